//! The NCCL library under test, opened at run time with `dlopen` and called through a table
//! of function pointers with the exact C signatures of NVIDIA's `nccl.h` (2.28). Nothing here
//! links against the oxccl crate, so NVIDIA's library and ours are driven identically.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};

/// `ncclComm_t`.
pub type Comm = *mut c_void;
/// `cudaStream_t` (the same object as the driver's `CUstream`).
pub type Stream = *mut c_void;
/// `ncclResult_t`, `ncclDataType_t`, `ncclRedOp_t`: C enums, passed as int.
pub type NcclResult = c_int;

pub const NCCL_SUCCESS: NcclResult = 0;
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;
pub const NCCL_INVALID_USAGE: NcclResult = 5;
pub const NCCL_IN_PROGRESS: NcclResult = 7;

/// The `ncclResult_t` enumerator name of a result code.
pub fn result_name(result: NcclResult) -> &'static str {
    match result {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => "unknown ncclResult_t",
    }
}

/// Whether a result code means that the library declined what it was asked to do
/// (`ncclInvalidArgument`, `ncclInvalidUsage`), as opposed to failing while doing it.
pub fn is_refusal(result: NcclResult) -> bool {
    matches!(result, NCCL_INVALID_ARGUMENT | NCCL_INVALID_USAGE)
}

/// A failed NCCL call: which call, its result code and the library's two messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclError {
    /// The call, with context (rank, step).
    pub what: String,
    pub result: NcclResult,
    /// `ncclGetErrorString(result)`.
    pub text: String,
    /// `ncclGetLastError`, possibly empty.
    pub last: String,
}

impl std::fmt::Display for NcclError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} failed: {} ({}, ncclResult {})",
            self.what,
            self.text,
            result_name(self.result),
            self.result
        )?;
        if !self.last.is_empty() {
            write!(f, "; last error: {}", self.last)?;
        }
        Ok(())
    }
}

impl From<NcclError> for String {
    fn from(error: NcclError) -> String {
        error.to_string()
    }
}
/// `ncclScalarHostImmediate`.
pub const SCALAR_HOST_IMMEDIATE: c_int = 1;

/// `ncclUniqueId`: 128 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [u8; 128],
}

impl UniqueId {
    pub fn hex(&self) -> String {
        self.internal.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_hex(text: &str) -> Result<UniqueId, String> {
        if text.len() != 256 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "a unique id must be 256 hex digits, got {} characters",
                text.len()
            ));
        }
        let mut internal = [0u8; 128];
        for (i, byte) in internal.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
                .map_err(|e| format!("bad unique id hex: {e}"))?;
        }
        Ok(UniqueId { internal })
    }
}

type ReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    Comm,
    Stream,
) -> NcclResult;
type AllReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    Stream,
) -> NcclResult;
type RootedFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    Stream,
) -> NcclResult;
type GatherLikeFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> NcclResult;
type SendFn = unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult;
type RecvFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult;

/// Every entry point the benchmark calls.
pub struct Nccl {
    _handle: *mut c_void,
    pub get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    pub get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> NcclResult,
    pub comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> NcclResult,
    pub comm_destroy: unsafe extern "C" fn(Comm) -> NcclResult,
    pub comm_abort: unsafe extern "C" fn(Comm) -> NcclResult,
    pub comm_get_async_error: unsafe extern "C" fn(Comm, *mut NcclResult) -> NcclResult,
    pub get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    pub get_last_error: unsafe extern "C" fn(Comm) -> *const c_char,
    pub group_start: unsafe extern "C" fn() -> NcclResult,
    pub group_end: unsafe extern "C" fn() -> NcclResult,
    pub red_op_create_pre_mul_sum:
        unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, c_int, Comm) -> NcclResult,
    pub red_op_destroy: unsafe extern "C" fn(c_int, Comm) -> NcclResult,
    pub all_reduce: AllReduceFn,
    pub reduce: ReduceFn,
    pub reduce_scatter: AllReduceFn,
    pub all_gather: GatherLikeFn,
    pub broadcast: RootedFn,
    pub alltoall: GatherLikeFn,
    pub gather: RootedFn,
    pub scatter: RootedFn,
    pub send: SendFn,
    pub recv: RecvFn,
}

