//! Communicator lifecycle and queries, and user reduction ops.

use super::{comm, entry, out_ptr};
use crate::abi::{
    ncclComm_t, ncclConfig_t, ncclDataType_t, ncclResult_t, ncclScalarResidence_t, ncclUniqueId,
    RawDataType, RawRedOp, RawScalarResidence,
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

/// Store a new handle (NULL stays NULL) in the caller's out-pointer.
fn put_comm(out: *mut ncclComm_t, handle: ncclComm_t) {
    // SAFETY: callers checked `out` is non-NULL; the caller provides a writable handle slot.
    unsafe { *out = handle };
}

fn init_rank_config(
    out: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
    cfg: *mut ncclConfig_t,
) -> ncclResult_t {
    entry("ncclCommInitRankConfig", std::ptr::null_mut(), || {
        out_ptr(out, "newcomm")?;
        put_comm(out, std::ptr::null_mut());
        check_rank(nranks, rank)?;
        // SAFETY: cfg is NULL or the caller's initialised config (NCCL's contract).
        let cfg = unsafe { crate::core::config::read_user_config(cfg) }?;
        lifecycle::init_rank(out, nranks, &[id], rank, cfg.as_ref())
    })
}

#[no_mangle]
pub extern "C" fn ncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    init_rank_config(comm, nranks, commId, rank, config)
}
#[no_mangle]
pub extern "C" fn pncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    init_rank_config(comm, nranks, commId, rank, config)
}

fn init_rank(out: *mut ncclComm_t, nranks: c_int, id: ncclUniqueId, rank: c_int) -> ncclResult_t {
    entry("ncclCommInitRank", std::ptr::null_mut(), || {
        out_ptr(out, "newcomm")?;
        put_comm(out, std::ptr::null_mut());
        check_rank(nranks, rank)?;
        lifecycle::init_rank(out, nranks, &[id], rank, None)
    })
}

#[no_mangle]
pub extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    init_rank(comm, nranks, commId, rank)
}
#[no_mangle]
pub extern "C" fn pncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    init_rank(comm, nranks, commId, rank)
}

fn init_rank_scalable(
    out: *mut ncclComm_t,
    nranks: c_int,
    rank: c_int,
    n_id: c_int,
    ids: *mut ncclUniqueId,
    cfg: *mut ncclConfig_t,
) -> ncclResult_t {
    entry("ncclCommInitRankScalable", std::ptr::null_mut(), || {
        out_ptr(out, "newcomm")?;
        put_comm(out, std::ptr::null_mut());
        check_rank(nranks, rank)?;
        if n_id < 1 || n_id > nranks || ids.is_null() {
            return Err(Error::invalid_argument(format!(
                "nId {n_id} must be in 1..={nranks} with a non-NULL commIds"
            )));
        }
        // SAFETY: the caller passes nId ids (NCCL's contract); n_id >= 1 was checked.
        let ids = unsafe { std::slice::from_raw_parts(ids, n_id as usize) }.to_vec();
        // SAFETY: cfg is NULL or the caller's initialised config.
        let cfg = unsafe { crate::core::config::read_user_config(cfg) }?;
        lifecycle::init_rank(out, nranks, &ids, rank, cfg.as_ref())
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
    init_rank_scalable(newcomm, nranks, myrank, nId, commIds, config)
}
#[no_mangle]
pub extern "C" fn pncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    init_rank_scalable(newcomm, nranks, myrank, nId, commIds, config)
}

fn init_all(out: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t {
    entry("ncclCommInitAll", std::ptr::null_mut(), || {
        out_ptr(out, "comms")?;
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
        let slots = unsafe { std::slice::from_raw_parts_mut(out, ndev as usize) };
        slots.fill(std::ptr::null_mut());
        let handles = lifecycle::init_all(&devs)?;
        slots.copy_from_slice(&handles);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclCommInitAll(
    comm: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> ncclResult_t {
    init_all(comm, ndev, devlist)
}
#[no_mangle]
pub extern "C" fn pncclCommInitAll(
    comm: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> ncclResult_t {
    init_all(comm, ndev, devlist)
}

fn finalize(c: ncclComm_t) -> ncclResult_t {
    entry("ncclCommFinalize", c, || {
        if c.is_null() {
            // NVIDIA's library accepts a NULL communicator here (as for destroy).
            return Ok(());
        }
        lifecycle::finalize(&comm(c)?)
    })
}

#[no_mangle]
pub extern "C" fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
    finalize(comm)
}
#[no_mangle]
pub extern "C" fn pncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
    finalize(comm)
}

fn destroy(c: ncclComm_t) -> ncclResult_t {
    entry("ncclCommDestroy", c, || {
        if c.is_null() {
            // NVIDIA's library accepts a NULL communicator here.
            return Ok(());
        }
        lifecycle::destroy(c, false)
    })
}

#[no_mangle]
pub extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    destroy(comm)
}
#[no_mangle]
pub extern "C" fn pncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    destroy(comm)
}

fn abort(c: ncclComm_t) -> ncclResult_t {
    entry("ncclCommAbort", c, || {
        if c.is_null() {
            return Ok(());
        }
        lifecycle::destroy(c, true)
    })
}

#[no_mangle]
pub extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    abort(comm)
}
#[no_mangle]
pub extern "C" fn pncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    abort(comm)
}

fn revoke(c: ncclComm_t, flags: c_int) -> ncclResult_t {
    entry("ncclCommRevoke", c, || {
        // NVIDIA's order: a NULL communicator is accepted, then the flags are checked.
        if c.is_null() {
            return Ok(());
        }
        if flags != 0 {
            return Err(Error::invalid_argument(format!(
                "revokeFlags must be NCCL_REVOKE_DEFAULT (0), got {flags}"
            )));
        }
        let c = comm(c)?;
        lifecycle::revoke(&c)
    })
}

#[no_mangle]
pub extern "C" fn ncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) -> ncclResult_t {
    revoke(comm, revokeFlags)
}
#[no_mangle]
pub extern "C" fn pncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) -> ncclResult_t {
    revoke(comm, revokeFlags)
}

