//! Windows (`ncclCommWindowRegister`): a buffer every rank of a communicator registers
//! together, whose peers' copies this rank reaches by load/store: directly in one process,
//! through CUDA IPC across processes of a host. Also the signals of one-sided operations
//! (`ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`) and what `ncclCommQueryProperties`
//! reports.
//!
//! Signals are counters in device memory, one per (context, signal index, sending rank), in
//! a block each rank allocates at its first window registration and maps from every peer it
//! can reach. Only the sending rank writes its counter in a peer's block, so it knows the
//! next value on the host and writes it in stream order after its data (`cuStreamWriteValue64`,
//! with a memory barrier); a waiter knows how many signals it has consumed and makes its
//! stream wait on the GPU until the counter reaches the new total (`cuStreamWaitValue64`).
//! An abort raises every counter far past any total, so that no stream waits forever.

use super::Comm;
use crate::abi::{ncclCommProperties_t, ncclWindow_t, NCCL_API_MAGIC};
use crate::cuda::{self, CUstream, DeviceBuffer};
use crate::error::{Error, Result};
use crate::topo::{Path, Topology};
use crate::transport::rma_socket::{Header, RmaSocket};
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};

/// Signal indices per context unless `ncclConfig_t::numRmaSig` asks for more (NVIDIA's default).
pub const DEFAULT_SIGNALS: i32 = 1;
/// Contexts unless `ncclConfig_t::numRmaCtx` asks for more (NVIDIA's default).
pub const DEFAULT_CONTEXTS: i32 = 1;
/// The value an abort writes into every counter: past any total a wait can ask for.
const RELEASED: u64 = 1 << 60;
/// Known `NCCL_WIN_*` flags.
const KNOWN_FLAGS: i32 = 0x01 | 0x02 | 0x04 | 0x08;

/// A peer's memory mapped into this process, unmapped on drop.
enum Mapping {
    /// Through CUDA IPC (memory from `cudaMalloc`).
    Ipc(u64),
    /// An imported allocation (memory from `ncclMemAlloc`).
    Vmm(#[allow(dead_code)] cuda::vmm::Imported),
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Mapping::Ipc(p) = self {
            let _ = cuda::ipc_close(*p);
        }
    }
}

/// Numbers the fd-passing sockets of this process's registrations.
static FD_TAG: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// How long the ranks of a host have to pass a window's memory handle to each other.
const FD_PASS_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

fn fd_socket_name(pid: u32, tag: u64) -> String {
    format!("oxccl-win-{pid}-{tag}")
}

/// One registered window, as this rank sees it.
pub struct Window {
    comm: Weak<Comm>,
    /// The registering rank's own buffer.
    pub user_ptr: u64,
    pub size: usize,
    /// Each rank's copy, mapped into this process (`None`: not reachable by load/store).
    peers: Vec<Option<u64>>,
    /// Ranks on this rank's host (its LSA team), in rank order.
    lsa_ranks: Vec<i32>,
    /// Its number among the communicator's registrations (the same on every rank).
    seq: u64,
    _mappings: Vec<Mapping>,
}

impl Window {
    /// `offset` into this rank's view of `peer`'s copy.
    pub fn peer_pointer(&self, offset: usize, peer: i32) -> Result<u64> {
        self.check_range(offset, 0)?;
        let base = usize::try_from(peer)
            .ok()
            .and_then(|p| self.peers.get(p))
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "peer {peer} is not within valid range of ranks {}",
                    self.peers.len()
                ))
            })?;
        base.map(|b| b + offset as u64).ok_or_else(|| {
            Error::invalid_usage(format!(
                "peer {peer} is not reachable by load/store from this rank (another host, or ncclMemAlloc memory of another process)"
            ))
        })
    }

    /// `offset` into this rank's view of the copy of the `lsa_rank`-th rank of its host.
    pub fn lsa_pointer(&self, offset: usize, lsa_rank: i32) -> Result<u64> {
        let peer = usize::try_from(lsa_rank)
            .ok()
            .and_then(|r| self.lsa_ranks.get(r).copied())
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "lsaRank {lsa_rank} is not within the {} ranks of this host",
                    self.lsa_ranks.len()
                ))
            })?;
        self.peer_pointer(offset, peer)
    }

    /// Fail unless `offset..offset + bytes` lies within the window.
    fn check_range(&self, offset: usize, bytes: usize) -> Result<()> {
        let end = offset.checked_add(bytes);
        if offset >= self.size || end.is_none_or(|e| e > self.size) {
            return Err(Error::invalid_argument(format!(
                "offset {offset} + {bytes} bytes is past the window's {} bytes",
                self.size
            )));
        }
        Ok(())
    }

    fn belongs_to(&self, comm: &Arc<Comm>) -> bool {
        self.comm.upgrade().is_some_and(|c| Arc::ptr_eq(&c, comm))
    }
}

