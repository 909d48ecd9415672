//! Version, error strings, last error, debug reset and unique ids.

use super::{entry, export, out};
use crate::abi::{
    ncclComm_t, ncclEncryptionConfig_t, ncclResult_t, ncclUniqueId, RawResult, RUNTIME_VERSION_CODE,
};
use crate::core::Comm;
use std::os::raw::{c_char, c_int};

#[no_mangle]
pub extern "C" fn ncclGetVersion(version: *mut c_int) -> ncclResult_t {
    export!(ncclGetVersion, name);
    entry(name, std::ptr::null_mut(), || {
        out(version, "version")?.write(RUNTIME_VERSION_CODE);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: RawResult) -> *const c_char {
    export!(ncclGetErrorString);
    crate::error::error_cstr(result.0).as_ptr()
}

#[no_mangle]
pub extern "C" fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
    export!(ncclGetLastError);
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

fn reset_debug_init() {
    let _ = std::panic::catch_unwind(crate::debug::reset);
}

// The alias `pncclResetDebugInit` carries the same deprecation in nccl.h, under its own name.
#[no_mangle]
#[deprecated(
    note = "ncclResetDebugInit is not supported as part of the NCCL API and will be removed in the future"
)]
pub extern "C" fn ncclResetDebugInit() {
    export!(ncclResetDebugInit);
    reset_debug_init()
}

/// NVIDIA's library exports this too, and libtorch_cuda.so 2.11 imports it (by this name, not
/// through `ncclResetDebugInit`): without it, that one symbol would still bind to NVIDIA's
/// file under `LD_PRELOAD`. Not in nccl.h (cbindgen.toml excludes it), and without an alias.
#[no_mangle]
pub extern "C" fn ncclResetDebugInitInternal() {
    reset_debug_init()
}

#[no_mangle]
pub extern "C" fn ncclGetUniqueId(out: *mut ncclUniqueId) -> ncclResult_t {
    export!(ncclGetUniqueId, name);
    entry(name, std::ptr::null_mut(), || {
        let slot = self::out(out, "uniqueId")?;
        slot.write(crate::bootstrap::get_unique_id()?);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclSetEncryption(config: *const ncclEncryptionConfig_t) -> ncclResult_t {
    export!(ncclSetEncryption, name);
    entry(name, std::ptr::null_mut(), || {
        // SAFETY: config is NULL or the caller's initialised config (NCCL's contract).
        let cfg = unsafe { crate::bootstrap::crypt::read_config(config) }?;
        crate::bootstrap::set_encryption(cfg)
    })
}
