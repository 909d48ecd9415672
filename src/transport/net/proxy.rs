//! The proxy: one thread per communicator that moves the data of its network connections
//! between the kernels and the network. It meets the kernels through the same counters as
//! every transport, in host memory the GPU maps (see `transport/mod.rs`): for a sending side
//! it watches `tail` and the step words the kernel writes (`STEP_WORDS_OFFSET`), sends each
//! filled slot, and, once the network has taken it, advances `head`, freeing the slot; for a
//! receiving side it posts a receive into each slot the kernel has freed (`head`) for a step
//! the launched kernels will consume (`Announced`, as NVIDIA's proxy posts only the steps of
//! the operations it was given) and, once the data is in, advances `tail`. A message is the
//! step's payload and an 8-byte trailer, the step word, which says where the payload goes
//! (the Simple or the LL region of the slot) and lets the receiver check that both ends are at the same step. A side whose slots
//! are in GPU memory (GPUDirect RDMA, `NetSide::gpu_slots`), never read or written here: a
//! receiving one leaves every message where it landed, at its slot's start (the kernel knows
//! what it reads there), and advances `tail` once the network's `iflush` says the bytes are
//! visible to the GPU; a sending one sends a Simple step from the slot with the trailer the
//! kernel wrote after it (`FLAG_SEND_GPU`), and an LL step from the host LL regions (where it
//! polls the words, as for any side) through the bounce area.
//!
//! It never waits forever: the communicator's abort stops it, and a failed send, receive or
//! test becomes the communicator's error (through the sink it was given) naming the peer,
//! and raises the device abort flag so that kernels waiting on the connection return. A
//! proxy thread that does not come back from a network call (a plugin that blocks) cannot
//! act itself: a process-wide monitor thread rings the bell of a yielding launch for it (a
//! plugin's CUDA copy may be queued behind that launch's stream waits, in the same hardware
//! queue of the GPU, and would otherwise never end) and logs which side's pass it is stuck in.
//! Under CUDA graphs nothing changes: the proxy follows the counters, whoever launched, and a
//! graph's replays announce their steps themselves (a host node each).
//!
//! Teardown: once the kernels are done, every announced step has been received and consumed,
//! so no receive is left posted; on stop the thread also lets the sends in flight complete
//! (at most `SETTLE`) and then closes every connection with nothing in flight, as NVIDIA's
//! does, so a plugin finds no request to complain about. An abort closes at once.

