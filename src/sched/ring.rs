//! Ring arithmetic shared by the planner and the simulator: the order of the ranks around
//! the ring (`RingOrder`), the neighbours of a position, how a range of elements is cut into
//! pieces, and the step schedule of every ring collective — which block a position sends,
//! receives, reduces or writes at step `s`. The kernels (`kernels/collectives.cuh`) follow the
//! same schedule; the simulator runs it against them.
//!
//! The schedule works on ring *positions* (an item's `rank` field): position p sends to
//! position p + 1. `RingOrder` says which rank stands at each position; it is rank order
//! (position = rank) unless the ranks of a host are not contiguous, when it groups them so
//! that a ring channel crosses each host boundary once.

use super::CollKind;
use std::collections::HashMap;

/// The order of the ranks around every ring channel: the rank at each position, and the
/// position of each rank. A communicator computes it once (`by_host`, from the allgathered
/// topology, so every rank computes the same order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingOrder {
    /// `ranks[p]`: the rank at position p.
    ranks: Vec<i32>,
    /// `positions[r]`: the position of rank r.
    positions: Vec<i32>,
    /// Whether position p is rank p for every p.
    identity: bool,
}

impl RingOrder {
    /// Rank order: position p is rank p.
    pub fn identity(nranks: i32) -> RingOrder {
        let ranks: Vec<i32> = (0..nranks.max(0)).collect();
        RingOrder {
            positions: ranks.clone(),
            ranks,
            identity: true,
        }
    }

    /// The ring order of `ranks` (the rank at each position), or None when it is not a
    /// permutation of `0..ranks.len()`.
    pub fn new(ranks: Vec<i32>) -> Option<RingOrder> {
        let n = ranks.len();
        let mut positions = vec![-1; n];
        for (p, &r) in ranks.iter().enumerate() {
            let slot = positions.get_mut(usize::try_from(r).ok()?)?;
            if *slot != -1 {
                return None;
            }
            *slot = p as i32;
        }
        let identity = ranks.iter().enumerate().all(|(p, &r)| p as i32 == r);
        Some(RingOrder {
            ranks,
            positions,
            identity,
        })
    }

    /// The order of a communicator whose rank r runs on host `host_of[r]`: the ranks of each
    /// host consecutive, in rank order, and the hosts in the order of their lowest rank (as
    /// NVIDIA's library connects its rings across nodes). Rank order exactly when every
    /// host's ranks are contiguous (one host included).
    pub fn by_host(host_of: &[u64]) -> RingOrder {
        let mut first: HashMap<u64, usize> = HashMap::new();
        for (r, &h) in host_of.iter().enumerate() {
            first.entry(h).or_insert(r);
        }
        let mut ranks: Vec<i32> = (0..host_of.len() as i32).collect();
        ranks.sort_by_key(|&r| (first[&host_of[r as usize]], r));
        RingOrder::new(ranks).expect("a sorted permutation")
    }

    pub fn nranks(&self) -> i32 {
        self.ranks.len() as i32
    }

    /// Whether this is rank order (position = rank).
    pub fn is_identity(&self) -> bool {
        self.identity
    }

    /// The rank at every position.
    pub fn ranks(&self) -> &[i32] {
        &self.ranks
    }

    /// The rank at position `pos` (taken modulo the ring's length).
    pub fn rank_at(&self, pos: i32) -> i32 {
        self.ranks[pos.rem_euclid(self.nranks()) as usize]
    }

    /// The position of `rank`.
    pub fn position_of(&self, rank: i32) -> i32 {
        self.positions[rank as usize]
    }

    /// The rank `rank` sends to on a ring channel.
    pub fn next_of(&self, rank: i32) -> i32 {
        self.rank_at(next(self.position_of(rank), self.nranks()))
    }

    /// The rank `rank` receives from on a ring channel.
    pub fn prev_of(&self, rank: i32) -> i32 {
        self.rank_at(prev(self.position_of(rank), self.nranks()))
    }
}

/// The position after `pos` on a ring of `nranks` positions.
pub fn next(pos: i32, nranks: i32) -> i32 {
    (pos + 1) % nranks
}

/// The position before `pos` on a ring of `nranks` positions.
pub fn prev(pos: i32, nranks: i32) -> i32 {
    (pos + nranks - 1) % nranks
}

/// Elements of one 16-byte unit, the granularity ring ranges are cut at.
pub fn element_granularity(elem_size: u64) -> u64 {
    (16 / elem_size).max(1)
}

