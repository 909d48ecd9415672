//! A live communicator's out-of-band channel over its bootstrap connections: what the
//! watchdog (`core::watchdog`) uses while the communicator runs, beside the collectives of
//! `Bootstrap` and never in their way. It sends and takes messages of its own kind
//! (`KIND_WATCH`, any peer, any order), tells how each peer's connection to this rank stands
//! (open, closed after a farewell, closed without one), and sends the farewell of an orderly
//! close over the connections that are open. Every send is bounded by its own short limit.
//! The optional collective check (`core::watchdog::check`) sends and receives its own kind
//! (`KIND_CHECK`) on the same connections, from the caller's thread.

use super::peers::{LinkState, Peers, KIND_BYE, KIND_CHECK, KIND_WATCH};
use super::socket::{Limits, WaitError};
use crate::error::Result;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// One rank's out-of-band channel; cheap to clone, shares the bootstrap's connections.
#[derive(Clone)]
pub struct Link {
    rank: i32,
    nranks: i32,
    peers: Arc<Peers>,
}

impl Link {
    pub(super) fn new(rank: i32, nranks: i32, peers: Arc<Peers>) -> Link {
        Link {
            rank,
            nranks,
            peers,
        }
    }

    pub fn rank(&self) -> i32 {
        self.rank
    }

    pub fn nranks(&self) -> i32 {
        self.nranks
    }

    /// Send a watchdog message to `peer`, connecting if needed, within `limit`.
    pub fn send(&self, peer: i32, tag: u64, data: &[u8], limit: Duration) -> Result<()> {
        let never = AtomicBool::new(false);
        let limits = Limits::new(limit, &never);
        self.peers.send(peer, KIND_WATCH, tag, data, &limits)
    }

    /// Send a collective-check message to `peer` within `limit` (or until `abort` is set).
    pub fn send_check(
        &self,
        peer: i32,
        data: &[u8],
        limit: Duration,
        abort: &AtomicBool,
    ) -> Result<()> {
        let limits = Limits::new(limit, abort);
        self.peers.send(peer, KIND_CHECK, 0, data, &limits)
    }

    /// The next collective-check message from `peer` (they arrive in the order sent), waiting
    /// at most `wait`: None when none came by then. Fails when `abort` is set, and at once
    /// when `peer`'s connection closed with nothing left from it.
    pub fn recv_check(
        &self,
        peer: i32,
        wait: Duration,
        abort: &AtomicBool,
    ) -> Result<Option<Vec<u8>>> {
        let limits = Limits::new(wait, abort);
        match self.peers.recv(peer, KIND_CHECK, 0, &limits) {
            Ok(msg) => Ok(Some(msg)),
            Err(e) => match limits.expired() {
                Some(WaitError::TimedOut) => Ok(None),
                _ => Err(e),
            },
        }
    }

    /// The oldest watchdog message waiting from any peer: (peer, tag, payload).
    pub fn take(&self) -> Option<(i32, u64, Vec<u8>)> {
        self.peers.take_any(KIND_WATCH)
    }

    /// Wait at most `limit` for a message or a connection change (or `wake`).
    pub fn wait(&self, limit: Duration) {
        self.peers.wait_arrival(limit);
    }

    /// End a `wait` now.
    pub fn wake(&self) {
        self.peers.wake_waiters();
    }

    /// How `peer`'s connection to this rank stands.
    pub fn state(&self, peer: i32) -> LinkState {
        self.peers.link_state(peer)
    }

    /// The first failure a peer reported through the bootstrap: (peer, message).
    pub fn remote_failure(&self) -> Option<(i32, String)> {
        self.peers.remote_failure()
    }

    /// Where `peer`'s bootstrap listens.
    pub fn addr(&self, peer: i32) -> Option<SocketAddr> {
        self.peers.addrs().get(peer as usize).copied().flatten()
    }

    /// Send each peer this rank has a connection to its farewell (`farewell_for(peer)`),
    /// the last frame before an orderly close; at most `limit` per peer. Opens nothing: a
    /// peer only sees the close of a connection that exists.
    pub fn farewell(&self, farewell_for: impl Fn(i32) -> Vec<u8>, limit: Duration) {
        let never = AtomicBool::new(false);
        for peer in (0..self.nranks).filter(|&p| p != self.rank) {
            let limits = Limits::new(limit, &never);
            let _ = self
                .peers
                .send_if_connected(peer, KIND_BYE, 0, &farewell_for(peer), &limits);
        }
    }
}
