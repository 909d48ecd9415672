//! Local copies: the collectives of a one-rank communicator (nothing in place; out of place a
//! copy, and kernel items whenever a PreMulSum scales the data), and the sends to self of a
//! group paired in order with its receives from self. A one-rank group's lone copy stays a
//! `LocalCopy`, which the planner launches as the copy kernel or gives to the copy engine by
//! size; with more in the group, copies below `COPY_ENGINE_MIN_BYTES` become kernel items of the
//! group's one launch, as the small copies of a multi-rank group do, and larger ones run on the
//! copy engine beside it; copies of a group that depend on each other stay whole, in order.

use super::{collective_key, is_reduction, Group, Lowering, Piece};
use crate::error::{Error, Result};
use crate::sched::cost;
use crate::sched::device::{OxWork, WorkKind};
use crate::sched::plan::{split, LocalCopy};
use crate::sched::redop::RedOp;
use crate::sched::Task;

/// A copy of a one-rank group, held until the whole group is lowered.
pub(super) struct OneRankCopy {
    copy: LocalCopy,
    /// The task's most channels.
    max: u32,
    /// The ordering key of its items, but for the channel.
    key: (u8, u64, u64, u64, u64),
}

/// Whether some copy of `copies` touches what an earlier one writes, or writes what an
/// earlier one reads (the same copy twice writes the same bytes either way: not a dependence).
fn depend_on_each_other(copies: &[OneRankCopy]) -> bool {
    let span = |at: u64, bytes: u64| at..at.saturating_add(bytes);
    let meet =
        |a: std::ops::Range<u64>, b: std::ops::Range<u64>| a.start < b.end && b.start < a.end;
    copies.iter().enumerate().any(|(i, later)| {
        let (src, dst) = (later.copy.src, later.copy.dst);
        copies[..i]
            .iter()
            .filter(|e| e.copy != later.copy)
            .any(|earlier| {
                let wrote = span(earlier.copy.dst, earlier.copy.bytes);
                let read = span(earlier.copy.src, earlier.copy.bytes);
                meet(span(src, later.copy.bytes), wrote.clone())
                    || meet(span(dst, later.copy.bytes), wrote)
                    || meet(span(dst, later.copy.bytes), read)
            })
    })
}

/// Whether a one-rank task changes its data (PreMulSum scales it); every other op of one rank
/// (sum, prod, min, max, avg) returns the input unchanged, so a copy, or nothing in place.
pub fn one_rank_transform(task: &Task) -> bool {
    is_reduction(task.kind) && matches!(task.op, RedOp::PreMulSum(_))
}

/// A kernel copy item on ring channel `c` (no connections) of a task that may use up to
/// `max_cta` CTAs.
fn copy_piece(c: usize, key: (u8, u64, u64, u64, u64), work: OxWork, max_cta: u32) -> Piece {
    Piece {
        group: Group::Chan(c as u32),
        key,
        work,
        send: None,
        recv: None,
        max_cta,
    }
}

