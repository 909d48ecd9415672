//! The measuring loop of one process: it owns some ranks (all of them with `-g`, one with
//! `-p`), creates their communicators, and for every collective, type, operator, size and
//! in-place mode runs a checked collective and then the timed iterations, reporting per-rank
//! events to a sink. Several ranks may share a device: each keeps its own stream, events and
//! buffers in the device's primary context, and device memory is measured once per device. A
//! watchdog makes sure no step waits forever; a call the library refuses (`ncclInvalidUsage`,
//! `ncclInvalidArgument`) ends the run as a `Failure::Refused`. With `--trace-interval` the
//! timed iterations are followed as they end (`trace.rs`).

use crate::args::{Coll, Dtype, Op, Options};
use crate::check::{self, Pattern, Shape};
use crate::cuda::{self, CUcontext, CUdeviceptr, CUevent, CUstream, DeviceBuffer};
use crate::nccl::{
    is_refusal, Comm, Nccl, NcclError, UniqueId, NCCL_IN_PROGRESS, NCCL_SUCCESS,
    SCALAR_HOST_IMMEDIATE,
};
use crate::protocol::{Event, InitInfo, RankResult, Refusal, ResultKey};
use crate::trace::{self, Tracer};
use parking_lot::Mutex;
use std::ffi::c_void;
use std::sync::Once;
use std::time::{Duration, Instant};

/// Why a run stopped.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// An error with its message (exit status 3).
    Error(String),
    /// A step that did not finish in time (exit status 4).
    Hang(String),
    /// The library declined the configuration (exit status 3; a result, not a crash).
    Refused(Refusal),
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure::Error(message)
    }
}

impl From<NcclError> for Failure {
    fn from(error: NcclError) -> Failure {
        if is_refusal(error.result) {
            Failure::Refused(Refusal::from_error(&error))
        } else {
            Failure::Error(error.to_string())
        }
    }
}

impl Failure {
    /// Name the library in a refusal that does not name one yet.
    pub fn with_library(self, library: &str) -> Failure {
        match self {
            Failure::Refused(mut refusal) if refusal.library.is_empty() => {
                refusal.library = library.to_string();
                Failure::Refused(refusal)
            }
            other => other,
        }
    }
}

/// Exit status the benchmark uses for a hang.
pub const EXIT_HANG: i32 = 4;

static WATCHED: Mutex<Option<(Instant, String)>> = Mutex::new(None);
static WATCHDOG: Once = Once::new();

/// Exit the process if a host-side step blocks past its deadline. The thread only reads the
/// armed deadline, so it is harmless when nothing is armed.
fn start_watchdog() {
    WATCHDOG.call_once(|| {
        std::thread::spawn(|| loop {
            std::thread::sleep(Duration::from_millis(200));
            let expired = WATCHED
                .lock()
                .as_ref()
                .filter(|(deadline, _)| Instant::now() > *deadline)
                .map(|(_, what)| what.clone());
            if let Some(what) = expired {
                eprintln!("oxccl-bench: HANG: {what} did not return in time; exiting");
                let _ = std::io::Write::flush(&mut std::io::stderr());
                // SAFETY: _exit ends the process without running handlers that could block on
                // the hung library.
                unsafe { libc::_exit(EXIT_HANG) };
            }
        });
    });
}

/// Run `step` with the watchdog armed for `what`; `timeout` bounds how long it may block.
fn watched<T>(what: &str, timeout: Duration, step: impl FnOnce() -> T) -> T {
    start_watchdog();
    *WATCHED.lock() = Some((Instant::now() + timeout, what.to_string()));
    let result = step();
    *WATCHED.lock() = None;
    result
}

/// One rank driven by this process. Ranks on the same device share its context but never a
/// stream, an event or a buffer.
struct LocalRank {
    rank: usize,
    device: usize,
    ctx: CUcontext,
    stream: CUstream,
    comm: Comm,
    send: DeviceBuffer,
    recv: DeviceBuffer,
    starts: Vec<CUevent>,
    ends: Vec<CUevent>,
    /// PreMulSum operator of this communicator for the current type.
    premulsum: Option<i32>,
}

/// One device used by this process: its primary context, retained once however many local
/// ranks it holds, and the free-memory reading after the benchmark's own buffers.
struct LocalDevice {
    device: usize,
    ctx: CUcontext,
    mem_after_alloc: usize,
}

