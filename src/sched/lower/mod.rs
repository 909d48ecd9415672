//! Lowering: turns the tasks of a group into work items (`Piece`s: an `OxWork` with its CTA
//! group, its ordering key and the connections it needs, not yet resolved) and copy-engine
//! copies. One module per family of tasks:
//!
//! - `ring`: ring collectives (all-reduce, all-gather, reduce-scatter, broadcast, reduce);
//! - `one_shot`: the one-shot all-reduce the cost model may pick instead of the ring;
//! - `to_p2p`: send/recv, alltoall, gather and scatter as point-to-point operations;
//! - `p2p`: point-to-point operations as items over the P2P channels;
//! - `copy`: one-rank collectives, and sends to self paired with receives from self.
//!
//! `plan` then assigns CTAs and resolves connections.

mod copy;
mod one_shot;
mod p2p;
mod ring;
mod to_p2p;

pub use copy::one_rank_transform;

use super::cost::{self, Algo, Limits, MAX_CTAS};
use super::device::{OxWork, WorkKind, FLAG_OPS, FLAG_SCALAR_DEVICE};
use super::plan::{Dir, LocalCopy, NetView};
use super::redop::{RedOp, Scalar};
use super::ring::RingOrder;
use super::tune::Tuner;
use super::{CollKind, Task};
use crate::error::{Error, Result};
use std::collections::BTreeMap;

/// Which CTA group an item belongs to: all items that share a connection share a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    Chan(u32),
    P2p(u32, i32, Dir),
}

/// An item before connections and CTAs are resolved.
#[derive(Clone, Debug)]
pub struct Piece {
    pub group: Group,
    pub key: (u8, u64, u64, u64, u64),
    pub work: OxWork,
    /// (connection row, peer) of the item's send and receive connections.
    pub send: Option<(u32, i32)>,
    pub recv: Option<(u32, i32)>,
    /// Most CTAs the item's task may use (`Limits::max_channels`): its group's CTA is below
    /// the least of its items'.
    pub max_cta: u32,
}

/// The ordering key of every item of the collective with sequence number `seq`.
fn collective_key(seq: u64) -> (u8, u64, u64, u64, u64) {
    (0, seq, 0, 0, 0)
}

/// What lowering accumulates over the tasks of a group on one rank.
struct Lowering<'a> {
    rank: i32,
    nranks: i32,
    nchannels: u32,
    pieces: Vec<Piece>,
    copies: Vec<LocalCopy>,
    /// A one-rank group's copies until every task is lowered (`place_one_rank_copies`).
    one_rank_copies: Vec<copy::OneRankCopy>,
    /// Sequence number of the next collective of the group.
    coll_seq: u64,
    /// Sequence number of the next operation towards (peer, direction).
    p2p_seq: BTreeMap<(i32, Dir), u64>,
    /// (address, bytes, the task's most channels) of every send to self and every receive
    /// from self, in order.
    self_sends: Vec<(u64, u64, u32)>,
    self_recvs: Vec<(u64, u64, u32)>,
    /// The limits of the task being lowered (`Limits::of` its options).
    limits: Limits,
    /// The network, when the communicator uses it: rings are planned for its link, and the
    /// one-shot all-reduce is never chosen (the proxy moves data between steps, and one-shot
    /// steps, LL words to every peer at once, have no step words).
    net: Option<&'a NetView>,
    /// The order of the ranks around the ring channels, and the device address of its table
    /// (`FLAG_RING_ORDER`; 0 when only the connections are asked for).
    ring: &'a RingOrder,
    ring_table: u64,
    /// The communicator's tuner plugin, asked about every ring collective.
    tuner: Option<&'a dyn Tuner>,
}

/// The communicator-wide inputs of lowering besides the tasks.
#[derive(Clone, Copy)]
pub struct Setting<'a> {
    pub rank: i32,
    pub nranks: i32,
    pub nchannels: u32,
    pub net: Option<&'a NetView>,
    pub ring: &'a RingOrder,
    /// Device address of the ring table (0 when the items are not launched).
    pub ring_table: u64,
    pub tuner: Option<&'a dyn Tuner>,
}

impl<'a> Lowering<'a> {
    fn new(setting: Setting<'a>) -> Result<Self> {
        let Setting {
            rank,
            nranks,
            nchannels,
            net,
            ring,
            ring_table,
            tuner,
        } = setting;
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
        if ring.nranks() != nranks {
            return Err(Error::internal(format!(
                "plan: a ring order of {} ranks for {nranks} ranks",
                ring.nranks()
            )));
        }
        Ok(Lowering {
            rank,
            nranks,
            nchannels,
            pieces: Vec::new(),
            copies: Vec::new(),
            one_rank_copies: Vec::new(),
            coll_seq: 0,
            p2p_seq: BTreeMap::new(),
            self_sends: Vec::new(),
            self_recvs: Vec::new(),
            limits: Limits::of(nchannels, &Default::default()),
            net,
            ring,
            ring_table,
            tuner,
        })
    }

    /// Take the next collective sequence number.
    fn next_collective(&mut self) -> u64 {
        self.coll_seq += 1;
        self.coll_seq - 1
    }

