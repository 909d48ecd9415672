//! The built-in InfiniBand / RoCE network, "IB", as NVIDIA's `NET/IB`: libibverbs opened at
//! run time (`verbs`), every ACTIVE port `NCCL_IB_HCA` selects a device, or with
//! `NCCL_IB_MERGE_NICS` the ports of one physical NIC together as one device (`devices`), RC
//! queue pairs set up over a TCP side channel on every member port of the device (`conn`),
//! data moved by RDMA writes into the receiver's buffers announced through a clear-to-send
//! FIFO (`fifo`). Without libibverbs, or without a usable port, the network is absent and says
//! why in an INFO line.
//!
//! Each device context has a thread reading its async events: they are logged as WARN, and a
//! port that goes down fails every request of its connections (unless
//! `NCCL_IB_RETURN_ASYNC_EVENTS=0`: then they are only logged).

pub mod conn;
pub mod devices;
pub mod fifo;
pub mod verbs;

#[cfg(test)]
mod tests;

use super::api::{
    Comm, Handle, MemHandle, MemType, Net, Properties, Request, PTR_CUDA, PTR_DMABUF, PTR_HOST,
};
use crate::bootstrap::socket::{self as bsock, NetIf};
use crate::env::registry as reg;
use crate::error::{Error, Result};
use conn::{Connecting, Listening, QpSettings, Site};
use devices::{Device, GidChoice, HcaFilter, Port};
use fifo::{Conn, DataPath, MemKeys};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use verbs::{Lib, Mr};

/// The verbs libraries the network tries, in order, after `NCCL_IBVERBS_LIB` (found as
/// `dlopen` finds them).
pub const LIBRARIES: [&str; 2] = ["libibverbs.so", "libibverbs.so.1"];

