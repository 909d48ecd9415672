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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use sys::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUgraphNode, CUmodule, CUstream,
};

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

/// Make `ctx` current on this thread. The caller's thread usually has it current already
/// (its own `cudaSetDevice`): the context is set only when another one is current.
pub fn set_current(ctx: CUcontext) -> Result<()> {
    let mut cur: CUcontext = std::ptr::null_mut();
    // SAFETY: writes one handle.
    check(unsafe { sys::cuCtxGetCurrent(&mut cur) }, "cuCtxGetCurrent")?;
    if cur == ctx {
        return Ok(());
    }
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

/// Whether device `dev` supports GPUDirect RDMA (a NIC reading and writing its memory).
pub fn gpu_direct_rdma_supported(dev: i32) -> Result<bool> {
    Ok(device_attribute(
        dev,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
    )? == 1)
}

/// Whether device `dev` can export its memory as dma-bufs (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`:
/// the driver and the kernel allow it).
pub fn dma_buf_supported(dev: i32) -> Result<bool> {
    Ok(device_attribute(
        dev,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
    )? == 1)
}

/// A dma-buf file descriptor for `bytes` of device memory at `ptr` (both multiples of the
/// host page size), for a network to register; closed when dropped.
pub fn dma_buf_fd(ptr: CUdeviceptr, bytes: usize) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let mut fd: std::os::raw::c_int = -1;
    // SAFETY: the driver writes one int (the fd) through the handle pointer.
    check(
        unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut std::os::raw::c_int).cast(),
                ptr,
                bytes,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        },
        "cuMemGetHandleForAddressRange",
    )?;
    if fd < 0 {
        return Err(Error::system(
            "cuMemGetHandleForAddressRange gave no dma-buf file descriptor",
        ));
    }
    // SAFETY: the driver made a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
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

/// The UUID of device `dev`.
pub fn device_uuid(dev: i32) -> Result<[u8; 16]> {
    let mut uuid = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: writes one CUuuid.
    check(
        unsafe { sys::cuDeviceGetUuid_v2(&mut uuid, dev) },
        "cuDeviceGetUuid",
    )?;
    Ok(uuid.bytes.map(|b| b as u8))
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
    // On a private non-blocking stream, as memset_zero: a copy on the legacy stream would wait
    // for the blocking streams of every thread of the process, among them another rank's
    // kernel that may be waiting for this rank (ranks as threads sharing a GPU).
    on_private_stream(|stream| {
        // SAFETY: dst holds at least src.len() bytes (caller's contract); src is readable for
        // that long and outlives the synchronisation that follows.
        check(
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), src.len(), stream) },
            "cuMemcpyHtoDAsync",
        )
    })
}

/// Device-to-host copy on a private non-blocking stream (so it waits for no other thread's
/// work on the legacy stream), complete on return.
pub fn read_device(dst: &mut [u8], src: CUdeviceptr) -> Result<()> {
    on_private_stream(|stream| {
        // SAFETY: src holds at least dst.len() bytes (caller's contract); dst is writable for
        // that long and outlives the synchronisation that follows.
        check(
            unsafe { sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, dst.len(), stream) },
            "cuMemcpyDtoHAsync",
        )
    })
}

/// Synchronous device-to-host copy.
pub fn copy_from_device(dst: &mut [u8], src: CUdeviceptr) -> Result<()> {
    // SAFETY: dst is a valid host slice; src holds at least dst.len() bytes (caller's contract).
    check(
        unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len()) },
        "cuMemcpyDtoH",
    )
}

/// Fill device memory with zero bytes and wait until the GPU has done it.
///
/// `cuMemsetD8` alone is asynchronous with respect to the host for device memory: a buffer
/// handed to a peer right after it could still be zeroed later, over what the peer's kernel
/// already wrote (seen with ranks of several processes time-slicing one GPU). So the memset
/// runs on a private non-blocking stream (it waits for no user work) that is synchronised.
pub fn memset_zero(dst: CUdeviceptr, bytes: usize) -> Result<()> {
    on_private_stream(|stream| {
        // SAFETY: dst holds at least `bytes` bytes (caller's contract); the stream is live.
        check(
            unsafe { sys::cuMemsetD8Async(dst, 0, bytes, stream) },
            "cuMemsetD8Async",
        )
    })
}