use super::api::{Comm, MemHandle, Net, Request};
use crate::error::{Error, Result};
use crate::sched::device::{
    BELL_OFFSET, LL_REGION_DIV, PARK_ENTRY_BYTES, PARK_OFFSET, PROGRESS_CTAS, STEP_LL,
};
use crate::sched::Dir;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where errors of the proxy go, with the peer whose connection failed (the communicator's
/// async error, and its watchdog, which tells the other ranks).
pub type ErrorSink = Arc<dyn Fn(i32, Error) + Send + Sync>;

/// Bytes of the trailer that follows every message's payload.
const TRAILER: usize = 8;
/// How long the proxy keeps spinning after the last thing it moved before it naps.
const SPIN: Duration = Duration::from_millis(5);
const NAP: Duration = Duration::from_micros(50);
/// After this long without moving anything while work is posted, the proxy logs where every
/// side stands (once per stall).
const STALL_REPORT: Duration = Duration::from_secs(10);

/// How long a stopping proxy (not aborted) lets the sends in flight complete before it closes
/// their connections anyway.
const SETTLE: Duration = Duration::from_secs(1);

/// The steps the kernels launched so far will consume on one receiving side, ever. The launch
/// path adds each launch's (`sched::steps`): at the launch, or for a launch captured in a
/// CUDA graph at every replay of the graph (a host node). The proxy posts a receive for step
/// k only while k is below it, so once the kernels are done no receive is left posted.
#[derive(Clone, Debug, Default)]
pub struct Announced(Arc<AnnouncedSteps>);

#[derive(Debug, Default)]
struct AnnouncedSteps {
    total: AtomicU64,
    /// Kept by `Announced::tracking_launches`: where each launch's steps end (a step count),
    /// oldest first, until the proxy has received that far.
    ends: Option<Mutex<VecDeque<u64>>>,
}

impl Announced {
    /// Steps that also remember where each launch's end (`ends_launch`).
    pub fn tracking_launches() -> Announced {
        Announced(Arc::new(AnnouncedSteps {
            total: AtomicU64::new(0),
            ends: Some(Mutex::new(VecDeque::new())),
        }))
    }

    /// A launch's `steps` more will be consumed.
    pub fn add(&self, steps: u64) {
        match &self.0.ends {
            Some(ends) => {
                // Under the lock, so the ends are in the order of the totals.
                let mut ends = ends.lock();
                let end = self.0.total.fetch_add(steps, Ordering::AcqRel) + steps;
                ends.push_back(end);
            }
            None => {
                self.0.total.fetch_add(steps, Ordering::AcqRel);
            }
        }
    }

    /// The steps announced so far.
    pub fn get(&self) -> u64 {
        self.0.total.load(Ordering::Acquire)
    }

    /// Whether `received` steps in all end a launch (always false unless tracking launches);
    /// the ends up to it are forgotten.
    pub fn ends_launch(&self, received: u64) -> bool {
        let Some(ends) = &self.0.ends else {
            return false;
        };
        let mut ends = ends.lock();
        let mut hit = false;
        while let Some(&end) = ends.front() {
            if end > received {
                break;
            }
            hit |= end == received;
            ends.pop_front();
        }
        hit
    }
}

/// Host addresses of one network side's counters and buffers (all in memory the GPU maps).
#[derive(Clone, Copy, Debug)]
pub struct HostBlock {
    /// Slots filled (the kernel writes it on a sending side, the proxy on a receiving one).
    pub tail: *mut u64,
    /// Slots consumed (the proxy writes it on a sending side, the kernel on a receiving one).
    pub head: *mut u64,
    /// The step words, `nslots` u64s (written by the sending kernel).
    pub words: *const u64,
    /// The staging buffer, `nslots * slot_bytes` (in GPU memory for `NetSide::gpu_slots`).
    pub buf: *mut u8,
    /// Slot 0's LL region, in host memory (a sending side's): the end of the slot, or with
    /// slots in GPU memory the first of the host LL regions.
    pub ll: *mut u8,
    /// Bytes from one slot's LL region to the next's.
    pub ll_stride: usize,
    /// A sending side's copy area for LL payloads: `nslots * bounce_bytes(slot_bytes)`.
    pub bounce: *mut u8,
}

/// Bytes of one slot's bounce area: an LL region and a trailer.
pub fn bounce_bytes(slot_bytes: u32) -> usize {
    (slot_bytes / LL_REGION_DIV) as usize + TRAILER
}

/// One side of one network connection, handed to the proxy once connected.
pub struct NetSide {
    pub net: Arc<dyn Net>,
    pub comm: Comm,
    pub mh: MemHandle,
    /// Registration of the bounce area (sending sides).
    pub bounce_mh: MemHandle,
    pub dir: Dir,
    pub peer: i32,
    pub channel: u32,
    pub block: HostBlock,
    /// The device addresses of `block.head` and `block.tail` (a parked CTA's entry names one).
    pub dev_head: u64,
    pub dev_tail: u64,
    pub nslots: u32,
    pub slot_bytes: u32,
    /// The side's slots (`block.buf`) are in GPU memory, registered with the network as such,
    /// never touched by the proxy: a received message is flushed, not landed; a Simple step
    /// is sent with the trailer its kernel wrote.
    pub gpu_slots: bool,
    /// A receiving side's steps to post receives for (unused on a sending side).
    pub announced: Announced,
    /// Where the side counts what its device does (`meter`); None: not counted.
    pub meter: Option<super::meter::DeviceMeter>,
}

// SAFETY: the block's pointers are into memory owned by the connection's `Side`, which the
// communicator keeps until the proxy has stopped (`Connections` stops it first on drop); only
// the proxy thread dereferences them, and `Net` is Send + Sync.
unsafe impl Send for NetSide {}

/// A side the proxy drives: the side and its position.
struct Driven {
    side: NetSide,
    /// The next step to post (send or receive).
    next: u64,
    /// Posted requests in step order.
    inflight: VecDeque<(u64, Request)>,
    /// The flush of a received step in GPU memory, before its `tail` (`gpu_slots`).
    flushing: Option<(u64, Request)>,
    /// Its connection failed: it moves nothing more (the other sides go on).
    failed: bool,
    /// A receiving side has received a step of a launch whose last step it has not received
    /// (what its meter counts as the device being in a launch).
    in_launch: bool,
}

fn load(p: *const u64) -> u64 {
    // SAFETY: p is an aligned u64 of a live block (NetSide's contract); the GPU writes it
    // concurrently, hence volatile.
    let v = unsafe { std::ptr::read_volatile(p) };
    fence(Ordering::Acquire);
    v
}

fn store(p: *mut u64, v: u64) {
    fence(Ordering::Release);
    // SAFETY: as in `load`.
    unsafe { std::ptr::write_volatile(p, v) };
}

fn epoch(k: u64) -> u64 {
    (k + 1) & 0xffff_ffff
}

/// An LL step's payload as it travels: its LL region's words, two per 8 payload bytes (the
/// last unit of 4 bytes or fewer has one).
fn ll_wire_bytes(payload: usize) -> usize {
    payload.div_ceil(8) * 16
}

impl Driven {
    /// Nothing of this side is waiting to go out: no send in flight and no filled slot
    /// unsent (a receiving side has nothing to deliver to the network).
    fn drained(&self) -> bool {
        self.side.dir == Dir::Recv || (self.inflight.is_empty() && self.filled(self.next).is_none())
    }

    /// Where step k's slot is: an address in host memory, or in GPU memory (`gpu_slots`,
    /// never dereferenced here; hence a wrapping offset).
    fn slot(&self, k: u64) -> *mut u8 {
        let s = &self.side;
        s.block
            .buf
            .wrapping_add((k % s.nslots as u64) as usize * s.slot_bytes as usize)
    }

    /// Step k's LL region (a sending side's, in host memory).
    fn ll_region(&self, k: u64) -> *mut u8 {
        let b = &self.side.block;
        b.ll.wrapping_add((k % self.side.nslots as u64) as usize * b.ll_stride)
    }

    fn what(&self) -> String {
        side_name(side_code(&self.side))
    }

    /// One pass over this side: post what is ready, complete what is done. Whether anything
    /// moved.
    fn progress(&mut self) -> Result<bool> {
        let posted = match self.side.dir {
            Dir::Send => self.post_sends()?,
            Dir::Recv => self.post_recvs()?,
        };
        Ok(self.complete()? || posted)
    }

    /// The step word of step k, if the kernel has filled step k: (payload bytes, LL).
    fn filled(&self, k: u64) -> Option<(usize, bool)> {
        let s = &self.side;
        // SAFETY: the words array has nslots entries.
        let word = load(unsafe { s.block.words.add((k % s.nslots as u64) as usize) });
        if word >> 32 != epoch(k) {
            return None;
        }
        let ll = word as u32 & STEP_LL != 0;
        let bytes = (word as u32 & !STEP_LL) as usize;
        if ll {
            self.ll_ready(k, bytes).then_some((bytes, true))
        } else {
            (load(s.block.tail) > k).then_some((bytes, false))
        }
    }

    /// Whether every LL word of step k's payload carries the step's epoch.
    fn ll_ready(&self, k: u64, bytes: usize) -> bool {
        let words = self.ll_region(k) as *const u64;
        let units = bytes.div_ceil(8);
        (0..units).all(|u| {
            let two = bytes - u * 8 > 4;
            // SAFETY: unit u's words are within the LL region (bytes <= its payload).
            let ok = |i: usize| load(unsafe { words.add(2 * u + i) }) >> 32 == epoch(k);
            ok(0) && (!two || ok(1))
        })
    }

    /// The message of filled step k: its address and length (payload + trailer), the
    /// trailer written after the payload (in the slot, or for LL in the bounce area with a
    /// copy of the LL words; a Simple step in GPU memory has it from its kernel).
    fn message(&self, k: u64, bytes: usize, ll: bool) -> (*mut u8, usize) {
        let s = &self.side;
        let word = (epoch(k) << 32) | bytes as u64 | if ll { STEP_LL as u64 } else { 0 };
        let (base, len) = if ll {
            let len = ll_wire_bytes(bytes);
            let slot = (k % s.nslots as u64) as usize;
            // SAFETY: the bounce area has nslots areas of bounce_bytes; len + TRAILER fits.
            let b = unsafe { s.block.bounce.add(slot * bounce_bytes(s.slot_bytes)) };
            // SAFETY: both ranges are within their areas and do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(self.ll_region(k), b, len) };
            (b, len)
        } else {
            (self.slot(k), bytes)
        };
        if !ll && s.gpu_slots {
            return (base, len + TRAILER);
        }
        // SAFETY: payload + trailer fits the slot (a Simple payload is at most 7/8 of it) or
        // the bounce area; nothing else writes there until the send completes.
        unsafe { std::ptr::write_unaligned(base.add(len) as *mut u64, word) };
        (base, len + TRAILER)
    }

    fn post_sends(&mut self) -> Result<bool> {
        let mut posted = false;
        while self.inflight.len() < self.side.nslots as usize {
            let k = self.next;
            let Some((bytes, ll)) = self.filled(k) else {
                break;
            };
            let (ptr, len) = self.message(k, bytes, ll);
            let mh = if ll {
                self.side.bounce_mh
            } else {
                self.side.mh
            };
            let s = &self.side;
            match s.net.isend(s.comm, ptr, len, 0, mh)? {
                Some(r) => self.inflight.push_back((k, r)),
                None => break,
            }
            self.next += 1;
            posted = true;
        }
        Ok(posted)
    }

    /// Post a receive for each step whose slot the kernel has freed and that a launched kernel
    /// will consume.
    fn post_recvs(&mut self) -> Result<bool> {
        let mut posted = false;
        while self.inflight.len() < self.side.nslots as usize {
            let k = self.next;
            let s = &self.side;
            let free = load(s.block.head) + s.nslots as u64;
            if k >= free.min(s.announced.get()) {
                break;
            }
            let ptr = self.slot(k);
            match s.net.irecv(s.comm, ptr, s.slot_bytes as usize, 0, s.mh)? {
                Some(r) => self.inflight.push_back((k, r)),
                None => break,
            }
            self.next += 1;
            posted = true;
        }
        Ok(posted)
    }

    /// Complete the posted requests that are done, in order (a received step in GPU memory
    /// once its flush is done too).
    fn complete(&mut self) -> Result<bool> {
        let mut done = false;
        loop {
            let s = &self.side;
            if let Some((k, f)) = self.flushing {
                if s.net.test(f)?.is_none() {
                    break;
                }
                self.flushing = None;
                store(s.block.tail, k + 1);
                done = true;
                continue;
            }
            let Some(&(k, r)) = self.inflight.front() else {
                break;
            };
            let Some(n) = s.net.test(r)? else {
                break;
            };
            self.inflight.pop_front();
            done = true;
            if let (Dir::Recv, Some(m)) = (s.dir, &s.meter) {
                // A side joins its device's busy period with its launch's first completion,
                // not when it posts the receive: receives are posted a launch ahead, and a
                // side waiting for the next launch's data must not keep the period open.
                if !self.in_launch {
                    m.launch_started();
                    self.in_launch = true;
                }
                m.received(n);
                if s.announced.ends_launch(k + 1) {
                    m.launch_done();
                    self.in_launch = false;
                }
            }
            match s.dir {
                Dir::Send => store(s.block.head, k + 1),
                // The slot is not reposted before the kernel has read it (head), which it
                // does only after the tail: the flush has the slot to itself.
                Dir::Recv if s.gpu_slots => match s.net.iflush(s.comm, self.slot(k), n, s.mh)? {
                    Some(f) => self.flushing = Some((k, f)),
                    None => store(s.block.tail, k + 1),
                },
                Dir::Recv => {
                    self.land(k, n)?;
                    store(s.block.tail, k + 1);
                }
            }
        }
        Ok(done)
    }

    /// Step k's message of `n` bytes is in its slot: check its trailer and move an LL
    /// payload to the slot's LL region.
    fn land(&self, k: u64, n: usize) -> Result<()> {
        let bad = |why: String| {
            Error::remote(format!(
                "network connection {}: step {k}: {why}",
                self.what()
            ))
        };
        if n < TRAILER {
            return Err(bad(format!("a message of {n} bytes has no trailer")));
        }
        let slot = self.slot(k);
        // SAFETY: n <= slot_bytes bytes were received into the slot.
        let word = unsafe { std::ptr::read_unaligned(slot.add(n - TRAILER) as *const u64) };
        let ll = word as u32 & STEP_LL != 0;
        let bytes = (word as u32 & !STEP_LL) as usize;
        let payload = if ll { ll_wire_bytes(bytes) } else { bytes };
        if word >> 32 != epoch(k) || payload != n - TRAILER {
            return Err(bad(format!(
                "the peer sent step epoch {} with {bytes} bytes in a message of {n}: the two \
                 ends disagree on the sequence of steps",
                word >> 32
            )));
        }
        if ll {
            let (src, dst) = (slot as *const u64, self.ll_region(k) as *mut u64);
            for i in 0..payload / 8 {
                // SAFETY: both are within the slot, 8-aligned (slots and regions are
                // multiples of 4 KiB / 8), and disjoint (the payload is at most 1/8 of it).
                // One 8-byte store per LL word: a word is never seen torn.
                unsafe { std::ptr::write_volatile(dst.add(i), std::ptr::read(src.add(i))) };
            }
        }
        Ok(())
    }

    /// Where this side stands, for a stall report.
    fn state(&self) -> String {
        let s = &self.side;
        let k = self.next;
        // SAFETY: the words array has nslots entries.
        let word = load(unsafe { s.block.words.add((k % s.nslots as u64) as usize) });
        let flushing = self
            .flushing
            .map_or(String::new(), |(f, _)| format!(", step {f} flushing"));
        let announced = match s.dir {
            Dir::Recv => format!(", {} steps announced", s.announced.get()),
            Dir::Send => String::new(),
        };
        format!(
            "{}: next step {k}, {} posted{flushing}{announced}, tail {}, head {}, step word of \
             the next slot {:#x}",
            self.what(),
            self.inflight.len(),
            load(s.block.tail),
            load(s.block.head),
            word
        )
    }

    /// Requests still in flight (posted, or a flush).
    fn in_flight(&self) -> usize {
        self.inflight.len() + self.flushing.is_some() as usize
    }

    /// Close the connection (and deregister its memory). Requests still in flight are said
    /// (an abort, a failed side, or steps announced that no kernel consumed).
    fn close(&self, rank: i32) {
        let s = &self.side;
        if self.in_flight() > 0 {
            crate::info!(
                NET,
                "rank {rank}: closing the network connection {} with {} requests in flight",
                self.what(),
                self.in_flight()
            );
        }
        let _ = s.net.dereg_mr(s.comm, s.mh);
        let _ = match s.dir {
            Dir::Send => {
                let _ = s.net.dereg_mr(s.comm, s.bounce_mh);
                s.net.close_send(s.comm)
            }
            Dir::Recv => s.net.close_recv(s.comm),
        };
    }
}

struct Shared {
    stop: AtomicBool,
    /// Set by `drain`; the thread answers with `drained` once every send side is empty.
    drain: AtomicBool,
    drained: AtomicBool,
    /// A send side failed: what the kernels left for it never goes out (a drain then ends at
    /// once).
    failed: AtomicBool,
    /// The communicator's abort flag.
    abort: Arc<AtomicBool>,
    incoming: Mutex<Vec<NetSide>>,
    has_incoming: AtomicBool,
    sink: ErrorSink,
    /// Host address of the communicator's status page (`sched::device`): its abort flag (a
    /// u32 at 0) and its bell (a u32 at `BELL_OFFSET`); 0 for none.
    device_abort: usize,
    rank: i32,
    /// Where the thread is, for the monitor: when its current pass over the sides began (µs
    /// since `epoch`; 0 between passes) and the side it is at (`side_code`).
    epoch: Instant,
    pass_since_us: AtomicU64,
    pass_side: AtomicU64,
    /// How long a pass may last before the monitor reports it (`STALL_REPORT`), and whether
    /// it did for the current one.
    stuck_after_us: AtomicU64,
    stuck_reported: AtomicBool,
    /// Whether the status page is still there for the monitor to ring its bell: cleared,
    /// under the lock, when the proxy stops (the page may go right after).
    page_live: Mutex<bool>,
}

/// A side as the monitor keeps it: channel, peer and direction in one word (`side_name` says
/// it in words, as every report of the side does).
fn side_code(s: &NetSide) -> u64 {
    (s.channel as u64) << 33 | (s.peer as u32 as u64) << 1 | (s.dir == Dir::Recv) as u64
}

fn side_name(code: u64) -> String {
    let (channel, peer) = (code >> 33, (code >> 1) as u32 as i32);
    match code & 1 {
        0 => format!("sending to rank {peer} (channel {channel})"),
        _ => format!("receiving from rank {peer} (channel {channel})"),
    }
}

impl Shared {
    fn now_us(&self) -> u64 {
        (self.epoch.elapsed().as_micros() as u64).max(1)
    }

    /// How long the thread has been in its current pass over the sides (none between passes).
    fn in_pass_for(&self) -> Option<Duration> {
        let since = self.pass_since_us.load(Ordering::Acquire);
        (since != 0).then(|| Duration::from_micros(self.now_us().saturating_sub(since)))
    }

    /// Where the thread has been, in one pass, for longer than the report delay: the side it
    /// is at (in a network call, or stopped) and for how long.
    fn stuck_in(&self) -> Option<(String, Duration)> {
        let took = self.in_pass_for()?;
        let side = self.pass_side.load(Ordering::Acquire);
        let limit = Duration::from_micros(self.stuck_after_us.load(Ordering::Relaxed));
        (took > limit).then(|| (side_name(side), took))
    }

    /// `f()` while the status page is there (`Proxy::stop` or drop declares it gone, after
    /// which it may be freed); `None` once it is gone. Every use of the page (bell, park
    /// entries) by the thread or the monitor is inside one.
    fn on_page<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        let live = self.page_live.lock();
        (*live).then(f)
    }

    /// Whether a yielding launch may be waiting for this proxy's bell (it is silent).
    fn bell_awaited(&self) -> bool {
        self.on_page(|| self.bell_silent()).unwrap_or(false)
    }

    /// The monitor's part while the thread is held in one pass longer than `BELL_SAFETY`:
    /// ring a silent bell, as the thread would after its pass, so that a yielding launch goes
    /// on (its kernels park again if their waits are still unmet).
    fn ring_for_held_thread(&self) {
        if self.in_pass_for().is_none_or(|took| took <= BELL_SAFETY) {
            return;
        }
        self.on_page(|| {
            if self.bell_silent() {
                self.ring_bell();
            }
        });
    }

    /// The bell, when there is a status page.
    fn bell(&self) -> Option<*mut u32> {
        (self.device_abort != 0).then(|| (self.device_abort + BELL_OFFSET as usize) as *mut u32)
    }

    /// Let a yielding launch's next kernel run (its stream waits for the bell): once a parked
    /// CTA's wait is met (its park entry), or on abort. The fence orders the counter's store
    /// before the bell's, against a parking CTA's store of 0, fence and load of the counter:
    /// either the CTA sees the counter, or this store comes after its 0.
    fn ring_bell(&self) {
        if let Some(bell) = self.bell() {
            fence(Ordering::SeqCst);
            // SAFETY: called inside `on_page`, so the status page is still there (it outlives
            // the proxy until declared gone, Proxy::start's contract); the bell is an aligned
            // u32 in it, written by the GPU concurrently, hence volatile.
            unsafe { std::ptr::write_volatile(bell, 1) };
        }
    }

    /// Whether the bell is silent (a yielding launch's stream waits, or will); inside
    /// `on_page`.
    fn bell_silent(&self) -> bool {
        // SAFETY: as in ring_bell.
        self.bell()
            .is_some_and(|bell| unsafe { std::ptr::read_volatile(bell) } == 0)
    }

    /// The park entry (`PARK_OFFSET`) of CTA `cta`: (counter's device address, value waited
    /// for) when the CTA is parked now; inside `on_page`.
    fn park_entry(&self, cta: u32) -> Option<(u64, u64)> {
        if self.device_abort == 0 {
            return None;
        }
        let at = self.device_abort + (PARK_OFFSET + PARK_ENTRY_BYTES * cta) as usize;
        // SAFETY: the entry is two aligned u64s within the status page (there: inside
        // `on_page`), written by the GPU concurrently, hence volatile.
        let (addr, value) = unsafe {
            (
                std::ptr::read_volatile(at as *const u64),
                std::ptr::read_volatile((at + 8) as *const u64),
            )
        };
        (addr != 0).then_some((addr, value))
    }

    /// Whether a parked CTA's wait is met by a counter of `sides`; inside `on_page`.
    fn parked_wait_met(&self, sides: &[Driven]) -> bool {
        (0..PROGRESS_CTAS)
            .filter_map(|cta| self.park_entry(cta))
            .any(|(addr, value)| {
                sides.iter().any(|d| {
                    let s = &d.side;
                    let counter = if addr == s.dev_head {
                        s.block.head
                    } else if addr == s.dev_tail {
                        s.block.tail
                    } else {
                        return false;
                    };
                    load(counter) >= value
                })
            })
    }
}

