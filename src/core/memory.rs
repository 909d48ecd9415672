//! A communicator's GPU memory: what it holds, measured by counting its device allocations
//! (`ncclCommMemStats`), and releasing the part it can rebuild while the communicator is idle
//! (`ncclCommSuspend`) and allowing it back (`ncclCommResume`).
//!
//! The connection buffers are the suspendable part: suspending waits for the communicator's
//! work, meets the other ranks (so no peer still uses them) and frees them; they are made
//! again, collectively as always, by the first operation after `ncclCommResume`. Everything
//! else (signal counters of windows, the ring table) persists. A CUDA graph captured before a
//! suspend refers to the freed buffers: capture it again after the resume.

use super::Comm;
use crate::abi::{ncclResult_t, NCCL_SUSPEND_MEM};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// What a communicator's device allocations add up to, by kind.
#[derive(Default)]
pub struct Usage {
    /// Connection buffers: released by a suspend.
    pub suspendable: Arc<AtomicU64>,
    /// Everything else the communicator allocated.
    pub persistent: Arc<AtomicU64>,
    /// Set between `ncclCommSuspend` and `ncclCommResume`.
    pub suspended: AtomicBool,
}

impl Usage {
    /// Whether the communicator is suspended.
    pub fn is_suspended(&self) -> bool {
        self.suspended.load(Ordering::Acquire)
    }
}

/// Release the communicator's suspendable GPU memory (`flags`: `NCCL_SUSPEND_MEM`; other
/// bits are ignored, and without it nothing is suspended, as NVIDIA's).
pub fn suspend(comm: &Arc<Comm>, flags: i32) -> Result<()> {
    if flags & NCCL_SUSPEND_MEM == 0 {
        return Ok(());
    }
    if comm.mem.is_suspended() {
        return Err(Error::invalid_usage("communicator is already suspended"));
    }
    let mut rt = comm.rt.lock();
    let rt = rt.as_mut().ok_or_else(|| {
        Error::invalid_usage("communicator is not initialised (still in progress or failed)")
    })?;
    crate::cuda::set_current(rt.ctx)?;
    rt.quiesce(&comm.abort)?;
    // Every rank's work is done before any frees what its peers write into.
    rt.bootstrap.barrier()?;
    let before = comm.mem.suspendable.load(Ordering::Relaxed);
    rt.release_connections();
    comm.mem.suspended.store(true, Ordering::Release);
    crate::info!(
        INIT,
        "rank {}: suspended, {} bytes of connection buffers released",
        comm.rank(),
        before - comm.mem.suspendable.load(Ordering::Relaxed)
    );
    Ok(())
}

/// Allow operations again; their connections are made by the first one that needs them.
pub fn resume(comm: &Arc<Comm>) -> Result<()> {
    if !comm.mem.is_suspended() {
        return Err(Error::invalid_usage("communicator is not suspended"));
    }
    comm.mem.suspended.store(false, Ordering::Release);
    Ok(())
}

/// One of the `ncclCommMemStat_t` statistics, as measured now.
pub fn stat(comm: &Arc<Comm>, stat: i32) -> Result<u64> {
    let suspendable = comm.mem.suspendable.load(Ordering::Relaxed);
    let persistent = comm.mem.persistent.load(Ordering::Relaxed);
    Ok(match stat {
        0 => suspendable,
        1 => comm.mem.is_suspended() as u64,
        2 => persistent,
        3 => suspendable + persistent,
        _ => {
            return Err(Error::new(
                ncclResult_t::ncclInvalidArgument,
                format!("stat {stat} is not a ncclCommMemStat_t value (0..3)"),
            ))
        }
    })
}
