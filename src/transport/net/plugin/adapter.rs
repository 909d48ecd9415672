//! [`PluginNet`]: one opened net plugin behind the [`Net`] trait, whatever its ABI version
//! (v8 to v11). The entries every version shares are held once ([`Shared`]); the calls whose
//! arguments changed between versions are one enum ([`Calls`]) matched on at each call, and
//! converted the way NVIDIA's compatibility layer converts them (v8's `int` sizes, v10's comm
//! config on `connect`, v11's context).

use super::abi::*;
use crate::abi::ncclResult_t;
use crate::error::{Error, Result};
use crate::plugin::dl::Library;
use crate::transport::net::api::{
    Comm, Handle, MemHandle, MemType, Net, Properties, Request, HANDLE_BYTES, PTR_CUDA, PTR_HOST,
};
use parking_lot::Mutex;
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::Arc;

/// Sizes `test` may write: NVIDIA passes room for `NCCL_PROXY_MAX_SUBS` grouped receives.
const TEST_SIZES: usize = 8;

/// A table as the plugin exports it.
#[derive(Clone, Copy)]
enum Table {
    V8(ncclNet_v8_t),
    V9(ncclNet_v9_t),
    V10(ncclNet_v10_t),
    V11(ncclNet_v11_t),
}

/// The entries with one signature in every version, none of them NULL but `iflush` (a
/// host-memory network may have nothing to flush).
#[derive(Clone, Copy)]
struct Shared {
    devices: DevicesFn,
    accept: AcceptFn,
    reg_mr: RegMrFn,
    /// NULL in a plugin without DMA-BUF registration.
    reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    dereg_mr: DeregMrFn,
    iflush: Option<IflushFn>,
    test: TestFn,
    close_send: CloseFn,
    close_recv: CloseFn,
    close_listen: CloseFn,
}

/// The calls whose arguments depend on the version.
#[derive(Clone, Copy)]
enum Calls {
    V8 {
        props: PropsV8Fn,
        listen: ListenFn,
        connect: ConnectV8Fn,
        isend: IsendV8Fn,
        irecv: IrecvV8Fn,
    },
    V9 {
        props: PropsV9Fn,
        listen: ListenFn,
        connect: ConnectV8Fn,
        isend: IsendV9Fn,
        irecv: IrecvV9Fn,
    },
    V10 {
        props: PropsV9Fn,
        listen: ListenFn,
        connect: ConnectV10Fn,
        isend: IsendV10Fn,
        irecv: IrecvV10Fn,
    },
    V11 {
        init: InitV11Fn,
        props: PropsV11Fn,
        listen: ListenV11Fn,
        connect: ConnectV11Fn,
        isend: IsendV10Fn,
        irecv: IrecvV10Fn,
        finalize: Option<FinalizeFn>,
    },
}

