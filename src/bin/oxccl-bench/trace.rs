//! `--trace-interval MS`: busbw over time while one size's timed iterations run, so that a
//! change in the middle of a run (a link cut, weights that adapt) shows when it happened and
//! how long the library took to recover. The timed iterations run back to back on each
//! rank's stream; iteration i ends at its end event, `t_i` seconds after the first one began
//! (CUDA event times). Each iteration's bus bytes (size × the collective's bus factor, as the
//! busbw column) are spread evenly over the time from the previous end to its own, and every
//! interval of the trace reports the bytes that fell in it over its length:
//!
//! ```text
//! # trace start size=67108864 unix=1733241234.512 interval_ms=100
//! # trace t=0.100 busbw=0.587 iters=1
//! ```
//!
//! `t` is the interval's end (s since the first timed iteration began), `iters` the
//! iterations that ended in it, `unix` the wall-clock time of the start, to line the trace up
//! with events outside the process (`scripts/links-bench.sh` notes when it cut a link).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One interval of the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceLine {
    /// The interval's end, seconds since the first timed iteration began.
    pub t: f64,
    /// Bus bandwidth over the interval, GB/s.
    pub busbw: f64,
    /// Iterations that ended in the interval.
    pub iters: usize,
}

impl fmt::Display for TraceLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "# trace t={:.3} busbw={:.3} iters={}",
            self.t, self.busbw, self.iters
        )
    }
}

/// The line that opens a size's trace.
pub fn start_line(size: u64, started: SystemTime, interval: Duration) -> String {
    let unix = started
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    format!(
        "# trace start size={size} unix={unix:.3} interval_ms={}",
        interval.as_millis()
    )
}

/// Turns the end times of back-to-back iterations into trace intervals.
#[derive(Debug)]
pub struct Tracer {
    interval_s: f64,
    /// Bytes one iteration counts for busbw.
    bus_bytes: f64,
    /// The open interval's number (from 0): it spans `index × interval_s` to the next.
    index: u64,
    /// Bus bytes and iterations ended in the open interval so far.
    bytes: f64,
    ended: usize,
    /// When the last iteration ended (s; 0: the first began).
    last_end: f64,
}

impl Tracer {
    /// A trace with intervals of `interval` (at least 1 ms) for iterations of `bytes` each,
    /// counted for busbw with the collective's `bus_factor`.
    pub fn new(interval: Duration, bytes: u64, bus_factor: f64) -> Tracer {
        let interval_s = interval.as_secs_f64().max(1e-3);
        Tracer {
            interval_s,
            bus_bytes: bytes as f64 * bus_factor,
            index: 0,
            bytes: 0.0,
            ended: 0,
            last_end: 0.0,
        }
    }

    /// The next iteration ended `t` s after the first began: the lines of the intervals that
    /// closed before it. An end earlier than the last one's (clock jitter) counts as equal.
    pub fn iteration_ended(&mut self, t: f64) -> Vec<TraceLine> {
        let t = t.max(self.last_end);
        let span = t - self.last_end;
        let rate = if span > 0.0 {
            self.bus_bytes / span
        } else {
            0.0
        };
        let mut lines = Vec::new();
        while t > self.open_to() {
            let to = self.open_to();
            self.bytes += rate * (to - self.last_end.max(self.open_from()));
            lines.push(self.close(to));
        }
        self.bytes += if span > 0.0 {
            rate * (t - self.last_end.max(self.open_from()))
        } else {
            // Ended in no time (a mock, or a timer's resolution): its bytes land here.
            self.bus_bytes
        };
        self.ended += 1;
        self.last_end = t;
        lines
    }

    /// The iterations are over: the line of the last interval, up to the last end, if any
    /// time or iteration fell in it.
    pub fn finish(&mut self) -> Option<TraceLine> {
        (self.last_end > self.open_from() || self.ended > 0).then(|| self.close(self.last_end))
    }

    fn open_from(&self) -> f64 {
        self.index as f64 * self.interval_s
    }

    fn open_to(&self) -> f64 {
        (self.index + 1) as f64 * self.interval_s
    }

