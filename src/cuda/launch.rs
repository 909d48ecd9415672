//! Kernel launches: one checked `cuLaunchKernel` wrapper for the embedded kernels.

use super::{check, CUfunction, CUstream};
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::c_void;

/// Launch `func` with the oxccl kernel signature `(const void* items, uint32_t nitems)`.
pub fn launch_items(
    func: CUfunction,
    grid: u32,
    block: u32,
    smem: u32,
    stream: CUstream,
    items: u64,
    nitems: u32,
) -> Result<()> {
    let mut items = items;
    let mut nitems = nitems;
    let mut params: [*mut c_void; 2] = [
        &mut items as *mut u64 as *mut c_void,
        &mut nitems as *mut u32 as *mut c_void,
    ];
    // SAFETY: func is a loaded kernel whose two parameters are a pointer and a u32, matching
    // `params`, which outlives the call (the driver copies the values at launch).
    let res = unsafe {
        sys::cuLaunchKernel(
            func,
            grid,
            1,
            1,
            block,
            1,
            1,
            smem,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    check(res, "cuLaunchKernel")
}