/// How long the bell may stay silent before the proxy rings it anyway (a parked CTA waits on
/// a counter this proxy does not drive, or its entry was not yet visible): a missed ring
/// costs this much, never a hang (the woken kernel parks again if its wait is still unmet;
/// the launch's last kernel spins).
const BELL_SAFETY: Duration = Duration::from_millis(2);

/// The proxy thread of one communicator; stopped and joined on drop.
pub struct Proxy {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Start the thread. `device_abort` is the host address of the communicator's status page
    /// (the u32 abort flag kernels poll, then the bell; 0: none); it must outlive the proxy.
    /// `cuda_dev`: the communicator's device, whose primary context the thread makes current
    /// (as NVIDIA's progress thread calls `cudaSetDevice`), so a plugin that calls CUDA from
    /// `isend`/`irecv`/`test` finds the device it expects; `None` (tests on host memory):
    /// the thread touches no CUDA.
    pub fn start(
        rank: i32,
        cuda_dev: Option<i32>,
        abort: Arc<AtomicBool>,
        device_abort: usize,
        sink: ErrorSink,
    ) -> Result<Proxy> {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            drain: AtomicBool::new(false),
            drained: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            abort,
            incoming: Mutex::new(Vec::new()),
            has_incoming: AtomicBool::new(false),
            sink,
            device_abort,
            rank,
            epoch: Instant::now(),
            pass_since_us: AtomicU64::new(0),
            pass_side: AtomicU64::new(0),
            stuck_after_us: AtomicU64::new(STALL_REPORT.as_micros() as u64),
            stuck_reported: AtomicBool::new(false),
            page_live: Mutex::new(true),
        });
        monitor::watch(&shared);
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("oxccl-proxy-r{rank}"))
            .spawn(move || {
                if let Some(dev) = cuda_dev {
                    enter_device(dev);
                }
                run(rank, &s)
            })
            .map_err(|e| Error::system(format!("cannot start the proxy thread: {e}")))?;
        Ok(Proxy {
            shared,
            thread: Some(thread),
        })
    }

    /// Where the thread has been stuck in one pass for longer than the report delay (the
    /// side, and for how long); what the monitor reports.
    pub fn stuck_in(&self) -> Option<(String, Duration)> {
        self.shared.stuck_in()
    }

    /// The report delay of `stuck_in` (`STALL_REPORT` unless set).
    pub fn set_stuck_after(&self, after: Duration) {
        self.shared
            .stuck_after_us
            .store(after.as_micros() as u64, Ordering::Relaxed);
    }

    /// Drive `side` from now on.
    pub fn add(&self, side: NetSide) {
        self.shared.incoming.lock().push(side);
        self.shared.has_incoming.store(true, Ordering::Release);
    }
}

