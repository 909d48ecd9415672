//! Enqueue: a validated task joins the thread's group (a call outside a group is a group of
//! one). Zero-count collectives are no-ops, as in NVIDIA's library, and so are in-place
//! collectives of a one-rank communicator that leave the data as it is (all but PreMulSum):
//! like NVIDIA's, they enqueue no GPU work at all. Every operation, no-ops included, is
//! numbered first (`Comm::progress`), so that all ranks number the same calls alike; a no-op
//! outside a group counts as launched (and so, once what came before it finishes, done) at
//! once. With the collective check on (`OXCCL_CHECK_COLLECTIVES=1`), every numbered operation
//! is also noted for the check of its group (`watchdog::check`), no-ops too: another rank may
//! have called something else under that number. A call's launch event
//! (`ncclCollConfig_t.launchCompletionEvent`) is recorded after its group's launch on the
//! communicator, and for a no-op at once (or at its group's end).

use super::watchdog::check;
use super::watchdog::wire::OpDesc;
use super::Comm;
use crate::abi::cudaStream_t;
use crate::error::Result;
use crate::sched::{CollKind, Task};
use std::sync::Arc;

/// Queue `task` on `comm` for `stream`; `launch_event` (0: none) is the caller's event to
/// record on `stream` once the task's kernel has been launched.
pub fn enqueue(
    comm: &Arc<Comm>,
    mut task: Task,
    stream: cudaStream_t,
    launch_event: usize,
) -> Result<()> {
    let seq = comm.progress.record(&task, stream as usize);
    let checked = comm.nranks() > 1 && check::enabled();
    if checked {
        check::note(comm, signature(&task, seq));
    }
    let p2p = matches!(task.kind, CollKind::Send | CollKind::Recv);
    if !p2p {
        if comm.weights.is_active() && super::adaptive::paced(task.count, task.dtype.size()) {
            // The launches ahead first, so the epoch is the newest agreed by the time this
            // collective can be launched (not the one when it began to wait).
            if let Some(rt) = comm.rt.lock().as_mut() {
                let bytes = task.count.saturating_mul(task.dtype.size()) as u64;
                let wire =
                    crate::sched::adaptive::wire_bytes(task.kind, bytes, comm.nranks() as u32);
                rt.wait_for_launch_room(stream as usize, wire, &comm.abort)?;
            }
        }
        // Collectives are numbered alike on every rank: the number picks the weights.
        task.weights_epoch = comm.weights.epoch_for(seq, &comm.abort)?;
    }
    let noop = !p2p
        && (task.count == 0 || comm.nranks() == 1 && is_one_rank_noop(&task) && comm.is_ready());
    if noop {
        if checked {
            // No GPU work, but the other ranks wait for its signature.
            super::group::check_noop(comm)?;
        }
        if super::group::depth() == 0 {
            comm.progress.mark_launched();
            if let Some(rt) = comm.rt.lock().as_mut() {
                rt.note_launched(comm.progress.launched());
            }
        }
        return super::group::launch_event(stream as usize, launch_event);
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
    super::group::submit_op(comm, task, stream as usize, launch_event)
}

/// What the collective check compares of `task`, numbered `seq`.
fn signature(task: &Task, seq: u64) -> OpDesc {
    OpDesc {
        kind: task.kind,
        seq,
        count: task.count as u64,
        dtype: task.dtype,
        op: crate::sched::device::op_code(task.op),
        root: task.root,
    }
}

/// Whether `task` on a one-rank communicator changes nothing: in place, and no PreMulSum.
fn is_one_rank_noop(task: &Task) -> bool {
    task.sendbuff == task.recvbuff && !crate::sched::plan::one_rank_transform(task)
}
