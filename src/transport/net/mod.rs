//! The network transport: between hosts, or between ranks of one host when neither P2P nor
//! SHM is allowed (`NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`, as NVIDIA's). The kernels see an
//! ordinary connection whose every counter and buffer is in this rank's own host memory
//! (device-mapped): a sending kernel fills slots there, a receiving kernel reads them there,
//! and the communicator's proxy thread (`proxy.rs`) moves the slots over the network.
//!
//! A side's block is one host allocation: the head page, the tail page (tail, step words),
//! the staging slots, and for a sender the bounce area of its LL messages. Each side plays
//! both roles of the shared layout (`side_conn` with "mine" and "theirs" in one block). A
//! side whose slots the network may read or write in GPU memory (`gdr`) has them there
//! instead, registered with the network as CUDA memory (or as a dma-buf of it); a sending one
//! keeps its LL regions in its host block, after the tail page (`SEND_LL_OFFSET`).
//!
//! The process's networks are loaded once (`network`): a net plugin if one is found
//! (`NCCL_NET_PLUGIN`), then the built-in IB network (`ib`), then the built-in sockets; a
//! communicator takes the one its
//! `netName` (or `NCCL_NET`) names, else the first.

pub mod api;
pub mod gdr;
pub mod ib;
pub mod meter;
pub mod plugin;
pub mod proxy;
pub mod socket;