/// The first verbs library that opens: `NCCL_IBVERBS_LIB` if set, then `LIBRARIES`; the
/// error of the last one tried when none does.
fn open_library() -> Result<Arc<Lib>> {
    let chosen = reg::IBVERBS_LIB.get().filter(|p| !p.is_empty());
    if let Some(p) = &chosen {
        crate::info!(ENV | INIT, "NCCL_IBVERBS_LIB set by environment to {p}");
    }
    let mut last = None;
    for path in chosen.iter().map(String::as_str).chain(LIBRARIES) {
        match Lib::open(path) {
            Ok(lib) => return Ok(lib),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("at least one library is tried"))
}

/// The `NCCL_IB_*` settings the network follows.
#[derive(Clone, Debug)]
pub struct Settings {
    pub hca: HcaFilter,
    pub gid: GidChoice,
    pub qp: QpSettings,
    pub qps_per_connection: usize,
    pub split_data: bool,
    /// `NCCL_IB_ADAPTIVE_ROUTING`: 1 on, 0 off, else on for InfiniBand ports only.
    pub adaptive_routing: i64,
    pub ar_threshold: usize,
    /// Flush received GPU data with an RDMA read (`NCCL_GDR_FLUSH_DISABLE` unset).
    pub gdr_flush: bool,
    /// The HCA reads and writes GPU memory registered with `ibv_reg_mr` (nvidia-peermem).
    pub peer_memory: bool,
    /// `NCCL_IB_PCI_RELAXED_ORDERING`: 0 off; 1 or 2 (default) on where the verbs library
    /// registers with relaxed ordering (`ibv_reg_mr_iova2`).
    pub relaxed_ordering: i64,
    /// `NCCL_IB_MERGE_NICS`: the ports of one physical NIC make one device.
    pub merge_nics: bool,
    /// `NCCL_IB_DEVICE_PCI_ORDER`: devices numbered in PCI bus order.
    pub device_pci_order: bool,
    /// `NCCL_IB_USE_INLINE`: CTS entries go as inline data.
    pub inline_cts: bool,
    /// `NCCL_IB_RETURN_ASYNC_EVENTS`: a port error fails its connections' requests.
    pub async_events_fail: bool,
    /// Where sysfs lists the verbs devices and their PCI functions.
    pub sysfs: PathBuf,
}

impl Settings {
    pub fn from_env() -> Settings {
        let ipv6 = reg::IB_ADDR_FAMILY
            .string()
            .trim()
            .eq_ignore_ascii_case("AF_INET6");
        Settings {
            hca: HcaFilter::parse(reg::IB_HCA.get().as_deref()),
            gid: GidChoice {
                index: reg::IB_GID_INDEX.int(),
                roce_version: reg::IB_ROCE_VERSION_NUM.int(),
                ipv6,
                routable_flid_index: reg::IB_ROUTABLE_FLID_GID_INDEX.int(),
                range: reg::IB_ADDR_RANGE.get().and_then(|r| {
                    crate::info!(ENV, "NCCL_IB_ADDR_RANGE set by environment to {r}");
                    devices::Subnet::parse(&r, ipv6)
                }),
            },
            qp: QpSettings {
                traffic_class: reg::IB_TC.int().clamp(0, 255) as u8,
                service_level: reg::IB_SL.int().clamp(0, 15) as u8,
                traffic_class_set: reg::IB_TC.int() >= 0,
                service_level_set: reg::IB_SL.int() >= 0,
                timeout: reg::IB_TIMEOUT.int().clamp(1, 31) as u8,
                retry_cnt: reg::IB_RETRY_CNT.int().clamp(0, 7) as u8,
                pkey_index: reg::IB_PKEY.int().clamp(0, 0xffff) as u16,
                fifo_traffic_class: match reg::IB_FIFO_TC.int() {
                    tc @ 0..=255 => Some(tc as u8),
                    _ => None,
                },
                ece: reg::IB_ECE_ENABLE.flag(),
                modify_retry: verbs::ModifyRetry::from_env(),
            },
            qps_per_connection: reg::IB_QPS_PER_CONNECTION
                .int()
                .clamp(1, fifo::MAX_QPS_PER_MEMBER as i64) as usize,
            split_data: reg::IB_SPLIT_DATA_ON_QPS.int() != 0,
            adaptive_routing: reg::IB_ADAPTIVE_ROUTING.int(),
            ar_threshold: reg::IB_AR_THRESHOLD.int().max(0) as usize,
            gdr_flush: !reg::GDR_FLUSH_DISABLE.flag(),
            peer_memory: peer_memory_loaded(),
            relaxed_ordering: reg::IB_PCI_RELAXED_ORDERING.int(),
            merge_nics: reg::IB_MERGE_NICS.flag(),
            device_pci_order: reg::IB_DEVICE_PCI_ORDER.flag(),
            inline_cts: reg::IB_USE_INLINE.flag(),
            async_events_fail: reg::IB_RETURN_ASYNC_EVENTS.flag(),
            sysfs: PathBuf::from(devices::SYSFS_INFINIBAND),
        }
    }

    /// Whether buffers register with PCI relaxed ordering, with the verbs library `lib`
    /// (NVIDIA's `ncclIbRelaxedOrderingCapable`).
    fn relaxed_ordering_with(&self, lib: &Lib) -> bool {
        matches!(self.relaxed_ordering, 1 | 2) && lib.has_relaxed_ordering()
    }

    /// How a connection on the member ports `ports` moves data: with adaptive routing only
    /// where every member has it (NVIDIA's rule for merged devices).
    fn data_path(&self, ports: &[&Port]) -> DataPath {
        let ar = match self.adaptive_routing {
            0 => false,
            1 => true,
            _ => ports.iter().all(|p| !p.is_roce()),
        };
        DataPath {
            split: self.split_data,
            adaptive_routing: ar,
            ar_threshold: self.ar_threshold,
            inline_cts: self.inline_cts,
        }
    }
}

/// Whether NVIDIA's peer-memory module is loaded (GPU memory registers with `ibv_reg_mr`).
fn peer_memory_loaded() -> bool {
    [
        "/sys/kernel/mm/memory_peers/nv_mem/version",
        "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
        "/sys/module/nvidia_peermem/version",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists())
}

/// A registered memory region (one registration per member port) and what it holds.
struct Region {
    mrs: Vec<Mr>,
    mem: MemType,
}

#[derive(Default)]
struct Objects {
    listens: HashMap<usize, Arc<Mutex<Listening>>>,
    /// Senders whose setup is under way, by the handle they connect to, with their device.
    connecting: HashMap<[u8; super::api::HANDLE_BYTES], (usize, Connecting)>,
    comms: HashMap<usize, (usize, Arc<Mutex<Conn>>)>,
    regions: HashMap<usize, Region>,
    /// Requests in flight and their comm.
    requests: HashMap<usize, usize>,
}

/// The IB network: the hardware it found, the settings its connections take, and its
/// objects (comms, registrations, requests). A communicator with its own traffic class gets
/// a network of its own over the same hardware (`for_comm`).
pub struct IbNet {
    hw: Arc<Hardware>,
    settings: Settings,
    objects: Mutex<Objects>,
    next: AtomicUsize,
}

/// The ports and devices of an IB network, shared by the networks of every communicator:
/// its ports, the devices they make (a port each, or the merged ports of one NIC), and the
/// threads reading the devices' async events, stopped when the last network goes.
struct Hardware {
    ports: Vec<Port>,
    devices: Vec<Device>,
    /// Per port: it went down (an async event said so).
    down: Vec<Arc<AtomicBool>>,
    /// Per port: it registers dma-bufs.
    dmabuf: Vec<bool>,
    /// Buffers register with PCI relaxed ordering.
    relaxed: bool,
    oob: NetIf,
    stop: Arc<AtomicBool>,
    watchers: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl IbNet {
    /// The network as the environment sets it up, or None (said in an INFO line) when the
    /// verbs library or a usable port is missing.
    pub fn from_env() -> Result<Option<IbNet>> {
        let lib = match open_library() {
            Ok(l) => l,
            Err(e) => {
                crate::info!(INIT | NET, "Failed to open libibverbs.so[.1]");
                crate::info!(NET, "{}", e.msg);
                return Ok(None);
            }
        };
        let oob = bsock::net_interfaces()?
            .into_iter()
            .next()
            .ok_or_else(|| Error::system("NET/IB : no interface for the out-of-band channel"))?;
        IbNet::with_lib(lib, Settings::from_env(), oob)
    }

    /// The network over the verbs library at `path`.
    pub fn open(path: &str, settings: Settings, oob: NetIf) -> Result<Option<IbNet>> {
        IbNet::with_lib(Lib::open(path)?, settings, oob)
    }

    fn with_lib(lib: Arc<Lib>, settings: Settings, oob: NetIf) -> Result<Option<IbNet>> {
        let mut ports = devices::find_ports(&lib, &settings.hca, settings.gid, &settings.sysfs)?;
        if settings.device_pci_order {
            devices::in_pci_order(&mut ports);
        }
        if ports.is_empty() {
            crate::info!(INIT | NET, "NET/IB : No device found.");
            return Ok(None);
        }
        let list: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("[{i}]{}", p.label()))
            .collect();
        let relaxed = settings.relaxed_ordering_with(&lib);
        if settings.relaxed_ordering == 1 && !relaxed {
            crate::info!(
                NET,
                "NET/IB : NCCL_IB_PCI_RELAXED_ORDERING=1 but the verbs library has no \
                 ibv_reg_mr_iova2 (IBVERBS_1.8): registering without relaxed ordering"
            );
        }
        crate::info!(
            INIT | NET,
            "NET/IB : Using {} {}; OOB {}:{}<0>",
            list.join(" "),
            if relaxed { "[RO]" } else { "" },
            oob.name,
            oob.ip
        );
        let devices = merged_devices(&ports, settings.merge_nics);
        let down = ports
            .iter()
            .map(|_| Arc::new(AtomicBool::new(false)))
            .collect();
        let dmabuf = ports.iter().map(|p| p.ctx.dmabuf_supported()).collect();
        let hw = Hardware {
            ports,
            devices,
            down,
            dmabuf,
            relaxed,
            oob,
            stop: Arc::new(AtomicBool::new(false)),
            watchers: Mutex::new(Vec::new()),
        };
        hw.watch_async_events(settings.async_events_fail)?;
        Ok(Some(IbNet::over(Arc::new(hw), settings)))
    }

    /// This network as a communicator with `ncclConfig_t.trafficClass` `class` uses it: None
    /// when that changes nothing (unset, or `NCCL_IB_TC` and `NCCL_IB_SL` set), else a network
    /// of its own over the same hardware.
    fn with_traffic_class(&self, class: i32) -> Option<IbNet> {
        if class == crate::abi::NCCL_CONFIG_UNDEF_INT {
            return None;
        }
        let qp = self.settings.qp.with_traffic_class(class);
        (qp != self.settings.qp).then(|| {
            let settings = Settings {
                qp,
                ..self.settings.clone()
            };
            IbNet::over(self.hw.clone(), settings)
        })
    }

    /// A network over `hw` whose connections take `settings`.
    fn over(hw: Arc<Hardware>, settings: Settings) -> IbNet {
        IbNet {
            hw,
            settings,
            objects: Mutex::new(Objects::default()),
            next: AtomicUsize::new(1),
        }
    }

    fn device(&self, dev: i32) -> Result<(usize, &Device)> {
        usize::try_from(dev)
            .ok()
            .and_then(|d| self.hw.devices.get(d).map(|v| (d, v)))
            .ok_or_else(|| Error::invalid_argument(format!("NET/IB : no device {dev}")))
    }

    /// The first member port of device `dev`.
    fn first_port(&self, dev: usize) -> &Port {
        &self.hw.ports[self.hw.devices[dev].members[0]]
    }

    fn site(&self, dev: usize) -> Site<'_> {
        let device = &self.hw.devices[dev];
        let ports: Vec<&Port> = device.members.iter().map(|&m| &self.hw.ports[m]).collect();
        Site {
            path: self.settings.data_path(&ports),
            ports,
            name: device.name.clone(),
            port_down: device
                .members
                .iter()
                .map(|&m| self.hw.down[m].clone())
                .collect(),
            qp: self.settings.qp,
        }
    }

    /// A memory handle for a buffer registered with `reg` (one port's registration) on every
    /// member port of device `dev`.
    fn register(
        &self,
        dev: usize,
        mem: MemType,
        reg: impl Fn(&Port) -> Result<Mr>,
    ) -> Result<MemHandle> {
        let mrs = self.hw.devices[dev]
            .members
            .iter()
            .map(|&m| reg(&self.hw.ports[m]))
            .collect::<Result<Vec<Mr>>>()?;
        let id = self.id();
        self.objects.lock().regions.insert(id, Region { mrs, mem });
        Ok(MemHandle(id))
    }

    /// Whether buffers register with PCI relaxed ordering (`NCCL_IB_PCI_RELAXED_ORDERING`).
    pub fn relaxed_ordering(&self) -> bool {
        self.hw.relaxed
    }

    fn id(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn add_comm(&self, dev: usize, conn: Conn) -> Comm {
        let id = self.id();
        self.objects
            .lock()
            .comms
            .insert(id, (dev, Arc::new(Mutex::new(conn))));
        Comm(id)
    }

    fn comm(&self, c: Comm) -> Result<(usize, Arc<Mutex<Conn>>)> {
        self.objects
            .lock()
            .comms
            .get(&c.0)
            .cloned()
            .ok_or_else(|| Error::internal(format!("NET/IB : no comm {}", c.0)))
    }

    /// The numbers of a comm's data QPs (tests: the stand-in's facts about them).
    #[cfg(test)]
    fn qp_nums(&self, c: Comm) -> Vec<u32> {
        let (_, conn) = self.comm(c).unwrap();
        let nums = conn.lock().qps.iter().map(verbs::Qp::num).collect();
        nums
    }

    fn keys(&self, mh: MemHandle) -> Result<(MemKeys, MemType)> {
        let o = self.objects.lock();
        let r = o
            .regions
            .get(&mh.0)
            .ok_or_else(|| Error::internal(format!("NET/IB : no memory handle {}", mh.0)))?;
        let mut keys = MemKeys::default();
        for (i, mr) in r.mrs.iter().enumerate() {
            keys.lkeys[i] = mr.lkey();
            keys.rkeys[i] = mr.rkey();
        }
        Ok((keys, r.mem))
    }

    /// The `PTR_*` bits of device `dev`: host memory, GPU memory through nvidia-peermem,
    /// dma-bufs where every member port registers them.
    fn ptr_support(&self, dev: usize) -> i32 {
        let mut bits = PTR_HOST;
        if self.settings.peer_memory {
            bits |= PTR_CUDA;
        }
        if self.hw.devices[dev]
            .members
            .iter()
            .all(|&m| self.hw.dmabuf[m])
        {
            bits |= PTR_DMABUF;
        }
        bits
    }

    /// Post a send or receive on `comm` and file its request.
    fn post(
        &self,
        comm: Comm,
        mh: MemHandle,
        op: impl FnOnce(&mut Conn, u64, &MemKeys) -> Result<Option<()>>,
    ) -> Result<Option<Request>> {
        let (_, conn) = self.comm(comm)?;
        let (keys, _) = self.keys(mh)?;
        let id = self.id();
        let posted = op(&mut conn.lock(), id as u64, &keys)?;
        Ok(posted.map(|()| {
            self.objects.lock().requests.insert(id, comm.0);
            Request(id)
        }))
    }

    fn close_comm(&self, c: Comm) -> Result<()> {
        let removed = {
            let mut o = self.objects.lock();
            o.requests.retain(|_, comm| *comm != c.0);
            o.comms.remove(&c.0)
        };
        if let Some((_, conn)) = removed {
            let conn = conn.lock();
            // An orderly close says goodbye; a peer that is gone is no error here.
            let _ = std::io::Write::write(&mut &conn.side_channel, &[fifo::GOODBYE]);
        }
        Ok(())
    }
}

/// The devices of `ports`, merged per NIC when `merge` (`NCCL_IB_MERGE_NICS`), each merged
/// one told in an INFO line as NVIDIA's; merging off where it would merge says so.
fn merged_devices(ports: &[Port], merge: bool) -> Vec<Device> {
    let devices = devices::make_devices(ports, merge);
    if !merge && devices::make_devices(ports, true).len() < ports.len() {
        crate::info!(NET, "NET/IB : Skipping makeVDevice, NCCL_IB_MERGE_NICS=0");
    }
    for (i, d) in devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.members.len() > 1)
    {
        crate::info!(
            NET,
            "NET/IB : Made virtual device [{i}] name={} speed={} ndevs={} rail=-1 plane={}",
            d.name,
            d.speed_mbps,
            d.members.len(),
            PLANE_VIRTUAL
        );
    }
    devices
}

