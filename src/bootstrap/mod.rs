//! Bootstrap: unique ids, the TCP rendezvous among ranks, and host-side collectives
//! (allgather, barrier, tagged send/recv) used by init and by the transports.

use crate::abi::ncclUniqueId;
use crate::error::{Error, Result};

/// A fresh unique id for a new communicator (placeholder until the rendezvous lands).
pub fn get_unique_id() -> Result<ncclUniqueId> {
    Err(Error::unsupported("ncclGetUniqueId"))
}
