//! The optional collective check (`OXCCL_CHECK_COLLECTIVES=1`, off by default):
//! before a group's work for a communicator is launched, its ranks compare the signatures of
//! the operations they are about to run, over the bootstrap (never through the GPU).
//!
//! Every operation is noted when it is numbered (`note`, from enqueue, no-ops included, so
//! every rank numbers and checks the same calls). At the group's end (`run`), each rank sends
//! the signature (kind, number, count, type, reduction, root) of each collective noted since
//! its last check to every other rank, and of each send or receive to its peer; then it waits
//! until it has, for each of its operations, what the other side called under the same number
//! (collective #n from every rank; for send #k to q, q's receive #k from this rank, and the
//! other way round), and compares. Signatures travel as messages of their own kind, in the
//! order sent, and are kept until used, so ranks that group their calls differently still meet
//! (a peer's later operations wait for this rank's later check).
//!
//! A mismatch fails the call on every rank that sees it with `ncclInvalidUsage` and the words
//! the hang report uses ("rank 2 called ncclAllGather #57 (1024 × float) where ranks 0,1,3
//! called ncclAllReduce #57 (4096 × float)"); nothing of the group is launched on that
//! communicator, which is failed (its async error): the watchdog tells the other ranks, whose
//! communicator fails too, so a peer whose own check passed (the other side of a send in a
//! group that failed elsewhere) does not wait forever. The other communicators of the group
//! launch as usual.
//!
//! The wait is the collective's own wait moved to the host: while operations wait in the check
//! the watchdog counts them as handed over, so a rank that never calls is named by the usual
//! hang report after `OXCCL_HANG_REPORT_S` (and fails it under `OXCCL_HANG_ERROR=1`); a dead
//! or departed rank fails the communicator as usual, and `ncclCommAbort` from another thread
//! ends the wait. Each of these ends the check with the communicator's error.

use super::report::{self, CommName, Ident};
use super::wire::{self, OpDesc};
use crate::bootstrap::link::Link;
use crate::core::Comm;
use crate::error::{Error, Result};
use crate::sched::CollKind;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The setting's name, for messages.
pub const SETTING: &str = crate::env::registry::CHECK_COLLECTIVES.name;
/// Bound on sending one message of the check to one peer.
const SEND_LIMIT: Duration = Duration::from_secs(5);
/// How long one receive waits before the wait looks at the communicator's state again.
const SLICE: Duration = Duration::from_millis(50);
/// After a peer's connection closed: how long the check waits for the watchdog to name the
/// cause (a dead or departed rank) before failing with the connection's own error.
const CAUSE_WAIT: Duration = Duration::from_secs(4);
/// Most signatures kept from peers, unused (a broken peer cannot fill the memory).
const MAX_KEPT: usize = 1 << 20;

/// NVIDIA's `NCCL_CHECK_MODE`: `DEBUG_LOCAL` checks each call's buffers with the driver,
/// `DEBUG_GLOBAL` also compares the calls of every rank (here: the collective check);
/// `NCCL_CHECK_POINTERS=1`, its older form, is `DEBUG_LOCAL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Default,
    Local,
    Global,
}

/// The mode of `NCCL_CHECK_MODE` (case-insensitive) over `NCCL_CHECK_POINTERS`.
pub fn parse_mode(check_mode: Option<&str>, check_pointers: bool) -> Mode {
    match check_mode.map(str::trim) {
        Some(m) if m.eq_ignore_ascii_case("DEBUG_GLOBAL") => Mode::Global,
        Some(m) if m.eq_ignore_ascii_case("DEBUG_LOCAL") => Mode::Local,
        _ if check_pointers => Mode::Local,
        _ => Mode::Default,
    }
}

static MODE: crate::env::Cached<Mode> = crate::env::Cached::new(|| {
    use crate::env::registry as reg;
    parse_mode(reg::CHECK_MODE.get().as_deref(), reg::CHECK_POINTERS.flag())
});

/// The check mode in force.
pub fn mode() -> Mode {
    MODE.get()
}