    /// Close the open interval at `to` and open the next. An interval of no length (every
    /// iteration took no measurable time) has busbw 0: nothing was measured.
    fn close(&mut self, to: f64) -> TraceLine {
        let length = to - self.open_from();
        let line = TraceLine {
            t: to,
            busbw: if length > 0.0 {
                self.bytes / length / 1e9
            } else {
                0.0
            },
            iters: self.ended,
        };
        self.index += 1;
        self.bytes = 0.0;
        self.ended = 0;
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn near(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn steady_iterations_give_their_busbw_in_every_interval() {
        // 1 GB per iteration (bus factor 1), one every 0.25 s: 4 GB/s whatever the interval.
        let mut tracer = Tracer::new(Duration::from_millis(100), 1_000_000_000, 1.0);
        let mut lines = Vec::new();
        for i in 1..=8 {
            lines.extend(tracer.iteration_ended(0.25 * i as f64));
        }
        lines.extend(tracer.finish());
        assert_eq!(lines.len(), 20, "{lines:?}");
        for (i, line) in lines.iter().enumerate() {
            assert!(near(line.t, 0.1 * (i + 1) as f64), "{line:?}");
            assert!(near(line.busbw, 4.0), "{line:?}");
        }
        let iters: usize = lines.iter().map(|l| l.iters).sum();
        assert_eq!(iters, 8);
        // Iteration 1 ends at 0.25 s, in the third interval.
        assert_eq!(lines[2].iters, 1);
        assert_eq!(lines[0].iters + lines[1].iters, 0);
    }

    #[test]
    fn a_slowdown_shows_in_the_intervals_after_it() {
        let mut tracer = Tracer::new(Duration::from_millis(500), 500_000_000, 2.0);
        let mut lines = Vec::new();
        // 1 GB of bus bytes every 0.1 s (10 GB/s) for 1 s, then every 0.4 s (2.5 GB/s).
        let mut t = 0.0;
        for _ in 0..10 {
            t += 0.1;
            lines.extend(tracer.iteration_ended(t));
        }
        for _ in 0..5 {
            t += 0.4;
            lines.extend(tracer.iteration_ended(t));
        }
        lines.extend(tracer.finish());
        let bw: Vec<f64> = lines
            .iter()
            .map(|l| (l.busbw * 100.0).round() / 100.0)
            .collect();
        assert_eq!(bw, vec![10.0, 10.0, 2.5, 2.5, 2.5, 2.5], "{lines:?}");
        assert!(near(lines.last().unwrap().t, 3.0));
    }

    #[test]
    fn a_partial_last_interval_and_instant_iterations_are_reported() {
        let mut tracer = Tracer::new(Duration::from_millis(100), 1_000_000, 1.0);
        assert!(tracer.iteration_ended(0.0).is_empty());
        assert!(tracer.iteration_ended(0.0).is_empty());
        let last = tracer.finish().unwrap();
        assert_eq!(last.iters, 2);
        assert_eq!(last.busbw, 0.0, "no time measured");
        // Nothing ran: no line.
        assert_eq!(
            Tracer::new(Duration::from_millis(100), 1, 1.0).finish(),
            None
        );
        // A long iteration spans empty intervals, each with its share.
        let mut tracer = Tracer::new(Duration::from_millis(100), 1_000_000_000, 1.0);
        let lines = tracer.iteration_ended(0.35);
        assert_eq!(lines.len(), 3);
        assert!(lines
            .iter()
            .all(|l| l.iters == 0 && (l.busbw - 2.857).abs() < 1e-3));
        let last = tracer.finish().unwrap();
        assert!(near(last.t, 0.35) && last.iters == 1 && (last.busbw - 2.857).abs() < 1e-3);
    }

    #[test]
    fn lines_have_the_documented_shape() {
        let line = TraceLine {
            t: 1.25,
            busbw: 0.5,
            iters: 3,
        };
        assert_eq!(line.to_string(), "# trace t=1.250 busbw=0.500 iters=3");
        let start = start_line(
            64 << 20,
            UNIX_EPOCH + Duration::from_millis(1_700_000_000_250),
            Duration::from_millis(100),
        );
        assert_eq!(
            start,
            "# trace start size=67108864 unix=1700000000.250 interval_ms=100"
        );
    }
}
