//! The dynamic loader, thinly: open a shared library (`dlopen` with `RTLD_NOW | RTLD_LOCAL`,
//! as NVIDIA's plugin loader), look a symbol up, name the file a symbol came from, close it.

use std::ffi::{CStr, CString};
use std::os::raw::c_void;

/// An open shared library; closed (`dlclose`) when dropped.
pub struct Library {
    /// The `dlopen` handle, as a number so that the type is `Send` and `Sync` (the loader's
    /// handles may be used from any thread).
    handle: usize,
}

/// Why `dlopen` failed: `dlerror`'s text, and whether it says the file does not exist.
#[derive(Debug)]
pub struct OpenError {
    pub not_found: bool,
    pub text: String,
}

impl Library {
    /// Open `name` (a file name searched like `dlopen` does, or a path); `None` opens the
    /// program itself (NVIDIA's `STATIC_PLUGIN`).
    pub fn open(name: Option<&str>) -> Result<Library, OpenError> {
        let cname = match name.map(CString::new) {
            Some(Ok(c)) => Some(c),
            Some(Err(_)) => {
                return Err(OpenError {
                    not_found: false,
                    text: "name contains a NUL byte".into(),
                })
            }
            None => None,
        };
        let ptr = cname.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        // SAFETY: ptr is NULL or a NUL-terminated string that outlives the call.
        let handle = unsafe { libc::dlopen(ptr, libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            let text = last_error();
            // NVIDIA's test: the message names the file and says it does not exist.
            let not_found =
                text.contains("No such file or directory") && name.is_none_or(|n| text.contains(n));
            return Err(OpenError { not_found, text });
        }
        Ok(Library {
            handle: handle as usize,
        })
    }

    /// The address of `symbol`, or None when the library does not define it.
    pub fn symbol(&self, symbol: &CStr) -> Option<*const c_void> {
        // SAFETY: handle is a live dlopen handle (closed only in drop); symbol is
        // NUL-terminated.
        let addr = unsafe { libc::dlsym(self.handle as *mut c_void, symbol.as_ptr()) };
        (!addr.is_null()).then_some(addr as *const c_void)
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: handle came from dlopen and is closed once, here.
        unsafe { libc::dlclose(self.handle as *mut c_void) };
    }
}

/// The path of the loaded object that holds the address `addr` (NVIDIA prints it when a
/// plugin loads).
pub fn file_of(addr: usize) -> Option<String> {
    // SAFETY: Dl_info is plain data; all-zero is a valid value for dladdr to fill.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads addr's value and writes info.
    let found = unsafe { libc::dladdr(addr as *const c_void, &mut info) } != 0;
    if !found || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader, valid while the
    // object stays loaded (it is: the caller holds it open).
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(name.to_string_lossy().into_owned())
}

/// `dlerror`'s text for the last failure on this thread.
fn last_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call
    // on this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown dlopen error".into();
    }
    // SAFETY: p is non-NULL and NUL-terminated (above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
