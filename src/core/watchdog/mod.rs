//! The watchdog: one thread per communicator of more than one rank, from the end of its init
//! to its destroy or abort, watching what the user's thread cannot see while it waits in a
//! collective, over the bootstrap's connections (never through the GPU):
//! - dead ranks: a peer's bootstrap connection that closes without a farewell (its process was
//!   killed or crashed, or its host answered nothing for `OXCCL_DEAD_PEER_S`,
//!   `bootstrap::socket::detect_dead_peer`), a lost-rank notice from another rank, or a
//!   failure a transport reports ([`report_peer_failure`]) gives the communicator
//!   `ncclRemoteError` naming the rank, stops its kernels and tells the other ranks;
//! - departed ranks: a peer that left in order (`ncclCommDestroy`/`ncclCommAbort`: its
//!   farewell says how far it got) fails the communicator only once this rank has work it
//!   can never complete;
//! - hangs: launched work that makes no progress for `OXCCL_HANG_REPORT_S` seconds makes the
//!   ranks compare progress and each log one WARN line (`report.rs`); `OXCCL_HANG_ERROR=1`
//!   turns the report into the communicator's error and stops its kernels;
//! - answers: it answers the other ranks' progress queries, so a rank that is not stuck, or
//!   has finished everything, still says where it is;
//! - the optional collective check (`check.rs`, `OXCCL_CHECK_COLLECTIVES=1`): runs on the
//!   caller's thread before a launch; a mismatch it finds reaches the other ranks through the
//!   watchdog (`TAG_CHECK_FAILED`), and operations waiting in it count as pending here.
//!
//! Completion is seen through the runtime's own launch events
//! (`completion.rs`), progress numbers come from `core::progress`, the messages are in
//! `wire.rs`, and when a communicator counts as stuck is `stall.rs`.

pub mod check;
pub mod completion;
pub mod report;
pub mod stall;
pub mod status;
pub mod wire;

#[cfg(test)]
mod tests;

use super::Comm;
use crate::abi::ncclResult_t;
use crate::bootstrap::link::Link;
use crate::bootstrap::peers::LinkState;
use crate::error::Error;
use crate::sched::device::GpuWait;
use parking_lot::Mutex;
use report::{Answer, CommName, Findings, Ident};
use stall::Stall;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use wire::{Departure, Farewell, Lost, OpDesc, P2pCounts, Query, RankState};

/// How often the watchdog looks (it also wakes for every message).
const TICK: Duration = Duration::from_millis(100);
/// How long a hang report waits for the other ranks' answers.
const EXCHANGE_LIMIT: Duration = Duration::from_secs(5);
/// Bound on one message to one peer.
const SEND_LIMIT: Duration = Duration::from_secs(1);
/// How long a transport's report of a peer's failure waits for the peer's farewell (sent
/// before it closes its connections) before it counts as the peer's loss.
const REPORT_GRACE: Duration = Duration::from_millis(1000);
/// How long work beyond what a departed rank completed may stay pending before it counts as
/// never completing (what this rank's marker events need to catch up).
const DEPARTURE_GRACE: Duration = Duration::from_secs(2);
/// How long launched work may still run after a peer is found gone before its kernels are
/// stopped: kernels that no longer need the peer (the last steps of a collective it already
/// finished its part of) complete meanwhile and keep their results; kernels that wait for it
/// are released.
const LOST_GRACE: Duration = Duration::from_secs(2);
/// Default of `OXCCL_HANG_REPORT_S`.
pub const DEFAULT_REPORT_S: i64 = 60;

/// The watchdog's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Seconds without progress before a hang report (`OXCCL_HANG_REPORT_S`, 0: never).
    pub report_after: Option<Duration>,
    /// Whether the report becomes the communicator's error (`OXCCL_HANG_ERROR`).
    pub hang_error: bool,
}

impl Settings {
    pub fn from_env() -> Settings {
        let secs = crate::env::registry::HANG_REPORT_S.int();
        Settings {
            report_after: (secs > 0).then(|| Duration::from_secs(secs as u64)),
            hang_error: crate::env::registry::HANG_ERROR.flag(),
        }
    }
}

/// How a communicator's completed operations are found out: polled every tick, it moves
/// `comm.progress`'s `completed` forward.
pub trait Completion {
    fn poll(&mut self, comm: &Comm);
}

/// Everything a watchdog needs, gathered at the end of its communicator's init.
pub struct Parts {
    pub link: Link,
    pub idents: Vec<Ident>,
    pub name: CommName,
    /// Makes the completion tracker on the watchdog's own thread (CUDA state is per thread).
    pub completion: Box<dyn FnOnce() -> Box<dyn Completion> + Send>,
    /// Stops the communicator's kernels.
    pub stop_kernels: Box<dyn Fn() + Send>,
    /// Reads what this rank's kernels wait for from the communicator's status page.
    pub gpu_waits: Box<dyn Fn() -> Vec<GpuWait> + Send>,
    pub settings: Settings,
}