static WINDOWS: Lazy<Mutex<HashMap<usize, Arc<Window>>>> = Lazy::new(|| Mutex::new(HashMap::new()));

/// The window behind a handle: NULL and unknown handles are `ncclInvalidArgument`.
pub fn find(handle: ncclWindow_t) -> Result<Arc<Window>> {
    if handle.is_null() {
        return Err(Error::invalid_argument("window argument is NULL"));
    }
    WINDOWS
        .lock()
        .get(&(handle as usize))
        .cloned()
        .ok_or_else(|| {
            Error::invalid_argument(format!("window {handle:p} is not a registered window"))
        })
}

/// How a rank's signal counters are laid out: `[context][signal][sender]`, 8 bytes each.
#[derive(Clone, Copy)]
struct Layout {
    ncontexts: i32,
    nsignals: i32,
    nranks: i32,
}

impl Layout {
    fn bytes(&self) -> usize {
        (self.ncontexts * self.nsignals * self.nranks) as usize * 8
    }

    fn index(&self, ctx: i32, sig: i32, sender: i32) -> u64 {
        (((ctx * self.nsignals + sig) * self.nranks + sender) as u64) * 8
    }
}

/// What operations from other hosts write into: this rank's windows by number, and its
/// signal counters.
struct Inbound {
    windows: Mutex<HashMap<u64, (u64, usize)>>,
    /// This rank's counters, owned here: a network thread delivering late (after the
    /// communicator is gone) holds the last reference, so it never writes freed memory.
    counters: DeviceBuffer,
    layout: Layout,
}

impl Inbound {
    /// Write an arrived put's payload into the window, then raise the sender's counter.
    fn deliver(&self, h: &Header, payload: &[u8]) -> Result<()> {
        if h.bytes > 0 {
            let (base, size) = *self.windows.lock().get(&h.window).ok_or_else(|| {
                Error::system(format!(
                    "RMA/Socket: a put into unknown window {}",
                    h.window
                ))
            })?;
            if h.offset
                .checked_add(h.bytes)
                .is_none_or(|end| end > size as u64)
            {
                return Err(Error::system(format!(
                    "RMA/Socket: a put of {} bytes at {} is past window {}'s {size} bytes",
                    h.bytes, h.offset, h.window
                )));
            }
            cuda::copy_to_device(base + h.offset, payload)?;
        }
        let l = self.layout;
        let (ctx, sig, sender) = (h.ctx as i32, h.sig as i32, h.sender as i32);
        if ctx >= l.ncontexts || sig >= l.nsignals || sender >= l.nranks {
            return Err(Error::system(
                "RMA/Socket: a signal out of this rank's range",
            ));
        }
        cuda::copy_to_device(
            self.counters.ptr() + l.index(ctx, sig, sender),
            &h.value.to_le_bytes(),
        )
    }
}

/// A communicator's signal counters, what it has sent and consumed, and its network side.
pub struct Signals {
    layout: Layout,
    /// Every rank's counter block as mapped here (`None`: not by load/store).
    peers: Vec<Option<u64>>,
    _mappings: Vec<Mapping>,
    inbound: Arc<Inbound>,
    /// Operations with ranks of other hosts, and where each of those ranks listens.
    net: Option<RmaSocket>,
    remote: Vec<Option<SocketAddr>>,
    /// Registrations so far (the next window's number).
    windows: std::sync::atomic::AtomicU64,
    /// Signals sent, per (receiver, context, signal).
    sent: Mutex<HashMap<(i32, i32, i32), u64>>,
    /// Signals waited for, per (sender, context, signal).
    awaited: Mutex<HashMap<(i32, i32, i32), u64>>,
}

