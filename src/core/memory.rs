//! A communicator's GPU memory: what it holds (`ncclCommMemStats`), and releasing it while
//! the communicator is idle (`ncclCommSuspend`) and bringing it back (`ncclCommResume`).

use super::Comm;
use crate::error::{Error, Result};
use std::sync::Arc;

/// Release the communicator's dynamic GPU memory (`flags`: `NCCL_SUSPEND_MEM`).
pub fn suspend(_comm: &Arc<Comm>, _flags: i32) -> Result<()> {
    Err(Error::unsupported("ncclCommSuspend"))
}

/// Bring back what `suspend` released.
pub fn resume(_comm: &Arc<Comm>) -> Result<()> {
    Err(Error::unsupported("ncclCommResume"))
}

/// One of the `ncclCommMemStat_t` statistics.
pub fn stat(_comm: &Arc<Comm>, _stat: i32) -> Result<u64> {
    Err(Error::unsupported("ncclCommMemStats"))
}
