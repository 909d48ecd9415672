//! Communicator lifecycle: init (one rank, all local devices, several roots), split, shrink,
//! grow (its arguments and id exchange in `grow.rs`), revoke, finalize, destroy and abort. Creation returns the handle at once; the rendezvous
//! runs now (blocking, outside a group), at the outermost `ncclGroupEnd` (inside a group), or
//! in the background (non-blocking communicators, which report `ncclInProgress` meanwhile).

use super::group;
use super::runtime::Runtime;
use super::watchdog::{self, wire::Departure};
use super::{Comm, CommConfig};
use crate::abi::{
    ncclComm_t, ncclConfig_t, ncclResult_t, ncclUniqueId, NCCL_SHRINK_ABORT, NCCL_SPLIT_NOCOLOR,
};
use crate::bootstrap::Bootstrap;
use crate::cuda;
use crate::error::{Error, Result};
use crate::sched::NetLink;
use crate::topo::{self, PeerInfo, Topology};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a new communicator finds its peers.
pub enum Origin {
    /// From unique ids (`ncclCommInitRank*`, `ncclCommInitAll`).
    Ids(Vec<ncclUniqueId>),
    /// From a parent: split by color and key. `child` is None for NCCL_SPLIT_NOCOLOR.
    Split {
        parent: Arc<Comm>,
        color: i32,
        key: i32,
    },
    /// From a parent without the excluded ranks.
    Shrink {
        parent: Arc<Comm>,
        exclude: Vec<i32>,
        flags: i32,
    },
    /// Grown from a parent (None for a new rank) with the grow's id (None for the existing
    /// ranks other than the root, who learn it from the root).
    Grow {
        parent: Option<Arc<Comm>>,
        id: Option<ncclUniqueId>,
    },
}

impl Origin {
    /// The entry point that makes such a communicator, as NVIDIA's lifecycle lines name it.
    pub fn function(&self) -> &'static str {
        match self {
            Origin::Ids(_) => "ncclCommInitRank",
            Origin::Split { .. } => "ncclCommSplit",
            Origin::Shrink { .. } => "ncclCommShrink",
            Origin::Grow { .. } => "ncclCommGrow",
        }
    }

    /// The parent communicator, if the communicator has one.
    fn parent(&self) -> Option<&Arc<Comm>> {
        match self {
            Origin::Ids(_) => None,
            Origin::Split { parent, .. } | Origin::Shrink { parent, .. } => Some(parent),
            Origin::Grow { parent, .. } => parent.as_ref(),
        }
    }
}

/// One pending creation: the child (if this rank gets one) and where it comes from.
pub struct InitJob {
    pub child: Option<Arc<Comm>>,
    pub origin: Origin,
}

/// Publish `comm`, store its handle for the caller, and run or defer its init.
pub(super) fn start(out: *mut ncclComm_t, job: InitJob) -> Result<()> {
    match &job.child {
        Some(c) => {
            let handle = Comm::register(c.clone());
            // SAFETY: the API layer checked `out` is a writable, non-NULL handle slot.
            unsafe { *out = handle };
            c.set_async_state(ncclResult_t::ncclInProgress);
        }
        // NCCL_SPLIT_NOCOLOR: no communicator, and NVIDIA's library says so with NULL.
        // SAFETY: as above.
        None => unsafe { *out = std::ptr::null_mut() },
    }
    // A NOCOLOR rank (no child) takes part in the parent's exchange as a blocking one does.
    group::submit_init(group::InitWork {
        blocking: job.child.as_ref().is_none_or(|c| c.config.blocking),
        run: Box::new(move || run_job(&job)),
    })
}

/// What a communicator's creation prints once per process, as NVIDIA's does: the version
/// line, and here also the NVIDIA settings that are set but not built.
pub fn announce(rank: i32) {
    crate::debug::show_version(rank);
    crate::env::not_built::report_once();
}

/// `ncclCommInitRank[Config|Scalable]`: join the communicator described by `ids`.
pub fn init_rank(
    out: *mut ncclComm_t,
    nranks: i32,
    ids: &[ncclUniqueId],
    rank: i32,
    cfg: Option<&ncclConfig_t>,
) -> Result<()> {
    announce(rank);
    let config = CommConfig::resolve(cfg, None)?;
    crate::bootstrap::crypt::check_plaintext("communicator init")?;
    cuda::driver()?;
    let dev = cuda::current_device()?;
    let comm = Arc::new(Comm::new(rank, nranks, dev, config));
    start(
        out,
        InitJob {
            child: Some(comm),
            origin: Origin::Ids(ids.to_vec()),
        },
    )
}

