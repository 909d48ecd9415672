//! Enqueue: a validated task joins the thread's group; outside a group it runs at once.

use super::Comm;
use crate::abi::cudaStream_t;
use crate::error::{Error, Result};
use crate::sched::Task;

/// Queue `task` on `comm` for `stream`.
pub fn enqueue(comm: &Comm, task: Task, stream: cudaStream_t) -> Result<()> {
    let _ = (comm, stream);
    if task.count == 0
        && !matches!(
            task.kind,
            crate::sched::CollKind::Send | crate::sched::CollKind::Recv
        )
    {
        return Ok(());
    }
    Err(Error::unsupported(&format!("nccl{}", task.kind.name())))
}
