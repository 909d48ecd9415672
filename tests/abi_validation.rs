//! Argument validation of the C entry points on a live communicator, without a GPU: a
//! communicator is registered directly (no transport), and every call here must fail its
//! argument checks with NVIDIA 2.28.9's code before anything would touch a device.
//! (ffi-tests/bad_inputs.c covers NULL and garbage communicators through the C ABI.)

use nccl::abi::{ncclComm_t, ncclResult_t, RawDataType, RawRedOp, RawScalarResidence};
use nccl::api::{coll, comm as comm_api, mem, p2p};
use nccl::core::{Comm, CommConfig};
use std::os::raw::{c_int, c_void};
use std::sync::Arc;

use ncclResult_t::{ncclInvalidArgument, ncclSuccess};

/// A registered two-rank communicator (rank 0) that has no transport.
fn fake_comm() -> ncclComm_t {
    Comm::register(Arc::new(Comm::new(0, 2, 0, CommConfig::default())))
}

const F32: RawDataType = RawDataType(7);
const SUM: RawRedOp = RawRedOp(0);

fn all_reduce(comm: ncclComm_t, dtype: RawDataType, op: RawRedOp) -> ncclResult_t {
    let mut buf = [0u8; 64];
    let p = buf.as_mut_ptr() as *mut c_void;
    coll::ncclAllReduce(p, p, 4, dtype, op, comm, std::ptr::null_mut())
}

#[test]
fn invalid_data_types_and_ops() {
    let comm = fake_comm();
    for dtype in [-1, 12, 1000, c_int::MIN] {
        assert_eq!(
            all_reduce(comm, RawDataType(dtype), SUM),
            ncclInvalidArgument,
            "datatype {dtype}"
        );
    }
    // 5 is ncclNumOps: the first user op handle, never created here.
    for op in [-1, 5, 6, 1000, c_int::MAX] {
        assert_eq!(
            all_reduce(comm, F32, RawRedOp(op)),
            ncclInvalidArgument,
            "op {op}"
        );
    }
}

#[test]
fn roots_and_peers_out_of_range() {
    let comm = fake_comm();
    let mut buf = [0u8; 64];
    let p = buf.as_mut_ptr() as *mut c_void;
    let s = std::ptr::null_mut();
    for root in [-1, 2, c_int::MAX] {
        let r = coll::ncclBroadcast(p, p, 4, F32, root, comm, s);
        assert_eq!(r, ncclInvalidArgument, "broadcast root {root}");
        let r = coll::ncclReduce(p, p, 4, F32, SUM, root, comm, s);
        assert_eq!(r, ncclInvalidArgument, "reduce root {root}");
        let r = coll::ncclGather(p, p, 4, F32, root, comm, s);
        assert_eq!(r, ncclInvalidArgument, "gather root {root}");
        let r = coll::ncclScatter(p, p, 4, F32, root, comm, s);
        assert_eq!(r, ncclInvalidArgument, "scatter root {root}");
        let r = p2p::ncclSend(p, 4, F32, root, comm, s);
        assert_eq!(r, ncclInvalidArgument, "send peer {root}");
        let r = p2p::ncclRecv(p, 4, F32, root, comm, s);
        assert_eq!(r, ncclInvalidArgument, "recv peer {root}");
    }
}

#[test]
fn queries_with_null_out_pointers() {
    let comm = fake_comm();
    let null = std::ptr::null_mut();
    assert_eq!(comm_api::ncclCommCount(comm, null), ncclInvalidArgument);
    assert_eq!(comm_api::ncclCommCuDevice(comm, null), ncclInvalidArgument);
    assert_eq!(comm_api::ncclCommUserRank(comm, null), ncclInvalidArgument);
    assert_eq!(
        comm_api::ncclCommGetAsyncError(comm, std::ptr::null_mut()),
        ncclInvalidArgument
    );
    let mut n = 0;
    assert_eq!(comm_api::ncclCommCount(comm, &mut n), ncclSuccess);
    assert_eq!(n, 2);
}

