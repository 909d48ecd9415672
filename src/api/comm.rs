//! Communicator lifecycle and queries, and user reduction ops.

use super::{entry, export, find_comm, out, Out};
use crate::abi::{
    ncclComm_t, ncclConfig_t, ncclDataType_t, ncclResult_t, ncclScalarResidence_t, ncclUniqueId,
    RawCommMemStat, RawDataType, RawRedOp, RawScalarResidence,
};
use crate::core::{lifecycle, redop::Scalar, Comm};
use crate::error::{Error, Result};
use std::os::raw::{c_int, c_void};

fn check_rank(nranks: c_int, rank: c_int) -> Result<()> {
    if nranks < 1 || rank < 0 || rank >= nranks {
        return Err(Error::invalid_argument(format!(
            "Invalid rank requested : {rank}/{nranks}"
        )));
    }
    Ok(())
}

/// The `newcomm` slot of a creation: checked, and NULL until the communicator exists.
fn new_comm_slot(p: *mut ncclComm_t) -> Result<Out<ncclComm_t>> {
    let slot = out(p, "newcomm")?;
    slot.write(std::ptr::null_mut());
    Ok(slot)
}

#[no_mangle]
pub extern "C" fn ncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    export!(ncclCommInitRankConfig, name);
    entry(name, std::ptr::null_mut(), || {
        let slot = new_comm_slot(comm)?;
        check_rank(nranks, rank)?;
        // SAFETY: config is NULL or the caller's initialised config (NCCL's contract).
        let cfg = unsafe { crate::core::config::read_user_config(config) }?;
        lifecycle::init_rank(slot.as_ptr(), nranks, &[commId], rank, cfg.as_ref())
    })
}

#[no_mangle]
pub extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    export!(ncclCommInitRank, name);
    entry(name, std::ptr::null_mut(), || {
        let slot = new_comm_slot(comm)?;
        check_rank(nranks, rank)?;
        lifecycle::init_rank(slot.as_ptr(), nranks, &[commId], rank, None)
    })
}

#[no_mangle]
pub extern "C" fn ncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    export!(ncclCommInitRankScalable, name);
    entry(name, std::ptr::null_mut(), || {
        let slot = new_comm_slot(newcomm)?;
        check_rank(nranks, myrank)?;
        if nId < 1 || nId > nranks || commIds.is_null() {
            return Err(Error::invalid_argument(format!(
                "nId {nId} must be in 1..={nranks} with a non-NULL commIds"
            )));
        }
        // SAFETY: the caller passes nId ids (NCCL's contract); nId >= 1 was checked.
        let ids = unsafe { std::slice::from_raw_parts(commIds, nId as usize) }.to_vec();
        // SAFETY: config is NULL or the caller's initialised config.
        let cfg = unsafe { crate::core::config::read_user_config(config) }?;
        lifecycle::init_rank(slot.as_ptr(), nranks, &ids, myrank, cfg.as_ref())
    })
}

#[no_mangle]
pub extern "C" fn ncclCommInitAll(
    comm: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> ncclResult_t {
    export!(ncclCommInitAll, name);
    entry(name, std::ptr::null_mut(), || {
        let first = out(comm, "comms")?;
        if ndev < 0 {
            return Err(Error::invalid_argument(format!(
                "Invalid device count requested : {ndev}"
            )));
        }
        if ndev == 0 {
            // NVIDIA's library creates nothing and succeeds.
            return Ok(());
        }
        let devs: Vec<i32> = if devlist.is_null() {
            (0..ndev).collect()
        } else {
            // SAFETY: the caller passes ndev device numbers (NCCL's contract).
            unsafe { std::slice::from_raw_parts(devlist, ndev as usize) }.to_vec()
        };
        // SAFETY: the caller provides room for ndev handles (NCCL's contract).
        let slots = unsafe { std::slice::from_raw_parts_mut(first.as_ptr(), ndev as usize) };
        slots.fill(std::ptr::null_mut());
        let handles = lifecycle::init_all(&devs)?;
        slots.copy_from_slice(&handles);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
    export!(ncclCommFinalize, name);
    entry(name, comm, || {
        if comm.is_null() {
            // NVIDIA's library accepts a NULL communicator here (as for destroy).
            return Ok(());
        }
        lifecycle::finalize(&find_comm(comm)?)
    })
}

#[no_mangle]
pub extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    export!(ncclCommDestroy, name);
    entry(name, comm, || {
        if comm.is_null() {
            // NVIDIA's library accepts a NULL communicator here.
            return Ok(());
        }
        lifecycle::destroy(comm, false)
    })
}

#[no_mangle]
pub extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    export!(ncclCommAbort, name);
    entry(name, comm, || {
        if comm.is_null() {
            return Ok(());
        }
        lifecycle::destroy(comm, true)
    })
}

#[no_mangle]
pub extern "C" fn ncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) -> ncclResult_t {
    export!(ncclCommRevoke, name);
    entry(name, comm, || {
        // NVIDIA's order: a NULL communicator is accepted, then the flags are checked.
        if comm.is_null() {
            return Ok(());
        }
        if revokeFlags != 0 {
            return Err(Error::invalid_argument(format!(
                "revokeFlags must be NCCL_REVOKE_DEFAULT (0), got {revokeFlags}"
            )));
        }
        lifecycle::revoke(&find_comm(comm)?)
    })
}

