//! The host-side profile of the per-call path (`OXCCL_HOST_PROFILE=1`): how many times each
//! stage of a collective call ran and the host time it took, printed when the process exits.
//! It answers "where do the microseconds of a small collective go" without a profiler on the
//! machine. Off (the default), a stage costs one load of a cached flag; on, two clock reads.
//! Stages nest (a call contains its launch): each is timed on its own, so the times of the
//! inner stages are parts of the outer ones, not additions to them.

use once_cell::sync::OnceCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The stages of the per-call path that are timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// A collective or point-to-point call, from its entry point to its return.
    Call,
    /// The group's end: checks, connections and launches of its operations.
    GroupExecute,
    /// Whether the group's operations need new connections.
    NeedsConnect,
    /// One communicator's launch of a group (plan, ordering, launch, events).
    LaunchGroup,
    /// Finding (or making) the plan of the group's tasks.
    PlanLookup,
    /// Asking the driver whether the stream captures a graph.
    CaptureCheck,
    /// Writing the work items into the pinned arena.
    ArenaWrite,
    /// The kernel launch itself (`cuLaunchKernel`).
    KernelLaunch,
    /// Copy-engine copies (`cuMemcpyDtoDAsync`) on the user's or the side stream.
    Copies,
    /// Recording the launch's completion event and the ordering waits around it.
    Events,
}

const STAGES: [Stage; 10] = [
    Stage::Call,
    Stage::GroupExecute,
    Stage::NeedsConnect,
    Stage::LaunchGroup,
    Stage::PlanLookup,
    Stage::CaptureCheck,
    Stage::ArenaWrite,
    Stage::KernelLaunch,
    Stage::Copies,
    Stage::Events,
];

struct Counters {
    calls: [AtomicU64; STAGES.len()],
    nanos: [AtomicU64; STAGES.len()],
}

static COUNTERS: Counters = Counters {
    calls: [const { AtomicU64::new(0) }; STAGES.len()],
    nanos: [const { AtomicU64::new(0) }; STAGES.len()],
};

/// Whether the profile is on (`OXCCL_HOST_PROFILE`, read once); the first time it is on, the
/// report is registered to print at exit.
fn enabled() -> bool {
    static ON: OnceCell<bool> = OnceCell::new();
    *ON.get_or_init(|| {
        let on = crate::env::registry::HOST_PROFILE.flag();
        if on {
            // SAFETY: `report_at_exit` is an `extern "C" fn()` that only reads atomics and
            // writes to stderr, which stays valid while exit handlers run.
            unsafe { libc::atexit(report_at_exit) };
        }
        on
    })
}

/// Time the rest of the enclosing scope as `stage` (nothing when the profile is off).
pub fn span(stage: Stage) -> Span {
    Span {
        stage,
        start: enabled().then(Instant::now),
    }
}

/// A running stage; its time is added when it is dropped.
pub struct Span {
    stage: Stage,
    start: Option<Instant>,
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(start) = self.start {
            let i = self.stage as usize;
            let ns = start.elapsed().as_nanos() as u64;
            COUNTERS.calls[i].fetch_add(1, Ordering::Relaxed);
            COUNTERS.nanos[i].fetch_add(ns, Ordering::Relaxed);
        }
    }
}

/// The report's lines: each stage that ran, its count, mean and total host time.
pub fn report_lines() -> Vec<String> {
    let mut lines = vec![format!(
        "host profile (OXCCL_HOST_PROFILE): {:<13} {:>10} {:>10} {:>12}",
        "stage", "count", "mean us", "total ms"
    )];
    for (i, stage) in STAGES.iter().enumerate() {
        let calls = COUNTERS.calls[i].load(Ordering::Relaxed);
        if calls == 0 {
            continue;
        }
        let ns = COUNTERS.nanos[i].load(Ordering::Relaxed);
        lines.push(format!(
            "host profile (OXCCL_HOST_PROFILE): {:<13} {:>10} {:>10.3} {:>12.3}",
            format!("{stage:?}"),
            calls,
            ns as f64 / calls as f64 / 1e3,
            ns as f64 / 1e6
        ));
    }
    lines
}

extern "C" fn report_at_exit() {
    // Not `eprintln!`: it panics when stderr is gone, and a panic may not leave an exit handler.
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    for line in report_lines() {
        let _ = writeln!(err, "NCCL INFO {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_of_a_disabled_profile_records_nothing() {
        // The test environment does not set OXCCL_HOST_PROFILE.
        let before = COUNTERS.calls[Stage::Call as usize].load(Ordering::Relaxed);
        drop(span(Stage::Call));
        let after = COUNTERS.calls[Stage::Call as usize].load(Ordering::Relaxed);
        assert_eq!(before, after);
    }

    #[test]
    fn every_stage_is_listed_once_in_order() {
        for (i, s) in STAGES.iter().enumerate() {
            assert_eq!(*s as usize, i);
        }
    }
}
