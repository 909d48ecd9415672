//! One-sided host operations on windows: `ncclPutSignal` writes into a peer's window and
//! raises a signal there, `ncclSignal` raises a signal alone, `ncclWaitSignal` waits on the
//! stream until the expected signals have arrived.

use super::{entry, export, find_comm};
use crate::abi::{
    cudaStream_t, ncclComm_t, ncclDataType_t, ncclResult_t, ncclWaitSignalDesc_t, ncclWindow_t,
    RawDataType,
};
use crate::core::window;
use crate::cuda::CUstream;
use crate::error::{Error, Result};
use std::os::raw::{c_int, c_uint, c_void};

/// The data type's size, or `ncclInvalidArgument` for an unknown type.
fn type_size(dtype: RawDataType) -> Result<usize> {
    ncclDataType_t::from_raw(dtype)
        .map(|t| t.size())
        .ok_or_else(|| Error::invalid_argument(format!("invalid type {}", dtype.0)))
}

/// `flags` are reserved: only 0 is accepted.
fn check_flags(flags: c_uint) -> Result<()> {
    if flags != 0 {
        return Err(Error::invalid_argument(format!(
            "flags {flags:#x} are reserved and must be 0"
        )));
    }
    Ok(())
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ncclPutSignal(
    localbuff: *const c_void,
    count: usize,
    datatype: RawDataType,
    peer: c_int,
    peerWin: ncclWindow_t,
    peerWinOffset: usize,
    sigIdx: c_int,
    ctx: c_int,
    flags: c_uint,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    export!(ncclPutSignal, name);
    entry(name, comm, || {
        let c = find_comm(comm)?;
        c.check_usable()?;
        check_flags(flags)?;
        let bytes = count
            .checked_mul(type_size(datatype)?)
            .ok_or_else(|| Error::invalid_argument(format!("count {count} is too large")))?;
        window::put_signal(
            &c,
            localbuff as u64,
            bytes,
            peer,
            peerWin,
            peerWinOffset,
            sigIdx,
            ctx,
            stream as CUstream,
        )
    })
}

#[no_mangle]
pub extern "C" fn ncclSignal(
    peer: c_int,
    sigIdx: c_int,
    ctx: c_int,
    flags: c_uint,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    export!(ncclSignal, name);
    entry(name, comm, || {
        let c = find_comm(comm)?;
        c.check_usable()?;
        check_flags(flags)?;
        window::signal(&c, peer, sigIdx, ctx, stream as CUstream)
    })
}

#[no_mangle]
pub extern "C" fn ncclWaitSignal(
    nDesc: c_int,
    signalDescs: *mut ncclWaitSignalDesc_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    export!(ncclWaitSignal, name);
    entry(name, comm, || {
        let c = find_comm(comm)?;
        c.check_usable()?;
        // As NVIDIA's: no descriptor at all is an invalid argument too.
        if nDesc <= 0 || signalDescs.is_null() {
            return Err(Error::invalid_argument(format!(
                "invalid arguments: nDesc {nDesc}, signalDescs {signalDescs:p}"
            )));
        }
        // SAFETY: the caller passes nDesc descriptors (NCCL's contract); read unaligned.
        let waits: Vec<window::WaitFor> = (0..nDesc as usize)
            .map(|i| unsafe { signalDescs.add(i).read_unaligned() })
            .map(|d| window::WaitFor {
                count: d.opCnt,
                peer: d.peer,
                sig: d.sigIdx,
                ctx: d.ctx,
            })
            .collect();
        window::wait_signals(&c, &waits, stream as CUstream)
    })
}
