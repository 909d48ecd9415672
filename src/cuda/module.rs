//! The embedded kernels: the fatbin that build.rs compiles from `kernels/`, loaded once per
//! context on first use, lookup of kernel functions by name (`kernel`, or a `Kernels` memo of
//! one context, which the per-call path uses: no lock, no driver call but the launch), and
//! the launch wrappers, which take a looked-up `Kernel`.

use super::{check, driver, CUcontext, CUfunction, CUmodule, CUstream};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_void, CString};

/// The fatbin of every kernel in `kernels/` (SASS for the built architectures plus PTX).
pub static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/oxccl_kernels.fatbin"));

pub use crate::sched::device::{COPY_KERNEL, INLINE_KERNEL, MAIN_KERNEL, YIELD_KERNEL};

/// Loaded modules and looked-up functions, keyed by context (handles kept as integers so the
/// maps are `Send`; primary contexts live until the process exits).
#[derive(Default)]
struct Cache {
    modules: HashMap<usize, usize>,
    functions: HashMap<(usize, &'static str), usize>,
}

static CACHE: Lazy<Mutex<Cache>> = Lazy::new(|| Mutex::new(Cache::default()));

fn current_context() -> Result<CUcontext> {
    driver()?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: writes one handle.
    check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
    if ctx.is_null() {
        return Err(Error::internal(
            "no CUDA context is current on this thread: cannot load the oxccl kernels",
        ));
    }
    Ok(ctx)
}

fn module_locked(cache: &mut Cache, ctx: CUcontext) -> Result<CUmodule> {
    if let Some(&m) = cache.modules.get(&(ctx as usize)) {
        return Ok(m as CUmodule);
    }
    let mut module: CUmodule = std::ptr::null_mut();
    // SAFETY: FATBIN is a complete fatbin image that lives for the whole program; the driver
    // copies what it needs and writes one handle.
    check(
        unsafe { sys::cuModuleLoadData(&mut module, FATBIN.as_ptr().cast()) },
        "cuModuleLoadData (oxccl kernels: was the library built for this GPU's architecture? \
         see OXCCL_CUDA_ARCHS)",
    )?;
    cache.modules.insert(ctx as usize, module as usize);
    Ok(module)
}

/// The kernels' module in the current context, loaded on first use.
pub fn module() -> Result<CUmodule> {
    let ctx = current_context()?;
    module_locked(&mut CACHE.lock(), ctx)
}

/// A kernel of the embedded module, ready to launch in the context it was looked up in.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    func: usize,
    pub name: &'static str,
}

/// The kernel `name` of the embedded module in the current context.
pub fn kernel(name: &'static str) -> Result<Kernel> {
    Ok(Kernel {
        func: function(name)? as usize,
        name,
    })
}

/// The kernels of one context looked up so far: after its first launch of a kernel, a
/// runtime finds it here without the driver's current context or the process-wide cache.
pub struct Kernels {
    ctx: usize,
    found: Vec<Kernel>,
}

impl Kernels {
    pub fn new(ctx: CUcontext) -> Kernels {
        Kernels {
            ctx: ctx as usize,
            found: Vec::new(),
        }
    }

    /// The kernel `name` in this context, which must be current the first time.
    pub fn get(&mut self, name: &'static str) -> Result<Kernel> {
        if let Some(k) = self.found.iter().find(|k| k.name == name) {
            return Ok(*k);
        }
        let k = Kernel {
            func: function_in(self.ctx as CUcontext, name)? as usize,
            name,
        };
        self.found.push(k);
        Ok(k)
    }
}

/// A kernel of the embedded module, by name, in the current context.
pub fn function(name: &'static str) -> Result<CUfunction> {
    function_in(current_context()?, name)
}

/// A kernel of the embedded module, by name, in `ctx` (the current context).
fn function_in(ctx: CUcontext, name: &'static str) -> Result<CUfunction> {
    let mut cache = CACHE.lock();
    if let Some(&f) = cache.functions.get(&(ctx as usize, name)) {
        return Ok(f as CUfunction);
    }
    let module = module_locked(&mut cache, ctx)?;
    let cname = CString::new(name).map_err(|_| Error::internal("kernel name contains NUL"))?;
    let mut func: CUfunction = std::ptr::null_mut();
    // SAFETY: module is loaded in this context; cname is NUL-terminated; writes one handle.
    check(
        unsafe { sys::cuModuleGetFunction(&mut func, module, cname.as_ptr()) },
        &format!("cuModuleGetFunction({name})"),
    )?;
    load_now(func, name)?;
    cache.functions.insert((ctx as usize, name), func as usize);
    Ok(func)
}

