//! A tuner's say in the plan (NVIDIA's tuner plugins, `NCCL_TUNER_PLUGIN`): for each ring
//! collective the planner fills NVIDIA's cost table — modelled µs per algorithm and protocol,
//! `IGNORE` where a pair is not offered — lets the tuner change it and the channel count, and
//! takes the cheapest pair it can run. oxccl runs rings with LL or Simple, so those two are
//! the entries it offers (others stay `IGNORE`, and a tuner's preference for one it does not
//! offer is passed over); a tuner that ignores both leaves the planner's own choice. With a
//! tuner the small all-reduce follows the table too (the one-shot path is not in NVIDIA's
//! table). The plugin behind [`Tuner`] is `crate::plugin::tuner`; this side is safe Rust.

use super::cost::Limits;
use super::proto::Proto;
use super::CollKind;
use crate::error::Result;

/// NVIDIA's algorithm rows of the table (`NCCL_ALGO_*`).
pub const NUM_ALGORITHMS: usize = 7;
pub const ALGO_TREE: usize = 0;
pub const ALGO_RING: usize = 1;
/// NVIDIA's protocol columns (`NCCL_PROTO_*`).
pub const NUM_PROTOCOLS: usize = 3;
pub const PROTO_LL: usize = 0;
pub const PROTO_LL128: usize = 1;
pub const PROTO_SIMPLE: usize = 2;
/// A pair that is not offered (`NCCL_ALGO_PROTO_IGNORE`).
pub const IGNORE: f32 = -1.0;

/// NVIDIA's cost table: µs per (algorithm, protocol).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostTable(pub [[f32; NUM_PROTOCOLS]; NUM_ALGORITHMS]);

impl CostTable {
    /// Nothing offered.
    pub fn ignored() -> CostTable {
        CostTable([[IGNORE; NUM_PROTOCOLS]; NUM_ALGORITHMS])
    }
}

/// What a tuner is asked about one collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query {
    /// NVIDIA's `ncclFunc_t` of the collective.
    pub func: i32,
    /// NVIDIA's `nBytes`: the larger of the bytes a rank sends and receives.
    pub bytes: u64,
}

/// A tuner of one communicator.
pub trait Tuner: Send + Sync + std::fmt::Debug {
    /// Change `table` as the tuner prefers; the channels it asks for, 0 for the planner's.
    fn tune(&self, query: &Query, table: &mut CostTable) -> Result<u32>;
}

/// NVIDIA's `ncclFunc_t` for a ring collective.
pub fn func_of(kind: CollKind) -> i32 {
    match kind {
        CollKind::Broadcast => 0,
        CollKind::Reduce => 1,
        CollKind::AllGather => 2,
        CollKind::ReduceScatter => 3,
        _ => 4,
    }
}

/// NVIDIA's `nBytes` of a collective whose per-rank block is `bytes`: all-gather and
/// reduce-scatter move `nranks` blocks on one side.
pub fn nccl_bytes(kind: CollKind, bytes: u64, nranks: i32) -> u64 {
    match kind {
        CollKind::AllGather | CollKind::ReduceScatter => bytes * nranks.max(1) as u64,
        _ => bytes,
    }
}

