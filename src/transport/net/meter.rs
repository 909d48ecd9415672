//! What each network device of a communicator does: the bytes its receives brought and the
//! time they took, and the time its sends waited on it; counted by the proxy thread as it
//! posts and completes requests, and read at any time by the channel weights' exchange
//! (`core::adaptive`, `sched::adaptive` for how the figures are used).
//!
//! Receives: the time between consecutive completions while receives stay posted on the
//! device (a busy period); a busy period's first completion only starts the clock and its
//! bytes are not counted. So the wait for a peer that has not started sending is not the
//! link's time, and while data keeps arriving, bytes over time is what the link delivers.
//! Sends: the time with at least one send posted and not done (overlapping sends count
//! once; an open interval counts up to the moment it is read). A send waits while the
//! network cannot take more: over a link that holds the bytes back it waits most of the time.
//! Only the proxy thread writes; the counters are relaxed atomics, so the per-message cost is
//! a clock read and a few uncontended atomic operations.

use crate::sched::adaptive::Sample;
use crate::sched::Dir;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// `Device::rx_last_ns` when no completion of the current busy period has been seen.
const NONE: u64 = u64::MAX;

/// One device's counters.
struct Device {
    /// Bytes of the receive completions counted (every one but a busy period's first).
    rx_bytes: AtomicU64,
    /// Time between counted receive completions and the completion before each, ns.
    rx_busy_ns: AtomicU64,
    /// Receives posted and not done.
    rx_active: AtomicU32,
    /// The last receive completion of the current busy period (ns since the meter's start),
    /// or `NONE`.
    rx_last_ns: AtomicU64,
    /// Send busy time of the intervals that ended, ns.
    tx_busy_ns: AtomicU64,
    /// Sends posted and not done.
    tx_active: AtomicU32,
    /// When the current send busy interval began (ns since the meter's start), while active.
    tx_since_ns: AtomicU64,
}

impl Default for Device {
    fn default() -> Device {
        Device {
            rx_bytes: AtomicU64::new(0),
            rx_busy_ns: AtomicU64::new(0),
            rx_active: AtomicU32::new(0),
            rx_last_ns: AtomicU64::new(NONE),
            tx_busy_ns: AtomicU64::new(0),
            tx_active: AtomicU32::new(0),
            tx_since_ns: AtomicU64::new(0),
        }
    }
}

/// Per-device counters of one communicator.
pub struct NetMeter {
    start: Instant,
    devices: Vec<Device>,
}

impl NetMeter {
    /// Counters for `ndev` devices (requests on other devices are not counted).
    pub fn new(ndev: usize) -> Arc<NetMeter> {
        Arc::new(NetMeter {
            start: Instant::now(),
            devices: (0..ndev).map(|_| Device::default()).collect(),
        })
    }

    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// The handle a side on device `dev` counts through.
    pub fn device(self: &Arc<Self>, dev: i32) -> DeviceMeter {
        DeviceMeter {
            meter: self.clone(),
            dev: dev.max(0) as usize,
        }
    }

    /// Every device's totals so far.
    pub fn totals(&self) -> Vec<Sample> {
        let now = self.now_ns();
        self.devices
            .iter()
            .map(|d| {
                let open = match d.tx_active.load(Ordering::Relaxed) {
                    0 => 0,
                    _ => now.saturating_sub(d.tx_since_ns.load(Ordering::Relaxed)),
                };
                Sample {
                    bytes: d.rx_bytes.load(Ordering::Relaxed),
                    busy_ns: d.rx_busy_ns.load(Ordering::Relaxed),
                    send_busy_ns: d.tx_busy_ns.load(Ordering::Relaxed) + open,
                }
            })
            .collect()
    }
}

/// A side's way into its device's counters.
#[derive(Clone)]
pub struct DeviceMeter {
    meter: Arc<NetMeter>,
    dev: usize,
}

impl DeviceMeter {
    fn counters(&self) -> Option<&Device> {
        self.meter.devices.get(self.dev)
    }