fn split(
    c: ncclComm_t,
    color: c_int,
    key: c_int,
    out: *mut ncclComm_t,
    cfg: *mut ncclConfig_t,
) -> ncclResult_t {
    entry("ncclCommSplit", c, || {
        let parent = comm(c)?;
        out_ptr(out, "newcomm")?;
        put_comm(out, std::ptr::null_mut());
        if color < 0 && color != crate::abi::NCCL_SPLIT_NOCOLOR {
            return Err(Error::invalid_argument(format!(
                "color {color} must be >= 0 or NCCL_SPLIT_NOCOLOR"
            )));
        }
        // SAFETY: cfg is NULL or the caller's initialised config.
        let cfg = unsafe { crate::core::config::read_user_config(cfg) }?;
        lifecycle::split(&parent, color, key, out, cfg.as_ref())
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
    split(comm, color, key, newcomm, config)
}
#[no_mangle]
pub extern "C" fn pncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    split(comm, color, key, newcomm, config)
}

fn shrink(
    c: ncclComm_t,
    exclude: *mut c_int,
    n_exclude: c_int,
    out: *mut ncclComm_t,
    cfg: *mut ncclConfig_t,
    flags: c_int,
) -> ncclResult_t {
    entry("ncclCommShrink", c, || {
        let parent = comm(c)?;
        out_ptr(out, "newcomm")?;
        put_comm(out, std::ptr::null_mut());
        if n_exclude < 0 || (n_exclude > 0 && exclude.is_null()) {
            return Err(Error::invalid_argument(format!(
                "excludeRanksList is NULL or excludeRanksCount {n_exclude} is negative"
            )));
        }
        if flags & !crate::abi::NCCL_SHRINK_ABORT != 0 {
            return Err(Error::invalid_argument(format!(
                "unknown shrinkFlags {flags:#x}"
            )));
        }
        let list = if n_exclude == 0 {
            Vec::new()
        } else {
            // SAFETY: the caller passes n_exclude ranks (NCCL's contract).
            unsafe { std::slice::from_raw_parts(exclude, n_exclude as usize) }.to_vec()
        };
        // SAFETY: cfg is NULL or the caller's initialised config.
        let cfg = unsafe { crate::core::config::read_user_config(cfg) }?;
        lifecycle::shrink(&parent, &list, out, cfg.as_ref(), flags)
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
    shrink(
        comm,
        excludeRanksList,
        excludeRanksCount,
        newcomm,
        config,
        shrinkFlags,
    )
}
#[no_mangle]
pub extern "C" fn pncclCommShrink(
    comm: ncclComm_t,
    excludeRanksList: *mut c_int,
    excludeRanksCount: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrinkFlags: c_int,
) -> ncclResult_t {
    shrink(
        comm,
        excludeRanksList,
        excludeRanksCount,
        newcomm,
        config,
        shrinkFlags,
    )
}

fn get_async_error(c: ncclComm_t, out: *mut ncclResult_t) -> ncclResult_t {
    entry("ncclCommGetAsyncError", c, || {
        let c = comm(c)?;
        out_ptr(out, "asyncError")?;
        // SAFETY: checked non-NULL; writes one valid enum value.
        unsafe { *out = c.async_error() };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclCommGetAsyncError(
    comm: ncclComm_t,
    asyncError: *mut ncclResult_t,
) -> ncclResult_t {
    get_async_error(comm, asyncError)
}
#[no_mangle]
pub extern "C" fn pncclCommGetAsyncError(
    comm: ncclComm_t,
    asyncError: *mut ncclResult_t,
) -> ncclResult_t {
    get_async_error(comm, asyncError)
}

/// Shared body of the three integer queries.
fn query(
    name: &str,
    c: ncclComm_t,
    out: *mut c_int,
    what: &str,
    get: fn(&Comm) -> c_int,
) -> ncclResult_t {
    entry(name, c, || {
        let c = comm(c)?;
        out_ptr(out, what)?;
        // SAFETY: checked non-NULL; writes one int.
        unsafe { *out = get(&c) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    query("ncclCommCount", comm, count, "count", |c| c.nranks())
}
#[no_mangle]
pub extern "C" fn pncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    query("ncclCommCount", comm, count, "count", |c| c.nranks())
}
#[no_mangle]
pub extern "C" fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    query("ncclCommCuDevice", comm, device, "device", |c| c.cuda_dev)
}
#[no_mangle]
pub extern "C" fn pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    query("ncclCommCuDevice", comm, device, "device", |c| c.cuda_dev)
}
#[no_mangle]
pub extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    query("ncclCommUserRank", comm, rank, "rank", |c| c.rank())
}
#[no_mangle]
pub extern "C" fn pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    query("ncclCommUserRank", comm, rank, "rank", |c| c.rank())
}

fn create_pre_mul_sum(
    op: *mut RawRedOp,
    scalar: *mut c_void,
    dtype: RawDataType,
    residence: RawScalarResidence,
    c: ncclComm_t,
) -> ncclResult_t {
    entry("ncclRedOpCreatePreMulSum", c, || {
        let c = comm(c)?;
        out_ptr(op, "op")?;
        if scalar.is_null() {
            return Err(Error::invalid_argument("scalar argument is NULL"));
        }
        let dtype = ncclDataType_t::from_raw(dtype)
            .ok_or_else(|| Error::invalid_argument(format!("invalid datatype {}", dtype.0)))?;
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
        let handle = c.redops.create(dtype, scalar);
        // SAFETY: checked non-NULL; writes one op handle.
        unsafe { *op = handle };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut RawRedOp,
    scalar: *mut c_void,
    datatype: RawDataType,
    residence: RawScalarResidence,
    comm: ncclComm_t,
) -> ncclResult_t {
    create_pre_mul_sum(op, scalar, datatype, residence, comm)
}
#[no_mangle]
pub extern "C" fn pncclRedOpCreatePreMulSum(
    op: *mut RawRedOp,
    scalar: *mut c_void,
    datatype: RawDataType,
    residence: RawScalarResidence,
    comm: ncclComm_t,
) -> ncclResult_t {
    create_pre_mul_sum(op, scalar, datatype, residence, comm)
}

fn red_op_destroy(op: RawRedOp, c: ncclComm_t) -> ncclResult_t {
    entry("ncclRedOpDestroy", c, || comm(c)?.redops.destroy(op))
}

#[no_mangle]
pub extern "C" fn ncclRedOpDestroy(op: RawRedOp, comm: ncclComm_t) -> ncclResult_t {
    red_op_destroy(op, comm)
}
#[no_mangle]
pub extern "C" fn pncclRedOpDestroy(op: RawRedOp, comm: ncclComm_t) -> ncclResult_t {
    red_op_destroy(op, comm)
}