/// A running watchdog.
struct Handle {
    stop: Arc<AtomicBool>,
    link: Link,
    thread: JoinHandle<()>,
}

/// A communicator's watchdog and what reaches it from other threads (`Comm::watch`).
#[derive(Default)]
pub struct Slot {
    handle: Mutex<Option<Handle>>,
    /// Failures transports reported: (peer, what, when).
    reports: Mutex<Vec<(i32, String, Instant)>>,
    /// The communicator's name and its ranks, for messages.
    names: Mutex<Option<(CommName, Vec<Ident>)>>,
    /// The last hang report's line (for the on-demand status and tests).
    last_report: Mutex<Option<String>>,
    /// Who waits for an on-demand status of this communicator.
    status_waiters: Mutex<Vec<std::sync::mpsc::Sender<String>>>,
    /// The collective check's operations and the signatures received (`check.rs`).
    check: Mutex<check::State>,
    /// Mismatches this rank's check found, for the watchdog to tell the other ranks.
    check_failures: Mutex<Vec<String>>,
}

impl Slot {
    /// The line of the last hang report this rank made, if any.
    pub fn last_report(&self) -> Option<String> {
        self.last_report.lock().clone()
    }

    /// What the collective check needs: the link, the communicator's name and its ranks
    /// (None while no watchdog runs).
    fn parts_for_check(&self) -> Option<(Link, CommName, Vec<Ident>)> {
        let link = self.handle.lock().as_ref()?.link.clone();
        let (name, idents) = self.names.lock().clone()?;
        Some((link, name, idents))
    }

    /// This rank's check found `what`: the watchdog fails the communicator for good and tells
    /// the other ranks.
    fn check_failed(&self, what: String) {
        self.check_failures.lock().push(what);
        if let Some(h) = self.handle.lock().as_ref() {
            h.link.wake();
        }
    }
}

/// Start `comm`'s watchdog from its runtime (a communicator of one rank needs none), and the
/// process's status endpoint with the first one.
pub fn start(comm: &Arc<Comm>) {
    if comm.nranks() < 2 {
        return;
    }
    status::serve_once();
    let parts = {
        let rt = comm.rt.lock();
        let Some(rt) = rt.as_ref() else {
            return;
        };
        let ctx = completion::SendCtx(rt.ctx);
        let abort = rt.device_abort_handle();
        let waits = rt.gpu_waits_handle();
        Parts {
            link: rt.bootstrap.link(),
            idents: rt.topo.peers.iter().map(Ident::from).collect(),
            name: CommName {
                handle: Arc::as_ptr(comm) as usize,
                hash: rt.comm_hash(),
            },
            completion: Box::new(move || completion::markers(ctx)),
            stop_kernels: Box::new(move || abort.signal()),
            gpu_waits: Box::new(move || waits.read()),
            settings: Settings::from_env(),
        }
    };
    spawn(comm, parts);
}

/// Start a watchdog for `comm` from `parts`.
pub fn spawn(comm: &Arc<Comm>, parts: Parts) {
    let stop = Arc::new(AtomicBool::new(false));
    let link = parts.link.clone();
    *comm.watch.names.lock() = Some((parts.name, parts.idents.clone()));
    let weak = Arc::downgrade(comm);
    let flag = stop.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("oxccl-watch-{}", comm.rank()))
        .spawn(move || Watch::new(weak, parts).run(&flag));
    match spawned {
        Ok(thread) => {
            *comm.watch.handle.lock() = Some(Handle { stop, link, thread });
            farewell_at_exit(comm);
        }
        Err(e) => crate::warn!(
            "rank {}: cannot start the watchdog thread ({e}): no hang reports or dead-rank \
             errors for this communicator",
            comm.rank()
        ),
    }
}

/// Stop `comm`'s watchdog and say farewell to the peers connected to this rank: an orderly
/// end, which they must not take for a death. `how` says which call ends it.
pub fn stop(comm: &Comm, how: Departure) {
    let Some(h) = comm.watch.handle.lock().take() else {
        return;
    };
    h.stop.store(true, Ordering::Release);
    h.link.wake();
    let _ = h.thread.join();
    say_farewell(comm, &h.link, how);
}