/// Length of every part (but the last, which may be shorter or empty) when `total` is cut
/// into `parts` parts whose starts are multiples of `gran`.
pub fn part_len(total: u64, parts: u64, gran: u64) -> u64 {
    total.div_ceil(parts).div_ceil(gran) * gran
}

/// What a position does at one step of a ring collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingStep {
    /// Index of the block the step works on: all-reduce, of the piece; all-gather and
    /// reduce-scatter, the position whose rank's block it is (`RingOrder::rank_at`).
    pub block: u64,
    /// Reads the user's input (combined with what it receives, if it receives).
    pub input: bool,
    /// Receives the previous position's data.
    pub recv: bool,
    /// Sends the step's result to the next position.
    pub send: bool,
    /// Writes the step's result to the user's output.
    pub output: bool,
    /// Applies the op's post transform (the last reduction of a block).
    pub post: bool,
}

fn modn(a: i64, n: i64) -> u64 {
    a.rem_euclid(n) as u64
}

/// Ring all-reduce at position `rank` of `nranks`, 2(n-1) + 1 steps: reduce-scatter of the
/// pieces `rank-1, rank-2, ...` (the last one, the position's own piece, is complete and
/// written out), then all-gather of the completed pieces `rank-1-s` coming round.
pub fn all_reduce_steps(rank: i32, nranks: i32) -> Vec<RingStep> {
    let n = nranks as i64;
    let last = 2 * n - 2;
    (0..=last)
        .map(|s| RingStep {
            block: modn(rank as i64 - 1 - s, n),
            input: s < n,
            recv: s > 0,
            send: s < last,
            output: s >= n - 1,
            post: s == n - 1,
        })
        .collect()
}

/// Ring reduce-scatter at position `rank`: n steps over the blocks of positions `rank-1,
/// rank-2, ...`, ending at its own, which is written out.
pub fn reduce_scatter_steps(rank: i32, nranks: i32) -> Vec<RingStep> {
    let n = nranks as i64;
    (0..n)
        .map(|s| RingStep {
            block: modn(rank as i64 - 1 - s, n),
            input: true,
            recv: s > 0,
            send: s < n - 1,
            output: s == n - 1,
            post: s == n - 1,
        })
        .collect()
}

/// Ring all-gather at position `rank`: n steps over the blocks of positions `rank, rank-1,
/// ...`; the first sends its own block from the input (and writes it to the output when
/// `own_block` says so).
pub fn all_gather_steps(rank: i32, nranks: i32, own_block: bool) -> Vec<RingStep> {
    let n = nranks as i64;
    (0..n)
        .map(|s| RingStep {
            block: modn(rank as i64 - s, n),
            input: s == 0,
            recv: s > 0,
            send: s < n - 1,
            output: s > 0 || own_block,
            post: false,
        })
        .collect()
}

/// Place of ring position `rank` on the chain of a Broadcast (0 = the root) or a Reduce (the
/// root last) rooted at position `root`: the chain runs along the ring, position p -> p + 1.
pub fn chain_position(kind: CollKind, rank: i32, root: i32, nranks: i32) -> u64 {
    let shift = if kind == CollKind::Broadcast { 0 } else { 1 };
    modn(rank as i64 - root as i64 - shift, nranks as i64)
}