/// `ncclCommInitAll`: one communicator per listed device, in this process.
pub fn init_all(devs: &[i32]) -> Result<Vec<ncclComm_t>> {
    announce(0);
    crate::bootstrap::crypt::check_plaintext("communicator init")?;
    cuda::driver()?;
    let n = cuda::device_count()?;
    for (i, &d) in devs.iter().enumerate() {
        if d < 0 || d >= n {
            return Err(Error::invalid_argument(format!(
                "devlist[{i}] = {d} is not a valid CUDA device ({n} visible)"
            )));
        }
    }
    let id = crate::bootstrap::get_unique_id()?;
    let nranks = devs.len() as i32;
    let comms: Vec<Arc<Comm>> = devs
        .iter()
        .enumerate()
        .map(|(r, &d)| Arc::new(Comm::new(r as i32, nranks, d, CommConfig::from_env())))
        .collect();
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| s.spawn(|| init_comm(c, &Origin::Ids(vec![id]))))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::internal("init thread panicked")))
            })
            .collect()
    });
    if let Some(e) = results.into_iter().find_map(|r| r.err()) {
        return Err(e);
    }
    Ok(comms
        .into_iter()
        .map(|c| {
            c.set_async_state(ncclResult_t::ncclSuccess);
            Comm::register(c)
        })
        .collect())
}

/// Complete a job: run `init_comm` and settle the child's async state. NOCOLOR ranks take part
/// in the parent's exchange and get no communicator.
fn run_job(job: &InitJob) -> Result<()> {
    let result = match &job.child {
        Some(c) => init_comm(c, &job.origin),
        // A NOCOLOR rank still counts the split, so that every parent rank numbers the
        // next split's rendezvous alike.
        None => members_of(&job.origin, None).map(|_| {
            if let Origin::Split { parent, .. } = &job.origin {
                parent.children.fetch_add(1, Ordering::AcqRel);
            }
        }),
    };
    if let Some(c) = &job.child {
        match &result {
            Ok(()) => c.set_async_state(ncclResult_t::ncclSuccess),
            Err(e) => {
                c.set_async_state(ncclResult_t::ncclSuccess);
                c.set_async_error(e);
            }
        }
    }
    result
}

/// The parent ranks of the new communicator in new-rank order, and this rank's position, for
/// split and shrink (None for init from ids, or for a NOCOLOR rank).
fn members_of(origin: &Origin, _child: Option<&Comm>) -> Result<Option<(Vec<i32>, i32)>> {
    match origin {
        Origin::Ids(_) | Origin::Grow { .. } => Ok(None),
        Origin::Split { parent, color, key } => {
            let rt = parent.rt.lock();
            let rt = rt
                .as_ref()
                .ok_or_else(|| Error::invalid_usage("parent communicator is not initialised"))?;
            let mut mine = Vec::with_capacity(12);
            mine.extend_from_slice(&color.to_le_bytes());
            mine.extend_from_slice(&key.to_le_bytes());
            mine.extend_from_slice(&parent.rank().to_le_bytes());
            let all = rt.bootstrap.allgather(&mine)?;
            let entries: Vec<(i32, i32, i32)> = all
                .iter()
                .map(|b| {
                    let at = |o: usize| i32::from_le_bytes(b[o..o + 4].try_into().unwrap());
                    (at(0), at(4), at(8))
                })
                .collect();
            Ok(split_members(&entries, *color, parent.rank()))
        }
        Origin::Shrink {
            parent, exclude, ..
        } => {
            let members = shrink_members(parent.nranks(), exclude);
            let pos = members
                .iter()
                .position(|&r| r == parent.rank())
                .ok_or_else(|| {
                    Error::invalid_usage(format!(
                        "rank {} is in the exclude list and cannot call ncclCommShrink",
                        parent.rank()
                    ))
                })?;
            Ok(Some((members, pos as i32)))
        }
    }
}

/// Split arithmetic: given every parent rank's (color, key, parent rank), the members of
/// `color` ordered by (key, parent rank), and `me`'s position; None for NOCOLOR.
pub fn split_members(entries: &[(i32, i32, i32)], color: i32, me: i32) -> Option<(Vec<i32>, i32)> {
    if color == NCCL_SPLIT_NOCOLOR {
        return None;
    }
    let mut same: Vec<(i32, i32)> = entries
        .iter()
        .filter(|e| e.0 == color)
        .map(|e| (e.1, e.2))
        .collect();
    same.sort();
    let members: Vec<i32> = same.into_iter().map(|(_, r)| r).collect();
    let pos = members.iter().position(|&r| r == me)? as i32;
    Some((members, pos))
}

