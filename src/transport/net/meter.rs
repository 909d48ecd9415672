//! What a communicator's sends achieve on each network device: bytes the network took and
//! the time the device was busy (at least one send on it posted and not done), counted by
//! the proxy thread as it posts and completes sends, and read at any time by the channel
//! weights' exchange (`core::adaptive`). Only the proxy thread writes; the counters are
//! relaxed atomics, so the per-message cost is a clock read when a device turns busy or
//! idle and a few uncontended atomic operations.

use crate::sched::adaptive::Sample;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// One device's counters.
#[derive(Default)]
struct Device {
    bytes: AtomicU64,
    /// Busy time of the intervals that ended, ns.
    busy_ns: AtomicU64,
    /// Sends posted and not done.
    active: AtomicU32,
    /// When the current busy interval began (ns since the meter's start), while active.
    since_ns: AtomicU64,
}

/// Per-device send counters of one communicator.
pub struct NetMeter {
    start: Instant,
    devices: Vec<Device>,
}

impl NetMeter {
    /// Counters for `ndev` devices (sends on other devices are not counted).
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

    /// Every device's totals so far (a busy interval still open counts up to now).
    pub fn totals(&self) -> Vec<Sample> {
        let now = self.now_ns();
        self.devices
            .iter()
            .map(|d| {
                let open = match d.active.load(Ordering::Relaxed) {
                    0 => 0,
                    _ => now.saturating_sub(d.since_ns.load(Ordering::Relaxed)),
                };
                Sample {
                    bytes: d.bytes.load(Ordering::Relaxed),
                    busy_ns: d.busy_ns.load(Ordering::Relaxed) + open,
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

    /// A send was posted.
    pub fn posted(&self) {
        let Some(d) = self.counters() else { return };
        if d.active.load(Ordering::Relaxed) == 0 {
            d.since_ns.store(self.meter.now_ns(), Ordering::Relaxed);
        }
        d.active.fetch_add(1, Ordering::Relaxed);
    }

    /// A send of `bytes` completed (or was dropped with its connection: `bytes` 0).
    pub fn done(&self, bytes: usize) {
        let Some(d) = self.counters() else { return };
        d.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        if d.active.load(Ordering::Relaxed) == 0 {
            return;
        }
        if d.active.fetch_sub(1, Ordering::Relaxed) == 1 {
            let busy = self
                .meter
                .now_ns()
                .saturating_sub(d.since_ns.load(Ordering::Relaxed));
            d.busy_ns.fetch_add(busy, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn busy_time_counts_overlapping_sends_once_and_open_intervals_up_to_now() {
        let m = NetMeter::new(2);
        let (a, b) = (m.device(0), m.device(1));
        a.posted();
        a.posted();
        std::thread::sleep(Duration::from_millis(20));
        a.done(1000);
        let open = m.totals();
        assert_eq!(open[0].bytes, 1000);
        assert!(open[0].busy_ns >= 20_000_000, "{open:?}");
        std::thread::sleep(Duration::from_millis(20));
        a.done(3000);
        let t = m.totals();
        assert_eq!(t[0].bytes, 4000);
        assert!(t[0].busy_ns >= 40_000_000 && t[0].busy_ns < 1_000_000_000);
        // Idle now: the total stays.
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(m.totals()[0], t[0]);
        assert_eq!(t[1], Sample::default());
        b.posted();
        b.done(7);
        assert_eq!(m.totals()[1].bytes, 7);
        // A device beyond the meter's is not counted.
        let c = m.device(5);
        c.posted();
        c.done(9);
        assert_eq!(m.totals().len(), 2);
    }
}
