//! Collectives: argument checks shared by all of them, then a task for the group machinery.

use super::{entry, export, find_comm};
use crate::abi::{
    cudaStream_t, ncclCollConfig_t, ncclComm_t, ncclDataType_t, ncclResult_t, RawDataType, RawRedOp,
};
use crate::core::coll_config::{self, CallConfig};
use crate::core::redop::RedOp;
use crate::core::watchdog::check::Mode as CheckMode;
use crate::error::{Error, Result};
use crate::sched::{CollKind, Task};
use std::os::raw::{c_int, c_void};

/// Everything a collective call passes, before validation.
pub(crate) struct Call {
    pub kind: CollKind,
    pub sendbuff: *const c_void,
    pub recvbuff: *mut c_void,
    pub count: usize,
    pub dtype: RawDataType,
    /// `None` for operations that do not reduce.
    pub op: Option<RawRedOp>,
    /// Root rank, or peer for Send/Recv; ignored where the operation has none.
    pub root: c_int,
    pub comm: ncclComm_t,
    pub stream: cudaStream_t,
}

/// Validate a call as NVIDIA's library does and hand it to the communicator.
pub(crate) fn submit(name: &str, call: Call) -> ncclResult_t {
    let _span = crate::profile::span(crate::profile::Stage::Call);
    entry(name, call.comm, || {
        submit_call(find_comm(call.comm)?, call, CallConfig::default())
    })
}

/// `submit` with the caller's per-call configuration (NULL: the plain call). The config is
/// checked first, before the communicator, as NVIDIA's library does.
pub(crate) fn submit_configured(
    name: &str,
    call: Call,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    entry(name, call.comm, || {
        // SAFETY: `config` is NULL or the caller's struct of the size it declares (NCCL's
        // contract for ncclCollConfig_t).
        let user = unsafe { coll_config::read(config) }?;
        let c = find_comm(call.comm)?;
        let cfg = match user {
            Some(user) => coll_config::resolve(&user, &c.config, call.kind)?,
            None => CallConfig::default(),
        };
        submit_call(c, call, cfg)
    })
}

fn submit_call(c: std::sync::Arc<crate::core::Comm>, call: Call, cfg: CallConfig) -> Result<()> {
    c.check_usable()?;
    let dtype = ncclDataType_t::from_raw(call.dtype).ok_or_else(|| {
        Error::invalid_argument(format!(
            "invalid type {}, comm {:p}",
            call.dtype.0, call.comm
        ))
    })?;
    let op = match call.op {
        Some(raw) => c.redops.resolve(raw, dtype)?,
        None => RedOp::Sum,
    };
    if call.kind.has_root() && (call.root < 0 || call.root >= c.nranks()) {
        let what = if matches!(call.kind, CollKind::Send | CollKind::Recv) {
            "peer"
        } else {
            "root"
        };
        return Err(Error::invalid_argument(format!(
            "invalid {what} {}, nranks {}",
            call.root,
            c.nranks()
        )));
    }
    check_buffers(&call, c.rank(), c.cuda_dev, c.check_mode)?;
    let task = Task {
        kind: call.kind,
        dtype,
        op,
        count: call.count,
        sendbuff: call.sendbuff as u64,
        recvbuff: call.recvbuff as u64,
        root: call.root,
        opts: cfg.opts,
        weights_epoch: 0,
    };
    crate::core::enqueue::enqueue(&c, task, call.stream, cfg.launch_event)
}

/// Buffers a rank actually touches must not be NULL when there is data to move; with the
/// communicator's `NCCL_CHECK_MODE` (`mode`) set they must also be memory the GPU reaches,
/// and device memory of its device `dev` where they are device memory (NVIDIA's
/// `CudaPtrCheck`).
fn check_buffers(call: &Call, rank: i32, dev: i32, mode: CheckMode) -> Result<()> {
    if call.count == 0 {
        return Ok(());
    }
    let is_root = rank == call.root;
    let (needs_send, needs_recv) = match call.kind {
        CollKind::Send => (true, false),
        CollKind::Recv => (false, true),
        CollKind::Reduce => (true, is_root),
        CollKind::Gather => (true, is_root),
        CollKind::Scatter => (is_root, true),
        CollKind::Broadcast => (is_root, true),
        _ => (true, true),
    };
    if needs_send && call.sendbuff.is_null() {
        return Err(Error::invalid_argument("sendbuff argument is NULL"));
    }
    if needs_recv && call.recvbuff.is_null() {
        return Err(Error::invalid_argument("recvbuff argument is NULL"));
    }
    if mode != CheckMode::Default {
        if needs_send {
            check_pointer(call.sendbuff as u64, "sendbuff", dev)?;
        }
        if needs_recv {
            check_pointer(call.recvbuff as u64, "recvbuff", dev)?;
        }
    }
    Ok(())
}

/// The driver's word on one buffer, in NVIDIA's words (`NCCL_CHECK_MODE`).
pub(crate) fn check_pointer(ptr: u64, name: &str, dev: i32) -> Result<()> {
    let facts = crate::cuda::pointer_facts(ptr)?;
    if facts.device_pointer == 0 {
        return Err(Error::invalid_argument(format!(
            "{name} {ptr:#x} is not a valid pointer"
        )));
    }
    if facts.on_device && facts.device != dev {
        return Err(Error::invalid_argument(format!(
            "{name} allocated on device {} mismatchs with NCCL device {dev}",
            facts.device
        )));
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: RawDataType,
    op: RawRedOp,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    export!(ncclAllReduce, name);
    submit(
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
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: RawDataType,
    op: RawRedOp,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    export!(ncclReduce, name);
    submit(
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
    )
}

// The in-place broadcast of NCCL 1: one buffer, both sent (at the root) and received.
#[no_mangle]
pub extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: RawDataType,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    export!(ncclBcast, name);
    submit(
        name,
        Call {
            kind: CollKind::Broadcast,
            sendbuff: buff,
            recvbuff: buff,
            count,
            dtype: datatype,
            op: None,
            root,
            comm,
            stream,
        },
    )
}

#[no_mangle]
pub extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: RawDataType,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    export!(ncclBroadcast, name);
    submit(
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
    )
}

#[no_mangle]
pub extern "C" fn ncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: RawDataType,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    export!(ncclGather, name);
    submit(
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
    )
}

#[no_mangle]
pub extern "C" fn ncclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: RawDataType,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    export!(ncclScatter, name);
    submit(
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
    )
}

#[no_mangle]
pub extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: RawDataType,
    op: RawRedOp,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    export!(ncclReduceScatter, name);
    submit(
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
    )
}

#[no_mangle]
pub extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: RawDataType,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    export!(ncclAllGather, name);
    submit(
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
    )
}

#[no_mangle]
pub extern "C" fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: RawDataType,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    export!(ncclAlltoAll, name);
    submit(
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
    )
}
