//! The per-call configured collectives (`ncclXConfig`): the same calls as `coll`, with an
//! `ncclCollConfig_t` that bounds this call's CTAs, filters its algorithm and names an event
//! to record when its kernel has launched. A NULL config is the plain call.

use super::coll::{submit_configured, Call};
use super::export;
use crate::abi::{cudaStream_t, ncclCollConfig_t, ncclComm_t, ncclResult_t, RawDataType, RawRedOp};
use crate::sched::CollKind;
use std::os::raw::{c_int, c_void};

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ncclAllReduceConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: RawDataType,
    op: RawRedOp,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    export!(ncclAllReduceConfig, name);
    submit_configured(
        name,
        Call {
            kind: CollKind::AllReduce,
            sendbuff,
            recvbuff,
            count,
            dtype: datatype,
            op: Some(op),
            root: 0,
            comm,
            stream,
        },
        config,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ncclBroadcastConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: RawDataType,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    export!(ncclBroadcastConfig, name);
    submit_configured(
        name,
        Call {
            kind: CollKind::Broadcast,
            sendbuff,
            recvbuff,
            count,
            dtype: datatype,
            op: None,
            root,
            comm,
            stream,
        },
        config,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ncclReduceConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: RawDataType,
    op: RawRedOp,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    export!(ncclReduceConfig, name);
    submit_configured(
        name,
        Call {
            kind: CollKind::Reduce,
            sendbuff,
            recvbuff,
            count,
            dtype: datatype,
            op: Some(op),
            root,
            comm,
            stream,
        },
        config,
    )
}

#[no_mangle]
pub extern "C" fn ncclAllGatherConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: RawDataType,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    export!(ncclAllGatherConfig, name);
    submit_configured(
        name,
        Call {
            kind: CollKind::AllGather,
            sendbuff,
            recvbuff,
            count: sendcount,
            dtype: datatype,
            op: None,
            root: 0,
            comm,
            stream,
        },
        config,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ncclReduceScatterConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: RawDataType,
    op: RawRedOp,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    export!(ncclReduceScatterConfig, name);
    submit_configured(
        name,
        Call {
            kind: CollKind::ReduceScatter,
            sendbuff,
            recvbuff,
            count: recvcount,
            dtype: datatype,
            op: Some(op),
            root: 0,
            comm,
            stream,
        },
        config,
    )
}

#[no_mangle]
pub extern "C" fn ncclAlltoAllConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: RawDataType,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    export!(ncclAlltoAllConfig, name);
    submit_configured(
        name,
        Call {
            kind: CollKind::AlltoAll,
            sendbuff,
            recvbuff,
            count,
            dtype: datatype,
            op: None,
            root: 0,
            comm,
            stream,
        },
        config,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ncclGatherConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: RawDataType,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    export!(ncclGatherConfig, name);
    submit_configured(
        name,
        Call {
            kind: CollKind::Gather,
            sendbuff,
            recvbuff,
            count,
            dtype: datatype,
            op: None,
            root,
            comm,
            stream,
        },
        config,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ncclScatterConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: RawDataType,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    export!(ncclScatterConfig, name);
    submit_configured(
        name,
        Call {
            kind: CollKind::Scatter,
            sendbuff,
            recvbuff,
            count,
            dtype: datatype,
            op: None,
            root,
            comm,
            stream,
        },
        config,
    )
}
