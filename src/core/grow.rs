//! Growing a live communicator: `ncclCommGetUniqueId` makes the id new ranks join with, and
//! `ncclCommGrow` builds the larger communicator from the existing ranks and the new ones.

use super::Comm;
use crate::abi::{ncclComm_t, ncclConfig_t, ncclUniqueId};
use crate::error::{Error, Result};
use std::sync::Arc;

/// The id new ranks of a grow join with (made by the existing root).
pub fn unique_id(_comm: &Arc<Comm>) -> Result<ncclUniqueId> {
    Err(Error::unsupported("ncclCommGetUniqueId"))
}

/// Build the grown communicator of `nranks` ranks into `*newcomm`.
pub fn grow(
    parent: Option<Arc<Comm>>,
    nranks: i32,
    id: Option<ncclUniqueId>,
    rank: i32,
    newcomm: *mut ncclComm_t,
    config: Option<&ncclConfig_t>,
) -> Result<()> {
    let _ = (parent, nranks, id, rank, newcomm, config);
    Err(Error::unsupported("ncclCommGrow"))
}
