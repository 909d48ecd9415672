//! Group semantics: `ncclGroupStart`/`ncclGroupEnd` nesting per thread; the communicator
//! creations and operations collected until the outermost end, which then runs creations
//! (concurrently, one thread each) and then each communicator's operations as one launch
//! (concurrently across communicators, since connection setup waits on peers). With the
//! collective check on (`OXCCL_CHECK_COLLECTIVES=1`), the ranks compare what they are about to
//! run first (`watchdog::check`); a communicator whose check fails launches nothing. The
//! launch events of the group's calls (`ncclCollConfig_t.launchCompletionEvent`) are recorded
//! on their streams right after their communicator's launch; those of no-op calls once the
//! group's launches are out.

use super::watchdog::check;
use super::Comm;
use crate::abi::ncclResult_t;
use crate::error::{Error, Result};
use crate::sched::Task;
use std::cell::RefCell;
use std::sync::Arc;

/// A communicator creation to run, as `lifecycle` hands it over (the group machinery knows
/// nothing of how a communicator is built).
pub struct InitWork {
    /// Whether the caller waits for it (false for non-blocking communicators).
    pub blocking: bool,
    /// The rendezvous and setup; it settles the new communicator's state itself.
    pub run: Box<dyn FnOnce() -> Result<()> + Send>,
}

/// One collected operation: the communicator, the task and the user's stream.
struct Op {
    comm: Arc<Comm>,
    task: Task,
    stream: usize,
    /// The caller's event to record after the launch (0: none).
    event: usize,
}

/// What one communicator of a group launches: its tasks in order, their streams, and the
/// (stream, event) pairs to record after its launch (borrowed from the thread's `Lanes`).
struct CommView<'a> {
    comm: &'a Arc<Comm>,
    tasks: &'a [Task],
    streams: &'a [usize],
    events: &'a [(usize, usize)],
}

#[derive(Default)]
struct Pending {
    depth: usize,
    inits: Vec<InitWork>,
    ops: Vec<Op>,
    /// Communicators whose only operations in the group were no-ops, still to be checked.
    checks: Vec<Arc<Comm>>,
    /// (stream, event) of the group's no-op calls that asked for a launch event.
    noop_events: Vec<(usize, usize)>,
    /// Kept between groups for `launch_ops`.
    lanes: Vec<Lanes>,
}

/// One communicator's operations of a group laid out as `launch_all` takes them (`first`: the
/// index of its first operation, whose communicator it is); the thread keeps these between
/// groups (`Pending::lanes`), so a group reuses their vectors instead of allocating.
#[derive(Default)]
struct Lanes {
    first: usize,
    tasks: Vec<Task>,
    streams: Vec<usize>,
    events: Vec<(usize, usize)>,
}

impl Lanes {
    /// The lanes as `launch_all` takes them, `ops` being the group's operations.
    fn view<'a>(&'a self, ops: &'a [Op]) -> CommView<'a> {
        CommView {
            comm: &ops[self.first].comm,
            tasks: &self.tasks,
            streams: &self.streams,
            events: &self.events,
        }
    }
}

thread_local! {
    static GROUP: RefCell<Pending> = RefCell::new(Pending::default());
}

/// Open a (possibly nested) group on this thread.
pub fn start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// Current nesting depth on this thread (0 outside a group).
pub fn depth() -> usize {
    GROUP.with(|g| g.borrow().depth)
}

/// Close a group; the outermost end runs what was collected.
pub fn end() -> Result<()> {
    let (inits, ops, checks, noop_events) = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::invalid_usage(
                "ncclGroupEnd called without a matching ncclGroupStart",
            ));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(Default::default());
        }
        Ok((
            std::mem::take(&mut g.inits),
            std::mem::take(&mut g.ops),
            std::mem::take(&mut g.checks),
            std::mem::take(&mut g.noop_events),
        ))
    })?;
    let launched = execute(inits, ops, checks);
    let recorded = record_events(&noop_events);
    launched.and(recorded)
}