/// An entry that must be there, or its name.
fn req<F>(f: Option<F>, name: &'static str) -> std::result::Result<F, &'static str> {
    f.ok_or(name)
}

/// [`Shared`] from any version's table (the fields have one name and type in all).
macro_rules! shared_of {
    ($t:expr) => {
        Shared {
            devices: req($t.devices, "devices")?,
            accept: req($t.accept, "accept")?,
            reg_mr: req($t.regMr, "regMr")?,
            reg_mr_dma_buf: $t.regMrDmaBuf,
            dereg_mr: req($t.deregMr, "deregMr")?,
            iflush: $t.iflush,
            test: req($t.test, "test")?,
            close_send: req($t.closeSend, "closeSend")?,
            close_recv: req($t.closeRecv, "closeRecv")?,
            close_listen: req($t.closeListen, "closeListen")?,
        }
    };
}

impl Table {
    /// Copy the table at `ptr`.
    ///
    /// # Safety
    /// `ptr` points to a live `ncclNet_v<version>_t`.
    unsafe fn read(ptr: *const c_void, version: u32) -> Table {
        // SAFETY: the caller's contract: ptr points to a table of this version's layout.
        unsafe {
            match version {
                8 => Table::V8(*(ptr as *const ncclNet_v8_t)),
                9 => Table::V9(*(ptr as *const ncclNet_v9_t)),
                10 => Table::V10(*(ptr as *const ncclNet_v10_t)),
                11 => Table::V11(*(ptr as *const ncclNet_v11_t)),
                _ => unreachable!("net plugin version {version} is not one of VERSIONS"),
            }
        }
    }

    /// The entries oxccl calls; Err names the first NULL one.
    fn entries(&self) -> std::result::Result<(Shared, Calls), &'static str> {
        Ok(match self {
            Table::V8(t) => (
                shared_of!(t),
                Calls::V8 {
                    props: req(t.getProperties, "getProperties")?,
                    listen: req(t.listen, "listen")?,
                    connect: req(t.connect, "connect")?,
                    isend: req(t.isend, "isend")?,
                    irecv: req(t.irecv, "irecv")?,
                },
            ),
            Table::V9(t) => (
                shared_of!(t),
                Calls::V9 {
                    props: req(t.getProperties, "getProperties")?,
                    listen: req(t.listen, "listen")?,
                    connect: req(t.connect, "connect")?,
                    isend: req(t.isend, "isend")?,
                    irecv: req(t.irecv, "irecv")?,
                },
            ),
            Table::V10(t) => (
                shared_of!(t),
                Calls::V10 {
                    props: req(t.getProperties, "getProperties")?,
                    listen: req(t.listen, "listen")?,
                    connect: req(t.connect, "connect")?,
                    isend: req(t.isend, "isend")?,
                    irecv: req(t.irecv, "irecv")?,
                },
            ),
            Table::V11(t) => (
                shared_of!(t),
                Calls::V11 {
                    init: req(t.init, "init")?,
                    props: req(t.getProperties, "getProperties")?,
                    listen: req(t.listen, "listen")?,
                    connect: req(t.connect, "connect")?,
                    isend: req(t.isend, "isend")?,
                    irecv: req(t.irecv, "irecv")?,
                    finalize: t.finalize,
                },
            ),
        })
    }

    /// Call the plugin's `init` with oxccl's logger, no profiler, and for v11 communicator
    /// id 0 and the default comm config; the v11 context it returns.
    fn init(&self) -> std::result::Result<(c_int, usize), &'static str> {
        let log = crate::plugin::logger::logger();
        // SAFETY (every arm): the logger has ncclDebugLogger_t's C variadic type; the
        // profiler callback may be NULL; v11's out-pointer and config are valid for the call
        // (NVIDIA too passes a config that lives only for the call).
        let out = unsafe {
            match self {
                Table::V8(t) => (req(t.init, "init")?(log), 0),
                Table::V9(t) => (req(t.init, "init")?(log), 0),
                Table::V10(t) => (req(t.init, "init")?(log, None), 0),
                Table::V11(t) => init_v11(req(t.init, "init")?, 0, &mut default_config()),
            }
        };
        Ok(out)
    }
}

/// A v11 plugin's `init` for communicator `comm_id` with `config`, oxccl's logger and no
/// profiler: its return code and the context it made.
fn init_v11(init: InitV11Fn, comm_id: u64, config: &mut ncclNetCommConfig_t) -> (c_int, usize) {
    let mut ctx = null_mut();
    // SAFETY: the out-pointer and config are valid for the call (NVIDIA too passes a config
    // that lives only for the call); the logger has ncclDebugLogger_t's C variadic type; the
    // profiler callback may be NULL.
    let rc = unsafe {
        init(
            &mut ctx,
            comm_id,
            config,
            crate::plugin::logger::logger(),
            None,
        )
    };
    (rc, ctx as usize)
}

/// NCCL's comm config when `ncclConfig_t` leaves it unset.
fn default_config() -> ncclNetCommConfig_t {
    ncclNetCommConfig_t {
        trafficClass: NCCL_NET_TRAFFIC_CLASS_UNDEF,
    }
}

