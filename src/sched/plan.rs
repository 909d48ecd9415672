//! Planning one launch: turns all tasks of a group on one communicator into the work items of
//! ONE `ox_kernel` launch, and says which connections they need.
//!
//! Connections are indexed `[channel][peer]`. Channels `0..nchannels` are ring channels
//! (collectives: this rank -> rank+1 and rank-1 -> this rank); channels
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
//! alltoall, gather or scatter) come out as `LocalCopy`s, which the runtime hands to the copy
//! engine (`cuMemcpyAsync`) beside the kernel — all of a one-rank plan's, and those of at
//! least `cost::COPY_ENGINE_MIN_BYTES` otherwise; smaller ones stay kernel work.
//!
//! Protocol: each item is Simple or LL (`FLAG_LL`), chosen from the task's byte count by the
//! cost model, so both ends of every connection choose alike; `chunk` is then the step
//! payload of that protocol (see `device::simple_step_bytes` / `ll_step_bytes`).

use super::cost::{self, Algo, BLOCK_THREADS, MAX_CTAS};
use super::device::{
    ll_step_bytes, simple_step_bytes, OxConn, OxWork, WorkKind, FLAG_LL, FLAG_OPS, FLAG_OWN_BLOCK,
    FLAG_SCALAR_DEVICE,
};
use super::{CollKind, Task};
use crate::core::redop::{RedOp, Scalar};
use crate::error::{Error, Result};
use std::collections::BTreeMap;

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
    /// Device-visible address of a volatile u32 (host-mapped pinned memory); non-zero = abort.
    pub abort_flag: u64,
    /// Threads per CTA (`NCCL_NTHREADS`: 64..=512, a multiple of 64).
    pub threads: u32,
}

/// Direction of a connection, seen from this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dir {
    Send,
    Recv,
}

/// A device-to-device copy of `bytes` from `src` to `dst`, done by the copy engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalCopy {
    pub dst: u64,
    pub src: u64,
    pub bytes: u64,
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
}

/// Rows of `Geometry::send`/`recv`: ring channels, then as many P2P channels, then the
/// one-shot all-reduce's `DIRECT_MAX_CHANNELS` rows (connections with small LL-only buffers,
/// `cost::DIRECT_SLOT_BYTES`).
pub fn conn_channels(nchannels: u32) -> u32 {
    2 * nchannels + cost::DIRECT_MAX_CHANNELS
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

/// Which CTA group an item belongs to: all items that share a connection share a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Group {
    Chan(u32),
    P2p(u32, i32, Dir),
}

/// An item before connections and CTAs are resolved.
#[derive(Clone, Debug)]
struct Piece {
    group: Group,
    key: (u8, u64, u64, u64, u64),
    work: OxWork,
    send: Option<(u32, i32)>,
    recv: Option<(u32, i32)>,
}

/// A P2P operation: `bytes` from `addr` to `peer` (Send) or from `peer` into `addr` (Recv).
struct P2pOp {
    peer: i32,
    dir: Dir,
    addr: u64,
    bytes: u64,
}

/// Split `total` into `parts` contiguous ranges whose starts are multiples of `gran`;
/// returns (start, len) for every part, empty ones included.
pub fn split(total: u64, parts: u32, gran: u64) -> Vec<(u64, u64)> {
    let parts = parts.max(1) as u64;
    let gran = gran.max(1);
    let per = total.div_ceil(parts).div_ceil(gran) * gran;
    (0..parts)
        .map(|i| {
            let start = (i * per).min(total);
            (start, per.min(total - start))
        })
        .collect()
}

fn scalar_of(op: RedOp) -> (u64, u32) {
    match op {
        RedOp::PreMulSum(Scalar::Host(bytes)) => (u64::from_le_bytes(bytes), 0),
        RedOp::PreMulSum(Scalar::Device(ptr)) => (ptr, FLAG_SCALAR_DEVICE),
        _ => (0, 0),
    }
}

fn is_reduction(kind: CollKind) -> bool {
    matches!(
        kind,
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
    )
}