/// Shrink arithmetic: the parent's ranks minus the excluded ones, in order.
pub fn shrink_members(nranks: i32, exclude: &[i32]) -> Vec<i32> {
    (0..nranks).filter(|r| !exclude.contains(r)).collect()
}

/// Rendezvous, topology and device state for `comm`.
fn init_comm(comm: &Arc<Comm>, origin: &Origin) -> Result<()> {
    let start = Instant::now();
    let _counted = cuda::account_into(&comm.mem.persistent);
    let ctx = cuda::use_device(comm.cuda_dev)?;
    let (bootstrap, comm_hash) = match origin {
        Origin::Ids(ids) => {
            let b = Bootstrap::init(ids, comm.rank(), comm.nranks(), comm.abort.clone())?;
            let bytes: Vec<u8> = ids[0].internal.iter().map(|&c| c as u8).collect();
            (b, topo::fnv1a(&bytes))
        }
        Origin::Grow { parent, id } => super::grow::bootstrap(comm, parent.as_ref(), id.as_ref())?,
        Origin::Split { parent, .. } | Origin::Shrink { parent, .. } => {
            if let Origin::Shrink { flags, .. } = origin {
                if flags & NCCL_SHRINK_ABORT != 0 {
                    stop_kernels(parent);
                }
            }
            let (members, pos) = members_of(origin, Some(comm))?
                .ok_or_else(|| Error::internal("a child communicator without members"))?;
            comm.set_rank(pos, members.len() as i32);
            let tag = parent.children.fetch_add(1, Ordering::AcqRel);
            let rt = parent.rt.lock();
            let rt = rt
                .as_ref()
                .ok_or_else(|| Error::invalid_usage("parent communicator is not initialised"))?;
            let b = rt.bootstrap.sub(&members, tag, comm.abort.clone())?;
            (b, child_hash(rt.comm_hash(), tag, &members))
        }
    };
    let bootstrap_s = start.elapsed().as_secs_f64();
    let bus_id = cuda::pci_bus_id(comm.cuda_dev)?;
    let ident = Ident::of(comm, &bus_id);
    let _ = comm.bus_id.set(ident.bus_id);
    crate::info!(
        INIT,
        "[Rank {}] {} commId {comm_hash:#x} - Init START",
        comm.rank(),
        ident.head(comm, origin)
    );
    // The rest of init, where threads start and host buffers are first touched, runs on the
    // CPUs near the GPU, as NVIDIA's does; the runtime keeps them for its connections.
    let cpus = topo::affinity::for_gpu(&topo::pci::Sysfs::system(), &bus_id, comm.cuda_dev);
    let _pinned = topo::affinity::Pinned::enter(cpus.as_deref());
    let me = PeerInfo {
        rank: comm.rank(),
        host_hash: topo::host_hash(),
        pid: std::process::id(),
        cuda_dev: comm.cuda_dev,
        nvlinks: topo::file::nvlinks(&bus_id, || topo::nvml::nvlink_count(&bus_id))?,
        bus_id,
        host: crate::debug::hostname(),
        gpu_uuid: cuda::device_uuid(comm.cuda_dev)?,
    };
    let allgather_start = Instant::now();
    let peers = bootstrap
        .allgather(&me.to_bytes())?
        .iter()
        .map(|b| PeerInfo::from_bytes(b))
        .collect::<Result<Vec<_>>>()?;
    let mut allgathers_s = allgather_start.elapsed().as_secs_f64();
    let topo_start = Instant::now();
    let topo = Topology::new(peers, comm.rank(), cuda::device_by_pci_bus_id, |a, b| {
        cuda::can_access_peer(a, b).unwrap_or(false)
    })?;
    topo.log();
    crate::transport::net::dump_topology(comm.config.net_name.as_deref(), &topo);
    comm.local_rank.store(topo.local_rank(), Ordering::Release);
    comm.local_nranks
        .store(topo.local_ranks.len() as i32, Ordering::Release);
    let topo_s = topo_start.elapsed().as_secs_f64();
    crate::info!(
        INIT,
        "comm {:p} rank {} nRanks {} nNodes {} localRanks {} localRank {} MNNVL 0",
        Arc::as_ptr(comm),
        comm.rank(),
        comm.nranks(),
        topo.nnodes(),
        topo.local_ranks.len(),
        topo.local_rank()
    );
    let agree_start = Instant::now();
    let nchannels =
        (crate::sched::NCHANNELS as i32).clamp(comm.config.min_ctas, comm.config.max_ctas) as u32;
    let nchannels = shared_gpu_channels(&topo, &bootstrap, comm.cuda_dev, nchannels)?;
    let (net_link, routes) = agree_net_link(
        &topo,
        &bootstrap,
        comm.config.net_name.as_deref(),
        nchannels,
    )?;
    allgathers_s += agree_start.elapsed().as_secs_f64();
    crate::info!(
        INIT,
        "{nchannels} coll channels, 0 collnet channels, 0 nvls channels, {nchannels} p2p channels, \
         {} p2p channels per peer",
        crate::sched::cost::p2p_channels_per_peer(nchannels)
    );
    // The names of the devices the routes' positions stand for, for the weights' INFO lines.
    let device_names =
        crate::transport::net::local_device_names(comm.config.net_name.as_deref(), &topo);
    let (topo_nranks, topo_nnodes) = (topo.peers.len(), topo.nnodes());
    let mut rt = Runtime::new(
        ctx,
        bootstrap,
        topo,
        nchannels,
        comm_hash,
        comm.abort.clone(),
        async_error_sink(comm),
    )?;
    if let Some(plugin) = crate::plugin::tuner::load() {
        let tuner = plugin.init(comm_hash, topo_nranks, topo_nnodes)?;
        rt.set_tuner(Arc::new(tuner));
    }
    rt.set_cpus(cpus);
    rt.set_net_link(net_link, routes);
    rt.start_adaptive_weights(comm.weights.clone(), device_names, comm.abort.clone())?;
    rt.set_network(comm.config.net_name.clone(), comm.config.traffic_class);
    rt.count_connections_into(comm.mem.suspendable.clone());
    let connect_start = Instant::now();
    if !crate::env::registry::RUNTIME_CONNECT.flag() {
        rt.connect_rings(comm.rank(), comm.nranks())?;
    }
    let connections_s = connect_start.elapsed().as_secs_f64();
    *comm.rt.lock() = Some(rt);
    super::watchdog::start(comm);
    log_init_complete(comm, origin, &ident, comm_hash);
    let total = start.elapsed().as_secs_f64();
    crate::info!(
        INIT | PROFILE,
        "Init timings - {}: rank {} nranks {} total {:.2} (kernels 0.00, alloc 0.00, bootstrap {:.2}, \
         allgathers {:.2}, topo {:.2}, graphs 0.00, connections {:.2}, rest {:.2})",
        origin.function(),
        comm.rank(),
        comm.nranks(),
        total,
        bootstrap_s,
        allgathers_s,
        topo_s,
        connections_s,
        (total - bootstrap_s - allgathers_s - topo_s - connections_s).max(0.0)
    );
    Ok(())
}

