//! What a communicator was asked to do, in order, and how far it got. Every collective gets
//! the next collective number, every send the next number towards its peer and every receive
//! the next number from its peer; all ranks count alike, so one number names the same
//! operation on every rank (collective #57 here is collective #57 there; send #3 to rank 2 is
//! rank 2's receive #3 from here). Every operation also gets an ordinal, its place among all
//! of this communicator's operations, which is how far the launches and their completion are
//! tracked: `launched` is the ordinal of the last operation handed to the GPU (set by the
//! launch path), `completed` that of the last one known finished (set by the watchdog,
//! `core::watchdog`, which sees the launches' completion). The last [`RECENT`] operations are
//! kept with what they were, for reports that name the operation a rank waits in and the
//! ranks behind it.

use super::int_map::IntMap;
use crate::abi::ncclDataType_t;
use crate::sched::redop::RedOp;
use crate::sched::{CollKind, Task};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

/// Operations kept per communicator.
pub const RECENT: usize = 256;

/// One enqueued operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpRecord {
    /// The collective number, or for send/recv the number with `peer`.
    pub seq: u64,
    /// Its place among all operations of the communicator (1, 2, ...).
    pub ordinal: u64,
    pub kind: CollKind,
    pub count: usize,
    pub dtype: ncclDataType_t,
    pub op: RedOp,
    /// Root (rooted collectives) or peer (send, recv); 0 otherwise.
    pub root: i32,
    pub stream: usize,
}

impl OpRecord {
    /// Whether this is a send or a receive (numbered per peer and direction).
    pub fn is_p2p(&self) -> bool {
        matches!(self.kind, CollKind::Send | CollKind::Recv)
    }
}

/// How many operations of each numbering there were up to some point.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub collectives: u64,
    /// (peer, is a send) -> operations.
    pub p2p: IntMap<(i32, bool), u64>,
}

impl Counts {
    /// Sends to `peer` (`send`) or receives from it.
    pub fn p2p_with(&self, peer: i32, send: bool) -> u64 {
        self.p2p.get(&(peer, send)).copied().unwrap_or(0)
    }

    fn count(&mut self, r: &OpRecord) -> u64 {
        let n = if r.is_p2p() {
            self.p2p
                .entry((r.root, r.kind == CollKind::Send))
                .or_default()
        } else {
            &mut self.collectives
        };
        *n += 1;
        *n
    }

    fn uncount(&mut self, r: &OpRecord) {
        let n = if r.is_p2p() {
            self.p2p
                .entry((r.root, r.kind == CollKind::Send))
                .or_default()
        } else {
            &mut self.collectives
        };
        *n = n.saturating_sub(1);
    }
}

#[derive(Default)]
struct Log {
    ops: u64,
    counts: Counts,
    recent: VecDeque<OpRecord>,
}

/// A communicator's numbering, recent history and progress.
#[derive(Default)]
pub struct Progress {
    log: Mutex<Log>,
    launched: AtomicU64,
    completed: AtomicU64,
    /// The ordinal up to which operations wait in the collective check (`watchdog::check`),
    /// before their launch; 0 when none do.
    checking: AtomicU64,
}

impl Progress {
    /// Number `task` (issued on `stream`) and remember it; returns its number.
    pub fn record(&self, task: &Task, stream: usize) -> u64 {
        let mut log = self.log.lock();
        log.ops += 1;
        let mut rec = OpRecord {
            seq: 0,
            ordinal: log.ops,
            kind: task.kind,
            count: task.count,
            dtype: task.dtype,
            op: task.op,
            root: task.root,
            stream,
        };
        rec.seq = log.counts.count(&rec);
        if log.recent.len() == RECENT {
            log.recent.pop_front();
        }
        log.recent.push_back(rec);
        rec.seq
    }

    /// Collectives enqueued so far.
    pub fn collectives(&self) -> u64 {
        self.log.lock().counts.collectives
    }