/// Idle private streams for the synchronous helpers above, as (context, stream): a thread
/// takes one of its current context's, works on it alone and puts it back, so a connection's
/// buffers do not each create and destroy a stream. Process-wide and never dropped: no
/// stream is destroyed at thread or process exit, when the application's CUDA runtime may
/// already have torn its context down (destroying a stream of a context that is gone crashes
/// inside the driver).
static PRIVATE_STREAMS: parking_lot::Mutex<Vec<(usize, usize)>> =
    parking_lot::Mutex::new(Vec::new());

/// Enqueue `work` on a private stream of the current context and wait for it. A cached stream
/// that fails is let go without destroying it (a reset primary context keeps its handle but
/// not its streams, and destroying a stream of a context that is gone may crash the driver),
/// and the work is tried once more on a fresh one. (The helpers' work may run twice: zeroing
/// and copies.)
fn on_private_stream(mut work: impl FnMut(CUstream) -> Result<()>) -> Result<()> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: writes one handle.
    check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
    let key = ctx as usize;
    let cached = {
        let mut idle = PRIVATE_STREAMS.lock();
        idle.iter()
            .position(|(c, _)| *c == key)
            .map(|i| idle.swap_remove(i).1 as CUstream)
    };
    if let Some(stream) = cached {
        if work(stream)
            .and_then(|()| stream_synchronize(stream))
            .is_ok()
        {
            PRIVATE_STREAMS.lock().push((key, stream as usize));
            return Ok(());
        }
    }
    let fresh = Stream::new()?;
    let stream = fresh.raw();
    work(stream).and_then(|()| stream_synchronize(stream))?;
    PRIVATE_STREAMS
        .lock()
        .push((key, fresh.into_raw() as usize));
    Ok(())
}

/// What the driver says of the memory at `ptr` (`cuPointerGetAttributes`, which answers
/// for any address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PointerFacts {
    /// The address a kernel uses for it; 0 where it is no memory the GPU can reach (host
    /// memory that is not registered, or no memory at all).
    pub device_pointer: CUdeviceptr,
    /// Device memory (not host or managed memory).
    pub on_device: bool,
    /// The device ordinal of device memory.
    pub device: i32,
}