impl Lowering<'_> {
    /// A collective of a one-rank communicator, the `seq`-th of the group.
    pub(super) fn one_rank(&mut self, task: &Task, seq: u64) {
        let es = task.dtype.size() as u64;
        let count = task.count as u64;
        let bytes = count * es;
        let transform = one_rank_transform(task);
        if count == 0 || (task.sendbuff == task.recvbuff && !transform) {
            return;
        }
        let max = self.limits.max_channels;
        if !transform {
            self.one_rank_copies.push(OneRankCopy {
                copy: LocalCopy::new(task.recvbuff, task.sendbuff, bytes),
                max,
                key: collective_key(seq),
            });
            return;
        }
        let nch = cost::copy_channels(bytes, max);
        for (c, (start, len)) in split(count, nch, 16).into_iter().enumerate() {
            if len == 0 {
                continue;
            }
            let mut w = self.task_work(task, WorkKind::Copy);
            w.src = task.sendbuff + start * es;
            w.dst = task.recvbuff + start * es;
            w.count = len;
            self.pieces.push(copy_piece(c, collective_key(seq), w, max));
        }
    }

    /// Pair the group's sends to self with its receives from self, in order, into copies.
    pub(super) fn pair_self_copies(&mut self) -> Result<()> {
        let rank = self.rank;
        if self.self_sends.len() != self.self_recvs.len() {
            return Err(Error::invalid_usage(format!(
                "rank {rank}: {} send(s) to itself but {} receive(s) from itself in one group",
                self.self_sends.len(),
                self.self_recvs.len()
            )));
        }
        let sends = std::mem::take(&mut self.self_sends);
        let recvs = std::mem::take(&mut self.self_recvs);
        for (seq, ((src, sbytes, smax), (dst, rbytes, rmax))) in
            sends.into_iter().zip(recvs).enumerate()
        {
            if sbytes != rbytes {
                return Err(Error::invalid_usage(format!(
                    "rank {rank}: send to itself of {sbytes} bytes matched with a receive of {rbytes} bytes"
                )));
            }
            if sbytes != 0 && src != dst {
                self.self_copy(seq as u64, src, dst, sbytes, smax.min(rmax));
            }
        }
        Ok(())
    }

    /// The `seq`-th copy to self of a group: `bytes` from `src` to `dst`, on at most `max`
    /// channels.
    fn self_copy(&mut self, seq: u64, src: u64, dst: u64, bytes: u64, max: u32) {
        let rank = self.rank as u64;
        if self.nranks == 1 {
            self.one_rank_copies.push(OneRankCopy {
                copy: LocalCopy::new(dst, src, bytes),
                max,
                key: (1, 0, rank, seq, 0),
            });
            return;
        }
        if bytes >= cost::COPY_ENGINE_MIN_BYTES {
            self.copies.push(LocalCopy::new(dst, src, bytes));
            return;
        }
        let nch = cost::copy_channels(bytes, max);
        self.kernel_copy(src, dst, bytes, nch, max, |c| (1, 0, rank, seq, c as u64));
    }

    /// Place the one-rank copies of the group, every task lowered: a lone copy (nothing else
    /// in the group) as it is; otherwise small ones as kernel items, the rest beside them.
    /// Copies that read or write what an earlier one of the group writes (or write what it
    /// reads) stay whole copies run in the group's order, as NVIDIA's library, which copies at
    /// each call, orders them: kernel items on different CTAs would race.
    pub(super) fn place_one_rank_copies(&mut self) {
        let copies = std::mem::take(&mut self.one_rank_copies);
        let in_order = copies.len() == 1 || depend_on_each_other(&copies);
        if in_order && self.pieces.is_empty() {
            self.copies.extend(copies.iter().map(|c| c.copy));
            return;
        }
        for OneRankCopy { copy, max, key } in copies {
            if copy.bytes >= cost::COPY_ENGINE_MIN_BYTES {
                self.copies.push(copy);
                continue;
            }
            let nch = cost::one_rank_copy_channels(copy.bytes, max);
            self.kernel_copy(copy.src, copy.dst, copy.bytes, nch, max, |c| {
                (key.0, key.1, key.2, key.3, c as u64)
            });
        }
    }

    /// Kernel copy items of `bytes` from `src` to `dst` (type-agnostic, by bytes), split over
    /// `nch` channels of a task that may use up to `max` CTAs; `key(c)` is the ordering key of
    /// channel `c`'s item.
    fn kernel_copy(
        &mut self,
        src: u64,
        dst: u64,
        bytes: u64,
        nch: u32,
        max: u32,
        key: impl Fn(usize) -> (u8, u64, u64, u64, u64),
    ) {
        for (c, (start, len)) in split(bytes, nch, 512).into_iter().enumerate() {
            if len == 0 {
                continue;
            }
            let mut w = self.byte_work(WorkKind::Copy);
            w.src = src + start;
            w.dst = dst + start;
            w.count = len;
            self.pieces.push(copy_piece(c, key(c), w, max));
        }
    }
}