/// The farewell: how far this rank got, for each peer it is connected to.
fn say_farewell(comm: &Comm, link: &Link, how: Departure) {
    let p = &comm.progress;
    // Destroy waited for every operation; an abort or an exit ends those still running.
    let done = match how {
        Departure::Destroyed => p.enqueued(),
        Departure::Aborted | Departure::Exited => p.completed(),
    };
    let counts = p.counts_at(done).unwrap_or_default();
    let farewell_for = |peer| {
        wire::encode_farewell(&Farewell {
            reason: how,
            collectives_done: counts.collectives,
            sends_done: counts.p2p_with(peer, true),
            recvs_done: counts.p2p_with(peer, false),
        })
    };
    link.farewell(farewell_for, SEND_LIMIT);
}

/// Communicators with a watchdog, for the farewell at process exit.
static WATCHED: Mutex<Vec<Weak<Comm>>> = Mutex::new(Vec::new());

/// Say farewell for `comm` when the process exits normally while it is still live (a
/// program that ends without `ncclCommDestroy` is not a dead rank); a killed process runs
/// no exit handler, and its peers see a close without a farewell.
fn farewell_at_exit(comm: &Arc<Comm>) {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    let mut watched = WATCHED.lock();
    watched.retain(|w| w.strong_count() > 0);
    watched.push(Arc::downgrade(comm));
    REGISTERED.call_once(|| {
        // SAFETY: registers a function of this library that never unwinds (it catches
        // panics); the library is not unloaded before exit (NCCL is never dlclosed in use).
        unsafe { libc::atexit(say_farewells_at_exit) };
    });
}

extern "C" fn say_farewells_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let Some(watched) = WATCHED.try_lock() else {
            return;
        };
        for comm in watched.iter().filter_map(Weak::upgrade) {
            // Not joined: the thread may be in a send; exit ends it.
            let Some(h) = comm.watch.handle.try_lock().and_then(|mut h| h.take()) else {
                continue;
            };
            h.stop.store(true, Ordering::Release);
            say_farewell(&comm, &h.link, Departure::Exited);
        }
    });
}

/// For transports (the network proxy, for one): `peer` failed, as `what` says; `remote`:
/// the peer's end went away (its connection closed or was reset), so the peer is gone or
/// unreachable. The watchdog decides within [`REPORT_GRACE`] and a tick: a peer whose
/// farewell came meanwhile left in order (it closes its connections after its last
/// operation; a net plugin may fail a receive posted ahead for that), which is no error by
/// itself (the departed-rank rule applies); otherwise the communicator gets `ncclRemoteError`
/// naming the peer, its kernels stop and the other ranks are told. Without a watchdog the
/// error is set at once.
pub fn report_peer_failure(comm: &Comm, peer: i32, remote: bool, what: &str) {
    let watched = comm.watch.handle.lock().is_some();
    if !watched {
        let verb = if remote {
            "is gone or unreachable"
        } else {
            "failed"
        };
        let named = match comm.watch.names.lock().as_ref() {
            Some((name, idents)) => format!("{name}: {} {verb}: {what}", report::who(peer, idents)),
            None => format!("rank {peer} {verb}: {what}"),
        };
        comm.set_async_error(&Error::remote(named));
        return;
    }
    comm.watch
        .reports
        .lock()
        .push((peer, what.to_string(), Instant::now()));
    if let Some(h) = comm.watch.handle.lock().as_ref() {
        h.link.wake();
    }
}

/// [`report_peer_failure`] for a thread that holds no communicator (a transport's proxy):
/// cheap to clone, does nothing once the communicator is gone.
#[derive(Clone)]
pub struct FailureReporter(Weak<Comm>);

impl FailureReporter {
    pub fn new(comm: &Arc<Comm>) -> FailureReporter {
        FailureReporter(Arc::downgrade(comm))
    }

    pub fn report(&self, peer: i32, remote: bool, what: &str) {
        if let Some(comm) = self.0.upgrade() {
            report_peer_failure(&comm, peer, remote, what);
        }
    }
}

/// The status of every communicator of this process with a watchdog, each as its rank here
/// sees all of its ranks (asked of every rank within `limit`).
pub fn status_report(limit: Duration) -> String {
    let comms: Vec<Arc<Comm>> = WATCHED.lock().iter().filter_map(Weak::upgrade).collect();
    let mut asked = Vec::new();
    for comm in &comms {
        if let Some(h) = comm.watch.handle.lock().as_ref() {
            let (tx, rx) = std::sync::mpsc::channel();
            comm.watch.status_waiters.lock().push(tx);
            h.link.wake();
            asked.push((comm.clone(), rx));
        }
    }
    let deadline = Instant::now() + limit;
    let mut out = String::new();
    for (comm, rx) in asked {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(text) => out.push_str(&text),
            Err(_) => out.push_str(&format!(
                "comm {:p} rank {}: no status within {} s\n",
                Arc::as_ptr(&comm),
                comm.rank(),
                limit.as_secs()
            )),
        }
    }
    out
}