/// The items of a one-shot all-reduce on `nch` channels: per channel, a `DirectAllReduce`
/// item with the connections of peer 0 (send to rank+1, receive from rank-1) followed by a
/// `DirectPeer` item for each further peer k (send to rank+1+k, receive from rank-1-k), all
/// on the channel's CTA with the task's key, so they stay together in the CTA's item list.
#[allow(clippy::too_many_arguments)]
fn push_direct(
    pieces: &mut Vec<Piece>,
    base: &dyn Fn(WorkKind) -> OxWork,
    seq: u64,
    task: &Task,
    nch: u32,
    gran: u64,
    rank: i32,
    nranks: i32,
    nchannels: u32,
) {
    let count = task.count as u64;
    for (c, (start, len)) in split(count, nch, gran).into_iter().enumerate() {
        if len == 0 {
            continue;
        }
        let row = direct_channel(nchannels, c as u32);
        for k in 0..nranks - 1 {
            let mut w = base(if k == 0 {
                WorkKind::DirectAllReduce
            } else {
                WorkKind::DirectPeer
            });
            w.flags |= FLAG_LL;
            w.src = task.sendbuff;
            w.dst = task.recvbuff;
            w.offset = start;
            w.count = len;
            w.block = count;
            pieces.push(Piece {
                group: Group::Chan(c as u32),
                key: (0, seq, 0, 0, 0),
                work: w,
                send: Some((row, (rank + 1 + k).rem_euclid(nranks))),
                recv: Some((row, (rank - 1 - k).rem_euclid(nranks))),
            });
        }
    }
}