/// [`PointerFacts`] of `ptr`.
pub fn pointer_facts(ptr: u64) -> Result<PointerFacts> {
    use sys::CUpointer_attribute as A;
    let mut device_pointer: CUdeviceptr = 0;
    let mut memory_type: u32 = 0;
    let mut device: i32 = -1;
    let mut managed: i32 = 0;
    let mut attributes = [
        A::CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
        A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        A::CU_POINTER_ATTRIBUTE_IS_MANAGED,
    ];
    let mut data: [*mut std::ffi::c_void; 4] = [
        (&mut device_pointer as *mut CUdeviceptr).cast(),
        (&mut memory_type as *mut u32).cast(),
        (&mut device as *mut i32).cast(),
        (&mut managed as *mut i32).cast(),
    ];
    // SAFETY: each data slot points at a live value of the type its attribute writes
    // (CUdeviceptr, unsigned int, int, int); the arrays have the count passed.
    check(
        unsafe {
            sys::cuPointerGetAttributes(
                attributes.len() as u32,
                attributes.as_mut_ptr(),
                data.as_mut_ptr(),
                ptr,
            )
        },
        "cuPointerGetAttributes",
    )?;
    Ok(PointerFacts {
        device_pointer,
        on_device: memory_type == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 && managed == 0,
        device,
    })
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

/// Make `stream`'s later work wait until the u32 at device address `addr` has bit 0 set
/// (`cuStreamWaitValue32`, AND): the stream waits on the GPU, without a kernel, so the GPU
/// may run other contexts meanwhile. Captured as a graph node under stream capture.
pub fn wait_bit0(stream: CUstream, addr: CUdeviceptr) -> Result<()> {
    // SAFETY: addr is a device-visible u32 that outlives the wait (the caller's contract:
    // a communicator's status page); no memory is written.
    check(
        unsafe {
            sys::cuStreamWaitValue32_v2(
                stream,
                addr,
                1,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_AND as u32,
            )
        },
        "cuStreamWaitValue32",
    )
}

/// Write the u64 `value` at device address `addr` in `stream`'s order (`cuStreamWriteValue64`),
/// after a memory barrier: writes of earlier work on the stream are visible before it.
pub fn write_u64(stream: CUstream, addr: CUdeviceptr, value: u64) -> Result<()> {
    // SAFETY: addr is a device-visible u64 mapped in this context that outlives the write
    // (the caller's contract).
    check(
        unsafe { sys::cuStreamWriteValue64_v2(stream, addr, value, 0) },
        "cuStreamWriteValue64",
    )
}

/// Make `stream`'s later work wait until the u64 at `addr` reaches `value`
/// (`cuStreamWaitValue64`, GEQ: `(int64_t)(*addr - value) >= 0`), on the GPU.
pub fn wait_u64_geq(stream: CUstream, addr: CUdeviceptr, value: u64) -> Result<()> {
    // SAFETY: addr is a device-visible u64 that outlives the wait (the caller's contract).
    check(
        unsafe {
            sys::cuStreamWaitValue64_v2(
                stream,
                addr,
                value,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        },
        "cuStreamWaitValue64",
    )
}

/// The allocation that holds `ptr`: its base and size (`cuMemGetAddressRange`).
pub fn address_range(ptr: CUdeviceptr) -> Result<(CUdeviceptr, usize)> {
    let mut base: CUdeviceptr = 0;
    let mut size = 0usize;
    // SAFETY: writes one pointer and one size.
    check(
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) },
        "cuMemGetAddressRange",
    )?;
    Ok((base, size))
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

/// Record the caller's event `event` on `stream`: after the work queued there so far, or,
/// while the stream captures a graph, as an event-record node of the graph
/// (`CU_EVENT_RECORD_EXTERNAL`), which every launch of the graph records.
pub fn record_user_event(event: CUevent, stream: CUstream) -> Result<()> {
    let flags = if stream_is_capturing(stream)? {
        sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32
    } else {
        0
    };
    // SAFETY: the caller's event and stream are live handles (NCCL's contract); the driver
    // validates both.
    check(
        unsafe { sys::cuEventRecordWithFlags(event, stream, flags) },
        "cuEventRecordWithFlags",
    )
}

/// The graph that `stream`, which must be capturing, records into.
pub fn capturing_graph(stream: CUstream) -> Result<sys::CUgraph> {
    capture_dependencies(stream).map(|(graph, _)| graph)
}

/// A stream the library owns, for work beside the user's stream (copy-engine copies).
/// Non-blocking: it never waits for the legacy default stream, nor it for this one.
pub struct Stream(CUstream);

// SAFETY: CUDA streams may be used from any thread; the owner serialises its use.
unsafe impl Send for Stream {}

impl Stream {
    /// A new non-blocking stream in the current context.
    pub fn new() -> Result<Stream> {
        const NON_BLOCKING: u32 = 0x1; // CU_STREAM_NON_BLOCKING
        let mut s: CUstream = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check(
            unsafe { sys::cuStreamCreate(&mut s, NON_BLOCKING) },
            "cuStreamCreate",
        )?;
        Ok(Stream(s))
    }
    pub fn raw(&self) -> CUstream {
        self.0
    }
    /// The handle, kept alive: nothing destroys the stream any more.
    pub fn into_raw(self) -> CUstream {
        let s = self.0;
        std::mem::forget(self);
        s
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the stream is destroyed once, here (pending work still completes).
        unsafe { sys::cuStreamDestroy_v2(self.0) };
    }
}

/// Whether work on `stream` implicitly waits for the legacy default stream (and the other
/// way round): the legacy stream itself, and streams created without the non-blocking flag.
pub fn stream_syncs_with_legacy(stream: CUstream) -> Result<bool> {
    const LEGACY: usize = 0x1; // CU_STREAM_LEGACY
    const PER_THREAD: usize = 0x2; // CU_STREAM_PER_THREAD
    if matches!(stream as usize, 0 | LEGACY | PER_THREAD) {
        return Ok(true);
    }
    let mut flags = 0u32;
    // SAFETY: stream is a live stream handle of the caller's; writes one word.
    check(
        unsafe { sys::cuStreamGetFlags(stream, &mut flags) },
        "cuStreamGetFlags",
    )?;
    Ok(flags & 0x1 == 0)
}

/// A device-to-device copy of `bytes` on `stream` (the copy engine, or the driver's copy
/// kernel, at device memory speed); under capture it becomes a memcpy node.
pub fn memcpy_dtod_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    // SAFETY: dst and src are device memory of at least `bytes` bytes each, valid until the
    // copy runs (the collective's contract with its caller).
    check(
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream) },
        "cuMemcpyDtoDAsync",
    )
}

