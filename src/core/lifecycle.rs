//! Communicator lifecycle: init (one rank, all local devices, several roots), split, shrink,
//! revoke, finalize, destroy and abort.

use super::{Comm, CommConfig};
use crate::abi::{ncclComm_t, ncclConfig_t, ncclUniqueId};
use crate::error::{Error, Result};
use std::sync::Arc;

/// `ncclCommInitRank[Config|Scalable]`: join the communicator described by `ids`.
pub fn init_rank(
    out: *mut ncclComm_t,
    nranks: i32,
    ids: &[ncclUniqueId],
    rank: i32,
    cfg: Option<&ncclConfig_t>,
) -> Result<()> {
    let _ = (out, nranks, ids, rank, CommConfig::resolve(cfg, None)?);
    Err(Error::unsupported("ncclCommInitRank"))
}

/// `ncclCommInitAll`: one communicator per listed device, in this process.
pub fn init_all(devs: &[i32]) -> Result<Vec<ncclComm_t>> {
    let _ = devs;
    Err(Error::unsupported("ncclCommInitAll"))
}

/// `ncclCommFinalize`.
pub fn finalize(comm: &Arc<Comm>) -> Result<()> {
    comm.check_usable()
}

/// `ncclCommDestroy` / `ncclCommAbort`.
pub fn destroy(handle: ncclComm_t, abort: bool) -> Result<()> {
    let comm = Comm::from_handle(handle)?;
    if abort {
        comm.abort.store(true, std::sync::atomic::Ordering::Release);
    }
    comm.mark_destroyed();
    Comm::unregister(handle);
    Ok(())
}

/// `ncclCommRevoke`.
pub fn revoke(comm: &Arc<Comm>) -> Result<()> {
    let _ = comm;
    Err(Error::unsupported("ncclCommRevoke"))
}

/// `ncclCommSplit`.
pub fn split(
    parent: &Arc<Comm>,
    color: i32,
    key: i32,
    out: *mut ncclComm_t,
    cfg: Option<&ncclConfig_t>,
) -> Result<()> {
    let _ = (parent, color, key, out, cfg);
    Err(Error::unsupported("ncclCommSplit"))
}

/// `ncclCommShrink`.
pub fn shrink(
    parent: &Arc<Comm>,
    exclude: &[i32],
    out: *mut ncclComm_t,
    cfg: Option<&ncclConfig_t>,
    flags: i32,
) -> Result<()> {
    let _ = (parent, exclude, out, cfg, flags);
    Err(Error::unsupported("ncclCommShrink"))
}