/// What ring position `rank` does at every step of a Broadcast or Reduce chain rooted at
/// position `root` (every step of the item alike; `block` is 0).
pub fn chain_step(kind: CollKind, rank: i32, root: i32, nranks: i32) -> RingStep {
    let pos = chain_position(kind, rank, root, nranks);
    let first = pos == 0;
    let last = pos == nranks as u64 - 1;
    let bcast = kind == CollKind::Broadcast;
    RingStep {
        block: 0,
        input: first || !bcast,
        recv: !first,
        send: !last,
        output: if bcast { true } else { last },
        post: !bcast && last,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_reduce_hands_each_block_on_to_the_next_rank() {
        for n in 2..=8 {
            for r in 0..n {
                let steps = all_reduce_steps(r, n);
                assert_eq!(steps.len(), 2 * n as usize - 1);
                let own = &steps[n as usize - 1];
                assert_eq!((own.block, own.post, own.output), (r as u64, true, true));
                assert_eq!(steps.last().unwrap().block, next(r, n) as u64);
                // What this rank sends at step s, the next rank receives at step s + 1.
                let nxt = all_reduce_steps(next(r, n), n);
                for s in 0..steps.len() - 1 {
                    assert_eq!(steps[s].block, nxt[s + 1].block, "n={n} r={r} s={s}");
                }
            }
        }
    }

    #[test]
    fn chains_start_at_the_root_and_end_at_it() {
        for n in 2..=5 {
            for root in 0..n {
                let b = chain_step(CollKind::Broadcast, root, root, n);
                assert!(b.send && !b.recv && b.input);
                let r = chain_step(CollKind::Reduce, root, root, n);
                assert!(r.recv && !r.send && r.post && r.output);
                assert_eq!(prev(next(root, n), n), root);
            }
        }
    }

    /// How many times one ring channel of `order` passes from one host to another.
    fn host_crossings(order: &RingOrder, host_of: &[u64]) -> usize {
        let n = order.nranks();
        (0..n)
            .filter(|&p| {
                host_of[order.rank_at(p) as usize] != host_of[order.rank_at(p + 1) as usize]
            })
            .count()
    }

    #[test]
    fn ring_order_is_rank_order_when_hosts_are_contiguous() {
        for n in 1..=9usize {
            assert!(
                RingOrder::by_host(&vec![7; n]).is_identity(),
                "one host, {n} ranks"
            );
            for per_host in 1..=n {
                let hosts: Vec<u64> = (0..n).map(|r| 100 + (r / per_host) as u64).collect();
                let order = RingOrder::by_host(&hosts);
                assert_eq!(order, RingOrder::identity(n as i32), "{hosts:?}");
            }
        }
        // Host ids need not grow with the ranks: contiguity is what counts.
        assert!(RingOrder::by_host(&[9, 9, 3, 3, 5]).is_identity());
        assert!(RingOrder::identity(0).is_identity());
    }

    #[test]
    fn interleaved_hosts_get_each_host_in_one_run() {
        // Rank r on host r % 2 (4 ranks), r % 3 and r % 2 (6 ranks).
        assert_eq!(RingOrder::by_host(&[0, 1, 0, 1]).ranks(), &[0, 2, 1, 3]);
        assert_eq!(
            RingOrder::by_host(&[0, 1, 2, 0, 1, 2]).ranks(),
            &[0, 3, 1, 4, 2, 5]
        );
        assert_eq!(
            RingOrder::by_host(&[0, 1, 0, 1, 0, 1]).ranks(),
            &[0, 2, 4, 1, 3, 5]
        );
        // Hosts in the order of their lowest rank, whatever their ids; uneven hosts.
        assert_eq!(
            RingOrder::by_host(&[5, 7, 7, 5, 2]).ranks(),
            &[0, 3, 1, 2, 4]
        );
        assert_eq!(
            RingOrder::by_host(&[1, 0, 0, 2, 1, 0]).ranks(),
            &[0, 4, 1, 2, 5, 3]
        );
        for hosts in [
            vec![0u64, 1, 0, 1],
            vec![0, 1, 2, 0, 1, 2],
            vec![5, 7, 7, 5, 2],
            vec![1, 0, 0, 2, 1, 0, 2, 2],
        ] {
            let order = RingOrder::by_host(&hosts);
            let nhosts = {
                let mut h = hosts.clone();
                h.sort();
                h.dedup();
                h.len()
            };
            // Rank order crosses at every hop here; the grouped ring once per host.
            assert_eq!(host_crossings(&order, &hosts), nhosts, "{hosts:?}");
            assert!(host_crossings(&RingOrder::identity(hosts.len() as i32), &hosts) > nhosts);
            // Position 0 is rank 0, and next/prev walk the order both ways.
            assert_eq!(order.rank_at(0), 0);
            for r in 0..order.nranks() {
                assert_eq!(order.rank_at(order.position_of(r)), r);
                assert_eq!(order.prev_of(order.next_of(r)), r);
                assert_eq!(
                    order.position_of(order.next_of(r)),
                    next(order.position_of(r), order.nranks())
                );
            }
        }
    }

    #[test]
    fn ring_orders_are_permutations() {
        assert!(RingOrder::new(vec![0, 2, 1, 3]).is_some());
        assert!(RingOrder::new(vec![0, 2, 2, 3]).is_none());
        assert!(RingOrder::new(vec![0, 4, 1, 3]).is_none());
        assert!(RingOrder::new(vec![0, -1]).is_none());
        assert_eq!(RingOrder::new(vec![]), Some(RingOrder::identity(0)));
        let o = RingOrder::new(vec![2, 0, 1]).unwrap();
        assert!(!o.is_identity());
        assert_eq!((o.rank_at(-1), o.rank_at(3)), (1, 2));
        assert_eq!((o.next_of(1), o.prev_of(2)), (2, 1));
    }
}