static ENABLED: crate::env::Cached<bool> = crate::env::Cached::new(|| {
    crate::env::registry::CHECK_COLLECTIVES.flag() || mode() == Mode::Global
});

/// Whether the collective check is on: `OXCCL_CHECK_COLLECTIVES=1` or
/// `NCCL_CHECK_MODE=DEBUG_GLOBAL`.
pub fn enabled() -> bool {
    #[cfg(test)]
    if FORCED.load(std::sync::atomic::Ordering::Acquire) {
        return true;
    }
    ENABLED.get()
}

/// For tests that go through enqueue: the check on without the variable.
#[cfg(test)]
pub static FORCED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What the other side of one operation called, filed by the rank that sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    /// Its collective #n.
    Coll(u64),
    /// Its send #k to this rank.
    SendHere(u64),
    /// Its receive #k from this rank.
    RecvHere(u64),
}

/// A communicator's check between calls.
#[derive(Default)]
pub struct State {
    /// Operations numbered since the last check, in order.
    unchecked: Vec<OpDesc>,
    /// Signatures received and not yet compared: by (sender, what).
    received: HashMap<(i32, Key), OpDesc>,
}

/// Note an operation `comm` numbered (with its number), for its next check.
pub fn note(comm: &Comm, op: OpDesc) {
    comm.watch.check.lock().unchecked.push(op);
}

/// Whether `comm` has operations waiting for a check.
pub fn pending(comm: &Comm) -> bool {
    !comm.watch.check.lock().unchecked.is_empty()
}

/// Check the operations each communicator numbered since its last check against its other
/// ranks' (all sends first, then the waits, so one thread may drive several ranks); one result
/// per communicator, in order.
pub fn run(comms: &[Arc<Comm>]) -> Vec<Result<()>> {
    let started: Vec<Result<Option<Round>>> = comms.iter().map(Round::start).collect();
    comms
        .iter()
        .zip(started)
        .map(|(comm, round)| {
            let outcome = match round {
                Ok(None) => return Ok(()),
                Ok(Some(round)) => round.finish(comm),
                Err(e) => Err(e),
            };
            comm.progress.set_checking(None);
            outcome.inspect_err(|e| failed(comm, e))
        })
        .collect()
}

/// A failed check fails the communicator (unless it is being aborted, or already failed).
fn failed(comm: &Comm, e: &Error) {
    if !comm.aborted() {
        comm.set_async_error(e);
    }
}

/// What a signature says, from the receiving rank `me`'s side; None if it cannot be one (a
/// send or receive that does not involve `me`, a collective numbered 0).
fn key_of(op: &OpDesc, me: i32) -> Option<Key> {
    match op.kind {
        CollKind::Send if op.root == me => Some(Key::SendHere(op.seq)),
        CollKind::Recv if op.root == me => Some(Key::RecvHere(op.seq)),
        CollKind::Send | CollKind::Recv => None,
        _ if op.seq == 0 => None,
        _ => Some(Key::Coll(op.seq)),
    }
}

fn is_p2p(op: &OpDesc) -> bool {
    matches!(op.kind, CollKind::Send | CollKind::Recv)
}

/// One communicator's check under way: its operations sent, their counterparts awaited.
struct Round {
    link: Link,
    name: CommName,
    idents: Vec<Ident>,
    me: i32,
    nranks: i32,
    ops: Vec<OpDesc>,
}

/// Where a round stands.
enum Verdict {
    /// Every operation has its counterparts, and they agree.
    Agreed,
    /// What disagrees, in the words of the hang report.
    Mismatch(Vec<String>),
    /// Something is still to come from this rank.
    Waiting(i32),
}