impl Signals {
    fn index(&self, ctx: i32, sig: i32, sender: i32) -> u64 {
        self.layout.index(ctx, sig, sender)
    }

    fn check(&self, peer: i32, sig: i32, ctx: i32) -> Result<()> {
        let l = self.layout;
        if peer < 0 || peer >= l.nranks {
            return Err(Error::invalid_argument(format!(
                "peer {peer} is not within valid range of ranks {}",
                l.nranks
            )));
        }
        if sig < 0 || sig >= l.nsignals {
            return Err(Error::invalid_argument(format!(
                "sigIdx {sig} is not within the {} signals (ncclConfig_t::numRmaSig)",
                l.nsignals
            )));
        }
        if ctx < 0 || ctx >= l.ncontexts {
            return Err(Error::invalid_argument(format!(
                "ctx {ctx} is not within the {} contexts (ncclConfig_t::numRmaCtx)",
                l.ncontexts
            )));
        }
        Ok(())
    }

    /// Raise one signal at `peer` (from `me`) in `stream`'s order; `put` is the data that
    /// goes before it to a rank of another host (window number, offset, source, bytes).
    fn raise(
        &self,
        me: i32,
        peer: i32,
        sig: i32,
        ctx: i32,
        put: Option<(u64, u64, u64, u64)>,
        stream: CUstream,
    ) -> Result<()> {
        let mut sent = self.sent.lock();
        let count = sent.entry((peer, ctx, sig)).or_insert(0);
        match (
            self.peers[peer as usize],
            &self.net,
            self.remote[peer as usize],
        ) {
            (Some(base), _, _) if put.is_none() => {
                cuda::write_u64(stream, base + self.index(ctx, sig, me), *count + 1)?
            }
            (_, Some(net), Some(addr)) => {
                let (window, offset, src, bytes) = put.unwrap_or((u64::MAX, 0, 0, 0));
                let header = Header {
                    window,
                    offset,
                    bytes,
                    ctx: ctx as u32,
                    sig: sig as u32,
                    sender: me as u32,
                    value: *count + 1,
                };
                net.send(addr, src, header, stream)?
            }
            _ => return Err(unreachable_peer(peer)),
        }
        *count += 1;
        Ok(())
    }

    /// Make `stream` wait for `count` more signals from `sender`.
    fn wait(&self, sender: i32, sig: i32, ctx: i32, count: u64, stream: CUstream) -> Result<()> {
        let mut awaited = self.awaited.lock();
        let total = awaited.entry((sender, ctx, sig)).or_insert(0);
        cuda::wait_u64_geq(
            stream,
            self.inbound.counters.ptr() + self.index(ctx, sig, sender),
            *total + count,
        )?;
        *total += count;
        Ok(())
    }

    /// Release every stream waiting on this rank's counters (abort).
    fn release(&self) {
        let local = &self.inbound.counters;
        let n = local.len() / 8;
        let words: Vec<u8> = std::iter::repeat_n(RELEASED.to_le_bytes(), n)
            .flatten()
            .collect();
        if let Err(e) = cuda::copy_to_device(local.ptr(), &words) {
            crate::warn!(
                "abort: cannot release the streams waiting on signals: {}",
                e.msg
            );
        }
    }
}

fn unreachable_peer(peer: i32) -> Error {
    Error::invalid_usage(format!(
        "peer {peer} is not reachable from this rank (neither by load/store nor over the network)"
    ))
}

/// What one rank tells the others about a registration.
#[derive(Clone, Copy, Default)]
struct Exported {
    ptr: u64,
    size: u64,
    /// The buffer's IPC handle and its offset in the allocation, where it has one.
    ipc: Option<([u8; 64], u64)>,
    /// The rank's signal block and its IPC handle (present on the first registration).
    signals: Option<(u64, [u8; 64])>,
    /// For memory without an IPC handle: its allocation's size, the buffer's offset in it,
    /// and the tag of the socket that passes its descriptor.
    vmm: Option<(u64, u64, u64)>,
    /// Where the rank takes one-sided operations from other hosts (first registration).
    rma_addr: Option<SocketAddr>,
}

