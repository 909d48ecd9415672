//! Host functions of NCCL's device API (`nccl_device/*.h`). Teams are plain arithmetic over
//! the communicator and work now; device communicators, barriers and the LL all-to-all need
//! symmetric memory windows, which oxccl has not built: those return `ncclInvalidUsage`.

use super::{entry, export, find_comm, out};
use crate::abi::{
    ncclComm_t, ncclDevComm, ncclDevCommRequirements, ncclDevResourceRequirements,
    ncclGinBarrierHandle, ncclLLA2AHandle, ncclLsaBarrierHandle, ncclResult_t, ncclTeam_t,
};
use crate::error::Error;
use std::os::raw::c_int;
use std::sync::atomic::Ordering::Relaxed;

/// `name (the device API) is not yet supported`, for the functions that need windows.
fn device_api(name: &str) -> Error {
    Error::unsupported(&format!("{name} (the device API)"))
}

#[no_mangle]
pub extern "C" fn ncclDevCommCreate(
    comm: ncclComm_t,
    reqs: *const ncclDevCommRequirements,
    outDevComm: *mut ncclDevComm,
) -> ncclResult_t {
    export!(ncclDevCommCreate, name);
    entry(name, comm, || {
        find_comm(comm)?;
        if reqs.is_null() {
            return Err(Error::invalid_argument("reqs argument is NULL"));
        }
        out(outDevComm, "outDevComm")?;
        Err(device_api(name))
    })
}

#[no_mangle]
pub extern "C" fn ncclDevCommDestroy(
    comm: ncclComm_t,
    devComm: *const ncclDevComm,
) -> ncclResult_t {
    export!(ncclDevCommDestroy, name);
    entry(name, comm, || {
        find_comm(comm)?;
        if devComm.is_null() {
            return Err(Error::invalid_argument("devComm argument is NULL"));
        }
        Err(device_api(name))
    })
}

/// A team computed from a communicator; an invalid handle yields the empty team and leaves
/// a message for `ncclGetLastError` (these functions cannot return an error code).
fn team(name: &str, c: ncclComm_t, make: fn(&crate::core::Comm) -> ncclTeam_t) -> ncclTeam_t {
    let mut out = ncclTeam_t {
        nRanks: 0,
        rank: 0,
        stride: 0,
    };
    entry(name, c, || {
        out = make(&*find_comm(c)?);
        Ok(())
    });
    out
}

#[no_mangle]
pub extern "C" fn ncclTeamWorld(comm: ncclComm_t) -> ncclTeam_t {
    export!(ncclTeamWorld, name);
    team(name, comm, |c| ncclTeam_t {
        nRanks: c.nranks(),
        rank: c.rank(),
        stride: 1,
    })
}

#[no_mangle]
pub extern "C" fn ncclTeamLsa(comm: ncclComm_t) -> ncclTeam_t {
    export!(ncclTeamLsa, name);
    team(name, comm, |c| ncclTeam_t {
        nRanks: c.local_nranks.load(Relaxed),
        rank: c.local_rank.load(Relaxed),
        stride: 1,
    })
}

#[no_mangle]
pub extern "C" fn ncclTeamRail(comm: ncclComm_t) -> ncclTeam_t {
    export!(ncclTeamRail, name);
    team(name, comm, |c| {
        let local = c.local_nranks.load(Relaxed).max(1);
        ncclTeam_t {
            nRanks: c.nranks() / local,
            rank: c.rank() / local,
            stride: local,
        }
    })
}

/// A rank computed from a communicator and a team member's rank; -1 (and a message for
/// `ncclGetLastError`) for an invalid handle.
fn team_rank(name: &str, c: ncclComm_t, make: impl FnOnce(&crate::core::Comm) -> c_int) -> c_int {
    let mut out = -1;
    entry(name, c, || {
        out = make(&*find_comm(c)?);
        Ok(())
    });
    out
}

// World rank of `rank` of team `tm`, whose member this communicator's rank is.
#[no_mangle]
pub extern "C" fn ncclTeamRankToWorld(comm: ncclComm_t, tm: ncclTeam_t, rank: c_int) -> c_int {
    export!(ncclTeamRankToWorld, name);
    team_rank(name, comm, |c| c.rank() + (rank - tm.rank) * tm.stride)
}

// LSA-team rank of `rank` of team `tm`.
#[no_mangle]
pub extern "C" fn ncclTeamRankToLsa(comm: ncclComm_t, tm: ncclTeam_t, rank: c_int) -> c_int {
    export!(ncclTeamRankToLsa, name);
    team_rank(name, comm, |c| {
        c.local_rank.load(Relaxed) + (rank - tm.rank) * tm.stride
    })
}

#[no_mangle]
pub extern "C" fn ncclLsaBarrierCreateRequirement(
    team: ncclTeam_t,
    nBarriers: c_int,
    outHandle: *mut ncclLsaBarrierHandle,
    outReq: *mut ncclDevResourceRequirements,
) -> ncclResult_t {
    export!(ncclLsaBarrierCreateRequirement, name);
    let _ = team;
    entry(name, std::ptr::null_mut(), || {
        out(outHandle, "outHandle")?;
        out(outReq, "outReq")?;
        if nBarriers < 0 {
            return Err(Error::invalid_argument(format!(
                "nBarriers {nBarriers} is negative"
            )));
        }
        Err(device_api(name))
    })
}

#[no_mangle]
pub extern "C" fn ncclGinBarrierCreateRequirement(
    comm: ncclComm_t,
    team: ncclTeam_t,
    nBarriers: c_int,
    outHandle: *mut ncclGinBarrierHandle,
    outReq: *mut ncclDevResourceRequirements,
) -> ncclResult_t {
    export!(ncclGinBarrierCreateRequirement, name);
    let _ = team;
    entry(name, comm, || {
        find_comm(comm)?;
        out(outHandle, "outHandle")?;
        out(outReq, "outReq")?;
        if nBarriers < 0 {
            return Err(Error::invalid_argument(format!(
                "nBarriers {nBarriers} is negative"
            )));
        }
        Err(device_api(name))
    })
}

#[no_mangle]
pub extern "C" fn ncclLLA2ACreateRequirement(
    nBlocks: c_int,
    nSlots: c_int,
    outHandle: *mut ncclLLA2AHandle,
    outReq: *mut ncclDevResourceRequirements,
) -> ncclResult_t {
    export!(ncclLLA2ACreateRequirement, name);
    entry(name, std::ptr::null_mut(), || {
        out(outHandle, "outHandle")?;
        out(outReq, "outReq")?;
        if nBlocks < 1 || nSlots < 1 {
            return Err(Error::invalid_argument(format!(
                "nBlocks {nBlocks} and nSlots {nSlots} must be positive"
            )));
        }
        Err(device_api(name))
    })
}

// Slots an LL all-to-all needs: one 16-byte LL packet carries 8 bytes of payload, so each
// element takes `ceil(maxEltSize / 8)` slots. Negative inputs give 0.
#[no_mangle]
pub extern "C" fn ncclLLA2ACalcSlots(maxElts: c_int, maxEltSize: c_int) -> c_int {
    export!(ncclLLA2ACalcSlots);
    if maxElts <= 0 || maxEltSize <= 0 {
        return 0;
    }
    maxElts.saturating_mul((maxEltSize + 7) / 8)
}
