//! The `extern "C"` entry points, one file per family. Each one validates its arguments,
//! catches panics, maps errors to `ncclResult_t` and records the message for
//! `ncclGetLastError`; the work itself is done by `core`. Every function is written once, as
//! `#[no_mangle] pub extern "C" fn ncclX` (which cbindgen reads for `include/nccl.h`), and
//! starts with `export!(ncclX)`: that exports the profiling alias `pncclX` as a second name of
//! the same code and gives the body its name for messages.
#![allow(non_snake_case)]
// C entry points receive raw pointers by definition; each one checks them before use.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod coll;
pub mod coll_config;
pub mod comm;
pub mod device;
pub mod group;
pub mod mem;
pub mod misc;
pub mod p2p;
pub mod param;
pub mod rma;

use crate::abi::{ncclComm_t, ncclResult_t};
use crate::core::Comm;
use crate::error::{Error, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// Export the C entry point `$f` (an `ncclX` function of the enclosing body) a second time, as
/// the profiling alias `p$f` at the same address, and, in the form `export!($f, name)`, bind
/// `name` to `"$f"` for messages. Used as the first statement of the entry point itself.
///
/// The alias is an assembler-level symbol (`.set pncclX, ncclX`): it copies the function's type
/// and size, and `build.rs` adds a version script that keeps every `pnccl*` symbol global (rustc
/// exports only the Rust-level `#[no_mangle]` items). tests/header.rs writes the alias's
/// prototype next to each entry point's in `include/nccl.h`.
macro_rules! export {
    ($f:ident) => {
        // `$f` must name an existing function (a typo fails here, not at link time).
        const _: () = {
            let _ = $f;
        };
        mod alias {
            //! The profiling alias `pncclX` of the enclosing entry point `ncclX`.
            ::core::arch::global_asm!(concat!(
                ".globl p",
                stringify!($f),
                "\n.set p",
                stringify!($f),
                ", ",
                stringify!($f)
            ));
        }
    };
    ($f:ident, $name:ident) => {
        export!($f);
        let $name: &'static str = stringify!($f);
    };
}
pub(crate) use export;

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
            crate::debug::log(
                crate::debug::Level::Warn,
                crate::debug::subsys::ALL,
                crate::debug::Site::at(e.origin),
                format_args!("{msg}"),
            );
            crate::error::set_thread_last_error(&msg);
            if let Ok(c) = Comm::from_handle(comm) {
                c.last_error.set(&msg);
            }
            e.code
        }
    }
}

/// The communicator behind a handle, or `ncclInvalidArgument` for NULL or unknown handles.
pub(crate) fn find_comm(handle: ncclComm_t) -> Result<Arc<Comm>> {
    Comm::from_handle(handle)
}

/// A caller's out-pointer, checked non-NULL when it was made (by [`out`] or [`out_or`]).
pub(crate) struct Out<T>(*mut T);

impl<T: Copy> Out<T> {
    /// Store `value` for the caller (plain data only: nothing is dropped in the slot).
    pub(crate) fn write(&self, value: T) {
        // SAFETY: the pointer was checked non-NULL when `self` was made, and the C caller
        // passes a writable `T` (NCCL's contract); an unaligned write assumes no alignment.
        unsafe { self.0.write_unaligned(value) }
    }
}

impl<T> Out<T> {
    /// The checked pointer, for `core` functions that store into it themselves.
    pub(crate) fn as_ptr(&self) -> *mut T {
        self.0
    }
}

/// Check an out-pointer: NULL is `ncclInvalidArgument` with "`what` argument is NULL".
pub(crate) fn out<T>(p: *mut T, what: &str) -> Result<Out<T>> {
    out_or(p, || {
        Error::invalid_argument(format!("{what} argument is NULL"))
    })
}

/// Check an out-pointer, with the error `null` for NULL (where NVIDIA's is not the usual one).
pub(crate) fn out_or<T>(p: *mut T, null: impl FnOnce() -> Error) -> Result<Out<T>> {
    if p.is_null() {
        return Err(null());
    }
    Ok(Out(p))
}