/// A progress exchange under way: the query sent and the answers so far, by rank.
struct Exchange {
    round: u64,
    started: Instant,
    query: Query,
    mine: RankState,
    stuck: Duration,
    answers: Vec<Option<Answer>>,
    /// Whether this is the second round of a hang report.
    refined: bool,
    /// Whether this rank's operation waits in the collective check (not launched yet).
    in_check: bool,
}

impl Exchange {
    fn status(&self) -> bool {
        self.query.status
    }
}

/// What a peer's connection says about it.
enum PeerEnd {
    Here,
    Left(Farewell, Option<Instant>),
    Lost(String),
}

/// The watchdog thread's state.
struct Watch {
    comm: Weak<Comm>,
    link: Link,
    idents: Vec<Ident>,
    name: CommName,
    make_completion: Option<Box<dyn FnOnce() -> Box<dyn Completion> + Send>>,
    stop_kernels: Box<dyn Fn() + Send>,
    gpu_waits: Box<dyn Fn() -> Vec<GpuWait> + Send>,
    settings: Settings,
    me: i32,
    nranks: i32,
    stall: Stall,
    stuck: Option<Duration>,
    ends: Vec<PeerEnd>,
    exchange: Option<Exchange>,
    round: u64,
    failed: bool,
    /// When the kernels are to be stopped if work is still pending (after a lost peer).
    abort_due: Option<Instant>,
    /// The operation the last "behind" line was about (one line per stuck operation).
    behind_logged: Option<OpDesc>,
    /// The GPU's waits while no pending operation accounts for them (`check_gpu_waits`).
    gpu_only: Option<GpuOnlyWait>,
    last_full_tick: Instant,
}

/// The same wait entries seen since `since` with no operation pending, and whether they were
/// reported.
struct GpuOnlyWait {
    waits: Vec<GpuWait>,
    since: Instant,
    reported: bool,
}

impl Watch {
    fn new(comm: Weak<Comm>, parts: Parts) -> Watch {
        let (me, nranks) = (parts.link.rank(), parts.link.nranks());
        let now = Instant::now();
        Watch {
            comm,
            link: parts.link,
            idents: parts.idents,
            name: parts.name,
            make_completion: Some(parts.completion),
            stop_kernels: parts.stop_kernels,
            gpu_waits: parts.gpu_waits,
            settings: parts.settings,
            me,
            nranks,
            stall: Stall::new(now),
            stuck: None,
            ends: (0..nranks).map(|_| PeerEnd::Here).collect(),
            exchange: None,
            round: 0,
            failed: false,
            abort_due: None,
            behind_logged: None,
            gpu_only: None,
            last_full_tick: now - TICK,
        }
    }

    fn run(mut self, stop: &AtomicBool) {
        let mut completion = (self.make_completion.take().expect("made once"))();
        while !stop.load(Ordering::Acquire) {
            let Some(comm) = self.comm.upgrade() else {
                return;
            };
            self.handle_messages(&comm);
            if self.last_full_tick.elapsed() >= TICK {
                self.last_full_tick = Instant::now();
                self.check_links(&comm);
                self.check_reports(&comm);
                self.check_departed(&comm);
                completion.poll(&comm);
                self.check_abort_due(&comm);
                self.check_stall(&comm);
                self.check_gpu_waits(&comm);
                self.check_status_request(&comm);
                self.continue_exchange(&comm);
            }
            drop(comm);
            self.link.wait(TICK);
        }
        // The last word on what completed, for the farewell.
        if let Some(comm) = self.comm.upgrade() {
            completion.poll(&comm);
        }
    }

    fn others(&self) -> impl Iterator<Item = i32> {
        let me = self.me;
        (0..self.nranks).filter(move |&r| r != me)
    }

    fn who(&self, rank: i32) -> String {
        report::who(rank, &self.idents)
    }

    /// The communicator failed: its error (the first wins) and one WARN line; its kernels are
    /// stopped now (`stop_now`) or, if work is still pending then, after [`LOST_GRACE`].
    fn fail(&mut self, comm: &Comm, err: Error, stop_now: bool) {
        comm.set_async_error(&err);
        if !std::mem::replace(&mut self.failed, true) {
            crate::warn!("{}", err.msg);
        }
        if stop_now {
            self.abort_due = None;
            (self.stop_kernels)();
        } else if self.abort_due.is_none() {
            self.abort_due = Some(Instant::now() + LOST_GRACE);
        }
    }

    /// Stop the kernels once the grace after a failure has passed, if work is still pending.
    fn check_abort_due(&mut self, comm: &Comm) {
        let Some(due) = self.abort_due else {
            return;
        };
        let p = &comm.progress;
        if Instant::now() >= due && p.completed() < p.launched() {
            self.abort_due = None;
            (self.stop_kernels)();
        }
    }