/// Finish loading `func` before it is first launched. Under lazy loading (CUDA's default
/// since 12.2) `cuModuleGetFunction` may hand out a partly loaded function that its first
/// launch completes, and that load may wait for the context's running kernels: with ranks as
/// threads sharing a GPU, one rank's kernel waits for another rank's launch, and that launch
/// would wait for it. Drivers before 12.4 have no `cuFuncLoad` and load at lookup.
fn load_now(func: CUfunction, name: &str) -> Result<()> {
    // SAFETY: looking a symbol up in the already opened libcuda runs no code of it.
    let present = unsafe {
        sys::culib()
            .get::<unsafe extern "C" fn()>(b"cuFuncLoad\0")
            .is_ok()
    };
    if !present {
        return Ok(());
    }
    // SAFETY: func is a kernel of our module in the current context.
    check(
        unsafe { sys::cuFuncLoad(func) },
        &format!("cuFuncLoad({name})"),
    )
}

/// How many CTAs of `block` threads of the plan kernels (`ox_kernel`, `ox_kernel_inline` and
/// `ox_kernel_yield`, the lowest of them) device `dev` can hold resident at once: occupancy per SM × SMs. The
/// current context must be `dev`'s.
pub fn resident_ctas(dev: i32, block: u32) -> Result<u32> {
    let sms = super::device_attribute(
        dev,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    )?;
    let mut per_sm = i32::MAX;
    for name in [MAIN_KERNEL, INLINE_KERNEL, YIELD_KERNEL] {
        let func = function(name)?;
        let mut n = 0;
        // SAFETY: func is a kernel of our module in the current context; writes one int.
        check(
            unsafe {
                sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, func, block as i32, 0)
            },
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        )?;
        per_sm = per_sm.min(n);
    }
    Ok((per_sm.max(0) as u32).saturating_mul(sms.max(0) as u32))
}

/// One kernel argument, passed by value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelArg {
    U64(u64),
    U32(u32),
    I32(i32),
}

/// Most arguments `launch_args` passes.
pub const MAX_KERNEL_ARGS: usize = 8;

impl KernelArg {
    /// The argument's bytes as the kernel's parameter of its C type holds them.
    fn bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        match self {
            KernelArg::U64(v) => b = v.to_ne_bytes(),
            KernelArg::U32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
            KernelArg::I32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
        }
        b
    }
}

/// Launch `kernel` on `stream` with the given arguments (in the kernel's parameter order and
/// C types, at most `MAX_KERNEL_ARGS`).
pub fn launch_args(
    kernel: Kernel,
    grid: u32,
    block: u32,
    smem: u32,
    stream: CUstream,
    args: &[KernelArg],
) -> Result<()> {
    if grid == 0 {
        return Ok(());
    }
    if args.len() > MAX_KERNEL_ARGS {
        return Err(Error::internal(format!(
            "{} arguments for {}: at most {MAX_KERNEL_ARGS}",
            args.len(),
            kernel.name
        )));
    }
    let mut values = [[0u8; 8]; MAX_KERNEL_ARGS];
    for (v, a) in values.iter_mut().zip(args) {
        *v = a.bytes();
    }
    let mut params = [std::ptr::null_mut::<c_void>(); MAX_KERNEL_ARGS];
    for (p, v) in params.iter_mut().zip(values.iter_mut()) {
        *p = v.as_mut_ptr().cast::<c_void>();
    }
    // `values` outlives the launch, which copies the parameters before returning.
    let func = kernel.func as CUfunction;
    let res = launch_raw(
        func,
        grid,
        block,
        smem,
        stream,
        &mut params[..args.len()],
        &mut [],
    );
    launch_checked(kernel.name, grid, block, res)
}

