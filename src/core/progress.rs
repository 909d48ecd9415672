//! What a communicator was asked to do, in order. Every collective gets the next collective
//! number, every send the next number towards its peer and every receive the next number
//! from its peer; all ranks count alike, so one number names the same operation on every
//! rank (collective #57 here is collective #57 there; send #3 to rank 2 is rank 2's receive
//! #3 from here). The last [`RECENT`] operations are kept with what they were, for reports
//! that name the operation a rank waits in and the ranks behind it (issue #13).

use crate::abi::ncclDataType_t;
use crate::sched::redop::RedOp;
use crate::sched::{CollKind, Task};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};

/// Operations kept per communicator.
pub const RECENT: usize = 256;

/// One enqueued operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpRecord {
    /// The collective number, or for send/recv the number with `peer`.
    pub seq: u64,
    pub kind: CollKind,
    pub count: usize,
    pub dtype: ncclDataType_t,
    pub op: RedOp,
    /// Root (rooted collectives) or peer (send, recv); 0 otherwise.
    pub root: i32,
    pub stream: usize,
}

#[derive(Default)]
struct Log {
    collectives: u64,
    /// (peer, is a send) -> operations so far.
    p2p: HashMap<(i32, bool), u64>,
    recent: VecDeque<OpRecord>,
}

/// A communicator's numbering and recent history.
#[derive(Default)]
pub struct Progress {
    log: Mutex<Log>,
}

impl Progress {
    /// Number `task` (issued on `stream`) and remember it; returns its number.
    pub fn record(&self, task: &Task, stream: usize) -> u64 {
        let mut log = self.log.lock();
        let seq = match task.kind {
            CollKind::Send | CollKind::Recv => {
                let n = log
                    .p2p
                    .entry((task.root, task.kind == CollKind::Send))
                    .or_default();
                *n += 1;
                *n
            }
            _ => {
                log.collectives += 1;
                log.collectives
            }
        };
        if log.recent.len() == RECENT {
            log.recent.pop_front();
        }
        log.recent.push_back(OpRecord {
            seq,
            kind: task.kind,
            count: task.count,
            dtype: task.dtype,
            op: task.op,
            root: task.root,
            stream,
        });
        seq
    }

    /// Collectives enqueued so far.
    pub fn collectives(&self) -> u64 {
        self.log.lock().collectives
    }

    /// The kept operations, oldest first.
    pub fn recent(&self) -> Vec<OpRecord> {
        self.log.lock().recent.iter().copied().collect()
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
            (last.seq, last.kind, last.count, last.stream),
            (2, CollKind::AllGather, 0, 7)
        );
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
    }
}