/// A C string the plugin owns, copied; NULL is empty.
pub(super) fn c_string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: p is a non-NULL, NUL-terminated string of the plugin's.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// [`Properties`] from any version's props struct (the fields oxccl reads have one name in
/// all), with `max_p2p` bytes.
macro_rules! properties_of {
    ($p:expr, $max_p2p:expr) => {
        Properties {
            name: c_string($p.name),
            pci_path: c_string($p.pciPath),
            guid: $p.guid,
            ptr_support: $p.ptrSupport,
            reg_is_global: $p.regIsGlobal != 0,
            speed_mbps: $p.speed,
            port: $p.port,
            latency_us: $p.latency,
            max_comms: $p.maxComms,
            max_recvs: $p.maxRecvs,
            max_p2p_bytes: $max_p2p,
        }
    };
}

/// Handle buffers of connects in progress, by device and the caller's handle.
type PendingConnects = HashMap<(i32, [u8; HANDLE_BYTES]), Box<[u8; HANDLE_BYTES]>>;

/// An opened plugin library and its entries, shared by every [`PluginNet`] made of it.
struct Plugin {
    /// The table's name (`NCCL_NET` selects by it).
    name: String,
    shared: Shared,
    calls: Calls,
    /// Dropped last: the entries' code lives in it.
    _lib: Library,
}

/// A net plugin behind the [`Net`] trait, with one context: comms, requests and memory
/// handles are the plugin's pointers. The process opens the plugin once (`open`, NVIDIA's
/// first `init`); each communicator then gets its own (`Net::for_comm`): a v11 plugin an
/// `init` of its own with the communicator's id and traffic class, finalized when that
/// communicator's last user of it goes, as NVIDIA's calls it per communicator.
pub struct PluginNet {
    plugin: Arc<Plugin>,
    /// A v11 plugin's context from `init` (finalized on drop); 0 for older versions.
    ctx: usize,
    /// The comm config a v10 plugin's `connect` takes, at one address for this context's
    /// life (as NVIDIA keeps it in the context).
    config: Box<UnsafeCell<ncclNetCommConfig_t>>,
    /// Handles of connects in progress, as the plugin left them: a plugin may keep the state
    /// of a non-blocking connect in the handle (NVIDIA's own do), so each retry must pass the
    /// bytes the previous call wrote, not the caller's copy. Keyed by device and the caller's
    /// handle; an entry goes when its connect completes or fails.
    pending: Mutex<PendingConnects>,
}

// SAFETY: a plugin's entries may be called from any thread (NCCL calls them from its proxy
// threads). The raw pointers held are the plugin's context and oxccl's own config, which
// only the plugin reads; `pending` is behind a mutex.
unsafe impl Send for PluginNet {}
// SAFETY: as for Send; the &self methods read the copied entries and call the plugin.
unsafe impl Sync for PluginNet {}
// SAFETY: Plugin holds copied function pointers and the library they live in, read only.
unsafe impl Send for Plugin {}
// SAFETY: as for Send.
unsafe impl Sync for Plugin {}

impl PluginNet {
    /// Initialise the plugin whose `ncclNet_v<version>_t` is at `table` in `lib`: `init`,
    /// then at least one device, then the device check, with NVIDIA's INFO lines. None when
    /// the plugin is unusable (the reason is logged).
    ///
    /// # Safety
    /// `table` points to a table of `version`'s layout inside `lib`.
    pub(super) unsafe fn open(lib: Library, table: *const c_void, version: u32) -> Option<Self> {
        // SAFETY: the caller's contract.
        let before = unsafe { Table::read(table, version) };
        let name = super::table_name(table);
        let (rc, ctx) = match before.init() {
            Ok(out) => out,
            Err(entry) => return failed(&name, &format!("{entry} is NULL")),
        };
        if rc != 0 {
            return failed(&name, &format!("init returned {rc}"));
        }
        // A plugin may fill in its table in init: read it again.
        // SAFETY: the caller's contract.
        let after = unsafe { Table::read(table, version) };
        let (shared, calls) = match after.entries() {
            Ok(e) => e,
            Err(entry) => {
                finalize_raw(&after, ctx);
                return failed(&name, &format!("{entry} is NULL"));
            }
        };
        let plugin = Arc::new(Plugin {
            name,
            shared,
            calls,
            _lib: lib,
        });
        let net = PluginNet::with_context(plugin, ctx, default_config());
        // From here on dropping `net` finalizes a v11 plugin, as NVIDIA's failure path does.
        match net.devices() {
            Ok(n) if n > 0 => {}
            Ok(_) => return failed(net.name(), "no devices"),
            Err(e) => return failed(net.name(), &e.msg),
        }
        crate::info!(INIT | NET, "Initialized NET plugin {}", net.name());
        // A plugin may set NCCL_* variables in its init (aws-ofi-nccl does).
        crate::env::reload();
        net.host_only().then_some(net)
    }

    fn with_context(plugin: Arc<Plugin>, ctx: usize, config: ncclNetCommConfig_t) -> Self {
        PluginNet {
            plugin,
            ctx,
            config: Box::new(UnsafeCell::new(config)),
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// This plugin for the communicator `comm_id` with `traffic_class` (its
    /// `ncclConfig_t.trafficClass`, `NCCL_CONFIG_UNDEF_INT` when unset): a v11 plugin's
    /// `init` with them (a context of its own), a v10 plugin's `connect` config; older
    /// versions take neither (NVIDIA's compatibility layer does the same).
    fn for_comm_context(&self, comm_id: u64, traffic_class: c_int) -> Result<PluginNet> {
        let mut config = default_config();
        if traffic_class != crate::abi::NCCL_CONFIG_UNDEF_INT {
            config.trafficClass = traffic_class;
        }
        let mut ctx = 0usize;
        if let Calls::V11 { init, .. } = self.plugin.calls {
            let (rc, made) = init_v11(init, comm_id, &mut config);
            self.check(rc, "init")?;
            ctx = made;
        }
        Ok(PluginNet::with_context(self.plugin.clone(), ctx, config))
    }

    /// Whether oxccl can drive the plugin's device 0: it must not offload to the device
    /// (NVIDIA's device check; oxccl has no device-side network code).
    fn host_only(&self) -> bool {
        match self.raw_properties(0) {
            Ok((_, NCCL_NET_DEVICE_HOST)) => true,
            Ok((_, kind)) => {
                crate::warn!(
                    "NET/Plugin: {} offloads to the device (netDeviceType {kind}), which oxccl \
                     does not support; not using it",
                    self.plugin.name
                );
                false
            }
            Err(e) => {
                crate::warn!("{}; not using it", e.msg);
                false
            }
        }
    }

    /// A plugin call's result as ours: a failure names the plugin and the call.
    fn check(&self, rc: c_int, call: &str) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        let code = ncclResult_t::from_raw(rc)
            .filter(|c| *c != ncclResult_t::ncclSuccess)
            .unwrap_or(ncclResult_t::ncclInternalError);
        Err(Error::new(
            code,
            format!(
                "net plugin {}: {call} failed: {}",
                self.plugin.name,
                crate::error::error_string(rc)
            ),
        ))
    }

    /// A device's properties, and its `netDeviceType`.
    fn raw_properties(&self, dev: i32) -> Result<(Properties, c_int)> {
        let (props, kind, rc) = match self.plugin.calls {
            Calls::V8 { props, .. } => {
                // SAFETY: plain data, for which all-zero is a valid value.
                let mut p: ncclNetProperties_v8_t = unsafe { std::mem::zeroed() };
                // SAFETY: p is writable and has the layout this version fills.
                let rc = unsafe { props(dev, &mut p) };
                (properties_of!(p, MAX_NET_SIZE), p.netDeviceType, rc)
            }
            Calls::V9 { props, .. } | Calls::V10 { props, .. } => {
                // SAFETY: plain data, for which all-zero is a valid value.
                let mut p: ncclNetProperties_v9_t = unsafe { std::mem::zeroed() };
                // SAFETY: p is writable and has the layout this version fills.
                let rc = unsafe { props(dev, &mut p) };
                (properties_of!(p, p.maxP2pBytes), p.netDeviceType, rc)
            }
            Calls::V11 { props, .. } => {
                // SAFETY: plain data, for which all-zero is a valid value.
                let mut p: ncclNetProperties_v11_t = unsafe { std::mem::zeroed() };
                // SAFETY: p is writable and has the layout this version fills.
                let rc = unsafe { props(dev, &mut p) };
                (properties_of!(p, p.maxP2pBytes), p.netDeviceType, rc)
            }
        };
        self.check(rc, &format!("getProperties({dev})"))?;
        if props.max_p2p_bytes == 0 || props.max_p2p_bytes > NCCL_MAX_NET_SIZE_BYTES {
            return Err(Error::internal(format!(
                "net plugin {}: invalid value for maxP2pBytes {} [allowed range: 1 - {}]",
                self.plugin.name, props.max_p2p_bytes, NCCL_MAX_NET_SIZE_BYTES
            )));
        }
        Ok((props, kind))
    }

    /// v8 takes sizes as `int`, and NVIDIA's compatibility layer refuses more than
    /// `MAX_NET_SIZE` bytes.
    fn int_size(&self, size: usize, call: &str) -> Result<c_int> {
        if size > MAX_NET_SIZE {
            return Err(Error::internal(format!(
                "net plugin {}: {call} of {size} bytes, more than a v8 plugin takes ({MAX_NET_SIZE})",
                self.plugin.name
            )));
        }
        Ok(size as c_int)
    }

    /// One connect call with the handle buffer the plugin keeps its progress in.
    fn connect_once(&self, dev: i32, handle: &mut [u8; HANDLE_BYTES]) -> Result<*mut c_void> {
        let mut comm = null_mut();
        let mut dev_comm: *mut ncclNetDeviceHandle_t = null_mut();
        let h = handle.as_mut_ptr() as *mut c_void;
        // SAFETY (every arm): handle holds HANDLE_BYTES writable bytes; the out-pointers are
        // valid for the call; a NULL device handle asks for no offload; the v10 config lives
        // as long as the plugin; the v11 context is the one init returned.
        let rc = unsafe {
            match self.plugin.calls {
                Calls::V8 { connect, .. } | Calls::V9 { connect, .. } => {
                    connect(dev, h, &mut comm, &mut dev_comm)
                }
                Calls::V10 { connect, .. } => {
                    connect(dev, self.config.get(), h, &mut comm, &mut dev_comm)
                }
                Calls::V11 { connect, .. } => {
                    connect(self.ctx as *mut c_void, dev, h, &mut comm, &mut dev_comm)
                }
            }
        };
        self.check(rc, "connect")?;
        Ok(comm)
    }
}

/// Log why plugin `name` is not used, in NVIDIA's words and then ours.
fn failed(name: &str, why: &str) -> Option<PluginNet> {
    crate::info!(INIT | NET, "NET/Plugin: {name}: {why}");
    crate::info!(INIT | NET, "Failed to initialize NET plugin {name}");
    None
}

/// Call a v11 plugin's `finalize` with its context (nothing for older versions).
fn finalize_raw(table: &Table, ctx: usize) {
    if let Table::V11(ncclNet_v11_t {
        finalize: Some(f), ..
    }) = table
    {
        // SAFETY: ctx is the context this plugin's init returned, finalized once.
        unsafe { f(ctx as *mut c_void) };
    }
}

impl Drop for PluginNet {
    fn drop(&mut self) {
        if let Calls::V11 {
            finalize: Some(f), ..
        } = self.plugin.calls
        {
            // SAFETY: ctx is the context init returned; this is its one finalize.
            let rc = unsafe { f(self.ctx as *mut c_void) };
            if rc != 0 {
                crate::info!(
                    NET,
                    "NET/Plugin: {}: finalize returned {rc}",
                    self.plugin.name
                );
            }
        }
    }
}

/// A request out-pointer as a request: NULL means "not now, try again".
fn request(req: *mut c_void) -> Option<Request> {
    (!req.is_null()).then_some(Request(req as usize))
}

impl Net for PluginNet {
    fn name(&self) -> &str {
        &self.plugin.name
    }

    fn for_comm(&self, comm_id: u64, traffic_class: i32) -> Result<Option<Arc<dyn Net>>> {
        Ok(Some(Arc::new(
            self.for_comm_context(comm_id, traffic_class)?,
        )))
    }

    fn devices(&self) -> Result<i32> {
        let mut n: c_int = 0;
        // SAFETY: n is writable for the call.
        let rc = unsafe { (self.plugin.shared.devices)(&mut n) };
        self.check(rc, "devices")?;
        Ok(n)
    }

    fn properties(&self, dev: i32) -> Result<Properties> {
        Ok(self.raw_properties(dev)?.0)
    }

    fn listen(&self, dev: i32) -> Result<(Handle, Comm)> {
        let mut handle = Handle::default();
        let mut comm = null_mut();
        let h = handle.0.as_mut_ptr() as *mut c_void;
        // SAFETY (every arm): the handle has HANDLE_BYTES writable bytes, comm is writable;
        // the v11 context is the one init returned.
        let rc = unsafe {
            match self.plugin.calls {
                Calls::V8 { listen, .. } | Calls::V9 { listen, .. } | Calls::V10 { listen, .. } => {
                    listen(dev, h, &mut comm)
                }
                Calls::V11 { listen, .. } => listen(self.ctx as *mut c_void, dev, h, &mut comm),
            }
        };
        self.check(rc, "listen")?;
        if comm.is_null() {
            return Err(Error::internal(format!(
                "net plugin {}: listen returned no comm",
                self.plugin.name
            )));
        }
        Ok((handle, Comm(comm as usize)))
    }

    fn connect(&self, dev: i32, handle: &Handle) -> Result<Option<Comm>> {
        let key = (dev, handle.0);
        let mut buf = self
            .pending
            .lock()
            .remove(&key)
            .unwrap_or_else(|| Box::new(handle.0));
        let comm = self.connect_once(dev, &mut buf)?;
        if comm.is_null() {
            self.pending.lock().insert(key, buf);
            return Ok(None);
        }
        Ok(Some(Comm(comm as usize)))
    }

    fn accept(&self, listen: Comm) -> Result<Option<Comm>> {
        let mut comm = null_mut();
        let mut dev_comm: *mut ncclNetDeviceHandle_t = null_mut();
        // SAFETY: listen is a comm this plugin's listen returned; the out-pointers are valid
        // for the call; a NULL device handle asks for no offload.
        let rc = unsafe {
            (self.plugin.shared.accept)(listen.0 as *mut c_void, &mut comm, &mut dev_comm)
        };
        self.check(rc, "accept")?;
        Ok((!comm.is_null()).then_some(Comm(comm as usize)))
    }

    fn reg_mr(&self, comm: Comm, data: *mut u8, size: usize, mem: MemType) -> Result<MemHandle> {
        let kind = match mem {
            MemType::Host => PTR_HOST,
            MemType::Cuda => PTR_CUDA,
        };
        let mut mh = null_mut();
        // SAFETY: comm is this plugin's; data/size is the caller's buffer, which it keeps
        // valid while registered; mh is writable.
        let rc = unsafe {
            (self.plugin.shared.reg_mr)(comm.0 as *mut c_void, data.cast(), size, kind, &mut mh)
        };
        self.check(rc, "regMr")?;
        Ok(MemHandle(mh as usize))
    }

    fn has_dma_buf(&self) -> bool {
        self.plugin.shared.reg_mr_dma_buf.is_some()
    }

    fn reg_mr_dma_buf(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        offset: u64,
        fd: i32,
    ) -> Result<MemHandle> {
        let Some(reg) = self.plugin.shared.reg_mr_dma_buf else {
            return Err(Error::internal(format!(
                "net plugin {}: regMrDmaBuf is NULL",
                self.name()
            )));
        };
        let mut mh = null_mut();
        // SAFETY: comm is this plugin's; data/size is the caller's CUDA buffer, kept valid
        // while registered, and fd a dma-buf of it the caller keeps open for the call; mh is
        // writable.
        let rc = unsafe {
            reg(
                comm.0 as *mut c_void,
                data.cast(),
                size,
                PTR_CUDA,
                offset,
                fd,
                &mut mh,
            )
        };
        self.check(rc, "regMrDmaBuf")?;
        Ok(MemHandle(mh as usize))
    }

    fn dereg_mr(&self, comm: Comm, mh: MemHandle) -> Result<()> {
        // SAFETY: comm and mh are this plugin's, mh registered on comm.
        let rc =
            unsafe { (self.plugin.shared.dereg_mr)(comm.0 as *mut c_void, mh.0 as *mut c_void) };
        self.check(rc, "deregMr")
    }

    fn isend(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        tag: i32,
        mh: MemHandle,
    ) -> Result<Option<Request>> {
        let (c, d, m) = (
            comm.0 as *mut c_void,
            data as *mut c_void,
            mh.0 as *mut c_void,
        );
        let mut req = null_mut();
        // SAFETY (every arm): comm and mh are this plugin's; the caller keeps data valid
        // until the request is done; req is writable; no profiler handle.
        let rc = unsafe {
            match self.plugin.calls {
                Calls::V8 { isend, .. } => {
                    isend(c, d, self.int_size(size, "isend")?, tag, m, &mut req)
                }
                Calls::V9 { isend, .. } => isend(c, d, size, tag, m, &mut req),
                Calls::V10 { isend, .. } | Calls::V11 { isend, .. } => {
                    isend(c, d, size, tag, m, null_mut(), &mut req)
                }
            }
        };
        self.check(rc, "isend")?;
        Ok(request(req))
    }

    fn irecv(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        tag: i32,
        mh: MemHandle,
    ) -> Result<Option<Request>> {
        let c = comm.0 as *mut c_void;
        let mut datas = [data as *mut c_void];
        let mut tags = [tag];
        let mut mhs = [mh.0 as *mut c_void];
        let mut phandles = [null_mut::<c_void>()];
        let mut sizes = [size];
        let (d, t, m) = (datas.as_mut_ptr(), tags.as_mut_ptr(), mhs.as_mut_ptr());
        let mut req = null_mut();
        // SAFETY (every arm): one receive, every array of one element and valid for the
        // call; comm and mh are this plugin's; the caller keeps data valid until the
        // request is done; req is writable (NULL in: no optional completion asked).
        let rc = unsafe {
            match self.plugin.calls {
                Calls::V8 { irecv, .. } => {
                    let mut int_sizes = [self.int_size(size, "irecv")?];
                    irecv(c, 1, d, int_sizes.as_mut_ptr(), t, m, &mut req)
                }
                Calls::V9 { irecv, .. } => irecv(c, 1, d, sizes.as_mut_ptr(), t, m, &mut req),
                Calls::V10 { irecv, .. } | Calls::V11 { irecv, .. } => irecv(
                    c,
                    1,
                    d,
                    sizes.as_mut_ptr(),
                    t,
                    m,
                    phandles.as_mut_ptr(),
                    &mut req,
                ),
            }
        };
        self.check(rc, "irecv")?;
        Ok(request(req))
    }

    fn iflush(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        mh: MemHandle,
    ) -> Result<Option<Request>> {
        let Some(iflush) = self.plugin.shared.iflush else {
            return Ok(None);
        };
        let size = c_int::try_from(size).map_err(|_| {
            Error::internal(format!(
                "net plugin {}: iflush of {size} bytes",
                self.plugin.name
            ))
        })?;
        let mut datas = [data as *mut c_void];
        let mut sizes = [size];
        let mut mhs = [mh.0 as *mut c_void];
        let mut req = null_mut();
        // SAFETY: one flush, every array of one element and valid for the call; comm and mh
        // are this plugin's; req is writable.
        let rc = unsafe {
            iflush(
                comm.0 as *mut c_void,
                1,
                datas.as_mut_ptr(),
                sizes.as_mut_ptr(),
                mhs.as_mut_ptr(),
                &mut req,
            )
        };
        self.check(rc, "iflush")?;
        Ok(request(req))
    }

    fn test(&self, req: Request) -> Result<Option<usize>> {
        let mut done: c_int = 0;
        let mut sizes = [0 as c_int; TEST_SIZES];
        // SAFETY: req is a live request of this plugin's; done and sizes are writable.
        let rc = unsafe {
            (self.plugin.shared.test)(req.0 as *mut c_void, &mut done, sizes.as_mut_ptr())
        };
        self.check(rc, "test")?;
        if done == 0 {
            return Ok(None);
        }
        let size = usize::try_from(sizes[0]).map_err(|_| {
            Error::internal(format!(
                "net plugin {}: test reported {} bytes",
                self.plugin.name, sizes[0]
            ))
        })?;
        Ok(Some(size))
    }

    fn close_send(&self, comm: Comm) -> Result<()> {
        // SAFETY: comm is a send comm of this plugin's, closed once.
        let rc = unsafe { (self.plugin.shared.close_send)(comm.0 as *mut c_void) };
        self.check(rc, "closeSend")
    }

    fn close_recv(&self, comm: Comm) -> Result<()> {
        // SAFETY: comm is a receive comm of this plugin's, closed once.
        let rc = unsafe { (self.plugin.shared.close_recv)(comm.0 as *mut c_void) };
        self.check(rc, "closeRecv")
    }

    fn close_listen(&self, comm: Comm) -> Result<()> {
        // SAFETY: comm is a listening comm of this plugin's, closed once.
        let rc = unsafe { (self.plugin.shared.close_listen)(comm.0 as *mut c_void) };
        self.check(rc, "closeListen")
    }
}
