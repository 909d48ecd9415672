//! What each network device of a communicator delivers: the bytes its receives brought and
//! the time they took, counted by the proxy thread, and read at any time by the channel
//! weights' exchange (`core::adaptive`).
//!
//! A device is busy while one of its receiving sides is in a launch: from receiving the first
//! step of a launch until receiving that launch's last step (`proxy::Announced` knows where
//! each launch's steps end). Receives are posted a launch ahead, so posting does not count: a
//! side that finished its share and waits for the next launch's data (while the other links
//! finish theirs) would keep the period open and charge the link for the wait. Within a busy
//! period the time between consecutive completions counts; the period's first completion
//! only starts the clock and its bytes are not counted. So neither the wait for the peer to start sending (host skew, its kernel, the
//! collectives queued before) nor the time a device that finished its share waits for the
//! next collective counts as the link's: while data keeps arriving, bytes over time is what
//! the link delivers. Only the proxy thread writes; the counters are relaxed atomics, so
//! the per-message cost is a clock read and a few uncontended atomic operations.

use crate::sched::adaptive::Sample;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// `Device::last_ns` when no completion of the current busy period has been seen.
const NONE: u64 = u64::MAX;

/// One device's counters.
struct Device {
    /// Bytes of the completions counted (every one but a busy period's first).
    bytes: AtomicU64,
    /// Time between counted completions and the completion before each, ns.
    busy_ns: AtomicU64,
    /// Receiving sides in a launch.
    in_launch: AtomicU32,
    /// The last completion of the current busy period (ns since the meter's start), or `NONE`.
    last_ns: AtomicU64,
}

impl Default for Device {
    fn default() -> Device {
        Device {
            bytes: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            in_launch: AtomicU32::new(0),
            last_ns: AtomicU64::new(NONE),
        }
    }
}

/// Per-device receive counters of one communicator.
pub struct NetMeter {
    start: Instant,
    devices: Vec<Device>,
}

impl NetMeter {
    /// Counters for `ndev` devices (receives on other devices are not counted).
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
        self.devices
            .iter()
            .map(|d| Sample {
                bytes: d.bytes.load(Ordering::Relaxed),
                busy_ns: d.busy_ns.load(Ordering::Relaxed),
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

    /// The side received the first step of a launch (called before that step's `received`).
    pub fn launch_started(&self) {
        let Some(d) = self.counters() else { return };
        if d.in_launch.fetch_add(1, Ordering::Relaxed) == 0 {
            d.last_ns.store(NONE, Ordering::Relaxed);
        }
    }

    /// A receive of `bytes` completed.
    pub fn received(&self, bytes: usize) {
        let Some(d) = self.counters() else { return };
        if d.in_launch.load(Ordering::Relaxed) == 0 {
            return;
        }
        let now = self.meter.now_ns();
        let last = d.last_ns.swap(now, Ordering::Relaxed);
        if last != NONE && bytes > 0 {
            d.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
            d.busy_ns
                .fetch_add(now.saturating_sub(last), Ordering::Relaxed);
        }
    }

    /// The side received its launch's last step.
    pub fn launch_done(&self) {
        let Some(d) = self.counters() else { return };
        if d.in_launch.load(Ordering::Relaxed) == 0 {
            return;
        }
        if d.in_launch.fetch_sub(1, Ordering::Relaxed) == 1 {
            d.last_ns.store(NONE, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_busy_period_runs_from_its_first_completion_to_the_end_of_its_launches() {
        let m = NetMeter::new(2);
        let (a, a2, b) = (m.device(0), m.device(0), m.device(1));
        a.launch_started();
        a2.launch_started();
        // The wait before the first completion is not the link's.
        std::thread::sleep(Duration::from_millis(30));
        a.received(1000);
        assert_eq!(
            m.totals()[0],
            Sample::default(),
            "the first completion starts the clock"
        );
        std::thread::sleep(Duration::from_millis(20));
        a2.received(3000);
        let t = m.totals();
        assert_eq!(t[0].bytes, 3000);
        assert!(
            t[0].busy_ns >= 20_000_000 && t[0].busy_ns < 30_000_000,
            "{t:?}"
        );
        // One side done, the other still in its launch: the period goes on.
        a.launch_done();
        std::thread::sleep(Duration::from_millis(10));
        a2.received(5000);
        let t = m.totals();
        assert_eq!(t[0].bytes, 8000);
        assert!(
            t[0].busy_ns >= 30_000_000 && t[0].busy_ns < 40_000_000,
            "{t:?}"
        );
        // Both done: the wait for the next launch's data is not counted, nor is its first
        // completion.
        a2.launch_done();
        a.launch_started();
        std::thread::sleep(Duration::from_millis(20));
        a.received(7000);
        assert_eq!(m.totals()[0], t[0]);
        std::thread::sleep(Duration::from_millis(5));
        a.received(1000);
        assert_eq!(m.totals()[0].bytes, 9000);
        assert_eq!(t[1], Sample::default());
        // A completion outside a launch, and a dropped one, count nothing.
        b.received(9);
        b.launch_started();
        b.received(10);
        b.received(0);
        assert_eq!(m.totals()[1].bytes, 0);
        b.launch_done();
        b.launch_done();
        // A device beyond the meter's is not counted.
        let c = m.device(5);
        c.launch_started();
        c.received(9);
        c.received(9);
        assert_eq!(m.totals().len(), 2);
    }
}
