//! Enqueue: a validated task joins the thread's group (a call outside a group is a group of
//! one). Zero-count collectives are no-ops, as in NVIDIA's library.

use super::Comm;
use crate::abi::cudaStream_t;
use crate::error::Result;
use crate::sched::{CollKind, Task};
use std::sync::Arc;

/// Queue `task` on `comm` for `stream`.
pub fn enqueue(comm: &Arc<Comm>, task: Task, stream: cudaStream_t) -> Result<()> {
    if task.count == 0 && !matches!(task.kind, CollKind::Send | CollKind::Recv) {
        return Ok(());
    }
    crate::trace!(
        COLL,
        "{}: count {} datatype {} root {} comm rank {}",
        task.kind.name(),
        task.count,
        task.dtype.name(),
        task.root,
        comm.rank()
    );
    super::group::submit_op(comm, task, stream as usize)
}