/// The plane NVIDIA gives a merged device without `NCCL_IB_HCA` planes: its virtual bit with
/// the bit of plane index 0.
const PLANE_VIRTUAL: i32 = (1 << 14) | 1;

/// Log an async event of device `dev` and, with `fail`, fail the ports it took down.
fn on_async_event(dev: &str, ports: &[(u8, Arc<AtomicBool>)], ev: verbs::AsyncEvent, fail: bool) {
    let words = verbs::event_str(ev.event_type);
    if ev.event_type == verbs::EVENT_PORT_ERR {
        let port = ev.element as u32;
        crate::warn!("NET/IB : Got async event : {words} ({dev}:{port})");
        if !fail {
            return;
        }
        for (p, down) in ports {
            if *p as u32 == port {
                down.store(true, Ordering::Release);
            }
        }
    } else {
        crate::warn!("NET/IB : Got async event : {words} ({dev})");
    }
}

impl Hardware {
    /// One thread per device context reading its async events; with `fail`, a port error
    /// fails the port's requests (`NCCL_IB_RETURN_ASYNC_EVENTS`).
    fn watch_async_events(&self, fail: bool) -> Result<()> {
        let mut seen: Vec<String> = Vec::new();
        for p in &self.ports {
            if seen.contains(&p.dev_name) {
                continue;
            }
            seen.push(p.dev_name.clone());
            let ports: Vec<(u8, Arc<AtomicBool>)> = self
                .ports
                .iter()
                .zip(&self.down)
                .filter(|(q, _)| q.dev_name == p.dev_name)
                .map(|(q, d)| (q.port, d.clone()))
                .collect();
            let (ctx, name, stop) = (p.ctx.clone(), p.dev_name.clone(), self.stop.clone());
            let t = std::thread::Builder::new()
                .name(format!("oxccl-ib-async-{name}"))
                .spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        if let Some(ev) = ctx.next_async_event(100) {
                            on_async_event(&name, &ports, ev, fail);
                        }
                    }
                })
                .map_err(|e| Error::system(format!("NET/IB : async event thread: {e}")))?;
            self.watchers.lock().push(t);
        }
        Ok(())
    }
}