const EXPORTED_BYTES: usize = 8 + 8 + 1 + 64 + 8 + 1 + 8 + 64 + 1 + 24 + 20;

fn encode_addr(a: Option<SocketAddr>) -> [u8; 20] {
    let mut b = [0u8; 20];
    if let Some(a) = a {
        b[0] = 1;
        match a.ip() {
            IpAddr::V4(ip) => {
                b[1] = 4;
                b[2..6].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                b[1] = 6;
                b[2..18].copy_from_slice(&ip.octets());
            }
        }
        b[18..20].copy_from_slice(&a.port().to_le_bytes());
    }
    b
}

fn decode_addr(b: &[u8]) -> Option<SocketAddr> {
    let port = u16::from_le_bytes([b[18], b[19]]);
    match (b[0], b[1]) {
        (1, 4) => Some(SocketAddr::new(
            IpAddr::from(<[u8; 4]>::try_from(&b[2..6]).ok()?),
            port,
        )),
        (1, 6) => Some(SocketAddr::new(
            IpAddr::from(<[u8; 16]>::try_from(&b[2..18]).ok()?),
            port,
        )),
        _ => None,
    }
}

impl Exported {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(EXPORTED_BYTES);
        v.extend_from_slice(&self.ptr.to_le_bytes());
        v.extend_from_slice(&self.size.to_le_bytes());
        let (ipc, off) = self.ipc.unwrap_or(([0; 64], 0));
        v.push(self.ipc.is_some() as u8);
        v.extend_from_slice(&ipc);
        v.extend_from_slice(&off.to_le_bytes());
        let (sig, sig_ipc) = self.signals.unwrap_or((0, [0; 64]));
        v.push(self.signals.is_some() as u8);
        v.extend_from_slice(&sig.to_le_bytes());
        v.extend_from_slice(&sig_ipc);
        let (size, off, tag) = self.vmm.unwrap_or((0, 0, 0));
        v.push(self.vmm.is_some() as u8);
        for x in [size, off, tag] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.extend_from_slice(&encode_addr(self.rma_addr));
        v
    }

    fn decode(b: &[u8]) -> Result<Exported> {
        if b.len() != EXPORTED_BYTES {
            return Err(Error::internal(format!(
                "window registration: a peer sent {} bytes, not {EXPORTED_BYTES}",
                b.len()
            )));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let handle_at = |i: usize| -> [u8; 64] { b[i..i + 64].try_into().unwrap() };
        Ok(Exported {
            ptr: u64_at(0),
            size: u64_at(8),
            ipc: (b[16] != 0).then(|| (handle_at(17), u64_at(81))),
            signals: (b[89] != 0).then(|| (u64_at(90), handle_at(98))),
            vmm: (b[162] != 0).then(|| (u64_at(163), u64_at(171), u64_at(179))),
            rma_addr: decode_addr(&b[187..207]),
        })
    }
}

/// The IPC handle of the allocation holding `ptr` and `ptr`'s offset in it, where the driver
/// gives one (memory from `cuMemAlloc`/`cudaMalloc`; not `ncclMemAlloc`'s mapped memory).
fn ipc_export(ptr: u64) -> Option<([u8; 64], u64)> {
    let (base, _) = cuda::address_range(ptr).ok()?;
    let handle = cuda::ipc_handle(base).ok()?;
    Some((handle, ptr - base))
}

/// Where this rank reaches `peer`'s exported memory at `ptr`: directly in one process, through
/// IPC on one host (the mapping is kept in `keep`), else nowhere.
fn reach(
    topo: &Topology,
    peer: i32,
    ptr: u64,
    ipc: Option<([u8; 64], u64)>,
    keep: &mut Vec<Mapping>,
) -> Result<Option<u64>> {
    let path = topo.paths[peer as usize];
    if topo.same_process(peer) {
        if !matches!(path, Path::SameGpu) && peer != topo.my_rank {
            let dev = topo.peers[peer as usize].cuda_dev;
            cuda::enable_peer_access(cuda::primary_ctx(dev)?)?;
        }
        return Ok(Some(ptr));
    }
    if !mappable(topo, peer) {
        return Ok(None);
    }
    let Some((handle, offset)) = ipc else {
        return Ok(None);
    };
    let base = cuda::ipc_open(&handle)?;
    keep.push(Mapping::Ipc(base));
    Ok(Some(base + offset))
}

