//! Self-correcting channel weights, the pure part: what a rank reports of its network devices
//! (per device, the rate its receives arrived at while data kept coming, and how long its
//! sends waited on the device), how every rank turns all reports into the same next device
//! speeds (bounded steps, a floor per device, hysteresis), and from which collective the new
//! speeds apply.
//!
//! A device whose sends waited on it for most of a period is *saturated*: the link is what
//! holds its bytes back, so the rate they arrived at is what it carries, and its speed moves
//! to that rate. A device that is not saturated while another is had room to spare: its
//! speed steps up (never beyond the speed agreed at init), so the bytes move to it. Its own
//! rate says little (its receives also wait for the peer's kernel and for collectives
//! queued behind the saturated device) and is not used. With no device saturated the network
//! does not set the pace, and the weights stay. `core::adaptive` runs the exchange; the
//! speeds replace the agreed ones in `weights::Routes` (same channel→device routes, new
//! shares of the bytes).
//!
//! Everything here is a function of integers every rank holds alike after the exchange, so
//! every rank computes the same speeds and the same switch point.

/// Most a device's speed moves in one update, in percent of its current speed.
pub const MAX_STEP_PCT: u64 = 25;
/// A device is saturated when some rank's sends waited on it for at least this share of a
/// period, in percent.
pub const SATURATED_PCT: u64 = 50;
/// Least share of the bytes a device keeps, in percent (so a device that recovers carries
/// traffic and is measured again); lower when there are more than 10 devices.
pub const FLOOR_PCT: u64 = 5;
/// Smallest change of any device's share, in permille, that is worth a switch: smaller
/// changes are noise and leave the weights as they are.
pub const HYSTERESIS_PERMILLE: u64 = 20;
/// A device's sample says something only with at least this many bytes and this much busy
/// time.
pub const MIN_SAMPLE_BYTES: u64 = 256 << 10;
pub const MIN_SAMPLE_NS: u64 = 1_000_000;

/// What one rank's network device did over one period (`transport::net::meter`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// Bytes its receives brought while data kept arriving.
    pub bytes: u64,
    /// The time they took, in ns.
    pub busy_ns: u64,
    /// Time with at least one send on the device posted and not done, in ns.
    pub send_busy_ns: u64,
}

impl Sample {
    /// The rate data arrived at on the device while it kept coming, Mbit/s; None with too
    /// little traffic.
    pub fn rate_mbps(&self) -> Option<u64> {
        if self.bytes < MIN_SAMPLE_BYTES || self.busy_ns < MIN_SAMPLE_NS {
            return None;
        }
        let mbps = self.bytes as u128 * 8000 / self.busy_ns as u128;
        Some(mbps.min(u32::MAX as u128) as u64)
    }

    /// The sample of the period from `earlier` (cumulative totals) to `self`.
    pub fn since(&self, earlier: &Sample) -> Sample {
        Sample {
            bytes: self.bytes.saturating_sub(earlier.bytes),
            busy_ns: self.busy_ns.saturating_sub(earlier.busy_ns),
            send_busy_ns: self.send_busy_ns.saturating_sub(earlier.send_busy_ns),
        }
    }
}

/// A serialised report: round, fence, period, device count; then each device's sample.
const HEADER_BYTES: usize = 28;
const SAMPLE_BYTES: usize = 24;

/// One rank's contribution to an exchange round.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The round (every rank numbers its rounds alike, from 1).
    pub round: u64,
    /// The highest collective number this rank plans with the current weights without
    /// waiting for the round's outcome.
    pub fence: u64,
    /// How long the period the samples cover lasted, ns.
    pub period_ns: u64,
    /// Per device, this rank's sends over the last period.
    pub samples: Vec<Sample>,
}