/// The graph nodes the next operation captured on `stream` would depend on.
fn capture_dependencies(stream: CUstream) -> Result<(sys::CUgraph, Vec<sys::CUgraphNode>)> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: sys::cuuint64_t = 0;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut edges: *const sys::CUgraphEdgeData = std::ptr::null();
    let mut ndeps = 0usize;
    // SAFETY: writes the status, id, graph and the dependency array (valid until the next
    // operation on the stream; copied below before any).
    check(
        unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                stream,
                &mut status,
                &mut id,
                &mut graph,
                &mut deps,
                &mut edges,
                &mut ndeps,
            )
        },
        "cuStreamGetCaptureInfo",
    )?;
    if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE || graph.is_null() {
        return Err(Error::internal("the stream is not capturing a graph"));
    }
    let nodes = if ndeps == 0 || deps.is_null() {
        Vec::new()
    } else {
        // SAFETY: the driver returned `ndeps` valid node handles at `deps`.
        unsafe { std::slice::from_raw_parts(deps, ndeps) }.to_vec()
    };
    Ok((graph, nodes))
}

/// Under capture on `stream`: add device-to-device copies `(dst, src, bytes)` to the graph as
/// nodes beside the next operation (they depend on what it depends on). Returns the nodes,
/// for `capture_join` once that operation is captured.
pub fn capture_copies_beside(
    stream: CUstream,
    ctx: CUcontext,
    copies: &[(CUdeviceptr, CUdeviceptr, usize)],
) -> Result<Vec<sys::CUgraphNode>> {
    let (graph, deps) = capture_dependencies(stream)?;
    let mut nodes = Vec::with_capacity(copies.len());
    for &(dst, src, bytes) in copies {
        let params = sys::CUDA_MEMCPY3D {
            srcXInBytes: 0,
            srcY: 0,
            srcZ: 0,
            srcLOD: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: src,
            srcArray: std::ptr::null_mut(),
            reserved0: std::ptr::null_mut(),
            srcPitch: 0,
            srcHeight: 0,
            dstXInBytes: 0,
            dstY: 0,
            dstZ: 0,
            dstLOD: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst,
            dstArray: std::ptr::null_mut(),
            reserved1: std::ptr::null_mut(),
            dstPitch: 0,
            dstHeight: 0,
            WidthInBytes: bytes,
            Height: 1,
            Depth: 1,
        };
        let mut node: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: graph is the capturing graph; deps are its nodes; params describes a plain
        // 1-D device-to-device copy; writes one node handle.
        check(
            unsafe {
                sys::cuGraphAddMemcpyNode(&mut node, graph, deps.as_ptr(), deps.len(), &params, ctx)
            },
            "cuGraphAddMemcpyNode",
        )?;
        nodes.push(node);
    }
    Ok(nodes)
}

