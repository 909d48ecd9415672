//! A communicator's device-side state once initialised: its CUDA context, bootstrap,
//! topology, connections, the abort flag kernels poll, the host-mapped arena work items are
//! written to, and the ordering of its launches. `run_group` executes one group's tasks for
//! one communicator as a single kernel launch.

use super::yielding;
use crate::bootstrap::Bootstrap;
use crate::cuda::module::{Kernel, KernelArg, Kernels};
use crate::cuda::{self, CUcontext, CUstream, Event, HostMapped};
use crate::error::{Error, Result};
use crate::profile::{self, Stage};
use crate::sched::device::GpuWait;
use crate::sched::{self, relocate, Geometry, Plan, Task};
use crate::topo::{Path, Topology};
use crate::transport::net::proxy::Announced;
use crate::transport::net::CommNet;
use crate::transport::{self, sizes, ConnSpan, Connections, ErrorSink, Setup};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of work items one launch may use (at most `MAX_ITEMS` items).
pub const ARENA_SLOT_BYTES: usize = 64 * 1024;
const _: () = assert!(ARENA_SLOT_BYTES / sched::device::WORK_SIZE <= sched::device::MAX_ITEMS);
/// Launch slots in the arena (launches in flight before the host waits for the oldest).
pub const ARENA_SLOTS: usize = 64;
/// Completion events of launches that take their items by value, used round-robin.
const INLINE_EVENTS: usize = 64;
/// Launches whose completion the watchdog can still ask about (`completed_ordinal`).
const NOTED_LAUNCHES: usize = 256;

/// Host-mapped memory for work items. Eager launches use slots round-robin, a slot being reused
/// only after the launch that read it has finished; a captured launch gets its own allocation,
/// owned by the graph (a CUDA user object) and freed after the graph is destroyed.
struct WorkArena {
    mem: HostMapped,
    /// One event per slot, recorded after the launch that read the slot.
    done: Vec<Event>,
    recorded: Vec<bool>,
    next: usize,
    /// The last eager write had to wait for an earlier launch to finish.
    waited: bool,
}

impl WorkArena {
    fn new() -> Result<WorkArena> {
        Ok(WorkArena {
            mem: HostMapped::new(ARENA_SLOT_BYTES * ARENA_SLOTS)?,
            done: (0..ARENA_SLOTS)
                .map(|_| Event::new())
                .collect::<Result<_>>()?,
            recorded: vec![false; ARENA_SLOTS],
            next: 0,
            waited: false,
        })
    }

    /// Copy `items` for an eager launch into the next slot, once the launch that used it last
    /// has finished. Returns the slot and the items' device address.
    fn write_eager(&mut self, items: &[u8], abort: &AtomicBool) -> Result<(usize, u64)> {
        check_items_size(items)?;
        let slot = self.next;
        self.wait_for_room(ARENA_SLOTS, abort)?;
        self.next = (self.next + 1) % ARENA_SLOTS;
        let off = slot * ARENA_SLOT_BYTES;
        // SAFETY: off + items.len() <= the arena's size (checked above); no running kernel
        // reads the slot (its last launch finished).
        unsafe {
            std::ptr::copy_nonoverlapping(items.as_ptr(), self.mem.host().add(off), items.len())
        };
        std::sync::atomic::fence(Ordering::SeqCst);
        Ok((slot, self.mem.dev() + off as u64))
    }

    /// Wait until the next eager launch may write its slot with at most `depth` eager launches
    /// unfinished, itself included: the slot's last launch and the one `depth` launches back
    /// are done (at once when they are; `ARENA_SLOTS`: the slot's own last launch alone).
    fn wait_for_room(&mut self, depth: usize, abort: &AtomicBool) -> Result<()> {
        let slot = self.next;
        let [oldest, own] = slots_to_wait_for(slot, depth);
        // At full depth both are the slot itself: ask its event once.
        let waits = if oldest == own {
            &[own][..]
        } else {
            &[oldest, own][..]
        };
        for &s in waits {
            if self.recorded[s] && !self.done[s].done()? {
                self.waited = true;
                wait_event(
                    &self.done[s],
                    abort,
                    "a previous launch of this communicator",
                )?;
            }
        }
        Ok(())
    }

    /// Copy `items` for a launch captured on `stream` into memory the capturing graph owns
    /// (no event may be queried while a stream captures, and the graph may replay the launch at
    /// any later time); returns the device address.
    fn write_graph(&mut self, items: &[u8], stream: CUstream) -> Result<u64> {
        check_items_size(items)?;
        let _relaxed = cuda::RelaxedCapture::enter()?;
        cuda::collect_graph_garbage();
        let mem = HostMapped::new(items.len())?;
        // SAFETY: mem holds items.len() bytes; nothing reads it yet.
        unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), mem.host(), items.len()) };
        std::sync::atomic::fence(Ordering::SeqCst);
        let dev = mem.dev();
        cuda::keep_for_graph(cuda::capturing_graph(stream)?, Box::new(mem))?;
        Ok(dev)
    }
}

/// The slots whose launches must be done before an eager launch writes `slot`: the slot's
/// previous launch (it still reads the slot), and the launch `depth` launches back, which used
/// `slot - depth` since slots are used in turn (the same slot at full depth), so that at most
/// `depth` launches are unfinished at once.
fn slots_to_wait_for(slot: usize, depth: usize) -> [usize; 2] {
    let depth = depth.clamp(1, ARENA_SLOTS);
    [(slot + ARENA_SLOTS - depth) % ARENA_SLOTS, slot]
}

/// `OXCCL_ADAPTIVE_QUEUE_MS`: how much estimated work of large collectives may wait ahead of
/// the GPU behind the running one while the weights adapt.
fn queue_horizon() -> Duration {
    let ms = crate::env::registry::ADAPTIVE_QUEUE_MS
        .int()
        .clamp(0, 60_000);
    Duration::from_millis(ms as u64)
}

fn check_items_size(items: &[u8]) -> Result<()> {
    if items.len() > ARENA_SLOT_BYTES {
        return Err(Error::invalid_usage(format!(
            "a group needs {} bytes of work items, more than the {ARENA_SLOT_BYTES} one launch can take: split the group",
            items.len()
        )));
    }
    Ok(())
}

