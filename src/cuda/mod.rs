//! The only place that talks to the CUDA driver. libcuda is opened at run time (cudarc's
//! dynamic loading); without it every call fails with a message that says so. Each wrapper
//! checks the driver's result and turns failures into `ncclUnhandledCudaError` with the
//! driver's own text.

// Driver handles (contexts, streams) are opaque pointers the driver validates itself.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod module;
pub mod vmm;

use crate::error::{Error, Result};
use cudarc::driver::sys;
use once_cell::sync::OnceCell;
use std::ffi::CStr;

pub use sys::{CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUmodule, CUstream};

static DRIVER: OnceCell<std::result::Result<(), Error>> = OnceCell::new();

/// Load libcuda and initialise the driver once; every later call sees the same outcome.
pub fn driver() -> Result<()> {
    DRIVER
        .get_or_init(|| {
            // SAFETY: is_culib_present only tries to dlopen candidate library names.
            if !unsafe { sys::is_culib_present() } {
                return Err(Error::system(
                    "the NVIDIA driver library libcuda.so.1 could not be loaded: is an NVIDIA driver installed?",
                ));
            }
            // SAFETY: libcuda is present; cuInit takes a flags word that must be 0.
            check(unsafe { sys::cuInit(0) }, "cuInit")
        })
        .clone()
}

/// The driver's name and text for a result code.
pub fn error_text(res: sys::CUresult) -> String {
    let mut name: *const std::os::raw::c_char = std::ptr::null();
    let mut text: *const std::os::raw::c_char = std::ptr::null();
    // SAFETY: both calls only write a pointer to a static string into our out-parameters.
    unsafe {
        sys::cuGetErrorName(res, &mut name);
        sys::cuGetErrorString(res, &mut text);
    }
    let show = |p: *const std::os::raw::c_char| {
        if p.is_null() {
            format!("{res:?}")
        } else {
            // SAFETY: the driver returns NUL-terminated static strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    format!("{} ({})", show(text), show(name))
}

/// Turn a driver result into our error, naming the call that failed.
pub fn check(res: sys::CUresult, what: &str) -> Result<()> {
    if res == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::cuda(format!(
            "Cuda failure '{}' in {what}",
            error_text(res)
        )))
    }
}

/// Number of visible CUDA devices.
pub fn device_count() -> Result<i32> {
    driver()?;
    let mut n = 0;
    // SAFETY: writes one int.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n)
}

/// The device of the calling thread's current context, as `cudaGetDevice` reports it
/// (device 0 when the thread has no current context yet).
pub fn current_device() -> Result<i32> {
    driver()?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: writes one handle.
    check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
    if ctx.is_null() {
        return Ok(0);
    }
    let mut dev: CUdevice = 0;
    // SAFETY: a context is current; writes one int.
    check(unsafe { sys::cuCtxGetDevice(&mut dev) }, "cuCtxGetDevice")?;
    Ok(dev)
}

/// Retain device `dev`'s primary context (the one the runtime API uses) and make it current
/// on this thread. Returns the context; primary contexts live until the process exits.
pub fn use_device(dev: i32) -> Result<CUcontext> {
    driver()?;
    let n = device_count()?;
    if dev < 0 || dev >= n {
        return Err(Error::invalid_argument(format!(
            "CUDA device {dev} does not exist ({n} visible)"
        )));
    }
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: dev is a valid ordinal; writes one handle.
    check(
        unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
        "cuDevicePrimaryCtxRetain",
    )?;
    // SAFETY: ctx was just retained.
    check(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")?;
    crate::debug::set_thread_device(dev);
    Ok(ctx)
}

/// Make `ctx` current on this thread.
pub fn set_current(ctx: CUcontext) -> Result<()> {
    // SAFETY: ctx is a retained primary context.
    check(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")
}

/// Free and total memory of the current context's device.
pub fn mem_info() -> Result<(usize, usize)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: writes two sizes.
    check(
        unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
        "cuMemGetInfo",
    )?;
    Ok((free, total))
}

/// An integer attribute of a device.
pub fn device_attribute(dev: i32, attr: sys::CUdevice_attribute) -> Result<i32> {
    let mut v = 0;
    // SAFETY: writes one int.
    check(
        unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) },
        "cuDeviceGetAttribute",
    )?;
    Ok(v)
}

/// The PCI bus id string of a device, e.g. `0000:19:00.0`.
pub fn pci_bus_id(dev: i32) -> Result<String> {
    let mut buf = [0 as std::os::raw::c_char; 64];
    // SAFETY: buf holds 64 bytes, as passed.
    check(
        unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) },
        "cuDeviceGetPCIBusId",
    )?;
    // SAFETY: the driver NUL-terminates within the buffer.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .to_ascii_lowercase())
}

/// Device memory from `cuMemAlloc` in the current context.
pub fn mem_alloc(bytes: usize) -> Result<CUdeviceptr> {
    let mut p: CUdeviceptr = 0;
    // SAFETY: writes one pointer.
    check(
        unsafe { sys::cuMemAlloc_v2(&mut p, bytes.max(1)) },
        "cuMemAlloc",
    )?;
    Ok(p)
}

/// Free memory from `mem_alloc`.
pub fn mem_free(p: CUdeviceptr) -> Result<()> {
    // SAFETY: p came from cuMemAlloc and is freed once by its owner.
    check(unsafe { sys::cuMemFree_v2(p) }, "cuMemFree")
}

/// Synchronous host-to-device copy.
pub fn copy_to_device(dst: CUdeviceptr, src: &[u8]) -> Result<()> {
    // SAFETY: src is a valid host slice; dst is device memory of at least src.len() bytes
    // (the caller's contract).
    check(
        unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) },
        "cuMemcpyHtoD",
    )
}

/// Synchronous device-to-host copy.
pub fn copy_from_device(dst: &mut [u8], src: CUdeviceptr) -> Result<()> {
    // SAFETY: dst is a valid host slice; src holds at least dst.len() bytes (caller's contract).
    check(
        unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len()) },
        "cuMemcpyDtoH",
    )
}

/// Fill device memory with zero bytes, synchronously.
pub fn memset_zero(dst: CUdeviceptr, bytes: usize) -> Result<()> {
    // SAFETY: dst holds at least `bytes` bytes (caller's contract).
    check(unsafe { sys::cuMemsetD8_v2(dst, 0, bytes) }, "cuMemsetD8")
}

/// Wait for all work of the current context.
pub fn ctx_synchronize() -> Result<()> {
    // SAFETY: no arguments.
    check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
}

/// Wait for all work queued on `stream`.
pub fn stream_synchronize(stream: CUstream) -> Result<()> {
    // SAFETY: stream is a live stream handle (or null for the legacy default stream).
    check(
        unsafe { sys::cuStreamSynchronize(stream) },
        "cuStreamSynchronize",
    )
}

/// Whether a stream is being captured into a CUDA graph.
pub fn stream_is_capturing(stream: CUstream) -> Result<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: writes one enum.
    check(
        unsafe { sys::cuStreamIsCapturing(stream, &mut status) },
        "cuStreamIsCapturing",
    )?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}
