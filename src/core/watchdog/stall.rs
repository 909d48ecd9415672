//! When a communicator counts as stuck: work handed to the GPU (`launched`) beyond what is
//! known finished (`completed`), with `completed` standing still for the report's delay. Pure
//! arithmetic on the two ordinals and the clock, so it is tested without a GPU.

use std::time::{Duration, Instant};

/// The state of one communicator's progress between ticks.
pub struct Stall {
    completed: u64,
    /// Since when nothing has completed while work was pending.
    since: Instant,
    /// The operation (ordinal) the last report was for: one report per stuck operation.
    reported: Option<u64>,
    /// Nothing was pending at the last update.
    idle: bool,
}

impl Stall {
    pub fn new(now: Instant) -> Stall {
        Stall {
            completed: 0,
            since: now,
            reported: None,
            idle: true,
        }
    }

    /// Take the newest ordinals; how long the pending work has made no progress (None when
    /// nothing is pending).
    pub fn update(&mut self, now: Instant, launched: u64, completed: u64) -> Option<Duration> {
        if completed != self.completed {
            self.completed = completed;
            self.since = now;
            self.reported = None;
        }
        if completed >= launched {
            self.idle = true;
            return None;
        }
        if std::mem::replace(&mut self.idle, false) {
            self.since = now;
        }
        Some(now.saturating_duration_since(self.since))
    }

    /// Whether a report is due: stuck for `after` and not yet reported.
    pub fn report_due(&self, stuck: Option<Duration>, after: Duration) -> bool {
        self.reported.is_none() && stuck.is_some_and(|d| d >= after)
    }

    /// The report for the operation after `completed` is made.
    pub fn reported(&mut self) {
        self.reported = Some(self.completed + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(60);

    #[test]
    fn pending_work_without_progress_is_reported_once_after_the_delay() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut s = Stall::new(t0);
        assert_eq!(s.update(at(0), 0, 0), None, "nothing launched");
        // Launched at 10 s, never completes.
        assert_eq!(s.update(at(10), 4, 0), Some(Duration::ZERO));
        let stuck = s.update(at(69), 4, 0);
        assert!(!s.report_due(stuck, T), "59 s");
        let stuck = s.update(at(70), 4, 0);
        assert!(s.report_due(stuck, T), "60 s");
        s.reported();
        let stuck = s.update(at(200), 4, 0);
        assert!(!s.report_due(stuck, T), "once per stuck operation");
    }

    #[test]
    fn progress_restarts_the_clock_and_idle_is_never_stuck() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut s = Stall::new(t0);
        s.update(at(0), 10, 0);
        // A long queue that keeps completing is not stuck.
        for i in 1..=9 {
            let stuck = s.update(at(50 * i), 10, i);
            assert!(!s.report_due(stuck, T), "completing {i}");
        }
        assert_eq!(s.update(at(1000), 10, 10), None, "all done");
        assert_eq!(s.update(at(5000), 10, 10), None, "idle for long");
        // New work after a long idle time starts its own clock.
        assert_eq!(s.update(at(5001), 11, 10), Some(Duration::ZERO));
        s.reported();
        // After a report, progress and a new stall report again.
        s.update(at(5100), 12, 11);
        let stuck = s.update(at(5161), 12, 11);
        assert!(s.report_due(stuck, T));
    }
}
