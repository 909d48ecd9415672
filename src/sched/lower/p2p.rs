//! Point-to-point operations as items: an operation with another rank is split over up to
//! `cost::p2p_plan` P2P channels (a function of its kind, its bytes and, for a peer reached
//! over the network, the network's link, so both ends split alike), one `Send` or `Recv` item
//! per part, keyed by (round, source, sequence number of the operation between the two ranks,
//! part); operations with this rank itself are kept for `copy` to pair.

use super::to_p2p::P2pOp;
use super::{Group, Lowering, Piece};
use crate::sched::cost;
use crate::sched::device::WorkKind;
use crate::sched::plan::{p2p_channel, split_for, Dir};
use crate::sched::CollKind;

impl Lowering<'_> {
    /// Lower the P2P operations `ops` of a task of `kind`.
    pub(super) fn p2p_ops(&mut self, kind: CollKind, ops: Vec<P2pOp>) {
        for op in ops {
            if op.peer == self.rank {
                let own = (op.addr, op.bytes, self.limits.max_channels);
                match op.dir {
                    Dir::Send => self.self_sends.push(own),
                    Dir::Recv => self.self_recvs.push(own),
                }
                continue;
            }
            let seq = self.p2p_seq.entry((op.peer, op.dir)).or_insert(0);
            let this_seq = *seq;
            *seq += 1;
            if op.bytes != 0 {
                self.p2p_items(kind, &op, this_seq);
            }
        }
    }

    /// The items of the `seq`-th operation `op` between this rank and its peer.
    fn p2p_items(&mut self, kind: CollKind, op: &P2pOp, seq: u64) {
        let (src, dst) = match op.dir {
            Dir::Send => (self.rank, op.peer),
            Dir::Recv => (op.peer, self.rank),
        };
        let round = (dst - src).rem_euclid(self.nranks) as u64;
        let link = self.net.and_then(|n| n.link_to(op.peer));
        let max = self.limits.max_channels;
        let (proto, parts) = cost::p2p_plan(kind, op.bytes, max, link);
        let remote = link.is_some();
        let ranges = split_for(self.net.filter(|_| remote), op.bytes, parts, 512);
        for (j, (start, len)) in ranges.into_iter().enumerate() {
            if len == 0 {
                continue;
            }
            let ch = p2p_channel(self.nchannels, j as u32);
            let mut w = self.byte_work(match op.dir {
                Dir::Send => WorkKind::Send,
                Dir::Recv => WorkKind::Recv,
            });
            w.root = op.peer;
            w.flags |= proto.flag();
            w.count = len;
            match op.dir {
                Dir::Send => w.src = op.addr + start,
                Dir::Recv => w.dst = op.addr + start,
            }
            self.pieces.push(Piece {
                group: Group::P2p(j as u32, op.peer, op.dir),
                key: (1, round, src as u64, seq, j as u64),
                work: w,
                send: (op.dir == Dir::Send).then_some((ch, op.peer)),
                recv: (op.dir == Dir::Recv).then_some((ch, op.peer)),
                max_cta: max,
            });
        }
    }
}
