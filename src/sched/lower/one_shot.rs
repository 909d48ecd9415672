//! The one-shot all-reduce (small messages, LL only): every rank writes its whole input to
//! every peer over the one-shot rows of connections and folds all ranks' values in rank
//! order. Per channel, a `DirectAllReduce` item carries the connections of peer 0 (send to
//! rank+1, receive from rank-1), followed by a `Peer` item for each further peer k (send
//! to rank+1+k, receive from rank-1-k), all on the channel's CTA with the task's key, so they
//! stay together in the CTA's item list.

use super::{collective_key, Group, Lowering, Piece};
use crate::sched::device::WorkKind;
use crate::sched::plan::{direct_channel, split};
use crate::sched::proto::Proto;
use crate::sched::{ring, Task};

impl Lowering<'_> {
    /// The items of a one-shot all-reduce on `nch` channels, the `seq`-th collective.
    pub(super) fn one_shot_all_reduce(&mut self, task: &Task, seq: u64, nch: u32) {
        let count = task.count as u64;
        let gran = ring::element_granularity(task.dtype.size() as u64);
        let (rank, nranks) = (self.rank, self.nranks);
        for (c, (start, len)) in split(count, nch, gran).into_iter().enumerate() {
            if len == 0 {
                continue;
            }
            let row = direct_channel(self.nchannels, c as u32);
            for k in 0..nranks - 1 {
                let kind = if k == 0 {
                    WorkKind::DirectAllReduce
                } else {
                    WorkKind::Peer
                };
                let mut w = self.range_work(task, kind, start, len, count);
                w.flags |= Proto::Ll.flag();
                self.pieces.push(Piece {
                    group: Group::Chan(c as u32),
                    key: collective_key(seq),
                    work: w,
                    send: Some((row, (rank + 1 + k).rem_euclid(nranks))),
                    recv: Some((row, (rank - 1 - k).rem_euclid(nranks))),
                    max_cta: self.limits.max_channels,
                });
            }
        }
    }
}