    /// A request in direction `dir` was posted.
    pub fn posted(&self, dir: Dir) {
        let Some(d) = self.counters() else { return };
        match dir {
            Dir::Recv => {
                if d.rx_active.fetch_add(1, Ordering::Relaxed) == 0 {
                    d.rx_last_ns.store(NONE, Ordering::Relaxed);
                }
            }
            Dir::Send => {
                if d.tx_active.load(Ordering::Relaxed) == 0 {
                    d.tx_since_ns.store(self.meter.now_ns(), Ordering::Relaxed);
                }
                d.tx_active.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A request in direction `dir` of `bytes` completed (or was dropped with its
    /// connection: `bytes` 0).
    pub fn done(&self, dir: Dir, bytes: usize) {
        let Some(d) = self.counters() else { return };
        match dir {
            Dir::Recv => {
                if d.rx_active.load(Ordering::Relaxed) == 0 {
                    return;
                }
                let now = self.meter.now_ns();
                let last = d.rx_last_ns.swap(now, Ordering::Relaxed);
                if last != NONE && bytes > 0 {
                    d.rx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                    d.rx_busy_ns
                        .fetch_add(now.saturating_sub(last), Ordering::Relaxed);
                }
                if d.rx_active.fetch_sub(1, Ordering::Relaxed) == 1 {
                    d.rx_last_ns.store(NONE, Ordering::Relaxed);
                }
            }
            Dir::Send => {
                if d.tx_active.load(Ordering::Relaxed) == 0 {
                    return;
                }
                if d.tx_active.fetch_sub(1, Ordering::Relaxed) == 1 {
                    let busy = self
                        .meter
                        .now_ns()
                        .saturating_sub(d.tx_since_ns.load(Ordering::Relaxed));
                    d.tx_busy_ns.fetch_add(busy, Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_receive_busy_period_counts_from_its_first_completion() {
        let m = NetMeter::new(2);
        let (a, b) = (m.device(0), m.device(1));
        a.posted(Dir::Recv);
        a.posted(Dir::Recv);
        a.posted(Dir::Recv);
        // The wait before the first completion is not the link's.
        std::thread::sleep(Duration::from_millis(30));
        a.done(Dir::Recv, 1000);
        assert_eq!(
            m.totals()[0],
            Sample::default(),
            "the first completion starts the clock"
        );
        std::thread::sleep(Duration::from_millis(20));
        a.done(Dir::Recv, 3000);
        let t = m.totals();
        assert_eq!(t[0].bytes, 3000);
        assert!(
            t[0].busy_ns >= 20_000_000 && t[0].busy_ns < 30_000_000,
            "{t:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
        a.done(Dir::Recv, 5000);
        let t = m.totals();
        assert_eq!(t[0].bytes, 8000);
        assert!(
            t[0].busy_ns >= 30_000_000 && t[0].busy_ns < 40_000_000,
            "{t:?}"
        );
        // Idle (nothing posted): the gap until the next period is not counted, nor is that
        // period's first completion.
        std::thread::sleep(Duration::from_millis(20));
        a.posted(Dir::Recv);
        a.done(Dir::Recv, 7000);
        assert_eq!(m.totals()[0], t[0]);
        assert_eq!(t[1], Sample::default());
        // A completion without a post, and a dropped one, count nothing.
        b.done(Dir::Recv, 9);
        b.posted(Dir::Recv);
        b.posted(Dir::Recv);
        b.done(Dir::Recv, 10);
        b.done(Dir::Recv, 0);
        assert_eq!(m.totals()[1].bytes, 0);
        // A device beyond the meter's is not counted.
        let c = m.device(5);
        c.posted(Dir::Recv);
        c.done(Dir::Recv, 9);
        c.done(Dir::Recv, 9);
        assert_eq!(m.totals().len(), 2);
    }

    #[test]
    fn send_busy_time_counts_overlapping_sends_once_and_open_intervals_up_to_now() {
        let m = NetMeter::new(1);
        let a = m.device(0);
        a.posted(Dir::Send);
        a.posted(Dir::Send);
        std::thread::sleep(Duration::from_millis(20));
        a.done(Dir::Send, 1000);
        let open = m.totals()[0];
        assert!(open.send_busy_ns >= 20_000_000, "{open:?}");
        assert_eq!(open.bytes, 0, "sends bring no received bytes");
        std::thread::sleep(Duration::from_millis(20));
        a.done(Dir::Send, 3000);
        let t = m.totals()[0];
        assert!(t.send_busy_ns >= 40_000_000 && t.send_busy_ns < 1_000_000_000);
        // Idle now: the total stays.
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(m.totals()[0], t);
        // A completion without a post counts nothing.
        a.done(Dir::Send, 5);
        assert_eq!(m.totals()[0], t);
    }
}