/// `ncclGroupSimulateEnd`: close the group without running it and estimate its time in µs.
pub fn simulate_end() -> Result<f32> {
    let ops = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::invalid_usage(
                "ncclGroupSimulateEnd called without a matching ncclGroupStart",
            ));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(Vec::new());
        }
        g.inits.clear();
        g.checks.clear();
        g.noop_events.clear();
        Ok(std::mem::take(&mut g.ops))
    })?;
    let tasks: Vec<(i32, Option<crate::sched::NetLink>, Task)> = ops
        .iter()
        .map(|o| {
            let net = o.comm.rt.lock().as_ref().and_then(|rt| rt.net_link());
            (o.comm.nranks(), net, o.task)
        })
        .collect();
    Ok(crate::sched::estimate_us(&tasks))
}

/// A communicator creation: now (outside a group), at the group's end, or in the background
/// for non-blocking communicators (returning `ncclInProgress`).
pub fn submit_init(job: InitWork) -> Result<()> {
    if depth() > 0 {
        GROUP.with(|g| g.borrow_mut().inits.push(job));
        return Ok(());
    }
    if job.blocking {
        (job.run)()
    } else {
        std::thread::Builder::new()
            .name("oxccl-init".into())
            .spawn(move || {
                let _ = (job.run)();
            })
            .map_err(|e| Error::system(format!("cannot start the init thread: {e}")))?;
        Err(Error::new(
            ncclResult_t::ncclInProgress,
            "initialisation continues in the background",
        ))
    }
}

/// An operation: collected inside a group, run at once outside one; `event` (0: none) is
/// recorded on `stream` after its launch.
pub fn submit_op(comm: &Arc<Comm>, task: Task, stream: usize, event: usize) -> Result<()> {
    let op = Op {
        comm: comm.clone(),
        task,
        stream,
        event,
    };
    if depth() > 0 {
        GROUP.with(|g| g.borrow_mut().ops.push(op));
        return Ok(());
    }
    execute_one(op)
}

/// A call outside a group: a group of its one operation, in the thread's list of operations
/// (empty outside a group, and handed back after the launch, so this allocates nothing).
fn execute_one(op: Op) -> Result<()> {
    let mut ops = GROUP.with(|g| std::mem::take(&mut g.borrow_mut().ops));
    ops.push(op);
    execute(Vec::new(), ops, Vec::new())
}

/// The launch event `event` (0: none) of a no-op call on `stream`: recorded now outside a
/// group, else once the group's launches are out.
pub fn launch_event(stream: usize, event: usize) -> Result<()> {
    if event == 0 {
        return Ok(());
    }
    if depth() > 0 {
        GROUP.with(|g| g.borrow_mut().noop_events.push((stream, event)));
        return Ok(());
    }
    record_events(&[(stream, event)])
}

/// Record each caller's event of `events` ((stream, event) pairs) on its stream.
fn record_events(events: &[(usize, usize)]) -> Result<()> {
    for &(stream, event) in events {
        crate::cuda::record_user_event(
            event as crate::cuda::CUevent,
            stream as crate::cuda::CUstream,
        )?;
    }
    Ok(())
}

/// A no-op (no GPU work) under the collective check: checked now outside a group, else at
/// the group's end with the rest.
pub fn check_noop(comm: &Arc<Comm>) -> Result<()> {
    if depth() > 0 {
        GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if !g.checks.iter().any(|c| Arc::ptr_eq(c, comm)) {
                g.checks.push(comm.clone());
            }
        });
        return Ok(());
    }
    check::run(std::slice::from_ref(comm)).remove(0)
}

fn execute(inits: Vec<InitWork>, mut ops: Vec<Op>, checks: Vec<Arc<Comm>>) -> Result<()> {
    let _span = crate::profile::span(crate::profile::Stage::GroupExecute);
    if !inits.is_empty() {
        let nonblocking = inits.iter().any(|j| !j.blocking);
        if nonblocking && ops.is_empty() {
            std::thread::Builder::new()
                .name("oxccl-init".into())
                .spawn(move || {
                    let _ = run_inits(inits);
                })
                .map_err(|e| Error::system(format!("cannot start the init thread: {e}")))?;
            return Err(Error::new(
                ncclResult_t::ncclInProgress,
                "initialisation continues in the background",
            ));
        }
        run_inits(inits)?;
    }
    let check_failure = check_group(&mut ops, checks);
    if !ops.is_empty() {
        launch_ops(ops)?;
    }
    check_failure.map_or(Ok(()), Err)
}

