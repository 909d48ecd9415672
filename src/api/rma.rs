//! One-sided host operations on windows: `ncclPutSignal` writes into a peer's window and
//! raises a signal there, `ncclSignal` raises a signal alone, `ncclWaitSignal` waits on the
//! stream until the expected signals have arrived.

use super::{entry, export, find_comm};
use crate::abi::{
    cudaStream_t, ncclComm_t, ncclResult_t, ncclWaitSignalDesc_t, ncclWindow_t, RawDataType,
};
use crate::error::Error;
use std::os::raw::{c_int, c_uint, c_void};

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
    let _ = (
        localbuff,
        count,
        datatype,
        peer,
        peerWin,
        peerWinOffset,
        sigIdx,
        ctx,
        flags,
        stream,
    );
    entry(name, comm, || {
        let c = find_comm(comm)?;
        c.check_usable()?;
        Err(Error::unsupported(name))
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
    let _ = (peer, sigIdx, ctx, flags, stream);
    entry(name, comm, || {
        let c = find_comm(comm)?;
        c.check_usable()?;
        Err(Error::unsupported(name))
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
    let _ = (nDesc, signalDescs, stream);
    entry(name, comm, || {
        let c = find_comm(comm)?;
        c.check_usable()?;
        Err(Error::unsupported(name))
    })
}
