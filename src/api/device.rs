//! Host functions of NCCL's device API (`nccl_device/*.h`). Teams are plain arithmetic over
//! the communicator and work now; device communicators, barriers and the LL all-to-all need
//! symmetric memory windows, which oxccl has not built: those return `ncclInvalidUsage`.

use super::{comm, entry, out_ptr};
use crate::abi::{
    ncclComm_t, ncclDevComm, ncclDevCommRequirements, ncclDevResourceRequirements,
    ncclGinBarrierHandle, ncclLLA2AHandle, ncclLsaBarrierHandle, ncclResult_t, ncclTeam_t,
};
use crate::error::Error;
use std::os::raw::c_int;
use std::sync::atomic::Ordering::Relaxed;

fn dev_comm_create(
    c: ncclComm_t,
    reqs: *const ncclDevCommRequirements,
    out: *mut ncclDevComm,
) -> ncclResult_t {
    entry("ncclDevCommCreate", c, || {
        comm(c)?;
        if reqs.is_null() {
            return Err(Error::invalid_argument("reqs argument is NULL"));
        }
        out_ptr(out, "outDevComm")?;
        Err(Error::unsupported("ncclDevCommCreate (the device API)"))
    })
}

#[no_mangle]
pub extern "C" fn ncclDevCommCreate(
    comm: ncclComm_t,
    reqs: *const ncclDevCommRequirements,
    outDevComm: *mut ncclDevComm,
) -> ncclResult_t {
    dev_comm_create(comm, reqs, outDevComm)
}
#[no_mangle]
pub extern "C" fn pncclDevCommCreate(
    comm: ncclComm_t,
    reqs: *const ncclDevCommRequirements,
    outDevComm: *mut ncclDevComm,
) -> ncclResult_t {
    dev_comm_create(comm, reqs, outDevComm)
}

fn dev_comm_destroy(c: ncclComm_t, dev_comm: *const ncclDevComm) -> ncclResult_t {
    entry("ncclDevCommDestroy", c, || {
        comm(c)?;
        if dev_comm.is_null() {
            return Err(Error::invalid_argument("devComm argument is NULL"));
        }
        Err(Error::unsupported("ncclDevCommDestroy (the device API)"))
    })
}

#[no_mangle]
pub extern "C" fn ncclDevCommDestroy(
    comm: ncclComm_t,
    devComm: *const ncclDevComm,
) -> ncclResult_t {
    dev_comm_destroy(comm, devComm)
}
#[no_mangle]
pub extern "C" fn pncclDevCommDestroy(
    comm: ncclComm_t,
    devComm: *const ncclDevComm,
) -> ncclResult_t {
    dev_comm_destroy(comm, devComm)
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
        out = make(&*comm(c)?);
        Ok(())
    });
    out
}

fn world(c: &crate::core::Comm) -> ncclTeam_t {
    ncclTeam_t {
        nRanks: c.nranks(),
        rank: c.rank(),
        stride: 1,
    }
}

fn lsa(c: &crate::core::Comm) -> ncclTeam_t {
    ncclTeam_t {
        nRanks: c.local_nranks.load(Relaxed),
        rank: c.local_rank.load(Relaxed),
        stride: 1,
    }
}

fn rail(c: &crate::core::Comm) -> ncclTeam_t {
    let local = c.local_nranks.load(Relaxed).max(1);
    ncclTeam_t {
        nRanks: c.nranks() / local,
        rank: c.rank() / local,
        stride: local,
    }
}

#[no_mangle]
pub extern "C" fn ncclTeamWorld(comm: ncclComm_t) -> ncclTeam_t {
    team("ncclTeamWorld", comm, world)
}
#[no_mangle]
pub extern "C" fn pncclTeamWorld(comm: ncclComm_t) -> ncclTeam_t {
    team("ncclTeamWorld", comm, world)
}
#[no_mangle]
pub extern "C" fn ncclTeamLsa(comm: ncclComm_t) -> ncclTeam_t {
    team("ncclTeamLsa", comm, lsa)
}
#[no_mangle]
pub extern "C" fn pncclTeamLsa(comm: ncclComm_t) -> ncclTeam_t {
    team("ncclTeamLsa", comm, lsa)
}
#[no_mangle]
pub extern "C" fn ncclTeamRail(comm: ncclComm_t) -> ncclTeam_t {
    team("ncclTeamRail", comm, rail)
}
#[no_mangle]
pub extern "C" fn pncclTeamRail(comm: ncclComm_t) -> ncclTeam_t {
    team("ncclTeamRail", comm, rail)
}

/// World rank of `rank` of team `tm`, whose member this communicator's rank is.
fn team_rank_to_world(c: ncclComm_t, tm: ncclTeam_t, rank: c_int) -> c_int {
    let mut out = -1;
    entry("ncclTeamRankToWorld", c, || {
        let c = comm(c)?;
        out = c.rank() + (rank - tm.rank) * tm.stride;
        Ok(())
    });
    out
}

#[no_mangle]
pub extern "C" fn ncclTeamRankToWorld(comm: ncclComm_t, tm: ncclTeam_t, rank: c_int) -> c_int {
    team_rank_to_world(comm, tm, rank)
}
#[no_mangle]
pub extern "C" fn pncclTeamRankToWorld(comm: ncclComm_t, tm: ncclTeam_t, rank: c_int) -> c_int {
    team_rank_to_world(comm, tm, rank)
}