/// How NVIDIA's lifecycle lines name a communicator's GPU: its NVML index (the bus-id order
/// of the machine's GPUs; the CUDA device where sysfs does not say) and its bus id as a number.
struct Ident {
    nvml_dev: i32,
    bus_id: i64,
}

impl Ident {
    /// What NVIDIA's init lines start with: `ncclCommInitRank comm 0x.. rank 0 nranks 2
    /// cudaDev 0 nvmlDev 0 busId 1b000`.
    fn head(&self, comm: &Arc<Comm>, origin: &Origin) -> String {
        format!(
            "{} comm {:p} rank {} nranks {} cudaDev {} nvmlDev {} busId {:x}",
            origin.function(),
            Arc::as_ptr(comm),
            comm.rank(),
            comm.nranks(),
            comm.cuda_dev,
            self.nvml_dev,
            self.bus_id
        )
    }

    fn of(comm: &Comm, bus_id: &str) -> Ident {
        Ident {
            nvml_dev: topo::pci::Sysfs::system()
                .gpu_ordinal(bus_id)
                .map_or(comm.cuda_dev, |o| o as i32),
            bus_id: topo::pci::bus_id_value(bus_id),
        }
    }
}

/// NVIDIA's `Init COMPLETE` line: a child names its parent, the parent's children so far,
/// and its color and key.
fn log_init_complete(comm: &Arc<Comm>, origin: &Origin, ident: &Ident, comm_hash: u64) {
    let head = ident.head(comm, origin);
    match origin.parent() {
        Some(parent) => {
            let (color, key) = match origin {
                Origin::Split { color, key, .. } => (*color, *key),
                _ => (0, comm.rank()),
            };
            crate::info!(
                INIT,
                "{head} parent {:p} childCount {} color {color} key {key} - Init COMPLETE",
                Arc::as_ptr(parent),
                parent.children.load(Ordering::Acquire)
            );
        }
        None => crate::info!(INIT, "{head} commId {comm_hash:#x} - Init COMPLETE"),
    }
}