/// Whether `peer` (another process) has GPU memory this rank can map: same host, peer access.
fn mappable(topo: &Topology, peer: i32) -> bool {
    !matches!(topo.paths[peer as usize], Path::Net | Path::Shm)
}

/// The ranks of other processes that will map this rank's memory by descriptor.
fn fd_importers(topo: &Topology, nranks: i32) -> usize {
    (0..nranks)
        .filter(|&p| p != topo.my_rank && !topo.same_process(p) && mappable(topo, p))
        .count()
}

/// Map `peer`'s `ncclMemAlloc` memory, receiving its descriptor from the peer's socket.
fn import_by_fd(
    topo: &Topology,
    peer: i32,
    e: &Exported,
    keep: &mut Vec<Mapping>,
) -> Result<Option<u64>> {
    let Some((size, offset, tag)) = e.vmm else {
        return Ok(None);
    };
    let name = fd_socket_name(topo.peers[peer as usize].pid, tag);
    let fd = crate::transport::fdpass::receive(&name, FD_PASS_LIMIT)
        .map_err(|err| err.context(format!("window memory of rank {peer}")))?;
    let imported = cuda::vmm::import(&fd, size as usize)?;
    let ptr = imported.ptr + offset;
    keep.push(Mapping::Vmm(imported));
    Ok(Some(ptr))
}

/// The network side of one-sided operations, when some rank of the communicator is on another
/// host: a listener on this rank's bootstrap address, writing what arrives into `inbound`.
fn start_network(
    rt: &crate::core::runtime::Runtime,
    inbound: &Arc<Inbound>,
) -> Result<Option<RmaSocket>> {
    let topo = &rt.topo;
    if !topo.paths.contains(&Path::Net) {
        return Ok(None);
    }
    let Some(me) = rt.bootstrap.peer_addrs()[topo.my_rank as usize] else {
        crate::warn!(
            "RMA/Socket: no bootstrap address of my own: no one-sided operations with other hosts"
        );
        return Ok(None);
    };
    // Weak: a message arriving after the communicator is gone is dropped.
    let inbound = Arc::downgrade(inbound);
    let deliver = Arc::new(move |h: &Header, payload: &[u8]| match inbound.upgrade() {
        Some(inbound) => inbound.deliver(h, payload),
        None => Ok(()),
    });
    Ok(Some(RmaSocket::start(me.ip(), rt.ctx, deliver)?))
}

fn signal_counts(comm: &Comm) -> (i32, i32) {
    let pick = |v: i32, d: i32| if v > 0 { v } else { d };
    (
        pick(comm.config.num_rma_ctx, DEFAULT_CONTEXTS),
        pick(comm.config.num_rma_sig, DEFAULT_SIGNALS),
    )
}

