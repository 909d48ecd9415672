//! The thin verbs layer: libibverbs.so.1 opened at run time (`dlopen`, then `dlvsym` of each
//! function at the version rdma-core gives it, as NVIDIA's NCCL binds them), the C structs
//! the IB network passes to it laid out as rdma-core's public `<infiniband/verbs.h>`, and
//! small owning wrappers (context, protection domain, memory region, completion queue, queue
//! pair) that release what they hold when dropped. The verbs rdma-core makes inline
//! (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`) go through the context's ops table, as
//! that header does. Every `unsafe` of the IB network is here.
//!
//! The `ibverbs-sys` crate is not used: it builds rdma-core from source and links the
//! library, and the product must not have libibverbs as a link-time dependency.

use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::Arc;

/// `IBV_SYSFS_NAME_MAX`-bounded device name, as `ibv_get_device_name` returns it.
pub type DevicePtr = *mut c_void;

/// `union ibv_gid`.
pub type Gid = [u8; 16];

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct PortAttr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: i32,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
    /// Room for fields newer libraries append (`active_speed_ex`, ...).
    pub reserved: [u32; 16],
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// What the software verbs device reports of one of its QPs (tests).
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpFacts {
    pub traffic_class: u32,
    pub service_level: u32,
    /// The options both ends agreed on (0: ECE not set).
    pub ece_options: u32,
    pub max_inline: u32,
}

/// `struct ibv_ece`: Enhanced Connection Establishment options of a QP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ece {
    pub vendor_id: u32,
    pub options: u32,
    pub comp_mask: u32,
}

