//! Point-to-point: `ncclSend` and `ncclRecv`.

use super::coll::{submit, Call};
use super::export;
use crate::abi::{cudaStream_t, ncclComm_t, ncclResult_t, RawDataType};
use crate::sched::CollKind;
use std::os::raw::{c_int, c_void};

#[no_mangle]
pub extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: RawDataType,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    export!(ncclSend, name);
    submit(
        name,
        Call {
            kind: CollKind::Send,
            sendbuff,
            recvbuff: std::ptr::null_mut(),
            count,
            dtype: datatype,
            op: None,
            root: peer,
            comm,
            stream,
        },
    )
}

#[no_mangle]
pub extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: RawDataType,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    export!(ncclRecv, name);
    submit(
        name,
        Call {
            kind: CollKind::Recv,
            sendbuff: std::ptr::null(),
            recvbuff,
            count,
            dtype: datatype,
            op: None,
            root: peer,
            comm,
            stream,
        },
    )
}
