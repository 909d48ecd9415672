//! Planning one launch: turns all tasks of a group on one communicator into the work items of
//! ONE `ox_kernel` launch, and says which connections they need.
//!
//! Connections are indexed `[channel][peer]`. Channels `0..nchannels` are ring channels
//! (collectives: this rank -> the next rank of the ring order and the previous one -> this
//! rank; `Geometry::ring`, rank order unless a host's ranks are not contiguous); channels
//! `nchannels..2*nchannels` are P2P channels (`nchannels + j` carries part j of a P2P
//! operation). So `Geometry::send`/`recv` have `conn_channels(nchannels)` rows.
//!
//! Deadlock freedom: every connection is used by one CTA only (items are grouped by the
//! connections they use), and every CTA runs its items in increasing *key* order, where both
//! ends of a connection give the same item the same key (collectives: their sequence number
//! among the group's collectives; P2P: (round = (dst - src) mod n, src, sequence number of
//! the op between src and dst, part)). The unfinished item with the smallest key then always
//! has every participating CTA at it, so it progresses — however items are folded onto CTAs.
//! It requires every CTA of the launch to be resident at once (grid <= `nchannels`, which
//! init caps so that the CTAs of every rank sharing a GPU fit on it together).
//!
//! Local copies (a one-rank collective, a send to self, the own block of an all-gather,
//! alltoall, gather or scatter) come out as `LocalCopy`s: all of a one-rank plan's, and those
//! of at least `cost::COPY_ENGINE_MIN_BYTES` otherwise (smaller ones stay kernel work). Beside
//! a kernel the copy engine does them; a plan with no kernel launches `COPY_KERNEL` for those
//! below `cost::copy_kernel_max()` (`cost::copy_kernel_ctas`).
//!
//! Protocol: each item is a `Proto` (Simple or LL, encoded as `FLAG_LL`), chosen from the
//! task's byte count by the cost model, so both ends of every connection choose alike;
//! `chunk` is then the step payload of that protocol (`Proto::step_bytes`).
//!
//! Tasks become items in `lower` (one module per family of tasks); this module assigns the
//! items to CTAs and resolves their connections.

use super::cost::{self, NetLink, BLOCK_THREADS, MAX_CTAS};
use super::device::{
    OxConn, OxWork, WorkKind, FLAG_PARK_RECV, FLAG_PARK_SEND, FLAG_RECV_GPU, FLAG_SEND_GPU,
};
use super::lower::{decompose, Group, Piece, Setting};
use super::proto::Proto;
use super::ring::RingOrder;
use super::tune::Tuner;
use super::Task;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::sync::Arc;

pub use super::lower::one_rank_transform;

/// What the communicator gives the planner.
#[derive(Clone, Debug)]
pub struct Geometry {
    pub rank: i32,
    pub nranks: i32,
    /// Ring channels (CTAs available for collectives), the same on every rank.
    pub nchannels: u32,
    /// `[channel][peer]`: this rank -> peer, `conn_channels(nchannels)` rows.
    pub send: Vec<Vec<Option<OxConn>>>,
    /// `[channel][peer]`: peer -> this rank.
    pub recv: Vec<Vec<Option<OxConn>>>,
    /// (channel, peer) of the receive connections whose slots are in GPU memory, written by
    /// the network (`FLAG_RECV_GPU`).
    pub recv_gpu: std::collections::BTreeSet<(u32, i32)>,
    /// (channel, peer) of the send connections whose slots are in GPU memory, read by the
    /// network (`FLAG_SEND_GPU`).
    pub send_gpu: std::collections::BTreeSet<(u32, i32)>,
    /// Device-visible address of a volatile u32 (host-mapped pinned memory); non-zero = abort.
    pub abort_flag: u64,
    /// Threads per CTA (`NCCL_NTHREADS`: 64..=512, a multiple of 64).
    pub threads: u32,
    /// The network, when the communicator uses it (`decompose`'s `net`).
    pub net: Option<NetView>,
    /// The order of the ranks around every ring channel, the same on every rank.
    pub ring: RingOrder,
    /// Device address of the ring table (`FLAG_RING_ORDER`: `ring`'s ranks as `i32`s), when
    /// `ring` is not rank order; 0 otherwise.
    pub ring_table: u64,
    /// `[peer]` (empty: none): waits on this peer's connections may park the CTA
    /// (`FLAG_PARK_SEND` / `FLAG_PARK_RECV`; the peer is another process on this GPU, reached
    /// over the network), and a plan with such items is a yielding launch (`Plan::yields`).
    pub park: Vec<bool>,
    /// The communicator's tuner plugin, when one is loaded (`tune`).
    pub tuner: Option<Arc<dyn Tuner>>,
}

