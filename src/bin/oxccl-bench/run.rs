//! The measuring loop of one process: it owns some ranks (all of them with `-g`, one with
//! `-p`), creates their communicators, and for every collective, type, operator, size and
//! in-place mode runs a checked collective and then the timed iterations, reporting per-rank
//! events to a sink. A watchdog makes sure no step waits forever.

use crate::args::{Coll, Dtype, Op, Options};
use crate::check::{self, Pattern, Shape};
use crate::cuda::{self, CUcontext, CUdeviceptr, CUevent, CUstream, DeviceBuffer};
use crate::nccl::{Comm, Nccl, UniqueId, NCCL_IN_PROGRESS, NCCL_SUCCESS, SCALAR_HOST_IMMEDIATE};
use crate::protocol::{Event, InitInfo, RankResult, ResultKey};
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
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure::Error(message)
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

/// One rank driven by this process.
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
    mem_after_alloc: usize,
    /// PreMulSum operator of this communicator for the current type.
    premulsum: Option<i32>,
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
    timeout: Duration,
    first_coll_reported: bool,
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
                "rank {rank} needs GPU {device} but only {device_count} GPU(s) are visible; {} rank(s) need {} GPUs",
                placement.nranks, placement.nranks
            )));
        }
    }
    let timeout = Duration::from_secs_f64(opts.timeout_s);
    let mut worker = Worker {
        nccl,
        opts,
        nranks: placement.nranks,
        ranks: Vec::new(),
        timeout,
        first_coll_reported: false,
    };
    let outcome = worker
        .setup(placement, sink)
        .and_then(|_| worker.sweep(sink));
    match outcome {
        Ok(()) => worker.teardown(),
        Err(failure) => {
            worker.abort();
            Err(failure)
        }
    }
}