    /// The ordinal of the last operation enqueued.
    pub fn enqueued(&self) -> u64 {
        self.log.lock().ops
    }

    /// Everything enqueued so far has been handed to the GPU (or needed no GPU work).
    pub fn mark_launched(&self) {
        let ops = self.enqueued();
        self.launched.fetch_max(ops, Ordering::AcqRel);
    }

    /// The ordinal of the last operation handed to the GPU.
    pub fn launched(&self) -> u64 {
        self.launched.load(Ordering::Acquire)
    }

    /// Operations up to `ordinal` wait in the collective check (`None`: the check ended).
    pub fn set_checking(&self, ordinal: Option<u64>) {
        self.checking.store(ordinal.unwrap_or(0), Ordering::Release);
    }

    /// Whether operations wait in the collective check now.
    pub fn in_check(&self) -> bool {
        self.checking.load(Ordering::Acquire) > self.launched()
    }

    /// The ordinal of the last operation handed over to run: launched, or waiting in the
    /// collective check before its launch (what the watchdog counts as pending).
    pub fn handed_over(&self) -> u64 {
        self.launched().max(self.checking.load(Ordering::Acquire))
    }

    /// Operations up to `ordinal` are known to have finished.
    pub fn set_completed(&self, ordinal: u64) {
        self.completed.fetch_max(ordinal, Ordering::AcqRel);
    }