impl Geometry {
    fn parks(&self, peer: i32) -> bool {
        usize::try_from(peer)
            .ok()
            .and_then(|p| self.park.get(p).copied())
            .unwrap_or(false)
    }
}

/// The network as the planner sees it, when a communicator uses it: plain data, the same on
/// every rank (agreed at init).
#[derive(Clone, Debug, PartialEq)]
pub struct NetView {
    /// The communicator's slowest network link: every ring crosses it (the ring collectives
    /// are planned for it, and never take the one-shot path).
    pub link: NetLink,
    /// `[peer]`: this rank reaches the peer over the network (the P2P operations with it are
    /// planned for the link; the peer says the same of this rank).
    pub remote: Vec<bool>,
    /// Every channel's device and share of the bytes (`weights`; even unless the devices
    /// differ in speed).
    pub routes: super::weights::Routes,
}

impl NetView {
    /// The link to `peer` when it is reached over the network.
    pub fn link_to(&self, peer: i32) -> Option<NetLink> {
        let remote = usize::try_from(peer)
            .ok()
            .and_then(|p| self.remote.get(p).copied())
            .unwrap_or(false);
        remote.then_some(self.link)
    }

    /// The link channels `0..nch` of a ring get together (`Routes::link_for`).
    pub fn link_for(&self, nch: u32) -> NetLink {
        self.routes.link_for(nch, self.link)
    }

    /// Most channels a ring over the network may use: each device at most
    /// `cost::net_channel_cap` of its speed when weighted, else the agreed link's cap.
    pub fn channel_cap(&self) -> u32 {
        self.routes
            .channel_cap()
            .unwrap_or_else(|| super::cost::net_channel_cap(self.link))
    }

    /// The view as the weights of `epoch` have it (`Routes::at_epoch`): itself for epoch 0,
    /// an error when this rank does not know the epoch's speeds (planning with others would
    /// split differently from the peers).
    pub fn at_epoch(&self, epoch: u32) -> Result<std::borrow::Cow<'_, NetView>> {
        if epoch == 0 {
            return Ok(std::borrow::Cow::Borrowed(self));
        }
        let routes = self.routes.at_epoch(epoch).ok_or_else(|| {
            crate::error::Error::internal(format!(
                "plan: the channel weights of epoch {epoch} are not known here"
            ))
        })?;
        Ok(std::borrow::Cow::Owned(NetView {
            link: self.link,
            remote: self.remote.clone(),
            routes,
        }))
    }

    /// `total` elements (or bytes) cut over channels `0..nch` in multiples of `gran`: in
    /// proportion to the channels' weights when the routes weigh them, else evenly (`split`).
    pub fn split_over(&self, total: u64, nch: u32, gran: u64) -> Vec<(u64, u64)> {
        match self.routes.weights(nch) {
            Some(w) => super::weights::split_weighted(total, &w, gran),
            None => split(total, nch, gran),
        }
    }
}

/// `total` cut over channels `0..nch` as the network `net` weighs them (`NetView::split_over`),
/// evenly without one.
pub fn split_for(net: Option<&NetView>, total: u64, nch: u32, gran: u64) -> Vec<(u64, u64)> {
    match net {
        Some(n) => n.split_over(total, nch, gran),
        None => split(total, nch, gran),
    }
}

/// Direction of a connection, seen from this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dir {
    Send,
    Recv,
}

