//! The agreement protocol with threads as ranks: enqueuing threads racing each other and
//! the exchange, every rank must give every collective the same epoch.

use super::*;
use std::collections::HashMap;

/// An in-memory allgather among `n` threads: each call of a rank is one round.
struct Board {
    n: usize,
    slots: Mutex<HashMap<u64, Vec<Option<Vec<u8>>>>>,
    filled: Condvar,
}

impl Board {
    fn allgather(&self, rank: usize, call: u64, mine: &[u8]) -> Vec<Vec<u8>> {
        let mut slots = self.slots.lock();
        slots.entry(call).or_insert_with(|| vec![None; self.n])[rank] = Some(mine.to_vec());
        loop {
            let row = &slots[&call];
            if row.iter().all(Option::is_some) {
                return row.iter().map(|b| b.clone().unwrap()).collect();
            }
            self.filled.notify_all();
            self.filled.wait_for(&mut slots, Duration::from_millis(1));
        }
    }
}

/// Cumulative totals after `round` periods of 100 ms at `mbps` per device.
fn totals(per_round: &[Vec<u64>], round: usize) -> Vec<Sample> {
    let ndev = per_round[0].len();
    (0..ndev)
        .map(|d| {
            let bytes: u64 = per_round[..round].iter().map(|r| r[d] * 12_500).sum();
            Sample {
                bytes,
                busy_ns: round as u64 * 100_000_000,
            }
        })
        .collect()
}

#[test]
fn every_rank_gives_every_collective_the_same_epoch() {
    const RANKS: usize = 4;
    const COLLECTIVES: u64 = 4000;
    const ROUNDS: usize = 12;
    let board = Arc::new(Board {
        n: RANKS,
        slots: Mutex::new(HashMap::new()),
        filled: Condvar::new(),
    });
    // The fast device measured at a quarter of its speed: the weights move in steps.
    let per_round: Vec<Vec<u64>> = (0..ROUNDS).map(|_| vec![1000, 1000]).collect();
    let abort = AtomicBool::new(false);
    let results: Vec<(Vec<u32>, Vec<Switch>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..RANKS)
            .map(|rank| {
                let (board, per_round, abort) = (board.clone(), &per_round, &abort);
                s.spawn(move || {
                    let schedule = Schedule::default();
                    schedule.activate();
                    let agent = {
                        let schedule = schedule.clone();
                        s.spawn(move || {
                            let mut rounds = Rounds::new(vec![4000, 1000]);
                            let mut switches = Vec::new();
                            for round in 1..=ROUNDS {
                                // Ranks reach their rounds at different times.
                                std::thread::sleep(Duration::from_millis(2 + rank as u64));
                                let mut ex =
                                    |mine: &[u8]| Ok(board.allgather(rank, round as u64, mine));
                                let t = totals(per_round, round);
                                let out = rounds
                                    .run(&schedule, t, Duration::from_millis(2), &mut ex)
                                    .unwrap();
                                switches.extend(out);
                            }
                            schedule.stop();
                            switches
                        })
                    };
                    // Ranks enqueue at different paces, racing the rounds.
                    let epochs: Vec<u32> = (1..=COLLECTIVES)
                        .map(|seq| {
                            if seq % (50 + 30 * rank as u64) == 0 {
                                std::thread::sleep(Duration::from_micros(300));
                            }
                            schedule.epoch_for(seq, abort).unwrap()
                        })
                        .collect();
                    (epochs, agent.join().unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (epochs0, switches0) = &results[0];
    assert!(
        switches0.len() >= 2,
        "the weights should move in bounded steps: {switches0:?}"
    );
    for (rank, (epochs, switches)) in results.iter().enumerate() {
        assert_eq!(switches, switches0, "rank {rank} agreed on other switches");
        for (i, (a, b)) in epochs.iter().zip(epochs0).enumerate() {
            assert_eq!(
                a,
                b,
                "collective {} has epoch {a} on rank {rank}, {b} on rank 0",
                i + 1
            );
        }
        // Epochs never go back.
        assert!(epochs.windows(2).all(|w| w[0] <= w[1]));
    }
    // Switches are numbered in turn (a later one may start no later than an earlier one, which
    // it then replaces) and their speeds head for 1:1 in bounded steps.
    assert!(switches0.windows(2).all(|w| w[0].epoch + 1 == w[1].epoch));
    let last = &switches0.last().unwrap().speeds;
    assert!(last[0] < 4000 && last[1] >= 1000, "{last:?}");
}

#[test]
fn a_collective_past_its_fence_waits_for_the_outcome_and_abort_ends_the_wait() {
    let schedule = Schedule::default();
    schedule.activate();
    let abort = AtomicBool::new(false);
    assert_eq!(schedule.epoch_for(5, &abort).unwrap(), 0);
    let fence = schedule.open_round(10);
    assert_eq!(fence, 15);
    // Within the fence: at once, the current epoch.
    assert_eq!(schedule.epoch_for(15, &abort).unwrap(), 0);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| schedule.epoch_for(40, &abort));
        std::thread::sleep(Duration::from_millis(30));
        assert!(
            !waiter.is_finished(),
            "a collective beyond the fence must wait"
        );
        schedule.close_round(Some(Switch {
            from: 20,
            epoch: 1,
            speeds: vec![1, 2],
        }));
        assert_eq!(waiter.join().unwrap().unwrap(), 1);
    });
    assert_eq!(schedule.epoch_for(19, &abort).unwrap(), 0);
    assert_eq!(schedule.speeds_of(1), Some(vec![1, 2]));
    // An abort ends a wait with an error.
    schedule.open_round(1);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| schedule.epoch_for(1000, &abort));
        std::thread::sleep(Duration::from_millis(20));
        abort.store(true, Ordering::Release);
        assert!(waiter.join().unwrap().is_err());
    });
    // A stopped exchange lets everything through with what it has.
    abort.store(false, Ordering::Release);
    schedule.open_round(1);
    schedule.stop();
    assert_eq!(schedule.epoch_for(5000, &abort).unwrap(), 1);
    // Inactive: always epoch 0, never a wait.
    let idle = Schedule::default();
    idle.open_round(0);
    assert_eq!(idle.epoch_for(1 << 40, &abort).unwrap(), 0);
}