impl Round {
    /// Take `comm`'s unchecked operations and send their signatures (None: nothing to check,
    /// or no check possible: one rank, no watchdog).
    fn start(comm: &Arc<Comm>) -> Result<Option<Round>> {
        let ops = std::mem::take(&mut comm.watch.check.lock().unchecked);
        if ops.is_empty() || comm.nranks() < 2 {
            return Ok(None);
        }
        comm.check_usable()?;
        let Some((link, name, idents)) = comm.watch.parts_for_check() else {
            // Not initialised yet: the launch fails on its own.
            if !comm.is_ready() {
                return Ok(None);
            }
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                crate::warn!(
                    "rank {}: {SETTING}=1 but this communicator has no watchdog: its \
                     operations are not checked",
                    comm.rank()
                )
            });
            return Ok(None);
        };
        let round = Round {
            me: link.rank(),
            nranks: link.nranks(),
            link,
            name,
            idents,
            ops,
        };
        comm.progress.set_checking(Some(comm.progress.enqueued()));
        for peer in (0..round.nranks).filter(|&p| p != round.me) {
            let mine: Vec<OpDesc> = round
                .ops
                .iter()
                .filter(|op| !is_p2p(op) || op.root == peer)
                .copied()
                .collect();
            for chunk in mine.chunks(wire::MAX_SIGNATURES) {
                let msg = wire::encode_signatures(chunk);
                if let Err(e) = round.link.send_check(peer, &msg, SEND_LIMIT, &comm.abort) {
                    comm.progress.set_checking(None);
                    return Err(round.peer_trouble(comm, peer, e));
                }
            }
        }
        Ok(Some(round))
    }

    fn head(&self) -> String {
        format!("{} {}", self.name, report::who(self.me, &self.idents))
    }

    /// Wait for the counterparts and compare.
    fn finish(self, comm: &Comm) -> Result<()> {
        loop {
            let peer = match self.verdict(comm) {
                Verdict::Agreed => {
                    self.forget_used(comm);
                    return Ok(());
                }
                Verdict::Mismatch(found) => return Err(self.mismatch(comm, &found)),
                Verdict::Waiting(peer) => peer,
            };
            self.check_live(comm)?;
            match self.link.recv_check(peer, SLICE, &comm.abort) {
                Ok(Some(msg)) => self.file(comm, peer, &msg)?,
                Ok(None) => {}
                Err(_) if comm.aborted() => {}
                Err(e) => return Err(self.peer_trouble(comm, peer, e)),
            }
        }
    }

    /// Fail if the communicator was aborted or failed meanwhile (a dead or departed rank, a
    /// hang report under `OXCCL_HANG_ERROR=1`, another rank's failed check).
    fn check_live(&self, comm: &Comm) -> Result<()> {
        if comm.aborted() {
            return Err(Error::invalid_usage(format!(
                "{}: the communicator was aborted while this rank waited in the collective \
                 check ({SETTING}=1)",
                self.head()
            )));
        }
        match comm.async_error() {
            crate::abi::ncclResult_t::ncclSuccess | crate::abi::ncclResult_t::ncclInProgress => {
                Ok(())
            }
            code => Err(Error::new(
                code,
                comm.async_message()
                    .unwrap_or_else(|| "the communicator failed".into()),
            )),
        }
    }

    /// A peer's connection failed: the communicator's error as the watchdog names it (a dead
    /// or departed rank) if it comes soon, else this one.
    fn peer_trouble(&self, comm: &Comm, peer: i32, e: Error) -> Error {
        let until = Instant::now() + CAUSE_WAIT;
        while Instant::now() < until {
            if let Err(named) = self.check_live(comm) {
                return named;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Error::remote(format!(
            "{}: the collective check ({SETTING}=1) lost {}: {}",
            self.head(),
            report::who(peer, &self.idents),
            e.msg
        ))
    }

    /// Keep what `peer` sent.
    fn file(&self, comm: &Comm, peer: i32, msg: &[u8]) -> Result<()> {
        let malformed = |why: &str| {
            Error::internal(format!(
                "{}: a malformed collective-check message from rank {peer} ({why}; another \
                 version of the library?)",
                self.head()
            ))
        };
        let ops = wire::decode_signatures(msg).ok_or_else(|| malformed("undecodable"))?;
        let mut state = comm.watch.check.lock();
        for op in ops {
            let key = key_of(&op, self.me).ok_or_else(|| malformed("not for this rank"))?;
            if state.received.len() >= MAX_KEPT {
                return Err(malformed("too many signatures unused"));
            }
            if state.received.insert((peer, key), op).is_some() {
                return Err(malformed("the same operation twice"));
            }
        }
        Ok(())
    }

    /// What each of this rank's operations needs from others: (rank, what).
    fn needs(&self, op: &OpDesc) -> Vec<(i32, Key)> {
        match op.kind {
            CollKind::Send if op.root != self.me => vec![(op.root, Key::RecvHere(op.seq))],
            CollKind::Recv if op.root != self.me => vec![(op.root, Key::SendHere(op.seq))],
            // To itself: compared with its own other side below, when that is in the same
            // round (it must be, or the transfer could never run).
            CollKind::Send | CollKind::Recv => Vec::new(),
            _ => (0..self.nranks)
                .filter(|&p| p != self.me)
                .map(|p| (p, Key::Coll(op.seq)))
                .collect(),
        }
    }

    fn verdict(&self, comm: &Comm) -> Verdict {
        let state = comm.watch.check.lock();
        let mut found = Vec::new();
        let mut waiting = None;
        for op in &self.ops {
            let needs = self.needs(op);
            let got: Vec<(i32, OpDesc)> = needs
                .iter()
                .filter_map(|k| state.received.get(k).map(|d| (k.0, *d)))
                .collect();
            if got.len() < needs.len() {
                if waiting.is_none() {
                    waiting = needs
                        .iter()
                        .find(|k| !state.received.contains_key(k))
                        .map(|k| k.0);
                }
                continue;
            }
            let mut callers = vec![(self.me, *op)];
            callers.extend(got);
            if is_p2p(op) && op.root == self.me {
                if let Some(other) = self.own_other_side(op) {
                    callers.push((self.me, other));
                }
            }
            if let Some(text) = report::mismatch_text(&callers) {
                // A send to itself and its receive meet twice (once from each side).
                if !found.contains(&text) {
                    found.push(text);
                }
            }
        }
        if !found.is_empty() {
            Verdict::Mismatch(found)
        } else if let Some(peer) = waiting {
            Verdict::Waiting(peer)
        } else {
            Verdict::Agreed
        }
    }

    /// The other side of a send to or receive from this rank itself, in this round.
    fn own_other_side(&self, op: &OpDesc) -> Option<OpDesc> {
        let want = match op.kind {
            CollKind::Send => CollKind::Recv,
            _ => CollKind::Send,
        };
        self.ops
            .iter()
            .find(|o| o.kind == want && o.root == self.me && o.seq == op.seq)
            .copied()
    }

    /// Drop the counterparts this round used.
    fn forget_used(&self, comm: &Comm) {
        let mut state = comm.watch.check.lock();
        for op in &self.ops {
            for k in self.needs(op) {
                state.received.remove(&k);
            }
        }
    }

    /// The error of a mismatch, and the notice to the other ranks (through the watchdog).
    fn mismatch(&self, comm: &Comm, found: &[String]) -> Error {
        let what = found.join("; ");
        let err = Error::invalid_usage(format!(
            "{}: the collective check ({SETTING}=1) found {what}; nothing of this group was \
             launched on this communicator, which is failed",
            self.head()
        ));
        failed(comm, &err);
        comm.watch.check_failed(what);
        err
    }
}

/// For tests: whether `comm` has counterparts kept, unused.
#[cfg(test)]
pub fn kept(comm: &Comm) -> usize {
    comm.watch.check.lock().received.len()
}

#[cfg(test)]
mod mode_tests {
    use super::*;

    #[test]
    fn nvidias_check_modes() {
        assert_eq!(parse_mode(None, false), Mode::Default);
        assert_eq!(parse_mode(None, true), Mode::Local);
        assert_eq!(parse_mode(Some("debug_local"), false), Mode::Local);
        assert_eq!(parse_mode(Some("DEBUG_GLOBAL"), false), Mode::Global);
        assert_eq!(parse_mode(Some("DEBUG_GLOBAL"), true), Mode::Global);
        assert_eq!(parse_mode(Some("other"), false), Mode::Default);
    }
}