#[no_mangle]
pub extern "C" fn ncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    export!(ncclCommSplit, name);
    entry(name, comm, || {
        let parent = find_comm(comm)?;
        let slot = new_comm_slot(newcomm)?;
        if color < 0 && color != crate::abi::NCCL_SPLIT_NOCOLOR {
            return Err(Error::invalid_argument(format!(
                "color {color} must be >= 0 or NCCL_SPLIT_NOCOLOR"
            )));
        }
        // SAFETY: config is NULL or the caller's initialised config.
        let cfg = unsafe { crate::core::config::read_user_config(config) }?;
        lifecycle::split(&parent, color, key, slot.as_ptr(), cfg.as_ref())
    })
}

#[no_mangle]
pub extern "C" fn ncclCommShrink(
    comm: ncclComm_t,
    excludeRanksList: *mut c_int,
    excludeRanksCount: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrinkFlags: c_int,
) -> ncclResult_t {
    export!(ncclCommShrink, name);
    entry(name, comm, || {
        let parent = find_comm(comm)?;
        let slot = new_comm_slot(newcomm)?;
        let n_exclude = excludeRanksCount;
        if n_exclude < 0 || (n_exclude > 0 && excludeRanksList.is_null()) {
            return Err(Error::invalid_argument(format!(
                "excludeRanksList is NULL or excludeRanksCount {n_exclude} is negative"
            )));
        }
        if shrinkFlags & !crate::abi::NCCL_SHRINK_ABORT != 0 {
            return Err(Error::invalid_argument(format!(
                "unknown shrinkFlags {shrinkFlags:#x}"
            )));
        }
        let list = if n_exclude == 0 {
            Vec::new()
        } else {
            // SAFETY: the caller passes n_exclude ranks (NCCL's contract).
            unsafe { std::slice::from_raw_parts(excludeRanksList, n_exclude as usize) }.to_vec()
        };
        // SAFETY: config is NULL or the caller's initialised config.
        let cfg = unsafe { crate::core::config::read_user_config(config) }?;
        lifecycle::shrink(&parent, &list, slot.as_ptr(), cfg.as_ref(), shrinkFlags)
    })
}

#[no_mangle]
pub extern "C" fn ncclCommGetAsyncError(
    comm: ncclComm_t,
    asyncError: *mut ncclResult_t,
) -> ncclResult_t {
    export!(ncclCommGetAsyncError, name);
    entry(name, comm, || {
        let c = find_comm(comm)?;
        let code = c.async_error();
        out(asyncError, "asyncError")?.write(code);
        // Callers that then ask ncclGetLastError(NULL) (PyTorch) get the reason, as with
        // NVIDIA's library, whose WARN lines set the thread's last error.
        if !matches!(
            code,
            ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress
        ) {
            if let Some(text) = c.last_error.text() {
                crate::error::set_thread_last_error(&text);
            }
        }
        Ok(())
    })
}

/// Shared body of the three integer queries.
fn query(
    name: &str,
    c: ncclComm_t,
    value: *mut c_int,
    what: &str,
    get: fn(&Comm) -> c_int,
) -> ncclResult_t {
    entry(name, c, || {
        let c = find_comm(c)?;
        out(value, what)?.write(get(&c));
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    export!(ncclCommCount, name);
    query(name, comm, count, "count", |c| c.nranks())
}

#[no_mangle]
pub extern "C" fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    export!(ncclCommCuDevice, name);
    query(name, comm, device, "device", |c| c.cuda_dev)
}

#[no_mangle]
pub extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    export!(ncclCommUserRank, name);
    query(name, comm, rank, "rank", |c| c.rank())
}