/// The protocols `lim` allows, each with the planner's channels and modelled µs for it
/// (`best(proto)`), asked of `tuner`: the protocol and channels to use. None where the tuner
/// ignored every protocol offered (the caller keeps its own choice).
pub fn ring_choice(
    tuner: &dyn Tuner,
    query: &Query,
    lim: &Limits,
    best: &dyn Fn(Proto) -> (u32, f64),
) -> Result<Option<(Proto, u32)>> {
    let mut table = CostTable::ignored();
    let offered: Vec<(Proto, usize, u32)> = [(Proto::Ll, PROTO_LL), (Proto::Simple, PROTO_SIMPLE)]
        .into_iter()
        .filter(|&(proto, _)| lim.protocols.allows(proto))
        .map(|(proto, col)| (proto, col, best(proto)))
        .map(|(proto, col, (nch, time))| {
            table.0[ALGO_RING][col] = time as f32;
            (proto, col, nch)
        })
        .collect();
    let asked = tuner.tune(query, &mut table)?;
    let chosen = offered
        .iter()
        .filter(|&&(_, col, _)| table.0[ALGO_RING][col] >= 0.0)
        .min_by(|a, b| table.0[ALGO_RING][a.1].total_cmp(&table.0[ALGO_RING][b.1]));
    Ok(chosen.map(|&(proto, _, nch)| {
        let nch = if asked > 0 {
            asked.min(lim.max_channels.max(1))
        } else {
            nch
        };
        (proto, nch)
    }))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::sched::cost::{Algorithms, Protocols};
    use parking_lot::Mutex;

    /// A tuner in Rust: sets `pick` to 0, `ignore` to IGNORE, asks for `channels`, and
    /// remembers every query and table it got.
    #[derive(Debug, Default)]
    pub(crate) struct Scripted {
        pub pick: Option<(usize, usize)>,
        pub ignore: Vec<(usize, usize)>,
        pub channels: u32,
        pub seen: Mutex<Vec<(Query, CostTable)>>,
    }

    impl Tuner for Scripted {
        fn tune(&self, query: &Query, table: &mut CostTable) -> Result<u32> {
            self.seen.lock().push((*query, *table));
            for &(a, p) in &self.ignore {
                table.0[a][p] = IGNORE;
            }
            if let Some((a, p)) = self.pick {
                if table.0[a][p] != IGNORE {
                    table.0[a][p] = 0.0;
                }
            }
            Ok(self.channels)
        }
    }

    fn limits(ll: bool, simple: bool) -> Limits {
        Limits {
            min_channels: 1,
            max_channels: 16,
            protocols: Protocols { simple, ll },
            algorithms: Algorithms { one_shot: true },
        }
    }

    fn best(proto: Proto) -> (u32, f64) {
        match proto {
            Proto::Ll => (2, 10.0),
            Proto::Simple => (8, 20.0),
        }
    }

    const Q: Query = Query {
        func: 4,
        bytes: 4096,
    };

    #[test]
    fn the_table_offers_the_ring_protocols_at_their_modelled_times() {
        let t = Scripted::default();
        let got = ring_choice(&t, &Q, &limits(true, true), &best).unwrap();
        assert_eq!(got, Some((Proto::Ll, 2)), "the cheaper one, untouched");
        let (q, table) = t.seen.lock()[0];
        assert_eq!(q, Q);
        assert_eq!(table.0[ALGO_RING], [10.0, IGNORE, 20.0]);
        assert_eq!(table.0[ALGO_TREE], [IGNORE; 3]);
        let t = Scripted::default();
        ring_choice(&t, &Q, &limits(false, true), &best).unwrap();
        assert_eq!(t.seen.lock()[0].1 .0[ALGO_RING], [IGNORE, IGNORE, 20.0]);
    }

    #[test]
    fn the_tuner_picks_the_protocol_and_the_channels() {
        let t = Scripted {
            pick: Some((ALGO_RING, PROTO_SIMPLE)),
            channels: 3,
            ..Default::default()
        };
        let got = ring_choice(&t, &Q, &limits(true, true), &best).unwrap();
        assert_eq!(got, Some((Proto::Simple, 3)));
        let many = Scripted {
            channels: 99,
            ..Default::default()
        };
        let got = ring_choice(&many, &Q, &limits(true, true), &best).unwrap();
        assert_eq!(got, Some((Proto::Ll, 16)), "at most the task's channels");
    }

    #[test]
    fn a_pair_not_offered_or_all_ignored_leaves_the_planner_to_choose() {
        let tree = Scripted {
            pick: Some((ALGO_TREE, PROTO_LL)),
            ..Default::default()
        };
        let got = ring_choice(&tree, &Q, &limits(true, true), &best).unwrap();
        assert_eq!(got, Some((Proto::Ll, 2)));
        let none = Scripted {
            ignore: vec![(ALGO_RING, PROTO_LL), (ALGO_RING, PROTO_SIMPLE)],
            ..Default::default()
        };
        assert_eq!(
            ring_choice(&none, &Q, &limits(true, true), &best).unwrap(),
            None
        );
    }

    #[test]
    fn nvidias_function_numbers_and_bytes() {
        assert_eq!(func_of(CollKind::AllReduce), 4);
        assert_eq!(func_of(CollKind::AllGather), 2);
        assert_eq!(nccl_bytes(CollKind::AllGather, 100, 4), 400);
        assert_eq!(nccl_bytes(CollKind::ReduceScatter, 100, 4), 400);
        assert_eq!(nccl_bytes(CollKind::AllReduce, 100, 4), 100);
    }
}