impl Worker<'_> {
    fn setup(&mut self, placement: &Placement, sink: &mut dyn FnMut(Event)) -> Result<(), Failure> {
        let nccl = self.nccl;
        let mut mem_before = Vec::new();
        let mut contexts = Vec::new();
        for &(_, device) in &placement.local {
            let ctx = cuda::primary_context(device)?;
            mem_before.push(cuda::free_memory()?);
            contexts.push(ctx);
        }
        let unique_id = match placement.unique_id {
            Some(id) => id,
            None => nccl.unique_id()?,
        };
        let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); placement.local.len()];
        let started = Instant::now();
        let init_result = watched("communicator init (ncclCommInitRank)", self.timeout, || {
            let grouped = placement.local.len() > 1;
            if grouped {
                // SAFETY: plain NCCL call.
                nccl.check(
                    unsafe { (nccl.group_start)() },
                    "ncclGroupStart",
                    std::ptr::null_mut(),
                )?;
            }
            for (i, &(rank, _)) in placement.local.iter().enumerate() {
                cuda::set_current(contexts[i])?;
                // SAFETY: comms[i] receives the communicator; the id is passed by value as C does.
                let result = unsafe {
                    (nccl.comm_init_rank)(&mut comms[i], self.nranks as i32, unique_id, rank as i32)
                };
                nccl.check(
                    result,
                    &format!("ncclCommInitRank (rank {rank} of {})", self.nranks),
                    std::ptr::null_mut(),
                )?;
            }
            if grouped {
                // SAFETY: plain NCCL call.
                let result = unsafe { (nccl.group_end)() };
                nccl.check(
                    result,
                    "ncclGroupEnd after ncclCommInitRank",
                    std::ptr::null_mut(),
                )?;
            }
            Ok::<(), String>(())
        });
        let init_ms = started.elapsed().as_secs_f64() * 1e3;
        // Free memory right after init, before the benchmark allocates anything of its own.
        let mut mem_after_init = Vec::new();
        for ctx in &contexts {
            cuda::set_current(*ctx)?;
            mem_after_init.push(cuda::free_memory()?);
        }
        // Keep whatever communicators were created so that abort can clean them up.
        for (i, &(rank, device)) in placement.local.iter().enumerate() {
            cuda::set_current(contexts[i])?;
            let stream = cuda::create_stream()?;
            let events = |n: usize| {
                (0..n)
                    .map(|_| cuda::create_event())
                    .collect::<Result<Vec<_>, _>>()
            };
            self.ranks.push(LocalRank {
                rank,
                device,
                ctx: contexts[i],
                stream,
                comm: comms[i],
                send: DeviceBuffer::new(0)?,
                recv: DeviceBuffer::new(0)?,
                starts: events(self.opts.iters.max(3))?,
                ends: events(self.opts.iters.max(3))?,
                mem_after_alloc: 0,
                premulsum: None,
            });
        }
        init_result?;
        let max_bytes = crate::args::sweep_sizes(self.opts)
            .into_iter()
            .max()
            .unwrap_or(0) as usize;
        for (i, lr) in self.ranks.iter_mut().enumerate() {
            cuda::set_current(lr.ctx)?;
            sink(Event::Init(InitInfo {
                rank: lr.rank,
                device: lr.device,
                init_ms,
                init_bytes: mem_before[i] as i64 - mem_after_init[i] as i64,
            }));
            // Buffers a little larger than the largest size, so that nothing rounds past them.
            lr.send = DeviceBuffer::new(max_bytes + 64)?;
            lr.recv = DeviceBuffer::new(max_bytes + 64)?;
            lr.mem_after_alloc = cuda::free_memory()?;
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
                // Close the group so that the library is left in a sane state, then report.
                // SAFETY: plain NCCL call.
                unsafe { (nccl.group_end)() };
                return Err(nccl
                    .check(result, &format!("{what} (rank {}, {step})", lr.rank), comm)
                    .unwrap_err()
                    .into());
            }
        }
        let result = watched(
            &format!("ncclGroupEnd after {what} ({step})"),
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
                    return Err(nccl
                        .check(
                            state,
                            &format!(
                                "asynchronous NCCL error during {phase} of {step} on rank {}",
                                lr.rank
                            ),
                            lr.comm,
                        )
                        .unwrap_err());
                }
            }
            Ok(())
        })?;
        if done {
            Ok(())
        } else {
            let pending: Vec<String> = self
                .ranks
                .iter()
                .zip(events)
                .filter(|(_, e)| !cuda::event_done(**e).unwrap_or(false))
                .map(|(lr, _)| lr.rank.to_string())
                .collect();
            Err(Failure::Hang(format!(
                "{phase} of {step} ({}) did not complete within {} s on rank(s) {}",
                nccl_call_name(step.coll),
                self.opts.timeout_s,
                pending.join(",")
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
        for lr in &self.ranks {
            cuda::set_current(lr.ctx)?;
            let free = cuda::free_memory()?;
            sink(Event::FirstCollMemory {
                rank: lr.rank,
                bytes: lr.mem_after_alloc as i64 - free as i64,
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
            for i in 0..iters {
                self.record_all(|lr| lr.starts[i])?;
                self.launch(step, shape, buffers)?;
                self.record_all(|lr| lr.ends[i])?;
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
        // End every capture even after a failure so that the streams are usable (or abortable).
        let mut graphs = Vec::new();
        let mut ended = Ok(());
        for lr in &self.ranks {
            cuda::set_current(lr.ctx)?;
            match cuda::end_capture(lr.stream) {
                Ok(graph) => graphs.push(graph),
                Err(e) => ended = Err(Failure::Error(format!("graph capture of {step}: {e}"))),
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
                &format!("ncclCommDestroy (rank {})", lr.rank),
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
                &format!("ncclCommAbort (rank {})", lr.rank),
                Duration::from_secs(20),
                // SAFETY: aborts a communicator once; nothing uses it afterwards.
                || unsafe { (nccl.comm_abort)(lr.comm) },
            );
        }
        // After an abort the device may be unusable; leave the rest to process exit.
        std::mem::forget(ranks);
    }
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
