//! Self-correcting channel weights, the running part (`OXCCL_ADAPTIVE_WEIGHTS`, on by default,
//! on every rank; network devices weighted at init): a thread per communicator that every period
//! (`OXCCL_ADAPTIVE_PERIOD_MS`) allgathers each rank's measured per-device send rates over
//! the bootstrap (its own tag, beside the communicator's other bootstrap traffic), and the
//! `Schedule` that says which weights epoch each collective plans with.
//!
//! The protocol (docs/weights.md): at a round's start each rank fixes a *fence*, its highest
//! collective number given an epoch so far plus a margin (`sched::adaptive::fence_margin`),
//! and sends it with its samples. Until the round's outcome is known, a collective numbered
//! at most the fence plans with the current epoch at once; one beyond it waits for the
//! outcome (abort-aware; normally it is there long before). Every rank computes the same
//! outcome from the same reports and the rounds before: new speeds or none
//! (`sched::adaptive::Follower`) and, for new speeds, the first collective they
//! apply to, past every rank's fence (`switch_from`). So no rank has planned a collective the
//! switch covers with the old weights, and no rank waits on the exchange unless it outruns
//! its margin. A switch may start before an earlier one that no collective has reached yet
//! and then replaces it: a collective plans with the newest switch it reached. With the
//! weights adapting, a collective is given its epoch only once the launches ahead of it are
//! few (`Runtime::wait_for_launch_room`). Collective numbers are the communicator's
//! (`core::progress`), the same on every rank. Send/receive keep the weights agreed at init
//! (epoch 0): their order relative to collectives may differ between the two ends within a
//! group.
//!
//! A failed exchange (a peer gone) stops the thread with a warning; the weights then stay
//! as they are and nothing waits for an outcome.

use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use crate::sched::adaptive::{self as rule, Report, Sample};
use crate::transport::net::meter::NetMeter;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The bootstrap tag of the exchange's messages ("OXWEIGHT"; the transports' tags have zeros
/// in bits 33..48).
const TAG: u64 = 0x4f58_5745_4947_4854;
/// Collectives of at least this many bytes wait for launch room before they take their weights
/// epoch (`Runtime::wait_for_launch_room`), so that they split by the newest agreed weights;
/// smaller ones take the current epoch at once: their split moves too few bytes to be worth a
/// wait on the caller's path.
pub const PACED_BYTES: usize = 1 << 20;

/// Whether a collective of `count` elements of `elem_size` bytes waits for launch room.
pub fn paced(count: usize, elem_size: usize) -> bool {
    count.saturating_mul(elem_size) >= PACED_BYTES
}

/// Switches a schedule keeps (collectives are given their epoch when enqueued, soon before
/// they are planned).
const KEPT_SWITCHES: usize = 8;
/// How often a collective waiting for a round's outcome warns.
const WAIT_WARN: Duration = Duration::from_secs(30);

/// From collective number `from` on, the weights of epoch `epoch`: `speeds`, Mbit/s per
/// device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Switch {
    pub from: u64,
    pub epoch: u32,
    pub speeds: Vec<u32>,
}

#[derive(Default)]
struct State {
    /// The highest collective number given an epoch.
    highest: u64,
    /// While a round is open: this rank's fence.
    fence: Option<u64>,
    /// The latest switches, oldest first.
    switches: Vec<Switch>,
    /// The last switch's epoch (0 before any).
    last_epoch: u32,
    /// The exchange ended: no round will close.
    stopped: bool,
}

/// Which weights epoch each collective of a communicator plans with; inactive (always epoch
/// 0) unless the weights adapt.
#[derive(Clone, Default)]
pub struct Schedule(Arc<ScheduleInner>);

#[derive(Default)]
struct ScheduleInner {
    active: AtomicBool,
    state: Mutex<State>,
    changed: Condvar,
}

impl Schedule {
    /// From now on collectives are given epochs by the exchange's outcomes.
    pub fn activate(&self) {
        self.0.active.store(true, Ordering::Release);
    }

