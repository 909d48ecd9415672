//! Host functions of NCCL's device API (`nccl_device/*.h`). Teams are plain arithmetic over
//! the communicator and work now; device communicators, barriers and the LL all-to-all need
//! symmetric memory windows, which oxccl has not built: those return `ncclInvalidUsage`.

use super::{entry, export, find_comm, out};
use crate::abi::{
    ncclCftLeId, ncclCftTeamMode_t, ncclCommProperties_t, ncclComm_t, ncclDevComm,
    ncclDevCommRequirements, ncclDevResourceRequirements, ncclGinBarrierHandle,
    ncclGinInboxA2AHandle, ncclGinOutboxHandle, ncclLLA2AHandle, ncclLsaBarrierHandle,
    ncclMultimemHandle_t, ncclResult_t, ncclTeam_t, ncclWindow_t,
};
use crate::error::Error;
use std::os::raw::{c_int, c_void};
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

/// The CFT load/store endpoint queries: the arguments are checked, then NVIDIA's answer on an
/// H200 (no CFT).
fn le_info(
    name: &str,
    window: ncclWindow_t,
    leId: *mut ncclCftLeId,
    leOffset: *mut usize,
) -> ncclResult_t {
    entry(name, std::ptr::null_mut(), || {
        out(leId, "leId")?;
        out(leOffset, "leOffset")?;
        crate::core::window::find(window)?;
        Err(no_hardware("CFT"))
    })
}

/// A call that needs hardware oxccl does not drive (NVLink multicast, GIN or CFT): NVIDIA's
/// answer on an H200 with NVLS off is `ncclInvalidArgument`.
fn no_hardware(what: &str) -> Error {
    Error::invalid_argument(format!("{what} is not available (oxccl does not drive it)"))
}

#[no_mangle]
pub extern "C" fn ncclCommQueryProperties(
    comm: ncclComm_t,
    props: *mut ncclCommProperties_t,
) -> ncclResult_t {
    export!(ncclCommQueryProperties, name);
    entry(name, comm, || {
        let c = find_comm(comm)?;
        out(props, "props")?;
        // SAFETY: props is non-NULL and the caller's initialised struct (NCCL's contract).
        unsafe { crate::core::window::query_properties(&c, props) }
    })
}

#[no_mangle]
pub extern "C" fn ncclGetLsaMultimemDevicePointer(
    window: ncclWindow_t,
    offset: usize,
    outPtr: *mut *mut c_void,
) -> ncclResult_t {
    export!(ncclGetLsaMultimemDevicePointer, name);
    let _ = offset;
    entry(name, std::ptr::null_mut(), || {
        let slot = out(outPtr, "outPtr")?;
        crate::core::window::find(window)?;
        // As NVIDIA's without NVLink multicast: success and a NULL pointer, said here too.
        slot.write(std::ptr::null_mut());
        crate::error::set_thread_last_error(&format!(
            "{name}: NVLink multicast is not available (oxccl does not drive it): the pointer is NULL"
        ));
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclGetMultimemDevicePointer(
    window: ncclWindow_t,
    offset: usize,
    multimem: ncclMultimemHandle_t,
    outPtr: *mut *mut c_void,
) -> ncclResult_t {
    export!(ncclGetMultimemDevicePointer, name);
    let _ = (offset, multimem);
    entry(name, std::ptr::null_mut(), || {
        out(outPtr, "outPtr")?;
        crate::core::window::find(window)?;
        Err(no_hardware("NVLink multicast"))
    })
}

#[no_mangle]
pub extern "C" fn ncclGetLsaDevicePointer(
    window: ncclWindow_t,
    offset: usize,
    lsaRank: c_int,
    outPtr: *mut *mut c_void,
) -> ncclResult_t {
    export!(ncclGetLsaDevicePointer, name);
    entry(name, std::ptr::null_mut(), || {
        let out = out(outPtr, "outPtr")?;
        let w = crate::core::window::find(window)?;
        out.write(w.lsa_pointer(offset, lsaRank)? as *mut c_void);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclGetPeerDevicePointer(
    window: ncclWindow_t,
    offset: usize,
    peer: c_int,
    outPtr: *mut *mut c_void,
) -> ncclResult_t {
    export!(ncclGetPeerDevicePointer, name);
    entry(name, std::ptr::null_mut(), || {
        let out = out(outPtr, "outPtr")?;
        let w = crate::core::window::find(window)?;
        out.write(w.peer_pointer(offset, peer)? as *mut c_void);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclGetMultimemDeviceLeInfo(
    window: ncclWindow_t,
    offset: usize,
    leId: *mut ncclCftLeId,
    leOffset: *mut usize,
) -> ncclResult_t {
    export!(ncclGetMultimemDeviceLeInfo, name);
    let _ = offset;
    le_info(name, window, leId, leOffset)
}

#[no_mangle]
pub extern "C" fn ncclGetCftDeviceLeInfo(
    window: ncclWindow_t,
    offset: usize,
    peerCft: c_int,
    cftTeam: ncclTeam_t,
    leId: *mut ncclCftLeId,
    leOffset: *mut usize,
) -> ncclResult_t {
    export!(ncclGetCftDeviceLeInfo, name);
    let _ = (offset, peerCft, cftTeam);
    le_info(name, window, leId, leOffset)
}

#[no_mangle]
pub extern "C" fn ncclGetPeerDeviceLeInfo(
    window: ncclWindow_t,
    offset: usize,
    peerWorld: c_int,
    leId: *mut ncclCftLeId,
    leOffset: *mut usize,
) -> ncclResult_t {
    export!(ncclGetPeerDeviceLeInfo, name);
    let _ = (offset, peerWorld);
    le_info(name, window, leId, leOffset)
}

#[no_mangle]
pub extern "C" fn ncclTeamCft(comm: ncclComm_t, mode: ncclCftTeamMode_t) -> ncclTeam_t {
    export!(ncclTeamCft, name);
    let _ = mode;
    // Without CFT every rank is a team of its own, as NVIDIA's answers on an H200.
    team(name, comm, |_| ncclTeam_t {
        nRanks: 1,
        rank: 0,
        stride: 1,
    })
}

#[no_mangle]
pub extern "C" fn ncclTeamCftMultimem(comm: ncclComm_t) -> ncclTeam_t {
    export!(ncclTeamCftMultimem, name);
    team(name, comm, |_| ncclTeam_t {
        nRanks: 1,
        rank: 0,
        stride: 1,
    })
}

#[no_mangle]
pub extern "C" fn ncclGinOutboxCreateRequirement(
    nBlocks: c_int,
    size_log2: c_int,
    outHandle: *mut ncclGinOutboxHandle,
    outReq: *mut ncclDevResourceRequirements,
) -> ncclResult_t {
    export!(ncclGinOutboxCreateRequirement, name);
    let _ = (nBlocks, size_log2);
    entry(name, std::ptr::null_mut(), || {
        out(outHandle, "outHandle")?;
        out(outReq, "outReq")?;
        Err(device_api(name))
    })
}

#[no_mangle]
pub extern "C" fn ncclGinInboxA2ACreateRequirement(
    peers: ncclTeam_t,
    nBlocks: c_int,
    size_log2: c_int,
    outHandle: *mut ncclGinInboxA2AHandle,
    outReq: *mut ncclDevResourceRequirements,
) -> ncclResult_t {
    export!(ncclGinInboxA2ACreateRequirement, name);
    let _ = (peers, nBlocks, size_log2);
    entry(name, std::ptr::null_mut(), || {
        out(outHandle, "outHandle")?;
        out(outReq, "outReq")?;
        Err(device_api(name))
    })
}
