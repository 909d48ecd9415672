//! Ring collectives (all-reduce, all-gather, reduce-scatter, and the broadcast and reduce
//! chains along the ring): one item per ring channel, each on a contiguous range of the
//! task's elements, sending to the next rank of the communicator's ring order and receiving
//! from the previous one. The items carry ring positions (`rank`, and the root's for the
//! chains); an all-gather or reduce-scatter on a ring not in rank order also carries the ring
//! table (`FLAG_RING_ORDER`), since its blocks are ranks'. The cost model picks the protocol
//! and the channels (or the one-shot path for a small all-reduce), for the network's link
//! when the communicator uses the network; a tuner plugin, when loaded, has the last word
//! (`tune`).

use super::{collective_key, Group, Lowering, Piece};
use crate::error::{Error, Result};
use crate::sched::cost::{self, AllReducePlan, Limits, Protocols};
use crate::sched::device::{OxWork, WorkKind, FLAG_OWN_BLOCK, FLAG_RING_ORDER};
use crate::sched::plan::{split_for, LocalCopy, NetView};
use crate::sched::proto::Proto;
use crate::sched::tune::{self, Tuner};
use crate::sched::{ring, CollKind, Task};

/// The work item kind of a ring collective.
fn ring_kind(kind: CollKind) -> WorkKind {
    match kind {
        CollKind::AllReduce => WorkKind::RingAllReduce,
        CollKind::AllGather => WorkKind::RingAllGather,
        CollKind::ReduceScatter => WorkKind::RingReduceScatter,
        CollKind::Broadcast => WorkKind::RingBroadcast,
        _ => WorkKind::RingReduce,
    }
}

impl Lowering<'_> {
    /// A ring collective, the `seq`-th collective of the group.
    pub(super) fn ring(&mut self, task: &Task, seq: u64) -> Result<()> {
        if task.count == 0 {
            return Ok(());
        }
        let rooted = matches!(task.kind, CollKind::Broadcast | CollKind::Reduce);
        if rooted && !(0..self.nranks).contains(&task.root) {
            return Err(Error::invalid_argument(format!(
                "root {} out of range",
                task.root
            )));
        }
        let own_flag = self.own_all_gather_block(task);
        let bytes = task.count as u64 * task.dtype.size() as u64;
        // The task's weights epoch (`weights::Routes::at_epoch`).
        let view = self
            .net
            .map(|n| n.at_epoch(task.weights_epoch))
            .transpose()?;
        let net = view.as_deref();
        let lim = &self.limits;
        if let Some(tuner) = self.tuner {
            let (proto, nch) = self.tuned(tuner, task.kind, bytes, net)?;
            self.ring_items(task, seq, proto, nch, own_flag, net);
            return Ok(());
        }
        let (proto, nch) = if let Some(net) = net {
            cost::ring_plan_net_routed(
                task.kind,
                bytes,
                self.nranks,
                lim,
                &|c| net.link_for(c),
                net.channel_cap(),
            )
        } else if task.kind == CollKind::AllReduce {
            match cost::allreduce_plan_in(bytes, self.nranks, lim) {
                AllReducePlan::Ring { proto, nch } => (proto, nch),
                AllReducePlan::Direct { nch } => {
                    self.one_shot_all_reduce(task, seq, nch);
                    return Ok(());
                }
            }
        } else {
            cost::ring_plan_in(task.kind, bytes, self.nranks, lim)
        };
        self.ring_items(task, seq, proto, nch, own_flag, net);
        Ok(())
    }

    /// The protocol and channels of a ring collective of `bytes` per rank block as `tuner`
    /// prefers among what the planner offers (`tune::ring_choice`), else the planner's own.
    fn tuned(
        &self,
        tuner: &dyn Tuner,
        kind: CollKind,
        bytes: u64,
        net: Option<&NetView>,
    ) -> Result<(Proto, u32)> {
        let nranks = self.nranks;
        let plan_in = |lim: &Limits| match net {
            Some(net) => cost::ring_plan_net_routed(
                kind,
                bytes,
                nranks,
                lim,
                &|c| net.link_for(c),
                net.channel_cap(),
            ),
            None => cost::ring_plan_in(kind, bytes, nranks, lim),
        };
        let best = |proto: Proto| {
            let only = Limits {
                protocols: Protocols::only(proto),
                ..self.limits
            };
            let (_, nch) = plan_in(&only);
            let time = match net {
                Some(net) => {
                    cost::ring_time_net_us(proto, kind, bytes, nranks, nch, net.link_for(nch))
                }
                None => cost::ring_time_proto_us(proto, kind, bytes, nranks, nch),
            };
            (nch, time)
        };
        let query = tune::Query {
            func: tune::func_of(kind),
            bytes: tune::nccl_bytes(kind, bytes, nranks),
        };
        Ok(tune::ring_choice(tuner, &query, &self.limits, &best)?
            .unwrap_or_else(|| plan_in(&self.limits)))
    }

    /// This rank's own all-gather block: in place already, or a copy-engine copy beside the
    /// ring when large, or written by the ring's first step (the returned flag).
    fn own_all_gather_block(&mut self, task: &Task) -> u32 {
        if task.kind != CollKind::AllGather {
            return 0;
        }
        let bytes = task.count as u64 * task.dtype.size() as u64;
        let own = task.recvbuff + self.rank as u64 * bytes;
        if task.sendbuff == own {
            return 0;
        }
        if bytes < cost::COPY_ENGINE_MIN_BYTES {
            return FLAG_OWN_BLOCK;
        }
        self.copies.push(LocalCopy::new(own, task.sendbuff, bytes));
        0
    }

    /// One item per ring channel `c < nch`, each on its range of the task's elements.
    fn ring_items(
        &mut self,
        task: &Task,
        seq: u64,
        proto: Proto,
        nch: u32,
        extra_flags: u32,
        net: Option<&NetView>,
    ) {
        let count = task.count as u64;
        let gran = ring::element_granularity(task.dtype.size() as u64);
        let next = self.ring.next_of(self.rank);
        let prev = self.ring.prev_of(self.rank);
        for (c, (start, len)) in split_for(net, count, nch, gran).into_iter().enumerate() {
            if len == 0 {
                continue;
            }
            let mut w = self.range_work(task, ring_kind(task.kind), start, len, count);
            w.flags |= extra_flags | proto.flag();
            self.place_on_ring(&mut w, task);
            self.pieces.push(Piece {
                group: Group::Chan(c as u32),
                key: collective_key(seq),
                work: w,
                send: Some((c as u32, next)),
                recv: Some((c as u32, prev)),
                max_cta: self.limits.max_channels,
            });
        }
    }

    /// Ring positions for an item of `task` on this rank: its own and, for the chains, the
    /// root's; an all-gather or reduce-scatter block at a position is that position's rank's,
    /// so on a ring not in rank order the item addresses the ring table (`FLAG_RING_ORDER`).
    /// In rank order the item is left as it is (positions are ranks).
    fn place_on_ring(&self, w: &mut OxWork, task: &Task) {
        if self.ring.is_identity() {
            return;
        }
        w.rank = self.ring.position_of(self.rank);
        if matches!(task.kind, CollKind::Broadcast | CollKind::Reduce) {
            w.root = self.ring.position_of(task.root);
        }
        if matches!(task.kind, CollKind::AllGather | CollKind::ReduceScatter) {
            let es = task.dtype.size() as u64;
            w.src += w.offset * es;
            w.dst += w.offset * es;
            w.offset = self.ring_table;
            w.flags |= FLAG_RING_ORDER;
        }
    }
}
