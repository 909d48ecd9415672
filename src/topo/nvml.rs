//! NVML, opened at run time (`libnvidia-ml.so.1`) only to count a GPU's active NVLink links.
//! Without NVML every count is 0 and the topology falls back to PCIe estimates.

use once_cell::sync::OnceCell;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};

type NvmlReturn = c_int;
type NvmlDevice = *mut c_void;

struct Nvml {
    get_handle: unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> NvmlReturn,
    link_state: unsafe extern "C" fn(NvmlDevice, c_uint, *mut c_int) -> NvmlReturn,
}

// SAFETY: function pointers into a library that stays loaded for the process lifetime.
unsafe impl Send for Nvml {}
// SAFETY: NVML functions are thread-safe.
unsafe impl Sync for Nvml {}

static NVML: OnceCell<Option<Nvml>> = OnceCell::new();

fn load() -> Option<Nvml> {
    // SAFETY: dlopen/dlsym with NUL-terminated names; the library is never closed, so the
    // function pointers stay valid. Signatures follow nvml.h.
    unsafe {
        let lib = libc::dlopen(
            c"libnvidia-ml.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        );
        if lib.is_null() {
            return None;
        }
        let sym = |name: &std::ffi::CStr| {
            let p = libc::dlsym(lib, name.as_ptr());
            (!p.is_null()).then_some(p)
        };
        let init: unsafe extern "C" fn() -> NvmlReturn = std::mem::transmute(sym(c"nvmlInit_v2")?);
        if init() != 0 {
            return None;
        }
        Some(Nvml {
            get_handle: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> NvmlReturn,
            >(sym(c"nvmlDeviceGetHandleByPciBusId_v2")?),
            link_state: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(NvmlDevice, c_uint, *mut c_int) -> NvmlReturn,
            >(sym(c"nvmlDeviceGetNvLinkState")?),
        })
    }
}

/// Active NVLink links of the GPU at `bus_id` (0 if NVML or NVLink is absent).
pub fn nvlink_count(bus_id: &str) -> u32 {
    const MAX_LINKS: c_uint = 18;
    let Some(nvml) = NVML.get_or_init(load) else {
        return 0;
    };
    let Ok(bus) = CString::new(bus_id) else {
        return 0;
    };
    let mut dev: NvmlDevice = std::ptr::null_mut();
    // SAFETY: bus is NUL-terminated; writes one handle.
    if unsafe { (nvml.get_handle)(bus.as_ptr(), &mut dev) } != 0 {
        return 0;
    }
    (0..MAX_LINKS)
        .filter(|&link| {
            let mut active: c_int = 0;
            // SAFETY: dev is a valid handle; writes one int.
            unsafe { (nvml.link_state)(dev, link, &mut active) == 0 && active == 1 }
        })
        .count() as u32
}
