//! Memory: `ncclMemAlloc`/`ncclMemFree`, buffer registration and windows.

use super::{comm, entry, out_ptr};
use crate::abi::{ncclComm_t, ncclResult_t, ncclWindow_t};
use crate::error::Error;
use std::os::raw::{c_int, c_void};

fn mem_alloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    entry("ncclMemAlloc", std::ptr::null_mut(), || {
        if ptr.is_null() {
            // NVIDIA passes the NULL pointer on to cudaMalloc, which fails: a CUDA error.
            return Err(Error::cuda(
                "ptr argument is NULL (cudaMalloc fails with cudaErrorInvalidValue)",
            ));
        }
        if size == 0 {
            return Err(Error::invalid_argument("size is 0"));
        }
        let p = crate::cuda::vmm::alloc(size)?;
        // SAFETY: checked non-NULL; the caller provides a writable pointer.
        unsafe { *ptr = p as *mut c_void };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    mem_alloc(ptr, size)
}
#[no_mangle]
pub extern "C" fn pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    mem_alloc(ptr, size)
}

fn mem_free(ptr: *mut c_void) -> ncclResult_t {
    entry("ncclMemFree", std::ptr::null_mut(), || {
        if ptr.is_null() {
            return Ok(());
        }
        // NVIDIA asks the driver about the pointer first (cuPointerGetAttribute), so a
        // pointer it did not allocate is a CUDA error there, not an argument error.
        crate::cuda::vmm::free(ptr as u64).map_err(|e| match e.code {
            ncclResult_t::ncclInvalidArgument => Error::cuda(e.msg),
            _ => e,
        })
    })
}

#[no_mangle]
pub extern "C" fn ncclMemFree(ptr: *mut c_void) -> ncclResult_t {
    mem_free(ptr)
}
#[no_mangle]
pub extern "C" fn pncclMemFree(ptr: *mut c_void) -> ncclResult_t {
    mem_free(ptr)
}

fn comm_register(
    c: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> ncclResult_t {
    entry("ncclCommRegister", c, || {
        let c = comm(c)?;
        out_ptr(handle, "handle")?;
        if buff.is_null() || size == 0 {
            return Err(Error::invalid_argument("buff is NULL or size is 0"));
        }
        c.check_usable()?;
        let h = c.registrations.register(buff as u64, size);
        // SAFETY: checked non-NULL; the caller provides a writable pointer.
        unsafe { *handle = h as *mut c_void };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclCommRegister(
    c: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> ncclResult_t {
    comm_register(c, buff, size, handle)
}
#[no_mangle]
pub extern "C" fn pncclCommRegister(
    c: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> ncclResult_t {
    comm_register(c, buff, size, handle)
}

fn comm_deregister(c: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
    entry("ncclCommDeregister", c, || {
        let c = comm(c)?;
        if handle.is_null() {
            return Err(Error::invalid_argument("handle is NULL"));
        }
        c.registrations.deregister(handle as u64)
    })
}

#[no_mangle]
pub extern "C" fn ncclCommDeregister(c: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
    comm_deregister(c, handle)
}
#[no_mangle]
pub extern "C" fn pncclCommDeregister(c: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
    comm_deregister(c, handle)
}

fn window_register(
    c: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut ncclWindow_t,
    flags: c_int,
) -> ncclResult_t {
    entry("ncclCommWindowRegister", c, || {
        comm(c)?;
        out_ptr(win, "win")?;
        if buff.is_null() || size == 0 {
            return Err(Error::invalid_argument("buff is NULL or size is 0"));
        }
        if flags & !0x01 != 0 {
            return Err(Error::invalid_argument(format!(
                "unknown window flags {flags:#x}"
            )));
        }
        Err(Error::unsupported("ncclCommWindowRegister"))
    })
}

#[no_mangle]
pub extern "C" fn ncclCommWindowRegister(
    c: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut ncclWindow_t,
    winFlags: c_int,
) -> ncclResult_t {
    window_register(c, buff, size, win, winFlags)
}
#[no_mangle]
pub extern "C" fn pncclCommWindowRegister(
    c: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut ncclWindow_t,
    winFlags: c_int,
) -> ncclResult_t {
    window_register(c, buff, size, win, winFlags)
}

fn window_deregister(c: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
    entry("ncclCommWindowDeregister", c, || {
        if win.is_null() {
            // NVIDIA's library returns success for a NULL window, whatever the communicator.
            return Ok(());
        }
        comm(c)?;
        Err(Error::unsupported("ncclCommWindowDeregister"))
    })
}

#[no_mangle]
pub extern "C" fn ncclCommWindowDeregister(c: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
    window_deregister(c, win)
}
#[no_mangle]
pub extern "C" fn pncclCommWindowDeregister(c: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
    window_deregister(c, win)
}
