//! Device memory from the driver's virtual memory API (`cuMemCreate` + `cuMemMap`), created
//! exportable as a POSIX file descriptor so other processes can map it: what `ncclMemAlloc`
//! returns and what cross-process transports share.

use super::{check, current_device, driver};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::HashMap;

struct Mapping {
    handle: sys::CUmemGenericAllocationHandle,
    size: usize,
}

static MAPPINGS: Lazy<Mutex<HashMap<u64, Mapping>>> = Lazy::new(|| Mutex::new(HashMap::new()));

fn location(dev: i32) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: dev,
    }
}

fn allocation_prop(dev: i32) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes:
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: location(dev),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// Allocate `size` bytes on the current device, readable and writable from this device and
/// every device that can access it as a peer. Returns the pointer; the size is rounded up to
/// the allocation granularity.
pub fn alloc(size: usize) -> Result<u64> {
    driver()?;
    let dev = current_device()?;
    let prop = allocation_prop(dev);
    let mut gran = 0usize;
    // SAFETY: prop is fully initialised; writes one size.
    check(
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut gran,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
        },
        "cuMemGetAllocationGranularity",
    )?;
    let gran = gran.max(1);
    let size = size.div_ceil(gran) * gran;
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: prop is valid; writes one handle.
    check(
        unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) },
        "cuMemCreate",
    )?;
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: reserves address space only; writes one pointer.
    if let Err(e) = check(
        unsafe { sys::cuMemAddressReserve(&mut ptr, size, gran, 0, 0) },
        "cuMemAddressReserve",
    ) {
        // SAFETY: handle was created above and is not mapped.
        unsafe { sys::cuMemRelease(handle) };
        return Err(e);
    }
    let undo = |ptr, handle| {
        // SAFETY: undoing the steps above on failure; each resource is released once.
        unsafe {
            sys::cuMemUnmap(ptr, size);
            sys::cuMemAddressFree(ptr, size);
            sys::cuMemRelease(handle);
        }
    };
    // SAFETY: ptr..ptr+size was reserved above and handle holds `size` bytes.
    if let Err(e) = check(
        unsafe { sys::cuMemMap(ptr, size, 0, handle, 0) },
        "cuMemMap",
    ) {
        undo(ptr, handle);
        return Err(e);
    }
    let mut descs = vec![sys::CUmemAccessDesc {
        location: location(dev),
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }];
    for peer in 0..super::device_count()? {
        let mut can = 0;
        // SAFETY: writes one int.
        if peer != dev
            && unsafe { sys::cuDeviceCanAccessPeer(&mut can, peer, dev) }
                == sys::CUresult::CUDA_SUCCESS
            && can == 1
        {
            descs.push(sys::CUmemAccessDesc {
                location: location(peer),
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            });
        }
    }
    // SAFETY: descs is a live array of descs.len() descriptors for the mapped range.
    if let Err(e) = check(
        unsafe { sys::cuMemSetAccess(ptr, size, descs.as_ptr(), descs.len()) },
        "cuMemSetAccess",
    ) {
        undo(ptr, handle);
        return Err(e);
    }
    MAPPINGS.lock().insert(ptr, Mapping { handle, size });
    crate::info!(
        ALLOC,
        "ncclMemAlloc: {size} bytes at {ptr:#x} on device {dev}"
    );
    Ok(ptr)
}

/// Free memory from `alloc`. Pointers `alloc` did not return are `ncclInvalidArgument`.
pub fn free(ptr: u64) -> Result<()> {
    let m = MAPPINGS.lock().remove(&ptr).ok_or_else(|| {
        Error::invalid_argument(format!(
            "pointer {ptr:#x} was not allocated by ncclMemAlloc"
        ))
    })?;
    // SAFETY: ptr/m describe a mapping made by alloc, removed from the table so freed once.
    unsafe {
        check(sys::cuMemUnmap(ptr, m.size), "cuMemUnmap")?;
        check(sys::cuMemAddressFree(ptr, m.size), "cuMemAddressFree")?;
        check(sys::cuMemRelease(m.handle), "cuMemRelease")?;
    }
    Ok(())
}
