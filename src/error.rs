//! Errors: the one `Error` type every layer returns, its mapping to `ncclResult_t`, the
//! text of `ncclGetErrorString`, and the "last error" messages behind `ncclGetLastError`
//! (one per thread, one per communicator).

use crate::abi::ncclResult_t;
use parking_lot::Mutex;
use std::cell::RefCell;
use std::ffi::CString;
use std::fmt;
use std::panic::Location;

/// An error with the NCCL code it maps to, a message for `ncclGetLastError`, and where in
/// oxccl it was made (the file and line a WARN names, as NVIDIA's name theirs).
#[derive(Clone, Debug)]
pub struct Error {
    pub code: ncclResult_t,
    pub msg: String,
    pub origin: &'static Location<'static>,
}

/// Errors are equal when their code and message are: where they were made does not matter.
impl PartialEq for Error {
    fn eq(&self, other: &Self) -> bool {
        self.code == other.code && self.msg == other.msg
    }
}

impl Eq for Error {}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    #[track_caller]
    pub fn new(code: ncclResult_t, msg: impl Into<String>) -> Self {
        Error {
            code,
            msg: msg.into(),
            origin: Location::caller(),
        }
    }
    #[track_caller]
    pub fn invalid_argument(msg: impl Into<String>) -> Self {
        Self::new(ncclResult_t::ncclInvalidArgument, msg)
    }
    #[track_caller]
    pub fn invalid_usage(msg: impl Into<String>) -> Self {
        Self::new(ncclResult_t::ncclInvalidUsage, msg)
    }
    #[track_caller]
    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(ncclResult_t::ncclInternalError, msg)
    }
    #[track_caller]
    pub fn system(msg: impl Into<String>) -> Self {
        Self::new(ncclResult_t::ncclSystemError, msg)
    }
    #[track_caller]
    pub fn cuda(msg: impl Into<String>) -> Self {
        Self::new(ncclResult_t::ncclUnhandledCudaError, msg)
    }
    #[track_caller]
    pub fn remote(msg: impl Into<String>) -> Self {
        Self::new(ncclResult_t::ncclRemoteError, msg)
    }
    /// The error for an entry point that exists in the ABI but is not built yet.
    #[track_caller]
    pub fn unsupported(function: &str) -> Self {
        Self::invalid_usage(format!("{function} is not yet supported by oxccl"))
    }
    /// Prefix the message with where it happened, keeping the code.
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.msg = format!("{what}: {}", self.msg);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.msg, error_string(self.code as i32))
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    #[track_caller]
    fn from(e: std::io::Error) -> Self {
        Error::system(e.to_string())
    }
}

/// Return early with an `ncclInvalidArgument` error built from a format string.
#[macro_export]
macro_rules! bail_arg {
    ($($t:tt)*) => { return Err($crate::error::Error::invalid_argument(format!($($t)*))) };
}

/// Return early with an `ncclInvalidUsage` error built from a format string.
#[macro_export]
macro_rules! bail_usage {
    ($($t:tt)*) => { return Err($crate::error::Error::invalid_usage(format!($($t)*))) };
}

/// NCCL's text for each result code (`ncclGetErrorString`), NUL-terminated.
pub fn error_cstr(code: i32) -> &'static std::ffi::CStr {
    match code {
        0 => c"no error",
        1 => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        2 => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        3 => c"internal error - please report this issue to the NCCL developers",
        4 => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        5 => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        6 => c"remote process exited or there was a network error",
        7 => c"NCCL operation in progress",
        8 => c"timeout",
        _ => c"unknown result code",
    }
}

/// `error_cstr` as a Rust string.
pub fn error_string(code: i32) -> &'static str {
    error_cstr(code).to_str().unwrap_or("unknown result code")
}

thread_local! {
    static THREAD_LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Record `msg` as this thread's last error.
pub fn set_thread_last_error(msg: &str) {
    let c = to_cstring(msg);
    THREAD_LAST.with(|l| *l.borrow_mut() = c);
}

/// Clear this thread's last error.
pub fn clear_thread_last_error() {
    THREAD_LAST.with(|l| *l.borrow_mut() = CString::default());
}

/// Pointer to this thread's last error; valid until this thread records another.
pub fn thread_last_error_ptr() -> *const std::os::raw::c_char {
    THREAD_LAST.with(|l| l.borrow().as_ptr())
}

/// A communicator's last error. Strings are kept (never freed while the communicator lives)
/// so a pointer handed to C stays valid even if another thread records a newer error.
#[derive(Default)]
pub struct LastError {
    history: Mutex<Vec<CString>>,
}

impl LastError {
    pub fn set(&self, msg: &str) {
        let mut h = self.history.lock();
        // Keep the history bounded: old pointers are only ever read briefly.
        if h.len() >= 64 {
            h.drain(..32);
        }
        h.push(to_cstring(msg));
    }
    /// The newest message, if one was recorded.
    pub fn text(&self) -> Option<String> {
        let h = self.history.lock();
        h.last().map(|c| c.to_string_lossy().into_owned())
    }
    /// Pointer to the newest message, or None if none was recorded.
    pub fn ptr(&self) -> Option<*const std::os::raw::c_char> {
        self.history.lock().last().map(|c| c.as_ptr())
    }
}

fn to_cstring(msg: &str) -> CString {
    CString::new(msg.replace('\0', " ")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_for_every_code() {
        assert_eq!(error_string(0), "no error");
        assert_eq!(error_string(7), "NCCL operation in progress");
        assert_eq!(error_string(8), "timeout");
        assert_eq!(error_string(9), "unknown result code");
        assert_eq!(error_string(-3), "unknown result code");
    }

    #[test]
    fn thread_last_error_is_per_thread() {
        set_thread_last_error("main thread error");
        std::thread::spawn(|| {
            let p = thread_last_error_ptr();
            // SAFETY: p points to this thread's live CString.
            assert_eq!(unsafe { std::ffi::CStr::from_ptr(p) }.to_str().unwrap(), "");
        })
        .join()
        .unwrap();
        let p = thread_last_error_ptr();
        // SAFETY: p points to this thread's live CString.
        assert_eq!(
            unsafe { std::ffi::CStr::from_ptr(p) }.to_str().unwrap(),
            "main thread error"
        );
    }
}