#[repr(C)]
pub struct QpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: QpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct GlobalRoute {
    pub dgid: Gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct AhAttr {
    pub grh: GlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct QpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: QpCap,
    pub ah_attr: AhAttr,
    pub alt_ah_attr: AhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
    /// The header's struct is 144 bytes: room up to its size.
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr` with the `rdma` member of its `wr` union spelled out.
#[repr(C)]
pub struct SendWr {
    pub wr_id: u64,
    pub next: *mut SendWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    /// Network byte order.
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub wr_rest: [u32; 5],
    pub qp_type: u32,
    pub pad: u32,
    pub bind_mw: [u64; 6],
}

impl Default for SendWr {
    fn default() -> Self {
        SendWr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            wr_rest: [0; 5],
            qp_type: 0,
            pad: 0,
            bind_mw: [0; 6],
        }
    }
}

#[repr(C)]
pub struct RecvWr {
    pub wr_id: u64,
    pub next: *mut RecvWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct Wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Network byte order.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct AsyncEvent {
    /// The element union: a CQ, QP, SRQ or WQ pointer, or the port number.
    pub element: u64,
    pub event_type: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct GidEntry {
    pub gid: Gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// The start of `struct ibv_context`: its device, its ops table, its file descriptors.
#[repr(C)]
pub struct ContextHead {
    pub device: *mut c_void,
    pub ops: [*mut c_void; OPS_LEN],
    pub cmd_fd: c_int,
    pub async_fd: c_int,
}

/// Entries of `struct ibv_context_ops`, and the ones called through it.
pub const OPS_LEN: usize = 32;
pub const OP_POLL_CQ: usize = 11;
pub const OP_POST_SEND: usize = 25;
pub const OP_POST_RECV: usize = 26;

/// The start of `struct ibv_qp` up to its number.
#[repr(C)]
pub struct QpHead {
    pub context: *mut c_void,
    pub qp_context: *mut c_void,
    pub pd: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
}

/// `struct ibv_device_attr` up to the GUIDs, with room for the rest.
#[repr(C)]
pub struct DeviceAttr {
    pub fw_ver: [u8; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    /// The other fields (rdma-core's struct is 232 bytes).
    _rest: [u64; 30],
}

/// The start of `struct ibv_mr` up to its keys.
#[repr(C)]
pub struct MrHead {
    pub context: *mut c_void,
    pub pd: *mut c_void,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

// enum values of <infiniband/verbs.h>
pub const PORT_ACTIVE: u32 = 4;
pub const LINK_LAYER_INFINIBAND: u8 = 1;
pub const LINK_LAYER_ETHERNET: u8 = 2;
/// `ibv_port_attr.flags`: the port's packets need a GRH (`IBV_QPF_GRH_REQUIRED`).
pub const QPF_GRH_REQUIRED: u8 = 1;
pub const QPT_RC: u32 = 2;
pub const QPS_INIT: u32 = 1;
pub const QPS_RTR: u32 = 2;
pub const QPS_RTS: u32 = 3;
pub const QPS_ERR: u32 = 6;
pub const ACCESS_LOCAL_WRITE: c_int = 1;
pub const ACCESS_REMOTE_WRITE: c_int = 2;
pub const ACCESS_REMOTE_READ: c_int = 4;
pub const ACCESS_RELAXED_ORDERING: c_int = 1 << 20;
pub const QP_STATE: c_int = 1;
pub const QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const QP_PKEY_INDEX: c_int = 1 << 4;
pub const QP_PORT: c_int = 1 << 5;
pub const QP_AV: c_int = 1 << 7;
pub const QP_PATH_MTU: c_int = 1 << 8;
pub const QP_TIMEOUT: c_int = 1 << 9;
pub const QP_RETRY_CNT: c_int = 1 << 10;
pub const QP_RNR_RETRY: c_int = 1 << 11;
pub const QP_RQ_PSN: c_int = 1 << 12;
pub const QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const QP_SQ_PSN: c_int = 1 << 16;
pub const QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const QP_DEST_QPN: c_int = 1 << 20;
pub const WR_RDMA_WRITE: u32 = 0;
pub const WR_RDMA_WRITE_WITH_IMM: u32 = 1;
pub const WR_RDMA_READ: u32 = 4;
pub const SEND_SIGNALED: u32 = 2;
pub const SEND_INLINE: u32 = 8;
pub const WC_WITH_IMM: u32 = 2;
pub const GID_TYPE_IB: u32 = 0;
pub const GID_TYPE_ROCE_V1: u32 = 1;
pub const GID_TYPE_ROCE_V2: u32 = 2;
pub const EVENT_QP_FATAL: u32 = 1;
pub const EVENT_PORT_ERR: u32 = 10;

/// `ibv_wc_status_str`'s words for a work completion's status, as rdma-core writes them.
pub fn wc_status_str(status: u32) -> &'static str {
    const WORDS: [&str; 22] = [
        "success",
        "local length error",
        "local QP operation error",
        "local EE context operation error",
        "local protection error",
        "Work Request Flushed Error",
        "memory management operation error",
        "bad response error",
        "local access error",
        "remote invalid request error",
        "remote access error",
        "remote operation error",
        "transport retry counter exceeded",
        "RNR retry counter exceeded",
        "local RDD violation error",
        "remote invalid RD request",
        "aborted error",
        "invalid EE context number",
        "invalid EE context state",
        "fatal error",
        "response timeout error",
        "general error",
    ];
    WORDS.get(status as usize).copied().unwrap_or("unknown")
}

/// `ibv_event_type_str`'s words for the async events the network reports.
pub fn event_str(event: u32) -> &'static str {
    const WORDS: [&str; 21] = [
        "CQ error",
        "local work queue catastrophic error",
        "invalid request local work queue error",
        "local access violation work queue error",
        "communication established",
        "send queue drained",
        "path migrated",
        "path migration request error",
        "local catastrophic error",
        "port active",
        "port error",
        "LID change",
        "P_Key change",
        "SM change",
        "SRQ catastrophic error",
        "SRQ limit reached",
        "last WQE reached",
        "client reregistration",
        "GID table change",
        "WQ fatal",
        "unknown",
    ];
    WORDS.get(event as usize).copied().unwrap_or("unknown")
}

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut DevicePtr;
type FreeDeviceList = unsafe extern "C" fn(*mut DevicePtr);
type GetDeviceName = unsafe extern "C" fn(DevicePtr) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(DevicePtr) -> *mut c_void;
type CloseDevice = unsafe extern "C" fn(*mut c_void) -> c_int;
type QueryPort = unsafe extern "C" fn(*mut c_void, u8, *mut PortAttr) -> c_int;
type QueryGid = unsafe extern "C" fn(*mut c_void, u8, c_int, *mut Gid) -> c_int;
type QueryGidEx = unsafe extern "C" fn(*mut c_void, u32, u32, *mut GidEntry, u32, usize) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type DeallocPd = unsafe extern "C" fn(*mut c_void) -> c_int;
type RegMr = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut MrHead;
type RegMrIova2 =
    unsafe extern "C" fn(*mut c_void, *mut c_void, usize, u64, std::ffi::c_uint) -> *mut MrHead;
type QueryDevice = unsafe extern "C" fn(*mut c_void, *mut DeviceAttr) -> c_int;
type RegDmabufMr = unsafe extern "C" fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut MrHead;
type DeregMr = unsafe extern "C" fn(*mut MrHead) -> c_int;
type CreateCq =
    unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void;
type DestroyCq = unsafe extern "C" fn(*mut c_void) -> c_int;
type CreateQp = unsafe extern "C" fn(*mut c_void, *mut QpInitAttr) -> *mut QpHead;
type ModifyQp = unsafe extern "C" fn(*mut QpHead, *mut QpAttr, c_int) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut QpHead) -> c_int;
type GetAsyncEvent = unsafe extern "C" fn(*mut c_void, *mut AsyncEvent) -> c_int;
type AckAsyncEvent = unsafe extern "C" fn(*mut AsyncEvent);
type QueryEce = unsafe extern "C" fn(*mut QpHead, *mut Ece) -> c_int;
type SetEce = unsafe extern "C" fn(*mut QpHead, *mut Ece) -> c_int;
type PollCq = unsafe extern "C" fn(*mut c_void, c_int, *mut Wc) -> c_int;
type PostSend = unsafe extern "C" fn(*mut QpHead, *mut SendWr, *mut *mut SendWr) -> c_int;
type PostRecv = unsafe extern "C" fn(*mut QpHead, *mut RecvWr, *mut *mut RecvWr) -> c_int;

/// The verbs library, opened once, with the functions the IB network calls.
pub struct Lib {
    /// The `dlopen` handle (never closed: providers keep threads and state).
    _handle: usize,
    get_device_list: GetDeviceList,
    free_device_list: FreeDeviceList,
    get_device_name: GetDeviceName,
    open_device: OpenDevice,
    close_device: CloseDevice,
    query_port: QueryPort,
    query_gid: QueryGid,
    query_gid_ex: Option<QueryGidEx>,
    alloc_pd: AllocPd,
    dealloc_pd: DeallocPd,
    reg_mr: RegMr,
    /// `ibv_reg_mr_iova2` (IBVERBS_1.8): takes `ACCESS_RELAXED_ORDERING`.
    reg_mr_iova2: Option<RegMrIova2>,
    query_device: QueryDevice,
    reg_dmabuf_mr: Option<RegDmabufMr>,
    dereg_mr: DeregMr,
    create_cq: CreateCq,
    destroy_cq: DestroyCq,
    create_qp: CreateQp,
    modify_qp: ModifyQp,
    destroy_qp: DestroyQp,
    get_async_event: GetAsyncEvent,
    ack_async_event: AckAsyncEvent,
    /// `ibv_query_ece` / `ibv_set_ece` (IBVERBS_1.10).
    query_ece: Option<QueryEce>,
    set_ece: Option<SetEce>,
}

// SAFETY: the library's functions may be called from any thread (rdma-core is thread-safe);
// the handle is never used after loading.
unsafe impl Send for Lib {}
// SAFETY: as above.
unsafe impl Sync for Lib {}

/// The function at `p` as the function pointer type `F`.
///
/// # Safety
/// `F` must be the function pointer type of the C function at `p`.
unsafe fn as_fn<F: Copy>(p: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size; the caller vouches for the prototype.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

fn last_dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "unknown error".into();
    }
    // SAFETY: not NULL, NUL-terminated (above).
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

impl Lib {
    /// Open `path` (a file name searched as `dlopen` does, or a path): the verbs library.
    pub fn open(path: &str) -> Result<Arc<Lib>> {
        let c = CString::new(path).map_err(|_| Error::invalid_argument("NUL in a library name"))?;
        // SAFETY: a NUL-terminated name; RTLD_NOW resolves everything at once.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(Error::system(format!(
                "Failed to open {path} ({})",
                last_dl_error()
            )));
        }
        let sym = |name: &str, version: &str| -> Option<*mut c_void> {
            let n = CString::new(name).ok()?;
            let v = CString::new(version).ok()?;
            // SAFETY: a live handle and NUL-terminated names.
            let p = unsafe { libc::dlvsym(handle, n.as_ptr(), v.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        let need = |name: &str, version: &str| -> Result<*mut c_void> {
            sym(name, version)
                .ok_or_else(|| Error::system(format!("{path}: no symbol {name}@{version}")))
        };
        // SAFETY (every as_fn below): each symbol is rdma-core's function of that name and
        // version, whose C prototype the field's type spells.
        unsafe {
            Ok(Arc::new(Lib {
                _handle: handle as usize,
                get_device_list: as_fn(need("ibv_get_device_list", "IBVERBS_1.1")?),
                free_device_list: as_fn(need("ibv_free_device_list", "IBVERBS_1.1")?),
                get_device_name: as_fn(need("ibv_get_device_name", "IBVERBS_1.1")?),
                open_device: as_fn(need("ibv_open_device", "IBVERBS_1.1")?),
                close_device: as_fn(need("ibv_close_device", "IBVERBS_1.1")?),
                query_port: as_fn(need("ibv_query_port", "IBVERBS_1.1")?),
                query_gid: as_fn(need("ibv_query_gid", "IBVERBS_1.1")?),
                query_gid_ex: sym("_ibv_query_gid_ex", "IBVERBS_1.11").map(|p| as_fn(p)),
                alloc_pd: as_fn(need("ibv_alloc_pd", "IBVERBS_1.1")?),
                dealloc_pd: as_fn(need("ibv_dealloc_pd", "IBVERBS_1.1")?),
                reg_mr: as_fn(need("ibv_reg_mr", "IBVERBS_1.1")?),
                reg_mr_iova2: sym("ibv_reg_mr_iova2", "IBVERBS_1.8").map(|p| as_fn(p)),
                query_device: as_fn(need("ibv_query_device", "IBVERBS_1.1")?),
                reg_dmabuf_mr: sym("ibv_reg_dmabuf_mr", "IBVERBS_1.12").map(|p| as_fn(p)),
                dereg_mr: as_fn(need("ibv_dereg_mr", "IBVERBS_1.1")?),
                create_cq: as_fn(need("ibv_create_cq", "IBVERBS_1.1")?),
                destroy_cq: as_fn(need("ibv_destroy_cq", "IBVERBS_1.1")?),
                create_qp: as_fn(need("ibv_create_qp", "IBVERBS_1.1")?),
                modify_qp: as_fn(need("ibv_modify_qp", "IBVERBS_1.1")?),
                destroy_qp: as_fn(need("ibv_destroy_qp", "IBVERBS_1.1")?),
                get_async_event: as_fn(need("ibv_get_async_event", "IBVERBS_1.1")?),
                ack_async_event: as_fn(need("ibv_ack_async_event", "IBVERBS_1.1")?),
                query_ece: sym("ibv_query_ece", "IBVERBS_1.10").map(|p| as_fn(p)),
                set_ece: sym("ibv_set_ece", "IBVERBS_1.10").map(|p| as_fn(p)),
            }))
        }
    }

    /// The software verbs device's test query `name` (version SOFT_VERBS_TEST), None for a
    /// library without it.
    #[cfg(test)]
    fn stand_in_symbol(&self, name: &str) -> Option<*mut c_void> {
        let (n, v) = (
            CString::new(name).ok()?,
            CString::new("SOFT_VERBS_TEST").ok()?,
        );
        // SAFETY: the live handle (never closed) and NUL-terminated names.
        let p = unsafe { libc::dlvsym(self._handle as *mut c_void, n.as_ptr(), v.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    /// The software verbs device's count of payload bytes delivered to device `dev`'s memory
    /// (`soft_verbs_rx_bytes@SOFT_VERBS_TEST`), None for a library without it.
    #[cfg(test)]
    pub fn stand_in_rx_bytes(&self, dev: &str) -> Option<u64> {
        type RxBytes = unsafe extern "C" fn(*const c_char) -> u64;
        let d = CString::new(dev).ok()?;
        let p = self.stand_in_symbol("soft_verbs_rx_bytes")?;
        // SAFETY: the stand-in's `uint64_t soft_verbs_rx_bytes(const char *)`; d is
        // NUL-terminated and outlives the call.
        Some(unsafe { as_fn::<RxBytes>(p)(d.as_ptr()) })
    }

    /// What the software verbs device knows of this process's QP `qp_num`
    /// (`soft_verbs_qp_facts@SOFT_VERBS_TEST`), None for another library or QP.
    #[cfg(test)]
    pub fn stand_in_qp_facts(&self, qp_num: u32) -> Option<QpFacts> {
        type Facts = unsafe extern "C" fn(u32, *mut u32, *mut u32, *mut u32, *mut u32) -> c_int;
        let p = self.stand_in_symbol("soft_verbs_qp_facts")?;
        let mut f = QpFacts::default();
        // SAFETY: the stand-in's `int soft_verbs_qp_facts(uint32_t, uint32_t *, uint32_t *,
        // uint32_t *, uint32_t *)`; every pointer is to a live u32.
        let rc = unsafe {
            as_fn::<Facts>(p)(
                qp_num,
                &mut f.traffic_class,
                &mut f.service_level,
                &mut f.ece_options,
                &mut f.max_inline,
            )
        };
        (rc == 0).then_some(f)
    }

    /// Whether registrations can ask for PCI relaxed ordering (`ibv_reg_mr_iova2`, NVIDIA's
    /// test of the IBVERBS_1.8 API).
    pub fn has_relaxed_ordering(&self) -> bool {
        self.reg_mr_iova2.is_some()
    }

    /// The names of the devices the library finds.
    pub fn device_names(&self) -> Result<Vec<String>> {
        let mut n: c_int = 0;
        // SAFETY: n is a valid out pointer; the list is freed below.
        let list = unsafe { (self.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(Error::system(format!(
                "NET/IB : ibv_get_device_list failed: {}",
                std::io::Error::last_os_error()
            )));
        }
        let mut names = Vec::new();
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds n device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: a device of the list; the name is NUL-terminated and lives with it.
            let name = unsafe { (self.get_device_name)(dev) };
            if !name.is_null() {
                // SAFETY: not NULL (above).
                names.push(
                    unsafe { CStr::from_ptr(name) }
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
        // SAFETY: the list from get_device_list, freed once.
        unsafe { (self.free_device_list)(list) };
        Ok(names)
    }

    /// Open the device named `name`.
    pub fn open_device(self: &Arc<Lib>, name: &str) -> Result<Arc<Context>> {
        let mut n: c_int = 0;
        // SAFETY: as in device_names.
        let list = unsafe { (self.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(Error::system("NET/IB : ibv_get_device_list failed"));
        }
        let mut ctx = std::ptr::null_mut();
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds n devices; names are NUL-terminated.
            let (dev, dn) = unsafe {
                let dev = *list.add(i);
                (dev, (self.get_device_name)(dev))
            };
            // SAFETY: a device name from the library, NUL-terminated.
            if !dn.is_null() && unsafe { CStr::from_ptr(dn) }.to_bytes() == name.as_bytes() {
                // SAFETY: a device of the live list.
                ctx = unsafe { (self.open_device)(dev) };
                break;
            }
        }
        let err = std::io::Error::last_os_error();
        // SAFETY: freed once; the opened context does not depend on the list.
        unsafe { (self.free_device_list)(list) };
        if ctx.is_null() {
            return Err(Error::system(format!(
                "NET/IB : ibv_open_device({name}) failed: {err}"
            )));
        }
        // SAFETY: an opened context is (starts with) struct ibv_context.
        let head = unsafe { &*(ctx as *const ContextHead) };
        // SAFETY: the ops table entries are function pointers of these prototypes (verbs.h).
        let (poll_cq, post_send, post_recv) = unsafe {
            (
                std::mem::transmute::<*mut c_void, Option<PollCq>>(head.ops[OP_POLL_CQ]),
                std::mem::transmute::<*mut c_void, Option<PostSend>>(head.ops[OP_POST_SEND]),
                std::mem::transmute::<*mut c_void, Option<PostRecv>>(head.ops[OP_POST_RECV]),
            )
        };
        let (Some(poll_cq), Some(post_send), Some(post_recv)) = (poll_cq, post_send, post_recv)
        else {
            // SAFETY: opened above, closed once.
            unsafe { (self.close_device)(ctx) };
            return Err(Error::system(format!(
                "NET/IB : device {name} has no poll_cq/post_send/post_recv"
            )));
        };
        let async_fd = head.async_fd;
        // SAFETY: the opened context.
        let pd = unsafe { (self.alloc_pd)(ctx) };
        if pd.is_null() {
            // SAFETY: opened above, closed once.
            unsafe { (self.close_device)(ctx) };
            return Err(Error::system(format!(
                "NET/IB : ibv_alloc_pd({name}) failed"
            )));
        }
        Ok(Arc::new(Context {
            lib: self.clone(),
            ctx: ctx as usize,
            pd: pd as usize,
            async_fd,
            poll_cq,
            post_send,
            post_recv,
        }))
    }
}

/// An open device with its protection domain; closed when the last user drops it.
pub struct Context {
    lib: Arc<Lib>,
    ctx: usize,
    pd: usize,
    pub async_fd: c_int,
    poll_cq: PollCq,
    post_send: PostSend,
    post_recv: PostRecv,
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every MR, CQ and QP holds the context alive, so none is left; each object
        // is released once.
        unsafe {
            (self.lib.dealloc_pd)(self.pd as *mut c_void);
            (self.lib.close_device)(self.ctx as *mut c_void);
        }
    }
}

fn os_error(what: &str) -> Error {
    Error::system(format!(
        "NET/IB : {what} failed: {}",
        std::io::Error::last_os_error()
    ))
}

fn rc_error(what: &str, rc: c_int) -> Error {
    Error::system(format!(
        "NET/IB : {what} failed: {}",
        std::io::Error::from_raw_os_error(rc)
    ))
}

impl Context {
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let mut a = PortAttr::default();
        // SAFETY: a live context; `a` has room for every layout of the struct.
        let rc = unsafe { (self.lib.query_port)(self.ctx as *mut c_void, port, &mut a) };
        if rc != 0 {
            return Err(rc_error(&format!("ibv_query_port({port})"), rc));
        }
        Ok(a)
    }

    /// GID `index` of `port` and its type (`GID_TYPE_*`; IB where the library cannot say).
    pub fn query_gid(&self, port: u8, index: i32) -> Option<(Gid, u32)> {
        if let Some(ex) = self.lib.query_gid_ex {
            let mut e = GidEntry::default();
            let size = std::mem::size_of::<GidEntry>();
            // SAFETY: a live context; e is an entry of the size given.
            let rc = unsafe {
                ex(
                    self.ctx as *mut c_void,
                    port as u32,
                    index as u32,
                    &mut e,
                    0,
                    size,
                )
            };
            return (rc == 0).then_some((e.gid, e.gid_type));
        }
        let mut g: Gid = [0; 16];
        // SAFETY: a live context; g is a 16-byte GID.
        let rc = unsafe { (self.lib.query_gid)(self.ctx as *mut c_void, port, index, &mut g) };
        (rc == 0).then_some((g, GID_TYPE_IB))
    }

    /// The device's system image GUID (NVIDIA's `ncclNetProperties_t.guid`: the same for
    /// every port of one adapter), as the library gives it (big-endian); 0 where it cannot.
    pub fn sys_image_guid(&self) -> u64 {
        // SAFETY: all-zero bytes are a valid DeviceAttr (integers and arrays).
        let mut a: DeviceAttr = unsafe { std::mem::zeroed() };
        // SAFETY: a live context; `a` has room for the whole struct.
        let rc = unsafe { (self.lib.query_device)(self.ctx as *mut c_void, &mut a) };
        if rc != 0 {
            return 0;
        }
        a.sys_image_guid
    }

    /// Register `len` bytes at `addr` for local writes and remote reads and writes.
    pub fn reg_mr(self: &Arc<Self>, addr: *mut u8, len: usize) -> Result<Mr> {
        self.reg_mr_ordered(addr, len, false)
    }

    /// `reg_mr`, with PCI relaxed ordering when `relaxed` and the library has
    /// `ibv_reg_mr_iova2` (NVIDIA's registration of communication buffers).
    pub fn reg_mr_ordered(
        self: &Arc<Self>,
        addr: *mut u8,
        len: usize,
        relaxed: bool,
    ) -> Result<Mr> {
        let access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
        let pd = self.pd as *mut c_void;
        let mr = match self.lib.reg_mr_iova2.filter(|_| relaxed) {
            // SAFETY: a live PD; the caller keeps [addr, addr+len) valid while the MR lives;
            // the iova is the address itself, as ibv_reg_mr gives it.
            Some(f) => unsafe {
                f(
                    pd,
                    addr.cast(),
                    len,
                    addr as u64,
                    (access | ACCESS_RELAXED_ORDERING) as std::ffi::c_uint,
                )
            },
            // SAFETY: as above.
            None => unsafe { (self.lib.reg_mr)(pd, addr.cast(), len, access) },
        };
        if mr.is_null() {
            return Err(os_error(&format!("ibv_reg_mr({addr:p}, {len})")));
        }
        Ok(Mr {
            ctx: self.clone(),
            mr: mr as usize,
        })
    }

    /// Register `len` bytes of the dma-buf `fd` from `offset`, seen at address `iova`, with
    /// PCI relaxed ordering when `relaxed`.
    pub fn reg_dmabuf_mr(
        self: &Arc<Self>,
        offset: u64,
        len: usize,
        iova: u64,
        fd: i32,
        relaxed: bool,
    ) -> Result<Mr> {
        let f = self
            .lib
            .reg_dmabuf_mr
            .ok_or_else(|| Error::system("NET/IB : the verbs library has no ibv_reg_dmabuf_mr"))?;
        let mut access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
        if relaxed {
            access |= ACCESS_RELAXED_ORDERING;
        }
        // SAFETY: a live PD; the caller's fd names a dma-buf of at least offset + len bytes.
        let mr = unsafe { f(self.pd as *mut c_void, offset, len, iova, fd, access) };
        if mr.is_null() {
            return Err(os_error("ibv_reg_dmabuf_mr"));
        }
        Ok(Mr {
            ctx: self.clone(),
            mr: mr as usize,
        })
    }

    /// Whether the library and device register dma-bufs: NVIDIA's probe, a registration of
    /// fd -1 that fails with EBADF (not EOPNOTSUPP / EPROTONOSUPPORT) where they do.
    pub fn dmabuf_supported(&self) -> bool {
        let Some(f) = self.lib.reg_dmabuf_mr else {
            return false;
        };
        // SAFETY: a live PD; fd -1 is refused before any memory is touched.
        let mr = unsafe { f(self.pd as *mut c_void, 0, 0, 0, -1, 0) };
        let err = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        if !mr.is_null() {
            // SAFETY: a registration that unexpectedly succeeded, released once.
            unsafe { (self.lib.dereg_mr)(mr) };
            return true;
        }
        err != libc::EOPNOTSUPP && err != libc::EPROTONOSUPPORT
    }

    pub fn create_cq(self: &Arc<Self>, cqe: i32) -> Result<Cq> {
        // SAFETY: a live context; no completion channel.
        let cq = unsafe {
            (self.lib.create_cq)(
                self.ctx as *mut c_void,
                cqe,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(os_error("ibv_create_cq"));
        }
        Ok(Cq {
            ctx: self.clone(),
            cq: cq as usize,
        })
    }

    /// A reliable-connected QP on `cq` (sends and receives) with room for `cap`.
    pub fn create_qp(self: &Arc<Self>, cq: &Cq, cap: QpCap) -> Result<Qp> {
        let mut init = QpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.cq as *mut c_void,
            recv_cq: cq.cq as *mut c_void,
            srq: std::ptr::null_mut(),
            cap,
            qp_type: QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: a live PD and CQ; init outlives the call.
        let qp = unsafe { (self.lib.create_qp)(self.pd as *mut c_void, &mut init) };
        if qp.is_null() {
            return Err(os_error("ibv_create_qp"));
        }
        Ok(Qp {
            ctx: self.clone(),
            qp: qp as usize,
        })
    }

    /// Wait at most `timeout_ms` for an async event; None when none came.
    pub fn next_async_event(&self, timeout_ms: i32) -> Option<AsyncEvent> {
        let mut pfd = libc::pollfd {
            fd: self.async_fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if n <= 0 || pfd.revents & libc::POLLIN == 0 {
            if n > 0 {
                // An fd in error (closed): do not spin on it.
                std::thread::sleep(std::time::Duration::from_millis(timeout_ms.max(0) as u64));
            }
            return None;
        }
        let mut ev = AsyncEvent::default();
        // SAFETY: a live context whose async fd is readable; ev is acknowledged at once.
        unsafe {
            if (self.lib.get_async_event)(self.ctx as *mut c_void, &mut ev) != 0 {
                return None;
            }
            (self.lib.ack_async_event)(&mut ev);
        }
        Some(ev)
    }
}

/// A registered memory region.
pub struct Mr {
    ctx: Arc<Context>,
    mr: usize,
}

impl Mr {
    fn head(&self) -> &MrHead {
        // SAFETY: a live MR (released only in drop).
        unsafe { &*(self.mr as *const MrHead) }
    }
    pub fn lkey(&self) -> u32 {
        self.head().lkey
    }
    pub fn rkey(&self) -> u32 {
        self.head().rkey
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: released once; no request uses it any more (the caller's contract).
        unsafe { (self.ctx.lib.dereg_mr)(self.mr as *mut MrHead) };
    }
}

/// A completion queue.
pub struct Cq {
    ctx: Arc<Context>,
    cq: usize,
}

impl Cq {
    /// Up to `wcs.len()` completions; how many.
    pub fn poll(&self, wcs: &mut [Wc]) -> Result<usize> {
        // SAFETY: a live CQ; wcs has room for the count given.
        let n = unsafe {
            (self.ctx.poll_cq)(self.cq as *mut c_void, wcs.len() as c_int, wcs.as_mut_ptr())
        };
        if n < 0 {
            return Err(Error::system(format!("NET/IB : ibv_poll_cq failed ({n})")));
        }
        Ok(n as usize)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: every QP on it was destroyed first (they hold nothing of it but the
        // pointer; the owner drops QPs before their CQ); released once.
        unsafe { (self.ctx.lib.destroy_cq)(self.cq as *mut c_void) };
    }
}

/// When a failed `ibv_modify_qp` is tried again (`NCCL_IB_MQP_RETRY_*`, NVIDIA's rule): after
/// ETIMEDOUT (either sign), or any error with `any_error`; at most `attempts` calls in all,
/// sleeping `sleep_ms` × the number of calls made before each new one. Bounded: 34 retries
/// of 100 ms steps sleep about 60 s in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModifyRetry {
    pub any_error: bool,
    pub attempts: u32,
    pub sleep_ms: u64,
}

impl ModifyRetry {
    pub fn from_env() -> ModifyRetry {
        use crate::env::registry as reg;
        ModifyRetry {
            any_error: reg::IB_MQP_RETRY_ALL.flag(),
            attempts: reg::IB_MQP_RETRY_CNT.int().clamp(0, 1 << 20) as u32 + 1,
            sleep_ms: reg::IB_MQP_RETRY_SLEEP_MSEC.int().clamp(0, 60_000) as u64,
        }
    }

    /// The sleep before the next call, after `made` calls of which the last returned `rc`;
    /// None: give up.
    pub fn after(&self, rc: c_int, made: u32) -> Option<std::time::Duration> {
        let retryable = rc != 0 && (self.any_error || rc.abs() == libc::ETIMEDOUT);
        (retryable && made < self.attempts)
            .then(|| std::time::Duration::from_millis(self.sleep_ms * u64::from(made)))
    }
}

/// A queue pair.
pub struct Qp {
    ctx: Arc<Context>,
    qp: usize,
}

impl Qp {
    pub fn num(&self) -> u32 {
        // SAFETY: a live QP (destroyed only in drop).
        unsafe { (*(self.qp as *const QpHead)).qp_num }
    }

    /// `ibv_modify_qp`, retried as `retry` says.
    pub fn modify(&self, attr: &mut QpAttr, mask: c_int, retry: &ModifyRetry) -> Result<()> {
        let mut made = 0;
        loop {
            // SAFETY: a live QP; attr outlives the call.
            let rc = unsafe { (self.ctx.lib.modify_qp)(self.qp as *mut QpHead, attr, mask) };
            made += 1;
            if rc == 0 {
                return Ok(());
            }
            let Some(pause) = retry.after(rc, made) else {
                return Err(rc_error(
                    &format!("ibv_modify_qp(qpn {}, state {})", self.num(), attr.qp_state),
                    rc,
                ));
            };
            crate::info!(
                NET,
                "Call to ibv_modify_qp failed with {rc} {}, qpn {} to state {}, retrying {made}/{} after {} msec of sleep",
                std::io::Error::from_raw_os_error(rc.abs()),
                self.num(),
                attr.qp_state,
                retry.attempts,
                pause.as_millis()
            );
            std::thread::sleep(pause);
        }
    }

    /// The QP's ECE options (`ibv_query_ece`): None where the library or the device has no
    /// ECE (no symbol, or EOPNOTSUPP).
    pub fn query_ece(&self) -> Result<Option<Ece>> {
        let Some(query) = self.ctx.lib.query_ece else {
            return Ok(None);
        };
        let mut ece = Ece::default();
        // SAFETY: a live QP; ece outlives the call.
        match unsafe { query(self.qp as *mut QpHead, &mut ece) } {
            0 => Ok(Some(ece)),
            rc if rc == libc::EOPNOTSUPP => Ok(None),
            rc => Err(rc_error("ibv_query_ece", rc)),
        }
    }

    /// Ask for the ECE options `ece` (`ibv_set_ece`, before RTR); false where the library or
    /// the device has no ECE.
    pub fn set_ece(&self, ece: Ece) -> Result<bool> {
        let Some(set) = self.ctx.lib.set_ece else {
            return Ok(false);
        };
        let mut ece = ece;
        // SAFETY: a live QP; ece outlives the call.
        match unsafe { set(self.qp as *mut QpHead, &mut ece) } {
            0 => Ok(true),
            rc if rc == libc::EOPNOTSUPP => Ok(false),
            rc => Err(rc_error("ibv_set_ece", rc)),
        }
    }

    /// Post a chain of send work requests (linked through `next`).
    pub fn post_send(&self, wr: &mut SendWr) -> Result<()> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live QP; the chain and its SGE lists outlive the call (the device copies
        // them), and the memory they name is registered and kept by the caller.
        let rc = unsafe { (self.ctx.post_send)(self.qp as *mut QpHead, wr, &mut bad) };
        if rc != 0 {
            return Err(rc_error("ibv_post_send", rc));
        }
        Ok(())
    }

    pub fn post_recv(&self, wr: &mut RecvWr) -> Result<()> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: as post_send.
        let rc = unsafe { (self.ctx.post_recv)(self.qp as *mut QpHead, wr, &mut bad) };
        if rc != 0 {
            return Err(rc_error("ibv_post_recv", rc));
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: released once, before the CQ it completes on (owner's drop order).
        unsafe { (self.ctx.lib.destroy_qp)(self.qp as *mut QpHead) };
    }
}

// SAFETY: verbs objects may be used from any thread (rdma-core serializes internally); the
// wrappers hold them as numbers and release them once.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}