// SAFETY: the table holds plain function pointers and the dlopen handle, which stays open for
// the life of the process; NCCL's entry points may be called from any thread.
unsafe impl Send for Nccl {}
// SAFETY: as above; nothing in the table is mutated after loading.
unsafe impl Sync for Nccl {}

/// Reinterpret a symbol address as a function pointer of type `F`.
///
/// # Safety
/// `F` must be an `extern "C"` function pointer type matching the symbol's real signature.
unsafe fn function_pointer<F: Copy>(symbol: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size (checked above); the caller vouches for the signature.
    unsafe { std::mem::transmute_copy(&symbol) }
}

fn dl_error() -> String {
    // SAFETY: dlerror returns a thread-local NUL-terminated string or null.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null dlerror results are valid C strings.
        unsafe { CStr::from_ptr(message) }
            .to_string_lossy()
            .into_owned()
    }
}

/// The library used when `--lib` is not given: libnccl.so.2 beside the executable if there is
/// one, else the bare name so that dlopen searches the usual places.
pub fn default_library() -> PathBuf {
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            let beside = dir.join("libnccl.so.2");
            if beside.exists() {
                return beside;
            }
        }
    }
    PathBuf::from("libnccl.so.2")
}

impl Nccl {
    /// Open `path` and resolve every symbol, naming the first one that is missing.
    pub fn load(path: &Path) -> Result<Nccl, String> {
        let has_slash = path.to_string_lossy().contains('/');
        if has_slash && !path.exists() {
            return Err(format!("NCCL library {} does not exist", path.display()));
        }
        let c_path = CString::new(path.to_string_lossy().as_bytes())
            .map_err(|_| format!("library path {} contains a NUL byte", path.display()))?;
        // SAFETY: c_path is a valid C string; RTLD_LOCAL keeps its symbols out of the global
        // namespace so a second library in a child process cannot be confused with it.
        let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!(
                "cannot load NCCL library {}: {}",
                path.display(),
                dl_error()
            ));
        }
        let lookup = |name: &str| -> Result<*mut c_void, String> {
            let c_name = CString::new(name).expect("symbol names have no NUL");
            // SAFETY: handle is a live dlopen handle and c_name a valid C string.
            let symbol = unsafe { libc::dlsym(handle, c_name.as_ptr()) };
            if symbol.is_null() {
                Err(format!(
                    "NCCL library {} lacks the symbol {name}",
                    path.display()
                ))
            } else {
                Ok(symbol)
            }
        };
        macro_rules! bind {
            ($name:literal) => {
                // SAFETY: the symbol comes from an NCCL library and the field's type is the
                // C signature nccl.h declares for it.
                unsafe { function_pointer(lookup($name)?) }
            };
        }
        Ok(Nccl {
            _handle: handle,
            get_version: bind!("ncclGetVersion"),
            get_unique_id: bind!("ncclGetUniqueId"),
            comm_init_rank: bind!("ncclCommInitRank"),
            comm_destroy: bind!("ncclCommDestroy"),
            comm_abort: bind!("ncclCommAbort"),
            comm_get_async_error: bind!("ncclCommGetAsyncError"),
            get_error_string: bind!("ncclGetErrorString"),
            get_last_error: bind!("ncclGetLastError"),
            group_start: bind!("ncclGroupStart"),
            group_end: bind!("ncclGroupEnd"),
            red_op_create_pre_mul_sum: bind!("ncclRedOpCreatePreMulSum"),
            red_op_destroy: bind!("ncclRedOpDestroy"),
            all_reduce: bind!("ncclAllReduce"),
            reduce: bind!("ncclReduce"),
            reduce_scatter: bind!("ncclReduceScatter"),
            all_gather: bind!("ncclAllGather"),
            broadcast: bind!("ncclBroadcast"),
            alltoall: bind!("ncclAlltoAll"),
            gather: bind!("ncclGather"),
            scatter: bind!("ncclScatter"),
            send: bind!("ncclSend"),
            recv: bind!("ncclRecv"),
        })
    }

    /// `ncclGetVersion` as a number (e.g. 22809), or 0 when the call fails.
    pub fn version(&self) -> i32 {
        let mut version = 0;
        // SAFETY: writes one int.
        if unsafe { (self.get_version)(&mut version) } != NCCL_SUCCESS {
            return 0;
        }
        version
    }

    pub fn unique_id(&self) -> Result<UniqueId, NcclError> {
        let mut id = UniqueId { internal: [0; 128] };
        // SAFETY: writes 128 bytes into id.
        let result = unsafe { (self.get_unique_id)(&mut id) };
        self.check(result, "ncclGetUniqueId", std::ptr::null_mut())?;
        Ok(id)
    }

    /// The library's text for a result code.
    pub fn error_string(&self, result: NcclResult) -> String {
        // SAFETY: ncclGetErrorString returns a static string for any code.
        let text = unsafe { (self.get_error_string)(result) };
        if text.is_null() {
            format!("error {result}")
        } else {
            // SAFETY: non-null results are NUL-terminated.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        }
    }

    /// The library's last error message (for `comm`, or the global one when null).
    pub fn last_error(&self, comm: Comm) -> String {
        // SAFETY: ncclGetLastError accepts a communicator or null.
        let text = unsafe { (self.get_last_error)(comm) };
        if text.is_null() {
            String::new()
        } else {
            // SAFETY: non-null results are NUL-terminated.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        }
    }

    /// The error for a failed call: the call, the code and both of the library's messages.
    pub fn error(&self, result: NcclResult, what: &str, comm: Comm) -> NcclError {
        NcclError {
            what: what.to_string(),
            result,
            text: self.error_string(result),
            last: self.last_error(comm).trim().to_string(),
        }
    }

    /// Turn a result code into an error naming the call and quoting both of the library's
    /// messages.
    pub fn check(&self, result: NcclResult, what: &str, comm: Comm) -> Result<(), NcclError> {
        if result == NCCL_SUCCESS {
            Ok(())
        } else {
            Err(self.error(result, what, comm))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_hex_round_trip() {
        let mut id = UniqueId { internal: [0; 128] };
        for (i, b) in id.internal.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let hex = id.hex();
        assert_eq!(hex.len(), 256);
        assert_eq!(UniqueId::from_hex(&hex).unwrap().internal, id.internal);
        assert!(UniqueId::from_hex("abc").is_err());
        assert!(UniqueId::from_hex(&"zz".repeat(128)).is_err());
    }

    #[test]
    fn missing_library_is_named() {
        let error = Nccl::load(Path::new("/nonexistent/libnccl.so.2"))
            .err()
            .expect("must fail");
        assert!(error.contains("/nonexistent/libnccl.so.2"), "{error}");
        assert!(error.contains("does not exist"), "{error}");
    }

    #[test]
    fn result_names_and_refusals() {
        assert_eq!(result_name(5), "ncclInvalidUsage");
        assert_eq!(result_name(4), "ncclInvalidArgument");
        assert_eq!(result_name(42), "unknown ncclResult_t");
        assert!(is_refusal(NCCL_INVALID_USAGE) && is_refusal(NCCL_INVALID_ARGUMENT));
        assert!(!is_refusal(2) && !is_refusal(3) && !is_refusal(NCCL_SUCCESS));
        let error = NcclError {
            what: "ncclCommInitRank (rank 1 of 2)".into(),
            result: 5,
            text: "invalid usage".into(),
            last: "Duplicate GPU detected".into(),
        };
        assert_eq!(
            error.to_string(),
            "ncclCommInitRank (rank 1 of 2) failed: invalid usage (ncclInvalidUsage, ncclResult 5); last error: Duplicate GPU detected"
        );
    }

    #[test]
    fn library_without_symbols_is_named() {
        // libc exists everywhere and lacks every NCCL symbol.
        let error = Nccl::load(Path::new("libc.so.6")).err().expect("must fail");
        assert!(error.contains("lacks the symbol ncclGetVersion"), "{error}");
    }
}