/// Launch a group's operations: laid out per communicator (in order) in the thread's lanes,
/// launched, and `ops` handed back to the thread's next group, so that a group on one
/// communicator allocates nothing (and one on several, the list of their views).
fn launch_ops(mut ops: Vec<Op>) -> Result<()> {
    // Taken out while launching: nothing under `launch_all` opens a group, but a borrow held
    // across it would turn such a change into a panic.
    let mut lanes = GROUP.with(|g| std::mem::take(&mut g.borrow_mut().lanes));
    let mut used = 0;
    for (k, op) in ops.iter().enumerate() {
        let same = |l: &Lanes| Arc::ptr_eq(&ops[l.first].comm, &op.comm);
        let i = match lanes[..used].iter().position(same) {
            Some(i) => i,
            None => {
                if used == lanes.len() {
                    lanes.push(Lanes::default());
                }
                lanes[used].first = k;
                used += 1;
                used - 1
            }
        };
        let l = &mut lanes[i];
        l.tasks.push(op.task);
        l.streams.push(op.stream);
        if op.event != 0 {
            l.events.push((op.stream, op.event));
        }
    }
    let launched = if used == 1 {
        launch_all(std::slice::from_ref(&lanes[0].view(&ops)))
    } else {
        let views: Vec<CommView<'_>> = lanes[..used].iter().map(|l| l.view(&ops)).collect();
        launch_all(&views)
    };
    for l in &mut lanes[..used] {
        l.tasks.clear();
        l.streams.clear();
        l.events.clear();
    }
    ops.clear();
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        g.lanes = lanes;
        if g.ops.capacity() == 0 {
            g.ops = ops;
        }
    });
    launched
}

/// The collective check of every communicator of the group with operations noted for it
/// (those with work, and `noop_only` ones whose calls were all no-ops): the operations of the
/// communicators that fail it are dropped from `ops`; the first failure is returned.
fn check_group(ops: &mut Vec<Op>, noop_only: Vec<Arc<Comm>>) -> Option<Error> {
    if !check::enabled() {
        return None;
    }
    let mut comms: Vec<Arc<Comm>> = Vec::new();
    for c in ops.iter().map(|o| &o.comm).chain(&noop_only) {
        if !comms.iter().any(|k| Arc::ptr_eq(k, c)) {
            comms.push(c.clone());
        }
    }
    comms.retain(|c| check::pending(c));
    if comms.is_empty() {
        return None;
    }
    let results = check::run(&comms);
    let mut first = None;
    for (comm, result) in comms.iter().zip(results) {
        if let Err(e) = result {
            ops.retain(|o| !Arc::ptr_eq(&o.comm, comm));
            first.get_or_insert(e);
        }
    }
    first
}

/// Connect and launch each communicator's operations, then record its calls' launch events.
fn launch_all(per_comm: &[CommView<'_>]) -> Result<()> {
    if per_comm.len() > 1 {
        check_rank_streams(per_comm)?;
        connect_in_parallel(per_comm)?;
    }
    for c in per_comm {
        let comm = c.comm;
        with_runtime(comm, |rt| {
            rt.connect_for(comm.rank(), comm.nranks(), c.tasks)?;
            rt.launch_group(comm.rank(), comm.nranks(), c.tasks, c.streams, &comm.abort)?;
            // Under the runtime's lock, so the watchdog sees the launch and its count together.
            comm.progress.mark_launched();
            rt.note_launched(comm.progress.launched());
            if let Some(done) = rt.completed_after_wait() {
                comm.progress.set_completed(done);
            }
            Ok(())
        })?;
        record_events(c.events)?;
    }
    Ok(())
}

/// Connection setup waits on peers: when a group spans several communicators and any needs
/// it, they set up in parallel threads (launches then go out from the calling thread).
fn connect_in_parallel(per_comm: &[CommView<'_>]) -> Result<()> {
    let needs_span = crate::profile::span(crate::profile::Stage::NeedsConnect);
    let needs = |c: &CommView<'_>| {
        c.comm
            .rt
            .lock()
            .as_ref()
            .is_some_and(|rt| rt.needs_connect(c.comm.rank(), c.comm.nranks(), c.tasks))
    };
    // Asked once more below only when some communicator needs it (a group's first call).
    let any = per_comm.iter().any(needs);
    drop(needs_span);
    if any {
        let needs_connect: Vec<bool> = per_comm.iter().map(needs).collect();
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = per_comm
                .iter()
                .zip(&needs_connect)
                .filter(|(_, &n)| n)
                .map(|(c, _)| {
                    let (comm, tasks) = (c.comm, c.tasks);
                    s.spawn(move || {
                        with_runtime(comm, |rt| rt.connect_for(comm.rank(), comm.nranks(), tasks))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::internal("group thread panicked")))
                })
                .collect()
        });
        results.into_iter().collect::<Result<()>>()?;
    }
    Ok(())
}