impl Drop for Hardware {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for t in self.watchers.lock().drain(..) {
            let _ = t.join();
        }
    }
}

impl Net for IbNet {
    fn name(&self) -> &str {
        "IB"
    }

    fn devices(&self) -> Result<i32> {
        Ok(self.hw.devices.len() as i32)
    }

    /// A merged device is named `a+b`, has the members' speeds summed, and the first
    /// member's PCI path, GUID and port, as NVIDIA's.
    fn properties(&self, dev: i32) -> Result<Properties> {
        let (d, v) = self.device(dev)?;
        let p = self.first_port(d);
        Ok(Properties {
            name: v.name.clone(),
            pci_path: p.pci_path.clone(),
            guid: p.guid,
            ptr_support: self.ptr_support(d),
            // A registration is the device's (its protection domain's), good for every comm
            // on it, as NVIDIA's.
            reg_is_global: true,
            speed_mbps: v.speed_mbps,
            port: p.port as i32,
            latency_us: 0.0,
            max_comms: 65536,
            max_recvs: 1,
            max_p2p_bytes: i32::MAX as usize,
        })
    }

    fn listen(&self, dev: i32) -> Result<(Handle, Comm)> {
        let (d, v) = self.device(dev)?;
        let members = v.members.len();
        let listener = bsock::listen_on(&self.hw.oob)?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::system(format!("NET/IB : set_nonblocking: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::system(format!("NET/IB : local_addr: {e}")))?;
        let id = self.id();
        self.objects
            .lock()
            .listens
            .insert(id, Arc::new(Mutex::new(Listening::new(listener, d))));
        Ok((conn::encode_handle(addr, members), Comm(id)))
    }

    fn connect(&self, dev: i32, handle: &Handle) -> Result<Option<Comm>> {
        let (d, _) = self.device(dev)?;
        let pending = self.objects.lock().connecting.remove(&handle.0);
        let (d, c) = match pending {
            Some(p) => p,
            None => {
                let (addr, remote_members) = conn::decode_handle(handle)?;
                crate::bootstrap::crypt::check_plaintext("NET/IB")?;
                let site = self.site(d);
                let qps = self.settings.qps_per_connection;
                (d, Connecting::start(&site, addr, remote_members, qps)?)
            }
        };
        match c.progress(&self.site(d))? {
            Ok(conn) => Ok(Some(self.add_comm(d, conn))),
            Err(c) => {
                self.objects.lock().connecting.insert(handle.0, (d, c));
                Ok(None)
            }
        }
    }

    fn accept(&self, listen: Comm) -> Result<Option<Comm>> {
        let l = self
            .objects
            .lock()
            .listens
            .get(&listen.0)
            .cloned()
            .ok_or_else(|| Error::internal(format!("NET/IB : no listening comm {}", listen.0)))?;
        let mut l = l.lock();
        let d = l.dev;
        let Some(mut conn) = l.progress(&self.site(d))? else {
            return Ok(None);
        };
        if self.settings.gdr_flush && self.ptr_support(d) & (PTR_CUDA | PTR_DMABUF) != 0 {
            conn::add_flush_qp(&mut conn, self.first_port(d), &self.settings.qp)?;
        }
        Ok(Some(self.add_comm(d, conn)))
    }

    fn reg_mr(&self, comm: Comm, data: *mut u8, size: usize, mem: MemType) -> Result<MemHandle> {
        let (d, _) = self.comm(comm)?;
        if mem == MemType::Cuda && !self.settings.peer_memory {
            return Err(Error::invalid_usage(
                "NET/IB : CUDA memory registers with ibv_reg_mr only with nvidia-peermem \
                 loaded (else as a dma-buf)",
            ));
        }
        self.register(d, mem, |p| {
            p.ctx.reg_mr_ordered(data, size.max(1), self.hw.relaxed)
        })
    }

    fn has_dma_buf(&self) -> bool {
        self.hw.dmabuf.iter().any(|&b| b)
    }

    fn reg_mr_dma_buf(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        offset: u64,
        fd: i32,
    ) -> Result<MemHandle> {
        let (d, _) = self.comm(comm)?;
        self.register(d, MemType::Cuda, |p| {
            p.ctx
                .reg_dmabuf_mr(offset, size, data as u64, fd, self.hw.relaxed)
        })
    }

    fn dereg_mr(&self, _comm: Comm, mh: MemHandle) -> Result<()> {
        self.objects.lock().regions.remove(&mh.0);
        Ok(())
    }

    fn isend(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        tag: i32,
        mh: MemHandle,
    ) -> Result<Option<Request>> {
        self.post(comm, mh, |c, id, keys| c.isend(id, data, size, tag, keys))
    }

    fn irecv(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        tag: i32,
        mh: MemHandle,
    ) -> Result<Option<Request>> {
        self.post(comm, mh, |c, id, keys| c.irecv(id, data, size, tag, keys))
    }

    fn iflush(
        &self,
        comm: Comm,
        data: *mut u8,
        _size: usize,
        mh: MemHandle,
    ) -> Result<Option<Request>> {
        let (keys, mem) = self.keys(mh)?;
        if mem == MemType::Host || !self.settings.gdr_flush {
            return Ok(None);
        }
        let (_, conn) = self.comm(comm)?;
        let id = self.id();
        // The flush QP is on the first member port: the buffer's key there.
        let posted = conn.lock().iflush(id as u64, data, keys.rkeys[0])?;
        Ok(posted.map(|()| {
            self.objects.lock().requests.insert(id, comm.0);
            Request(id)
        }))
    }

    fn test(&self, req: Request) -> Result<Option<usize>> {
        let comm = self
            .objects
            .lock()
            .requests
            .get(&req.0)
            .copied()
            .ok_or_else(|| Error::internal(format!("NET/IB : no request {}", req.0)))?;
        let (_, conn) = self.comm(Comm(comm))?;
        let r = conn.lock().test(req.0 as u64);
        if !matches!(r, Ok(None)) {
            self.objects.lock().requests.remove(&req.0);
        }
        r
    }

    fn close_send(&self, comm: Comm) -> Result<()> {
        self.close_comm(comm)
    }

    fn close_recv(&self, comm: Comm) -> Result<()> {
        self.close_comm(comm)
    }

    fn close_listen(&self, comm: Comm) -> Result<()> {
        self.objects.lock().listens.remove(&comm.0);
        Ok(())
    }

    /// A communicator with a traffic class of its own (`ncclConfig_t.trafficClass`) that
    /// changes how its QPs mark packets gets a network of its own over the same hardware.
    fn for_comm(&self, _comm_id: u64, traffic_class: i32) -> Result<Option<Arc<dyn Net>>> {
        Ok(self
            .with_traffic_class(traffic_class)
            .map(|n| Arc::new(n) as Arc<dyn Net>))
    }
}
