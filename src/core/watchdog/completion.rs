//! How the watchdog sees its communicator's launches finish, without touching the user's
//! streams or adding work to the launch path: every launch notes which of the runtime's own
//! completion events describes it (`Runtime::note_launched`, a ring push under the lock the
//! launch holds anyway), and each tick the watchdog asks the runtime, if its lock is free,
//! how far the noted launches got (`Runtime::completed_ordinal`, event queries in order).

use super::{Comm, Completion};
use crate::cuda::{self, CUcontext, RelaxedCapture};
use crate::error::Result;

/// A communicator's CUDA context, handed to the watchdog's thread.
pub struct SendCtx(pub CUcontext);

// SAFETY: a primary context may be made current on any thread; it lives until the process
// exits (the library never releases it).
unsafe impl Send for SendCtx {}

/// The tracker for a communicator, on the current thread; one that tracks nothing (every
/// launch counts as done), with a warning, when the context cannot be made current.
pub fn markers(ctx: SendCtx) -> Box<dyn Completion> {
    match RuntimeEvents::new(ctx.0) {
        Ok(t) => Box::new(t),
        Err(e) => {
            crate::warn!(
                "watchdog: cannot track completion ({}): no hang reports",
                e.msg
            );
            Box::new(Untracked)
        }
    }
}

/// Completion from the runtime's launch events.
struct RuntimeEvents {
    failed: bool,
    /// This thread's capture mode is relaxed for its whole life: its event queries must not
    /// disturb a graph the user captures meanwhile (they would invalidate a global capture).
    _relaxed: RelaxedCapture,
}

impl RuntimeEvents {
    fn new(ctx: CUcontext) -> Result<RuntimeEvents> {
        cuda::set_current(ctx)?;
        Ok(RuntimeEvents {
            failed: false,
            _relaxed: RelaxedCapture::enter()?,
        })
    }
}

impl Completion for RuntimeEvents {
    fn poll(&mut self, comm: &Comm) {
        if self.failed {
            return;
        }
        // A launch (or a wait inside one) holds the lock: next tick then.
        let Some(mut rt) = comm.rt.try_lock() else {
            return;
        };
        let Some(rt) = rt.as_mut() else {
            return;
        };
        match rt.completed_ordinal() {
            Ok(Some(ordinal)) => comm.progress.set_completed(ordinal),
            Ok(None) => {}
            Err(e) => {
                self.failed = true;
                crate::warn!(
                    "rank {}: the watchdog cannot track completion any more ({}): no hang reports",
                    comm.rank(),
                    e.msg
                );
            }
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