/// The items of `tasks` on `rank`, without connections resolved, and the local copies.
fn decompose(
    rank: i32,
    nranks: i32,
    nchannels: u32,
    tasks: &[Task],
) -> Result<(Vec<Piece>, Vec<LocalCopy>)> {
    if nranks < 1 || rank < 0 || rank >= nranks {
        return Err(Error::internal(format!(
            "plan: rank {rank} of {nranks} ranks"
        )));
    }
    if nchannels == 0 || nchannels > MAX_CTAS {
        return Err(Error::internal(format!(
            "plan: nchannels {nchannels} must be in 1..={MAX_CTAS}"
        )));
    }
    let mut pieces = Vec::new();
    let mut copies = Vec::new();
    let mut coll_seq = 0u64;
    let mut p2p_seq: BTreeMap<(i32, Dir), u64> = BTreeMap::new();
    let mut self_sends: Vec<(u64, u64)> = Vec::new();
    let mut self_recvs: Vec<(u64, u64)> = Vec::new();
    let next = (rank + 1) % nranks;
    let prev = (rank + nranks - 1) % nranks;

    for task in tasks {
        let es = task.dtype.size() as u64;
        if es == 0 {
            return Err(Error::invalid_argument("invalid data type"));
        }
        let count = task.count as u64;
        let bytes = count * es;
        let (scalar, sflags) = scalar_of(task.op);
        let flags = sflags | if is_reduction(task.kind) { FLAG_OPS } else { 0 };
        let base = |kind: WorkKind| {
            let mut w = OxWork::new(kind);
            w.dtype = task.dtype as u32;
            w.op = task.op.code();
            w.flags = flags;
            w.scalar = scalar;
            w.rank = rank;
            w.nranks = nranks;
            w.root = task.root;
            w
        };
        match cost::algorithm(task.kind, nranks) {
            Algo::Copy => {
                let seq = coll_seq;
                coll_seq += 1;
                let transform = one_rank_transform(task);
                if count == 0 || (task.sendbuff == task.recvbuff && !transform) {
                    continue;
                }
                if !transform {
                    copies.push(LocalCopy {
                        dst: task.recvbuff,
                        src: task.sendbuff,
                        bytes,
                    });
                    continue;
                }
                let nch = cost::copy_channels(bytes, nchannels);
                for (c, (start, len)) in split(count, nch, 16).into_iter().enumerate() {
                    if len == 0 {
                        continue;
                    }
                    let mut w = base(WorkKind::Copy);
                    w.src = task.sendbuff + start * es;
                    w.dst = task.recvbuff + start * es;
                    w.count = len;
                    pieces.push(Piece {
                        group: Group::Chan(c as u32),
                        key: (0, seq, 0, 0, 0),
                        work: w,
                        send: None,
                        recv: None,
                    });
                }
            }
            Algo::Ring => {
                let seq = coll_seq;
                coll_seq += 1;
                if count == 0 {
                    continue;
                }
                let kind = match task.kind {
                    CollKind::AllReduce => WorkKind::RingAllReduce,
                    CollKind::AllGather => WorkKind::RingAllGather,
                    CollKind::ReduceScatter => WorkKind::RingReduceScatter,
                    CollKind::Broadcast => WorkKind::RingBroadcast,
                    _ => WorkKind::RingReduce,
                };
                if matches!(task.kind, CollKind::Broadcast | CollKind::Reduce)
                    && !(0..nranks).contains(&task.root)
                {
                    return Err(Error::invalid_argument(format!(
                        "root {} out of range",
                        task.root
                    )));
                }
                // This rank's own all-gather block: in place already, or a copy-engine copy
                // beside the ring when large, or written by the ring's first step.
                let mut own_flag = 0;
                if task.kind == CollKind::AllGather {
                    let own = task.recvbuff + rank as u64 * bytes;
                    if task.sendbuff != own {
                        if bytes >= cost::COPY_ENGINE_MIN_BYTES {
                            copies.push(LocalCopy {
                                dst: own,
                                src: task.sendbuff,
                                bytes,
                            });
                        } else {
                            own_flag = FLAG_OWN_BLOCK;
                        }
                    }
                }
                let gran = (16 / es).max(1);
                let (ll, nch) = if task.kind == CollKind::AllReduce {
                    match cost::allreduce_plan(bytes, nranks, nchannels) {
                        cost::AllReducePlan::Ring { ll, nch } => (ll, nch),
                        cost::AllReducePlan::Direct { nch } => {
                            push_direct(
                                &mut pieces,
                                &base,
                                seq,
                                task,
                                nch,
                                gran,
                                rank,
                                nranks,
                                nchannels,
                            );
                            continue;
                        }
                    }
                } else {
                    cost::ring_plan(task.kind, bytes, nranks, nchannels)
                };
                for (c, (start, len)) in split(count, nch, gran).into_iter().enumerate() {
                    if len == 0 {
                        continue;
                    }
                    let mut w = base(kind);
                    w.flags |= own_flag;
                    if ll {
                        w.flags |= FLAG_LL;
                    }
                    w.src = task.sendbuff;
                    w.dst = task.recvbuff;
                    w.offset = start;
                    w.count = len;
                    w.block = count;
                    // The position in the ring; the chain of Broadcast needs it and the next
                    // rank to be rank + 1, as it is here.
                    pieces.push(Piece {
                        group: Group::Chan(c as u32),
                        key: (0, seq, 0, 0, 0),
                        work: w,
                        send: Some((c as u32, next)),
                        recv: Some((c as u32, prev)),
                    });
                }
            }
            Algo::P2p => {
                let mut ops = Vec::new();
                let block = bytes;
                match task.kind {
                    CollKind::Send | CollKind::Recv => {
                        let peer = task.root;
                        if !(0..nranks).contains(&peer) {
                            return Err(Error::invalid_argument(format!(
                                "peer {peer} out of range"
                            )));
                        }
                        let (dir, addr) = if task.kind == CollKind::Send {
                            (Dir::Send, task.sendbuff)
                        } else {
                            (Dir::Recv, task.recvbuff)
                        };
                        ops.push(P2pOp {
                            peer,
                            dir,
                            addr,
                            bytes,
                        });
                    }
                    CollKind::AlltoAll => {
                        for p in 0..nranks {
                            let o = p as u64 * block;
                            ops.push(P2pOp {
                                peer: p,
                                dir: Dir::Send,
                                addr: task.sendbuff + o,
                                bytes,
                            });
                            ops.push(P2pOp {
                                peer: p,
                                dir: Dir::Recv,
                                addr: task.recvbuff + o,
                                bytes,
                            });
                        }
                    }
                    CollKind::Gather | CollKind::Scatter => {
                        let root = task.root;
                        if !(0..nranks).contains(&root) {
                            return Err(Error::invalid_argument(format!(
                                "root {root} out of range"
                            )));
                        }
                        let gather = task.kind == CollKind::Gather;
                        if rank == root {
                            for p in 0..nranks {
                                let o = p as u64 * block;
                                let (dir, addr) = if gather {
                                    (Dir::Recv, task.recvbuff + o)
                                } else {
                                    (Dir::Send, task.sendbuff + o)
                                };
                                if p == rank {
                                    // The root's own block: a self send + recv pair.
                                    let (s, r) = if gather {
                                        (task.sendbuff, task.recvbuff + o)
                                    } else {
                                        (task.sendbuff + o, task.recvbuff)
                                    };
                                    ops.push(P2pOp {
                                        peer: p,
                                        dir: Dir::Send,
                                        addr: s,
                                        bytes,
                                    });
                                    ops.push(P2pOp {
                                        peer: p,
                                        dir: Dir::Recv,
                                        addr: r,
                                        bytes,
                                    });
                                } else {
                                    ops.push(P2pOp {
                                        peer: p,
                                        dir,
                                        addr,
                                        bytes,
                                    });
                                }
                            }
                        } else {
                            let (dir, addr) = if gather {
                                (Dir::Send, task.sendbuff)
                            } else {
                                (Dir::Recv, task.recvbuff)
                            };
                            ops.push(P2pOp {
                                peer: root,
                                dir,
                                addr,
                                bytes,
                            });
                        }
                    }
                    _ => unreachable!("only P2P kinds use Algo::P2p"),
                }
                for op in ops {
                    if op.peer == rank {
                        match op.dir {
                            Dir::Send => self_sends.push((op.addr, op.bytes)),
                            Dir::Recv => self_recvs.push((op.addr, op.bytes)),
                        }
                        continue;
                    }
                    let seq = p2p_seq.entry((op.peer, op.dir)).or_insert(0);
                    let this_seq = *seq;
                    *seq += 1;
                    if op.bytes == 0 {
                        continue;
                    }
                    let (src, dst) = match op.dir {
                        Dir::Send => (rank, op.peer),
                        Dir::Recv => (op.peer, rank),
                    };
                    let round = (dst - src).rem_euclid(nranks) as u64;
                    let parts = cost::p2p_channels_for(task.kind, op.bytes, nchannels);
                    let ll = cost::p2p_ll(op.bytes);
                    for (j, (start, len)) in split(op.bytes, parts, 512).into_iter().enumerate() {
                        if len == 0 {
                            continue;
                        }
                        let ch = p2p_channel(nchannels, j as u32);
                        let mut w = OxWork::new(match op.dir {
                            Dir::Send => WorkKind::Send,
                            Dir::Recv => WorkKind::Recv,
                        });
                        w.dtype = crate::abi::ncclDataType_t::ncclUint8 as u32;
                        w.rank = rank;
                        w.nranks = nranks;
                        w.root = op.peer;
                        if ll {
                            w.flags |= FLAG_LL;
                        }
                        w.count = len;
                        match op.dir {
                            Dir::Send => w.src = op.addr + start,
                            Dir::Recv => w.dst = op.addr + start,
                        }
                        pieces.push(Piece {
                            group: Group::P2p(j as u32, op.peer, op.dir),
                            key: (1, round, src as u64, this_seq, j as u64),
                            work: w,
                            send: (op.dir == Dir::Send).then_some((ch, op.peer)),
                            recv: (op.dir == Dir::Recv).then_some((ch, op.peer)),
                        });
                    }
                }
            }
        }
    }

    // Sends to self pair with receives from self, in order: local copies.
    if self_sends.len() != self_recvs.len() {
        return Err(Error::invalid_usage(format!(
            "rank {rank}: {} send(s) to itself but {} receive(s) from itself in one group",
            self_sends.len(),
            self_recvs.len()
        )));
    }
    for (seq, (&(src, sbytes), &(dst, rbytes))) in
        self_sends.iter().zip(self_recvs.iter()).enumerate()
    {
        if sbytes != rbytes {
            return Err(Error::invalid_usage(format!(
                "rank {rank}: send to itself of {sbytes} bytes matched with a receive of {rbytes} bytes"
            )));
        }
        if sbytes == 0 || src == dst {
            continue;
        }
        if nranks == 1 || sbytes >= cost::COPY_ENGINE_MIN_BYTES {
            copies.push(LocalCopy {
                dst,
                src,
                bytes: sbytes,
            });
            continue;
        }
        let nch = cost::copy_channels(sbytes, nchannels);
        for (c, (start, len)) in split(sbytes, nch, 512).into_iter().enumerate() {
            if len == 0 {
                continue;
            }
            let mut w = OxWork::new(WorkKind::Copy);
            w.dtype = crate::abi::ncclDataType_t::ncclUint8 as u32;
            w.rank = rank;
            w.nranks = nranks;
            w.src = src + start;
            w.dst = dst + start;
            w.count = len;
            pieces.push(Piece {
                group: Group::Chan(c as u32),
                key: (1, 0, rank as u64, seq as u64, c as u64),
                work: w,
                send: None,
                recv: None,
            });
        }
    }
    Ok((pieces, copies))
}