/// `ncclCommWindowRegister` for one rank: exchange, map, publish. Returns the handle.
pub fn register(comm: &Arc<Comm>, ptr: u64, size: usize, flags: i32) -> Result<ncclWindow_t> {
    if flags & !KNOWN_FLAGS != 0 {
        return Err(Error::invalid_argument(format!(
            "unknown window flags {flags:#x}"
        )));
    }
    comm.check_usable()?;
    let mut rt_guard = comm.rt.lock();
    let rt = rt_guard.as_mut().ok_or_else(|| {
        Error::invalid_usage("communicator is not initialised (still in progress or failed)")
    })?;
    cuda::set_current(rt.ctx)?;
    let _counted = cuda::account_into(&comm.mem.persistent);
    let mut rma = comm.rma.lock();
    // The first registration makes the signal counters, and the network side when some
    // rank is on another host.
    let new_signals = if rma.is_none() {
        let (ncontexts, nsignals) = signal_counts(comm);
        let layout = Layout {
            ncontexts,
            nsignals,
            nranks: comm.nranks(),
        };
        let inbound = Arc::new(Inbound {
            windows: Mutex::new(HashMap::new()),
            counters: DeviceBuffer::zeroed(layout.bytes())?,
            layout,
        });
        let net = start_network(rt, &inbound)?;
        Some((layout, inbound, net))
    } else {
        None
    };
    let ipc = ipc_export(ptr);
    // Memory without an IPC handle goes to the host's other processes as a descriptor.
    let importers = fd_importers(&rt.topo, comm.nranks());
    let fd_export = match (ipc, importers) {
        (None, 1..) => cuda::vmm::export(ptr)?.map(|(fd, alloc, off)| {
            let tag = FD_TAG.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            (fd, alloc, off, tag)
        }),
        _ => None,
    };
    let server = match &fd_export {
        Some((.., tag)) => Some(crate::transport::fdpass::FdServer::listen(
            &fd_socket_name(std::process::id(), *tag),
        )?),
        None => None,
    };
    let mine = Exported {
        ptr,
        size: size as u64,
        ipc,
        signals: match &new_signals {
            Some((_, inbound, _)) => {
                let b = inbound.counters.ptr();
                Some((b, cuda::ipc_handle(b)?))
            }
            None => None,
        },
        vmm: fd_export
            .as_ref()
            .map(|(_, alloc, off, tag)| (*alloc as u64, *off, *tag)),
        rma_addr: new_signals
            .as_ref()
            .and_then(|(.., net)| net.as_ref().map(|n| n.addr())),
    };
    let all = rt.bootstrap.allgather(&mine.encode())?;
    let all: Vec<Exported> = all
        .iter()
        .map(|b| Exported::decode(b))
        .collect::<Result<_>>()?;
    let topo = &rt.topo;
    let mut keep = Vec::new();
    let mut peers = Vec::with_capacity(all.len());
    std::thread::scope(|scope| -> Result<()> {
        let serving = match (&server, &fd_export) {
            (Some(server), Some((fd, ..))) => {
                let raw = std::os::fd::AsRawFd::as_raw_fd(fd);
                Some(scope.spawn(move || server.serve(raw, importers, FD_PASS_LIMIT)))
            }
            _ => None,
        };
        for (peer, e) in all.iter().enumerate() {
            let peer = peer as i32;
            let by_fd = e.ipc.is_none()
                && e.vmm.is_some()
                && !topo.same_process(peer)
                && mappable(topo, peer);
            peers.push(if by_fd {
                import_by_fd(topo, peer, e, &mut keep)?
            } else {
                reach(topo, peer, e.ptr, e.ipc, &mut keep)?
            });
        }
        match serving {
            Some(h) => h
                .join()
                .unwrap_or_else(|_| Err(Error::internal("the descriptor server panicked"))),
            None => Ok(()),
        }
    })?;
    if let Some((layout, inbound, net)) = new_signals {
        let mut sig_keep = Vec::new();
        let mut sig_peers = Vec::with_capacity(all.len());
        let mut remote = Vec::with_capacity(all.len());
        for (peer, e) in all.iter().enumerate() {
            let (p, h) = e.signals.ok_or_else(|| {
                Error::internal(format!(
                    "rank {peer} registered its first window without signals"
                ))
            })?;
            sig_peers.push(reach(topo, peer as i32, p, Some((h, 0)), &mut sig_keep)?);
            remote.push(e.rma_addr.filter(|_| topo.paths[peer] == Path::Net));
        }
        *rma = Some(Arc::new(Signals {
            layout,
            peers: sig_peers,
            _mappings: sig_keep,
            inbound,
            net,
            remote,
            windows: std::sync::atomic::AtomicU64::new(0),
            sent: Mutex::new(HashMap::new()),
            awaited: Mutex::new(HashMap::new()),
        }));
    }
    let signals = rma.clone().expect("made above");
    let seq = signals
        .windows
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    signals.inbound.windows.lock().insert(seq, (ptr, size));
    let lsa_ranks = (0..comm.nranks())
        .filter(|&r| !matches!(topo.paths[r as usize], Path::Net))
        .collect();
    let window = Arc::new(Window {
        comm: Arc::downgrade(comm),
        user_ptr: ptr,
        size,
        peers,
        lsa_ranks,
        seq,
        _mappings: keep,
    });
    let handle = Arc::as_ptr(&window) as ncclWindow_t;
    WINDOWS.lock().insert(handle as usize, window);
    crate::info!(
        REG,
        "rank {}: window {handle:p} registered, {size} bytes at {ptr:#x}, flags {flags:#x}",
        comm.rank()
    );
    Ok(handle)
}

