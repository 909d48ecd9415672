//! The parameter API: every `NCCL_*` setting of the registry in `env`, bound by name to a
//! handle and read typed, as a string or as raw bytes, listed, and dumped to the log.

use super::{entry, export};
use crate::abi::{ncclParamHandle_t, ncclResult_t};
use crate::error::Error;
use std::os::raw::{c_char, c_int, c_void};

#[no_mangle]
pub extern "C" fn ncclParamBind(out: *mut ncclParamHandle_t, key: *const c_char) -> ncclResult_t {
    export!(ncclParamBind, name);
    let _ = (out, key);
    entry(name, std::ptr::null_mut(), || Err(Error::unsupported(name)))
}

#[no_mangle]
pub extern "C" fn ncclParamGetI8(h: ncclParamHandle_t, out: *mut i8) -> ncclResult_t {
    export!(ncclParamGetI8, name);
    let _ = (h, out);
    entry(name, std::ptr::null_mut(), || Err(Error::unsupported(name)))
}

#[no_mangle]
pub extern "C" fn ncclParamGetI16(h: ncclParamHandle_t, out: *mut i16) -> ncclResult_t {
    export!(ncclParamGetI16, name);
    let _ = (h, out);
    entry(name, std::ptr::null_mut(), || Err(Error::unsupported(name)))
}

#[no_mangle]
pub extern "C" fn ncclParamGetI32(h: ncclParamHandle_t, out: *mut i32) -> ncclResult_t {
    export!(ncclParamGetI32, name);
    let _ = (h, out);
    entry(name, std::ptr::null_mut(), || Err(Error::unsupported(name)))
}

#[no_mangle]
pub extern "C" fn ncclParamGetI64(h: ncclParamHandle_t, out: *mut i64) -> ncclResult_t {
    export!(ncclParamGetI64, name);
    let _ = (h, out);
    entry(name, std::ptr::null_mut(), || Err(Error::unsupported(name)))
}

#[no_mangle]
pub extern "C" fn ncclParamGetU8(h: ncclParamHandle_t, out: *mut u8) -> ncclResult_t {
    export!(ncclParamGetU8, name);
    let _ = (h, out);
    entry(name, std::ptr::null_mut(), || Err(Error::unsupported(name)))
}

#[no_mangle]
pub extern "C" fn ncclParamGetU16(h: ncclParamHandle_t, out: *mut u16) -> ncclResult_t {
    export!(ncclParamGetU16, name);
    let _ = (h, out);
    entry(name, std::ptr::null_mut(), || Err(Error::unsupported(name)))
}

#[no_mangle]
pub extern "C" fn ncclParamGetU32(h: ncclParamHandle_t, out: *mut u32) -> ncclResult_t {
    export!(ncclParamGetU32, name);
    let _ = (h, out);
    entry(name, std::ptr::null_mut(), || Err(Error::unsupported(name)))
}

#[no_mangle]
pub extern "C" fn ncclParamGetU64(h: ncclParamHandle_t, out: *mut u64) -> ncclResult_t {
    export!(ncclParamGetU64, name);
    let _ = (h, out);
    entry(name, std::ptr::null_mut(), || Err(Error::unsupported(name)))
}

#[no_mangle]
pub extern "C" fn ncclParamGetStr(h: ncclParamHandle_t, out: *mut *const c_char) -> ncclResult_t {
    export!(ncclParamGetStr, name);
    let _ = (h, out);
    entry(name, std::ptr::null_mut(), || Err(Error::unsupported(name)))
}

#[no_mangle]
pub extern "C" fn ncclParamGet(
    h: ncclParamHandle_t,
    out: *mut c_void,
    maxLen: c_int,
    len: *mut c_int,
) -> ncclResult_t {
    export!(ncclParamGet, name);
    let _ = (h, out, maxLen, len);
    entry(name, std::ptr::null_mut(), || Err(Error::unsupported(name)))
}

#[no_mangle]
pub extern "C" fn ncclParamGetParameter(
    key: *const c_char,
    value: *mut *const c_char,
    valueLen: *mut c_int,
) -> ncclResult_t {
    export!(ncclParamGetParameter, name);
    let _ = (key, value, valueLen);
    entry(name, std::ptr::null_mut(), || Err(Error::unsupported(name)))
}

#[no_mangle]
pub extern "C" fn ncclParamGetAllParameterKeys(
    table: *mut *mut *const c_char,
    tableLen: *mut c_int,
) -> ncclResult_t {
    export!(ncclParamGetAllParameterKeys, name);
    let _ = (table, tableLen);
    entry(name, std::ptr::null_mut(), || Err(Error::unsupported(name)))
}

#[no_mangle]
pub extern "C" fn ncclParamDumpAll() {
    export!(ncclParamDumpAll, name);
    let _ = entry(name, std::ptr::null_mut(), || Err(Error::unsupported(name)));
}
