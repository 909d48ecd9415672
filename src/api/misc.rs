//! Version, error strings, last error, debug reset and unique ids.

use super::{entry, out_ptr};
use crate::abi::{ncclComm_t, ncclResult_t, ncclUniqueId, RawResult, NCCL_VERSION_CODE};
use crate::core::Comm;
use std::os::raw::{c_char, c_int};

fn get_version(version: *mut c_int) -> ncclResult_t {
    entry("ncclGetVersion", std::ptr::null_mut(), || {
        out_ptr(version, "version")?;
        // SAFETY: checked non-NULL; the caller provides a writable int.
        unsafe { *version = NCCL_VERSION_CODE };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclGetVersion(version: *mut c_int) -> ncclResult_t {
    get_version(version)
}
#[no_mangle]
pub extern "C" fn pncclGetVersion(version: *mut c_int) -> ncclResult_t {
    get_version(version)
}

#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: RawResult) -> *const c_char {
    crate::error::error_cstr(result.0).as_ptr()
}
#[no_mangle]
pub extern "C" fn pncclGetErrorString(result: RawResult) -> *const c_char {
    crate::error::error_cstr(result.0).as_ptr()
}

fn get_last_error(comm: ncclComm_t) -> *const c_char {
    // Never fails: a bad handle falls back to the thread's message.
    let per_comm = std::panic::catch_unwind(|| {
        Comm::from_handle(comm)
            .ok()
            .and_then(|c| c.last_error.ptr())
    });
    match per_comm {
        Ok(Some(p)) if !comm.is_null() => p,
        _ => crate::error::thread_last_error_ptr(),
    }
}

#[no_mangle]
pub extern "C" fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
    get_last_error(comm)
}
#[no_mangle]
pub extern "C" fn pncclGetLastError(comm: ncclComm_t) -> *const c_char {
    get_last_error(comm)
}

fn reset_debug_init() {
    let _ = std::panic::catch_unwind(crate::debug::reset);
}

#[no_mangle]
#[deprecated(
    note = "ncclResetDebugInit is not supported as part of the NCCL API and will be removed in the future"
)]
pub extern "C" fn ncclResetDebugInit() {
    reset_debug_init()
}
#[no_mangle]
#[deprecated(
    note = "pncclResetDebugInit is not supported as part of the NCCL API and will be removed in the future"
)]
pub extern "C" fn pncclResetDebugInit() {
    reset_debug_init()
}

/// NVIDIA's library exports this too, and libtorch_cuda.so 2.11 imports it (by this name, not
/// through `ncclResetDebugInit`): without it, that one symbol would still bind to NVIDIA's
/// file under `LD_PRELOAD`. Not in nccl.h (cbindgen.toml excludes it).
#[no_mangle]
pub extern "C" fn ncclResetDebugInitInternal() {
    reset_debug_init()
}

fn get_unique_id(out: *mut ncclUniqueId) -> ncclResult_t {
    entry("ncclGetUniqueId", std::ptr::null_mut(), || {
        out_ptr(out, "uniqueId")?;
        let id = crate::bootstrap::get_unique_id()?;
        // SAFETY: checked non-NULL; the caller provides a writable ncclUniqueId.
        unsafe { out.write_unaligned(id) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclGetUniqueId(out: *mut ncclUniqueId) -> ncclResult_t {
    get_unique_id(out)
}
#[no_mangle]
pub extern "C" fn pncclGetUniqueId(out: *mut ncclUniqueId) -> ncclResult_t {
    get_unique_id(out)
}