/// `ncclCommWindowDeregister` for one rank: wait until every rank is done with it, unmap.
pub fn deregister(comm: &Arc<Comm>, handle: ncclWindow_t) -> Result<()> {
    let w = find(handle)?;
    if !w.belongs_to(comm) {
        return Err(Error::invalid_argument(format!(
            "window {handle:p} was not registered with this communicator"
        )));
    }
    if let Some(rt) = comm.rt.lock().as_ref() {
        cuda::set_current(rt.ctx)?;
        // Peers may still write into this rank's copy until they deregister too.
        if !comm.aborted() {
            rt.bootstrap.barrier()?;
        }
    }
    WINDOWS.lock().remove(&(handle as usize));
    if let Some(s) = comm.rma.lock().as_ref() {
        s.inbound.windows.lock().remove(&w.seq);
    }
    Ok(())
}

/// The communicator's signals (present after its first window registration).
fn signals(comm: &Arc<Comm>) -> Result<Arc<Signals>> {
    comm.rma.lock().clone().ok_or_else(|| {
        Error::invalid_usage(
            "no window is registered on this communicator: signals live with windows (ncclCommWindowRegister first)",
        )
    })
}

/// Make the communicator's context current for stream operations.
fn enter_context(comm: &Arc<Comm>) -> Result<()> {
    comm.check_usable()?;
    let rt = comm.rt.lock();
    let rt = rt.as_ref().ok_or_else(|| {
        Error::invalid_usage("communicator is not initialised (still in progress or failed)")
    })?;
    cuda::set_current(rt.ctx)
}

/// One `ncclPutSignal`: copy `bytes` from `src` into `peer`'s copy of `win` at `offset`, then
/// raise signal (`sig`, `ctx`) there, in `stream`'s order.
#[allow(clippy::too_many_arguments)]
pub fn put_signal(
    comm: &Arc<Comm>,
    src: u64,
    bytes: usize,
    peer: i32,
    win: ncclWindow_t,
    offset: usize,
    sig: i32,
    ctx: i32,
    stream: CUstream,
) -> Result<()> {
    let w = find(win)?;
    if !w.belongs_to(comm) {
        return Err(Error::invalid_argument(format!(
            "window {win:p} was not registered with this communicator"
        )));
    }
    let s = signals(comm)?;
    s.check(peer, sig, ctx)?;
    if bytes > 0 {
        w.check_range(offset, bytes)?;
        if src == 0 {
            return Err(Error::invalid_argument("localbuff argument is NULL"));
        }
    }
    enter_context(comm)?;
    let direct = w.peers.get(peer as usize).copied().flatten();
    match direct {
        // Another host: the data goes with the signal, in one message.
        None if bytes > 0 => s.raise(
            comm.rank(),
            peer,
            sig,
            ctx,
            Some((w.seq, offset as u64, src, bytes as u64)),
            stream,
        ),
        _ => {
            if bytes > 0 {
                let dst = w.peer_pointer(offset, peer)?;
                cuda::memcpy_dtod_async(dst, src, bytes, stream)?;
            }
            s.raise(comm.rank(), peer, sig, ctx, None, stream)
        }
    }
}

/// One `ncclSignal`: raise signal (`sig`, `ctx`) at `peer` in `stream`'s order.
pub fn signal(comm: &Arc<Comm>, peer: i32, sig: i32, ctx: i32, stream: CUstream) -> Result<()> {
    let s = signals(comm)?;
    s.check(peer, sig, ctx)?;
    enter_context(comm)?;
    s.raise(comm.rank(), peer, sig, ctx, None, stream)
}

/// One wait of `ncclWaitSignal`: `stream` continues after `count` more signals from `peer`.
pub struct WaitFor {
    pub count: i32,
    pub peer: i32,
    pub sig: i32,
    pub ctx: i32,
}