/// A device-to-device copy of `bytes` from `src` to `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalCopy {
    pub dst: u64,
    pub src: u64,
    pub bytes: u64,
    pub by: CopyBy,
}

/// What does a `LocalCopy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyBy {
    /// The copy engine (`cuMemcpyDtoDAsync`): beside a kernel, or large.
    Engine,
    /// `COPY_KERNEL` on `ctas` CTAs of `threads` threads: a plan with no kernel of its own,
    /// whose small copies cost the caller less as a launch than as a copy-engine call.
    Kernel { ctas: u32, threads: u32 },
}

impl LocalCopy {
    /// A copy for the copy engine (the planner may give it to the copy kernel instead).
    pub fn new(dst: u64, src: u64, bytes: u64) -> LocalCopy {
        LocalCopy {
            dst,
            src,
            bytes,
            by: CopyBy::Engine,
        }
    }
}

/// One kernel launch, and the local copies that run beside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub kernel: &'static str,
    pub grid: u32,
    pub block: u32,
    pub smem: u32,
    /// The `OxWork` array (C layout); copy it to device memory and pass its address.
    pub items: Vec<u8>,
    /// Items in `items`; 0 means there is no kernel to launch.
    pub nitems: u32,
    /// Copies that run concurrently with the kernel (after the stream's earlier work, before
    /// its later work); with no kernel, simply on the stream.
    pub copies: Vec<LocalCopy>,
    /// Some item may park (`Geometry::park`): the runtime launches `YIELD_KERNEL` with
    /// resumes instead of `kernel`.
    pub yields: bool,
}

impl Plan {
    /// A plan of `items` on `grid` CTAs of `block` threads and no copies (tests build plans by
    /// hand with it).
    #[cfg(test)]
    pub fn of_items(items: &[super::device::OxWork], grid: u32, block: u32) -> Plan {
        let mut bytes = Vec::new();
        for w in items {
            w.serialize_into(&mut bytes);
        }
        Plan {
            kernel: crate::cuda::module::MAIN_KERNEL,
            grid,
            block,
            smem: 0,
            items: bytes,
            nitems: items.len() as u32,
            copies: Vec::new(),
            yields: false,
        }
    }
}

/// Rows of `Geometry::send`/`recv`: ring channels, then as many P2P channels, then the
/// one-shot all-reduce's `DIRECT_MAX_CHANNELS` rows (connections with small LL-only buffers,
/// `cost::DIRECT_SLOT_BYTES`).
pub fn conn_channels(nchannels: u32) -> u32 {
    2 * nchannels + cost::DIRECT_MAX_CHANNELS
}

/// How NVIDIA's INFO lines name connection row `row` (`Channel CC/I`): (channel, connection
/// index). Ring rows are connection 0 of their channel; P2P rows connection 1 of channel
/// `row - nchannels`, as NVIDIA's P2P connections are; the one-shot rows (never over the
/// network) connection 0 of their own numbers.
pub fn logged_channel(nchannels: u32, row: u32) -> (u32, u32) {
    if row < nchannels {
        (row, 0)
    } else if row < 2 * nchannels {
        (row - nchannels, 1)
    } else {
        (row - 2 * nchannels, 0)
    }
}

/// The connection row of channel `d` of the one-shot all-reduce.
pub fn direct_channel(nchannels: u32, d: u32) -> u32 {
    2 * nchannels + d
}

/// Whether connection row `row` is one of the one-shot all-reduce's.
pub fn is_direct_row(nchannels: u32, row: u32) -> bool {
    row >= 2 * nchannels
}

/// The connection channel that carries part `part` of a P2P operation.
pub fn p2p_channel(nchannels: u32, part: u32) -> u32 {
    nchannels + part
}

/// Split `total` into `parts` contiguous ranges whose starts are multiples of `gran`;
/// returns (start, len) for every part, empty ones included.
pub fn split(total: u64, parts: u32, gran: u64) -> Vec<(u64, u64)> {
    let parts = parts.max(1) as u64;
    let per = super::ring::part_len(total, parts, gran.max(1));
    (0..parts)
        .map(|i| {
            let start = (i * per).min(total);
            (start, per.min(total - start))
        })
        .collect()
}