use super::wire::{Half, Placement};
use super::{side_conn, Keep, Setup, Side};
use crate::cuda::{DeviceBuffer, HostMapped};
use crate::error::{Error, Result};
use crate::sched::device::{LL_REGION_DIV, MAX_NSLOTS, SEND_LL_OFFSET, STEP_WORDS_OFFSET};
use crate::sched::weights::{RouteClaim, Routes, Verdict};
use crate::sched::{Dir, NetLink};
use crate::topo::file::{Locator, NodeFile};
use crate::topo::nics::{self, NetDevsPolicy};
use crate::topo::pci::Sysfs;
use crate::topo::Topology;
use api::{Comm, Handle, MemHandle, MemType, Net, PTR_CUDA, PTR_DMABUF};
use once_cell::sync::OnceCell;
use proxy::{bounce_bytes, HostBlock, NetSide, Proxy};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The network a communicator uses: the one named `name` (its `ncclConfig_t.netName`, else
/// `NCCL_NET`), else the first of the process's networks.
pub fn network(name: Option<&str>) -> Result<Arc<dyn Net>> {
    static NETS: OnceCell<Vec<Arc<dyn Net>>> = OnceCell::new();
    let nets = NETS.get_or_try_init(load_networks)?;
    let net = pick(nets, name)?;
    log_choice(net.name());
    Ok(net)
}

/// The network one communicator uses (`network` picks it by `name`), made for that
/// communicator on first use (`Net::for_comm`: a v11 plugin's context of its own, from an
/// `init` with the communicator's id and traffic class, as NVIDIA's calls it per
/// communicator) and kept while this or any of the communicator's network connections holds
/// it.
pub struct CommNet {
    name: Option<String>,
    comm_id: u64,
    traffic_class: i32,
    net: OnceCell<Arc<dyn Net>>,
    /// The devices this rank's GPU uses (`local_choice`), found on first use.
    local: OnceCell<nics::Choice>,
}

impl CommNet {
    /// The network named `name` for communicator `comm_id` (its hash) with `traffic_class`
    /// (`ncclConfig_t.trafficClass`), not opened yet.
    pub fn new(name: Option<String>, comm_id: u64, traffic_class: i32) -> CommNet {
        CommNet {
            name,
            comm_id,
            traffic_class,
            net: OnceCell::new(),
            local: OnceCell::new(),
        }
    }

    /// The network, opened for this communicator the first time.
    pub fn get(&self) -> Result<Arc<dyn Net>> {
        self.net
            .get_or_try_init(|| {
                let shared = network(self.name.as_deref())?;
                let own = shared.for_comm(self.comm_id, self.traffic_class)?;
                Ok(own.unwrap_or(shared))
            })
            .cloned()
    }

    /// The devices of the network this rank's GPU uses and their PCI path types from it
    /// (`local_choice`), the same on every call.
    pub fn local(&self, topo: &Topology) -> Result<&nics::Choice> {
        self.local
            .get_or_try_init(|| local_choice(self.get()?.as_ref(), topo))
    }
}

/// The devices of `net` the GPU of `topo`'s rank uses, in channel order (channel c: entry c
/// mod length), by NVIDIA's affinity rule (`topo::nics`: the closest ones by PCI path type,
/// shared among the GPUs as close, `NCCL_NETDEVS_POLICY`), and every device's path type.
pub fn local_choice(net: &dyn Net, topo: &Topology) -> Result<nics::Choice> {
    let devices = (0..net.devices()?)
        .map(|d| {
            let p = net.properties(d)?;
            Ok(nics::NetDevice {
                name: p.name,
                pci_path: p.pci_path,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let locator = Locator::system()?;
    let choice = nics::choose(&locator, topo, &devices, NetDevsPolicy::from_env());
    if choice.devices.is_empty() {
        return Err(Error::system(format!(
            "NET/{} : no network device for rank {}",
            net.name(),
            topo.my_rank
        )));
    }
    Ok(choice)
}

/// NVIDIA-style INFO line of the devices rank `topo.my_rank`'s GPU uses:
/// `NET/IB : GPU 0000:18:00.0 (rank 0) uses [0]mlx5_0:1 [2]mlx5_2:1 (PIX) ; other devices
/// [1]mlx5_1:1 (SYS)`.
fn log_local_devices(net: &dyn Net, topo: &Topology, choice: &nics::Choice) {
    let label = |d: usize| {
        let name = net
            .properties(d as i32)
            .map(|p| match p.port {
                port if port > 0 => format!("{}:{port}", p.name),
                _ => p.name,
            })
            .unwrap_or_else(|_| "?".into());
        let class = choice.types.get(d).map(|t| t.name()).unwrap_or("");
        (format!("[{d}]{name}"), class)
    };
    let used: Vec<String> = choice.devices.iter().map(|&d| label(d).0).collect();
    let class = choice
        .devices
        .first()
        .map(|&d| label(d).1)
        .filter(|c| !c.is_empty())
        .map_or_else(
            || "GPU not in sysfs: every device".to_string(),
            str::to_string,
        );
    let others: Vec<String> = (0..choice.types.len())
        .filter(|d| !choice.devices.contains(d))
        .map(|d| {
            let (l, c) = label(d);
            format!("{l} ({c})")
        })
        .collect();
    let others = match others.is_empty() {
        true => String::new(),
        false => format!(" ; other devices {}", others.join(" ")),
    };
    let me = &topo.peers[topo.my_rank as usize];
    crate::info!(
        INIT | NET,
        "NET/{} : GPU {} (rank {}) uses {} ({class}){others}",
        net.name(),
        me.bus_id,
        me.rank,
        used.join(" ")
    );
}

/// What this rank's channels get of the network named `name` (as `network` picks it), for
/// the cost model: the devices its GPU uses (`local_choice`) side by side as far as
/// `channels` reach them (with even routes channel c uses the device c mod their number, see
/// `local_half`), from each device's speed (`device_speeds`) and latency.
pub fn link(name: Option<&str>, topo: &Topology, channels: u32) -> Result<NetLink> {
    let net = network(name)?;
    let speeds = device_speeds(net.as_ref())?;
    let local = local_choice(net.as_ref(), topo)?.devices;
    let used = local.len().clamp(1, channels.max(1) as usize);
    let mut link: Option<NetLink> = None;
    for &dev in local.iter().take(used) {
        let p = net.properties(dev as i32)?;
        let l = NetLink::from_properties(speeds[dev].1 as i32, p.latency_us);
        link = Some(link.map_or(l, |a| a.beside(l)));
    }
    Ok(link.expect("at least one device"))
}

/// (name, speed in Mbit/s) of every device of `net` (`resolve_speed`).
pub fn device_speeds(net: &dyn Net) -> Result<Vec<(String, u32)>> {
    let overrides = speed_overrides();
    let file = crate::topo::file::from_env()?;
    (0..net.devices()?)
        .map(|dev| {
            let p = net.properties(dev)?;
            let speed = resolve_speed(&p.name, p.speed_mbps, &overrides, file.as_deref());
            Ok((p.name, speed))
        })
        .collect()
}

/// The speed in Mbit/s of the device `name` whose properties report `reported_mbps`:
/// `OXCCL_NET_SPEEDS`'s (`overrides`) if it names the device, else the topology file's if it
/// gives one, else the reported one (`NET_DEFAULT_MBPS` when it reports none).
pub fn resolve_speed(
    name: &str,
    reported_mbps: i32,
    overrides: &[(String, u32)],
    file: Option<&NodeFile>,
) -> u32 {
    let reported = match reported_mbps {
        s if s > 0 => s as u32,
        _ => crate::sched::cost::NET_DEFAULT_MBPS as u32,
    };
    if let Some(&(_, s)) = overrides.iter().find(|(n, _)| n == name) {
        return s;
    }
    match file.and_then(|f| f.net_speed(name)) {
        Some(s) => {
            if s != reported {
                crate::topo::file::say_once(
                    format!(
                        "Topology file : network device {name} at {s} Mbit/s (reported {reported})"
                    ),
                    false,
                );
            }
            s
        }
        None => reported,
    }
}

/// `NCCL_TOPO_DUMP_FILE` on the rank that writes it (`topo::dump`): the loaded topology
/// file, else the detected node with the devices of the network named `name` (none when it
/// cannot be loaded).
pub fn dump_topology(name: Option<&str>, topo: &Topology) {
    let Some(path) = crate::topo::dump::target(topo) else {
        return;
    };
    let file = crate::topo::file::from_env().ok().flatten();
    let nets = network(name)
        .and_then(|net| dump_nets(net.as_ref()))
        .unwrap_or_default();
    let text = crate::topo::dump::text(file.as_deref(), topo, &Sysfs::system(), &nets);
    crate::topo::dump::write(&path, &text);
}

/// Every device of `net` as the topology dump describes it.
fn dump_nets(net: &dyn Net) -> Result<Vec<crate::topo::dump::DumpNet>> {
    let speeds = device_speeds(net)?;
    (0..net.devices()?)
        .map(|d| {
            let p = net.properties(d)?;
            Ok(crate::topo::dump::DumpNet {
                name: p.name,
                dev: d,
                pci_path: p.pci_path,
                speed_mbps: speeds[d as usize].1,
                port: p.port,
                latency_us: p.latency_us,
                guid: p.guid,
                max_comms: p.max_comms,
                gdr: p.ptr_support & PTR_CUDA != 0,
            })
        })
        .collect()
}

/// `OXCCL_NET_SPEEDS` (`name=Mbit/s,...`, e.g. `eth0=4000,eth1=1000`): the speeds of the
/// devices it names, for a network whose devices misreport theirs (a veth reports 10000, a
/// shaped link its unshaped speed). An entry that does not parse is warned about and left out.
fn speed_overrides() -> Vec<(String, u32)> {
    let spec = crate::env::registry::NET_SPEEDS.string();
    let (good, bad) = parse_speed_overrides(&spec);
    for entry in bad {
        crate::warn!("OXCCL_NET_SPEEDS: ignoring '{entry}' (expected name=Mbit/s, Mbit/s > 0)");
    }
    good
}

/// The (name, Mbit/s) entries of an `OXCCL_NET_SPEEDS` value, and the entries that are not.
pub(super) fn parse_speed_overrides(spec: &str) -> (Vec<(String, u32)>, Vec<String>) {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let parsed = entry.split_once('=').and_then(|(name, mbps)| {
            let mbps = mbps.trim().parse::<u32>().ok().filter(|&m| m > 0)?;
            let name = name.trim();
            (!name.is_empty()).then(|| (name.to_string(), mbps))
        });
        match parsed {
            Some(p) => good.push(p),
            None => bad.push(entry.to_string()),
        }
    }
    (good, bad)
}

/// What this rank says at init about the devices of the network named `name` its GPU uses
/// (`local_choice`, logged here), for the channels' routes (`sched::weights`): their speeds
/// in channel order (a route's device is a position in that list, which each rank maps to
/// its own device), `OXCCL_WEIGHTED_CHANNELS`, and the in-node hop `hop_mbps` its channels
/// share (0: none). No devices when the network cannot be loaded (the routes are then even).
pub fn route_claim(name: Option<&str>, topo: &Topology, hop_mbps: u32) -> RouteClaim {
    let local_speeds = |net: Arc<dyn Net>| -> Result<Vec<u32>> {
        let speeds = device_speeds(net.as_ref())?;
        let choice = local_choice(net.as_ref(), topo)?;
        log_local_devices(net.as_ref(), topo, &choice);
        Ok(choice.devices.iter().map(|&d| speeds[d].1).collect())
    };
    let speeds = network(name).and_then(local_speeds).unwrap_or_default();
    RouteClaim {
        speeds_mbps: speeds,
        weighted: crate::env::registry::WEIGHTED_CHANNELS.flag(),
        hop_mbps,
        adaptive: crate::env::registry::ADAPTIVE_WEIGHTS.flag(),
    }
}

/// The names of the devices this rank's GPU uses of the network named `name`, in route
/// position order (empty when it cannot say).
pub fn local_device_names(name: Option<&str>, topo: &Topology) -> Vec<String> {
    let local_names = |net: Arc<dyn Net>| -> Result<Vec<String>> {
        let speeds = device_speeds(net.as_ref())?;
        let choice = local_choice(net.as_ref(), topo)?;
        Ok(choice
            .devices
            .iter()
            .map(|&d| speeds[d].0.clone())
            .collect())
    };
    network(name).and_then(local_names).unwrap_or_default()
}

/// INFO lines for the routes rank `rank` agreed on for `nchannels` channels over the network
/// named `name`: each device's speed and channels, or why the split is even.
pub fn log_routes(
    topo: &Topology,
    routes: &Routes,
    verdict: Verdict,
    nchannels: u32,
    name: Option<&str>,
) {
    let rank = topo.my_rank;
    let names = local_device_names(name, topo);
    let why = match verdict {
        Verdict::Weighted => {
            let devices = routes.describe(nchannels, &names).join(", ");
            crate::info!(
                INIT | NET,
                "rank {rank}: channel weights: {devices}; bytes per channel in proportion to \
                 bandwidth (OXCCL_WEIGHTED_CHANNELS=0: even)"
            );
            return;
        }
        Verdict::Off => "OXCCL_WEIGHTED_CHANNELS=0 on some rank",
        Verdict::OneDevice => "one network device",
        Verdict::DeviceCounts => "ranks' GPUs use different numbers of network devices",
        Verdict::EqualSpeeds => "network devices of equal speed",
    };
    crate::info!(
        INIT | NET,
        "rank {rank}: channel weights even ({why}): channel c uses the device c mod {} of \
         its GPU's ({})",
        names.len().max(1),
        names.join(", ")
    );
}

/// Why the built-in IB network is not among the process's networks, when it is not.
static IB_ABSENT: OnceCell<String> = OnceCell::new();

/// As NVIDIA's: the plugin's network (if one loads), then the built-in IB network (when
/// libibverbs opens and a port is usable, unless `NCCL_IB_DISABLE`), then the sockets.
fn load_networks() -> Result<Vec<Arc<dyn Net>>> {
    let mut nets: Vec<Arc<dyn Net>> = plugin::load()?.into_iter().collect();
    let ib = match crate::env::registry::IB_DISABLE.flag() {
        true => Err("disabled by NCCL_IB_DISABLE".to_string()),
        false => match ib::IbNet::from_env() {
            Ok(Some(net)) => Ok(net),
            Ok(None) => Err("no libibverbs or no usable port (see the NET/IB INFO lines)".into()),
            Err(e) => Err(e.msg),
        },
    };
    match ib {
        Ok(net) => nets.push(Arc::new(net)),
        Err(why) => {
            let _ = IB_ABSENT.set(why);
        }
    }
    match socket::SocketNet::from_env() {
        Ok(s) => nets.push(Arc::new(s)),
        Err(e) if !nets.is_empty() => crate::info!(NET, "NET/Socket : unavailable: {}", e.msg),
        Err(e) => return Err(e),
    }
    Ok(nets)
}

/// The network named `name` (case-insensitive), or the first when none is named.
fn pick(nets: &[Arc<dyn Net>], name: Option<&str>) -> Result<Arc<dyn Net>> {
    let wanted = name.map(str::trim).filter(|n| !n.is_empty());
    let found = match wanted {
        None => nets.first(),
        Some(w) => nets.iter().find(|n| n.name().eq_ignore_ascii_case(w)),
    };
    found.cloned().ok_or_else(|| {
        let names: Vec<&str> = nets.iter().map(|n| n.name()).collect();
        let why_not_ib = match (wanted, IB_ABSENT.get()) {
            (Some(w), Some(why)) if w.eq_ignore_ascii_case("IB") => format!("; IB: {why}"),
            _ => String::new(),
        };
        Error::invalid_usage(format!(
            "NCCL_NET / netName {}: no such network (available: {}){why_not_ib}",
            wanted.unwrap_or("(none)"),
            names.join(", ")
        ))
    })
}

/// "Using network X", once per network chosen (NVIDIA's INFO line).
fn log_choice(name: &str) {
    static LOGGED: parking_lot::Mutex<Vec<String>> = parking_lot::Mutex::new(Vec::new());
    let mut logged = LOGGED.lock();
    if !logged.iter().any(|n| n == name) {
        crate::info!(INIT | NET, "Using network {name}");
        logged.push(name.to_string());
    }
}

const HEAD_PAGE: u64 = 0;
const TAIL_PAGE: u64 = 4096;
const STAGING: u64 = 8192;

/// Offsets in a side's block of its own part and of the stand-in for the peer's.
fn mine_and_theirs(dir: Dir) -> (u64, u64) {
    match dir {
        // A sender's own part is the head page; the receiver's (tail, staging) is local too.
        Dir::Send => (HEAD_PAGE, TAIL_PAGE),
        Dir::Recv => (TAIL_PAGE, HEAD_PAGE),
    }
}

/// Bytes of a side's host block: the counter pages, then the slots (unless they are in GPU
/// memory), a sending side's host LL regions when its slots are, and a sender's bounce area.
fn block_bytes(dir: Dir, slot_bytes: u32, nslots: u32, gpu_slots: bool) -> usize {
    let n = nslots as usize;
    let after_counters = match (dir, gpu_slots) {
        (_, false) => n * slot_bytes as usize,
        (Dir::Send, true) => n * (slot_bytes / LL_REGION_DIV) as usize,
        (Dir::Recv, true) => 0,
    };
    let bounce = match dir {
        Dir::Send => n * bounce_bytes(slot_bytes),
        Dir::Recv => 0,
    };
    STAGING as usize + after_counters + bounce
}

// A sending kernel finds the host LL regions from its tail (`FLAG_SEND_GPU`).
const _: () = assert!(STAGING - TAIL_PAGE == SEND_LL_OFFSET as u64);

/// Where the proxy finds the counters and buffers of a side's block at host address `host`
/// (of `block_bytes` bytes), whose slots are at `gpu_slots` in GPU memory if given.
fn host_block(
    host: *mut u8,
    slot_bytes: u32,
    nslots: u32,
    gpu_slots: Option<*mut u8>,
) -> HostBlock {
    // Offsets past the counter pages are within the block only where it has that part:
    // computed with a wrapping offset, never read through otherwise.
    let at = |off: u64| -> *mut u8 { host.wrapping_add(off as usize) };
    let simple = (slot_bytes - slot_bytes / LL_REGION_DIV) as usize;
    let (buf, ll, ll_stride, after) = match gpu_slots {
        None => {
            let buf = at(STAGING);
            let staging = nslots as u64 * slot_bytes as u64;
            (buf, buf.wrapping_add(simple), slot_bytes as usize, staging)
        }
        Some(gpu) => {
            let ll_stride = (slot_bytes / LL_REGION_DIV) as usize;
            (
                gpu,
                at(STAGING),
                ll_stride,
                nslots as u64 * ll_stride as u64,
            )
        }
    };
    HostBlock {
        tail: at(TAIL_PAGE) as *mut u64,
        head: at(HEAD_PAGE) as *mut u64,
        words: at(TAIL_PAGE + STEP_WORDS_OFFSET as u64) as *const u64,
        buf,
        ll,
        ll_stride,
        bounce: at(STAGING + after),
    }
}

/// A network side between its setup message and its connection.
pub(super) struct Local {
    mem: HostMapped,
    /// A receiver's listening comm.
    listen: Option<Comm>,
    net: Arc<dyn Net>,
    dev: i32,
    /// `dev`'s position in the list of devices this rank's GPU uses (the routes' device).
    slot: usize,
    /// The slots in GPU memory (`gdr`), else they are in `mem`.
    gpu_slots: Option<DeviceBuffer>,
    /// GPU slots are registered as a dma-buf (else as CUDA memory).
    dma_buf: bool,
}

/// What decides whether this rank's sides on device `dev` of `net` use GPU memory
/// (`gdr::uses_gpu_memory`): the device's properties, the GPU, their PCI paths.
fn gdr_site(setup: &Setup<'_>, net: &dyn Net, dev: i32) -> Result<gdr::Site> {
    let props = net.properties(dev)?;
    let mut site = gdr::Site {
        ptr_support: props.ptr_support,
        dma_buf: false,
        gpu_gdr: false,
        distance: gdr::SYS,
        compute_major: 0,
        gpus: 0,
    };
    if props.ptr_support & (PTR_CUDA | PTR_DMABUF) == 0 {
        return Ok(site);
    }
    let me = &setup.topo.peers[setup.topo.my_rank as usize];
    // The same PCI path types that chose the device (`topo::pci`); SYS where the GPU has none.
    site.distance = setup
        .net
        .local(setup.topo)?
        .types
        .get(dev as usize)
        .map_or(gdr::SYS, |t| t.level());
    site.gpu_gdr = crate::cuda::gpu_direct_rdma_supported(me.cuda_dev)?;
    site.dma_buf = crate::env::registry::DMABUF_ENABLE.flag()
        && net.has_dma_buf()
        && crate::cuda::dma_buf_supported(me.cuda_dev).unwrap_or(false);
    if site.dma_buf {
        log_dma_buf_once(me.cuda_dev);
    }
    site.compute_major = crate::cuda::device_attribute(
        me.cuda_dev,
        cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
    )?;
    site.gpus = crate::cuda::device_count()?;
    Ok(site)
}

/// NVIDIA's INFO line for a GPU whose memory may go to the network as dma-bufs, once per
/// device in the process.
fn log_dma_buf_once(dev: i32) {
    static LOGGED: parking_lot::Mutex<Vec<i32>> = parking_lot::Mutex::new(Vec::new());
    let mut logged = LOGGED.lock();
    if !logged.contains(&dev) {
        crate::info!(INIT, "DMA-BUF is available on GPU device {dev}");
        logged.push(dev);
    }
}

/// The network device of connection row `ch`: the routes (or the row, when there are none)
/// give a position in the list of devices this rank's GPU uses (`CommNet::local`), which
/// every rank maps to its own device, so ranks whose GPUs use different devices still agree
/// on every channel's route.
/// Returns (position in the list, device).
fn row_device(setup: &Setup<'_>, ch: u32) -> Result<(usize, i32)> {
    let local = &setup.net.local(setup.topo)?.devices;
    let slot = slot_of_row(setup.routes, ch, setup.nchannels, local.len());
    Ok((slot, local[slot] as i32))
}

/// The position in a rank's device list (of `ndev` devices) of connection row `row`.
fn slot_of_row(routes: Option<&Routes>, row: u32, nchannels: u32, ndev: usize) -> usize {
    let ndev = ndev.max(1);
    let slot = match routes {
        Some(r) => r.device_of_row(row, nchannels, ndev as i32),
        None => row as i32,
    };
    slot.max(0) as usize % ndev
}

/// Allocate this rank's block for (channel, peer, dir); a receiver also starts listening and
/// puts its handle in the setup message.
pub(super) fn local_half(setup: &Setup<'_>, ch: u32, dir: Dir) -> Result<(Half, Local)> {
    if setup.nslots > MAX_NSLOTS {
        return Err(Error::internal(format!(
            "a network connection has at most {MAX_NSLOTS} slots, not {}",
            setup.nslots
        )));
    }
    let net = setup.net.get()?;
    let (slot, dev) = row_device(setup, ch)?;
    let staging = setup.nslots as usize * setup.slot_bytes as usize;
    let site = gdr_site(setup, net.as_ref(), dev)?;
    let on_gpu = gdr::uses_gpu_memory(&site, dir, &gdr::Settings::from_env());
    let gpu_slots = match on_gpu {
        true => Some(DeviceBuffer::zeroed(staging + 2 * host_page())?),
        false => None,
    };
    let mem = HostMapped::new(block_bytes(dir, setup.slot_bytes, setup.nslots, on_gpu))?;
    let (handle, listen) = match dir {
        Dir::Recv => {
            let (h, l) = net.listen(dev)?;
            (h, Some(l))
        }
        Dir::Send => (Handle::default(), None),
    };
    let half = Half {
        local_base: mem.dev(),
        placement: Placement::Net(Box::new(handle.0)),
    };
    Ok((
        half,
        Local {
            mem,
            listen,
            net,
            dev,
            slot,
            gpu_slots,
            dma_buf: site.registers_dma_buf(),
        },
    ))
}

/// A connection side: (channel, peer, direction).
pub(super) type ConnKey = (u32, i32, Dir);

/// A network side waiting to connect: its key, its local part, the peer's handle.
pub(super) struct Pending {
    pub key: ConnKey,
    pub local: Local,
    pub theirs: Half,
}

/// Connect (senders) and accept (receivers) every pending side together, so that a network
/// needing both ends to progress at once gets them; then hand each side to the proxy.
pub(super) fn establish(
    setup: &Setup<'_>,
    pending: Vec<Pending>,
    proxy: &mut Option<Proxy>,
) -> Result<Vec<(ConnKey, Side)>> {
    let mut comms: Vec<Option<Comm>> = vec![None; pending.len()];
    let deadline = Instant::now() + Duration::from_secs(300);
    while comms.iter().any(Option::is_none) {
        for (p, slot) in pending.iter().zip(comms.iter_mut()) {
            if slot.is_none() {
                *slot = try_connect(p)?;
            }
        }
        if setup.abort.load(Ordering::Acquire) {
            return Err(Error::invalid_usage(
                "communicator aborted while connecting over the network",
            ));
        }
        if Instant::now() > deadline {
            let (ch, peer, dir) = pending[comms.iter().position(Option::is_none).unwrap()].key;
            return Err(Error::remote(format!(
                "rank {}: no network connection ({dir:?}) with rank {peer} on channel {ch} \
                 after 300 s",
                setup.topo.my_rank
            )));
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    if proxy.is_none() {
        *proxy = Some(Proxy::start(
            setup.topo.my_rank,
            Some(setup.topo.peers[setup.topo.my_rank as usize].cuda_dev),
            setup.abort.clone(),
            setup.device_abort,
            setup.sink.clone(),
        )?);
    }
    let proxy = proxy.as_ref().expect("started above");
    pending
        .into_iter()
        .zip(comms)
        .map(|(p, comm)| attach(setup, p, comm.expect("connected"), proxy))
        .collect()
}

fn try_connect(p: &Pending) -> Result<Option<Comm>> {
    let l = &p.local;
    match (p.key.2, &p.theirs.placement) {
        (Dir::Send, Placement::Net(h)) => l.net.connect(l.dev, &Handle(**h)),
        (Dir::Recv, _) => l.net.accept(l.listen.expect("a receiver listens")),
        (Dir::Send, other) => Err(Error::internal(format!(
            "network connection setup: the peer answered with {other:?}"
        ))),
    }
}

/// Register a connected side's memory, give the proxy its side, and make its `Side`.
fn attach(setup: &Setup<'_>, p: Pending, comm: Comm, proxy: &Proxy) -> Result<(ConnKey, Side)> {
    let (ch, peer, dir) = p.key;
    let Local {
        mem,
        listen,
        net,
        dev,
        slot,
        gpu_slots,
        dma_buf,
    } = p.local;
    let net_name = net.name().to_string();
    if let Some(l) = listen {
        net.close_listen(l)?;
    }
    let (slot_bytes, nslots) = (setup.slot_bytes, setup.nslots);
    let gpu_ptr = gpu_slots.as_ref().map(|g| page_aligned(g.ptr()) as *mut u8);
    let block = host_block(mem.host(), slot_bytes, nslots, gpu_ptr);
    let staging = nslots as usize * slot_bytes as usize;
    let mh = match gpu_ptr {
        Some(gpu) => register_gpu(net.as_ref(), comm, gpu, staging, dma_buf)?,
        None => net.reg_mr(comm, block.buf, staging, MemType::Host)?,
    };
    let bounce_mh = match dir {
        Dir::Send => net.reg_mr(
            comm,
            block.bounce,
            nslots as usize * bounce_bytes(slot_bytes),
            MemType::Host,
        )?,
        Dir::Recv => mh,
    };
    // A metered side needs to know where each launch's steps end (`meter`).
    let announced = match setup.meter {
        Some(_) => proxy::Announced::tracking_launches(),
        None => proxy::Announced::default(),
    };
    proxy.add(NetSide {
        net,
        comm,
        mh,
        bounce_mh,
        dir,
        peer,
        channel: ch,
        block,
        dev_head: mem.dev() + HEAD_PAGE,
        dev_tail: mem.dev() + TAIL_PAGE,
        nslots,
        slot_bytes,
        gpu_slots: gpu_slots.is_some(),
        announced: announced.clone(),
        // The meter counts by route position, as the weights it feeds are kept.
        meter: setup.meter.map(|m| m.device(slot as i32)),
    });
    let (mine, theirs) = mine_and_theirs(dir);
    let base = mem.dev();
    let mut conn = side_conn(dir, base + mine, base + theirs, slot_bytes, nslots);
    if let Some(gpu) = gpu_ptr {
        conn.buf = gpu as u64;
    }
    let me = setup.topo.my_rank;
    let dev_of = |rank: i32| {
        setup
            .topo
            .peers
            .get(rank as usize)
            .map_or(-1, |p| p.cuda_dev)
    };
    let line = connection_line(
        crate::sched::plan::logged_channel(setup.nchannels, ch),
        (me, dev_of(me)),
        (peer, dev_of(peer)),
        dir,
        &net_name,
        dev,
        gpu_slots.is_some(),
    );
    crate::info!(INIT | NET, "{line}");
    let on_gpu = gpu_slots.is_some();
    let mut keep: Vec<Keep> = vec![Box::new(mem)];
    keep.extend(gpu_slots.map(|g| Box::new(g) as Keep));
    Ok((
        (ch, peer, dir),
        Side {
            conn,
            gpu_slots: on_gpu,
            announced: (dir == Dir::Recv).then_some(announced),
            _keep: keep,
        },
    ))
}

/// The host's page size: a dma-buf covers whole pages, so GPU slots start on a page boundary
/// of a buffer two pages larger than the slots (one to reach the boundary, one to round the
/// end up).
fn host_page() -> usize {
    // SAFETY: sysconf reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).unwrap_or(4096).max(4096)
}

fn page_aligned(ptr: u64) -> u64 {
    ptr.next_multiple_of(host_page() as u64)
}

/// Register `bytes` of GPU memory at `ptr` with the network: as a dma-buf of it (`dma_buf`,
/// NVIDIA's choice where the device and the GPU allow it), else as CUDA memory.
fn register_gpu(
    net: &dyn Net,
    comm: Comm,
    ptr: *mut u8,
    bytes: usize,
    dma_buf: bool,
) -> Result<MemHandle> {
    if !dma_buf {
        return net.reg_mr(comm, ptr, bytes, MemType::Cuda);
    }
    use std::os::fd::AsRawFd;
    let fd = crate::cuda::dma_buf_fd(ptr as u64, bytes.next_multiple_of(host_page()))?;
    net.reg_mr_dma_buf(comm, ptr, bytes, 0, fd.as_raw_fd())
}

/// NVIDIA's INFO line for a network connection `(channel, connection index)` between this
/// rank and `peer` (each `(rank, device)`), sender first: `Channel 00/0 : 1[0] -> 0[0]
/// [receive] via NET/Socket/0`, and `/GDRDMA` when the side's slots are in GPU memory (either
/// direction).
fn connection_line(
    (ch, conn): (u32, u32),
    me: (i32, i32),
    peer: (i32, i32),
    dir: Dir,
    net: &str,
    dev: i32,
    gdr: bool,
) -> String {
    let (from, to, what) = match dir {
        Dir::Send => (me, peer, "send"),
        Dir::Recv => (peer, me, "receive"),
    };
    format!(
        "Channel {ch:02}/{conn} : {}[{}] -> {}[{}] [{what}] via NET/{net}/{dev}{}",
        from.0,
        from.1,
        to.0,
        to.1,
        if gdr { "/GDRDMA" } else { "" }
    )
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod hosts_tests;

#[cfg(test)]
mod layout_tests {
    use super::*;

    #[test]
    fn a_network_is_picked_by_name_or_first() {
        let nets: Vec<Arc<dyn Net>> = ["OxTest", "Socket"]
            .iter()
            .map(|_| {
                let lo = crate::bootstrap::socket::NetIf {
                    name: "lo".into(),
                    ip: "127.0.0.1".parse().unwrap(),
                    scope_id: 0,
                };
                Arc::new(socket::SocketNet::new(lo, socket::Shape::new(0, 1))) as Arc<dyn Net>
            })
            .collect();
        assert!(Arc::ptr_eq(&pick(&nets, None).unwrap(), &nets[0]));
        assert!(Arc::ptr_eq(&pick(&nets, Some(" ")).unwrap(), &nets[0]));
        assert!(Arc::ptr_eq(&pick(&nets, Some("socket")).unwrap(), &nets[0]));
        let e = pick(&nets, Some("IB")).err().unwrap();
        assert!(
            e.msg
                .contains("IB: no such network (available: Socket, Socket)"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn speed_overrides_name_devices_and_bad_entries_are_set_aside() {
        let (good, bad) = parse_speed_overrides(" oxf=4000, oxs = 1000 ,,x=0,y,=5,z=fast");
        assert_eq!(good, vec![("oxf".into(), 4000), ("oxs".into(), 1000)]);
        assert_eq!(bad, vec!["x=0", "y", "=5", "z=fast"]);
        assert_eq!(parse_speed_overrides(""), (vec![], vec![]));
    }

    #[test]
    fn ranks_whose_gpus_use_different_devices_agree_on_every_route() {
        use crate::sched::weights::RouteClaim;
        let claim = |speeds: &[u32]| RouteClaim {
            speeds_mbps: speeds.to_vec(),
            weighted: true,
            hop_mbps: 0,
            adaptive: false,
        };
        // Rank 0's GPU uses devices 0 and 2 of its host, rank 1's devices 3 and 1; the first
        // of each is 4x as fast as the second.
        let local = [vec![0usize, 2], vec![3usize, 1]];
        let speed_of = [[4000u32, 0, 1000, 0], [0, 1000, 0, 4000]];
        let claims: Vec<RouteClaim> = (0..2)
            .map(|r| claim(&local[r].iter().map(|&d| speed_of[r][d]).collect::<Vec<_>>()))
            .collect();
        let (routes, verdict) = Routes::agree(16, &claims);
        assert_eq!(verdict, Verdict::Weighted);
        let nch = 16;
        for row in 0..2 * nch {
            let slots: Vec<usize> = (0..2)
                .map(|_| slot_of_row(Some(&routes), row, nch, 2))
                .collect();
            assert_eq!(slots[0], slots[1], "row {row}");
            // Each rank's device on that route is its own, of the same speed.
            let devs: Vec<usize> = (0..2).map(|r| local[r][slots[r]]).collect();
            assert_eq!(speed_of[0][devs[0]], speed_of[1][devs[1]], "row {row}");
        }
        // 13 of 16 channels on the fast devices: devices 0 and 3.
        let fast = (0..nch)
            .filter(|&c| slot_of_row(Some(&routes), c, nch, 2) == 0)
            .count();
        assert_eq!(fast, 13);
        // Ranks using different numbers of devices: even routes, each rank round robin over
        // its own list.
        let (even, verdict) = Routes::agree(16, &[claim(&[4000]), claim(&[1000, 1000])]);
        assert_eq!(verdict, Verdict::DeviceCounts);
        assert_eq!(slot_of_row(Some(&even), 5, 16, 1), 0);
        assert_eq!(slot_of_row(Some(&even), 5, 16, 2), 1);
        assert_eq!(slot_of_row(None, 7, 16, 3), 1);
        assert_eq!(slot_of_row(None, 7, 16, 0), 0);
    }

    #[test]
    fn connection_lines_are_nvidias() {
        assert_eq!(
            connection_line((0, 0), (0, 0), (1, 0), Dir::Recv, "OxTest", 0, true),
            "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/OxTest/0/GDRDMA"
        );
        assert_eq!(
            connection_line((13, 0), (2, 1), (5, 3), Dir::Send, "Socket", 1, false),
            "Channel 13/0 : 2[1] -> 5[3] [send] via NET/Socket/1"
        );
        // A P2P row (channel 2 of 4 channels' P2P rows): NVIDIA's P2P connection index 1.
        assert_eq!(
            connection_line(
                crate::sched::plan::logged_channel(4, 6),
                (0, 0),
                (1, 0),
                Dir::Send,
                "Socket",
                0,
                false
            ),
            "Channel 02/1 : 0[0] -> 1[0] [send] via NET/Socket/0"
        );
        assert_eq!(crate::sched::plan::logged_channel(4, 3), (3, 0));
        assert_eq!(crate::sched::plan::logged_channel(4, 9), (1, 0));
    }

    #[test]
    fn one_block_holds_both_roles_of_the_shared_layout() {
        for dir in [Dir::Send, Dir::Recv] {
            let (mine, theirs) = mine_and_theirs(dir);
            let c = side_conn(dir, 1 << 20 | mine, 1 << 20 | theirs, 65536, 8);
            assert_eq!(c.head, 1 << 20 | HEAD_PAGE);
            assert_eq!(c.tail, 1 << 20 | TAIL_PAGE);
            assert_eq!(c.buf, 1 << 20 | STAGING);
            // The step word array and the position do not overlap the counters.
            let step_off = c.step - (1 << 20);
            assert!(step_off % 4096 == 64, "{dir:?}: step at {step_off}");
            assert!(STEP_WORDS_OFFSET as u64 + 8 * MAX_NSLOTS as u64 <= 4096);
        }
        assert_eq!(block_bytes(Dir::Recv, 65536, 8, false), 8192 + 8 * 65536);
        assert_eq!(
            block_bytes(Dir::Send, 65536, 8, false),
            8192 + 8 * 65536 + 8 * (8192 + 8)
        );
        // Slots in GPU memory: a receiver keeps the counter pages, a sender also its host
        // LL regions (8 KiB of each 64 KiB slot) and its bounce area.
        assert_eq!(block_bytes(Dir::Recv, 65536, 8, true), 8192);
        assert_eq!(
            block_bytes(Dir::Send, 65536, 8, true),
            8192 + 8 * 8192 + 8 * (8192 + 8)
        );
    }
}
