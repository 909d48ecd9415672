//! Point-to-point: `ncclSend` and `ncclRecv`.

use super::coll::{submit, Call};
use crate::abi::{cudaStream_t, ncclComm_t, ncclResult_t, RawDataType};
use crate::sched::CollKind;
use std::os::raw::{c_int, c_void};

fn send(
    sendbuff: *const c_void,
    count: usize,
    dtype: RawDataType,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let recvbuff = std::ptr::null_mut();
    submit(
        "ncclSend",
        Call {
            kind: CollKind::Send,
            sendbuff,
            recvbuff,
            count,
            dtype,
            op: None,
            root: peer,
            comm,
            stream,
        },
    )
}

fn recv(
    recvbuff: *mut c_void,
    count: usize,
    dtype: RawDataType,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let sendbuff = std::ptr::null();
    submit(
        "ncclRecv",
        Call {
            kind: CollKind::Recv,
            sendbuff,
            recvbuff,
            count,
            dtype,
            op: None,
            root: peer,
            comm,
            stream,
        },
    )
}

#[no_mangle]
pub extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: RawDataType,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    send(sendbuff, count, datatype, peer, comm, stream)
}
#[no_mangle]
pub extern "C" fn pncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: RawDataType,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    send(sendbuff, count, datatype, peer, comm, stream)
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
    recv(recvbuff, count, datatype, peer, comm, stream)
}
#[no_mangle]
pub extern "C" fn pncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: RawDataType,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    recv(recvbuff, count, datatype, peer, comm, stream)
}