/// Which connections `tasks` need: `(channel, peer, direction)`, sorted, without repeats
/// (ring channels to the neighbours of `rank` in `ring`).
pub fn connections_needed(
    rank: i32,
    nranks: i32,
    nchannels: u32,
    net: Option<&NetView>,
    ring: &RingOrder,
    tuner: Option<&dyn Tuner>,
    tasks: &[Task],
) -> Vec<(u32, i32, Dir)> {
    let setting = Setting {
        rank,
        nranks,
        nchannels,
        net,
        ring,
        ring_table: 0,
        tuner,
    };
    let Ok((pieces, _)) = decompose(setting, tasks) else {
        return Vec::new();
    };
    let mut out: Vec<(u32, i32, Dir)> = pieces
        .iter()
        .flat_map(|p| {
            let s = p.send.map(|(c, peer)| (c, peer, Dir::Send));
            let r = p.recv.map(|(c, peer)| (c, peer, Dir::Recv));
            s.into_iter().chain(r)
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn conn_of(geom: &Geometry, dir: Dir, ch: u32, peer: i32) -> Result<OxConn> {
    let table = match dir {
        Dir::Send => &geom.send,
        Dir::Recv => &geom.recv,
    };
    let conn = table
        .get(ch as usize)
        .and_then(|row| row.get(peer as usize))
        .copied()
        .flatten()
        .ok_or_else(|| {
            Error::internal(format!(
                "plan: rank {} has no {dir:?} connection on channel {ch} with peer {peer}",
                geom.rank
            ))
        })?;
    if conn.buf == 0 || conn.tail == 0 || conn.head == 0 || conn.step == 0 {
        return Err(Error::internal(format!(
            "plan: {dir:?} connection on channel {ch} with peer {peer} has a null pointer: {conn:?}"
        )));
    }
    if conn.slot_bytes == 0
        || conn.slot_bytes % 4096 != 0
        || !conn.nslots.is_power_of_two()
        || conn.nslots < 2
    {
        return Err(Error::internal(format!(
            "plan: {dir:?} connection on channel {ch} with peer {peer}: slot_bytes {} must be a \
             multiple of 4096 and nslots {} a power of two >= 2",
            conn.slot_bytes, conn.nslots
        )));
    }
    Ok(conn)
}

/// CTA of every item group: ring channel c is CTA c; P2P groups follow in order of first
/// appearance; beyond `nchannels` (at most MAX_CTAS), or beyond the fewest CTAs a task of
/// the group may use (`Piece::max_cta`), groups fold onto CTAs (correct because every CTA
/// runs its items by key).
fn assign_ctas(pieces: &[Piece], nchannels: u32) -> BTreeMap<Group, u32> {
    let mut cap: BTreeMap<Group, u32> = BTreeMap::new();
    for p in pieces {
        let c = cap.entry(p.group).or_insert(MAX_CTAS);
        *c = (*c).min(p.max_cta);
    }
    let mut groups: Vec<Group> = pieces.iter().map(|p| p.group).collect();
    groups.sort_by_key(|g| match g {
        Group::Chan(c) => (0, *c, 0),
        Group::P2p(..) => (1, 0, 0),
    });
    let chan_groups = pieces
        .iter()
        .filter_map(|p| match p.group {
            Group::Chan(c) => Some(c + 1),
            Group::P2p(..) => None,
        })
        .max()
        .unwrap_or(0);
    let mut cta_of: BTreeMap<Group, u32> = BTreeMap::new();
    let mut next_cta = chan_groups;
    for g in groups {
        if cta_of.contains_key(&g) {
            continue;
        }
        let cta = match g {
            Group::Chan(c) => c,
            Group::P2p(..) => {
                next_cta += 1;
                next_cta - 1
            }
        };
        let fold = nchannels.min(cap[&g]).clamp(1, MAX_CTAS);
        cta_of.insert(g, cta % fold);
    }
    cta_of
}

/// Whether items of `kind` step through ring-like connections in `chunk`-element steps.
fn has_steps(kind: u32) -> bool {
    kind != WorkKind::Send as u32 && kind != WorkKind::Recv as u32 && kind != WorkKind::Copy as u32
}

/// The item of `p` with its connections resolved and its step size set.
fn resolve(geom: &Geometry, p: &Piece) -> Result<OxWork> {
    let mut w = p.work;
    w.abort_flag = geom.abort_flag;
    if let Some((ch, peer)) = p.send {
        w.send = conn_of(geom, Dir::Send, ch, peer)?;
        if geom.parks(peer) {
            w.flags |= FLAG_PARK_SEND;
        }
        if geom.send_gpu.contains(&(ch, peer)) {
            w.flags |= FLAG_SEND_GPU;
        }
    }
    if let Some((ch, peer)) = p.recv {
        w.recv = conn_of(geom, Dir::Recv, ch, peer)?;
        if geom.parks(peer) {
            w.flags |= FLAG_PARK_RECV;
        }
        if geom.recv_gpu.contains(&(ch, peer)) {
            w.flags |= FLAG_RECV_GPU;
        }
    }
    if has_steps(w.kind) {
        if w.send.slot_bytes != w.recv.slot_bytes {
            return Err(Error::internal(format!(
                "plan: ring connections of channel {} have different slot sizes ({} and {}); \
                 every connection must use the same slot_bytes",
                p.send.map(|s| s.0).unwrap_or(0),
                w.send.slot_bytes,
                w.recv.slot_bytes
            )));
        }
        let es = crate::abi::ncclDataType_t::ALL[w.dtype as usize].size() as u64;
        w.chunk = Proto::of_flags(w.flags).step_bytes(w.send.slot_bytes) as u64 / es;
    }
    Ok(w)
}

/// Everything of one launch on one communicator for all `tasks` of a group.
pub fn plan(geom: &Geometry, tasks: &[Task]) -> Result<Plan> {
    if !geom.ring.is_identity() && geom.ring_table == 0 {
        return Err(Error::internal(
            "plan: a ring order other than rank order without its device table",
        ));
    }
    let setting = Setting {
        rank: geom.rank,
        nranks: geom.nranks,
        nchannels: geom.nchannels,
        net: geom.net.as_ref(),
        ring: &geom.ring,
        ring_table: geom.ring_table,
        tuner: geom.tuner.as_deref(),
    };
    let (pieces, mut copies) = decompose(setting, tasks)?;
    if pieces.is_empty() {
        // No kernel to run beside: the small copies become copy-kernel launches.
        let threads = cost::copy_kernel_threads();
        for c in &mut copies {
            if let Some(ctas) = cost::copy_kernel_ctas(c.bytes) {
                c.by = CopyBy::Kernel { ctas, threads };
            }
        }
    }
    let cta_of = assign_ctas(&pieces, geom.nchannels);
    let mut works = Vec::with_capacity(pieces.len());
    for (index, p) in pieces.iter().enumerate() {
        let mut w = resolve(geom, p)?;
        w.cta = cta_of[&p.group];
        works.push((w.cta, p.key, index, w));
    }
    works.sort_by_key(|&(cta, key, index, _)| (cta, key, index));
    let grid = works.iter().map(|w| w.0 + 1).max().unwrap_or(0);
    let yields = works
        .iter()
        .any(|(_, _, _, w)| w.flags & (FLAG_PARK_SEND | FLAG_PARK_RECV) != 0);
    let mut items = Vec::with_capacity(works.len() * super::device::WORK_SIZE);
    for (_, _, _, w) in &works {
        w.serialize_into(&mut items);
    }
    Ok(Plan {
        kernel: super::device::MAIN_KERNEL,
        grid,
        block: if geom.threads == 0 {
            BLOCK_THREADS
        } else {
            geom.threads
        },
        smem: 0,
        nitems: works.len() as u32,
        items,
        copies,
        yields,
    })
}