    /// The epoch collective number `seq` plans with. Waits only while a round is open and
    /// `seq` is beyond this rank's fence (until the round closes, or `abort`).
    pub fn epoch_for(&self, seq: u64, abort: &AtomicBool) -> Result<u32> {
        if !self.0.active.load(Ordering::Acquire) {
            return Ok(0);
        }
        let start = Instant::now();
        let mut next_warn = WAIT_WARN;
        let mut st = self.0.state.lock();
        st.highest = st.highest.max(seq);
        loop {
            match st.fence {
                Some(fence) if seq > fence && !st.stopped => {}
                _ => return Ok(epoch_of(&st.switches, seq)),
            }
            if abort.load(Ordering::Acquire) {
                return Err(Error::invalid_usage(
                    "communicator aborted while waiting for the channel weights' exchange",
                ));
            }
            if start.elapsed() > next_warn {
                crate::warn!(
                    "collective {seq} still waits for the channel weights' exchange after {} s: \
                     is a peer missing?",
                    start.elapsed().as_secs()
                );
                next_warn += WAIT_WARN;
            }
            self.0.changed.wait_for(&mut st, Duration::from_millis(10));
        }
    }

    /// Open a round: this rank's fence is the highest collective number given an epoch so
    /// far plus `margin`. Returns the fence.
    pub fn open_round(&self, margin: u64) -> u64 {
        let mut st = self.0.state.lock();
        let fence = st.highest + margin;
        st.fence = Some(fence);
        fence
    }

    /// The highest collective number given an epoch so far.
    pub fn highest(&self) -> u64 {
        self.0.state.lock().highest
    }

    /// The epoch a new switch gets.
    pub fn next_epoch(&self) -> u32 {
        self.0.state.lock().last_epoch + 1
    }

    /// Whether collectives are given epochs by the exchange's outcomes.
    pub fn is_active(&self) -> bool {
        self.0.active.load(Ordering::Acquire)
    }

    /// Close the open round with its outcome.
    pub fn close_round(&self, outcome: Option<Switch>) {
        let mut st = self.0.state.lock();
        if let Some(s) = outcome {
            st.last_epoch = s.epoch;
            if st.switches.len() == KEPT_SWITCHES {
                st.switches.remove(0);
            }
            st.switches.push(s);
        }
        st.fence = None;
        self.0.changed.notify_all();
    }

    /// The exchange ended: nothing waits for it any more.
    pub fn stop(&self) {
        let mut st = self.0.state.lock();
        st.stopped = true;
        st.fence = None;
        self.0.changed.notify_all();
    }

    /// The sum of the newest agreed switch's device speeds, Mbit/s (None before any).
    pub fn latest_total_mbps(&self) -> Option<u64> {
        let st = self.0.state.lock();
        st.switches
            .last()
            .map(|s| s.speeds.iter().map(|&v| u64::from(v)).sum())
    }

    /// The speeds of `epoch`, if still kept.
    pub fn speeds_of(&self, epoch: u32) -> Option<Vec<u32>> {
        let st = self.0.state.lock();
        st.switches
            .iter()
            .find(|s| s.epoch == epoch)
            .map(|s| s.speeds.clone())
    }
}

/// The epoch of collective `seq` under `switches` (oldest first): the latest switch whose
/// `from` it reached, else 0.
fn epoch_of(switches: &[Switch], seq: u64) -> u32 {
    switches
        .iter()
        .rev()
        .find(|s| seq >= s.from)
        .map_or(0, |s| s.epoch)
}

/// An allgather of the reports: this rank's bytes in, every rank's out, indexed by rank.
pub type Exchange<'a> = dyn FnMut(&[u8]) -> Result<Vec<Vec<u8>>> + 'a;

/// One rank's side of the rounds: its numbering, what it measured last, the speeds in use.
pub struct Rounds {
    round: u64,
    /// The speeds agreed at init, and those in use (the last outcome's).
    nominal: Vec<u32>,
    current: Vec<u32>,
    last_totals: Vec<Sample>,
    /// The recent rounds' agreed rates and the rule they go through (the same on every rank).
    follower: rule::Follower,
    last_highest: u64,
    last_at: Instant,
}