/// What a rank says at init about the network: whether it uses it (`Topology::uses_net`),
/// and the link its channels get there (None when it uses the network but could not load it:
/// its first connection over it reports why).
#[derive(Clone, Copy, Debug, PartialEq)]
struct NetClaim {
    uses: bool,
    link: Option<NetLink>,
}

const NET_CLAIM_BYTES: usize = 17;

impl NetClaim {
    fn to_bytes(self) -> [u8; NET_CLAIM_BYTES] {
        let mut b = [0u8; NET_CLAIM_BYTES];
        b[0] = match (self.uses, self.link) {
            (false, _) => 0,
            (true, None) => 1,
            (true, Some(_)) => 2,
        };
        if let (true, Some(l)) = (self.uses, self.link) {
            b[1..9].copy_from_slice(&l.gbps.to_le_bytes());
            b[9..17].copy_from_slice(&l.latency_us.to_le_bytes());
        }
        b
    }

    fn from_bytes(b: &[u8]) -> Option<NetClaim> {
        if b.len() != NET_CLAIM_BYTES {
            return None;
        }
        let f64_at = |o: usize| f64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let link = NetLink {
            gbps: f64_at(1),
            latency_us: f64_at(9),
        };
        match b[0] {
            0 => Some(NetClaim {
                uses: false,
                link: None,
            }),
            1 => Some(NetClaim {
                uses: true,
                link: None,
            }),
            2 => Some(NetClaim {
                uses: true,
                link: Some(link),
            }),
            _ => None,
        }
    }
}

/// The link every rank plans with: None when no rank uses the network, else the slowest link
/// any rank reported (NCCL plans a ring for its slowest link), or a default device's
/// (`NET_DEFAULT_MBPS`) when none could say.
fn agreed_link(claims: &[NetClaim]) -> Option<NetLink> {
    if !claims.iter().any(|c| c.uses) {
        return None;
    }
    let reported = claims
        .iter()
        .filter_map(|c| c.link)
        .reduce(NetLink::slowest);
    Some(reported.unwrap_or_else(|| NetLink::from_properties(0, 0.0)))
}

/// Agree at init on the network link the planner uses, so that every rank plans alike: each
/// rank says whether it uses the network and what its `nchannels` channels get of it (the
/// network `net_name` picks), and all take `agreed_link`; with it, each rank's network devices
/// (`transport::net::route_claim`), from which all take the same channel routes
/// (`sched::weights`). Every rank of a communicator of more than one rank that uses the
/// network takes part; the others have no link to agree on.
fn agree_net_link(
    topo: &Topology,
    bootstrap: &Bootstrap,
    net_name: Option<&str>,
    nchannels: u32,
) -> Result<(Option<NetLink>, crate::sched::Routes)> {
    // `uses_net` answers alike on every rank (planning relies on it too), so a communicator
    // within one host's P2P/SHM reach skips the exchange on every rank.
    if topo.peers.len() <= 1 || !topo.uses_net() {
        return Ok((None, crate::sched::Routes::even()));
    }
    let link = match crate::transport::net::link(net_name, topo, nchannels) {
        Ok(l) => Some(l),
        Err(e) => {
            crate::info!(
                INIT | NET,
                "rank {}: no network properties for the cost model: {}",
                topo.my_rank,
                e.msg
            );
            None
        }
    };
    let next = super::runtime::ring_order(topo).next_of(topo.my_rank);
    let hop = topo.paths[next as usize].in_node_mbps().unwrap_or(0);
    let mut mine = NetClaim { uses: true, link }.to_bytes().to_vec();
    mine.extend(crate::transport::net::route_claim(net_name, topo, hop).to_bytes());
    let all = bootstrap.allgather(&mine)?;
    let (claims, route_claims): (Vec<_>, Vec<_>) = all
        .iter()
        .enumerate()
        .map(|(rank, b)| {
            let (net, routes) = b.split_at(b.len().min(NET_CLAIM_BYTES));
            NetClaim::from_bytes(net)
                .zip(crate::sched::weights::RouteClaim::from_bytes(routes))
                .ok_or_else(|| {
                    Error::internal(format!(
                        "rank {rank} sent {} bytes that are no network claim",
                        b.len()
                    ))
                })
        })
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    let (routes, verdict) = crate::sched::Routes::agree(nchannels, &route_claims);
    crate::transport::net::log_routes(topo, &routes, verdict, nchannels, net_name);
    let agreed = agreed_link(&claims);
    if let Some(l) = agreed {
        crate::info!(
            INIT | NET,
            "rank {}: rings cross the network; planning for its slowest link: {:.3} GB/s, {:.1} us",
            topo.my_rank,
            l.gbps,
            l.latency_us
        );
    }
    Ok((agreed, routes))
}