/// `cuLaunchKernel` with parameter pointers already laid out for the kernel's signature, or
/// (when `params` is empty) with `extra` describing one parameter buffer.
fn launch_raw(
    func: CUfunction,
    grid: u32,
    block: u32,
    smem: u32,
    stream: CUstream,
    params: &mut [*mut c_void],
    extra: &mut [*mut c_void],
) -> sys::CUresult {
    let params_ptr = if params.is_empty() {
        std::ptr::null_mut()
    } else {
        params.as_mut_ptr()
    };
    let extra_ptr = if extra.is_empty() {
        std::ptr::null_mut()
    } else {
        extra.as_mut_ptr()
    };
    // SAFETY: func is a kernel of our module; params holds one pointer per kernel parameter,
    // each to bytes holding the value in the parameter's C type, or extra is a
    // CU_LAUNCH_PARAM_END-terminated list naming one buffer and its size (the callers'
    // contract); the driver copies the parameters before returning and writes through none.
    unsafe {
        sys::cuLaunchKernel(
            func, grid, 1, 1, block, 1, 1, smem, stream, params_ptr, extra_ptr,
        )
    }
}

fn launch_checked(name: &str, grid: u32, block: u32, res: sys::CUresult) -> Result<()> {
    if res == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    // The message is formatted only on failure: launches are on the per-call path.
    check(
        res,
        &format!("cuLaunchKernel({name}, grid {grid}, block {block})"),
    )
}

/// The `extra` markers of `cuLaunchKernel` (cuda.h's CU_LAUNCH_PARAM_*).
const LAUNCH_PARAM_END: *mut c_void = std::ptr::null_mut();
const LAUNCH_PARAM_BUFFER_POINTER: *mut c_void = std::ptr::without_provenance_mut(1);
const LAUNCH_PARAM_BUFFER_SIZE: *mut c_void = std::ptr::without_provenance_mut(2);

/// Set when the driver refused a parameter buffer shorter than the kernel's parameter; every
/// later launch then passes the whole struct.
static SHORT_PARAMS_REFUSED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Launch `kernel`, whose one parameter is a struct passed by value, with that struct's bytes
/// (`blob` must be exactly the parameter's size). Only the first `used` bytes are meaningful:
/// like NVIDIA's library, only those are handed to the driver, so a launch with one work item
/// does not copy a 4 KiB parameter (falling back to the whole struct if the driver refuses).
pub fn launch_blob(
    kernel: Kernel,
    grid: u32,
    block: u32,
    smem: u32,
    stream: CUstream,
    blob: &[u8],
    used: usize,
) -> Result<()> {
    use std::sync::atomic::Ordering;
    if grid == 0 {
        return Ok(());
    }
    let (func, name) = (kernel.func as CUfunction, kernel.name);
    let used = used.clamp(1, blob.len());
    let short = used < blob.len() && !SHORT_PARAMS_REFUSED.load(Ordering::Relaxed);
    let launch_with = |size: usize| {
        let mut size = size;
        let mut extra: [*mut c_void; 5] = [
            LAUNCH_PARAM_BUFFER_POINTER,
            blob.as_ptr() as *mut c_void,
            LAUNCH_PARAM_BUFFER_SIZE,
            (&mut size as *mut usize).cast(),
            LAUNCH_PARAM_END,
        ];
        launch_raw(func, grid, block, smem, stream, &mut [], &mut extra)
    };
    let mut res = launch_with(if short { used } else { blob.len() });
    if short && res == sys::CUresult::CUDA_ERROR_INVALID_VALUE {
        SHORT_PARAMS_REFUSED.store(true, Ordering::Relaxed);
        crate::info!(
            INIT,
            "the driver refused a {used}-byte parameter buffer for {name}; passing all {} bytes",
            blob.len()
        );
        res = launch_with(blob.len());
    }
    launch_checked(name, grid, block, res)
}

/// Launch a plan's kernel: `kernel(items, nitems)`, where `items` is the device copy of
/// `Plan::items`. A plan with no items launches nothing.
pub fn launch(
    kernel: Kernel,
    grid: u32,
    block: u32,
    smem: u32,
    stream: CUstream,
    items: u64,
    nitems: u32,
) -> Result<()> {
    if nitems == 0 {
        return Ok(());
    }
    launch_args(
        kernel,
        grid,
        block,
        smem,
        stream,
        &[KernelArg::U64(items), KernelArg::U32(nitems)],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fatbin_is_embedded() {
        // A fatbin starts with its magic number 0xBA55ED50 (little endian).
        assert!(FATBIN.len() > 1024);
        assert_eq!(&FATBIN[..4], &0xBA55_ED50u32.to_le_bytes());
    }
}