#[no_mangle]
pub extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut RawRedOp,
    scalar: *mut c_void,
    datatype: RawDataType,
    residence: RawScalarResidence,
    comm: ncclComm_t,
) -> ncclResult_t {
    export!(ncclRedOpCreatePreMulSum, name);
    entry(name, comm, || {
        let c = find_comm(comm)?;
        let op = out(op, "op")?;
        if scalar.is_null() {
            return Err(Error::invalid_argument("scalar argument is NULL"));
        }
        let dtype = ncclDataType_t::from_raw(datatype)
            .ok_or_else(|| Error::invalid_argument(format!("invalid datatype {}", datatype.0)))?;
        let scalar = match residence.0 {
            r if r == ncclScalarResidence_t::ncclScalarHostImmediate as c_int => {
                let mut bytes = [0u8; 8];
                // SAFETY: the caller's scalar holds one value of `dtype` (NCCL's contract).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        scalar as *const u8,
                        bytes.as_mut_ptr(),
                        dtype.size(),
                    )
                };
                Scalar::Host(bytes)
            }
            r if r == ncclScalarResidence_t::ncclScalarDevice as c_int => {
                Scalar::Device(scalar as u64)
            }
            r => {
                return Err(Error::invalid_argument(format!(
                    "invalid scalar residence {r}"
                )))
            }
        };
        op.write(c.redops.create(dtype, scalar));
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclRedOpDestroy(op: RawRedOp, comm: ncclComm_t) -> ncclResult_t {
    export!(ncclRedOpDestroy, name);
    entry(name, comm, || find_comm(comm)?.redops.destroy(op))
}

#[no_mangle]
pub extern "C" fn ncclCommGetUniqueId(
    comm: ncclComm_t,
    uniqueId: *mut ncclUniqueId,
) -> ncclResult_t {
    export!(ncclCommGetUniqueId, name);
    entry(name, comm, || {
        let c = find_comm(comm)?;
        let slot = out(uniqueId, "uniqueId")?;
        c.check_usable()?;
        slot.write(crate::core::grow::unique_id(&c)?);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclCommGrow(
    comm: ncclComm_t,
    nRanks: c_int,
    uniqueId: *const ncclUniqueId,
    rank: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    export!(ncclCommGrow, name);
    entry(name, comm, || {
        let slot = new_comm_slot(newcomm)?;
        // SAFETY: config is NULL or the caller's initialised config (NCCL's contract).
        let cfg = unsafe { crate::core::config::read_user_config(config) }?;
        // SAFETY: uniqueId is NULL or points to the caller's id (NCCL's contract).
        let id = (!uniqueId.is_null()).then(|| unsafe { uniqueId.read_unaligned() });
        let parent = if comm.is_null() {
            None
        } else {
            Some(find_comm(comm)?)
        };
        crate::core::grow::grow(parent, nRanks, id, rank, slot.as_ptr(), cfg.as_ref())
    })
}

#[no_mangle]
pub extern "C" fn ncclCommSuspend(comm: ncclComm_t, flags: c_int) -> ncclResult_t {
    export!(ncclCommSuspend, name);
    entry(name, comm, || {
        let c = find_comm(comm)?;
        c.check_usable()?;
        // It meets the other ranks: inside a group it runs at the group's end, beside theirs.
        crate::core::group::submit_init(crate::core::group::InitWork {
            blocking: true,
            run: Box::new(move || crate::core::memory::suspend(&c, flags)),
        })
    })
}

#[no_mangle]
pub extern "C" fn ncclCommResume(comm: ncclComm_t) -> ncclResult_t {
    export!(ncclCommResume, name);
    entry(name, comm, || {
        let c = find_comm(comm)?;
        c.check_live()?;
        crate::core::memory::resume(&c)
    })
}

#[no_mangle]
pub extern "C" fn ncclCommMemStats(
    comm: ncclComm_t,
    stat: RawCommMemStat,
    value: *mut u64,
) -> ncclResult_t {
    export!(ncclCommMemStats, name);
    entry(name, comm, || {
        let c = find_comm(comm)?;
        let value = out(value, "value")?;
        value.write(crate::core::memory::stat(&c, stat.0)?);
        Ok(())
    })
}
