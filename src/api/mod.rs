//! The `extern "C"` entry points, one file per family. Each one validates its arguments,
//! catches panics, maps errors to `ncclResult_t` and records the message for
//! `ncclGetLastError`; the work itself is done by `core`. Every function is exported twice,
//! as `ncclX` and as its profiling alias `pncclX`, both calling the same implementation.
#![allow(non_snake_case)]
// C entry points receive raw pointers by definition; each one checks them before use.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod coll;
pub mod comm;
pub mod device;
pub mod group;
pub mod mem;
pub mod misc;
pub mod p2p;

use crate::abi::{ncclComm_t, ncclResult_t};
use crate::core::Comm;
use crate::error::{Error, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// Run one entry point's body: catch panics, log and record errors, map to a result code.
/// `comm` (when the call has one) also records the error as that communicator's last error.
pub(crate) fn entry(
    name: &str,
    comm: ncclComm_t,
    body: impl FnOnce() -> Result<()>,
) -> ncclResult_t {
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|payload| {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(Error::internal(format!("internal panic: {what}")))
    });
    match outcome {
        Ok(()) => ncclResult_t::ncclSuccess,
        Err(e) if e.code == ncclResult_t::ncclInProgress => e.code,
        Err(e) => {
            let msg = format!("{name}: {}", e.msg);
            crate::warn!("{msg}");
            crate::error::set_thread_last_error(&msg);
            if let Ok(c) = Comm::from_handle(comm) {
                c.last_error.set(&msg);
            }
            e.code
        }
    }
}

/// The communicator behind a handle, or `ncclInvalidArgument` for NULL or unknown handles.
pub(crate) fn comm(handle: ncclComm_t) -> Result<Arc<Comm>> {
    Comm::from_handle(handle)
}

/// Check that an out-pointer is not NULL.
pub(crate) fn out_ptr<T>(p: *mut T, what: &str) -> Result<()> {
    if p.is_null() {
        return Err(Error::invalid_argument(format!("{what} argument is NULL")));
    }
    Ok(())
}