/// LSA-team rank of `rank` of team `tm`.
fn team_rank_to_lsa(c: ncclComm_t, tm: ncclTeam_t, rank: c_int) -> c_int {
    let mut out = -1;
    entry("ncclTeamRankToLsa", c, || {
        let c = comm(c)?;
        out = c.local_rank.load(Relaxed) + (rank - tm.rank) * tm.stride;
        Ok(())
    });
    out
}

#[no_mangle]
pub extern "C" fn ncclTeamRankToLsa(comm: ncclComm_t, tm: ncclTeam_t, rank: c_int) -> c_int {
    team_rank_to_lsa(comm, tm, rank)
}
#[no_mangle]
pub extern "C" fn pncclTeamRankToLsa(comm: ncclComm_t, tm: ncclTeam_t, rank: c_int) -> c_int {
    team_rank_to_lsa(comm, tm, rank)
}

fn lsa_barrier_req(
    _tm: ncclTeam_t,
    n: c_int,
    handle: *mut ncclLsaBarrierHandle,
    req: *mut ncclDevResourceRequirements,
) -> ncclResult_t {
    entry(
        "ncclLsaBarrierCreateRequirement",
        std::ptr::null_mut(),
        || {
            out_ptr(handle, "outHandle")?;
            out_ptr(req, "outReq")?;
            if n < 0 {
                return Err(Error::invalid_argument(format!(
                    "nBarriers {n} is negative"
                )));
            }
            Err(Error::unsupported(
                "ncclLsaBarrierCreateRequirement (the device API)",
            ))
        },
    )
}

#[no_mangle]
pub extern "C" fn ncclLsaBarrierCreateRequirement(
    team: ncclTeam_t,
    nBarriers: c_int,
    outHandle: *mut ncclLsaBarrierHandle,
    outReq: *mut ncclDevResourceRequirements,
) -> ncclResult_t {
    lsa_barrier_req(team, nBarriers, outHandle, outReq)
}
#[no_mangle]
pub extern "C" fn pncclLsaBarrierCreateRequirement(
    team: ncclTeam_t,
    nBarriers: c_int,
    outHandle: *mut ncclLsaBarrierHandle,
    outReq: *mut ncclDevResourceRequirements,
) -> ncclResult_t {
    lsa_barrier_req(team, nBarriers, outHandle, outReq)
}

fn gin_barrier_req(
    c: ncclComm_t,
    _tm: ncclTeam_t,
    n: c_int,
    handle: *mut ncclGinBarrierHandle,
    req: *mut ncclDevResourceRequirements,
) -> ncclResult_t {
    entry("ncclGinBarrierCreateRequirement", c, || {
        comm(c)?;
        out_ptr(handle, "outHandle")?;
        out_ptr(req, "outReq")?;
        if n < 0 {
            return Err(Error::invalid_argument(format!(
                "nBarriers {n} is negative"
            )));
        }
        Err(Error::unsupported(
            "ncclGinBarrierCreateRequirement (the device API)",
        ))
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
    gin_barrier_req(comm, team, nBarriers, outHandle, outReq)
}
#[no_mangle]
pub extern "C" fn pncclGinBarrierCreateRequirement(
    comm: ncclComm_t,
    team: ncclTeam_t,
    nBarriers: c_int,
    outHandle: *mut ncclGinBarrierHandle,
    outReq: *mut ncclDevResourceRequirements,
) -> ncclResult_t {
    gin_barrier_req(comm, team, nBarriers, outHandle, outReq)
}

fn lla2a_req(
    blocks: c_int,
    slots: c_int,
    handle: *mut ncclLLA2AHandle,
    req: *mut ncclDevResourceRequirements,
) -> ncclResult_t {
    entry("ncclLLA2ACreateRequirement", std::ptr::null_mut(), || {
        out_ptr(handle, "outHandle")?;
        out_ptr(req, "outReq")?;
        if blocks < 1 || slots < 1 {
            return Err(Error::invalid_argument(format!(
                "nBlocks {blocks} and nSlots {slots} must be positive"
            )));
        }
        Err(Error::unsupported(
            "ncclLLA2ACreateRequirement (the device API)",
        ))
    })
}

#[no_mangle]
pub extern "C" fn ncclLLA2ACreateRequirement(
    nBlocks: c_int,
    nSlots: c_int,
    outHandle: *mut ncclLLA2AHandle,
    outReq: *mut ncclDevResourceRequirements,
) -> ncclResult_t {
    lla2a_req(nBlocks, nSlots, outHandle, outReq)
}
#[no_mangle]
pub extern "C" fn pncclLLA2ACreateRequirement(
    nBlocks: c_int,
    nSlots: c_int,
    outHandle: *mut ncclLLA2AHandle,
    outReq: *mut ncclDevResourceRequirements,
) -> ncclResult_t {
    lla2a_req(nBlocks, nSlots, outHandle, outReq)
}

/// Slots an LL all-to-all needs: one 16-byte LL packet carries 8 bytes of payload, so each
/// element takes `ceil(maxEltSize / 8)` slots. Negative inputs give 0.
fn lla2a_calc_slots(max_elts: c_int, max_elt_size: c_int) -> c_int {
    if max_elts <= 0 || max_elt_size <= 0 {
        return 0;
    }
    max_elts.saturating_mul((max_elt_size + 7) / 8)
}

#[no_mangle]
pub extern "C" fn ncclLLA2ACalcSlots(maxElts: c_int, maxEltSize: c_int) -> c_int {
    lla2a_calc_slots(maxElts, maxEltSize)
}
#[no_mangle]
pub extern "C" fn pncclLLA2ACalcSlots(maxElts: c_int, maxEltSize: c_int) -> c_int {
    lla2a_calc_slots(maxElts, maxEltSize)
}