    /// `peer` is gone (`why`); unless the news came from another rank, tell the others.
    fn peer_lost(&mut self, comm: &Comm, peer: i32, why: String, relay: bool) {
        if matches!(self.ends[peer as usize], PeerEnd::Lost(_)) {
            return;
        }
        self.ends[peer as usize] = PeerEnd::Lost(why.clone());
        let msg = format!("{}: {} is gone: {why}", self.name, self.who(peer));
        self.fail(comm, Error::remote(msg), false);
        if relay {
            let news = wire::encode_lost(&Lost { rank: peer, why });
            let targets: Vec<i32> = self.others().filter(|&r| r != peer).collect();
            for r in targets {
                if matches!(self.ends[r as usize], PeerEnd::Here) {
                    let _ = self.link.send(r, wire::TAG_LOST, &news, SEND_LIMIT);
                }
            }
        }
    }

    fn handle_messages(&mut self, comm: &Comm) {
        while let Some((peer, tag, payload)) = self.link.take() {
            match tag {
                wire::TAG_QUERY => match wire::decode_query(&payload) {
                    Some(q) => self.answer(comm, peer, &q),
                    None => self.malformed(peer, "progress query"),
                },
                wire::TAG_REPLY => match wire::decode_reply(&payload) {
                    Some((round, state)) => self.take_reply(peer, round, state),
                    None => self.malformed(peer, "progress answer"),
                },
                wire::TAG_LOST => match wire::decode_lost(&payload) {
                    Some(l) if (0..self.nranks).contains(&l.rank) && l.rank != self.me => {
                        let why = format!("{} (noticed by rank {peer})", l.why);
                        self.peer_lost(comm, l.rank, why, false);
                    }
                    _ => self.malformed(peer, "lost-rank notice"),
                },
                wire::TAG_CHECK_FAILED => match wire::decode_check_failed(&payload) {
                    Some(what) => self.check_failed_there(comm, peer, what),
                    None => self.malformed(peer, "failed-check notice"),
                },
                _ => self.malformed(peer, "watchdog message"),
            }
        }
    }

    fn malformed(&self, peer: i32, what: &str) {
        crate::warn!(
            "{} rank {}: ignored a malformed {what} from rank {peer} (another version of the \
             library?)",
            self.name,
            self.me
        );
    }

    fn take_reply(&mut self, peer: i32, round: u64, state: RankState) {
        if let Some(ex) = self.exchange.as_mut() {
            if ex.round == round && state.rank == peer {
                ex.answers[peer as usize] = Some(Answer::State(state));
            }
        }
    }

    /// Tell `asker` where this rank is; if this rank is not stuck itself, say once why the
    /// asker waits on it.
    fn answer(&mut self, comm: &Comm, asker: i32, q: &Query) {
        let state = self.state_for(comm, asker, q.waiting.as_ref());
        let reply = wire::encode_reply(q.round, &state);
        let _ = self.link.send(asker, wire::TAG_REPLY, &reply, SEND_LIMIT);
        if self.behind_logged.is_some() && self.behind_logged == q.waiting {
            return;
        }
        let line = report::behind_report(self.name, self.me, &self.idents, &state, asker, q);
        if let Some((line, called_otherwise)) = line {
            // A rank with pending work of its own reports it itself when its time comes;
            // but under OXCCL_HANG_ERROR one that called something else fails at once, since
            // the others, failing on the mismatch, may be gone before its own report is due
            // (a culprit waiting on the host for connections its call needs).
            if self.stuck.is_some() && !(called_otherwise && self.settings.hang_error) {
                return;
            }
            self.behind_logged = q.waiting;
            *comm.watch.last_report.lock() = Some(line.clone());
            // Called something else: under OXCCL_HANG_ERROR this side fails too (a rank that
            // only has not got there yet may still do so).
            if self.settings.hang_error && called_otherwise {
                self.fail(comm, Error::remote(line), true);
            } else {
                crate::warn!("{line}");
            }
        }
    }