/// A child communicator's identity, the same on all of its ranks: from its parent's (itself
/// the same on every parent rank), the split's sequence number and the members.
pub fn child_hash(parent: u64, tag: u64, members: &[i32]) -> u64 {
    let mut bytes = Vec::with_capacity(16 + 4 * members.len());
    bytes.extend_from_slice(&parent.to_le_bytes());
    bytes.extend_from_slice(&tag.to_le_bytes());
    for m in members {
        bytes.extend_from_slice(&m.to_le_bytes());
    }
    topo::fnv1a(&bytes)
}

/// Channels of a communicator whose ranks share GPUs: every CTA of every rank on one GPU must
/// be resident at once (their kernels wait on each other), so each rank gets at most its share
/// of what its GPU holds (occupancy × SMs / ranks on the GPU), the same on every rank (the
/// minimum over all, agreed through the bootstrap). `nchannels` when no GPU is shared.
fn shared_gpu_channels(
    topo: &Topology,
    bootstrap: &Bootstrap,
    dev: i32,
    nchannels: u32,
) -> Result<u32> {
    if topo.max_ranks_per_gpu() <= 1 {
        return Ok(nchannels);
    }
    let sharing = topo.gpu_ranks();
    let resident = cuda::module::resident_ctas(dev, super::runtime::block_threads())?;
    let mine = resident / sharing.len() as u32;
    let all = bootstrap.allgather(&mine.to_le_bytes())?;
    let mut share = u32::MAX;
    for (rank, bytes) in all.iter().enumerate() {
        let theirs: [u8; 4] = bytes.as_slice().try_into().map_err(|_| {
            Error::internal(format!(
                "rank {rank} sent {} bytes for its CTA share, expected 4",
                bytes.len()
            ))
        })?;
        share = share.min(u32::from_le_bytes(theirs));
    }
    if share == 0 {
        return Err(Error::invalid_usage(format!(
            "{} ranks share one GPU but it holds only {resident} CTAs of this library's kernel at \
             once: too many ranks per GPU",
            sharing.len()
        )));
    }
    let capped = nchannels.min(share);
    crate::info!(
        INIT,
        "rank {} shares its GPU {} with ranks {:?}: {} CTAs resident per GPU, channels {} -> {}",
        topo.my_rank,
        topo.peers[topo.my_rank as usize].bus_id,
        sharing,
        resident,
        nchannels,
        capped
    );
    log_process_sharing(topo, &sharing);
    Ok(capped)
}

/// One INFO line when ranks of other processes share this rank's GPU: without MPS the GPU
/// time-slices between processes (correct, but each kernel waits for the others' slices).
fn log_process_sharing(topo: &Topology, sharing: &[i32]) {
    let me = &topo.peers[topo.my_rank as usize];
    let others: Vec<i32> = sharing
        .iter()
        .copied()
        .filter(|&r| topo.peers[r as usize].pid != me.pid)
        .collect();
    if others.is_empty() {
        return;
    }
    if topo::mps_active() {
        crate::info!(
            INIT,
            "rank {} shares its GPU with ranks {:?} of other processes: MPS is running, so their \
             kernels run side by side",
            me.rank,
            others
        );
    } else {
        crate::info!(
            INIT,
            "rank {} shares its GPU with ranks {:?} of other processes without MPS: the GPU \
             time-slices between processes, so results are correct but each operation waits for \
             the others' time slices (milliseconds); run the ranks in one process or start MPS",
            me.rank,
            others
        );
    }
}