    /// The ordinal of the last operation known to have finished.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Acquire)
    }

    /// The kept operations, oldest first.
    pub fn recent(&self) -> Vec<OpRecord> {
        self.log.lock().recent.iter().copied().collect()
    }

    /// The operation with this ordinal, if still kept.
    pub fn by_ordinal(&self, ordinal: u64) -> Option<OpRecord> {
        let log = self.log.lock();
        let first = log.recent.front()?.ordinal;
        let at = ordinal.checked_sub(first)? as usize;
        log.recent.get(at).copied()
    }

    /// The newest kept operation up to `ordinal` that matches `pick`.
    pub fn newest_upto(&self, ordinal: u64, pick: impl Fn(&OpRecord) -> bool) -> Option<OpRecord> {
        let log = self.log.lock();
        log.recent
            .iter()
            .rev()
            .filter(|r| r.ordinal <= ordinal)
            .find(|r| pick(r))
            .copied()
    }

    /// Collective number `seq`, if still kept.
    pub fn collective(&self, seq: u64) -> Option<OpRecord> {
        self.find(|r| !r.is_p2p() && r.seq == seq)
    }

    /// Send number `seq` to `peer` (`send`) or receive number `seq` from it, if still kept.
    pub fn p2p(&self, peer: i32, send: bool, seq: u64) -> Option<OpRecord> {
        let kind = if send { CollKind::Send } else { CollKind::Recv };
        self.find(|r| r.kind == kind && r.root == peer && r.seq == seq)
    }

    fn find(&self, pick: impl Fn(&OpRecord) -> bool) -> Option<OpRecord> {
        self.log
            .lock()
            .recent
            .iter()
            .rev()
            .find(|r| pick(r))
            .copied()
    }

    /// The counts as they stood after operation `ordinal`: exact while every later operation
    /// is still kept, else None.
    pub fn counts_at(&self, ordinal: u64) -> Option<Counts> {
        let log = self.log.lock();
        let mut counts = log.counts.clone();
        let mut oldest_later = log.ops + 1;
        for r in log.recent.iter().rev().take_while(|r| r.ordinal > ordinal) {
            counts.uncount(r);
            oldest_later = r.ordinal;
        }
        (oldest_later == ordinal + 1 || ordinal >= log.ops).then_some(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(kind: CollKind, count: usize, root: i32) -> Task {
        Task {
            kind,
            dtype: ncclDataType_t::ncclFloat32,
            op: RedOp::Sum,
            count,
            sendbuff: 0,
            recvbuff: 0,
            root,
            opts: Default::default(),
            weights_epoch: 0,
        }
    }

    #[test]
    fn collectives_and_each_peer_direction_count_separately() {
        let p = Progress::default();
        assert_eq!(p.record(&task(CollKind::AllReduce, 4, 0), 1), 1);
        assert_eq!(p.record(&task(CollKind::Send, 8, 2), 1), 1);
        assert_eq!(p.record(&task(CollKind::Send, 8, 2), 1), 2);
        assert_eq!(p.record(&task(CollKind::Recv, 8, 2), 1), 1);
        assert_eq!(p.record(&task(CollKind::Send, 8, 3), 1), 1);
        assert_eq!(p.record(&task(CollKind::AllGather, 0, 0), 7), 2);
        assert_eq!(p.collectives(), 2);
        let last = *p.recent().last().unwrap();
        assert_eq!(
            (last.seq, last.ordinal, last.kind, last.count, last.stream),
            (2, 6, CollKind::AllGather, 0, 7)
        );
        assert_eq!(p.p2p(2, true, 2).unwrap().ordinal, 3);
        assert_eq!(p.collective(1).unwrap().ordinal, 1);
        assert_eq!(p.by_ordinal(4).unwrap().kind, CollKind::Recv);
    }

    #[test]
    fn only_the_most_recent_operations_are_kept() {
        let p = Progress::default();
        for i in 0..RECENT + 10 {
            p.record(&task(CollKind::Broadcast, i, 1), 0);
        }
        let kept = p.recent();
        assert_eq!(kept.len(), RECENT);
        assert_eq!(kept[0].seq, 11);
        assert_eq!(kept[RECENT - 1].seq, (RECENT + 10) as u64);
        assert_eq!(p.by_ordinal(10), None);
        assert_eq!(p.by_ordinal(11).unwrap().count, 10);
        assert!(p.counts_at(5).is_none(), "older than the kept window");
        assert_eq!(p.counts_at(20).unwrap().collectives, 20);
    }

    #[test]
    fn counts_at_an_ordinal_leave_out_later_operations() {
        let p = Progress::default();
        p.record(&task(CollKind::AllReduce, 4, 0), 0);
        p.record(&task(CollKind::Send, 4, 1), 0);
        p.record(&task(CollKind::AllReduce, 4, 0), 0);
        p.record(&task(CollKind::Recv, 4, 1), 0);
        let at2 = p.counts_at(2).unwrap();
        assert_eq!((at2.collectives, at2.p2p_with(1, true)), (1, 1));
        assert_eq!(at2.p2p_with(1, false), 0);
        let now = p.counts_at(4).unwrap();
        assert_eq!((now.collectives, now.p2p_with(1, false)), (2, 1));
        let at0 = p.counts_at(0).unwrap();
        assert_eq!((at0.collectives, at0.p2p_with(1, true)), (0, 0));
    }

    #[test]
    fn launched_and_completed_only_move_forward() {
        let p = Progress::default();
        p.record(&task(CollKind::AllReduce, 4, 0), 0);
        p.record(&task(CollKind::AllReduce, 4, 0), 0);
        p.mark_launched();
        assert_eq!(p.launched(), 2);
        p.set_completed(2);
        p.set_completed(1);
        assert_eq!(p.completed(), 2);
    }

    #[test]
    fn operations_in_the_check_count_as_handed_over_until_it_ends() {
        let p = Progress::default();
        p.record(&task(CollKind::AllReduce, 4, 0), 0);
        p.mark_launched();
        p.record(&task(CollKind::AllReduce, 4, 0), 0);
        assert_eq!(p.handed_over(), 1);
        p.set_checking(Some(2));
        assert!(p.in_check());
        assert_eq!((p.launched(), p.handed_over()), (1, 2));
        p.set_checking(None);
        assert!(!p.in_check());
        assert_eq!(p.handed_over(), 1);
        p.set_checking(Some(2));
        p.mark_launched();
        assert!(!p.in_check(), "launched: the check is over");
    }
}