impl Rounds {
    pub fn new(nominal: Vec<u32>) -> Rounds {
        Rounds {
            round: 0,
            current: nominal.clone(),
            last_totals: vec![Sample::default(); nominal.len()],
            follower: rule::Follower::default(),
            nominal,
            last_highest: 0,
            last_at: Instant::now(),
        }
    }

    /// Run one round: `totals` are the meter's per-device totals now, `exchange` allgathers
    /// the reports (indexed by rank). Closes the round on `schedule` with its outcome, which
    /// it returns; on an error the schedule is stopped.
    pub fn run(
        &mut self,
        schedule: &Schedule,
        totals: Vec<Sample>,
        period: Duration,
        exchange: &mut Exchange<'_>,
    ) -> Result<Option<Switch>> {
        let outcome = self.agree(schedule, totals, period, exchange);
        match &outcome {
            Ok(switch) => schedule.close_round(switch.clone()),
            Err(_) => schedule.stop(),
        }
        outcome
    }

    fn agree(
        &mut self,
        schedule: &Schedule,
        totals: Vec<Sample>,
        period: Duration,
        exchange: &mut Exchange<'_>,
    ) -> Result<Option<Switch>> {
        self.round += 1;
        let samples: Vec<Sample> = (0..self.nominal.len())
            .map(|d| {
                let now = totals.get(d).copied().unwrap_or_default();
                now.since(&self.last_totals[d])
            })
            .collect();
        for (last, now) in self.last_totals.iter_mut().zip(&totals) {
            *last = *now;
        }
        let highest = schedule.highest();
        let pace = (highest - self.last_highest.min(highest)) as f64
            / self.last_at.elapsed().as_secs_f64().max(1e-3);
        self.last_highest = highest;
        self.last_at = Instant::now();
        let fence = schedule.open_round(rule::fence_margin(pace, period.as_secs_f64()));
        let mine = Report {
            round: self.round,
            fence,
            samples,
        };
        let reports = exchange(&mine.to_bytes())?
            .iter()
            .enumerate()
            .map(|(rank, b)| {
                Report::from_bytes(b)
                    .filter(|r| r.round == self.round && r.samples.len() == self.nominal.len())
                    .ok_or_else(|| {
                        Error::internal(format!(
                            "rank {rank} sent no weights report of round {} for {} devices",
                            self.round,
                            self.nominal.len()
                        ))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let rates = rule::agreed_rates(&reports, self.nominal.len());
        crate::trace!(
            NET,
            "channel weights round {}: agreed rates {:?} Mbit/s, speeds in use {:?}; this rank \
             received {:?} KiB in {:?} ms busy per device, collectives planned up to {highest}",
            self.round,
            rates,
            self.current,
            mine.samples
                .iter()
                .map(|s| s.bytes >> 10)
                .collect::<Vec<_>>(),
            mine.samples
                .iter()
                .map(|s| s.busy_ns / 1_000_000)
                .collect::<Vec<_>>(),
        );
        let Some(speeds) = self
            .follower
            .next_speeds(&self.current, &self.nominal, &rates)
        else {
            return Ok(None);
        };
        let epoch = schedule.next_epoch();
        self.current = speeds.clone();
        Ok(Some(Switch {
            from: rule::switch_from(&reports),
            epoch,
            speeds,
        }))
    }
}

/// Every rank's `mine`, indexed by rank, over the bootstrap's tagged messages (a ring; the
/// communicator's own bootstrap collectives use another numbering, so they never mix).
fn ring_allgather(b: &Bootstrap, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
    let (rank, n) = (b.rank(), b.nranks());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let mut out = vec![Vec::new(); n as usize];
    out[rank as usize] = mine.to_vec();
    for step in 0..n - 1 {
        let send_idx = (rank - step).rem_euclid(n) as usize;
        let recv_idx = (rank - step - 1).rem_euclid(n) as usize;
        b.send(next, TAG, &out[send_idx])?;
        out[recv_idx] = b.recv(prev, TAG)?;
    }
    Ok(out)
}

/// The exchange thread of one communicator; stopped and joined on drop.
pub struct Agent {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    schedule: Schedule,
}

/// What the exchange thread needs to know.
pub struct AgentSetup {
    pub rank: i32,
    /// The speeds agreed at init and the devices' names (for the INFO lines).
    pub nominal: Vec<u32>,
    pub names: Vec<String>,
    pub period: Duration,
    /// The communicator's abort flag (the thread ends when it is raised).
    pub comm_abort: Arc<AtomicBool>,
}

impl Agent {
    /// Start the exchange for a communicator whose bootstrap is `bootstrap`, measuring
    /// through `meter`, and activate `schedule`.
    pub fn start(
        setup: AgentSetup,
        bootstrap: &Bootstrap,
        meter: Arc<NetMeter>,
        schedule: Schedule,
    ) -> Result<Agent> {
        let stop = Arc::new(AtomicBool::new(false));
        let b = bootstrap.handle(stop.clone());
        let (s, flag) = (schedule.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(format!("oxccl-weights-r{}", setup.rank))
            .spawn(move || exchange_loop(setup, b, meter, s, flag))
            .map_err(|e| Error::system(format!("cannot start the weights thread: {e}")))?;
        schedule.activate();
        Ok(Agent {
            stop,
            thread: Some(thread),
            schedule,
        })
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.schedule.stop();
    }
}

fn exchange_loop(
    setup: AgentSetup,
    b: Bootstrap,
    meter: Arc<NetMeter>,
    schedule: Schedule,
    stop: Arc<AtomicBool>,
) {
    let mut rounds = Rounds::new(setup.nominal.clone());
    let ended = || stop.load(Ordering::Acquire) || setup.comm_abort.load(Ordering::Acquire);
    loop {
        let wake = Instant::now() + setup.period;
        while Instant::now() < wake {
            if ended() {
                schedule.stop();
                return;
            }
            std::thread::sleep(Duration::from_millis(5).min(setup.period));
        }
        let mut exchange = |mine: &[u8]| ring_allgather(&b, mine);
        match rounds.run(&schedule, meter.totals(), setup.period, &mut exchange) {
            Ok(Some(switch)) => log_switch(&setup, &switch),
            Ok(None) => {}
            Err(e) => {
                if !ended() {
                    crate::warn!(
                        "rank {}: the channel weights' exchange stopped ({}); the weights stay \
                         as they are",
                        setup.rank,
                        e.msg
                    );
                }
                return;
            }
        }
    }
}

/// Ranks one period between rounds allows for: a round's ring allgather takes one step per
/// rank, so a larger communicator spaces its rounds further apart. A function of the rank
/// count alone, so that every rank pauses alike and none waits in a round for another's pause.
pub const RANKS_PER_PERIOD: usize = 512;

/// The time between two rounds of a communicator of `nranks` ranks, from the configured
/// `period`.
pub fn round_period(period: Duration, nranks: usize) -> Duration {
    let periods = nranks.div_ceil(RANKS_PER_PERIOD).max(1);
    period.saturating_mul(u32::try_from(periods).unwrap_or(u32::MAX))
}

/// The INFO line of a switch: each device's new speed and share.
fn log_switch(setup: &AgentSetup, switch: &Switch) {
    let shares = rule::shares_of(&switch.speeds);
    let devices: Vec<String> = switch
        .speeds
        .iter()
        .zip(&shares)
        .enumerate()
        .map(|(d, (s, share))| {
            let name = setup.names.get(d).map_or("?", String::as_str);
            format!("dev {d} ({name}) {s} Mbit/s {}.{}%", share / 10, share % 10)
        })
        .collect();
    crate::info!(
        NET,
        "rank {}: channel weights now {} (epoch {}, from collective {}; measured, \
         OXCCL_ADAPTIVE_WEIGHTS=0: fixed)",
        setup.rank,
        devices.join(", "),
        switch.epoch,
        switch.from
    );
}

#[cfg(test)]
mod tests;