/// Where `comm`'s transports report a peer's connection failing after the call that used it
/// returned (the network proxy): the watchdog's peer failure, which sets the communicator's
/// async error naming the peer, stops its kernels and tells the other ranks.
fn async_error_sink(comm: &Arc<Comm>) -> crate::transport::ErrorSink {
    let reporter = watchdog::FailureReporter::new(comm);
    Arc::new(move |peer: i32, e: Error| {
        reporter.report(
            peer,
            e.code == crate::abi::ncclResult_t::ncclRemoteError,
            &e.msg,
        )
    })
}

/// Abort: every host wait of `comm` gives up, and its kernels stop.
fn abort_operations(comm: &Comm) {
    comm.abort.store(true, Ordering::Release);
    stop_kernels(comm);
}

/// Ask running kernels to stop and wait briefly for them (host-side waits continue, so the
/// bootstrap stays usable, e.g. for a shrink).
fn stop_kernels(comm: &Comm) {
    if let Some(rt) = comm.rt.lock().as_ref() {
        rt.signal_device_abort();
        if cuda::set_current(rt.ctx).is_ok() {
            super::window::release_waits(comm);
        }
        if !rt.drain(Duration::from_secs(10)) {
            crate::warn!(
                "rank {}: kernels did not stop within 10 s of the abort",
                comm.rank()
            );
        }
    }
}

/// `ncclCommFinalize`: wait for every issued operation.
pub fn finalize(comm: &Arc<Comm>) -> Result<()> {
    if comm.aborted() {
        return Err(Error::invalid_usage("communicator was aborted"));
    }
    if let Some(rt) = comm.rt.lock().as_ref() {
        rt.quiesce(&comm.abort)?;
        rt.drain_network(NETWORK_DRAIN_LIMIT);
    }
    Ok(())
}

/// How long an orderly finalize or destroy lets the network proxy send what finished kernels
/// left for it (a peer still receiving it takes it; a dead peer fails it at once).
const NETWORK_DRAIN_LIMIT: Duration = Duration::from_secs(300);

/// `ncclCommDestroy` (waits for issued work) / `ncclCommAbort` (stops it), with NVIDIA's
/// `DESTROY` lines.
pub fn destroy(handle: ncclComm_t, abort: bool) -> Result<()> {
    let comm = Comm::from_handle(handle)?;
    let said = |what: &str| {
        let bus_id = comm.bus_id.get().copied().unwrap_or(0);
        crate::info!(
            DESTROY,
            "comm {:p} rank {} nranks {} cudaDev {} busId {bus_id:x} - {what}",
            Arc::as_ptr(&comm),
            comm.rank(),
            comm.nranks(),
            comm.cuda_dev
        );
    };
    if abort {
        said("Abort START");
        // The farewell says what completed before the abort ends the rest.
        watchdog::stop(&comm, Departure::Aborted);
        abort_operations(&comm);
    } else {
        if let Some(rt) = comm.rt.lock().as_ref() {
            rt.quiesce(&comm.abort)?;
            rt.drain_network(NETWORK_DRAIN_LIMIT);
        }
        watchdog::stop(&comm, Departure::Destroyed);
    }
    comm.mark_destroyed();
    Comm::unregister(handle);
    // Free device state now (the Arc may outlive this call in another thread's hands).
    drop(comm.rt.lock().take());
    said(if abort {
        "Abort COMPLETE"
    } else {
        "Destroy COMPLETE"
    });
    Ok(())
}

/// `ncclCommRevoke`: stop in-flight operations; only destroy, split and shrink remain allowed.
pub fn revoke(comm: &Arc<Comm>) -> Result<()> {
    comm.revoked.store(true, Ordering::Release);
    if let Some(rt) = comm.rt.lock().as_ref() {
        rt.signal_device_abort();
        if !rt.drain(Duration::from_secs(10)) {
            return Err(Error::internal(
                "kernels did not stop within 10 s of ncclCommRevoke",
            ));
        }
        rt.clear_device_abort();
    }
    Ok(())
}

/// `ncclCommSplit`.
pub fn split(
    parent: &Arc<Comm>,
    color: i32,
    key: i32,
    out: *mut ncclComm_t,
    cfg: Option<&ncclConfig_t>,
) -> Result<()> {
    parent.check_live()?;
    let child = if color == NCCL_SPLIT_NOCOLOR {
        None
    } else {
        let config = CommConfig::resolve(cfg, Some(&parent.config))?;
        Some(Arc::new(Comm::new(0, 0, parent.cuda_dev, config)))
    };
    start(
        out,
        InitJob {
            child,
            origin: Origin::Split {
                parent: parent.clone(),
                color,
                key,
            },
        },
    )
}

