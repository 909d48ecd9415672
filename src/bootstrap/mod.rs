//! Bootstrap: unique ids, the TCP rendezvous among ranks, and host-side collectives
//! (allgather, barrier, tagged send/recv) used by init and by the transports.

use crate::abi::ncclUniqueId;
use crate::error::{Error, Result};

/// A fresh unique id for a new communicator (placeholder until the rendezvous lands).
pub fn get_unique_id() -> Result<ncclUniqueId> {
    Err(Error::unsupported("ncclGetUniqueId"))
}

// TEMPORARY stand-in until the bootstrap branch lands.
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
pub struct Bootstrap {
    rank: i32,
    nranks: i32,
    abort: Arc<AtomicBool>,
}
impl Bootstrap {
    pub fn init(
        _ids: &[ncclUniqueId],
        rank: i32,
        nranks: i32,
        abort: Arc<AtomicBool>,
    ) -> Result<Bootstrap> {
        let _ = Bootstrap {
            rank,
            nranks,
            abort,
        };
        Err(Error::unsupported("bootstrap"))
    }
    pub fn sub(&self, _members: &[i32], _tag: u64, _abort: Arc<AtomicBool>) -> Result<Bootstrap> {
        Err(Error::unsupported("bootstrap"))
    }
    pub fn rank(&self) -> i32 {
        self.rank
    }
    pub fn nranks(&self) -> i32 {
        self.nranks
    }
    pub fn allgather(&self, _mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Err(Error::unsupported("bootstrap"))
    }
    pub fn barrier(&self) -> Result<()> {
        Err(Error::unsupported("bootstrap"))
    }
    pub fn send(&self, _peer: i32, _tag: u64, _data: &[u8]) -> Result<()> {
        Err(Error::unsupported("bootstrap"))
    }
    pub fn recv(&self, _peer: i32, _tag: u64) -> Result<Vec<u8>> {
        Err(Error::unsupported("bootstrap"))
    }
    pub fn abort_flag(&self) -> &Arc<AtomicBool> {
        &self.abort
    }
}
