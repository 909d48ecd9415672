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

/// The `alloc` mapping that holds `ptr`: its base and size.
fn mapping_of(ptr: u64) -> Option<(u64, usize)> {
    MAPPINGS
        .lock()
        .iter()
        .find(|(&base, m)| ptr >= base && ptr < base + m.size as u64)
        .map(|(&base, m)| (base, m.size))
}

/// Memory from `alloc` holding `ptr`, exported for another process: a POSIX file descriptor
/// of the allocation, its size, and `ptr`'s offset in it. `None` for other memory.
pub fn export(ptr: u64) -> Result<Option<(std::os::fd::OwnedFd, usize, u64)>> {
    use std::os::fd::FromRawFd;
    let Some((base, size)) = mapping_of(ptr) else {
        return Ok(None);
    };
    let handle = MAPPINGS.lock().get(&base).map(|m| m.handle).unwrap_or(0);
    let mut fd: std::os::raw::c_int = -1;
    // SAFETY: handle is a live allocation of `alloc`, created exportable as a POSIX fd; writes
    // one int.
    check(
        unsafe {
            sys::cuMemExportToShareableHandle(
                &mut fd as *mut _ as *mut std::ffi::c_void,
                handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        },
        "cuMemExportToShareableHandle",
    )?;
    // SAFETY: the driver returned a new descriptor that we own.
    Ok(Some((
        unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) },
        size,
        ptr - base,
    )))
}

/// Another process's allocation mapped here (read-write for the current device); unmapped on
/// drop.
pub struct Imported {
    pub ptr: u64,
    size: usize,
}

impl Drop for Imported {
    fn drop(&mut self) {
        // SAFETY: ptr/size describe the mapping made by `import`, unmapped once.
        unsafe {
            sys::cuMemUnmap(self.ptr, self.size);
            sys::cuMemAddressFree(self.ptr, self.size);
        }
    }
}

/// Map an allocation of `size` bytes exported by another process as `fd`.
pub fn import(fd: &std::os::fd::OwnedFd, size: usize) -> Result<Imported> {
    use std::os::fd::AsRawFd;
    let dev = current_device()?;
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: fd is an exported allocation; the driver reads the descriptor's value.
    check(
        unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as isize as *mut std::ffi::c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        },
        "cuMemImportFromShareableHandle",
    )?;
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: reserves address space only; writes one pointer. Each failure below undoes
    // what succeeded before it.
    let mapped = unsafe {
        check(
            sys::cuMemAddressReserve(&mut ptr, size, 0, 0, 0),
            "cuMemAddressReserve",
        )
        .and_then(|()| {
            check(sys::cuMemMap(ptr, size, 0, handle, 0), "cuMemMap").inspect_err(|_| {
                sys::cuMemAddressFree(ptr, size);
            })
        })
    };
    // SAFETY: the mapping (if any) keeps the allocation alive; this reference is dropped.
    unsafe { sys::cuMemRelease(handle) };
    mapped?;
    let imported = Imported { ptr, size };
    let desc = sys::CUmemAccessDesc {
        location: location(dev),
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: ptr..ptr+size is mapped above; one descriptor.
    check(
        unsafe { sys::cuMemSetAccess(ptr, size, &desc, 1) },
        "cuMemSetAccess",
    )?;
    Ok(imported)
}
