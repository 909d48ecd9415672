//! Memory: `ncclMemAlloc`/`ncclMemFree`, buffer registration and windows.

use super::{entry, export, find_comm, out, out_or};
use crate::abi::{ncclComm_t, ncclResult_t, ncclWindow_t};
use crate::error::Error;
use std::os::raw::{c_int, c_void};

#[no_mangle]
pub extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    export!(ncclMemAlloc, name);
    entry(name, std::ptr::null_mut(), || {
        // NVIDIA passes the NULL pointer on to cudaMalloc, which fails: a CUDA error.
        let ptr = out_or(ptr, || {
            Error::cuda("ptr argument is NULL (cudaMalloc fails with cudaErrorInvalidValue)")
        })?;
        if size == 0 {
            return Err(Error::invalid_argument("size is 0"));
        }
        ptr.write(crate::cuda::vmm::alloc(size)? as *mut c_void);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclMemFree(ptr: *mut c_void) -> ncclResult_t {
    export!(ncclMemFree, name);
    entry(name, std::ptr::null_mut(), || {
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
pub extern "C" fn ncclCommRegister(
    c: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> ncclResult_t {
    export!(ncclCommRegister, name);
    entry(name, c, || {
        let c = find_comm(c)?;
        let handle = out(handle, "handle")?;
        if buff.is_null() || size == 0 {
            return Err(Error::invalid_argument("buff is NULL or size is 0"));
        }
        c.check_usable()?;
        if c.check_mode != crate::core::watchdog::check::Mode::Default {
            super::coll::check_pointer(buff as u64, "buff", c.cuda_dev)?;
        }
        handle.write(c.registrations.register(buff as u64, size) as *mut c_void);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclCommDeregister(c: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
    export!(ncclCommDeregister, name);
    entry(name, c, || {
        let c = find_comm(c)?;
        if handle.is_null() {
            return Err(Error::invalid_argument("handle is NULL"));
        }
        c.registrations.deregister(handle as u64)
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
    export!(ncclCommWindowRegister, name);
    entry(name, c, || {
        let comm = find_comm(c)?;
        let win = out(win, "win")?;
        if buff.is_null() || size == 0 {
            return Err(Error::invalid_argument("buff is NULL or size is 0"));
        }
        comm.check_usable()?;
        // Collective: inside a group it runs at the group's end, beside the other ranks'.
        let (ptr, slot) = (buff as u64, win.as_ptr() as usize);
        crate::core::group::submit_init(crate::core::group::InitWork {
            blocking: true,
            run: Box::new(move || {
                let handle = crate::core::window::register(&comm, ptr, size, winFlags)?;
                // SAFETY: `slot` is the caller's non-NULL `ncclWindow_t*`, which NCCL's
                // contract keeps valid until the registration completes.
                unsafe { (slot as *mut ncclWindow_t).write_unaligned(handle) };
                Ok(())
            }),
        })
    })
}

#[no_mangle]
pub extern "C" fn ncclCommWindowDeregister(c: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
    export!(ncclCommWindowDeregister, name);
    entry(name, c, || {
        if win.is_null() {
            // NVIDIA's library returns success for a NULL window, whatever the communicator.
            return Ok(());
        }
        let comm = find_comm(c)?;
        crate::core::window::find(win)?;
        let handle = win as usize;
        crate::core::group::submit_init(crate::core::group::InitWork {
            blocking: true,
            run: Box::new(move || crate::core::window::deregister(&comm, handle as ncclWindow_t)),
        })
    })
}

#[no_mangle]
pub extern "C" fn ncclWinGetUserPtr(
    comm: ncclComm_t,
    win: ncclWindow_t,
    outUserPtr: *mut *mut c_void,
) -> ncclResult_t {
    export!(ncclWinGetUserPtr, name);
    entry(name, comm, || {
        find_comm(comm)?;
        let slot = out(outUserPtr, "outUserPtr")?;
        let w = crate::core::window::find(win)?;
        slot.write(w.user_ptr as *mut c_void);
        Ok(())
    })
}
