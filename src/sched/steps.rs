//! How many steps the kernels consume on each receive connection of a launch, as
//! `kernels/collectives.cuh` sequences them: what a network receiving side may post receives
//! for (`transport::net::proxy`), so that no receive is left posted once the kernels are done.
//! Pure arithmetic on the items; `sim.rs` checks it against the steps its mirror of the
//! kernels actually takes.

use super::device::{ll_step_bytes, simple_step_bytes, OxConn, OxWork, WorkKind, FLAG_LL};
use super::{ring, CollKind};
use crate::abi::ncclDataType_t;

/// Steps an item consumes on its receive connection (`w.recv`): one per step of its
/// schedule that receives. Send and Copy items receive nothing.
pub fn recv_steps(w: &OxWork) -> u64 {
    let n = w.nranks;
    let pieces = |per: u64| if per == 0 { 0 } else { w.count.div_ceil(per) };
    let receiving = |steps: &[ring::RingStep]| steps.iter().filter(|s| s.recv).count() as u64;
    match w.kind {
        k if k == WorkKind::RingAllReduce as u32 => {
            pieces(n as u64 * w.chunk) * receiving(&ring::all_reduce_steps(w.rank, n))
        }
        k if k == WorkKind::RingAllGather as u32 || k == WorkKind::RingReduceScatter as u32 => {
            // Every position but the first of either schedule receives.
            pieces(w.chunk) * (n as u64).saturating_sub(1)
        }
        k if k == WorkKind::RingBroadcast as u32 || k == WorkKind::RingReduce as u32 => {
            let coll = match k == WorkKind::RingBroadcast as u32 {
                true => CollKind::Broadcast,
                false => CollKind::Reduce,
            };
            pieces(w.chunk) * ring::chain_step(coll, w.rank, w.root, n).recv as u64
        }
        // One LL step of the send row's payload bytes at a time, from each peer of the fan.
        k if k == WorkKind::DirectAllReduce as u32 || k == WorkKind::Peer as u32 => {
            let per = ll_step_bytes(w.send.slot_bytes) as u64;
            (w.count * elem_bytes(w)).div_ceil(per.max(1))
        }
        k if k == WorkKind::Recv as u32 => {
            let per = match w.flags & FLAG_LL != 0 {
                true => ll_step_bytes(w.recv.slot_bytes),
                false => simple_step_bytes(w.recv.slot_bytes),
            };
            pieces(per as u64)
        }
        _ => 0,
    }
}

/// Bytes of one element of the item's data type (1 for a code the kernels do not know).
fn elem_bytes(w: &OxWork) -> u64 {
    ncclDataType_t::ALL
        .get(w.dtype as usize)
        .map_or(1, |t| t.size() as u64)
}

/// The steps `items` (one launch) consume on each of their receive connections, summed per
/// connection (by its `tail`, which no two receive connections share), in first-use order;
/// connections nothing is received on are left out.
pub fn recv_steps_per_connection(items: &[OxWork]) -> Vec<(OxConn, u64)> {
    let mut out: Vec<(OxConn, u64)> = Vec::new();
    for w in items {
        let steps = recv_steps(w);
        if steps == 0 {
            continue;
        }
        match out.iter_mut().find(|(c, _)| c.tail == w.recv.tail) {
            Some((_, total)) => *total += steps,
            None => out.push((w.recv, steps)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::device::{FLAG_LL, WORK_SIZE};

    fn item(kind: WorkKind, count: u64, chunk: u64, rank: i32, nranks: i32) -> OxWork {
        let mut w = OxWork::new(kind);
        w.count = count;
        w.chunk = chunk;
        w.rank = rank;
        w.nranks = nranks;
        w.dtype = crate::sched::device::dtype::FLOAT;
        w.send.slot_bytes = 65536;
        w.recv.slot_bytes = 65536;
        w.recv.tail = 0x1000;
        w
    }

    #[test]
    fn ring_items_receive_at_every_step_but_the_first_of_each_round() {
        // 4 ranks, 10 elements, chunk 2: ceil(10 / 8) = 2 rounds of 2(n-1) receiving steps.
        assert_eq!(recv_steps(&item(WorkKind::RingAllReduce, 10, 2, 1, 4)), 12);
        assert_eq!(recv_steps(&item(WorkKind::RingAllGather, 5, 2, 0, 4)), 9);
        assert_eq!(
            recv_steps(&item(WorkKind::RingReduceScatter, 4, 2, 3, 4)),
            6
        );
        assert_eq!(recv_steps(&item(WorkKind::RingAllReduce, 0, 2, 1, 4)), 0);
    }

    #[test]
    fn chains_receive_everywhere_but_at_their_start() {
        let mut w = item(WorkKind::RingBroadcast, 7, 3, 2, 4);
        w.root = 2;
        assert_eq!(recv_steps(&w), 0, "the root of a broadcast only sends");
        w.root = 1;
        assert_eq!(recv_steps(&w), 3);
        let mut r = item(WorkKind::RingReduce, 7, 3, 2, 4);
        r.root = 1;
        assert_eq!(recv_steps(&r), 0, "the first of a reduce chain only sends");
        r.root = 2;
        assert_eq!(recv_steps(&r), 3);
    }

    #[test]
    fn p2p_and_one_shot_items_count_slot_sized_steps() {
        let simple = simple_step_bytes(65536) as u64;
        assert_eq!(recv_steps(&item(WorkKind::Recv, simple, 0, 0, 2)), 1);
        assert_eq!(recv_steps(&item(WorkKind::Recv, simple + 1, 0, 0, 2)), 2);
        let mut ll = item(WorkKind::Recv, 4097, 0, 0, 2);
        ll.flags |= FLAG_LL;
        assert_eq!(
            recv_steps(&ll),
            4097u64.div_ceil(ll_step_bytes(65536) as u64)
        );
        assert_eq!(recv_steps(&item(WorkKind::Send, 1 << 20, 0, 0, 2)), 0);
        // 4 KiB of LL payload per step: 1025 floats take two.
        assert_eq!(
            recv_steps(&item(WorkKind::DirectAllReduce, 1025, 0, 0, 3)),
            2
        );
        assert_eq!(recv_steps(&item(WorkKind::Peer, 1024, 0, 0, 3)), 1);
        assert_eq!(recv_steps(&item(WorkKind::Copy, 1024, 0, 0, 1)), 0);
    }

    #[test]
    fn steps_are_summed_per_receive_connection() {
        let a = item(WorkKind::Recv, 1, 0, 0, 2);
        let mut b = a;
        b.recv.tail = 0x2000;
        let send = item(WorkKind::Send, 1, 0, 0, 2);
        let got = recv_steps_per_connection(&[a, send, b, a]);
        let tails: Vec<(u64, u64)> = got.iter().map(|(c, n)| (c.tail, *n)).collect();
        assert_eq!(tails, vec![(0x1000, 2), (0x2000, 1)]);
        assert_eq!(WORK_SIZE, std::mem::size_of::<OxWork>());
    }
}