/// Whether a one-rank task changes its data (PreMulSum scales it); every other op of one rank
/// (sum, prod, min, max, avg) returns the input unchanged, so a copy, or nothing in place.
pub fn one_rank_transform(task: &Task) -> bool {
    is_reduction(task.kind) && matches!(task.op, RedOp::PreMulSum(_))
}

/// Which connections `tasks` need: `(channel, peer, direction)`, sorted, without repeats.
pub fn connections_needed(
    rank: i32,
    nranks: i32,
    nchannels: u32,
    tasks: &[Task],
) -> Vec<(u32, i32, Dir)> {
    let Ok((pieces, _)) = decompose(rank, nranks, nchannels, tasks) else {
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

/// Everything of one launch on one communicator for all `tasks` of a group.
pub fn plan(geom: &Geometry, tasks: &[Task]) -> Result<Plan> {
    let (pieces, copies) = decompose(geom.rank, geom.nranks, geom.nchannels, tasks)?;
    // CTAs: ring channel c is CTA c; P2P groups follow in order of first appearance; beyond
    // `nchannels` (at most MAX_CTAS) groups fold onto CTAs (correct because every CTA runs its
    // items by key).
    let mut groups: Vec<Group> = pieces.iter().map(|p| p.group).collect();
    groups.sort_by_key(|g| match g {
        Group::Chan(c) => (0, *c, 0),
        Group::P2p(..) => (1, 0, 0),
    });
    let mut cta_of: BTreeMap<Group, u32> = BTreeMap::new();
    let mut nchan_groups = 0u32;
    for p in &pieces {
        if let Group::Chan(c) = p.group {
            nchan_groups = nchan_groups.max(c + 1);
        }
    }
    let mut next_cta = nchan_groups;
    for g in groups {
        if cta_of.contains_key(&g) {
            continue;
        }
        let cta = match g {
            Group::Chan(c) => c,
            Group::P2p(..) => {
                let c = next_cta;
                next_cta += 1;
                c
            }
        };
        cta_of.insert(g, cta % geom.nchannels.clamp(1, MAX_CTAS));
    }
    let mut works = Vec::with_capacity(pieces.len());
    for (index, p) in pieces.iter().enumerate() {
        let mut w = p.work;
        w.abort_flag = geom.abort_flag;
        if let Some((ch, peer)) = p.send {
            w.send = conn_of(geom, Dir::Send, ch, peer)?;
        }
        if let Some((ch, peer)) = p.recv {
            w.recv = conn_of(geom, Dir::Recv, ch, peer)?;
        }
        if w.kind != WorkKind::Send as u32
            && w.kind != WorkKind::Recv as u32
            && w.kind != WorkKind::Copy as u32
        {
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
            let step_bytes = if w.flags & FLAG_LL != 0 {
                ll_step_bytes(w.send.slot_bytes)
            } else {
                simple_step_bytes(w.send.slot_bytes)
            };
            w.chunk = step_bytes as u64 / es;
        }
        w.cta = cta_of[&p.group];
        works.push((w.cta, p.key, index, w));
    }
    works.sort_by_key(|&(cta, key, index, _)| (cta, key, index));
    let grid = works.iter().map(|w| w.0 + 1).max().unwrap_or(0);
    let mut items = Vec::with_capacity(works.len() * super::device::WORK_SIZE);
    for (_, _, _, w) in &works {
        w.serialize_into(&mut items);
    }
    Ok(Plan {
        kernel: crate::cuda::module::MAIN_KERNEL,
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
    })
}
