//! Windows (`ncclCommWindowRegister`): a buffer every rank of a communicator registers
//! together, whose peers' copies this rank can reach by load/store or by copy, and the
//! signals one-sided operations raise in them. Also what `ncclCommQueryProperties` reports.

use super::Comm;
use crate::abi::{ncclCommProperties_t, ncclWindow_t, NCCL_API_MAGIC};
use crate::error::{Error, Result};
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// One registered window, as this rank sees it.
pub struct Window {
    /// The registering rank's own buffer.
    pub user_ptr: u64,
    pub size: usize,
    /// Each rank's copy of the window, mapped into this process (`None`: not reachable by
    /// load/store from here).
    pub peers: Vec<Option<u64>>,
    /// Ranks of this window's communicator on this rank's host, in rank order.
    pub lsa_ranks: Vec<i32>,
}

impl Window {
    /// `offset` into this rank's view of `peer`'s copy.
    pub fn peer_pointer(&self, offset: usize, peer: i32) -> Result<u64> {
        self.check_offset(offset)?;
        let base = usize::try_from(peer)
            .ok()
            .and_then(|p| self.peers.get(p))
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "peer {peer} is not a rank of the window's communicator"
                ))
            })?;
        base.map(|b| b + offset as u64).ok_or_else(|| {
            Error::invalid_usage(format!(
                "peer {peer} is not reachable by load/store from this rank"
            ))
        })
    }

    /// `offset` into this rank's view of the copy of the `lsa_rank`-th rank of its host.
    pub fn lsa_pointer(&self, offset: usize, lsa_rank: i32) -> Result<u64> {
        let peer = usize::try_from(lsa_rank)
            .ok()
            .and_then(|r| self.lsa_ranks.get(r).copied())
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "lsaRank {lsa_rank} is not in the window's LSA team"
                ))
            })?;
        self.peer_pointer(offset, peer)
    }

    fn check_offset(&self, offset: usize) -> Result<()> {
        if offset >= self.size {
            return Err(Error::invalid_argument(format!(
                "offset {offset} is past the window's {} bytes",
                self.size
            )));
        }
        Ok(())
    }
}

static WINDOWS: Lazy<Mutex<HashMap<usize, Arc<Window>>>> = Lazy::new(|| Mutex::new(HashMap::new()));

/// The window behind a handle: NULL and unknown handles are `ncclInvalidArgument`.
pub fn find(handle: ncclWindow_t) -> Result<Arc<Window>> {
    if handle.is_null() {
        return Err(Error::invalid_argument("window argument is NULL"));
    }
    WINDOWS
        .lock()
        .get(&(handle as usize))
        .cloned()
        .ok_or_else(|| {
            Error::invalid_argument(format!("window {handle:p} is not a registered window"))
        })
}

/// Fill the caller's `ncclCommProperties_t`, up to its `size`.
///
/// # Safety
/// `props` points to the caller's struct, of at least its `size` field's bytes.
pub unsafe fn query_properties(comm: &Comm, props: *mut ncclCommProperties_t) -> Result<()> {
    // SAFETY: every version starts with size_t size, unsigned magic, unsigned version.
    let size = unsafe { std::ptr::addr_of!((*props).size).read_unaligned() };
    let magic = unsafe { std::ptr::addr_of!((*props).magic).read_unaligned() };
    if magic != NCCL_API_MAGIC {
        return Err(Error::invalid_argument(
            "props not initialized via NCCL_COMM_PROPERTIES_INITIALIZER",
        ));
    }
    let ours = std::mem::size_of::<ncclCommProperties_t>();
    if size < 16 {
        return Err(Error::invalid_argument(format!(
            "props->size {size} is too small"
        )));
    }
    // SAFETY: the caller provides `size` bytes; copy at most that many.
    let mut p: ncclCommProperties_t = unsafe { std::mem::zeroed() };
    unsafe {
        std::ptr::copy_nonoverlapping(
            props as *const u8,
            &mut p as *mut _ as *mut u8,
            size.min(ours),
        )
    };
    fill_properties(comm, &mut p);
    // SAFETY: as above; the header fields are written back unchanged.
    unsafe {
        std::ptr::copy_nonoverlapping(
            &p as *const _ as *const u8,
            props as *mut u8,
            size.min(ours),
        )
    };
    Ok(())
}

fn fill_properties(comm: &Comm, p: &mut ncclCommProperties_t) {
    p.rank = comm.rank();
    p.nRanks = comm.nranks();
    p.cudaDev = comm.cuda_dev;
    p.nvmlDev = comm.cuda_dev;
    p.deviceApiSupport = false;
    p.multimemSupport = false;
    p.ginType = crate::abi::NCCL_GIN_TYPE_NONE;
    p.nLsaTeams = 1;
    p.hostRmaSupport = false;
    p.railedGinType = crate::abi::NCCL_GIN_TYPE_NONE;
    p.commHash = comm.rt.lock().as_ref().map_or(0, |rt| rt.comm_hash());
    p.ginMinStride = 0;
    p.ginConnectionType = crate::abi::NCCL_GIN_CONNECTION_NONE;
    p.ginSupport = [false; 64];
    p.devCommRuntimeVersionSize = 0;
    p.cftSupport = false;
    p.cftMulticastSupport = false;
    p.cftCountedSupport = false;
}