    /// This rank's progress, for `asker` (whose operation `asked` is).
    fn state_for(&self, comm: &Comm, asker: i32, asked: Option<&OpDesc>) -> RankState {
        let p = &comm.progress;
        let enqueued = p.enqueued();
        let launched = p.handed_over().min(enqueued);
        let completed = p.completed().min(launched);
        let now = p.counts_at(enqueued).unwrap_or_default();
        let done = p.counts_at(completed);
        let known = |f: &dyn Fn(&super::progress::Counts) -> u64| done.as_ref().map_or(u64::MAX, f);
        let desc = |r: super::progress::OpRecord| OpDesc::from(&r);
        let waiting = (completed < launched)
            .then(|| p.by_ordinal(completed + 1))
            .flatten()
            .map(desc);
        let asked = asked.and_then(|w| match w.kind {
            crate::sched::CollKind::Send => p.p2p(asker, false, w.seq),
            crate::sched::CollKind::Recv => p.p2p(asker, true, w.seq),
            _ => p.collective(w.seq),
        });
        RankState {
            rank: self.me,
            enqueued,
            launched,
            completed,
            collectives: now.collectives,
            collectives_done: known(&|c| c.collectives),
            last_collective: p.newest_upto(enqueued, |r| !r.is_p2p()).map(desc),
            last_collective_done: p.newest_upto(completed, |r| !r.is_p2p()).map(desc),
            waiting,
            stalled_s: self.stuck.map_or(0, |d| d.as_secs() as u32),
            asked: asked.map(desc),
            p2p: P2pCounts {
                sends: now.p2p_with(asker, true),
                sends_done: known(&|c| c.p2p_with(asker, true)),
                recvs: now.p2p_with(asker, false),
                recvs_done: known(&|c| c.p2p_with(asker, false)),
            },
        }
    }

    /// Peers whose connection to this rank ended: in order (a farewell) or not (gone).
    fn check_links(&mut self, comm: &Comm) {
        for peer in self.others().collect::<Vec<_>>() {
            if !matches!(self.ends[peer as usize], PeerEnd::Here) {
                continue;
            }
            let LinkState::Closed { farewell } = self.link.state(peer) else {
                continue;
            };
            match farewell.as_deref().map(wire::decode_farewell) {
                Some(Some(f)) => {
                    crate::info!(
                        INIT,
                        "{} rank {}: rank {peer} left ({}) after completing {} collective(s)",
                        self.name,
                        self.me,
                        f.reason.call(),
                        f.collectives_done
                    );
                    self.ends[peer as usize] = PeerEnd::Left(f, None);
                }
                Some(None) => {
                    let why = "it closed its bootstrap connection after a malformed farewell";
                    self.peer_lost(comm, peer, why.into(), true);
                }
                None => {
                    let why = self.why_closed(peer);
                    self.peer_lost(comm, peer, why, true);
                }
            }
        }
    }

    /// Why a peer's connection closed without a farewell.
    fn why_closed(&self, peer: i32) -> String {
        match self.link.remote_failure() {
            Some((who, msg)) if who == peer => format!("it failed: {msg}"),
            _ => format!(
                "its bootstrap connection to rank {} closed without a goodbye (the process was \
                 killed or crashed, or ended without running its exit handlers)",
                self.me
            ),
        }
    }

    fn check_reports(&mut self, comm: &Comm) {
        let mismatches = std::mem::take(&mut *comm.watch.check_failures.lock());
        for what in mismatches {
            self.check_failed_here(what);
        }
        let due: Vec<(i32, String, Instant)> = {
            let mut reports = comm.watch.reports.lock();
            let (due, young) = reports
                .drain(..)
                .partition(|(_, _, at)| at.elapsed() >= REPORT_GRACE);
            *reports = young;
            due
        };
        for (peer, what, _) in due {
            if !(0..self.nranks).contains(&peer) || peer == self.me {
                (self.stop_kernels)();
                continue;
            }
            match &self.ends[peer as usize] {
                PeerEnd::Here => {
                    let why = format!("{what} (reported by rank {}'s transport)", self.me);
                    self.peer_lost(comm, peer, why, true);
                }
                PeerEnd::Left(..) => crate::info!(
                    NET,
                    "{} rank {}: rank {peer} left in order; then: {what}",
                    self.name,
                    self.me
                ),
                PeerEnd::Lost(_) => {}
            }
        }
    }

    /// This rank's collective check found `what` (the caller's thread has set the error and
    /// logged it): no more reports; kernels still running after the grace are stopped; the
    /// other ranks are told, so that one whose own check passed does not wait forever.
    fn check_failed_here(&mut self, what: String) {
        self.failed = true;
        if self.abort_due.is_none() {
            self.abort_due = Some(Instant::now() + LOST_GRACE);
        }
        let notice = wire::encode_check_failed(&what);
        for r in self.others().collect::<Vec<_>>() {
            if matches!(self.ends[r as usize], PeerEnd::Here) {
                let _ = self
                    .link
                    .send(r, wire::TAG_CHECK_FAILED, &notice, SEND_LIMIT);
            }
        }
    }