impl Proxy {
    /// Wait (at most `limit`) until everything the kernels have filled has gone out: a
    /// sending kernel finishes once its last slot is filled, so an orderly destroy must let
    /// the proxy send it before stopping, or the peer would wait for it forever. The error
    /// says why not: the limit passed, the communicator was aborted, or a send side failed
    /// (then at once: what it holds never goes out). A failed receive side leaves nothing
    /// unsent.
    pub fn drain(&self, limit: Duration) -> std::result::Result<(), String> {
        let start = Instant::now();
        self.shared.drained.store(false, Ordering::Release);
        self.shared.drain.store(true, Ordering::Release);
        while !self.shared.drained.load(Ordering::Acquire) {
            if self.shared.failed.load(Ordering::Acquire) {
                return Err("a network connection failed".into());
            }
            if self.shared.abort.load(Ordering::Acquire) {
                return Err("the communicator was aborted".into());
            }
            if start.elapsed() > limit {
                return Err(format!("still unsent after {} s", limit.as_secs()));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        Ok(())
    }
}

/// How long `Connections` waits for the proxy thread to stop before leaving it behind.
pub const STOP_LIMIT: Duration = Duration::from_secs(5);

impl Proxy {
    /// Tell the thread to stop and declare the status page gone: neither the thread nor the
    /// monitor touches it afterwards, so it may be freed once this returns. The thread, when
    /// it is not this one (the last reference may go in the proxy's own thread, through its
    /// error sink; it then ends by itself).
    fn signal_stop(&mut self) -> Option<std::thread::JoinHandle<()>> {
        self.shared.stop.store(true, Ordering::Release);
        *self.shared.page_live.lock() = false;
        self.thread
            .take()
            .filter(|t| t.thread().id() != std::thread::current().id())
    }

    /// Stop the thread and wait for it at most `limit`. true: it has ended. false: it is
    /// held in a network call that does not return (a plugin's), and is left behind, logged
    /// with the connection it is at; it ends when the call returns and then only closes its
    /// connections. It no longer touches the status page, but it may still touch the memory
    /// of the sides it drives, which the caller must then never free.
    pub fn stop(mut self, limit: Duration) -> bool {
        let Some(t) = self.signal_stop() else {
            return true;
        };
        let start = Instant::now();
        while !t.is_finished() {
            if start.elapsed() > limit {
                let side = side_name(self.shared.pass_side.load(Ordering::Acquire));
                crate::warn!(
                    "rank {}: the proxy thread did not stop within {} s: it is held in a \
                     network call at its connection {side}; it is left behind, and its \
                     connections' memory is not freed",
                    self.shared.rank,
                    limit.as_secs_f32()
                );
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = t.join();
        true
    }
}

impl Drop for Proxy {
    /// Without `stop`, waits for the thread however long it takes: the sides' memory may be
    /// freed right after.
    fn drop(&mut self) {
        if let Some(t) = self.signal_stop() {
            let _ = t.join();
        }
    }
}

/// Make `dev`'s primary context current on the proxy thread, with NVIDIA's INFO line; a
/// failure is only logged, as NVIDIA's: the built-in transports never call CUDA from this
/// thread.
fn enter_device(dev: i32) {
    // SAFETY: sched_getcpu takes no arguments and only reads the calling thread's CPU.
    let cpu = unsafe { libc::sched_getcpu() };
    crate::info!(INIT, "[Proxy Progress] Device {dev} CPU core {cpu}");
    if let Err(e) = crate::cuda::use_device(dev) {
        crate::warn!("[Proxy Progress] Failed to set CUDA device {dev}: {e}");
    }
}

/// The thread: progress every side until stopped, aborted or failed; then close them all.
fn run(rank: i32, shared: &Shared) {
    let mut sides: Vec<Driven> = Vec::new();
    let mut last_moved = Instant::now();
    let mut stall_reported = false;
    let mut silent_since: Option<Instant> = None;
    while !shared.stop.load(Ordering::Acquire) {
        take_incoming(shared, &mut sides);
        let mut moved = false;
        if !shared.abort.load(Ordering::Acquire) {
            shared
                .pass_since_us
                .store(shared.now_us(), Ordering::Release);
            for d in sides.iter_mut().filter(|d| !d.failed) {
                shared
                    .pass_side
                    .store(side_code(&d.side), Ordering::Release);
                match d.progress() {
                    Ok(m) => {
                        moved |= m;
                    }
                    Err(e) => {
                        fail(rank, shared, d, e);
                        d.failed = true;
                        if d.side.dir == Dir::Send {
                            shared.failed.store(true, Ordering::Release);
                        }
                    }
                }
            }
            shared.pass_since_us.store(0, Ordering::Release);
            shared.on_page(|| {
                if shared.bell_silent() {
                    let since = *silent_since.get_or_insert_with(Instant::now);
                    if shared.parked_wait_met(&sides) || since.elapsed() > BELL_SAFETY {
                        shared.ring_bell();
                        silent_since = None;
                    }
                } else {
                    silent_since = None;
                }
            });
        }
        if shared.drain.load(Ordering::Acquire) && sides.iter().all(|d| d.failed || d.drained()) {
            shared.drain.store(false, Ordering::Release);
            shared
                .drained
                .store(!shared.failed.load(Ordering::Acquire), Ordering::Release);
        }
        if moved {
            last_moved = Instant::now();
            stall_reported = false;
        } else if !stall_reported && last_moved.elapsed() > STALL_REPORT && !sides.is_empty() {
            report_stall(rank, &sides, last_moved.elapsed());
            stall_reported = true;
        } else if last_moved.elapsed() > SPIN {
            std::thread::sleep(NAP);
        } else {
            std::hint::spin_loop();
        }
    }
    // A side handed over just before the stop is closed too.
    take_incoming(shared, &mut sides);
    if !shared.abort.load(Ordering::Acquire) {
        settle_sends(rank, shared, &mut sides);
    }
    for d in &sides {
        d.close(rank);
    }
}

/// Drive the sides handed over since the last look.
fn take_incoming(shared: &Shared, sides: &mut Vec<Driven>) {
    if shared.has_incoming.swap(false, Ordering::AcqRel) {
        sides.extend(shared.incoming.lock().drain(..).map(|side| Driven {
            side,
            next: 0,
            inflight: VecDeque::new(),
            flushing: None,
            failed: false,
            in_launch: false,
        }));
    }
}

/// Let the sends in flight complete (at most `SETTLE`, until an abort): a kernel that filled
/// its last slot is done before its send is, and the peer has its receive posted for it.
/// Receives are not waited for: once the kernels are done none is left that data will come
/// for.
fn settle_sends(rank: i32, shared: &Shared, sides: &mut [Driven]) {
    let start = Instant::now();
    let unsettled = |d: &Driven| !d.failed && d.side.dir == Dir::Send && !d.inflight.is_empty();
    while sides.iter().any(unsettled) {
        if shared.abort.load(Ordering::Acquire) || start.elapsed() > SETTLE {
            return;
        }
        for d in sides.iter_mut().filter(|d| unsettled(d)) {
            shared
                .pass_side
                .store(side_code(&d.side), Ordering::Release);
            if let Err(e) = d.complete() {
                crate::info!(
                    NET,
                    "rank {rank}: network connection {} failed while closing: {}",
                    d.what(),
                    e.msg
                );
                d.failed = true;
            }
        }
        std::thread::sleep(NAP);
    }
}

/// Log every side's position after a long time without movement (a hang's evidence: which
/// peer's data is missing). Sides that were never used are left out.
fn report_stall(rank: i32, sides: &[Driven], quiet: Duration) {
    let busy: Vec<String> = sides
        .iter()
        .filter(|d| d.next > 0 || !d.inflight.is_empty())
        .map(Driven::state)
        .collect();
    if busy.is_empty() {
        return;
    }
    crate::info!(
        NET,
        "rank {rank}: proxy idle for {} s; {}",
        quiet.as_secs(),
        busy.join("; ")
    );
}

/// A side failed: the sink hears it, naming the peer (the communicator's watchdog decides:
/// a peer that left in order closes its connections after its last operation, which is no
/// error; otherwise it stops the kernels that wait and tells the other ranks). A parked CTA's
/// next kernel is let run.
fn fail(rank: i32, shared: &Shared, d: &Driven, e: Error) {
    let msg = format!(
        "rank {rank}'s network connection {} failed: {}",
        d.what(),
        e.msg
    );
    crate::info!(NET, "{msg}");
    (shared.sink)(d.side.peer, Error::new(e.code, msg));
    shared.on_page(|| shared.ring_bell());
}

/// The process's one monitor thread. Every `TICK` while a bell is silent (a yielding launch
/// may wait for it), else every `IDLE_TICK`, for each live proxy whose thread has been held
/// in one pass over its sides (a network call that does not return):
/// past `BELL_SAFETY` it rings a silent bell in the thread's place (`ring_for_held_thread`),
/// and past the report delay (`Shared::stuck_in`) it logs, once per pass, the side the thread
/// is at, which the proxy cannot report itself.
mod monitor {
    use super::Shared;
    use parking_lot::Mutex;
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Weak};
    use std::time::Duration;

    static WATCHED: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());
    static STARTED: std::sync::Once = std::sync::Once::new();
    /// How often it looks while some bell is silent (a held thread's bell is rung this
    /// often), and otherwise.
    const TICK: Duration = Duration::from_millis(1);
    const IDLE_TICK: Duration = Duration::from_millis(100);

    /// Watch `shared` while it lives (the thread starts once, with the first proxy).
    pub(super) fn watch(shared: &Arc<Shared>) {
        WATCHED.lock().push(Arc::downgrade(shared));
        STARTED.call_once(|| {
            // A monitor that cannot start leaves stuck proxies unreported, nothing else.
            let _ = std::thread::Builder::new()
                .name("oxccl-proxy-mon".into())
                .spawn(run);
        });
    }

    fn run() {
        let mut tick = IDLE_TICK;
        loop {
            std::thread::sleep(tick);
            let live: Vec<Arc<Shared>> = {
                let mut w = WATCHED.lock();
                w.retain(|s| s.strong_count() > 0);
                w.iter().filter_map(Weak::upgrade).collect()
            };
            tick = if live.iter().any(|s| s.bell_awaited()) {
                TICK
            } else {
                IDLE_TICK
            };
            for s in live {
                check(&s);
            }
        }
    }

    fn check(s: &Shared) {
        s.ring_for_held_thread();
        match s.stuck_in() {
            Some((side, took)) => {
                if !s.stuck_reported.swap(true, Ordering::AcqRel) {
                    crate::info!(
                        NET,
                        "rank {}: the proxy thread has been in one pass for {} s, at its \
                         network connection {side} (a network call that does not return?); \
                         it moves nothing else meanwhile",
                        s.rank,
                        took.as_secs()
                    );
                }
            }
            None => s.stuck_reported.store(false, Ordering::Release),
        }
    }
}

#[cfg(test)]
mod announced_tests {
    use super::*;

    #[test]
    fn a_tracking_side_knows_where_each_launch_ends() {
        let a = Announced::tracking_launches();
        a.add(3);
        a.add(0);
        a.add(2);
        assert_eq!(a.get(), 5);
        assert!(!a.ends_launch(2));
        assert!(a.ends_launch(3), "the first launch's last step");
        assert!(!a.ends_launch(4));
        assert!(a.ends_launch(5));
        assert!(!a.ends_launch(5), "each end once");
        // Received past an end without stopping on it (not the proxy's way): forgotten.
        a.add(1);
        a.add(1);
        assert!(!a.ends_launch(5));
        assert!(a.ends_launch(7));
        // Without tracking nothing is kept.
        let plain = Announced::default();
        plain.add(4);
        assert_eq!(plain.get(), 4);
        assert!(!plain.ends_launch(4));
    }
}