/// Wait for `ev`, polling the abort flag; warns every 30 s while waiting.
pub fn wait_event(ev: &Event, abort: &AtomicBool, what: &str) -> Result<()> {
    let start = Instant::now();
    let mut next_warn = Duration::from_secs(30);
    loop {
        if ev.done()? {
            return Ok(());
        }
        if abort.load(Ordering::Acquire) {
            return Err(Error::invalid_usage(format!(
                "communicator aborted while waiting for {what}"
            )));
        }
        if start.elapsed() > next_warn {
            crate::warn!(
                "still waiting for {what} after {} s: is a peer missing?",
                start.elapsed().as_secs()
            );
            next_warn += Duration::from_secs(30);
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Everything a live communicator owns on the device side.
pub struct Runtime {
    pub ctx: CUcontext,
    /// The kernels looked up in `ctx`.
    kernels: Kernels,
    pub bootstrap: Bootstrap,
    pub topo: Topology,
    pub nchannels: u32,
    /// Threads per CTA (`NCCL_NTHREADS`, 0 = the planner's default).
    threads: u32,
    /// Bytes per connection slot (`NCCL_BUFFSIZE` / slots per connection).
    slot_bytes: u32,
    conns: Connections,
    /// A u32 kernels poll; non-zero asks them to stop (shared with `DeviceAbort` handles).
    device_abort: Arc<HostMapped>,
    /// The connections' wait addresses (`Connections::wait_spans`), for `GpuWaits`.
    wait_spans: Arc<parking_lot::Mutex<Vec<ConnSpan>>>,
    arena: WorkArena,
    /// Recorded after each launch that took its items by value (the next one each time, so a
    /// launch's event describes it until `INLINE_EVENTS` later launches).
    inline_done: Vec<Event>,
    next_inline: usize,
    /// Eager kernel launches so far, and the ones `note_launched` has seen.
    eager_launches: u64,
    noted_launches: u64,
    /// (operation ordinal, its launch's completion event if it had one of its own), oldest first.
    noted: VecDeque<(u64, Option<Done>)>,
    /// Ordering events for groups spanning several streams.
    join: Event,
    /// Where the copy-engine copies of a plan run beside its kernel (`Plan::copies`), with
    /// the events that fork them off the user's stream and join them back.
    side: cuda::Stream,
    fork: Event,
    copied: Event,
    /// The stream of the latest eager launch and where its completion is recorded.
    last: Option<(usize, Done)>,
    /// The planner's view of the connections, rebuilt when connections are added.
    geometry: Option<Geometry>,
    /// Task shapes whose connections are known to exist: the per-call path skips
    /// `connections_needed` for them (it costs microseconds).
    connected_shapes: ConnectedShapes,
    /// Plans of recent groups, by their exact tasks (buffers and options included): a training loop or a
    /// benchmark repeats the same calls, and a plan is a pure function of the tasks and the
    /// geometry, so it is computed once. Cleared whenever the geometry changes.
    plans: PlanCache,
    comm_hash: u64,
    /// The communicator's abort flag, and where a failed network connection is reported.
    abort: Arc<AtomicBool>,
    sink: ErrorSink,
    /// The network asked for (`ncclConfig_t.netName`, else `NCCL_NET`), opened for this
    /// communicator on its first network connection.
    comm_net: CommNet,
    /// The network as the planner sees it, when some rank uses it (agreed at init).
    net: Option<sched::NetView>,
    /// The order of the ranks around the ring channels (`ring_order`), and its table in
    /// device memory when it is not rank order (`FLAG_RING_ORDER`).
    ring: sched::RingOrder,
    ring_table: Option<cuda::DeviceBuffer>,
    /// `OXCCL_YIELD*`, and `[peer]`: waits on the peer may park (`Geometry::park`).
    yielding: yielding::Settings,
    park: Vec<bool>,
    /// Where the device memory of connections is counted (the communicator's suspendable
    /// memory, `memory::Usage`).
    connection_bytes: Arc<std::sync::atomic::AtomicU64>,
    /// Adaptive channel weights (`core::adaptive`): where network sends are measured, the
    /// schedule of weights epochs, and the exchange thread; None when the weights are fixed.
    adaptive: Option<AdaptiveWeights>,
    /// The communicator's context of the tuner plugin, when one is loaded.
    tuner: Option<Arc<dyn sched::Tuner>>,
    /// The CPUs near the GPU (`topo::affinity`): connections are made there.
    cpus: Option<Vec<usize>>,
}

/// A runtime's part of the adaptive channel weights. The agent is dropped (its thread
/// stopped) with the runtime.
struct AdaptiveWeights {
    meter: Arc<crate::transport::net::meter::NetMeter>,
    schedule: super::adaptive::Schedule,
    /// `OXCCL_ADAPTIVE_QUEUE_MS`, read once.
    queue_horizon: Duration,
    _agent: super::adaptive::Agent,
}

/// What decides the connections a task needs: its kind, type, count, root (or peer) and
/// options (which bound its channels).
type Shape = (
    sched::CollKind,
    crate::abi::ncclDataType_t,
    usize,
    i32,
    sched::TaskOptions,
);

fn shapes(tasks: &[Task]) -> Vec<Shape> {
    tasks
        .iter()
        .map(|t| (t.kind, t.dtype, t.count, t.root, t.opts))
        .collect()
}

/// The task shapes whose connections exist, with the tasks of the last group found connected
/// kept aside: a loop repeating one call compares its tasks instead of collecting and hashing
/// their shapes.
#[derive(Default)]
struct ConnectedShapes {
    set: HashSet<Vec<Shape>>,
    last: Vec<Task>,
}

impl ConnectedShapes {
    fn contains(&self, tasks: &[Task]) -> bool {
        (!self.last.is_empty() && self.last.as_slice() == tasks)
            || self.set.contains(&shapes(tasks))
    }

    /// `tasks` are connected: remember their shapes (bounded: a program with endlessly
    /// varying shapes just keeps computing them) and them as the last group.
    fn remember(&mut self, tasks: &[Task]) {
        if self.set.len() < 4096 {
            self.set.insert(shapes(tasks));
        }
        self.note_last(tasks);
    }

    /// `tasks`, known connected, become the last group (compared first next time).
    fn note_last(&mut self, tasks: &[Task]) {
        if self.last.as_slice() != tasks {
            self.last.clear();
            self.last.extend_from_slice(tasks);
        }
    }

    fn clear(&mut self) {
        self.set.clear();
        self.last.clear();
    }
}

/// Most plans kept in `Runtime::plans` (the map is emptied when full).
const PLAN_CACHE_ENTRIES: usize = 256;

/// Plans by their tasks' layout (`sched::relocate`): a group whose buffers moved is served the
/// plan made for the same layout elsewhere, moved to its buffers. The last group's exact tasks
/// are kept aside: a loop repeating one call finds its plan by comparing them, and a loop on
/// moving buffers moves the last plan without hashing.
#[derive(Default)]
struct PlanCache {
    map: HashMap<Vec<Task>, Keyed>,
    last: Option<Last>,
    /// The layout of the group being looked up, in buffers kept between calls.
    layout: relocate::Layout,
}

/// A plan as made, with the segments of the buffers it was made for, and whether every address
/// in it lies in them (only then may it be moved).
#[derive(Clone)]
struct Keyed {
    plan: Arc<CachedPlan>,
    segments: Vec<relocate::Segment>,
    movable: bool,
}

/// The last group served: its exact tasks, layout key and plan (moved to its buffers).
struct Last {
    tasks: Vec<Task>,
    key: Vec<Task>,
    served: Keyed,
}

impl PlanCache {
    fn get(&mut self, tasks: &[Task], nranks: i32) -> Option<Arc<CachedPlan>> {
        if let Some(last) = &self.last {
            if last.tasks.as_slice() == tasks {
                return Some(last.served.plan.clone());
            }
        }
        self.lay_out(tasks, nranks);
        if let Some(plan) = self.move_last(tasks) {
            return Some(plan);
        }
        let (key, segments) = (&self.layout.key, &self.layout.segments);
        let found = match &self.last {
            Some(last) if last.key == *key => last.served.clone(),
            _ => self.map.get(key)?.clone(),
        };
        let served = if found.segments == *segments {
            found
        } else {
            if !found.movable {
                return None;
            }
            let mv = relocate::Move {
                from: &found.segments,
                to: &self.layout.bases,
            };
            Keyed {
                plan: Arc::new(found.plan.relocated(&mv)?),
                segments: segments.clone(),
                movable: true,
            }
        };
        let plan = served.plan.clone();
        let key = self.layout.key.clone();
        self.set_last(tasks, key, served);
        Some(plan)
    }

    /// The last plan moved in place to `tasks`' buffers (whose layout `self.layout` holds),
    /// when `tasks` have its key and no launch holds it any more (a loop on moving buffers
    /// allocates nothing here).
    fn move_last(&mut self, tasks: &[Task]) -> Option<Arc<CachedPlan>> {
        let last = self.last.as_mut()?;
        if last.key != self.layout.key || !last.served.movable {
            return None;
        }
        let mv = relocate::Move {
            from: &last.served.segments,
            to: &self.layout.bases,
        };
        let plan = Arc::get_mut(&mut last.served.plan)?;
        if !plan.relocate(&mv) {
            return None;
        }
        last.served.segments.clear();
        last.served
            .segments
            .extend_from_slice(&self.layout.segments);
        last.tasks.clear();
        last.tasks.extend_from_slice(tasks);
        Some(last.served.plan.clone())
    }

    fn insert(&mut self, tasks: &[Task], nranks: i32, plan: Arc<CachedPlan>) {
        if self.map.len() >= PLAN_CACHE_ENTRIES {
            self.map.clear();
        }
        self.lay_out(tasks, nranks);
        let l = &self.layout;
        let movable = !l.segments.is_empty()
            && relocate::relocate(
                &plan.plan,
                &relocate::Move {
                    from: &l.segments,
                    to: &l.bases,
                },
            )
            .is_some();
        let keyed = Keyed {
            plan,
            segments: l.segments.clone(),
            movable,
        };
        let key = l.key.clone();
        self.map.insert(key.clone(), keyed.clone());
        self.set_last(tasks, key, keyed);
    }

    /// `tasks`' layout into `self.layout`: their key and segments, or, when the layout cannot
    /// be encoded, the exact tasks as the key and no segments (never moved).
    fn lay_out(&mut self, tasks: &[Task], nranks: i32) {
        if !relocate::layout_into(tasks, nranks, &mut self.layout) {
            let l = &mut self.layout;
            l.key.clear();
            l.segments.clear();
            l.bases.clear();
            l.key.extend_from_slice(tasks);
        }
    }

    /// `tasks` and `served` become the last ones, in the vectors already kept (calls that
    /// alternate between two shapes allocate nothing here).
    fn set_last(&mut self, tasks: &[Task], key: Vec<Task>, served: Keyed) {
        match &mut self.last {
            Some(last) => {
                last.tasks.clear();
                last.tasks.extend_from_slice(tasks);
                last.key = key;
                last.served = served;
            }
            None => {
                self.last = Some(Last {
                    tasks: tasks.to_vec(),
                    key,
                    served,
                })
            }
        }
    }

    fn clear(&mut self) {
        self.map.clear();
        self.last = None;
    }
}

/// A plan with the bytes its launch passes: the inline kernel's parameter when the items fit
/// it, else what `ox_kernel` reads from the arena (see `arena_bytes`).
struct CachedPlan {
    plan: Plan,
    inline: Option<Vec<u8>>,
    arena: Vec<u8>,
    /// What each launch tells the network proxy: the steps its kernels consume on each
    /// network receiving side.
    announce: Vec<(Announced, u64)>,
}

impl CachedPlan {
    fn new(plan: Plan, conns: &Connections) -> CachedPlan {
        let announce = announcements(&plan, conns);
        let inline = (plan.nitems as usize <= sched::device::INLINE_ITEMS && !plan.yields)
            .then(|| sched::device::inline_param(plan.nitems, &plan.items));
        let arena = if inline.is_some() {
            Vec::new()
        } else if plan.yields {
            sched::device::yield_input(&plan.items, plan.grid)
        } else {
            arena_bytes(&plan)
        };
        CachedPlan {
            plan,
            inline,
            arena,
            announce,
        }
    }

    /// This plan with its buffer addresses moved (`sched::relocate`); None when some address
    /// lies outside the segments.
    fn relocated(&self, mv: &relocate::Move) -> Option<CachedPlan> {
        let mut out = CachedPlan {
            plan: self.plan.clone(),
            inline: self.inline.clone(),
            arena: self.arena.clone(),
            announce: self.announce.clone(),
        };
        out.relocate(mv).then_some(out)
    }

    /// Move the buffer addresses in the plan and in the launch input made from it (both begin
    /// with the same items); false, with nothing changed, when some address lies outside the
    /// segments.
    fn relocate(&mut self, mv: &relocate::Move) -> bool {
        if !relocate::move_plan(&mut self.plan, mv) {
            return false;
        }
        let n = self.plan.nitems as usize;
        if let Some(blob) = &mut self.inline {
            let at = std::mem::offset_of!(sched::device::OxInline, items);
            let moved = relocate::move_items(blob, at, n, mv);
            debug_assert!(moved, "the launch input holds the plan's items");
        }
        if !self.arena.is_empty() {
            let moved = relocate::move_items(&mut self.arena, 0, n, mv);
            debug_assert!(moved, "the launch input holds the plan's items");
        }
        true
    }

    /// Tell the network proxy the steps a launch of this plan on `stream` will consume: now,
    /// or under capture at every launch of the graph (a host node beside the kernel's).
    fn announce(&self, stream: CUstream, capturing: bool) -> Result<()> {
        if self.announce.is_empty() {
            return Ok(());
        }
        if !capturing {
            announce(&self.announce);
            return Ok(());
        }
        let list = self.announce.clone();
        cuda::capture_host_call_beside(stream, Box::new(move || announce(&list)))
    }
}

/// Launch `plan` as the inline kernel `kernel`, its items in the parameter `blob`.
fn launch_inline(kernel: Kernel, plan: &Plan, blob: &[u8], stream: CUstream) -> Result<()> {
    let _span = profile::span(Stage::KernelLaunch);
    cuda::module::launch_blob(
        kernel,
        plan.grid,
        plan.block,
        plan.smem,
        stream,
        blob,
        8 + plan.items.len(),
    )
}

/// The steps `plan`'s kernels consume on each network receiving side among `conns`
/// (`sched::steps`).
fn announcements(plan: &Plan, conns: &Connections) -> Vec<(Announced, u64)> {
    let items = sched::device::deserialize_all(&plan.items);
    sched::steps::recv_steps_per_connection(&items)
        .into_iter()
        .filter_map(|(conn, steps)| {
            let side = conns.recv.values().find(|s| s.conn.tail == conn.tail)?;
            Some((side.announced.clone()?, steps))
        })
        .collect()
}

fn announce(list: &[(Announced, u64)]) {
    for (side, steps) in list {
        side.add(*steps);
    }
}

/// `ox_kernel`'s input for `plan` (`sched::device::with_cta_table`).
fn arena_bytes(plan: &Plan) -> Vec<u8> {
    sched::device::with_cta_table(&plan.items, plan.grid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::device::{OxWork, WorkKind};

    #[test]
    fn a_limited_arena_waits_for_the_launch_depth_launches_back() {
        // Full depth: only the slot's own previous launch.
        assert_eq!(slots_to_wait_for(5, ARENA_SLOTS), [5, 5]);
        // Depth 4: launch n waits for launch n - 4, which used the slot 4 back (wrapping).
        assert_eq!(slots_to_wait_for(5, 4), [1, 5]);
        assert_eq!(slots_to_wait_for(2, 4), [ARENA_SLOTS - 2, 2]);
        // Depth 1: every launch waits for the one before it.
        assert_eq!(slots_to_wait_for(0, 1), [ARENA_SLOTS - 1, 0]);
        // Out of range: clamped to 1..=ARENA_SLOTS.
        assert_eq!(slots_to_wait_for(7, 0), slots_to_wait_for(7, 1));
        assert_eq!(slots_to_wait_for(7, 1000), [7, 7]);
        // Over a whole turn of launches, at most `depth` are ever unfinished: launch n may
        // start once launch n - depth is done.
        for depth in [1, 4, 17, ARENA_SLOTS] {
            for n in 0..3 * ARENA_SLOTS {
                let [oldest, own] = slots_to_wait_for(n % ARENA_SLOTS, depth);
                if n >= depth {
                    assert_eq!(oldest, (n - depth) % ARENA_SLOTS);
                }
                assert_eq!(own, n % ARENA_SLOTS);
            }
        }
    }

    /// A one-item all-reduce plan on `send` -> `recv` as the planner would make it, cached.
    fn cached_copy_plan(send: u64, recv: u64) -> Arc<CachedPlan> {
        let mut w = OxWork::new(WorkKind::Copy);
        w.src = send;
        w.dst = recv;
        w.count = 64;
        let plan = Plan::of_items(&[w], 1, 64);
        Arc::new(CachedPlan::new(plan, &Connections::default()))
    }

    fn all_reduce(send: u64, recv: u64) -> Task {
        Task {
            kind: sched::CollKind::AllReduce,
            dtype: crate::abi::ncclDataType_t::ncclFloat32,
            op: sched::redop::RedOp::Sum,
            count: 64,
            sendbuff: send,
            recvbuff: recv,
            root: 0,
            opts: Default::default(),
            weights_epoch: 0,
        }
    }

    /// The addresses of a cached plan's one item, in the plan and in its inline launch input.
    fn served_addresses(p: &CachedPlan) -> [(u64, u64); 2] {
        let item = sched::device::deserialize_all(&p.plan.items)[0];
        let at = std::mem::offset_of!(sched::device::OxInline, items);
        let blob = p.inline.as_ref().expect("one item goes inline");
        let inline = OxWork::deserialize(&blob[at..]);
        [(item.src, item.dst), (inline.src, inline.dst)]
    }

    #[test]
    fn the_plan_cache_moves_plans_to_new_buffers() {
        let mut cache = PlanCache::default();
        let first = [all_reduce(0x10000, 0x20000)];
        assert!(cache.get(&first, 1).is_none());
        cache.insert(&first, 1, cached_copy_plan(0x10000, 0x20000));
        // Moved buffers (each its own way): the plan moved; again: served as it is; moved
        // again: moved in place; back to the first buffers: the first plan.
        for (send, recv) in [
            (0x50000, 0x30000),
            (0x50000, 0x30000),
            (0x90100, 0x70000),
            (0x10000, 0x20000),
        ] {
            let got = cache.get(&[all_reduce(send, recv)], 1).expect("served");
            assert_eq!(served_addresses(&got), [(send, recv); 2]);
        }
        // In place is another layout: not served from the out-of-place plan.
        assert!(cache.get(&[all_reduce(0x40000, 0x40000)], 1).is_none());
    }

    #[test]
    fn a_plan_with_an_address_from_no_buffer_is_not_moved() {
        let mut cache = PlanCache::default();
        let first = [all_reduce(0x10000, 0x20000)];
        cache.insert(&first, 1, cached_copy_plan(0x10000, 0xDEAD_0000));
        assert!(cache.get(&first, 1).is_some());
        assert!(cache.get(&[all_reduce(0x50000, 0x30000)], 1).is_none());
    }

    #[test]
    fn arena_bytes_index_every_cta() {
        let works: Vec<OxWork> = [0u32, 0, 1, 3, 3, 3]
            .into_iter()
            .map(|cta| {
                let mut w = OxWork::new(WorkKind::Copy);
                w.cta = cta;
                w
            })
            .collect();
        let plan = Plan::of_items(&works, 4, 512);
        let items = plan.items.clone();
        let bytes = arena_bytes(&plan);
        assert_eq!(&bytes[..items.len()], &items[..]);
        let first: Vec<u32> = bytes[items.len()..]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        // CTA 2 has no items (an empty range); the last entry is nitems.
        assert_eq!(first, vec![0, 2, 3, 3, 6]);
    }

    fn peer(rank: i32, host: &str) -> crate::topo::PeerInfo {
        crate::topo::PeerInfo {
            rank,
            host_hash: crate::topo::fnv1a(host.as_bytes()),
            pid: 100 + rank as u32,
            cuda_dev: 0,
            bus_id: "0000:19:00.0".into(),
            nvlinks: 0,
            host: host.into(),
            gpu_uuid: [0; 16],
        }
    }

    /// The topology rank `me` builds from the allgathered `peers`.
    fn topology(peers: &[crate::topo::PeerInfo], me: i32) -> Topology {
        let policy = crate::topo::Policy {
            multi_rank_gpu: true,
            allowed: crate::topo::Allowed {
                p2p: true,
                p2p_level: None,
                shm: true,
            },
        };
        Topology::with_policy(peers.to_vec(), me, |_| Some(0), |_, _| true, policy).unwrap()
    }

    #[test]
    fn every_rank_computes_the_same_ring_order() {
        // NCCL_HOSTID per process, rank r on host r % 2: every rank groups the hosts alike.
        let hosts = ["oxccl-bench-host-0", "oxccl-bench-host-1"];
        let peers: Vec<_> = (0..6).map(|r| peer(r, hosts[r as usize % 2])).collect();
        for me in 0..6 {
            let order = ring_order(&topology(&peers, me));
            assert_eq!(order.ranks(), &[0, 2, 4, 1, 3, 5], "rank {me}");
        }
        // Hosts of contiguous ranks, or one host: rank order.
        let peers: Vec<_> = (0..6).map(|r| peer(r, hosts[r as usize / 3])).collect();
        for me in 0..6 {
            assert!(ring_order(&topology(&peers, me)).is_identity());
        }
        let peers: Vec<_> = (0..3).map(|r| peer(r, "gpu07")).collect();
        assert!(ring_order(&topology(&peers, 1)).is_identity());
    }

    #[test]
    fn ring_lines_in_nvidias_format() {
        let order = sched::RingOrder::by_host(&[0, 1, 0, 1]);
        assert_eq!(
            ring_lines(&order, 2),
            vec![
                "Channel 00/02 :   0   2   1   3".to_string(),
                "Channel 01/02 :   0   2   1   3".to_string(),
            ]
        );
        // A ring not starting at rank 0 is printed from rank 0; long rings are cut as
        // NVIDIA's 128-byte line cuts them.
        let order = sched::RingOrder::new(vec![2, 0, 1]).unwrap();
        assert_eq!(ring_lines(&order, 1), vec!["Channel 00/01 :   0   1   2"]);
        let hosts: Vec<u64> = (0..64).map(|r| r % 2).collect();
        let lines = ring_lines(&sched::RingOrder::by_host(&hosts), 64);
        assert_eq!(lines.len(), 64);
        assert_eq!(lines[63].len(), 127);
        assert!(lines[63].starts_with("Channel 63/64 :   0   2   4"));
    }

    #[test]
    fn wait_entries_read_from_a_page() {
        use crate::sched::device::{
            PROGRESS_OFFSET, WAIT_ENTRY_BYTES, WAIT_RECV_SLOT, WAIT_WHAT_SHIFT,
        };
        let mut page = vec![0u64; STATUS_PAGE_BYTES / 8];
        page[0] = 1; // the abort flag is not a wait word
        let word = ((WAIT_RECV_SLOT as u64) << WAIT_WHAT_SHIFT) | 17;
        let entry = |cta: usize| (PROGRESS_OFFSET + WAIT_ENTRY_BYTES * cta as u32) as usize / 8;
        page[entry(3)] = word;
        page[entry(3) + 1] = 0x7000;
        page[entry(63)] = 5;
        page[entry(10) + 1] = 0x8000; // an address without a word: nothing to say
                                      // SAFETY: the vector holds STATUS_PAGE_BYTES bytes, u64-aligned.
        let entries = unsafe { read_wait_entries(page.as_ptr() as *const u8) };
        assert_eq!(entries, vec![(3, word, 0x7000), (63, 5, 0)]);
        page.fill(0);
        // SAFETY: as above.
        assert!(unsafe { read_wait_entries(page.as_ptr() as *const u8) }.is_empty());
    }
}

/// Stops a communicator's kernels: the abort flag they poll, shared with its runtime.
#[derive(Clone)]
pub struct DeviceAbort(Arc<HostMapped>);

impl DeviceAbort {
    /// Ask running kernels to stop, and let a yielding launch's stream past its waits for the
    /// bell (its later kernels then see the flag and end at once).
    pub fn signal(&self) {
        // SAFETY: the flag is a live (kept by this handle), aligned u32 in pinned host memory
        // (the status page).
        unsafe { std::ptr::write_volatile(self.0.host() as *mut u32, 1) };
        ring_bell(&self.0);
    }
}

/// Ring the bell of the status page `page` (a yielding launch's stream waits for it).
fn ring_bell(page: &HostMapped) {
    // SAFETY: the bell is an aligned u32 within the live page, which the GPU reads
    // concurrently, hence volatile.
    unsafe {
        std::ptr::write_volatile(
            page.host().add(sched::device::BELL_OFFSET as usize) as *mut u32,
            1,
        )
    };
}

/// What this communicator's kernels wait for, read without the runtime's lock (the
/// watchdog's): the status page's wait entries (`sched::device::PROGRESS_OFFSET`) and the
/// connections' addresses that name their peers.
#[derive(Clone)]
pub struct GpuWaits {
    page: Arc<HostMapped>,
    spans: Arc<parking_lot::Mutex<Vec<ConnSpan>>>,
}

impl GpuWaits {
    /// Every CTA's current wait, by CTA, with the peer rank its address belongs to.
    pub fn read(&self) -> Vec<GpuWait> {
        debug_assert!(self.page.len() >= STATUS_PAGE_BYTES);
        // SAFETY: the page is live (kept by this handle), STATUS_PAGE_BYTES long (Runtime::new)
        // and page-aligned (cuMemHostAlloc).
        let entries = unsafe { read_wait_entries(self.page.host()) };
        let spans = self.spans.lock();
        entries
            .into_iter()
            .filter_map(|(cta, word, at)| {
                Some(GpuWait {
                    cta,
                    wait: sched::device::decode_wait(word)?,
                    peer: transport::span_at(&spans, at).map(|s| s.peer),
                })
            })
            .collect()
    }
}

/// Bytes of the communicator's status page (`sched::device::STATUS_PAGE_BYTES`): abort flag,
/// bell, wait entries and park entries.
const STATUS_PAGE_BYTES: usize = sched::device::STATUS_PAGE_BYTES as usize;

/// A new status page: zeroed (no abort, no wait, no park), its bell rung. A bell of 0 means
/// a yielding launch's CTA parked, and only then does the network proxy watch the park
/// entries; a communicator that never yields never shows it one.
fn status_page() -> Result<HostMapped> {
    let page = HostMapped::new(STATUS_PAGE_BYTES)?;
    ring_bell(&page);
    Ok(page)
}

/// The wait entries of the status page at `page` whose word is not 0, (CTA, word, address)
/// by CTA, each field read once with a volatile load (kernels store them at any time).
///
/// # Safety
/// `page` must point at `STATUS_PAGE_BYTES` readable bytes, 8-byte aligned.
unsafe fn read_wait_entries(page: *const u8) -> Vec<(u32, u64, u64)> {
    use sched::device::{PROGRESS_CTAS, PROGRESS_OFFSET, WAIT_ENTRY_BYTES};
    (0..PROGRESS_CTAS)
        .filter_map(|cta| {
            let at = (PROGRESS_OFFSET + WAIT_ENTRY_BYTES * cta) as usize;
            // SAFETY: at + 16 <= STATUS_PAGE_BYTES and 8-aligned (PROGRESS_OFFSET and
            // WAIT_ENTRY_BYTES are), within the caller's page.
            let word = unsafe { std::ptr::read_volatile(page.add(at) as *const u64) };
            // SAFETY: as above, the entry's second u64.
            let addr = unsafe { std::ptr::read_volatile(page.add(at + 8) as *const u64) };
            (word != 0).then_some((cta, word, addr))
        })
        .collect()
}

/// Which event marks a launch's completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Done {
    Slot(usize),
    Inline(usize),
}

// SAFETY: the CUDA handles inside are usable from any thread; the Runtime is always accessed
// under its communicator's mutex.
unsafe impl Send for Runtime {}

impl Runtime {
    pub fn new(
        ctx: CUcontext,
        bootstrap: Bootstrap,
        topo: Topology,
        nchannels: u32,
        comm_hash: u64,
        abort: Arc<AtomicBool>,
        sink: ErrorSink,
    ) -> Result<Runtime> {
        let ring = ring_order(&topo);
        let ring_table = if ring.is_identity() {
            None
        } else {
            let bytes = sched::device::ring_table_bytes(ring.ranks());
            let table = cuda::DeviceBuffer::zeroed(bytes.len())?;
            cuda::copy_to_device(table.ptr(), &bytes)?;
            if topo.my_rank == 0 {
                for line in ring_lines(&ring, nchannels) {
                    crate::info!(INIT, "{line}");
                }
            }
            Some(table)
        };
        Ok(Runtime {
            ctx,
            kernels: Kernels::new(ctx),
            bootstrap,
            topo,
            nchannels,
            threads: threads_setting(),
            slot_bytes: sizes::configured_slot_bytes(),
            conns: Connections::default(),
            device_abort: Arc::new(status_page()?),
            wait_spans: Arc::default(),
            arena: WorkArena::new()?,
            inline_done: (0..INLINE_EVENTS)
                .map(|_| Event::new())
                .collect::<Result<_>>()?,
            next_inline: 0,
            eager_launches: 0,
            noted_launches: 0,
            noted: VecDeque::new(),
            join: Event::new()?,
            side: cuda::Stream::new()?,
            fork: Event::new()?,
            copied: Event::new()?,
            last: None,
            geometry: None,
            connected_shapes: ConnectedShapes::default(),
            plans: PlanCache::default(),
            comm_hash,
            abort,
            sink,
            comm_net: CommNet::new(None, comm_hash, crate::abi::NCCL_CONFIG_UNDEF_INT),
            net: None,
            ring,
            ring_table,
            yielding: yielding::Settings::from_env(),
            park: Vec::new(),
            connection_bytes: Arc::default(),
            adaptive: None,
            tuner: None,
            cpus: None,
        })
    }

    /// Make connections on `cpus` (their threads start there, their host buffers are first
    /// touched there).
    pub fn set_cpus(&mut self, cpus: Option<Vec<usize>>) {
        self.cpus = cpus;
    }

    /// Ask `tuner` about this communicator's ring collectives from now on.
    pub fn set_tuner(&mut self, tuner: Arc<dyn sched::Tuner>) {
        self.tuner = Some(tuner);
        self.geometry = None;
        self.plans = PlanCache::default();
    }

    /// Start the adaptive channel weights (every rank agreed on them at init:
    /// `Routes::is_adaptive`): measure network sends from now on and run the exchange that
    /// gives `schedule`'s collectives their epochs. `names`: the network devices', for the
    /// INFO lines; `comm_abort` ends the exchange.
    pub fn start_adaptive_weights(
        &mut self,
        schedule: super::adaptive::Schedule,
        names: Vec<String>,
        comm_abort: Arc<AtomicBool>,
    ) -> Result<()> {
        let Some(net) = self.net.as_ref().filter(|n| n.routes.is_adaptive()) else {
            return Ok(());
        };
        let nominal = net.routes.speeds().to_vec();
        let meter = crate::transport::net::meter::NetMeter::new(nominal.len());
        let period_ms = crate::env::registry::ADAPTIVE_PERIOD_MS
            .int()
            .clamp(10, 60_000);
        let period = super::adaptive::round_period(
            Duration::from_millis(period_ms as u64),
            self.topo.peers.len(),
        );
        let setup = super::adaptive::AgentSetup {
            rank: self.topo.my_rank,
            nominal,
            names,
            period,
            comm_abort,
        };
        let agent =
            super::adaptive::Agent::start(setup, &self.bootstrap, meter.clone(), schedule.clone())?;
        let horizon = queue_horizon();
        crate::info!(
            INIT | NET,
            "rank {}: channel weights adapt to measured throughput, agreed every {} ms, \
             at most {} ms of large collectives waiting ahead of the GPU \
             (OXCCL_ADAPTIVE_WEIGHTS=0: fixed)",
            self.topo.my_rank,
            period.as_millis(),
            horizon.as_millis()
        );
        self.adaptive = Some(AdaptiveWeights {
            meter,
            schedule,
            queue_horizon: horizon,
            _agent: agent,
        });
        Ok(())
    }

    /// Make the speeds of every weights epoch `tasks` plan with known to the planner's view
    /// (the geometry is rebuilt when one was new).
    fn learn_epochs(&mut self, tasks: &[Task]) {
        let (Some(a), Some(net)) = (self.adaptive.as_ref(), self.net.as_mut()) else {
            return;
        };
        for t in tasks {
            if net.routes.knows_epoch(t.weights_epoch) {
                continue;
            }
            if let Some(speeds) = a.schedule.speeds_of(t.weights_epoch) {
                crate::trace!(
                    NET,
                    "rank {}: planning with the channel weights of epoch {}: {:?} Mbit/s",
                    self.topo.my_rank,
                    t.weights_epoch,
                    speeds
                );
                net.routes.add_epoch(t.weights_epoch, speeds);
                self.geometry = None;
            }
        }
    }

    /// Count the device memory of connections made from now on into `counter`.
    pub fn count_connections_into(&mut self, counter: Arc<std::sync::atomic::AtomicU64>) {
        self.connection_bytes = counter;
    }

    /// Identifies the communicator: the same on all of its ranks (derived from its unique id,
    /// or from its parent's and the split's sequence number).
    pub fn comm_hash(&self) -> u64 {
        self.comm_hash
    }

    /// Plan for the network link `link` (agreed by every rank at init, before any planning;
    /// None: the communicator does not use the network), reaching over it the peers whose path
    /// is the network.
    /// `routes`: every channel's network device and share of the bytes (`sched::weights`).
    pub fn set_net_link(&mut self, link: Option<sched::NetLink>, routes: sched::Routes) {
        self.net = link.map(|link| sched::NetView {
            link,
            remote: self.topo.paths.iter().map(|&p| p == Path::Net).collect(),
            routes,
        });
        self.park = self.parking_peers();
        self.geometry = None;
        self.plans.clear();
        self.connected_shapes.clear();
    }

    /// `[peer]`: the peer is another process on this GPU that this rank reaches over the
    /// network (its proxy rings the bell), so waits on it may park (`core::yielding`); empty
    /// when there is none or `OXCCL_YIELD=0`.
    fn parking_peers(&self) -> Vec<bool> {
        let Some(net) = self.net.as_ref().filter(|_| self.yielding.enabled) else {
            return Vec::new();
        };
        let park: Vec<bool> = self
            .topo
            .time_sliced_peers()
            .iter()
            .zip(&net.remote)
            .map(|(&sliced, &remote)| sliced && remote)
            .collect();
        // Only when every other rank is such a peer: a communicator that also has peers on
        // this host spins as before (6 processes on 3 hosts of one GPU, host-grouped rings,
        // hung once with parking; not understood yet).
        let me = self.topo.my_rank as usize;
        if !park.iter().enumerate().all(|(r, &p)| p || r == me) || park.len() < 2 {
            return Vec::new();
        }
        let ranks: Vec<String> = (0..park.len())
            .filter(|&r| park[r])
            .map(|r| r.to_string())
            .collect();
        crate::info!(
            INIT,
            "commHash {:#x} rank {}: ranks {} are other processes on this GPU, reached over the \
             network: kernels waiting for them yield the GPU after {} us (OXCCL_YIELD=0: spin)",
            self.comm_hash,
            self.topo.my_rank,
            ranks.join(","),
            self.yielding.park_ns / 1000
        );
        park
    }

    /// The network link this communicator plans with, when it uses the network.
    pub fn net_link(&self) -> Option<sched::NetLink> {
        self.net.as_ref().map(|n| n.link)
    }

    /// Use the network named `name` for this communicator's network connections, opened
    /// for it with its `ncclConfig_t.trafficClass` (before any connection is made).
    pub fn set_network(&mut self, name: Option<String>, traffic_class: i32) {
        self.comm_net = CommNet::new(name, self.comm_hash, traffic_class);
    }

    /// Ask running kernels to stop (they poll this flag).
    pub fn signal_device_abort(&self) {
        self.device_abort_handle().signal();
    }

    /// A handle that stops this communicator's kernels without the runtime's lock (which a
    /// launch waiting for a stuck kernel may hold): the watchdog's.
    pub fn device_abort_handle(&self) -> DeviceAbort {
        DeviceAbort(self.device_abort.clone())
    }

    /// A handle that reads what this communicator's kernels wait for without the runtime's
    /// lock: the watchdog's.
    pub fn gpu_waits_handle(&self) -> GpuWaits {
        GpuWaits {
            page: self.device_abort.clone(),
            spans: self.wait_spans.clone(),
        }
    }

    /// Clear the device abort flag (after a revoke has drained the kernels).
    pub fn clear_device_abort(&self) {
        // SAFETY: as in DeviceAbort::signal (the runtime keeps the flag alive).
        unsafe { std::ptr::write_volatile(self.device_abort.host() as *mut u32, 0) };
    }

    fn last_event(&self) -> Option<&Event> {
        self.last.map(|(_, done)| match done {
            Done::Slot(slot) => &self.arena.done[slot],
            Done::Inline(i) => &self.inline_done[i],
        })
    }

    /// The operations up to `ordinal` were handed over by the launch just made (or needed no
    /// GPU work): remember which event tells when they are done.
    pub fn note_launched(&mut self, ordinal: u64) {
        let own = (self.eager_launches != self.noted_launches).then(|| self.last.map(|l| l.1));
        self.noted_launches = self.eager_launches;
        if self.noted.len() == NOTED_LAUNCHES {
            self.noted.pop_front();
        }
        self.noted.push_back((ordinal, own.flatten()));
    }

    /// After a launch that had to wait for an earlier one to free its work slot: the ordinal
    /// of the last operation known finished (`completed_ordinal`). A thread that launches
    /// back to back holds the runtime's lock nearly all the time, so the watchdog, which only
    /// tries the lock, would see no progress: the launcher reads it instead, only when it
    /// waited (a launch that did not wait costs nothing more).
    pub fn completed_after_wait(&mut self) -> Option<u64> {
        if !std::mem::take(&mut self.arena.waited) {
            return None;
        }
        self.completed_ordinal().ok().flatten()
    }

    /// The ordinal of the last operation known finished, from the launches noted: launches run
    /// in order, so the oldest unfinished one ends the scan. An event reused by a later launch
    /// describes that later one, whose end implies this one's: never a false "done".
    pub fn completed_ordinal(&mut self) -> Result<Option<u64>> {
        let mut completed = None;
        while let Some(&(ordinal, done)) = self.noted.front() {
            let finished = match done {
                Some(Done::Slot(slot)) => self.arena.done[slot].done()?,
                Some(Done::Inline(i)) => self.inline_done[i].done()?,
                None => true,
            };
            if !finished {
                break;
            }
            completed = Some(ordinal);
            self.noted.pop_front();
        }
        Ok(completed)
    }

    /// With adaptive weights: wait until a launch on `stream` may be written with at most
    /// `OXCCL_ADAPTIVE_QUEUE_MS` of large collectives waiting ahead of it, a collective that sends
    /// `wire_bytes` over the network taken as the estimate for each (`adaptive::queue_depth`
    /// at the speeds in use), so that it is given its weights epoch only then and takes the
    /// newest weights agreed meanwhile. Nothing to do without adaptive weights, or while
    /// `stream` captures (a captured launch uses no slot, and no event may be queried then).
    /// The limit is this wait's alone: other launches (smaller collectives, send/receive)
    /// wait for nothing but their own slot.
    pub fn wait_for_launch_room(
        &mut self,
        stream: usize,
        wire_bytes: u64,
        abort: &AtomicBool,
    ) -> Result<()> {
        let (Some(adaptive), Some(net)) = (self.adaptive.as_ref(), self.net.as_ref()) else {
            return Ok(());
        };
        let total_mbps = adaptive
            .schedule
            .latest_total_mbps()
            .unwrap_or_else(|| net.routes.speeds().iter().map(|&s| u64::from(s)).sum());
        let depth = sched::adaptive::queue_depth(
            wire_bytes,
            total_mbps,
            adaptive.queue_horizon,
            ARENA_SLOTS,
        );
        if depth >= ARENA_SLOTS {
            return Ok(());
        }
        cuda::set_current(self.ctx)?;
        if cuda::stream_is_capturing(stream as CUstream)? {
            return Ok(());
        }
        self.arena.wait_for_room(depth, abort)
    }

    /// Wait until the latest launch finished (polling `abort`).
    pub fn quiesce(&self, abort: &AtomicBool) -> Result<()> {
        match self.last_event() {
            Some(ev) => wait_event(ev, abort, "this communicator's last operation"),
            None => Ok(()),
        }
    }

    /// Let the network proxy send what the finished kernels left for it (at most `limit`);
    /// warns if it could not.
    pub fn drain_network(&self, limit: Duration) {
        if let Err(why) = self.conns.drain_network(limit) {
            crate::warn!(
                "the communicator's teardown could not send all data for the network: {why}"
            );
        }
    }

    /// Wait at most `limit` for the latest launch (used by abort, after signalling kernels).
    pub fn drain(&self, limit: Duration) -> bool {
        let Some(ev) = self.last_event() else {
            return true;
        };
        let start = Instant::now();
        while start.elapsed() < limit {
            if ev.done().unwrap_or(true) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    /// Whether `tasks` need connections this communicator does not have yet (setting them up
    /// waits on peers, so groups over several communicators do it in parallel threads).
    pub fn needs_connect(&self, rank: i32, nranks: i32, tasks: &[Task]) -> bool {
        if nranks == 1 || self.connected_shapes.contains(tasks) {
            return false;
        }
        self.connections_needed(rank, nranks, tasks)
            .iter()
            .any(|&(ch, peer, dir)| !self.conns.has(ch, peer, dir))
    }

    /// `sched::connections_needed` with this communicator's channels, network and ring.
    fn connections_needed(
        &self,
        rank: i32,
        nranks: i32,
        tasks: &[Task],
    ) -> Vec<(u32, i32, sched::Dir)> {
        sched::connections_needed(
            rank,
            nranks,
            self.nchannels,
            self.net.as_ref(),
            &self.ring,
            self.tuner.as_deref(),
            tasks,
        )
    }

    /// Set up the connections `tasks` need (a no-op once they exist).
    pub fn connect_for(&mut self, rank: i32, nranks: i32, tasks: &[Task]) -> Result<()> {
        if nranks == 1 {
            return Ok(());
        }
        if self.connected_shapes.contains(tasks) {
            self.connected_shapes.note_last(tasks);
            return Ok(());
        }
        // The first operation of a shape may come while the user's stream captures a graph:
        // allocating the connections is then allowed, as NVIDIA's library allows its own.
        let _relaxed = cuda::RelaxedCapture::enter()?;
        let needed = self.connections_needed(rank, nranks, tasks);
        self.connect_rows(needed)?;
        self.connected_shapes.remember(tasks);
        Ok(())
    }

    /// Connect every ring channel to this rank's ring neighbours now, as NVIDIA's library
    /// connects its rings at init with `NCCL_RUNTIME_CONNECT=0` (every rank calls this at
    /// the same point of its init).
    pub fn connect_rings(&mut self, rank: i32, nranks: i32) -> Result<()> {
        if nranks == 1 {
            return Ok(());
        }
        let (next, prev) = (self.ring.next_of(rank), self.ring.prev_of(rank));
        let rows = (0..self.nchannels)
            .flat_map(|ch| [(ch, next, sched::Dir::Send), (ch, prev, sched::Dir::Recv)])
            .collect();
        self.connect_rows(rows)
    }

    /// Set up the connections `needed` that do not exist yet, with every peer doing the same:
    /// in this communicator's context, on its CPUs, their memory counted as its connections'.
    fn connect_rows(&mut self, needed: Vec<(u32, i32, sched::Dir)>) -> Result<()> {
        cuda::set_current(self.ctx)?;
        let _counted = cuda::account_into(&self.connection_bytes);
        let _pinned = crate::topo::affinity::Pinned::enter(self.cpus.as_deref());
        // The one-shot all-reduce's rows get small LL-only buffers; every other row the
        // configured ones. Both ends split alike (the row decides).
        let (direct, regular): (Vec<_>, Vec<_>) = needed
            .into_iter()
            .partition(|&(row, _, _)| sched::plan::is_direct_row(self.nchannels, row));
        let before = self.conns.send.len() + self.conns.recv.len();
        for (rows, is_direct) in [(regular, false), (direct, true)] {
            let (slot_bytes, nslots) = sizes::row_buffers(is_direct, self.slot_bytes);
            if rows.is_empty() {
                continue;
            }
            let setup = Setup {
                bootstrap: &self.bootstrap,
                topo: &self.topo,
                slot_bytes,
                nslots,
                nchannels: self.nchannels,
                comm_hash: self.comm_hash,
                abort: &self.abort,
                device_abort: self.device_abort.host() as usize,
                sink: &self.sink,
                net: &self.comm_net,
                routes: self.net.as_ref().map(|n| &n.routes),
                meter: self.adaptive.as_ref().map(|a| &a.meter),
            };
            self.conns.connect(&setup, &rows)?;
        }
        if self.conns.send.len() + self.conns.recv.len() != before {
            *self.wait_spans.lock() = self.conns.wait_spans();
            self.geometry = None;
            self.plans.clear();
        }
        Ok(())
    }

    /// Free every connection (`ncclCommSuspend`): the next operation that needs them connects
    /// again. The caller has waited for the communicator's work and met its peers.
    pub fn release_connections(&mut self) {
        self.conns = Connections::default();
        self.wait_spans.lock().clear();
        self.geometry = None;
        self.plans.clear();
        self.connected_shapes.clear();
    }

    /// Run one group's tasks as one launch on `streams[0]` (other streams of the group are
    /// ordered around it). Connections must exist (`connect_for`).
    pub fn launch_group(
        &mut self,
        rank: i32,
        nranks: i32,
        tasks: &[Task],
        streams: &[usize],
        abort: &AtomicBool,
    ) -> Result<()> {
        let _span = profile::span(Stage::LaunchGroup);
        cuda::set_current(self.ctx)?;
        let lookup = profile::span(Stage::PlanLookup);
        if self.geometry.is_none() {
            self.geometry = Some(self.build_geometry(rank, nranks));
        }
        // Plans are cached by their tasks, weights epochs included: a plan made with other
        // weights is never served.
        let cached = match self.plans.get(tasks, nranks) {
            Some(cached) => cached,
            None => {
                self.learn_epochs(tasks);
                if self.geometry.is_none() {
                    self.geometry = Some(self.build_geometry(rank, nranks));
                }
                let plan = sched::plan(self.geometry.as_ref().expect("built above"), tasks)?;
                let cached = Arc::new(CachedPlan::new(plan, &self.conns));
                self.plans.insert(tasks, nranks, cached.clone());
                cached
            }
        };
        drop(lookup);
        let plan = &cached.plan;
        if plan.nitems == 0 && plan.copies.is_empty() {
            return Ok(());
        }
        let stream = streams[0] as CUstream;
        // Each other stream once (collecting none allocates nothing).
        let others: Vec<usize> = streams
            .iter()
            .enumerate()
            .filter(|&(i, s)| *s != streams[0] && !streams[..i].contains(s))
            .map(|(_, &s)| s)
            .collect();
        // Other streams' earlier work must finish before ours starts.
        for &s in &others {
            self.join.record(s as CUstream)?;
            self.join.wait_on(stream)?;
        }
        if plan.nitems == 0 {
            // Copies only (a one-rank communicator, sends to self): they touch no connection,
            // so they need no ordering with this communicator's kernels.
            run_copies(&mut self.kernels, &plan.copies, stream)?;
            return self.others_wait_for(stream, &others);
        }
        let capturing = {
            let _span = profile::span(Stage::CaptureCheck);
            cuda::stream_is_capturing(stream)?
        };
        // Launches of one communicator share connection state: keep them in order.
        if !capturing {
            if let Some((last_stream, _)) = self.last {
                if last_stream != streams[0] {
                    self.last_event().expect("a last launch").wait_on(stream)?;
                }
            }
        }
        let mut beside = self.fork_copies(&plan.copies, stream, capturing)?;
        cached.announce(stream, capturing)?;
        let done = if let Some(blob) = &cached.inline {
            let kernel = self.kernels.get(cuda::module::INLINE_KERNEL)?;
            launch_inline(kernel, plan, blob, stream)?;
            self.next_inline = (self.next_inline + 1) % INLINE_EVENTS;
            Done::Inline(self.next_inline)
        } else {
            let arena_span = profile::span(Stage::ArenaWrite);
            let (done, items) = if capturing {
                // Under capture no eager event is recorded (see below); the index is unused.
                (
                    Done::Inline(0),
                    self.arena.write_graph(&cached.arena, stream)?,
                )
            } else {
                let (slot, items) = self.arena.write_eager(&cached.arena, abort)?;
                (Done::Slot(slot), items)
            };
            drop(arena_span);
            let _span = profile::span(Stage::KernelLaunch);
            if plan.yields {
                yielding::launch(
                    self.kernels.get(cuda::module::YIELD_KERNEL)?,
                    plan.grid,
                    plan.block,
                    stream,
                    items,
                    plan.nitems,
                    self.device_abort.dev() + sched::device::BELL_OFFSET as u64,
                    self.yielding.park_ns,
                    self.yielding.resumes(nranks),
                )?;
            } else {
                cuda::module::launch(
                    self.kernels.get(plan.kernel)?,
                    plan.grid,
                    plan.block,
                    plan.smem,
                    stream,
                    items,
                    plan.nitems,
                )?;
            }
            if let Done::Slot(slot) = done {
                self.arena.recorded[slot] = true;
            }
            done
        };
        self.join_copies(&plan.copies, stream, capturing, &mut beside)?;
        // Under capture the completion event becomes a graph node: use the join event there,
        // so the eager events keep describing eager launches.
        let _events = profile::span(Stage::Events);
        let done_event = match (capturing, done) {
            (true, _) => &self.join,
            (false, Done::Slot(slot)) => &self.arena.done[slot],
            (false, Done::Inline(i)) => &self.inline_done[i],
        };
        if !capturing || !others.is_empty() {
            done_event.record(stream)?;
            for &s in &others {
                done_event.wait_on(s as CUstream)?;
            }
        }
        if !capturing {
            self.last = Some((streams[0], done));
            self.eager_launches += 1;
        }
        Ok(())
    }

    /// The group's other streams wait for what was just enqueued on `stream`.
    fn others_wait_for(&self, stream: CUstream, others: &[usize]) -> Result<()> {
        if others.is_empty() {
            return Ok(());
        }
        self.join.record(stream)?;
        for &s in others {
            self.join.wait_on(s as CUstream)?;
        }
        Ok(())
    }

    /// Start `copies` beside the kernel about to be launched on `stream`: on the side stream
    /// after the stream's earlier work, or, under capture, as graph nodes beside the kernel's
    /// node (returned, for `join_copies`).
    fn fork_copies(
        &mut self,
        copies: &[sched::plan::LocalCopy],
        stream: CUstream,
        capturing: bool,
    ) -> Result<Vec<cuda::CUgraphNode>> {
        if copies.is_empty() {
            return Ok(Vec::new());
        }
        if capturing {
            let list: Vec<_> = copies
                .iter()
                .map(|c| (c.dst, c.src, c.bytes as usize))
                .collect();
            return cuda::capture_copies_beside(stream, self.ctx, &list);
        }
        self.fork.record(stream)?;
        self.fork.wait_on(self.side.raw())?;
        run_copies(&mut self.kernels, copies, self.side.raw())?;
        Ok(Vec::new())
    }

    /// Make later work on `stream` wait for the copies `fork_copies` started (`nodes`, its
    /// result, under capture).
    fn join_copies(
        &self,
        copies: &[sched::plan::LocalCopy],
        stream: CUstream,
        capturing: bool,
        nodes: &mut [cuda::CUgraphNode],
    ) -> Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        if capturing {
            return cuda::capture_join(stream, nodes);
        }
        self.copied.record(self.side.raw())?;
        self.copied.wait_on(stream)
    }

    fn build_geometry(&self, rank: i32, nranks: i32) -> Geometry {
        let table = |map: &std::collections::HashMap<(u32, i32), crate::transport::Side>| {
            (0..sched::plan::conn_channels(self.nchannels))
                .map(|ch| {
                    (0..nranks)
                        .map(|p| map.get(&(ch, p)).map(|s| s.conn))
                        .collect()
                })
                .collect()
        };
        Geometry {
            rank,
            nranks,
            nchannels: self.nchannels,
            send: table(&self.conns.send),
            recv: table(&self.conns.recv),
            recv_gpu: gpu_slot_keys(&self.conns.recv),
            send_gpu: gpu_slot_keys(&self.conns.send),
            abort_flag: self.device_abort.dev(),
            threads: self.threads,
            net: self.net.clone(),
            ring: self.ring.clone(),
            ring_table: self.ring_table.as_ref().map_or(0, |t| t.ptr()),
            park: self.park.clone(),
            tuner: self.tuner.clone(),
        }
    }
}

/// (channel, peer) of the sides among `sides` whose slots are in GPU memory.
fn gpu_slot_keys(
    sides: &std::collections::HashMap<(u32, i32), crate::transport::Side>,
) -> std::collections::BTreeSet<(u32, i32)> {
    sides
        .iter()
        .filter(|(_, side)| side.gpu_slots)
        .map(|(&key, _)| key)
        .collect()
}

/// The order of the ranks around the ring channels of a communicator with topology `topo`:
/// each host's ranks consecutive, hosts in the order of their lowest rank
/// (`RingOrder::by_host`). A function of the allgathered peers alone, so every rank computes
/// the same order; rank order whenever every host's ranks are contiguous.
pub fn ring_order(topo: &Topology) -> sched::RingOrder {
    let hosts: Vec<u64> = topo.peers.iter().map(|p| p.host_hash).collect();
    sched::RingOrder::by_host(&hosts)
}

/// NVIDIA's INFO lines for the rings (`Channel 00/02 :   0   2   1   3`, rank 0 logs one per
/// channel, subsystem INIT), each ring from rank 0 on: each line its prefix, then every rank
/// as " %3d", at most 127 characters.
pub fn ring_lines(ring: &sched::RingOrder, nchannels: u32) -> Vec<String> {
    let start = ring.position_of(0);
    let mut ranks = String::new();
    for i in 0..ring.nranks() {
        ranks.push_str(&format!(" {:3}", ring.rank_at(start + i)));
    }
    (0..nchannels)
        .map(|c| {
            let mut line = format!("Channel {c:02}/{nchannels:02} :{ranks}");
            line.truncate(127);
            line
        })
        .collect()
}

/// Threads per CTA of this library's kernels: `NCCL_NTHREADS`, else the planner's default.
pub fn block_threads() -> u32 {
    match threads_setting() {
        0 => sched::cost::BLOCK_THREADS,
        n => n,
    }
}

/// `NCCL_NTHREADS`: threads per CTA, a multiple of 64 in 64..=512 (0: the default).
fn threads_setting() -> u32 {
    match crate::env::registry::NTHREADS.int() {
        0 => 0,
        n if (64..=512).contains(&n) && n % 64 == 0 => n as u32,
        n => {
            crate::warn!(
                "NCCL_NTHREADS={n} is not a multiple of 64 in 64..=512; using the default"
            );
            0
        }
    }
}

/// Device-to-device copies on `stream`, in order, each by the copy engine or the copy kernel
/// as the plan chose.
fn run_copies(
    kernels: &mut Kernels,
    copies: &[sched::plan::LocalCopy],
    stream: CUstream,
) -> Result<()> {
    use sched::plan::CopyBy;
    let _span = profile::span(Stage::Copies);
    for c in copies {
        match c.by {
            CopyBy::Engine => cuda::memcpy_dtod_async(c.dst, c.src, c.bytes as usize, stream)?,
            CopyBy::Kernel { ctas, threads } => cuda::module::launch_args(
                kernels.get(cuda::module::COPY_KERNEL)?,
                ctas,
                threads,
                0,
                stream,
                &[
                    KernelArg::U64(c.dst),
                    KernelArg::U64(c.src),
                    KernelArg::U64(c.bytes),
                ],
            )?,
        }
    }
    Ok(())
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Frees must happen with the communicator's context current.
        let _ = cuda::set_current(self.ctx);
    }
}