/// The distinct devices of `local` in order of first use, each primary context retained once.
fn open_devices(local: &[(usize, usize)]) -> Result<Vec<LocalDevice>, Failure> {
    let mut devices: Vec<LocalDevice> = Vec::new();
    for &(_, device) in local {
        if devices.iter().all(|d| d.device != device) {
            devices.push(LocalDevice {
                device,
                ctx: cuda::primary_context(device)?,
                mem_after_alloc: 0,
            });
        }
    }
    Ok(devices)
}

/// `rank(s) 0,1 on device(s) 0,0`, for messages about several local ranks.
fn ranks_text(local: &[(usize, usize)]) -> String {
    let ranks: Vec<usize> = local.iter().map(|&(r, _)| r).collect();
    let devices: Vec<usize> = local.iter().map(|&(_, d)| d).collect();
    format!(
        "rank(s) {} on device(s) {}",
        crate::args::devices_text(&ranks),
        crate::args::devices_text(&devices)
    )
}

/// Device pointers of one launch.
#[derive(Clone, Copy)]
struct Buffers {
    send: CUdeviceptr,
    recv: CUdeviceptr,
}

/// What is being run right now, for messages.
#[derive(Clone, Copy)]
struct Step {
    coll: Coll,
    dtype: Dtype,
    op: Option<Op>,
    size: u64,
    inplace: bool,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} {}size {} B {}",
            self.coll,
            self.dtype,
            self.op.map_or(String::new(), |o| format!("{o} ")),
            self.size,
            if self.inplace {
                "in-place"
            } else {
                "out-of-place"
            }
        )
    }
}

fn nccl_call_name(coll: Coll) -> &'static str {
    match coll {
        Coll::AllReduce => "ncclAllReduce",
        Coll::AllGather => "ncclAllGather",
        Coll::ReduceScatter => "ncclReduceScatter",
        Coll::Broadcast => "ncclBroadcast",
        Coll::Reduce => "ncclReduce",
        Coll::AlltoAll => "ncclAlltoAll",
        Coll::Gather => "ncclGather",
        Coll::Scatter => "ncclScatter",
        Coll::SendRecv => "ncclSend/ncclRecv",
    }
}

/// Where rank `rank`'s send and receive buffers are for one launch (in-place variants put one
/// inside the other, as nccl-tests does).
fn buffers_for(coll: Coll, shape: &Shape, elt: usize, lr: &LocalRank, inplace: bool) -> Buffers {
    if !inplace {
        return Buffers {
            send: lr.send.ptr,
            recv: lr.recv.ptr,
        };
    }
    let offset = (lr.rank * shape.count * elt) as CUdeviceptr;
    let base = lr.recv.ptr;
    match coll {
        Coll::AllGather | Coll::Gather => Buffers {
            send: base + offset,
            recv: base,
        },
        Coll::ReduceScatter | Coll::Scatter => Buffers {
            send: base,
            recv: base + offset,
        },
        _ => Buffers {
            send: base,
            recv: base,
        },
    }
}

/// Median of a list of times.
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// The ranks one process runs and the communicator they belong to.
pub struct Placement {
    pub nranks: usize,
    /// (global rank, device) for each rank of this process.
    pub local: Vec<(usize, usize)>,
    pub unique_id: Option<UniqueId>,
}

struct Worker<'a> {
    nccl: &'a Nccl,
    opts: &'a Options,
    nranks: usize,
    ranks: Vec<LocalRank>,
    devices: Vec<LocalDevice>,
    timeout: Duration,
    first_coll_reported: bool,
    /// Whether communicator init succeeded and every rank exists (only then are the
    /// communicators aborted on a failure).
    comms_ready: bool,
}

/// Run the whole sweep for the ranks of `placement`, sending events to `sink`.
pub fn run(
    nccl: &Nccl,
    opts: &Options,
    placement: &Placement,
    sink: &mut dyn FnMut(Event),
) -> Result<(), Failure> {
    let device_count = cuda::init()?;
    for &(rank, device) in &placement.local {
        if device >= device_count {
            return Err(Failure::Error(format!(
                "rank {rank} is placed on GPU {device} but only {device_count} GPU(s) are visible (GPUs 0..{})",
                device_count.saturating_sub(1)
            )));
        }
    }
    let timeout = Duration::from_secs_f64(opts.timeout_s);
    let mut worker = Worker {
        nccl,
        opts,
        nranks: placement.nranks,
        ranks: Vec::new(),
        devices: Vec::new(),
        timeout,
        first_coll_reported: false,
        comms_ready: false,
    };
    let outcome = worker
        .setup(placement, sink)
        .and_then(|_| worker.sweep(sink));
    match outcome {
        Ok(()) => worker.teardown(),
        Err(failure) => {
            if worker.comms_ready {
                worker.abort();
            } else {
                // After a failed or refused init the communicators may be half made, and an
                // abort of them could block: leave them to process exit.
                std::mem::forget(std::mem::take(&mut worker.ranks));
            }
            Err(failure)
        }
    }
}