/// A call a graph's host node makes (`capture_host_call_beside`).
pub type HostCall = Box<dyn Fn() + Send + Sync>;

unsafe extern "C" fn run_host_call(data: *mut std::ffi::c_void) {
    // SAFETY: data is the HostCall kept alive with the graph by capture_host_call_beside, for
    // as long as the graph (hence this node) exists.
    let call = unsafe { &*(data as *const HostCall) };
    // A panic must not unwind into the driver.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(call));
}

/// Under capture on `stream`: add a host node that runs `call` at every launch of the graph,
/// beside the next operation (it depends on what that depends on; nothing waits for it).
/// `call` lives as long as the graph; it runs on a driver thread and may not call CUDA.
pub fn capture_host_call_beside(stream: CUstream, call: HostCall) -> Result<()> {
    let (graph, deps) = capture_dependencies(stream)?;
    let call = Box::new(call);
    // The inner box's address: moving the outer box into the graph's keeping leaves it.
    let data = &*call as *const HostCall as *mut std::ffi::c_void;
    keep_for_graph(graph, call)?;
    let params = sys::CUDA_HOST_NODE_PARAMS {
        fn_: Some(run_host_call),
        userData: data,
    };
    let mut node: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: graph is the capturing graph; deps are its nodes; params names a function and
    // data that live as long as the graph (kept above); writes one node handle.
    check(
        unsafe { sys::cuGraphAddHostNode(&mut node, graph, deps.as_ptr(), deps.len(), &params) },
        "cuGraphAddHostNode",
    )
}

/// Under capture: make later work on `stream` also wait for `nodes` (from
/// `capture_copies_beside`).
pub fn capture_join(stream: CUstream, nodes: &mut [sys::CUgraphNode]) -> Result<()> {
    if nodes.is_empty() {
        return Ok(());
    }
    // CU_STREAM_ADD_CAPTURE_DEPENDENCIES
    const ADD: u32 = 0;
    // SAFETY: nodes are nodes of the graph `stream` captures into; no edge data.
    check(
        unsafe {
            sys::cuStreamUpdateCaptureDependencies_v2(
                stream,
                nodes.as_mut_ptr(),
                std::ptr::null(),
                nodes.len(),
                ADD,
            )
        },
        "cuStreamUpdateCaptureDependencies",
    )
}

/// While alive, this thread's stream-capture mode is relaxed, so that allocating or freeing
/// pinned memory is allowed while one of its streams captures (as NVIDIA's library does for
/// its own allocations); the previous mode comes back on drop.
pub struct RelaxedCapture {
    previous: sys::CUstreamCaptureMode,
}

impl RelaxedCapture {
    pub fn enter() -> Result<RelaxedCapture> {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: exchanges this thread's mode through one valid pointer.
        check(
            unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) },
            "cuThreadExchangeStreamCaptureMode",
        )?;
        Ok(RelaxedCapture { previous: mode })
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        let mut mode = self.previous;
        // SAFETY: as in enter; restoring cannot fail for a mode the driver gave us.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
}

/// What graphs released: their destructors may not call CUDA, so they park what they kept
/// here and `collect_graph_garbage` drops it later on an ordinary thread.
static GRAPH_GARBAGE: once_cell::sync::Lazy<parking_lot::Mutex<Vec<Box<dyn Send>>>> =
    once_cell::sync::Lazy::new(|| parking_lot::Mutex::new(Vec::new()));