/// `ncclWaitSignal`: every wait is checked before any is enqueued.
pub fn wait_signals(comm: &Arc<Comm>, waits: &[WaitFor], stream: CUstream) -> Result<()> {
    let s = signals(comm)?;
    for w in waits {
        s.check(w.peer, w.sig, w.ctx)?;
        if w.count < 0 {
            return Err(Error::invalid_argument(format!(
                "opCnt {} is negative",
                w.count
            )));
        }
    }
    enter_context(comm)?;
    for w in waits.iter().filter(|w| w.count > 0) {
        s.wait(w.peer, w.sig, w.ctx, w.count as u64, stream)?;
    }
    Ok(())
}

/// Abort: release every stream waiting on this communicator's signals.
pub fn release_waits(comm: &Comm) {
    if let Some(s) = comm.rma.lock().as_ref() {
        s.release();
    }
}

/// Fill the caller's `ncclCommProperties_t`, up to its `size`.
///
/// # Safety
/// `props` points to the caller's struct, of at least its `size` field's bytes.
pub unsafe fn query_properties(comm: &Comm, props: *mut ncclCommProperties_t) -> Result<()> {
    // SAFETY: a plain C struct of integers and bools: all zero is a valid value.
    let zero: ncclCommProperties_t = unsafe { std::mem::zeroed() };
    // SAFETY: props is the caller's struct (the function's contract).
    let (header, mut p) = unsafe { crate::abi::read_versioned(props, zero) };
    if header.magic != NCCL_API_MAGIC || header.size < std::mem::size_of_val(&header) {
        return Err(Error::invalid_usage(
            "Cannot get communicator properties: ncclCommProperties_t argument must be initialized via NCCL_COMM_PROPERTIES_INITIALIZER",
        ));
    }
    fill_properties(comm, &mut p);
    // SAFETY: as above; the header is written back as the caller wrote it.
    unsafe { crate::abi::write_versioned(props, &p) };
    Ok(())
}

/// What oxccl supports: no device API (no GIN, no multicast, no CFT); host one-sided
/// operations between ranks of one host.
fn fill_properties(comm: &Comm, p: &mut ncclCommProperties_t) {
    p.rank = comm.rank();
    p.nRanks = comm.nranks();
    p.cudaDev = comm.cuda_dev;
    p.nvmlDev = comm.cuda_dev;
    p.deviceApiSupport = false;
    p.multimemSupport = false;
    p.ginType = crate::abi::NCCL_GIN_TYPE_NONE;
    p.nLsaTeams = 1;
    p.hostRmaSupport = true;
    p.railedGinType = crate::abi::NCCL_GIN_TYPE_NONE;
    p.commHash = comm.rt.lock().as_ref().map_or(0, |rt| rt.comm_hash());
    p.ginMinStride = 0;
    p.ginConnectionType = crate::abi::NCCL_GIN_CONNECTION_NONE;
    p.ginSupport = [false; 64];
    p.devCommRuntimeVersionSize = 0;
    p.cftSupport = false;
    p.cftMulticastSupport = false;
    p.cftCountedSupport = false;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exported_round_trip() {
        let e = Exported {
            ptr: 0x7000_0000_1000,
            size: 4 << 20,
            ipc: Some(([3; 64], 4096)),
            signals: Some((0x7000_2000_0000, [9; 64])),
            vmm: Some((8 << 20, 2 << 20, 17)),
            rma_addr: Some("10.1.2.3:4567".parse().unwrap()),
        };
        let back = Exported::decode(&e.encode()).unwrap();
        assert_eq!(back.ptr, e.ptr);
        assert_eq!(back.size, e.size);
        assert_eq!(back.ipc, e.ipc);
        assert_eq!(back.signals, e.signals);
        assert_eq!(back.vmm, e.vmm);
        assert_eq!(back.rma_addr, e.rma_addr);
        let v6: SocketAddr = "[fe80::1]:99".parse().unwrap();
        assert_eq!(decode_addr(&encode_addr(Some(v6))), Some(v6));
        let none = Exported::decode(&Exported::default().encode()).unwrap();
        assert!(none.ipc.is_none() && none.signals.is_none() && none.vmm.is_none());
        assert!(none.rma_addr.is_none());
        assert!(Exported::decode(&[0; 10]).is_err());
    }
}