    /// Another rank's collective check found `what`: this rank's communicator fails too.
    fn check_failed_there(&mut self, comm: &Comm, peer: i32, what: String) {
        let msg = format!(
            "{} {}: the collective check ({}=1) of {} found {what}; the communicator is failed",
            self.name,
            self.who(self.me),
            check::SETTING,
            self.who(peer)
        );
        self.fail(comm, Error::invalid_usage(msg), false);
    }

    /// A departed rank: this rank's work beyond what it completed can never complete.
    fn check_departed(&mut self, comm: &Comm) {
        let p = &comm.progress;
        let now = p.counts_at(p.enqueued()).unwrap_or_default();
        let done = p.counts_at(p.completed()).unwrap_or_default();
        let mut failure = None;
        for peer in self.others() {
            let PeerEnd::Left(f, since) = &mut self.ends[peer as usize] else {
                continue;
            };
            let beyond = |mine: u64, mine_done: u64, theirs: u64| mine > mine_done.max(theirs);
            let stranded = if beyond(now.collectives, done.collectives, f.collectives_done) {
                p.collective(f.collectives_done.max(done.collectives) + 1)
            } else if beyond(
                now.p2p_with(peer, true),
                done.p2p_with(peer, true),
                f.recvs_done,
            ) {
                p.p2p(peer, true, f.recvs_done.max(done.p2p_with(peer, true)) + 1)
            } else if beyond(
                now.p2p_with(peer, false),
                done.p2p_with(peer, false),
                f.sends_done,
            ) {
                p.p2p(
                    peer,
                    false,
                    f.sends_done.max(done.p2p_with(peer, false)) + 1,
                )
            } else {
                *since = None;
                continue;
            };
            let first = *since.get_or_insert_with(Instant::now);
            if first.elapsed() >= DEPARTURE_GRACE && failure.is_none() {
                let what =
                    stranded.map_or("an operation".into(), |r| report::describe(&(&r).into()));
                failure = Some(format!(
                    "{}: {} left ({}) after completing {} collective(s), but rank {} has \
                     enqueued {what}, which can never complete",
                    self.name,
                    report::who(peer, &self.idents),
                    f.reason.call(),
                    f.collectives_done,
                    self.me
                ));
            }
        }
        if let Some(msg) = failure {
            self.fail(comm, Error::remote(msg), true);
        }
    }

    fn check_stall(&mut self, comm: &Comm) {
        let p = &comm.progress;
        let launched = p.handed_over();
        self.stuck = self
            .stall
            .update(Instant::now(), launched, p.completed().min(launched));
        let Some(after) = self.settings.report_after else {
            return;
        };
        if self.exchange.is_none() && !self.failed && self.stall.report_due(self.stuck, after) {
            self.stall.reported();
            self.start_exchange(comm, false);
        }
    }

    /// Kernels this rank's counters do not know of (a CUDA graph's replays) can hang too: when
    /// no operation is pending but the GPU's wait entries stay the same for the report delay,
    /// log once what they wait for, from whom (the hang report's clause). Nothing is compared
    /// with the other ranks (they may not know of the work either), and the communicator does
    /// not fail.
    fn check_gpu_waits(&mut self, comm: &Comm) {
        let Some(after) = self.settings.report_after else {
            return;
        };
        if self.stuck.is_some() || self.failed {
            self.gpu_only = None;
            return;
        }
        let waits = (self.gpu_waits)();
        if waits.is_empty() {
            self.gpu_only = None;
            return;
        }
        let same = self.gpu_only.as_ref().is_some_and(|g| g.waits == waits);
        if !same {
            self.gpu_only = Some(GpuOnlyWait {
                waits,
                since: Instant::now(),
                reported: false,
            });
            return;
        }
        let g = self.gpu_only.as_mut().expect("seen");
        let waited = g.since.elapsed();
        if g.reported || waited < after {
            return;
        }
        g.reported = true;
        if let Some(line) =
            report::gpu_wait_report(self.name, self.me, &self.idents, waited, &g.waits)
        {
            *comm.watch.last_report.lock() = Some(line.clone());
            crate::warn!("{line}");
        }
    }

    /// Someone asked for this communicator's status (`status_report`).
    fn check_status_request(&mut self, comm: &Comm) {
        if self.exchange.is_none() && !comm.watch.status_waiters.lock().is_empty() {
            self.start_exchange(comm, true);
        }
    }

    /// Ask every other rank where it is (those known gone or departed answer for themselves):
    /// for a hang report, or for a status (`status`).
    fn start_exchange(&mut self, comm: &Comm, status: bool) {
        let waiting = self.state_for(comm, self.me, None).waiting;
        if waiting.is_none() && !status {
            return;
        }
        self.start_round(comm, waiting, status, false);
    }