impl Report {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_BYTES + SAMPLE_BYTES * self.samples.len());
        b.extend_from_slice(&self.round.to_le_bytes());
        b.extend_from_slice(&self.fence.to_le_bytes());
        b.extend_from_slice(&self.period_ns.to_le_bytes());
        b.extend_from_slice(&(self.samples.len() as u32).to_le_bytes());
        for s in &self.samples {
            b.extend_from_slice(&s.bytes.to_le_bytes());
            b.extend_from_slice(&s.busy_ns.to_le_bytes());
            b.extend_from_slice(&s.send_busy_ns.to_le_bytes());
        }
        b
    }

    /// The report in `b` (`to_bytes`), or None when it is not one.
    pub fn from_bytes(b: &[u8]) -> Option<Report> {
        let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
        let n = u32::from_le_bytes(b.get(24..HEADER_BYTES)?.try_into().ok()?) as usize;
        if n > super::weights::MAX_DEVICES || b.len() != HEADER_BYTES + SAMPLE_BYTES * n {
            return None;
        }
        let samples = (0..n)
            .map(|d| {
                let at = HEADER_BYTES + SAMPLE_BYTES * d;
                Some(Sample {
                    bytes: u64_at(at)?,
                    busy_ns: u64_at(at + 8)?,
                    send_busy_ns: u64_at(at + 16)?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Report {
            round: u64_at(0)?,
            fence: u64_at(8)?,
            period_ns: u64_at(16)?,
            samples,
        })
    }
}

/// What all ranks' reports say of one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Agreed {
    /// The rate data arrived at, the least any rank measured (the slowest end sets the pace of
    /// the channels on the device); None where no rank received enough to say.
    pub rate: Option<u64>,
    /// Some rank's sends waited on the device for at least `SATURATED_PCT` of its period.
    pub saturated: bool,
}

/// Per device, what every rank's reports agree on.
pub fn agree_devices(reports: &[Report], ndev: usize) -> Vec<Agreed> {
    (0..ndev)
        .map(|d| Agreed {
            rate: reports
                .iter()
                .filter_map(|r| r.samples.get(d)?.rate_mbps())
                .min(),
            saturated: reports.iter().any(|r| {
                r.samples.get(d).is_some_and(|s| {
                    r.period_ns > 0
                        && s.send_busy_ns as u128 * 100
                            >= SATURATED_PCT as u128 * r.period_ns as u128
                })
            }),
        })
        .collect()
}

/// The first collective number the outcome of a round applies to: past every rank's fence
/// (no rank has planned a collective beyond its fence without the outcome) and past the
/// previous switch (`previous`, 0 for none), so switches keep their order.
pub fn switch_from(previous: u64, reports: &[Report]) -> u64 {
    let fence = reports.iter().map(|r| r.fence).max().unwrap_or(0);
    fence.max(previous) + 1
}

/// The next speeds (Mbit/s) of the devices, or None when the weights stay as they are.
/// `current`: the speeds in use; `nominal`: those agreed at init, which no speed exceeds;
/// `agreed`: what the reports say of each device (`agree_devices`). A saturated device's
/// target is its rate; a device that is not saturated, while another is, targets more than
/// it has (the bytes move to it); with none saturated nothing changes. Each speed moves
/// towards its target by at most `MAX_STEP_PCT`, every device keeps at least its floor
/// share, and a change of less than `HYSTERESIS_PERMILLE` in every share is no change.
pub fn next_speeds(current: &[u32], nominal: &[u32], agreed: &[Agreed]) -> Option<Vec<u32>> {
    let n = current.len();
    if n < 2 || nominal.len() != n || agreed.len() != n || !agreed.iter().any(|a| a.saturated) {
        return None;
    }
    let stepped: Vec<u64> = (0..n)
        .map(|d| {
            let cur = current[d].max(1) as u64;
            let top = nominal[d].max(1) as u64;
            let lo = (cur * (100 - MAX_STEP_PCT) / 100).max(1);
            let hi = (cur * (100 + MAX_STEP_PCT)).div_ceil(100);
            let target = match agreed[d] {
                Agreed {
                    saturated: true,
                    rate: Some(r),
                } => r,
                Agreed {
                    saturated: true,
                    rate: None,
                } => cur,
                Agreed {
                    saturated: false, ..
                } => hi,
            };
            // lo <= cur <= top: the step never leaves the nominal speed behind.
            target.min(top).max(1).clamp(lo, hi)
        })
        .collect();
    let next = with_floor(stepped);
    let before = shares_permille(&current.iter().map(|&s| s as u64).collect::<Vec<_>>());
    let after = shares_permille(&next);
    let moved = before
        .iter()
        .zip(&after)
        .any(|(&a, &b)| a.abs_diff(b) >= HYSTERESIS_PERMILLE);
    moved.then(|| {
        next.into_iter()
            .map(|s| s.min(u32::MAX as u64) as u32)
            .collect()
    })
}

/// Raise every speed to at least the floor share of the total (`FLOOR_PCT`, at most half an
/// even share).
fn with_floor(mut speeds: Vec<u64>) -> Vec<u64> {
    let n = speeds.len() as u64;
    // floor = num / den of the total.
    let (num, den) = if FLOOR_PCT * 2 * n <= 100 {
        (FLOOR_PCT, 100)
    } else {
        (1, 2 * n)
    };
    for _ in 0..8 {
        let total: u64 = speeds.iter().sum();
        let mut raised = false;
        for s in speeds.iter_mut() {
            let others = total - *s;
            // s / (others + s) >= num / den  <=>  s >= others * num / (den - num).
            let least = (others * num).div_ceil(den - num);
            if *s < least {
                *s = least;
                raised = true;
            }
        }
        if !raised {
            break;
        }
    }
    speeds
}

/// Each speed's share of the total, in permille.
pub fn shares_permille(speeds: &[u64]) -> Vec<u64> {
    let total: u64 = speeds.iter().sum::<u64>().max(1);
    speeds.iter().map(|&s| s * 1000 / total).collect()
}

/// Collectives a rank may plan beyond its count at a round's start before it must know the
/// round's outcome: what it plans in two periods at its recent pace, and at least 16, so
/// that the outcome is normally there first and no call waits for it.
pub fn fence_margin(collectives_per_s: f64, period_s: f64) -> u64 {
    let ahead = collectives_per_s.max(0.0) * 2.0 * period_s;
    16 + ahead.min(1e12) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 100 ms of data arriving at `mbps`; sends never waiting.
    fn sample(mbps: u64) -> Sample {
        Sample {
            bytes: mbps * 100_000 / 8,
            busy_ns: 100_000_000,
            send_busy_ns: 0,
        }
    }

    const SAT: fn(u64) -> Agreed = |r| Agreed {
        rate: Some(r),
        saturated: true,
    };
    const FREE: Agreed = Agreed {
        rate: None,
        saturated: false,
    };

    fn report(samples: Vec<Sample>) -> Report {
        Report {
            round: 1,
            fence: 0,
            period_ns: 200_000_000,
            samples,
        }
    }

    #[test]
    fn reports_round_trip_and_bad_bytes_are_refused() {
        let r = Report {
            round: 7,
            fence: 1234,
            period_ns: 5,
            samples: vec![sample(4000), Sample::default()],
        };
        assert_eq!(Report::from_bytes(&r.to_bytes()), Some(r.clone()));
        let b = r.to_bytes();
        assert_eq!(Report::from_bytes(&b[..b.len() - 1]), None);
        assert_eq!(Report::from_bytes(&[]), None);
    }

    #[test]
    fn the_slowest_rank_sets_the_rate_and_any_waiting_sender_saturates() {
        assert_eq!(sample(4000).rate_mbps(), Some(4000));
        assert_eq!(Sample::default().rate_mbps(), None);
        let waited = |mbps, pct: u64| Sample {
            send_busy_ns: 2_000_000 * pct,
            ..sample(mbps)
        };
        let agreed = agree_devices(
            &[
                report(vec![waited(4000, 10), waited(1000, 60), Sample::default()]),
                report(vec![waited(3000, 49), sample(1200), Sample::default()]),
            ],
            3,
        );
        assert_eq!(
            agreed,
            vec![
                Agreed {
                    rate: Some(3000),
                    saturated: false
                },
                SAT(1000),
                FREE
            ]
        );
    }

    /// Apply `next_speeds` with what `say` gives for the speeds in use until nothing changes;
    /// every step bounded. Returns the speeds and the number of updates.
    fn settle(
        mut cur: Vec<u32>,
        nominal: &[u32],
        say: impl Fn(&[u32]) -> Vec<Agreed>,
    ) -> (Vec<u32>, usize) {
        let mut updates = 0;
        while let Some(next) = next_speeds(&cur, nominal, &say(&cur)) {
            for d in 0..cur.len() {
                let (a, b) = (cur[d] as f64, next[d] as f64);
                assert!(
                    b >= a * 0.75 - 1.0 && b <= a * 1.25 + 1.0,
                    "{cur:?} -> {next:?}"
                );
                assert!(next[d] <= nominal[d], "{next:?} above {nominal:?}");
            }
            cur = next;
            updates += 1;
            assert!(updates < 20, "no convergence: {cur:?}");
        }
        (cur, updates)
    }

    /// Two links of capacity `caps` under speeds `cur`: the one whose share takes longer is
    /// saturated and measures its capacity; the other is free.
    fn two_links(caps: [u64; 2]) -> impl Fn(&[u32]) -> Vec<Agreed> {
        move |cur: &[u32]| {
            let total = (cur[0] + cur[1]) as f64;
            let t: Vec<f64> = (0..2)
                .map(|d| cur[d] as f64 / total / caps[d] as f64)
                .collect();
            let slow = if t[0] >= t[1] { 0 } else { 1 };
            let near = (t[0] - t[1]).abs() < 0.05 * t[0].max(t[1]);
            (0..2)
                .map(|d| {
                    if d == slow || near {
                        SAT(caps[d])
                    } else {
                        FREE
                    }
                })
                .collect()
        }
    }

    #[test]
    fn a_cut_link_loses_its_bytes_and_wins_them_back_when_it_recovers() {
        let nominal = [4000, 1000];
        // The fast link cut to a quarter.
        let (cur, updates) = settle(vec![4000, 1000], &nominal, two_links([1000, 1000]));
        let shares = shares_permille(&[cur[0] as u64, cur[1] as u64]);
        assert!(shares[0].abs_diff(500) <= 60, "{cur:?}");
        assert!(
            (3..=8).contains(&updates),
            "bounded steps: {updates} updates"
        );
        // Restored: the free fast link steps up until it is saturated again.
        let (cur, back) = settle(cur, &nominal, two_links([4000, 1000]));
        let shares = shares_permille(&[cur[0] as u64, cur[1] as u64]);
        assert!(shares[0].abs_diff(800) <= 30, "{cur:?}");
        assert!(back <= 8, "{back} updates to recover");
    }

    #[test]
    fn noise_or_no_saturated_device_changes_nothing() {
        let nominal = [4000, 1000];
        let cur = [4000u32, 1000];
        assert_eq!(next_speeds(&cur, &nominal, &[SAT(3900), SAT(1000)]), None);
        assert_eq!(next_speeds(&cur, &nominal, &[SAT(4000), SAT(980)]), None);
        // Free devices at their nominal speed have nowhere to go.
        assert_eq!(next_speeds(&cur, &nominal, &[SAT(4000), FREE]), None);
        // Nothing saturated: the network does not set the pace, whatever the rates say.
        let slow_rates = Agreed {
            rate: Some(10),
            saturated: false,
        };
        assert_eq!(next_speeds(&cur, &nominal, &[slow_rates, slow_rates]), None);
        assert_eq!(next_speeds(&cur, &nominal, &[FREE, FREE]), None);
        // One device: nothing to weigh.
        assert_eq!(next_speeds(&[1000], &[1000], &[SAT(10)]), None);
    }

    #[test]
    fn every_device_keeps_its_floor() {
        let nominal = [10_000, 10_000, 10_000];
        let mut cur = vec![10_000u32, 10_000, 10_000];
        for _ in 0..40 {
            match next_speeds(&cur, &nominal, &[SAT(10_000), SAT(1), SAT(10_000)]) {
                Some(n) => cur = n,
                None => break,
            }
        }
        let shares = shares_permille(&cur.iter().map(|&s| s as u64).collect::<Vec<_>>());
        assert!(shares[1] >= FLOOR_PCT * 10 - 1, "{shares:?}");
        // It stops near the floor: the last step would change less than the hysteresis.
        assert!(
            shares[1] < FLOOR_PCT * 10 + 2 * HYSTERESIS_PERMILLE,
            "{shares:?}"
        );
        // Many devices: the floor shrinks to half an even share.
        let many = with_floor(vec![1; 30].into_iter().chain([1_000_000]).collect());
        let shares = shares_permille(&many);
        assert!(
            shares[..30].iter().all(|&s| s * 31 * 2 >= 1000 - 31),
            "{shares:?}"
        );
    }

    #[test]
    fn the_same_inputs_give_the_same_outputs() {
        let say = [SAT(1003), FREE];
        let a = next_speeds(&[3000, 1250], &[4000, 1250], &say);
        assert!(a.is_some());
        for _ in 0..100 {
            assert_eq!(next_speeds(&[3000, 1250], &[4000, 1250], &say), a);
        }
    }

    #[test]
    fn the_switch_lies_past_every_fence_and_the_previous_switch() {
        let r = |fence| Report {
            round: 3,
            fence,
            period_ns: 1,
            samples: vec![],
        };
        assert_eq!(switch_from(0, &[r(10), r(40), r(25)]), 41);
        assert_eq!(switch_from(100, &[r(10), r(40)]), 101);
        assert!(fence_margin(0.0, 0.2) >= 16);
        assert_eq!(fence_margin(10_000.0, 0.2), 16 + 4000);
    }
}