unsafe extern "C" fn park_graph_value(ptr: *mut std::ffi::c_void) {
    // SAFETY: ptr is the Box<Box<dyn Send>> leaked by keep_for_graph, handed back exactly once
    // by the driver when the last graph holding the user object is destroyed.
    let value = unsafe { Box::from_raw(ptr as *mut Box<dyn Send>) };
    GRAPH_GARBAGE.lock().push(*value);
}

/// Keep `value` alive as long as `graph` (and every executable graph instantiated from it)
/// exists, through a CUDA user object whose destructor parks it for `collect_graph_garbage`.
pub fn keep_for_graph(graph: sys::CUgraph, value: Box<dyn Send>) -> Result<()> {
    let raw = Box::into_raw(Box::new(value)) as *mut std::ffi::c_void;
    let mut object: sys::CUuserObject = std::ptr::null_mut();
    // SAFETY: raw is a valid leaked box; park_graph_value takes it back exactly once.
    let res = unsafe {
        sys::cuUserObjectCreate(
            &mut object,
            raw,
            Some(park_graph_value),
            1,
            sys::CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32,
        )
    };
    if let Err(e) = check(res, "cuUserObjectCreate") {
        // SAFETY: the driver did not take raw; reclaim it.
        drop(unsafe { Box::from_raw(raw as *mut Box<dyn Send>) });
        return Err(e);
    }
    // SAFETY: graph is the capturing graph; MOVE hands our one reference to it.
    check(
        unsafe {
            sys::cuGraphRetainUserObject(
                graph,
                object,
                1,
                sys::CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE as u32,
            )
        },
        "cuGraphRetainUserObject",
    )
}

/// Drop what destroyed graphs released (frees their pinned work items).
pub fn collect_graph_garbage() {
    let parked = std::mem::take(&mut *GRAPH_GARBAGE.lock());
    drop(parked);
}

/// Pinned host memory mapped into the device address space (`cuMemHostAlloc` with
/// DEVICEMAP | PORTABLE): the host writes it directly, kernels read it over the bus.
pub struct HostMapped {
    host: *mut u8,
    dev: CUdeviceptr,
    bytes: usize,
}

// SAFETY: the allocation is plain pinned memory owned by this value; access is coordinated by
// its users (the host writes before launches, kernels read after).
unsafe impl Send for HostMapped {}
// SAFETY: as above; shared references only expose raw pointers.
unsafe impl Sync for HostMapped {}

impl HostMapped {
    /// Allocate `bytes` of zeroed, pinned, device-mapped host memory.
    pub fn new(bytes: usize) -> Result<HostMapped> {
        const PORTABLE: u32 = 0x01; // CU_MEMHOSTALLOC_PORTABLE
        const DEVICEMAP: u32 = 0x02; // CU_MEMHOSTALLOC_DEVICEMAP
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        check(
            unsafe { sys::cuMemHostAlloc(&mut host, bytes.max(1), PORTABLE | DEVICEMAP) },
            "cuMemHostAlloc",
        )?;
        // SAFETY: host points to `bytes` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(host as *mut u8, 0, bytes) };
        let mut dev: CUdeviceptr = 0;
        // SAFETY: host was allocated with DEVICEMAP; writes one pointer.
        let res = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) };
        if let Err(e) = check(res, "cuMemHostGetDevicePointer") {
            // SAFETY: host came from cuMemHostAlloc above.
            unsafe { sys::cuMemFreeHost(host) };
            return Err(e);
        }
        Ok(HostMapped {
            host: host as *mut u8,
            dev,
            bytes,
        })
    }
    /// The host address.
    pub fn host(&self) -> *mut u8 {
        self.host
    }
    /// The device address of the same bytes.
    pub fn dev(&self) -> CUdeviceptr {
        self.dev
    }
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }
    /// Whether the allocation is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for HostMapped {
    fn drop(&mut self) {
        // SAFETY: host came from cuMemHostAlloc and is freed once, here.
        unsafe { sys::cuMemFreeHost(self.host as *mut std::ffi::c_void) };
    }
}