#[test]
fn reduction_ops() {
    let comm = fake_comm();
    for builtin in 0..5 {
        assert_eq!(
            comm_api::ncclRedOpDestroy(RawRedOp(builtin), comm),
            ncclInvalidArgument,
            "builtin op {builtin}"
        );
    }
    let mut scalar = 2.0f32;
    let scalar_ptr = &mut scalar as *mut f32 as *mut c_void;
    let host = RawScalarResidence(1);
    let mut op = RawRedOp(-1);
    let bad_type =
        comm_api::ncclRedOpCreatePreMulSum(&mut op, scalar_ptr, RawDataType(12), host, comm);
    assert_eq!(bad_type, ncclInvalidArgument);
    let bad_residence =
        comm_api::ncclRedOpCreatePreMulSum(&mut op, scalar_ptr, F32, RawScalarResidence(7), comm);
    assert_eq!(bad_residence, ncclInvalidArgument);
    let null_op =
        comm_api::ncclRedOpCreatePreMulSum(std::ptr::null_mut(), scalar_ptr, F32, host, comm);
    assert_eq!(null_op, ncclInvalidArgument);
    assert_eq!(
        comm_api::ncclRedOpCreatePreMulSum(&mut op, scalar_ptr, F32, host, comm),
        ncclSuccess
    );
    assert_eq!(comm_api::ncclRedOpDestroy(op, comm), ncclSuccess);
    assert_eq!(
        comm_api::ncclRedOpDestroy(op, comm),
        ncclInvalidArgument,
        "double destroy"
    );
}

#[test]
fn revoke_and_shrink_arguments() {
    let comm = fake_comm();
    assert_eq!(comm_api::ncclCommRevoke(comm, 1), ncclInvalidArgument);
    assert_eq!(comm_api::ncclCommRevoke(comm, -1), ncclInvalidArgument);
    let mut out: ncclComm_t = std::ptr::null_mut();
    let null_cfg = std::ptr::null_mut();
    let null_list = std::ptr::null_mut();
    let r = comm_api::ncclCommShrink(comm, null_list, 1, &mut out, null_cfg, 0);
    assert_eq!(r, ncclInvalidArgument, "NULL list with a count");
    let mut list = [1];
    let r = comm_api::ncclCommShrink(comm, list.as_mut_ptr(), -1, &mut out, null_cfg, 0);
    assert_eq!(r, ncclInvalidArgument, "negative count");
    let r = comm_api::ncclCommShrink(comm, list.as_mut_ptr(), 1, &mut out, null_cfg, 0x10);
    assert_eq!(r, ncclInvalidArgument, "unknown flags");
    let r = comm_api::ncclCommShrink(
        comm,
        list.as_mut_ptr(),
        1,
        std::ptr::null_mut(),
        null_cfg,
        0,
    );
    assert_eq!(r, ncclInvalidArgument, "NULL newcomm");
}

#[test]
fn window_and_register_arguments() {
    let comm = fake_comm();
    let mut buf = [0u8; 64];
    let p = buf.as_mut_ptr() as *mut c_void;
    let mut win = std::ptr::null_mut();
    assert_eq!(
        mem::ncclCommWindowRegister(comm, p, 64, std::ptr::null_mut(), 0),
        ncclInvalidArgument
    );
    assert_eq!(
        mem::ncclCommWindowRegister(comm, p, 64, &mut win, 0x100),
        ncclInvalidArgument
    );
    assert_eq!(
        mem::ncclCommRegister(comm, p, 64, std::ptr::null_mut()),
        ncclInvalidArgument
    );
}

#[test]
fn destroyed_communicator_is_rejected() {
    let comm = fake_comm();
    assert_eq!(comm_api::ncclCommDestroy(comm), ncclSuccess);
    let mut n = 0;
    assert_eq!(comm_api::ncclCommCount(comm, &mut n), ncclInvalidArgument);
    assert_eq!(comm_api::ncclCommDestroy(comm), ncclInvalidArgument);
}
