//! Group semantics: `ncclGroupStart`/`ncclGroupEnd` nesting per thread, and the operations
//! collected until the outermost end.

use crate::error::{Error, Result};
use std::cell::Cell;

thread_local! {
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Open a (possibly nested) group on this thread.
pub fn start() {
    DEPTH.with(|d| d.set(d.get() + 1));
}

/// Close a group; the outermost end submits what was collected.
pub fn end() -> Result<()> {
    let depth = DEPTH.with(|d| d.get());
    if depth == 0 {
        return Err(Error::invalid_usage(
            "ncclGroupEnd called without a matching ncclGroupStart",
        ));
    }
    DEPTH.with(|d| d.set(depth - 1));
    Ok(())
}

/// Current nesting depth on this thread (0 outside a group).
pub fn depth() -> usize {
    DEPTH.with(|d| d.get())
}

/// `ncclGroupSimulateEnd`: close the group without running it and estimate its time in µs.
pub fn simulate_end() -> Result<f32> {
    end()?;
    Err(Error::unsupported("ncclGroupSimulateEnd"))
}