thread_local! {
    /// Where device memory allocated on this thread is counted (`account_into`).
    static ACCOUNT: std::cell::RefCell<Option<Arc<AtomicU64>>> = const { std::cell::RefCell::new(None) };
}

/// Counts device memory allocated on this thread into a counter while alive (the previous
/// counter is restored on drop): how a communicator measures the memory it holds.
pub struct AccountGuard(Option<Arc<AtomicU64>>);

/// Count the `DeviceBuffer`s this thread allocates from now on into `counter` (each buffer
/// takes its bytes off again when freed).
pub fn account_into(counter: &Arc<AtomicU64>) -> AccountGuard {
    AccountGuard(ACCOUNT.with(|a| a.replace(Some(counter.clone()))))
}

impl Drop for AccountGuard {
    fn drop(&mut self) {
        let previous = self.0.take();
        ACCOUNT.with(|a| *a.borrow_mut() = previous);
    }
}

/// Device memory owned by a value and freed on drop (in whatever context is current; device
/// pointers are valid in every context of the process).
pub struct DeviceBuffer {
    ptr: CUdeviceptr,
    bytes: usize,
    /// The counter its bytes were added to (`account_into`), if any.
    account: Option<Arc<AtomicU64>>,
}

impl DeviceBuffer {
    /// `bytes` of zeroed device memory on the current context's device.
    pub fn zeroed(bytes: usize) -> Result<DeviceBuffer> {
        let ptr = mem_alloc(bytes)?;
        let account = ACCOUNT.with(|a| a.borrow().clone());
        if let Some(a) = &account {
            a.fetch_add(bytes.max(1) as u64, Ordering::Relaxed);
        }
        let buf = DeviceBuffer {
            ptr,
            bytes,
            account,
        };
        memset_zero(ptr, bytes.max(1))?;
        Ok(buf)
    }
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.bytes
    }
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _ = mem_free(self.ptr);
        if let Some(a) = &self.account {
            a.fetch_sub(self.bytes.max(1) as u64, Ordering::Relaxed);
        }
    }
}

/// A CUDA IPC handle for device memory from `cuMemAlloc` (64 opaque bytes).
pub fn ipc_handle(ptr: CUdeviceptr) -> Result<[u8; 64]> {
    let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: ptr is the base of a cuMemAlloc allocation; writes one handle.
    check(
        unsafe { sys::cuIpcGetMemHandle(&mut h, ptr) },
        "cuIpcGetMemHandle",
    )?;
    Ok(h.reserved.map(|b| b as u8))
}

/// Map another process's memory from its IPC handle into the current context.
pub fn ipc_open(handle: &[u8; 64]) -> Result<CUdeviceptr> {
    let h = sys::CUipcMemHandle {
        reserved: handle.map(|b| b as std::os::raw::c_char),
    };
    let mut p: CUdeviceptr = 0;
    const LAZY_ENABLE_PEER_ACCESS: u32 = 0x1;
    // SAFETY: h is a handle exported by a peer; writes one pointer.
    check(
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut p, h, LAZY_ENABLE_PEER_ACCESS) },
        "cuIpcOpenMemHandle",
    )?;
    Ok(p)
}

/// Unmap memory from `ipc_open`.
pub fn ipc_close(p: CUdeviceptr) -> Result<()> {
    // SAFETY: p came from cuIpcOpenMemHandle and is closed once.
    check(
        unsafe { sys::cuIpcCloseMemHandle(p) },
        "cuIpcCloseMemHandle",
    )
}

/// The device ordinal (in this process) of the GPU at a PCI bus id, if visible.
pub fn device_by_pci_bus_id(bus_id: &str) -> Option<i32> {
    let c = std::ffi::CString::new(bus_id).ok()?;
    let mut dev: CUdevice = 0;
    // SAFETY: c is NUL-terminated; writes one int.
    (unsafe { sys::cuDeviceGetByPCIBusId(&mut dev, c.as_ptr()) } == sys::CUresult::CUDA_SUCCESS)
        .then_some(dev)
}

