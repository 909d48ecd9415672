//! The CUDA driver calls the benchmark needs (through cudarc's dynamically loaded bindings):
//! primary contexts, device memory, streams, events and graphs. Every failure becomes a
//! message naming the call and the driver's own text.

use cudarc::driver::sys;
use std::ffi::{c_char, c_void, CStr};
use std::time::{Duration, Instant};

pub use sys::{CUcontext, CUdeviceptr, CUevent, CUgraphExec, CUstream};

fn error_text(res: sys::CUresult) -> String {
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string.
    unsafe { sys::cuGetErrorString(res, &mut text) };
    if text.is_null() {
        format!("{res:?}")
    } else {
        // SAFETY: the driver returns NUL-terminated static strings.
        let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
        format!("{text} ({res:?})")
    }
}

/// Turn a driver result into an error naming the call.
pub fn check(res: sys::CUresult, what: &str) -> Result<(), String> {
    if res == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("CUDA error in {what}: {}", error_text(res)))
    }
}

/// Load libcuda and initialise the driver; returns the number of visible devices.
pub fn init() -> Result<usize, String> {
    // SAFETY: is_culib_present only tries to dlopen the driver library.
    if !unsafe { sys::is_culib_present() } {
        return Err(
            "no NVIDIA driver: libcuda.so.1 could not be loaded (is this a GPU machine with the driver installed?)"
                .into(),
        );
    }
    // SAFETY: the driver library is present; cuInit takes flags 0.
    check(unsafe { sys::cuInit(0) }, "cuInit")?;
    let mut count = 0;
    // SAFETY: writes one int.
    check(
        unsafe { sys::cuDeviceGetCount(&mut count) },
        "cuDeviceGetCount",
    )?;
    Ok(count.max(0) as usize)
}

/// The device's name, for the report.
pub fn device_name(device: usize) -> String {
    let mut name = [0 as c_char; 128];
    // SAFETY: the buffer holds 128 bytes and the driver writes a NUL-terminated name.
    let res = unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), 128, device as i32) };
    if res != sys::CUresult::CUDA_SUCCESS {
        return "unknown".into();
    }
    // SAFETY: the driver NUL-terminates the name within the buffer.
    unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Retain the device's primary context (the one the CUDA runtime, and so NCCL, uses) and make
/// it current on this thread.
pub fn primary_context(device: usize) -> Result<CUcontext, String> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: writes one context handle for a valid device ordinal.
    check(
        unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, device as i32) },
        "cuDevicePrimaryCtxRetain",
    )?;
    set_current(ctx)?;
    Ok(ctx)
}

pub fn set_current(ctx: CUcontext) -> Result<(), String> {
    // SAFETY: ctx is a retained primary context.
    check(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")
}

/// Free device memory of the current context's device, in bytes.
pub fn free_memory() -> Result<usize, String> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: writes two sizes.
    check(
        unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
        "cuMemGetInfo",
    )?;
    Ok(free)
}

/// Device memory owned by the benchmark (freed on drop; the context must still exist).
pub struct DeviceBuffer {
    pub ptr: CUdeviceptr,
}

impl DeviceBuffer {
    pub fn new(bytes: usize) -> Result<DeviceBuffer, String> {
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: writes one device pointer; at least one byte so the pointer is valid.
        check(
            unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(256)) },
            &format!("cuMemAlloc({bytes} bytes)"),
        )?;
        Ok(DeviceBuffer { ptr })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr came from cuMemAlloc and is freed once.
        unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// Copy host bytes to device memory and wait until the copy has landed.
pub fn copy_to_device(dst: CUdeviceptr, src: &[u8]) -> Result<(), String> {
    if src.is_empty() {
        return Ok(());
    }
    // SAFETY: dst points to at least src.len() bytes of device memory (callers size it).
    check(
        unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr() as *const c_void, src.len()) },
        "cuMemcpyHtoD",
    )?;
    // A copy from pageable memory may still be in flight when the call returns, and the
    // benchmark's streams do not wait for the null stream: finish it before any launch.
    // SAFETY: waits for all work of the current context.
    check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
}

/// Copy device memory to host bytes (synchronous).
pub fn copy_to_host(dst: &mut [u8], src: CUdeviceptr) -> Result<(), String> {
    if dst.is_empty() {
        return Ok(());
    }
    // SAFETY: src points to at least dst.len() bytes of device memory.
    check(
        unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len()) },
        "cuMemcpyDtoH",
    )
}

/// Set `bytes` bytes of device memory to `value` (synchronous).
pub fn fill_device(dst: CUdeviceptr, value: u8, bytes: usize) -> Result<(), String> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: dst points to at least `bytes` bytes of device memory.
    check(
        unsafe { sys::cuMemsetD8_v2(dst, value, bytes) },
        "cuMemsetD8",
    )?;
    // SAFETY: waits for the memset on the null stream of the current context.
    check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
}