/// Ranks of one communicator driven from one group must not share a stream: the kernel of one
/// would queue behind the other's, which waits for it — forever (ranks sharing a GPU, or a
/// stream handed to the wrong rank). Nor may one of two ranks on one GPU use the legacy
/// default stream while the other uses a blocking stream, which waits for it implicitly.
fn check_rank_streams(per_comm: &[CommView<'_>]) -> Result<()> {
    let ids: Vec<Option<u64>> = per_comm
        .iter()
        .map(|c| c.comm.rt.lock().as_ref().map(|rt| rt.comm_hash()))
        .collect();
    for i in 0..per_comm.len() {
        for j in i + 1..per_comm.len() {
            let (a, sa) = (per_comm[i].comm, per_comm[i].streams);
            let (b, sb) = (per_comm[j].comm, per_comm[j].streams);
            if ids[i].is_none() || ids[i] != ids[j] {
                continue;
            }
            if let Some(&s) = sa.iter().find(|s| sb.contains(s)) {
                return Err(Error::invalid_usage(format!(
                    "ranks {} and {} of one communicator were given the same stream {:#x} in \
                     one group: each rank needs its own stream (their kernels would wait for \
                     each other forever)",
                    a.rank(),
                    b.rank(),
                    s
                )));
            }
            if a.cuda_dev == b.cuda_dev {
                check_legacy_stream(a, sa, b, sb)?;
                check_legacy_stream(b, sb, a, sa)?;
            }
        }
    }
    Ok(())
}

/// Error if `a` uses the legacy default stream while `b`, on the same GPU, uses a stream that
/// implicitly waits for it.
fn check_legacy_stream(a: &Comm, sa: &[usize], b: &Comm, sb: &[usize]) -> Result<()> {
    if !sa.iter().any(|&s| s == 0 || s == 1) {
        return Ok(());
    }
    for &s in sb {
        if crate::cuda::stream_syncs_with_legacy(s as crate::cuda::CUstream)? {
            return Err(Error::invalid_usage(format!(
                "rank {} uses the legacy default stream and rank {} of the same communicator, on \
                 the same GPU, the blocking stream {s:#x}, which waits for it implicitly: their \
                 kernels would wait for each other forever; create the streams with \
                 cudaStreamNonBlocking",
                a.rank(),
                b.rank()
            )));
        }
    }
    Ok(())
}

fn run_inits(mut inits: Vec<InitWork>) -> Result<()> {
    if inits.len() == 1 {
        return (inits.remove(0).run)();
    }
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = inits.into_iter().map(|j| s.spawn(j.run)).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::internal("init thread panicked")))
            })
            .collect()
    });
    results.into_iter().collect()
}

/// Run `f` on the communicator's runtime; transport failures become its async error.
fn with_runtime(
    comm: &Arc<Comm>,
    f: impl FnOnce(&mut crate::core::runtime::Runtime) -> Result<()>,
) -> Result<()> {
    comm.check_usable()?;
    let mut rt = comm.rt.lock();
    let rt = rt.as_mut().ok_or_else(|| {
        Error::invalid_usage("communicator is not initialised (still in progress or failed)")
    })?;
    f(rt).inspect_err(|e| {
        if e.code == ncclResult_t::ncclRemoteError || e.code == ncclResult_t::ncclSystemError {
            comm.set_async_error(e);
        }
    })
}