/// Whether device `dev` can map memory of device `peer`.
pub fn can_access_peer(dev: i32, peer: i32) -> Result<bool> {
    let mut can = 0;
    // SAFETY: writes one int.
    check(
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev, peer) },
        "cuDeviceCanAccessPeer",
    )?;
    Ok(can == 1)
}

/// Let the current context access memory of `peer_ctx` (idempotent).
pub fn enable_peer_access(peer_ctx: CUcontext) -> Result<()> {
    // SAFETY: peer_ctx is a retained primary context.
    let res = unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) };
    if res == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(());
    }
    check(res, "cuCtxEnablePeerAccess")
}

/// A CUDA event without timing, for ordering and completion checks.
pub struct Event(CUevent);

// SAFETY: CUDA events may be used from any thread.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    pub fn new() -> Result<Event> {
        const DISABLE_TIMING: u32 = 0x2;
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check(
            unsafe { sys::cuEventCreate(&mut e, DISABLE_TIMING) },
            "cuEventCreate",
        )?;
        Ok(Event(e))
    }
    /// Record on `stream`.
    pub fn record(&self, stream: CUstream) -> Result<()> {
        // SAFETY: both handles are live.
        check(
            unsafe { sys::cuEventRecord(self.0, stream) },
            "cuEventRecord",
        )
    }
    /// Whether the recorded work finished (errors other than "not ready" are returned).
    pub fn done(&self) -> Result<bool> {
        // SAFETY: the event is live.
        let res = unsafe { sys::cuEventQuery(self.0) };
        if res == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check(res, "cuEventQuery").map(|_| true)
    }
    /// Make `stream` wait for this event.
    pub fn wait_on(&self, stream: CUstream) -> Result<()> {
        // SAFETY: both handles are live.
        check(
            unsafe { sys::cuStreamWaitEvent(stream, self.0, 0) },
            "cuStreamWaitEvent",
        )
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event is destroyed once, here.
        unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

/// Retain device `dev`'s primary context without making it current.
pub fn primary_ctx(dev: i32) -> Result<CUcontext> {
    driver()?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: writes one handle; the retain is balanced by process exit (primary contexts
    // are shared with the runtime API and never released by the library).
    check(
        unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
        "cuDevicePrimaryCtxRetain",
    )?;
    Ok(ctx)
}

/// Pin `bytes` of host memory at `host` (another process may map the same pages) and map them
/// into the device address space; returns their device address.
///
/// # Safety
/// `host..host + bytes` must stay mapped until [`host_unregister`] is called for `host`.
pub unsafe fn host_register(host: *mut u8, bytes: usize) -> Result<CUdeviceptr> {
    const PORTABLE: u32 = 0x01; // CU_MEMHOSTREGISTER_PORTABLE
    const DEVICEMAP: u32 = 0x02; // CU_MEMHOSTREGISTER_DEVICEMAP
    let host = host as *mut std::ffi::c_void;
    // SAFETY: the caller keeps host..host+bytes mapped while registered.
    check(
        unsafe { sys::cuMemHostRegister_v2(host, bytes, PORTABLE | DEVICEMAP) },
        "cuMemHostRegister",
    )?;
    let mut dev: CUdeviceptr = 0;
    // SAFETY: host was registered with DEVICEMAP; writes one pointer.
    let res = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) };
    if let Err(e) = check(res, "cuMemHostGetDevicePointer") {
        // SAFETY: undoes the registration just made.
        unsafe { sys::cuMemHostUnregister(host) };
        return Err(e);
    }
    Ok(dev)
}

/// Undo [`host_register`].
///
/// # Safety
/// `host` must have been registered by [`host_register`] and not yet unregistered.
pub unsafe fn host_unregister(host: *mut u8) {
    // SAFETY: per the contract, host is a live registration.
    unsafe { sys::cuMemHostUnregister(host as *mut std::ffi::c_void) };
}