pub fn create_stream() -> Result<CUstream, String> {
    let mut stream: CUstream = std::ptr::null_mut();
    // SAFETY: writes one stream handle in the current context.
    check(
        unsafe {
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            )
        },
        "cuStreamCreate",
    )?;
    Ok(stream)
}

pub fn destroy_stream(stream: CUstream) {
    // SAFETY: the stream was created by create_stream and is destroyed once.
    unsafe { sys::cuStreamDestroy_v2(stream) };
}

pub fn create_event() -> Result<CUevent, String> {
    let mut event: CUevent = std::ptr::null_mut();
    // SAFETY: writes one event handle in the current context.
    check(
        unsafe { sys::cuEventCreate(&mut event, sys::CUevent_flags::CU_EVENT_DEFAULT as u32) },
        "cuEventCreate",
    )?;
    Ok(event)
}

pub fn destroy_event(event: CUevent) {
    // SAFETY: the event was created by create_event and is destroyed once.
    unsafe { sys::cuEventDestroy_v2(event) };
}

pub fn record(event: CUevent, stream: CUstream) -> Result<(), String> {
    // SAFETY: event and stream belong to the same context.
    check(
        unsafe { sys::cuEventRecord(event, stream) },
        "cuEventRecord",
    )
}

/// Milliseconds between two completed events.
pub fn elapsed_ms(start: CUevent, end: CUevent) -> Result<f32, String> {
    let mut ms = 0f32;
    // SAFETY: writes one float; both events have completed.
    check(
        unsafe { sys::cuEventElapsedTime_v2(&mut ms, start, end) },
        "cuEventElapsedTime",
    )?;
    Ok(ms)
}

/// Whether an event has completed: Ok(true) done, Ok(false) still pending.
pub fn event_done(event: CUevent) -> Result<bool, String> {
    // SAFETY: queries a live event.
    let res = unsafe { sys::cuEventQuery(event) };
    match res {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        other => check(other, "cuEventQuery").map(|_| false),
    }
}

/// Poll `events` until all completed or the deadline passes: Ok(true) all done, Ok(false)
/// timed out. `also` is called between polls and may fail the wait (e.g. on an NCCL async
/// error).
pub fn wait_events<E: From<String>>(
    events: &[CUevent],
    deadline: Instant,
    mut also: impl FnMut() -> Result<(), E>,
) -> Result<bool, E> {
    let mut pause = Duration::from_micros(5);
    loop {
        let mut all = true;
        for event in events {
            if !event_done(*event)? {
                all = false;
                break;
            }
        }
        if all {
            return Ok(true);
        }
        also()?;
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

pub fn begin_capture(stream: CUstream) -> Result<(), String> {
    // SAFETY: captures work issued by this thread on a live stream.
    check(
        unsafe {
            sys::cuStreamBeginCapture_v2(
                stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        },
        "cuStreamBeginCapture",
    )
}

/// End a capture; the captured graph (instantiate it with [`instantiate`] once every capture
/// of this thread has ended: instantiating is not allowed while another capture is open).
pub fn end_capture(stream: CUstream) -> Result<sys::CUgraph, String> {
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: writes one graph handle for a stream that is capturing.
    check(
        unsafe { sys::cuStreamEndCapture(stream, &mut graph) },
        "cuStreamEndCapture",
    )?;
    Ok(graph)
}

/// Instantiate a captured graph and free the template.
pub fn instantiate(graph: sys::CUgraph) -> Result<CUgraphExec, String> {
    let mut exec: CUgraphExec = std::ptr::null_mut();
    // SAFETY: instantiates a valid graph; flags 0.
    let res = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
    // SAFETY: the executable graph keeps what it needs; the template can go.
    unsafe { sys::cuGraphDestroy(graph) };
    check(res, "cuGraphInstantiate")?;
    Ok(exec)
}

pub fn launch_graph(exec: CUgraphExec, stream: CUstream) -> Result<(), String> {
    // SAFETY: launches an instantiated graph on a live stream.
    check(unsafe { sys::cuGraphLaunch(exec, stream) }, "cuGraphLaunch")
}

/// Free a captured graph that will not be instantiated.
pub fn destroy_template(graph: sys::CUgraph) {
    // SAFETY: destroys a captured graph once.
    unsafe { sys::cuGraphDestroy(graph) };
}

pub fn destroy_graph(exec: CUgraphExec) {
    // SAFETY: destroys an instantiated graph once.
    unsafe { sys::cuGraphExecDestroy(exec) };
}