    /// One round of questions about `waiting`; `refined`: the second round of a hang report,
    /// about the operation the first round's answers showed this rank waits in.
    fn start_round(&mut self, comm: &Comm, waiting: Option<OpDesc>, status: bool, refined: bool) {
        let mut mine = self.state_for(comm, self.me, waiting.as_ref());
        if !status {
            mine.waiting = waiting;
        }
        self.round += 1;
        let stuck = self.stuck.unwrap_or_default();
        let query = Query {
            round: self.round,
            waiting,
            stalled_s: stuck.as_secs() as u32,
            status,
        };
        let encoded = wire::encode_query(&query);
        let mut answers: Vec<Option<Answer>> = (0..self.nranks).map(|_| None).collect();
        for peer in self.others() {
            answers[peer as usize] = match &self.ends[peer as usize] {
                PeerEnd::Left(f, _) => Some(Answer::Left(f.clone())),
                PeerEnd::Lost(why) => Some(Answer::Lost(why.clone())),
                PeerEnd::Here => self
                    .link
                    .send(peer, wire::TAG_QUERY, &encoded, SEND_LIMIT)
                    .err()
                    .map(|e| Answer::Silent(format!("the query could not be sent: {}", e.msg))),
            };
        }
        self.exchange = Some(Exchange {
            round: self.round,
            started: Instant::now(),
            query,
            mine,
            stuck,
            answers,
            refined,
            in_check: comm.progress.in_check(),
        });
    }

    /// The collective this rank really waits in, when the answers show it is a later one than
    /// its own view (launches that finished between two of its looks count as pending until
    /// a later marker completes): every collective another rank completed, every rank took
    /// part in, so this rank's copy completes too.
    fn refined_waiting(
        &self,
        comm: &Comm,
        mine: &RankState,
        answers: &[(i32, Answer)],
    ) -> Option<OpDesc> {
        let w = mine.waiting.filter(|w| {
            !matches!(
                w.kind,
                crate::sched::CollKind::Send | crate::sched::CollKind::Recv
            )
        })?;
        let others_done = answers
            .iter()
            .filter_map(|(_, a)| match a {
                Answer::State(s) if s.collectives_done != u64::MAX => Some(s.collectives_done),
                _ => None,
            })
            .max()?;
        // A rank that completed its own, different call under the number this rank is stuck
        // in does not move it past its last enqueued collective.
        let target = (others_done + 1).min(mine.collectives);
        if target <= w.seq {
            return None;
        }
        comm.progress.collective(target).map(|r| OpDesc::from(&r))
    }

    /// Once every rank answered, or the limit passed: the report.
    fn continue_exchange(&mut self, comm: &Comm) {
        let me = self.me as usize;
        let Some(ex) = self.exchange.as_ref() else {
            return;
        };
        let all_in = ex
            .answers
            .iter()
            .enumerate()
            .all(|(r, a)| r == me || a.is_some());
        if !all_in && ex.started.elapsed() < EXCHANGE_LIMIT {
            return;
        }
        let ex = self.exchange.take().expect("checked above");
        let status = ex.status();
        let silent = || Answer::Silent(format!("none within {} s", EXCHANGE_LIMIT.as_secs()));
        let answers: Vec<(i32, Answer)> = ex
            .answers
            .into_iter()
            .enumerate()
            .filter(|(r, _)| *r != me)
            .map(|(r, a)| (r as i32, a.unwrap_or_else(silent)))
            .collect();
        if !status && !ex.refined {
            if let Some(better) = self.refined_waiting(comm, &ex.mine, &answers) {
                self.start_round(comm, Some(better), false, true);
                return;
            }
        }
        if status {
            let mut text =
                report::status_text(self.name, self.me, &self.idents, &ex.mine, &answers);
            if let Some(line) = comm.watch.last_report() {
                text.push_str(&format!("  last report: {line}\n"));
            }
            for waiter in comm.watch.status_waiters.lock().drain(..) {
                let _ = waiter.send(text.clone());
            }
            return;
        }
        let gpu_waits = (self.gpu_waits)();
        let verdict = report::hang_report(&Findings {
            name: self.name,
            me: self.me,
            idents: &self.idents,
            mine: &ex.mine,
            stuck: ex.stuck,
            answers: &answers,
            in_check: ex.in_check,
            gpu_waits: &gpu_waits,
        });
        debug_assert_eq!(ex.query.round, ex.round);
        *comm.watch.last_report.lock() = Some(verdict.line.clone());
        // One line: as the failure's own WARN line under OXCCL_HANG_ERROR.
        if !self.settings.hang_error {
            crate::warn!("{}", verdict.line);
        } else {
            let code = if verdict.blames_others {
                ncclResult_t::ncclRemoteError
            } else {
                ncclResult_t::ncclInternalError
            };
            self.fail(comm, Error::new(code, verdict.line), true);
        }
    }
}
