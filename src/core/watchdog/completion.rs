//! How the watchdog sees its communicator's launches finish, without touching the user's
//! streams or the launch path: each tick, if something was launched since, it records a
//! marker event on its own stream behind the runtime's latest launch
//! (`Runtime::mark_after_last_launch`), remembering the operation ordinal that launch
//! covered; a marker that completed means every operation up to its ordinal did (launches of
//! a communicator run in order). Markers are recycled; at most [`MAX_PENDING`] wait at once.

use super::{Comm, Completion};
use crate::cuda::{self, CUcontext, Event, RelaxedCapture};
use crate::error::Result;
use std::collections::VecDeque;

/// Markers waiting at most (a stuck GPU with the host still launching adds one per tick).
pub const MAX_PENDING: usize = 256;

/// A communicator's CUDA context, handed to the watchdog's thread.
pub struct SendCtx(pub CUcontext);

// SAFETY: a primary context may be made current on any thread; it lives until the process
// exits (the library never releases it).
unsafe impl Send for SendCtx {}

/// The tracker for a communicator on the current thread, or one that tracks nothing (every
/// launch counts as done) when CUDA state cannot be made, with a warning.
pub fn markers(ctx: SendCtx) -> Box<dyn Completion> {
    match Markers::new(ctx.0) {
        Ok(m) => Box::new(m),
        Err(e) => {
            crate::warn!(
                "watchdog: cannot track completion ({}): no hang reports",
                e.msg
            );
            Box::new(Untracked)
        }
    }
}

/// Marker events behind the launches.
struct Markers {
    stream: cuda::Stream,
    /// (ordinal covered, marker), oldest first.
    pending: VecDeque<(u64, Event)>,
    pool: Vec<Event>,
    /// The ordinal the newest marker covers.
    marked: u64,
    failed: bool,
    /// This thread's capture mode is relaxed for its whole life: its event queries must not
    /// disturb a graph the user captures meanwhile (they would invalidate a global capture).
    _relaxed: RelaxedCapture,
}

impl Markers {
    fn new(ctx: CUcontext) -> Result<Markers> {
        cuda::set_current(ctx)?;
        let relaxed = RelaxedCapture::enter()?;
        Ok(Markers {
            stream: cuda::Stream::new()?,
            pending: VecDeque::new(),
            pool: Vec::new(),
            marked: 0,
            failed: false,
            _relaxed: relaxed,
        })
    }

    /// Move `completed` past every marker that finished.
    fn retire(&mut self, comm: &Comm) -> Result<()> {
        while let Some((ordinal, ev)) = self.pending.front() {
            if !ev.done()? {
                break;
            }
            comm.progress.set_completed(*ordinal);
            let (_, ev) = self.pending.pop_front().expect("front exists");
            self.pool.push(ev);
        }
        Ok(())
    }

    /// A marker behind the latest launch, if something was launched since the last one and
    /// the runtime is not busy (a launch holds its lock: next tick then).
    fn mark(&mut self, comm: &Comm) -> Result<()> {
        if comm.progress.launched() <= self.marked || self.pending.len() >= MAX_PENDING {
            return Ok(());
        }
        let Some(rt) = comm.rt.try_lock() else {
            return Ok(());
        };
        let Some(rt) = rt.as_ref() else {
            return Ok(());
        };
        // Read under the runtime's lock: the launch path counts there.
        let launched = comm.progress.launched();
        let ev = match self.pool.pop() {
            Some(ev) => ev,
            None => Event::new()?,
        };
        if rt.mark_after_last_launch(&ev, self.stream.raw())? {
            self.pending.push_back((launched, ev));
        } else {
            // Nothing eager was launched (graph capture only): nothing to wait for here.
            comm.progress.set_completed(launched);
            self.pool.push(ev);
        }
        self.marked = launched;
        Ok(())
    }
}

impl Completion for Markers {
    fn poll(&mut self, comm: &Comm) {
        if self.failed {
            return;
        }
        if let Err(e) = self.retire(comm).and_then(|_| self.mark(comm)) {
            self.failed = true;
            crate::warn!(
                "rank {}: the watchdog cannot track completion any more ({}): no hang reports",
                comm.rank(),
                e.msg
            );
        }
    }
}

/// Counts every launch as done (no hang reports).
struct Untracked;

impl Completion for Untracked {
    fn poll(&mut self, comm: &Comm) {
        comm.progress.set_completed(comm.progress.launched());
    }
}