/// `ncclCommShrink`.
pub fn shrink(
    parent: &Arc<Comm>,
    exclude: &[i32],
    out: *mut ncclComm_t,
    cfg: Option<&ncclConfig_t>,
    flags: i32,
) -> Result<()> {
    parent.check_live()?;
    for &r in exclude {
        if r < 0 || r >= parent.nranks() {
            return Err(Error::invalid_argument(format!(
                "excluded rank {r} is not in 0..{}",
                parent.nranks()
            )));
        }
    }
    if exclude.contains(&parent.rank()) {
        return Err(Error::invalid_argument(format!(
            "rank {} excludes itself",
            parent.rank()
        )));
    }
    let config = CommConfig::resolve(cfg, Some(&parent.config))?;
    let child = Some(Arc::new(Comm::new(0, 0, parent.cuda_dev, config)));
    start(
        out,
        InitJob {
            child,
            origin: Origin::Shrink {
                parent: parent.clone(),
                exclude: exclude.to_vec(),
                flags,
            },
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_plans_for_the_slowest_network_link() {
        let link = |gbps, latency_us| NetLink { gbps, latency_us };
        let claim = |uses, l: Option<NetLink>| NetClaim { uses, link: l };
        // The claims survive the wire, and a short or unknown claim is refused.
        for c in [
            claim(false, None),
            claim(true, None),
            claim(true, Some(link(12.5, 3.0))),
        ] {
            assert_eq!(NetClaim::from_bytes(&c.to_bytes()), Some(c));
        }
        assert_eq!(NetClaim::from_bytes(&[2u8; 5]), None);
        assert_eq!(NetClaim::from_bytes(&[7u8; NET_CLAIM_BYTES]), None);
        // Nobody uses the network: no link, whatever was loaded.
        assert_eq!(agreed_link(&[claim(false, None), claim(false, None)]), None);
        // The least bandwidth and the most latency of those that use it.
        let agreed = agreed_link(&[
            claim(true, Some(link(50.0, 1.0))),
            claim(false, None),
            claim(true, Some(link(12.5, 0.5))),
            claim(true, None),
        ]);
        assert_eq!(agreed, Some(link(12.5, 1.0)));
        // One rank uses it (the others do not know): everyone plans for it.
        assert_eq!(
            agreed_link(&[claim(false, None), claim(true, Some(link(3.0, 9.0)))]),
            Some(link(3.0, 9.0))
        );
        // Used but unknown everywhere: a default socket device's 10 Gbit/s.
        assert_eq!(
            agreed_link(&[claim(true, None), claim(false, None)]),
            Some(NetLink::from_properties(0, 0.0))
        );
    }

    #[test]
    fn split_orders_by_key_then_rank() {
        // (color, key, parent rank)
        let e = [(0, 5, 0), (1, 0, 1), (0, 1, 2), (1, 0, 3), (0, 1, 4)];
        assert_eq!(split_members(&e, 0, 0), Some((vec![2, 4, 0], 2)));
        assert_eq!(split_members(&e, 1, 3), Some((vec![1, 3], 1)));
        assert_eq!(split_members(&e, NCCL_SPLIT_NOCOLOR, 0), None);
    }

    #[test]
    fn split_patterns_partition_every_rank() {
        for n in [1, 2, 3, 8, 17] {
            for colors in [1, 2, 3] {
                let e: Vec<(i32, i32, i32)> =
                    (0..n).map(|r| (r % colors, (n - r) % 4, r)).collect();
                let mut seen = vec![0; n as usize];
                for &(c, _, r) in &e {
                    let (members, pos) = split_members(&e, c, r).unwrap();
                    assert_eq!(members[pos as usize], r);
                    assert!(members.iter().all(|&m| e[m as usize].0 == c));
                    seen[r as usize] += 1;
                }
                assert!(seen.iter().all(|&s| s == 1));
            }
        }
    }

    #[test]
    fn shrink_keeps_order() {
        assert_eq!(shrink_members(6, &[1, 4]), vec![0, 2, 3, 5]);
        assert_eq!(shrink_members(3, &[]), vec![0, 1, 2]);
    }
}