    /// Lower one task with the algorithm the cost model picks for it, within its limits.
    fn task(&mut self, task: &Task) -> Result<()> {
        if task.dtype.size() == 0 {
            return Err(Error::invalid_argument("invalid data type"));
        }
        self.limits = Limits::of(self.nchannels, &task.opts);
        match cost::algorithm(task.kind, self.nranks) {
            Algo::Copy => {
                let seq = self.next_collective();
                self.one_rank(task, seq);
                Ok(())
            }
            Algo::Ring => {
                let seq = self.next_collective();
                self.ring(task, seq)
            }
            Algo::P2p => {
                let ops = to_p2p::ops_of(task, self.rank, self.nranks)?;
                self.p2p_ops(task.kind, ops);
                Ok(())
            }
        }
    }

    /// An item of `kind` with the task-wide fields of `task` (dtype, op, scalar, ranks, root).
    fn task_work(&self, task: &Task, kind: WorkKind) -> OxWork {
        let (scalar, scalar_flags) = scalar_of(task.op);
        let mut w = OxWork::new(kind);
        w.dtype = task.dtype as u32;
        w.op = task.op.code();
        w.flags = scalar_flags | if is_reduction(task.kind) { FLAG_OPS } else { 0 };
        w.scalar = scalar;
        w.rank = self.rank;
        w.nranks = self.nranks;
        w.root = task.root;
        w
    }

    /// A channel item of `kind` covering elements [start, start + len) of a task of `count`
    /// elements per rank block, on the task's own buffers (ring and one-shot items).
    fn range_work(&self, task: &Task, kind: WorkKind, start: u64, len: u64, count: u64) -> OxWork {
        let mut w = self.task_work(task, kind);
        w.src = task.sendbuff;
        w.dst = task.recvbuff;
        w.offset = start;
        w.count = len;
        w.block = count;
        w
    }

    /// An item of `kind` on bytes (no op), as P2P operations and local copies use.
    fn byte_work(&self, kind: WorkKind) -> OxWork {
        let mut w = OxWork::new(kind);
        w.dtype = crate::abi::ncclDataType_t::ncclUint8 as u32;
        w.rank = self.rank;
        w.nranks = self.nranks;
        w
    }
}

/// The PreMulSum scalar of `op` and its flag: bytes of a host value, or a device pointer.
fn scalar_of(op: RedOp) -> (u64, u32) {
    match op {
        RedOp::PreMulSum(Scalar::Host(bytes)) => (u64::from_le_bytes(bytes), 0),
        RedOp::PreMulSum(Scalar::Device(ptr)) => (ptr, FLAG_SCALAR_DEVICE),
        _ => (0, 0),
    }
}

/// Whether `kind` reduces (and so applies the op's transforms).
pub fn is_reduction(kind: CollKind) -> bool {
    matches!(
        kind,
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
    )
}

/// The items of `tasks` on `setting.rank`, without connections resolved, and the local
/// copies; ring channels follow `setting.ring`, whose table the items address at
/// `setting.ring_table` (device memory; 0 when the items are not launched, as for
/// `connections_needed`).
pub fn decompose(setting: Setting<'_>, tasks: &[Task]) -> Result<(Vec<Piece>, Vec<LocalCopy>)> {
    let mut lowering = Lowering::new(setting)?;
    for task in tasks {
        lowering.task(task)?;
    }
    lowering.pair_self_copies()?;
    lowering.place_one_rank_copies();
    Ok((lowering.pieces, lowering.copies))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::device::WorkKind;
    use crate::sched::redop::RedOp;

    fn small_all_reduce() -> Task {
        Task {
            kind: CollKind::AllReduce,
            dtype: crate::abi::ncclDataType_t::ncclFloat32,
            op: RedOp::Sum,
            count: 2,
            sendbuff: 0x1000,
            recvbuff: 0x2000,
            root: 0,
            opts: Default::default(),
            weights_epoch: 0,
        }
    }

    fn kinds(net: bool) -> Vec<u32> {
        let view = NetView {
            link: crate::sched::cost::NetLink::from_properties(100_000, 0.0),
            remote: vec![true; 4],
            routes: crate::sched::Routes::even(),
        };
        let ring = RingOrder::identity(4);
        let setting = Setting {
            rank: 0,
            nranks: 4,
            nchannels: 8,
            net: net.then_some(&view),
            ring: &ring,
            ring_table: 0,
            tuner: None,
        };
        let (pieces, _) = decompose(setting, &[small_all_reduce()]).unwrap();
        pieces.iter().map(|p| p.work.kind).collect()
    }

    #[test]
    fn no_one_shot_all_reduce_over_the_network() {
        // Without the network an 8-byte all-reduce of 4 ranks takes the one-shot path ...
        assert!(kinds(false).contains(&(WorkKind::DirectAllReduce as u32)));
        // ... over it, the ring: the proxy moves data only between steps that have step words.
        let over_net = kinds(true);
        assert!(!over_net.is_empty());
        assert!(
            over_net
                .iter()
                .all(|&k| k == WorkKind::RingAllReduce as u32),
            "{over_net:?}"
        );
    }
}
