//! The parameter API: every setting of the registry in `env::registry`, bound by its full
//! name to a handle and read typed, as a string or as raw bytes, listed, and dumped to
//! stdout. A handle is the address of the registry entry; strings and the key table handed
//! out are owned by the calling thread and stay valid until its next call of the same kind.

use super::{entry, export, out};
use crate::abi::{ncclParamHandle, ncclParamHandle_t, ncclResult_t};
use crate::env::{registry, Kind, Param, Value};
use crate::error::{Error, Result};
use once_cell::sync::Lazy;
use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::fmt::Write as _;
use std::os::raw::{c_char, c_int, c_void};

thread_local! {
    /// The string of this thread's last `ncclParamGetStr`.
    static GET_STR: RefCell<CString> = RefCell::new(CString::default());
    /// The string of this thread's last `ncclParamGetParameter`.
    static PARAMETER: RefCell<CString> = RefCell::new(CString::default());
    /// The table of this thread's last `ncclParamGetAllParameterKeys`.
    static KEYS: RefCell<Vec<*const c_char>> = const { RefCell::new(Vec::new()) };
}

/// Every registered name as a C string, alive for the whole process.
static KEY_NAMES: Lazy<Vec<CString>> = Lazy::new(|| {
    registry::ALL
        .iter()
        .map(|p| CString::new(p.name).expect("a setting name has no NUL"))
        .collect()
});

/// The C string `p` as UTF-8, or `ncclInvalidArgument` for NULL or invalid text.
fn key_text<'a>(p: *const c_char) -> Result<&'a str> {
    if p.is_null() {
        return Err(Error::invalid_argument("key argument is NULL"));
    }
    // SAFETY: non-NULL, and the C caller passes a NUL-terminated string (NCCL's contract)
    // that outlives the call.
    let text = unsafe { CStr::from_ptr(p) };
    text.to_str()
        .map_err(|_| Error::invalid_argument("key is not valid UTF-8"))
}

/// The registered setting named by the C string `key`.
fn param_named(key: *const c_char) -> Result<&'static Param> {
    let name = key_text(key)?;
    registry::find(name)
        .ok_or_else(|| Error::invalid_argument(format!("unknown parameter {name:?}")))
}

/// The setting behind a handle from `ncclParamBind` (NULL or anything else is rejected).
fn param_of(h: ncclParamHandle_t) -> Result<&'static Param> {
    registry::ALL
        .iter()
        .copied()
        .find(|p| std::ptr::eq(handle_of(p), h))
        .ok_or_else(|| Error::invalid_argument("invalid parameter handle"))
}

fn handle_of(p: &'static Param) -> ncclParamHandle_t {
    p as *const Param as *mut ncclParamHandle
}

fn type_mismatch(p: &Param, wanted: &str) -> Error {
    Error::invalid_argument(format!("{} is not readable as {wanted}", p.name))
}

/// The setting's value as an integer of type `T`: integer, boolean (0/1) and list (mask)
/// settings are, when `T` holds the value.
fn read_integer<T: TryFrom<i128>>(h: ncclParamHandle_t, wanted: &str) -> Result<T> {
    let p = param_of(h)?;
    let wide: i128 = match p.value() {
        Value::Bool(b) => b as i128,
        Value::Int(n) => n as i128,
        Value::Mask(m) => m as i128,
        Value::Text(_) | Value::Choice(_) => return Err(type_mismatch(p, wanted)),
    };
    T::try_from(wide)
        .map_err(|_| Error::invalid_argument(format!("{}={wide} does not fit in {wanted}", p.name)))
}

/// One typed integer getter: check the out-pointer, read, store.
fn get_integer<T: TryFrom<i128> + Copy>(
    name: &str,
    h: ncclParamHandle_t,
    o: *mut T,
    wanted: &str,
) -> ncclResult_t {
    entry(name, std::ptr::null_mut(), || {
        let o = out(o, "out")?;
        o.write(read_integer::<T>(h, wanted)?);
        Ok(())
    })
}