impl Worker<'_> {
    fn setup(&mut self, placement: &Placement, sink: &mut dyn FnMut(Event)) -> Result<(), Failure> {
        self.devices = open_devices(&placement.local)?;
        let mem_before = self.free_memory_per_device()?;
        let unique_id = match placement.unique_id {
            Some(id) => id,
            None => self.nccl.unique_id()?,
        };
        let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); placement.local.len()];
        let started = Instant::now();
        // A failed or refused init ends the run here; its communicators are not aborted (see
        // `run`), the process exits soon after.
        self.init_communicators(placement, unique_id, &mut comms)?;
        let init_ms = started.elapsed().as_secs_f64() * 1e3;
        // Free memory right after init, before the benchmark allocates anything of its own.
        let mem_after_init = self.free_memory_per_device()?;
        // From here on a failure aborts every communicator.
        self.create_ranks(placement, &comms)?;
        self.comms_ready = true;
        for lr in &self.ranks {
            let slot = self.device_slot(lr.device);
            sink(Event::Init(InitInfo {
                rank: lr.rank,
                device: lr.device,
                init_ms,
                init_bytes: mem_before[slot] as i64 - mem_after_init[slot] as i64,
            }));
        }
        self.allocate_buffers()
    }

    /// Index into `self.devices` of a device this process uses.
    fn device_slot(&self, device: usize) -> usize {
        self.devices
            .iter()
            .position(|d| d.device == device)
            .unwrap_or(0)
    }

    /// Free memory of every local device, in `self.devices` order.
    fn free_memory_per_device(&self) -> Result<Vec<usize>, Failure> {
        let mut free = Vec::new();
        for device in &self.devices {
            cuda::set_current(device.ctx)?;
            free.push(cuda::free_memory()?);
        }
        Ok(free)
    }

    /// `ncclCommInitRank` for every local rank with its device current, grouped when this
    /// process has several ranks; bounded by the watchdog.
    fn init_communicators(
        &self,
        placement: &Placement,
        unique_id: UniqueId,
        comms: &mut [Comm],
    ) -> Result<(), Failure> {
        let nccl = self.nccl;
        let who = ranks_text(&placement.local);
        let grouped = placement.local.len() > 1;
        let what = format!("communicator init (ncclCommInitRank of {who})");
        watched(&what, self.timeout, || {
            if grouped {
                // SAFETY: plain NCCL call.
                nccl.check(
                    unsafe { (nccl.group_start)() },
                    "ncclGroupStart",
                    std::ptr::null_mut(),
                )?;
            }
            for (i, &(rank, device)) in placement.local.iter().enumerate() {
                cuda::set_current(self.devices[self.device_slot(device)].ctx)?;
                // SAFETY: comms[i] receives the communicator; the id is passed by value as C does.
                let result = unsafe {
                    (nccl.comm_init_rank)(&mut comms[i], self.nranks as i32, unique_id, rank as i32)
                };
                if result != NCCL_SUCCESS {
                    let error = nccl.error(
                        result,
                        &format!(
                            "ncclCommInitRank (rank {rank} of {}, device {device})",
                            self.nranks
                        ),
                        std::ptr::null_mut(),
                    );
                    if grouped {
                        // Close the group so that the library drops the queued inits.
                        // SAFETY: plain NCCL call.
                        unsafe { (nccl.group_end)() };
                    }
                    return Err(error.into());
                }
            }
            if grouped {
                // SAFETY: plain NCCL call.
                let result = unsafe { (nccl.group_end)() };
                nccl.check(
                    result,
                    &format!("ncclGroupEnd after ncclCommInitRank ({who})"),
                    std::ptr::null_mut(),
                )?;
            }
            Ok::<(), Failure>(())
        })
    }

    /// Stream and events of every local rank, created in its device's primary context.
    fn create_ranks(&mut self, placement: &Placement, comms: &[Comm]) -> Result<(), Failure> {
        let events = |n: usize| {
            (0..n)
                .map(|_| cuda::create_event())
                .collect::<Result<Vec<_>, _>>()
        };
        for (i, &(rank, device)) in placement.local.iter().enumerate() {
            let ctx = self.devices[self.device_slot(device)].ctx;
            cuda::set_current(ctx)?;
            let stream = cuda::create_stream()?;
            self.ranks.push(LocalRank {
                rank,
                device,
                ctx,
                stream,
                comm: comms[i],
                send: DeviceBuffer::new(0)?,
                recv: DeviceBuffer::new(0)?,
                starts: events(self.opts.iters.max(3))?,
                ends: events(self.opts.iters.max(3))?,
                premulsum: None,
            });
        }
        Ok(())
    }

    /// Every rank's own send and receive buffers, then the free memory of each device once
    /// all of them exist (the baseline of the first-collective figure).
    fn allocate_buffers(&mut self) -> Result<(), Failure> {
        let max_bytes = crate::args::sweep_sizes(self.opts)
            .into_iter()
            .max()
            .unwrap_or(0) as usize;
        for lr in &mut self.ranks {
            cuda::set_current(lr.ctx)?;
            // Buffers a little larger than the largest size, so that nothing rounds past them.
            lr.send = DeviceBuffer::new(max_bytes + 64)?;
            lr.recv = DeviceBuffer::new(max_bytes + 64)?;
        }
        let free = self.free_memory_per_device()?;
        for (device, free) in self.devices.iter_mut().zip(free) {
            device.mem_after_alloc = free;
        }
        Ok(())
    }

    fn sweep(&mut self, sink: &mut dyn FnMut(Event)) -> Result<(), Failure> {
        let sizes = crate::args::sweep_sizes(self.opts);
        for &coll in &self.opts.colls {
            let modes: Vec<bool> = self
                .opts
                .inplace
                .iter()
                .copied()
                .filter(|ip| !*ip || coll.has_inplace())
                .collect();
            if modes.is_empty() {
                eprintln!("oxccl-bench: {coll} has no in-place variant; skipped with --inplace 1");
                continue;
            }
            let ops: Vec<Option<Op>> = if coll.has_op() {
                self.opts.ops.iter().map(|o| Some(*o)).collect()
            } else {
                vec![None]
            };
            for &dtype in &self.opts.dtypes {
                for &op in &ops {
                    self.create_premulsum(dtype, op)?;
                    for &size in &sizes {
                        for &inplace in &modes {
                            let step = Step {
                                coll,
                                dtype,
                                op,
                                size,
                                inplace,
                            };
                            self.measure(step, sink)?;
                        }
                    }
                    self.destroy_premulsum(dtype)?;
                }
            }
        }
        Ok(())
    }

    fn create_premulsum(&mut self, dtype: Dtype, op: Option<Op>) -> Result<(), Failure> {
        if op != Some(Op::PreMulSum) {
            return Ok(());
        }
        let nccl = self.nccl;
        let mut scalar = [0u8; 8];
        crate::convert::encode(dtype, check::PREMULSUM_SCALAR, &mut scalar[..dtype.size()]);
        for lr in &mut self.ranks {
            cuda::set_current(lr.ctx)?;
            let mut handle = 0;
            // SAFETY: the scalar is read before the call returns (host-immediate residence).
            let result = unsafe {
                (nccl.red_op_create_pre_mul_sum)(
                    &mut handle,
                    scalar.as_mut_ptr() as *mut c_void,
                    dtype as i32,
                    SCALAR_HOST_IMMEDIATE,
                    lr.comm,
                )
            };
            nccl.check(
                result,
                &format!("ncclRedOpCreatePreMulSum ({dtype}, rank {})", lr.rank),
                lr.comm,
            )?;
            lr.premulsum = Some(handle);
        }
        Ok(())
    }

    fn destroy_premulsum(&mut self, dtype: Dtype) -> Result<(), Failure> {
        let nccl = self.nccl;
        for lr in &mut self.ranks {
            if let Some(handle) = lr.premulsum.take() {
                // SAFETY: the operator was created on this communicator and is no longer used.
                let result = unsafe { (nccl.red_op_destroy)(handle, lr.comm) };
                nccl.check(
                    result,
                    &format!("ncclRedOpDestroy ({dtype}, rank {})", lr.rank),
                    lr.comm,
                )?;
            }
        }
        Ok(())
    }

    /// Issue one collective on every local rank inside one NCCL group.
    fn launch(&self, step: Step, shape: &Shape, buffers: &[Buffers]) -> Result<(), Failure> {
        let nccl = self.nccl;
        let what = nccl_call_name(step.coll);
        let dtype = step.dtype as i32;
        let root = self.opts.root as i32;
        let n = self.nranks;
        // SAFETY: plain NCCL call.
        nccl.check(
            unsafe { (nccl.group_start)() },
            "ncclGroupStart",
            std::ptr::null_mut(),
        )?;
        for (lr, b) in self.ranks.iter().zip(buffers) {
            cuda::set_current(lr.ctx)?;
            let op = match step.op {
                Some(Op::PreMulSum) => lr.premulsum.unwrap_or(0),
                Some(o) => o.builtin_code().unwrap_or(0),
                None => 0,
            };
            let (send, recv) = (b.send as *const c_void, b.recv as *mut c_void);
            let (comm, stream) = (lr.comm, lr.stream as *mut c_void);
            let count = shape.count;
            // SAFETY: the buffers hold send_elems / recv_elems elements of the type (they are
            // allocated for the largest size), comm and stream belong to this rank's device.
            let result = unsafe {
                match step.coll {
                    Coll::AllReduce => {
                        (nccl.all_reduce)(send, recv, count, dtype, op, comm, stream)
                    }
                    Coll::ReduceScatter => {
                        (nccl.reduce_scatter)(send, recv, count, dtype, op, comm, stream)
                    }
                    Coll::Reduce => (nccl.reduce)(send, recv, count, dtype, op, root, comm, stream),
                    Coll::AllGather => (nccl.all_gather)(send, recv, count, dtype, comm, stream),
                    Coll::AlltoAll => (nccl.alltoall)(send, recv, count, dtype, comm, stream),
                    Coll::Broadcast => {
                        (nccl.broadcast)(send, recv, count, dtype, root, comm, stream)
                    }
                    Coll::Gather => (nccl.gather)(send, recv, count, dtype, root, comm, stream),
                    Coll::Scatter => (nccl.scatter)(send, recv, count, dtype, root, comm, stream),
                    Coll::SendRecv => {
                        let next = ((lr.rank + 1) % n) as i32;
                        let prev = ((lr.rank + n - 1) % n) as i32;
                        let sent = (nccl.send)(send, count, dtype, next, comm, stream);
                        if sent != NCCL_SUCCESS {
                            sent
                        } else {
                            (nccl.recv)(recv, count, dtype, prev, comm, stream)
                        }
                    }
                }
            };
            if result != NCCL_SUCCESS {
                let error = nccl.error(
                    result,
                    &format!("{what} (rank {}, device {}, {step})", lr.rank, lr.device),
                    comm,
                );
                // Close the group so that the library is left in a sane state, then report.
                watched(
                    &format!("ncclGroupEnd closing the group after {what} failed ({step})"),
                    self.timeout,
                    // SAFETY: plain NCCL call.
                    || unsafe { (nccl.group_end)() },
                );
                return Err(error.into());
            }
        }
        let result = watched(
            &format!(
                "ncclGroupEnd after {what} ({step}) for {}",
                self.ranks_text()
            ),
            self.timeout,
            || {
                // SAFETY: plain NCCL call.
                unsafe { (nccl.group_end)() }
            },
        );
        let comm = self.ranks.first().map_or(std::ptr::null_mut(), |r| r.comm);
        nccl.check(result, &format!("ncclGroupEnd after {what} ({step})"), comm)?;
        Ok(())
    }

    /// The local ranks and their devices, for messages.
    fn ranks_text(&self) -> String {
        let local: Vec<(usize, usize)> = self.ranks.iter().map(|r| (r.rank, r.device)).collect();
        ranks_text(&local)
    }

    /// Wait until `events[i]` (one per local rank) completed; a hang or an asynchronous NCCL
    /// error ends the run.
    fn wait(&self, events: &[CUevent], step: Step, phase: &str) -> Result<(), Failure> {
        let nccl = self.nccl;
        let deadline = Instant::now() + self.timeout;
        let done = cuda::wait_events(events, deadline, || {
            for lr in &self.ranks {
                let mut state = NCCL_SUCCESS;
                // SAFETY: writes one result code for a live communicator.
                let result = unsafe { (nccl.comm_get_async_error)(lr.comm, &mut state) };
                nccl.check(result, "ncclCommGetAsyncError", lr.comm)?;
                if state != NCCL_SUCCESS && state != NCCL_IN_PROGRESS {
                    return Err(Failure::from(nccl.error(
                        state,
                        &format!(
                            "asynchronous NCCL error during {phase} of {step} on rank {} (device {})",
                            lr.rank, lr.device
                        ),
                        lr.comm,
                    )));
                }
            }
            Ok(())
        })?;
        if done {
            Ok(())
        } else {
            let pending: Vec<(usize, usize)> = self
                .ranks
                .iter()
                .zip(events)
                .filter(|(_, e)| !cuda::event_done(**e).unwrap_or(false))
                .map(|(lr, _)| (lr.rank, lr.device))
                .collect();
            Err(Failure::Hang(format!(
                "{phase} of {step} ({}) did not complete within {} s on {}",
                nccl_call_name(step.coll),
                self.opts.timeout_s,
                ranks_text(&pending)
            )))
        }
    }

    fn record_all(&self, events: impl Fn(&LocalRank) -> CUevent) -> Result<Vec<CUevent>, Failure> {
        let mut recorded = Vec::new();
        for lr in &self.ranks {
            cuda::set_current(lr.ctx)?;
            let event = events(lr);
            cuda::record(event, lr.stream)?;
            recorded.push(event);
        }
        Ok(recorded)
    }

    fn report_first_collective_memory(
        &mut self,
        sink: &mut dyn FnMut(Event),
    ) -> Result<(), Failure> {
        if self.first_coll_reported {
            return Ok(());
        }
        self.first_coll_reported = true;
        let free = self.free_memory_per_device()?;
        for lr in &self.ranks {
            let slot = self.device_slot(lr.device);
            sink(Event::FirstCollMemory {
                rank: lr.rank,
                device: lr.device,
                bytes: self.devices[slot].mem_after_alloc as i64 - free[slot] as i64,
            });
        }
        Ok(())
    }

    fn measure(&mut self, step: Step, sink: &mut dyn FnMut(Event)) -> Result<(), Failure> {
        let shape = check::shape(step.coll, step.dtype, step.size, self.nranks);
        let elt = step.dtype.size();
        let buffers: Vec<Buffers> = self
            .ranks
            .iter()
            .map(|lr| buffers_for(step.coll, &shape, elt, lr, step.inplace))
            .collect();
        let wrong = if self.opts.check {
            self.checked_run(step, &shape, &buffers, sink)?
        } else {
            vec![-1; self.ranks.len()]
        };
        let times = self.timed_runs(step, &shape, &buffers, sink)?;
        let key = ResultKey {
            coll: step.coll,
            dtype: step.dtype,
            op: step.op,
            root: step.coll.has_root().then_some(self.opts.root),
            size: step.size,
            inplace: step.inplace,
            count: shape.count,
            bytes: shape.bytes,
        };
        for (i, lr) in self.ranks.iter().enumerate() {
            sink(Event::Result(RankResult {
                key,
                rank: lr.rank,
                time_us: times[i],
                wrong: wrong[i],
            }));
        }
        Ok(())
    }

    /// Poison outputs, write inputs, run once, compare: wrong elements per local rank.
    fn checked_run(
        &mut self,
        step: Step,
        shape: &Shape,
        buffers: &[Buffers],
        sink: &mut dyn FnMut(Event),
    ) -> Result<Vec<i64>, Failure> {
        let elt = step.dtype.size();
        let pattern = Pattern::new(step.dtype, step.op, self.nranks);
        let mut host = vec![0u8; shape.send_elems.max(shape.recv_elems) * elt];
        for (lr, b) in self.ranks.iter().zip(buffers) {
            cuda::set_current(lr.ctx)?;
            cuda::fill_device(
                b.recv,
                check::poison_byte(step.dtype),
                shape.recv_elems * elt,
            )?;
            let input = &mut host[..shape.send_elems * elt];
            check::fill_input(&pattern, lr.rank, input);
            cuda::copy_to_device(b.send, input)?;
        }
        self.launch(step, shape, buffers)?;
        let done = self.record_all(|lr| lr.ends[0])?;
        self.wait(&done, step, "the checked run")?;
        self.report_first_collective_memory(sink)?;
        let mut wrong = Vec::new();
        for (lr, b) in self.ranks.iter().zip(buffers) {
            cuda::set_current(lr.ctx)?;
            let output = &mut host[..shape.recv_elems * elt];
            cuda::copy_to_host(output, b.recv)?;
            let found = check::compare(
                step.coll,
                &pattern,
                lr.rank,
                self.opts.root,
                shape.count,
                output,
            );
            if found.wrong > 0 {
                let examples: Vec<String> = found
                    .first
                    .iter()
                    .map(|(i, want, got)| format!("[{i}] expected {want} got {got}"))
                    .collect();
                eprintln!(
                    "oxccl-bench: WRONG: {step} rank {}: {} of {} elements wrong, e.g. {}",
                    lr.rank,
                    found.wrong,
                    shape.recv_elems,
                    examples.join(", ")
                );
            }
            wrong.push(found.wrong as i64);
        }
        Ok(wrong)
    }

    /// Warm-up then timed iterations; the median per-iteration time of each local rank (µs).
    fn timed_runs(
        &mut self,
        step: Step,
        shape: &Shape,
        buffers: &[Buffers],
        sink: &mut dyn FnMut(Event),
    ) -> Result<Vec<f64>, Failure> {
        for _ in 0..self.opts.warmup {
            self.launch(step, shape, buffers)?;
        }
        if self.opts.warmup > 0 {
            let done = self.record_all(|lr| lr.ends[0])?;
            self.wait(&done, step, "the warm-up")?;
            self.report_first_collective_memory(sink)?;
        }
        let iters = self.opts.iters;
        let mut per_rank: Vec<Vec<f64>> = vec![Vec::new(); self.ranks.len()];
        if self.opts.graph {
            let graphs = self.capture(step, shape, buffers)?;
            let replays = 3;
            let outcome = (|| {
                for replay in 0..replays {
                    self.record_all(|lr| lr.starts[replay])?;
                    for (lr, graph) in self.ranks.iter().zip(&graphs) {
                        cuda::set_current(lr.ctx)?;
                        cuda::launch_graph(*graph, lr.stream)?;
                    }
                    self.record_all(|lr| lr.ends[replay])?;
                }
                let done: Vec<CUevent> = self.ranks.iter().map(|lr| lr.ends[replays - 1]).collect();
                self.wait(&done, step, "the graph replays")?;
                for (i, lr) in self.ranks.iter().enumerate() {
                    for replay in 0..replays {
                        let ms = cuda::elapsed_ms(lr.starts[replay], lr.ends[replay])?;
                        per_rank[i].push(f64::from(ms) * 1e3 / iters as f64);
                    }
                }
                Ok::<(), Failure>(())
            })();
            for graph in graphs {
                cuda::destroy_graph(graph);
            }
            outcome?;
        } else {
            let started = std::time::SystemTime::now();
            for i in 0..iters {
                self.record_all(|lr| lr.starts[i])?;
                self.launch(step, shape, buffers)?;
                self.record_all(|lr| lr.ends[i])?;
            }
            if let Some(interval) = self.opts.trace_interval {
                self.trace(step, shape, interval, started)?;
            }
            let done: Vec<CUevent> = self.ranks.iter().map(|lr| lr.ends[iters - 1]).collect();
            self.wait(&done, step, "the timed iterations")?;
            for (r, lr) in self.ranks.iter().enumerate() {
                for i in 0..iters {
                    let ms = cuda::elapsed_ms(lr.starts[i], lr.ends[i])?;
                    per_rank[r].push(f64::from(ms) * 1e3);
                }
            }
        }
        self.report_first_collective_memory(sink)?;
        Ok(per_rank.iter_mut().map(|times| median(times)).collect())
    }

    /// `--trace-interval`: follow the launched timed iterations as they end and print busbw
    /// per interval (`trace.rs`). An iteration's end is the slowest local rank's, timed from
    /// the first iteration's start by the ranks' events; `started` is the wall-clock time
    /// the first was launched. Each wait is bounded as every other.
    fn trace(
        &self,
        step: Step,
        shape: &Shape,
        interval: Duration,
        started: std::time::SystemTime,
    ) -> Result<(), Failure> {
        let factor = check::bus_factor(step.coll, self.nranks);
        let mut tracer = Tracer::new(interval, shape.bytes, factor);
        emit_trace(&trace::start_line(step.size, started, interval));
        for i in 0..self.opts.iters {
            let ends: Vec<CUevent> = self.ranks.iter().map(|lr| lr.ends[i]).collect();
            self.wait(&ends, step, "the timed iterations")?;
            let mut t = 0.0f64;
            for lr in &self.ranks {
                let ms = cuda::elapsed_ms(lr.starts[0], lr.ends[i])?;
                t = t.max(f64::from(ms) / 1e3);
            }
            for line in tracer.iteration_ended(t) {
                emit_trace(&line.to_string());
            }
        }
        if let Some(line) = tracer.finish() {
            emit_trace(&line.to_string());
        }
        Ok(())
    }

    /// Capture `iters` launches into one graph per local rank.
    fn capture(
        &self,
        step: Step,
        shape: &Shape,
        buffers: &[Buffers],
    ) -> Result<Vec<cuda::CUgraphExec>, Failure> {
        for lr in &self.ranks {
            cuda::set_current(lr.ctx)?;
            cuda::begin_capture(lr.stream)?;
        }
        let mut launched = Ok(());
        for _ in 0..self.opts.iters {
            launched = self.launch(step, shape, buffers);
            if launched.is_err() {
                break;
            }
        }
        // End every capture even after a failure so that the streams are usable (or abortable);
        // instantiate only once all have ended (not allowed while one is still open).
        let mut captured = Vec::new();
        let mut ended = Ok(());
        for lr in &self.ranks {
            cuda::set_current(lr.ctx)?;
            match cuda::end_capture(lr.stream) {
                Ok(graph) => captured.push((lr.ctx, graph)),
                Err(e) => ended = Err(Failure::Error(format!("graph capture of {step}: {e}"))),
            }
        }
        let mut graphs = Vec::new();
        for (ctx, graph) in captured {
            cuda::set_current(ctx)?;
            if launched.is_err() || ended.is_err() {
                cuda::destroy_template(graph);
                continue;
            }
            match cuda::instantiate(graph) {
                Ok(exec) => graphs.push(exec),
                Err(e) => ended = Err(Failure::Error(format!("graph of {step}: {e}"))),
            }
        }
        if launched.is_err() || ended.is_err() {
            for graph in graphs {
                cuda::destroy_graph(graph);
            }
            launched?;
            ended?;
            unreachable!("one of the two results is an error");
        }
        Ok(graphs)
    }

    fn teardown(&mut self) -> Result<(), Failure> {
        let nccl = self.nccl;
        let ranks = std::mem::take(&mut self.ranks);
        for lr in &ranks {
            cuda::set_current(lr.ctx)?;
            let result = watched(
                &format!("ncclCommDestroy (rank {}, device {})", lr.rank, lr.device),
                self.timeout,
                // SAFETY: destroys a live communicator once, after all its work completed.
                || unsafe { (nccl.comm_destroy)(lr.comm) },
            );
            nccl.check(
                result,
                &format!("ncclCommDestroy (rank {})", lr.rank),
                std::ptr::null_mut(),
            )?;
        }
        release(ranks);
        Ok(())
    }

    /// Abort every communicator after a failure (bounded by the watchdog).
    fn abort(&mut self) {
        let nccl = self.nccl;
        let ranks = std::mem::take(&mut self.ranks);
        for lr in &ranks {
            if lr.comm.is_null() {
                continue;
            }
            let _ = cuda::set_current(lr.ctx);
            watched(
                &format!("ncclCommAbort (rank {}, device {})", lr.rank, lr.device),
                Duration::from_secs(20),
                // SAFETY: aborts a communicator once; nothing uses it afterwards.
                || unsafe { (nccl.comm_abort)(lr.comm) },
            );
        }
        // After an abort the device may be unusable; leave the rest to process exit.
        std::mem::forget(ranks);
    }
}

/// A trace line on stdout at once (a parent process passes it through as it comes).
fn emit_trace(line: &str) {
    println!("{line}");
    let _ = std::io::Write::flush(&mut std::io::stdout());
}

fn release(ranks: Vec<LocalRank>) {
    for lr in ranks {
        let _ = cuda::set_current(lr.ctx);
        for event in lr.starts.iter().chain(&lr.ends) {
            cuda::destroy_event(*event);
        }
        cuda::destroy_stream(lr.stream);
        drop(lr.send);
        drop(lr.recv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_lists() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }
}