#[test]
fn a_report_of_another_round_is_an_error_and_stops_the_schedule() {
    let schedule = Schedule::default();
    schedule.activate();
    let mut rounds = Rounds::new(vec![4000, 1000]);
    let mut ex = |_: &[u8]| {
        Ok(vec![Report {
            round: 9,
            fence: 0,
            samples: vec![Sample::default(); 2],
        }
        .to_bytes()])
    };
    let e = rounds
        .run(
            &schedule,
            vec![Sample::default(); 2],
            Duration::from_millis(1),
            &mut ex,
        )
        .unwrap_err();
    assert!(e.msg.contains("round 1"), "{}", e.msg);
    schedule.open_round(1);
    // Stopped: nothing waits.
    assert_eq!(schedule.epoch_for(100, &AtomicBool::new(false)).unwrap(), 0);
}

#[test]
fn a_newer_switch_that_starts_earlier_replaces_the_older() {
    // Epoch 1 was agreed from collective 50; before any rank reached it, epoch 2 from 48.
    let s = |from, epoch| Switch {
        from,
        epoch,
        speeds: vec![1000, 1000],
    };
    let switches = [s(50, 1), s(48, 2)];
    assert_eq!(epoch_of(&switches, 47), 0);
    assert_eq!(epoch_of(&switches, 48), 2);
    assert_eq!(epoch_of(&switches, 60), 2);
    // A later switch from further on still takes over there.
    let switches = [s(50, 1), s(48, 2), s(70, 3)];
    assert_eq!(epoch_of(&switches, 69), 2);
    assert_eq!(epoch_of(&switches, 70), 3);
}

#[test]
fn only_collectives_of_a_mebibyte_or_more_wait_for_launch_room() {
    assert!(!paced(0, 4));
    assert!(!paced((PACED_BYTES / 4) - 1, 4));
    assert!(paced(PACED_BYTES / 4, 4));
    assert!(paced(PACED_BYTES, 1));
    // A count whose bytes overflow is large, not small.
    assert!(paced(usize::MAX, 8));
}

#[test]
fn larger_communicators_space_their_rounds_by_their_rank_count_alone() {
    let period = Duration::from_millis(200);
    assert_eq!(round_period(period, 2), period);
    assert_eq!(round_period(period, 512), period);
    assert_eq!(round_period(period, 513), 2 * period);
    assert_eq!(round_period(period, 8192), 16 * period);
}

/// Two ranks' bootstraps in this process.
fn two_bootstraps() -> Vec<Bootstrap> {
    use crate::bootstrap::{get_unique_id_with, BootstrapConfig};
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(20),
    };
    let id = get_unique_id_with(&cfg).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|r| {
                let cfg = &cfg;
                s.spawn(move || {
                    let abort = Arc::new(AtomicBool::new(false));
                    Bootstrap::init_with(&[id], r, 2, abort, cfg).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The real exchange threads of two ranks, the second started 600 ms after the first, and
/// collectives enqueued slowly on both (one every 150 ms, so that a fence lies at most a
/// collective ahead): once both run, no collective waits for a round as long as the start's
/// skew, because each rank pauses the same fixed time between rounds and the rounds stay
/// together. (Pauses that grew with a round's duration would feed on each other's waits and
/// hold collectives for seconds.)
#[test]
fn a_late_rank_does_not_make_the_rounds_wait_on_each_other() {
    let boots = two_bootstraps();
    let period = Duration::from_millis(100);
    let start = |rank: i32, b: &Bootstrap| {
        let schedule = Schedule::default();
        let setup = AgentSetup {
            rank,
            nominal: vec![4000, 1000],
            names: vec!["fast".into(), "slow".into()],
            period,
            comm_abort: Arc::new(AtomicBool::new(false)),
        };
        let agent = Agent::start(setup, b, NetMeter::new(2), schedule.clone()).unwrap();
        (agent, schedule)
    };
    let first = start(0, &boots[0]);
    std::thread::sleep(Duration::from_millis(600));
    let second = start(1, &boots[1]);
    let abort = AtomicBool::new(false);
    let longest = std::thread::scope(|s| {
        let waits: Vec<_> = [&first.1, &second.1]
            .into_iter()
            .map(|schedule| {
                let abort = &abort;
                s.spawn(move || {
                    let mut longest = Duration::ZERO;
                    for seq in 1..=20u64 {
                        std::thread::sleep(Duration::from_millis(150));
                        let t = Instant::now();
                        schedule.epoch_for(seq, abort).unwrap();
                        // The first second holds the start's skew.
                        if seq > 8 {
                            longest = longest.max(t.elapsed());
                        }
                    }
                    longest
                })
            })
            .collect();
        waits.into_iter().map(|h| h.join().unwrap()).max().unwrap()
    });
    drop((first, second));
    assert!(
        longest < Duration::from_millis(500),
        "a collective waited {longest:?} for a round"
    );
}