/// The bytes of the setting's value as `ncclParamGet` hands them out: a bool as one byte,
/// an integer or mask as eight, a choice as a 4-byte `int`, text with its NUL.
fn raw_bytes(p: &'static Param) -> Vec<u8> {
    match p.value() {
        Value::Bool(b) => vec![b as u8],
        Value::Int(n) => n.to_ne_bytes().to_vec(),
        Value::Mask(m) => m.to_ne_bytes().to_vec(),
        Value::Choice(c) => c.to_ne_bytes().to_vec(),
        Value::Text(t) => {
            let mut bytes = t.unwrap_or_default().into_bytes();
            bytes.push(0);
            bytes
        }
    }
}

/// `text` as a C string (an interior NUL cuts it there).
fn c_string(text: String) -> CString {
    let mut bytes = text.into_bytes();
    if let Some(nul) = bytes.iter().position(|&b| b == 0) {
        bytes.truncate(nul);
    }
    CString::new(bytes).expect("NUL removed")
}

#[no_mangle]
pub extern "C" fn ncclParamBind(out: *mut ncclParamHandle_t, key: *const c_char) -> ncclResult_t {
    export!(ncclParamBind, name);
    entry(name, std::ptr::null_mut(), || {
        let o = super::out(out, "out")?;
        o.write(handle_of(param_named(key)?));
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclParamGetI8(h: ncclParamHandle_t, out: *mut i8) -> ncclResult_t {
    export!(ncclParamGetI8, name);
    get_integer(name, h, out, "int8_t")
}

#[no_mangle]
pub extern "C" fn ncclParamGetI16(h: ncclParamHandle_t, out: *mut i16) -> ncclResult_t {
    export!(ncclParamGetI16, name);
    get_integer(name, h, out, "int16_t")
}

#[no_mangle]
pub extern "C" fn ncclParamGetI32(h: ncclParamHandle_t, out: *mut i32) -> ncclResult_t {
    export!(ncclParamGetI32, name);
    get_integer(name, h, out, "int32_t")
}

#[no_mangle]
pub extern "C" fn ncclParamGetI64(h: ncclParamHandle_t, out: *mut i64) -> ncclResult_t {
    export!(ncclParamGetI64, name);
    get_integer(name, h, out, "int64_t")
}

#[no_mangle]
pub extern "C" fn ncclParamGetU8(h: ncclParamHandle_t, out: *mut u8) -> ncclResult_t {
    export!(ncclParamGetU8, name);
    get_integer(name, h, out, "uint8_t")
}

#[no_mangle]
pub extern "C" fn ncclParamGetU16(h: ncclParamHandle_t, out: *mut u16) -> ncclResult_t {
    export!(ncclParamGetU16, name);
    get_integer(name, h, out, "uint16_t")
}

#[no_mangle]
pub extern "C" fn ncclParamGetU32(h: ncclParamHandle_t, out: *mut u32) -> ncclResult_t {
    export!(ncclParamGetU32, name);
    get_integer(name, h, out, "uint32_t")
}

#[no_mangle]
pub extern "C" fn ncclParamGetU64(h: ncclParamHandle_t, out: *mut u64) -> ncclResult_t {
    export!(ncclParamGetU64, name);
    get_integer(name, h, out, "uint64_t")
}

#[no_mangle]
pub extern "C" fn ncclParamGetStr(h: ncclParamHandle_t, out: *mut *const c_char) -> ncclResult_t {
    export!(ncclParamGetStr, name);
    entry(name, std::ptr::null_mut(), || {
        let o = super::out(out, "out")?;
        let p = param_of(h)?;
        let Value::Text(text) = p.value() else {
            return Err(type_mismatch(p, "a string"));
        };
        // An unset string reads as "", as in NVIDIA's library.
        GET_STR.with(|s| {
            *s.borrow_mut() = c_string(text.unwrap_or_default());
            o.write(s.borrow().as_ptr());
        });
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclParamGet(
    h: ncclParamHandle_t,
    out: *mut c_void,
    maxLen: c_int,
    len: *mut c_int,
) -> ncclResult_t {
    export!(ncclParamGet, name);
    entry(name, std::ptr::null_mut(), || {
        let buf = super::out(out.cast::<u8>(), "out")?;
        let len = super::out(len, "len")?;
        let p = param_of(h)?;
        let bytes = raw_bytes(p);
        if maxLen < 0 || (maxLen as usize) < bytes.len() {
            len.write(0);
            return Err(Error::invalid_argument(format!(
                "{} needs {} bytes, maxLen is {maxLen}",
                p.name,
                bytes.len()
            )));
        }
        // SAFETY: `buf` is non-NULL and the caller's buffer holds `maxLen` bytes (NCCL's
        // contract), at least `bytes.len()`; a local Vec cannot overlap it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.as_ptr(), bytes.len()) };
        len.write(bytes.len() as c_int);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclParamGetParameter(
    key: *const c_char,
    value: *mut *const c_char,
    valueLen: *mut c_int,
) -> ncclResult_t {
    export!(ncclParamGetParameter, name);
    entry(name, std::ptr::null_mut(), || {
        let value = out(value, "value")?;
        let value_len = out(valueLen, "valueLen")?;
        let text = c_string(param_named(key)?.text_value());
        PARAMETER.with(|s| {
            *s.borrow_mut() = text;
            let s = s.borrow();
            value.write(s.as_ptr());
            value_len.write(s.as_bytes().len() as c_int);
        });
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclParamGetAllParameterKeys(
    table: *mut *mut *const c_char,
    tableLen: *mut c_int,
) -> ncclResult_t {
    export!(ncclParamGetAllParameterKeys, name);
    entry(name, std::ptr::null_mut(), || {
        let table = out(table, "table")?;
        let table_len = out(tableLen, "tableLen")?;
        KEYS.with(|keys| {
            let mut keys = keys.borrow_mut();
            *keys = KEY_NAMES.iter().map(|k| k.as_ptr()).collect();
            table.write(keys.as_mut_ptr());
            table_len.write(keys.len() as c_int);
        });
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclParamDumpAll() {
    export!(ncclParamDumpAll, name);
    let _ = entry(name, std::ptr::null_mut(), || {
        let all = registry::PARAM_DUMP_ALL.flag();
        crate::debug::print_stdout(&dump(all));
        Ok(())
    });
}

/// The registry dump in NVIDIA's layout: the documented settings, or all with `all`.
pub fn dump(all: bool) -> String {
    let mut text = String::from("=== ncclParam Registry Dump ===\n");
    for p in registry::ALL.iter().filter(|p| all || p.documented) {
        dump_one(&mut text, p);
    }
    text
}

fn dump_one(text: &mut String, p: &'static Param) {
    let flags = if p.documented {
        "Documented"
    } else {
        "Undocumented"
    };
    let _ = writeln!(
        text,
        "{} ({}) [{flags}] {}",
        p.name,
        c_type(p),
        p.description
    );
    let _ = writeln!(
        text,
        "    Current value={} set_by={} default={}",
        p.text_value(),
        p.source().name(),
        p.default_text()
    );
    let (accepted, choices) = match p.kind {
        Kind::Bool if p.words => ("Boolean: 1/T/TRUE or 0/F/FALSE", &[][..]),
        Kind::Bool => (
            "Boolean: an integer, 0 for false, any other for true",
            &[][..],
        ),
        Kind::Int => ("Integer (decimal or 0x hexadecimal)", &[][..]),
        Kind::Text => ("String", &[][..]),
        Kind::OneOf { choices, .. } => ("One of:", choices),
        Kind::ListOf(choices) => ("Comma-separated list of:", choices),
    };
    let _ = writeln!(text, "    Accepted value: {accepted}");
    for c in choices {
        let _ = writeln!(text, "        {} - {}", c.name, c.description);
    }
}

/// The C type the dump names for a setting.
fn c_type(p: &Param) -> &'static str {
    match p.kind {
        Kind::Bool => "bool",
        Kind::Int => "int64_t",
        Kind::Text => "const char*",
        Kind::OneOf { ctype, .. } => ctype,
        Kind::ListOf(_) => "uint64_t",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::ncclResult_t::{ncclInvalidArgument, ncclSuccess};
    use crate::env::tests::sources;

    fn bind(key: &str) -> (ncclResult_t, ncclParamHandle_t) {
        let key = CString::new(key).unwrap();
        let mut h: ncclParamHandle_t = std::ptr::null_mut();
        (ncclParamBind(&mut h, key.as_ptr()), h)
    }

    fn parameter(key: &str) -> (ncclResult_t, String) {
        let key = CString::new(key).unwrap();
        let (mut value, mut len) = (std::ptr::null(), -1);
        let r = ncclParamGetParameter(key.as_ptr(), &mut value, &mut len);
        if r != ncclSuccess {
            return (r, String::new());
        }
        // SAFETY: on success `value` is this thread's NUL-terminated string.
        let text = unsafe { CStr::from_ptr(value) }
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(len as usize, text.len());
        (r, text)
    }

    #[test]
    fn bind_takes_full_registered_names() {
        assert_eq!(bind("NCCL_DEBUG").0, ncclSuccess);
        assert_eq!(bind("DEBUG").0, ncclInvalidArgument);
        assert_eq!(bind("NCCL_NOPE").0, ncclInvalidArgument);
        let key = CString::new("NCCL_DEBUG").unwrap();
        assert_eq!(
            ncclParamBind(std::ptr::null_mut(), key.as_ptr()),
            ncclInvalidArgument
        );
        let mut h = std::ptr::null_mut();
        assert_eq!(ncclParamBind(&mut h, std::ptr::null()), ncclInvalidArgument);
        let mut v = 0i64;
        assert_eq!(
            ncclParamGetI64(std::ptr::null_mut(), &mut v),
            ncclInvalidArgument
        );
        let stray = 0x1234 as ncclParamHandle_t;
        assert_eq!(ncclParamGetI64(stray, &mut v), ncclInvalidArgument);
    }

    #[test]
    fn integers_read_into_types_that_hold_them() {
        sources::with(
            &[("NCCL_BUFFSIZE", "1048576"), ("NCCL_NET_GDR_READ", "-1")],
            &[],
            || {
                let (_, h) = bind("NCCL_BUFFSIZE");
                let (mut i64v, mut i32v, mut u64v) = (0i64, 0i32, 0u64);
                let (mut i8v, mut u16v) = (0i8, 0u16);
                assert_eq!(ncclParamGetI64(h, &mut i64v), ncclSuccess);
                assert_eq!(ncclParamGetI32(h, &mut i32v), ncclSuccess);
                assert_eq!(ncclParamGetU64(h, &mut u64v), ncclSuccess);
                assert_eq!((i64v, i32v, u64v), (1 << 20, 1 << 20, 1 << 20));
                assert_eq!(ncclParamGetI8(h, &mut i8v), ncclInvalidArgument);
                assert_eq!(ncclParamGetU16(h, &mut u16v), ncclInvalidArgument);
                assert_eq!(
                    ncclParamGetI64(h, std::ptr::null_mut()),
                    ncclInvalidArgument
                );
                let (_, h) = bind("NCCL_NET_GDR_READ");
                assert_eq!(ncclParamGetI8(h, &mut i8v), ncclSuccess);
                assert_eq!(i8v, -1);
                let mut u8v = 0u8;
                assert_eq!(ncclParamGetU8(h, &mut u8v), ncclInvalidArgument, "negative");
            },
        );
    }

    #[test]
    fn a_bool_reads_as_0_or_1_and_one_raw_byte() {
        sources::with(&[("NCCL_P2P_DISABLE", "1")], &[], || {
            let (_, h) = bind("NCCL_P2P_DISABLE");
            let mut v = 7u8;
            assert_eq!(ncclParamGetU8(h, &mut v), ncclSuccess);
            assert_eq!(v, 1);
            let (mut buf, mut len) = ([0u8; 8], 0);
            assert_eq!(
                ncclParamGet(h, buf.as_mut_ptr().cast(), 1, &mut len),
                ncclSuccess
            );
            assert_eq!((len, buf[0]), (1, 1));
            assert_eq!(parameter("NCCL_P2P_DISABLE").1, "TRUE");
        });
    }

    #[test]
    fn an_enum_is_raw_bytes_and_text_only() {
        sources::with(&[("NCCL_DEBUG", "WARN")], &[], || {
            let (_, h) = bind("NCCL_DEBUG");
            let (mut i, mut s) = (0i64, std::ptr::null());
            assert_eq!(ncclParamGetI64(h, &mut i), ncclInvalidArgument);
            assert_eq!(ncclParamGetStr(h, &mut s), ncclInvalidArgument);
            let (mut buf, mut len) = ([0u8; 64], 0);
            assert_eq!(
                ncclParamGet(h, buf.as_mut_ptr().cast(), 64, &mut len),
                ncclSuccess
            );
            assert_eq!(len, 4);
            assert_eq!(i32::from_ne_bytes(buf[..4].try_into().unwrap()), 2);
            assert_eq!(
                ncclParamGet(h, buf.as_mut_ptr().cast(), 1, &mut len),
                ncclInvalidArgument
            );
            assert_eq!(len, 0);
            assert_eq!(
                ncclParamGet(h, std::ptr::null_mut(), 64, &mut len),
                ncclInvalidArgument
            );
            let no_len = std::ptr::null_mut();
            assert_eq!(
                ncclParamGet(h, buf.as_mut_ptr().cast(), 64, no_len),
                ncclInvalidArgument
            );
            assert_eq!(parameter("NCCL_DEBUG"), (ncclSuccess, "WARN".to_string()));
        });
        sources::with(&[], &[], || {
            assert_eq!(parameter("NCCL_DEBUG").1, "<unset>");
        });
    }

    #[test]
    fn a_string_reads_with_get_str_and_raw_with_its_nul() {
        sources::with(&[("NCCL_SOCKET_IFNAME", "=lo")], &[], || {
            let (_, h) = bind("NCCL_SOCKET_IFNAME");
            let mut s = std::ptr::null();
            assert_eq!(ncclParamGetStr(h, &mut s), ncclSuccess);
            // SAFETY: on success `s` is this thread's NUL-terminated string.
            assert_eq!(unsafe { CStr::from_ptr(s) }.to_str(), Ok("=lo"));
            let (mut buf, mut len) = ([0u8; 8], 0);
            assert_eq!(
                ncclParamGet(h, buf.as_mut_ptr().cast(), 8, &mut len),
                ncclSuccess
            );
            assert_eq!(&buf[..len as usize], b"=lo\0");
            let mut i = 0i32;
            assert_eq!(ncclParamGetI32(h, &mut i), ncclInvalidArgument);
            assert_eq!(
                ncclParamGetStr(h, std::ptr::null_mut()),
                ncclInvalidArgument
            );
        });
    }

    #[test]
    fn an_unset_string_reads_as_empty() {
        sources::with(&[], &[], || {
            let (_, h) = bind("NCCL_DEBUG_FILE");
            let mut s = std::ptr::null();
            assert_eq!(ncclParamGetStr(h, &mut s), ncclSuccess);
            // SAFETY: on success `s` is this thread's NUL-terminated string.
            assert_eq!(unsafe { CStr::from_ptr(s) }.to_bytes(), b"");
            let (mut buf, mut len) = ([7u8; 4], 0);
            assert_eq!(
                ncclParamGet(h, buf.as_mut_ptr().cast(), 4, &mut len),
                ncclSuccess
            );
            assert_eq!((len, buf[0]), (1, 0));
            assert_eq!(parameter("NCCL_DEBUG_FILE").1, "<unset>");
        });
    }

    #[test]
    fn get_parameter_answers_the_current_value_or_invalid_argument() {
        sources::with(&[], &[("NCCL_BUFFSIZE", "65536")], || {
            assert_eq!(
                parameter("NCCL_BUFFSIZE"),
                (ncclSuccess, "65536".to_string())
            );
            assert_eq!(parameter("NCCL_RAS_ADDR").1, "localhost:28028");
            assert_eq!(parameter("NCCL_NOPE").0, ncclInvalidArgument);
        });
        let key = CString::new("NCCL_DEBUG").unwrap();
        let (mut value, mut len) = (std::ptr::null(), 0);
        assert_eq!(
            ncclParamGetParameter(std::ptr::null(), &mut value, &mut len),
            ncclInvalidArgument
        );
        assert_eq!(
            ncclParamGetParameter(key.as_ptr(), std::ptr::null_mut(), &mut len),
            ncclInvalidArgument
        );
        assert_eq!(
            ncclParamGetParameter(key.as_ptr(), &mut value, std::ptr::null_mut()),
            ncclInvalidArgument
        );
    }

    #[test]
    fn the_key_table_lists_every_registered_setting() {
        let (mut table, mut n) = (std::ptr::null_mut(), 0);
        assert_eq!(
            ncclParamGetAllParameterKeys(&mut table, &mut n),
            ncclSuccess
        );
        assert_eq!(n as usize, registry::ALL.len());
        // SAFETY: on success `table` holds `n` pointers to NUL-terminated names.
        let keys: Vec<&str> = (0..n as usize)
            .map(|i| unsafe { CStr::from_ptr(*table.add(i)) }.to_str().unwrap())
            .collect();
        assert!(keys.contains(&"NCCL_BUFFSIZE") && keys.contains(&"NCCL_DEBUG"));
        assert_eq!(
            ncclParamGetAllParameterKeys(std::ptr::null_mut(), &mut n),
            ncclInvalidArgument
        );
        assert_eq!(
            ncclParamGetAllParameterKeys(&mut table, std::ptr::null_mut()),
            ncclInvalidArgument
        );
    }

    #[test]
    fn the_dump_shows_documented_settings_in_nvidias_layout() {
        sources::with(
            &[("NCCL_BUFFSIZE", "1048576")],
            &[("NCCL_NTHREADS", "128")],
            || {
                let text = dump(false);
                assert!(
                    text.starts_with("=== ncclParam Registry Dump ===\n"),
                    "{text}"
                );
                assert!(text.contains(
                "NCCL_BUFFSIZE (int64_t) [Documented] Size in bytes of the buffer used between \
                 each pair of ranks\n    Current value=1048576 set_by=EnvVar default=4194304\n"
            ));
                assert!(text.contains("NCCL_NTHREADS (int64_t)"));
                assert!(text.contains("Current value=128 set_by=ConfigFile default=0"));
                assert!(text.contains(
                "NCCL_DEBUG_SUBSYS (uint64_t) [Documented] Subsystems whose INFO output is shown \
                 (comma-separated, ^ to exclude)\n    Current value=INIT,ENV,BOOTSTRAP \
                 set_by=Default default=INIT,ENV,BOOTSTRAP\n    Accepted value: Comma-separated \
                 list of:\n        INIT - "
            ));
                assert!(text.contains("NCCL_DEBUG (ncclDebugLogLevel)"));
                assert!(
                    !text.contains("OXCCL_YIELD"),
                    "undocumented settings left out"
                );
                assert!(dump(true).contains("OXCCL_YIELD_SPIN_US (int64_t) [Undocumented]"));
            },
        );
    }
}
