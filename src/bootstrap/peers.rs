//! Connections among ranks: each rank's listener, served by one I/O thread that accepts
//! connections, authenticates them (a hello carrying the secret and the sender's rank),
//! reads framed messages without blocking and files them in an inbox keyed by
//! (peer, kind, tag); and the sending side, which opens one outgoing connection per peer
//! lazily. A message waits in the inbox until someone receives it, so arrivals may come in
//! any order and no sender ever blocks on a receiver that is not reading.

use super::id::{secrets_equal, Secret, SECRET_LEN};
use super::socket::{self, Limits, WaitError};
use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const HELLO_MAGIC: &[u8; 8] = b"OXBSHELO";
/// Bytes of a hello: magic, secret, sender rank, nranks.
const HELLO_LEN: usize = 8 + SECRET_LEN + 8;
/// Bytes of a frame header: kind, padding, tag, payload length.
const HEADER_LEN: usize = 24;
/// How long an accepted connection may take to say hello before it is dropped.
const HELLO_LIMIT: Duration = Duration::from_secs(10);

/// Message kinds: separate tag spaces so internal traffic never meets user tags.
pub const KIND_USER: u32 = 0;
pub const KIND_COLL: u32 = 1;
pub const KIND_SUB: u32 = 2;
/// The first message on each ring connection, opened eagerly so a dead neighbour is noticed.
pub const KIND_RING: u32 = 3;
/// A rank reporting that it failed (payload: its error message).
const KIND_FAIL: u32 = 4;
/// Out-of-band messages of a live communicator's watchdog (`core::watchdog`: progress
/// queries and answers, lost-rank notices); the tag says which.
pub const KIND_WATCH: u32 = 5;
/// The last frame of an orderly close (payload: the sender's farewell). Kept per peer rather
/// than filed, so that the close which follows it is known to be orderly.
pub const KIND_BYE: u32 = 6;
/// The signatures of the operations a rank is about to run (`core::watchdog::check`, the
/// optional collective check): received by the caller's thread, never by the watchdog's.
pub const KIND_CHECK: u32 = 7;

/// Largest payload of one frame: a failure report or a ring hello is a line of text, anything
/// else at most this (the bootstrap carries setup messages and small allgathers, never bulk
/// data). A longer header is a broken or hostile peer, refused before any memory is reserved.
const MAX_TEXT_FRAME: usize = 64 << 10;
const MAX_FRAME: usize = 256 << 20;
/// Most frames and bytes one peer may have waiting in the inbox, unreceived.
const MAX_QUEUED_FRAMES: usize = 1 << 16;
const MAX_QUEUED_BYTES: usize = 1 << 30;

/// The payload limit of a frame kind.
fn frame_limit(kind: u32) -> usize {
    match kind {
        KIND_FAIL | KIND_RING | KIND_WATCH | KIND_BYE | KIND_CHECK => MAX_TEXT_FRAME,
        _ => MAX_FRAME,
    }
}

type Key = (i32, u32, u64);

#[derive(Default)]
struct Inbox {
    queues: HashMap<Key, VecDeque<Vec<u8>>>,
    /// Peers whose connection to us has ended.
    closed: Vec<bool>,
    /// Set if the I/O thread itself failed.
    failure: Option<String>,
    /// The first failure a peer reported: (peer, its message).
    remote_failure: Option<(i32, String)>,
    /// Peers with an authenticated connection to us now (a second one is refused).
    connected: Vec<bool>,
    /// Frames and bytes each peer has waiting, unreceived.
    queued: Vec<(usize, usize)>,
    /// The farewell each peer sent before closing in order (`KIND_BYE`), if it did.
    farewell: Vec<Option<Vec<u8>>>,
}

impl Inbox {
    /// File a message from `peer`; false when that would pass the peer's queue limits.
    fn file(&mut self, key: Key, payload: Vec<u8>) -> bool {
        let q = &mut self.queued[key.0 as usize];
        if q.0 + 1 > MAX_QUEUED_FRAMES || q.1 + payload.len() > MAX_QUEUED_BYTES {
            return false;
        }
        *q = (q.0 + 1, q.1 + payload.len());
        self.queues.entry(key).or_default().push_back(payload);
        true
    }

    /// Take the oldest message for `key`.
    fn take(&mut self, key: &Key) -> Option<Vec<u8>> {
        let queue = self.queues.get_mut(key)?;
        let msg = queue.pop_front()?;
        if queue.is_empty() {
            self.queues.remove(key);
        }
        let q = &mut self.queued[key.0 as usize];
        *q = (q.0 - 1, q.1 - msg.len());
        Some(msg)
    }
}

/// The state the I/O thread shares with the receiving side.
struct Shared {
    rank: i32,
    nranks: i32,
    secret: Secret,
    inbox: Mutex<Inbox>,
    arrived: Condvar,
    stop: std::sync::atomic::AtomicBool,
    /// Collectives this rank has started and finished: a collective frame must carry a
    /// sequence number in the window they bound (`coll_window`).
    coll_started: AtomicU64,
    coll_done: AtomicU64,
}

impl Shared {
    /// The rank before this one on the ring: the only sender of collective frames.
    fn prev(&self) -> i32 {
        (self.rank + self.nranks - 1) % self.nranks
    }

    /// Why a collective frame from `peer` for collective `seq` cannot be legitimate, if it
    /// cannot. Collectives are ring allgathers: only the previous rank sends us their frames,
    /// and it cannot finish collective k before our contribution to k has gone round the
    /// ring to it, so it is never more than one collective ahead of us: while we are between
    /// collectives, having finished `done`, it is at most in collective `done`; while we are
    /// in collective `done`, at most in `done + 1`; i.e. `seq` lies in [done, started]. A
    /// finished collective has received all its frames, so none can come for it.
    fn coll_violation(&self, peer: i32, seq: u64) -> Option<String> {
        let (me, prev) = (self.rank, self.prev());
        if peer != prev {
            return Some(format!(
                "sent a frame of collective {seq}, but only rank {prev} sends collective \
                 frames to rank {me}"
            ));
        }
        let done = self.coll_done.load(Ordering::SeqCst);
        let started = self.coll_started.load(Ordering::SeqCst);
        if seq < done {
            return Some(format!(
                "sent a frame of collective {seq}, which is past (rank {me} has finished \
                 {done} collectives)"
            ));
        }
        if seq > started {
            return Some(format!(
                "sent a frame of collective {seq}, more than one collective ahead of rank {me} \
                 (which has started {started})"
            ));
        }
        None
    }
}

/// One rank's endpoints: its listener (with the I/O thread) and its outgoing connections.
pub struct Peers {
    shared: Arc<Shared>,
    outgoing: Vec<Mutex<Option<TcpStream>>>,
    addrs: Mutex<Vec<Option<SocketAddr>>>,
    listen_addr: SocketAddr,
    wake: UnixStream,
    io: Mutex<Option<JoinHandle<()>>>,
}

impl Peers {
    /// Serve `listener` for rank `rank` of `nranks`, accepting only connections that know `secret`.
    pub fn start(listener: TcpListener, rank: i32, nranks: i32, secret: Secret) -> Result<Peers> {
        let sys = |e: std::io::Error| {
            Error::system(format!("bootstrap: cannot start the listener thread: {e}"))
        };
        let listen_addr = listener.local_addr().map_err(sys)?;
        listener.set_nonblocking(true).map_err(sys)?;
        let (wake, wake_rx) = UnixStream::pair().map_err(sys)?;
        wake_rx.set_nonblocking(true).map_err(sys)?;
        let shared = Arc::new(Shared {
            rank,
            nranks,
            secret,
            inbox: Mutex::new(Inbox {
                closed: vec![false; nranks as usize],
                connected: vec![false; nranks as usize],
                queued: vec![(0, 0); nranks as usize],
                farewell: vec![None; nranks as usize],
                ..Default::default()
            }),
            arrived: Condvar::new(),
            stop: std::sync::atomic::AtomicBool::new(false),
            coll_started: AtomicU64::new(0),
            coll_done: AtomicU64::new(0),
        });
        let thread_shared = shared.clone();
        let io = std::thread::Builder::new()
            .name(format!("oxccl-boot-{rank}"))
            .spawn(move || io_loop(listener, wake_rx, thread_shared))
            .map_err(sys)?;
        Ok(Peers {
            shared,
            outgoing: (0..nranks).map(|_| Mutex::new(None)).collect(),
            addrs: Mutex::new(vec![None; nranks as usize]),
            listen_addr,
            wake,
            io: Mutex::new(Some(io)),
        })
    }

    pub fn listen_addr(&self) -> SocketAddr {
        self.listen_addr
    }

    pub fn set_addr(&self, rank: i32, addr: SocketAddr) {
        self.addrs.lock()[rank as usize] = Some(addr);
    }

    pub fn addrs(&self) -> Vec<Option<SocketAddr>> {
        self.addrs.lock().clone()
    }

    /// Send one message to `peer` (connecting first if needed).
    pub fn send(
        &self,
        peer: i32,
        kind: u32,
        tag: u64,
        data: &[u8],
        limits: &Limits<'_>,
    ) -> Result<()> {
        let me = self.shared.rank;
        if peer == me {
            let mut inbox = self.shared.inbox.lock();
            if !inbox.file((peer, kind, tag), data.to_vec()) {
                return Err(Error::internal(format!(
                    "bootstrap: rank {me} has more than {MAX_QUEUED_FRAMES} messages or \
                     {MAX_QUEUED_BYTES} bytes to itself waiting unreceived"
                )));
            }
            drop(inbox);
            self.shared.arrived.notify_all();
            return Ok(());
        }
        let mut slot = self.outgoing[peer as usize].lock();
        if slot.is_none() {
            *slot = Some(self.connect(peer, limits)?);
        }
        self.write_frame(peer, slot, kind, tag, data, limits)
    }

    /// Send one message to `peer` only over a connection that is already open (never
    /// connects, e.g. for a farewell): false when there is none.
    pub fn send_if_connected(
        &self,
        peer: i32,
        kind: u32,
        tag: u64,
        data: &[u8],
        limits: &Limits<'_>,
    ) -> Result<bool> {
        let slot = self.outgoing[peer as usize].lock();
        if slot.is_none() {
            return Ok(false);
        }
        self.write_frame(peer, slot, kind, tag, data, limits)
            .map(|_| true)
    }

    /// Open this rank's connection to `peer` and say hello.
    fn connect(&self, peer: i32, limits: &Limits<'_>) -> Result<TcpStream> {
        let me = self.shared.rank;
        let addr = self.addrs.lock()[peer as usize].ok_or_else(|| {
            Error::internal(format!(
                "bootstrap: rank {me} does not know rank {peer}'s address"
            ))
        })?;
        let what = format!("rank {me} connecting to rank {peer} at {addr}");
        let stream = socket::connect(&addr, false, limits).map_err(|e| match e {
            WaitError::Io(io) if io.kind() == ErrorKind::ConnectionRefused => {
                self.reported_failure().unwrap_or_else(|| {
                    Error::remote(format!(
                        "bootstrap: rank {peer} is not listening at {addr} any more (process exited or aborted?)"
                    ))
                })
            }
            e => e.into_error(limits, &what),
        })?;
        let _ = socket::detect_dead_peer(&stream, socket::dead_peer_secs());
        let mut hello = [0u8; HELLO_LEN];
        hello[..8].copy_from_slice(HELLO_MAGIC);
        hello[8..8 + SECRET_LEN].copy_from_slice(&self.shared.secret);
        hello[8 + SECRET_LEN..12 + SECRET_LEN].copy_from_slice(&me.to_le_bytes());
        hello[12 + SECRET_LEN..].copy_from_slice(&self.shared.nranks.to_le_bytes());
        socket::write_all(&stream, &hello, limits).map_err(|e| e.into_error(limits, &what))?;
        Ok(stream)
    }

    /// Write one frame on the open connection in `slot` (dropped if the write fails).
    fn write_frame(
        &self,
        peer: i32,
        mut slot: parking_lot::MutexGuard<'_, Option<TcpStream>>,
        kind: u32,
        tag: u64,
        data: &[u8],
        limits: &Limits<'_>,
    ) -> Result<()> {
        let me = self.shared.rank;
        // Nothing written yet: a raised abort (a handle's, such as the channel weights'
        // exchange when it stops) or a passed deadline leaves the connection, which other
        // threads share, as it is.
        if let Some(why) = limits.expired() {
            return Err(why.into_error(limits, &format!("rank {me} sending to rank {peer}")));
        }
        let stream = slot.as_ref().expect("an open connection");
        let mut header = [0u8; HEADER_LEN];
        header[..4].copy_from_slice(&kind.to_le_bytes());
        header[8..16].copy_from_slice(&tag.to_le_bytes());
        header[16..24].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let result = if data.len() <= 64 << 10 {
            let mut msg = Vec::with_capacity(HEADER_LEN + data.len());
            msg.extend_from_slice(&header);
            msg.extend_from_slice(data);
            socket::write_all(stream, &msg, limits)
        } else {
            socket::write_all(stream, &header, limits)
                .and_then(|_| socket::write_all(stream, data, limits))
        };
        if let Err(e) = result {
            // A half-written frame leaves the connection unusable.
            *slot = None;
            drop(slot);
            let err = match e {
                WaitError::Closed => self.reported_failure().unwrap_or_else(|| Error::remote(format!(
                    "bootstrap: rank {peer} closed its connection while rank {me} was sending to it \
                     (process exited or aborted?)"
                ))),
                e => e.into_error(limits, &format!("rank {me} sending {} bytes to rank {peer}", data.len())),
            };
            return Err(err);
        }
        Ok(())
    }

    /// Start the next collective; its sequence number tags its frames. Collectives are
    /// called in the same order on every rank, one at a time.
    pub fn begin_coll(&self) -> u64 {
        self.shared.coll_started.fetch_add(1, Ordering::SeqCst)
    }

    /// Finish collective `seq`, which received every frame it expects: one more from its
    /// sender (still queued) is a protocol violation.
    pub fn end_coll(&self, seq: u64) -> Result<()> {
        self.shared.coll_done.store(seq + 1, Ordering::SeqCst);
        let prev = self.shared.prev();
        let mut inbox = self.shared.inbox.lock();
        if inbox.take(&(prev, KIND_COLL, seq)).is_none() {
            return Ok(());
        }
        let why = format!(
            "sent more frames for collective {seq} than the collective has steps (rank {} \
             finished it)",
            self.shared.rank
        );
        drop(inbox);
        Err(Error::remote(format!(
            "bootstrap: rank {prev} broke the bootstrap protocol: {why}"
        )))
    }

    /// Receive the oldest message from `peer` with this kind and tag.
    pub fn recv(&self, peer: i32, kind: u32, tag: u64, limits: &Limits<'_>) -> Result<Vec<u8>> {
        let key = (peer, kind, tag);
        let mut inbox = self.shared.inbox.lock();
        loop {
            if let Some(msg) = inbox.take(&key) {
                return Ok(msg);
            }
            let me = self.shared.rank;
            if let Some((who, msg)) = &inbox.remote_failure {
                return Err(Error::remote(format!(
                    "bootstrap: rank {who} failed: {msg}"
                )));
            }
            if inbox.closed[peer as usize] {
                drop(inbox);
                if let Some(reported) = self.reported_failure() {
                    return Err(reported);
                }
                return Err(Error::remote(format!(
                    "bootstrap: rank {peer} closed its connection while rank {me} was waiting to receive from it \
                     (process exited or aborted?)"
                )));
            }
            if let Some(f) = &inbox.failure {
                return Err(Error::system(format!(
                    "bootstrap: rank {me}'s listener failed: {f}"
                )));
            }
            if let Some(why) = limits.expired() {
                return Err(why.into_error(
                    limits,
                    &format!("rank {me} waiting to receive from rank {peer}"),
                ));
            }
            let slice = limits.slice();
            self.shared.arrived.wait_for(&mut inbox, slice);
        }
    }

    /// The oldest message of `kind` waiting from any peer: (peer, tag, payload).
    pub fn take_any(&self, kind: u32) -> Option<(i32, u64, Vec<u8>)> {
        let mut inbox = self.shared.inbox.lock();
        let key = *inbox.queues.keys().find(|k| k.1 == kind)?;
        let msg = inbox.take(&key)?;
        Some((key.0, key.2, msg))
    }

    /// Wait at most `limit` for something to arrive or a connection to change (or for
    /// `wake_waiters`).
    pub fn wait_arrival(&self, limit: Duration) {
        let mut inbox = self.shared.inbox.lock();
        self.shared.arrived.wait_for(&mut inbox, limit);
    }

    /// End every `wait_arrival` now.
    pub fn wake_waiters(&self) {
        let _inbox = self.shared.inbox.lock();
        self.shared.arrived.notify_all();
    }

    /// How `peer`'s connection to this rank stands.
    pub fn link_state(&self, peer: i32) -> LinkState {
        let inbox = self.shared.inbox.lock();
        if !inbox.closed[peer as usize] {
            return LinkState::Open;
        }
        LinkState::Closed {
            farewell: inbox.farewell[peer as usize].clone(),
        }
    }

    /// The first failure a peer reported (or a protocol violation found): (peer, message).
    pub fn remote_failure(&self) -> Option<(i32, String)> {
        self.shared.inbox.lock().remote_failure.clone()
    }

    /// Tell peers that this rank failed, best effort and bounded: every peer whose address is
    /// known when the failure started here, else (a failure reported by another rank) only
    /// the peers we are connected to, so the report precedes the close they will see.
    pub fn notify_failure(&self, err: &Error) {
        let relayed = self.shared.inbox.lock().remote_failure.is_some();
        let never = std::sync::atomic::AtomicBool::new(false);
        let limits = Limits::new(Duration::from_secs(2), &never);
        let addrs = self.addrs();
        for (peer, addr) in addrs.iter().enumerate() {
            let peer = peer as i32;
            if addr.is_none() || peer == self.shared.rank || limits.expired().is_some() {
                continue;
            }
            if relayed && self.outgoing[peer as usize].lock().is_none() {
                continue;
            }
            let _ = self.send(peer, KIND_FAIL, 0, err.msg.as_bytes(), &limits);
        }
    }

    /// After a peer closed on us: wait briefly for a failure report (the rank where the
    /// failure started may have sent one that is still on its way) and return it if one came.
    fn reported_failure(&self) -> Option<Error> {
        let deadline = Instant::now() + Duration::from_millis(300);
        let mut inbox = self.shared.inbox.lock();
        while inbox.remote_failure.is_none() {
            if self
                .shared
                .arrived
                .wait_until(&mut inbox, deadline)
                .timed_out()
            {
                break;
            }
        }
        let (who, msg) = inbox.remote_failure.as_ref()?;
        Some(Error::remote(format!(
            "bootstrap: rank {who} failed: {msg}"
        )))
    }

    /// Shut every outgoing connection so peers waiting on us fail promptly.
    pub fn break_links(&self) {
        for slot in &self.outgoing {
            if let Some(stream) = slot.lock().take() {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }

    /// Stop the I/O thread and close every connection.
    pub fn shutdown(&self) {
        self.shared
            .stop
            .store(true, std::sync::atomic::Ordering::Release);
        let _ = (&self.wake).write(&[1]);
        if let Some(io) = self.io.lock().take() {
            let _ = io.join();
        }
        for slot in &self.outgoing {
            slot.lock().take();
        }
    }
}

impl Drop for Peers {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How a peer's connection to this rank stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// Open, or never opened.
    Open,
    /// Ended: after a farewell (an orderly close) or without one (the process died, or its
    /// bootstrap failed).
    Closed { farewell: Option<Vec<u8>> },
}

/// An accepted connection and what has been read from it.
struct Conn {
    stream: TcpStream,
    from: SocketAddr,
    peer: Option<i32>,
    since: Instant,
    buf: Vec<u8>,
}

enum Parsed {
    Keep,
    Drop,
}

fn io_loop(listener: TcpListener, wake_rx: UnixStream, shared: Arc<Shared>) {
    let mut conns: Vec<Conn> = Vec::new();
    let mut chunk = vec![0u8; 256 << 10];
    loop {
        let mut fds = vec![
            socket::pollfd(listener.as_raw_fd()),
            socket::pollfd(wake_rx.as_raw_fd()),
        ];
        fds.extend(conns.iter().map(|c| socket::pollfd(c.stream.as_raw_fd())));
        if let Err(e) = socket::poll(&mut fds, socket::POLL_INTERVAL) {
            shared.inbox.lock().failure = Some(format!("poll failed: {e}"));
            shared.arrived.notify_all();
            return;
        }
        if shared.stop.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let mut keep = Vec::with_capacity(conns.len());
        for (i, mut conn) in std::mem::take(&mut conns).into_iter().enumerate() {
            let alive = if socket::ready(&fds[2 + i]) {
                read_conn(&mut conn, &shared, &mut chunk)
            } else if conn.peer.is_none() && conn.since.elapsed() > HELLO_LIMIT {
                crate::warn!(
                    "bootstrap: rank {} dropped a connection from {} that never said hello",
                    shared.rank,
                    conn.from
                );
                Parsed::Drop
            } else {
                Parsed::Keep
            };
            if let Parsed::Keep = alive {
                keep.push(conn);
            }
        }
        conns = keep;
        if socket::ready(&fds[0]) {
            loop {
                match listener.accept() {
                    Ok((stream, from)) => {
                        // A peer host that dies or is cut off ends this connection as a
                        // killed process's close does (socket::detect_dead_peer).
                        let _ = socket::detect_dead_peer(&stream, socket::dead_peer_secs());
                        if stream.set_nonblocking(true).is_ok() {
                            conns.push(Conn {
                                stream,
                                from,
                                peer: None,
                                since: Instant::now(),
                                buf: Vec::new(),
                            });
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        }
    }
}

/// Read what is available on `conn` and file complete messages; Drop when it has ended.
fn read_conn(conn: &mut Conn, shared: &Shared, chunk: &mut [u8]) -> Parsed {
    // Read at most a few chunks per turn so one busy connection cannot starve the others.
    for _ in 0..16 {
        match conn.stream.read(chunk) {
            Ok(0) => return closed(conn, shared),
            Ok(n) => {
                conn.buf.extend_from_slice(&chunk[..n]);
                if let Parsed::Drop = parse(conn, shared) {
                    return Parsed::Drop;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Parsed::Keep,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return closed(conn, shared),
        }
    }
    Parsed::Keep
}

fn closed(conn: &Conn, shared: &Shared) -> Parsed {
    if let Some(peer) = conn.peer {
        let mut inbox = shared.inbox.lock();
        inbox.closed[peer as usize] = true;
        inbox.connected[peer as usize] = false;
        drop(inbox);
        shared.arrived.notify_all();
    }
    Parsed::Drop
}

/// An authenticated peer broke the protocol: its connection ends and every wait on this
/// rank fails with an error naming it.
fn violation(conn: &Conn, shared: &Shared, why: String) -> Parsed {
    let peer = conn
        .peer
        .expect("only an authenticated connection can break the protocol");
    crate::warn!(
        "bootstrap: rank {} dropped rank {peer}'s connection from {}: {why}",
        shared.rank,
        conn.from
    );
    let mut inbox = shared.inbox.lock();
    inbox.connected[peer as usize] = false;
    inbox
        .remote_failure
        .get_or_insert((peer, format!("broke the bootstrap protocol: {why}")));
    drop(inbox);
    shared.arrived.notify_all();
    Parsed::Drop
}

/// Consume the hello and every complete frame in `conn.buf`.
fn parse(conn: &mut Conn, shared: &Shared) -> Parsed {
    let mut pos = 0;
    if conn.peer.is_none() {
        if conn.buf.len() < HELLO_LEN {
            if conn.buf.len() >= 8 && &conn.buf[..8] != HELLO_MAGIC {
                return refuse(conn, shared, "not a bootstrap hello");
            }
            return Parsed::Keep;
        }
        let hello = &conn.buf[..HELLO_LEN];
        if &hello[..8] != HELLO_MAGIC {
            return refuse(conn, shared, "not a bootstrap hello");
        }
        if !secrets_equal(&hello[8..8 + SECRET_LEN], &shared.secret) {
            return refuse(conn, shared, "wrong secret");
        }
        let rank = i32::from_le_bytes(hello[8 + SECRET_LEN..12 + SECRET_LEN].try_into().unwrap());
        let nranks = i32::from_le_bytes(hello[12 + SECRET_LEN..].try_into().unwrap());
        if nranks != shared.nranks || rank < 0 || rank >= nranks {
            return refuse(conn, shared, &format!("claims rank {rank} of {nranks}"));
        }
        let mut inbox = shared.inbox.lock();
        if std::mem::replace(&mut inbox.connected[rank as usize], true) {
            drop(inbox);
            return refuse(
                conn,
                shared,
                &format!("claims rank {rank}, which is already connected"),
            );
        }
        drop(inbox);
        conn.peer = Some(rank);
        pos = HELLO_LEN;
    }
    let peer = conn.peer.unwrap();
    let mut filed = false;
    let mut inbox = None;
    while conn.buf.len() - pos >= HEADER_LEN {
        let h = &conn.buf[pos..pos + HEADER_LEN];
        let kind = u32::from_le_bytes(h[..4].try_into().unwrap());
        let tag = u64::from_le_bytes(h[8..16].try_into().unwrap());
        let len = u64::from_le_bytes(h[16..24].try_into().unwrap());
        if len > frame_limit(kind) as u64 {
            drop(inbox);
            return violation(
                conn,
                shared,
                format!(
                    "a frame of kind {kind} announced {len} bytes (limit {})",
                    frame_limit(kind)
                ),
            );
        }
        let len = len as usize;
        let have = conn.buf.len() - pos - HEADER_LEN;
        if have < len {
            // Room for the rest of the payload, in steps: memory follows the bytes that came.
            conn.buf.reserve((len - have).min(1 << 20));
            break;
        }
        if kind == KIND_COLL {
            if let Some(why) = shared.coll_violation(peer, tag) {
                drop(inbox);
                return violation(conn, shared, why);
            }
        }
        let payload = conn.buf[pos + HEADER_LEN..pos + HEADER_LEN + len].to_vec();
        pos += HEADER_LEN + len;
        let guard = inbox.get_or_insert_with(|| shared.inbox.lock());
        let accepted = if kind == KIND_FAIL {
            guard
                .remote_failure
                .get_or_insert((peer, socket::printable(&payload)));
            true
        } else if kind == KIND_BYE {
            guard.farewell[peer as usize].get_or_insert(payload);
            true
        } else {
            guard.file((peer, kind, tag), payload)
        };
        if !accepted {
            drop(inbox);
            return violation(
                conn,
                shared,
                format!(
                    "more than {MAX_QUEUED_FRAMES} messages or {MAX_QUEUED_BYTES} bytes waiting \
                     unreceived"
                ),
            );
        }
        filed = true;
    }
    drop(inbox);
    if filed {
        shared.arrived.notify_all();
    }
    conn.buf.drain(..pos);
    Parsed::Keep
}

fn refuse(conn: &Conn, shared: &Shared, why: &str) -> Parsed {
    crate::warn!(
        "bootstrap: rank {} refused a connection from {}: {why}",
        shared.rank,
        conn.from
    );
    Parsed::Drop
}

#[cfg(test)]
mod tests {
    //! A peer that knows the secret but breaks the protocol (a bug, a version skew): every
    //! case ends in an error naming it, with memory bounded, and never disturbs a healthy
    //! connection.
    use super::*;
    use crate::bootstrap::fuzz::{self, Rng};
    use std::sync::atomic::AtomicBool;

    const SECRET: Secret = *b"0123456789abcdef";

    fn rank0_of_2() -> Peers {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        Peers::start(listener, 0, 2, SECRET).unwrap()
    }

    /// A raw connection to `peers` that says hello as rank 1.
    fn as_rank1(peers: &Peers) -> TcpStream {
        hello_as(peers, 1)
    }

    /// A raw connection to `peers` that says hello as `rank` of the peers' nranks.
    fn hello_as(peers: &Peers, rank: i32) -> TcpStream {
        let mut s = TcpStream::connect(peers.listen_addr()).unwrap();
        s.write_all(&hello(rank, peers.shared.nranks)).unwrap();
        s
    }

    fn hello(rank: i32, nranks: i32) -> Vec<u8> {
        let mut hello = Vec::from(*HELLO_MAGIC);
        hello.extend_from_slice(&SECRET);
        hello.extend_from_slice(&rank.to_le_bytes());
        hello.extend_from_slice(&nranks.to_le_bytes());
        hello
    }

    fn frame(kind: u32, tag: u64, len: u64, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; HEADER_LEN];
        f[..4].copy_from_slice(&kind.to_le_bytes());
        f[8..16].copy_from_slice(&tag.to_le_bytes());
        f[16..24].copy_from_slice(&len.to_le_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn recv_error(peers: &Peers) -> String {
        let never = AtomicBool::new(false);
        let limits = Limits::new(Duration::from_secs(10), &never);
        peers.recv(1, KIND_USER, 7, &limits).unwrap_err().msg
    }

    #[test]
    fn a_huge_frame_header_is_refused_naming_the_peer() {
        let peers = rank0_of_2();
        let mut s = as_rank1(&peers);
        s.write_all(&frame(KIND_USER, 7, 1 << 40, &[])).unwrap();
        let msg = recv_error(&peers);
        assert!(
            msg.contains("rank 1") && msg.contains("1099511627776 bytes"),
            "{msg}"
        );
    }

    #[test]
    fn endless_unreceived_frames_end_in_an_error_not_unbounded_memory() {
        let peers = rank0_of_2();
        let mut s = as_rank1(&peers);
        let mut burst = Vec::new();
        for tag in 0..=MAX_QUEUED_FRAMES as u64 {
            burst.extend_from_slice(&frame(KIND_USER, 1000 + tag, 0, &[]));
        }
        // The peer may drop us mid-burst; what matters is the error on this side.
        let _ = s.write_all(&burst);
        let msg = recv_error(&peers);
        assert!(
            msg.contains("rank 1") && msg.contains("waiting unreceived"),
            "{msg}"
        );
        assert!(peers.shared.inbox.lock().queued[1].0 <= MAX_QUEUED_FRAMES);
    }

    #[test]
    fn a_second_connection_claiming_a_connected_rank_is_refused() {
        let peers = rank0_of_2();
        let mut first = as_rank1(&peers);
        // Let the I/O thread take the first hello before the impostor's.
        first.write_all(&frame(KIND_USER, 1, 3, b"one")).unwrap();
        let never = AtomicBool::new(false);
        let limits = Limits::new(Duration::from_secs(10), &never);
        assert_eq!(peers.recv(1, KIND_USER, 1, &limits).unwrap(), b"one");
        let mut impostor = as_rank1(&peers);
        let _ = impostor.write_all(&frame(KIND_USER, 7, 5, b"wrong"));
        impostor
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(
            impostor.read(&mut buf).unwrap_or(0),
            0,
            "impostor disconnected"
        );
        // The healthy connection still works and the impostor's frame was never filed.
        first.write_all(&frame(KIND_USER, 7, 5, b"right")).unwrap();
        assert_eq!(peers.recv(1, KIND_USER, 7, &limits).unwrap(), b"right");
        assert!(!peers.shared.inbox.lock().closed[1]);
    }

    #[test]
    fn a_send_stopped_before_its_first_byte_keeps_the_shared_connection() {
        let peers = rank0_of_2();
        let rank1 = TcpListener::bind("127.0.0.1:0").unwrap();
        peers.set_addr(1, rank1.local_addr().unwrap());
        let never = AtomicBool::new(false);
        let limits = Limits::new(Duration::from_secs(10), &never);
        peers.send(1, KIND_USER, 1, b"one", &limits).unwrap();
        let (mut conn, _) = rank1.accept().unwrap();
        let raised = AtomicBool::new(true);
        let aborted = Limits::new(Duration::from_secs(10), &raised);
        assert!(peers.send(1, KIND_USER, 2, b"two", &aborted).is_err());
        peers.send(1, KIND_USER, 3, b"three", &limits).unwrap();
        // One connection carried hello, frame 1 and frame 3, whole.
        let want = [
            hello(0, 2),
            frame(KIND_USER, 1, 3, b"one"),
            frame(KIND_USER, 3, 5, b"three"),
        ]
        .concat();
        let mut got = vec![0u8; want.len()];
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        conn.read_exact(&mut got).unwrap();
        assert!(got == want, "the frames after the stopped send differ");
        rank1.set_nonblocking(true).unwrap();
        assert!(rank1.accept().is_err(), "a second connection was opened");
    }

    fn recv_coll(peers: &Peers, from: i32, seq: u64) -> Result<Vec<u8>> {
        let never = AtomicBool::new(false);
        let limits = Limits::new(Duration::from_secs(10), &never);
        peers.recv(from, KIND_COLL, seq, &limits)
    }

    #[test]
    fn a_collective_frame_for_a_far_future_sequence_number_is_refused() {
        let peers = rank0_of_2();
        let mut s = as_rank1(&peers);
        s.write_all(&frame(KIND_COLL, 1000, 1, b"x")).unwrap();
        let msg = recv_error(&peers);
        assert!(
            msg.contains("rank 1") && msg.contains("1000") && msg.contains("collective"),
            "{msg}"
        );
    }

    #[test]
    fn collective_frames_are_taken_one_collective_ahead_but_not_from_the_past() {
        let peers = rank0_of_2();
        let mut s = as_rank1(&peers);
        // We are in collective 0; the peer may already be in collective 1.
        let seq = peers.begin_coll();
        assert_eq!(seq, 0);
        s.write_all(&frame(KIND_COLL, 0, 1, b"a")).unwrap();
        s.write_all(&frame(KIND_COLL, 1, 1, b"b")).unwrap();
        assert_eq!(recv_coll(&peers, 1, 0).unwrap(), b"a");
        peers.end_coll(seq).unwrap();
        let seq = peers.begin_coll();
        assert_eq!(recv_coll(&peers, 1, seq).unwrap(), b"b");
        peers.end_coll(seq).unwrap();
        // Collective 1 is over: another frame for it is a violation.
        s.write_all(&frame(KIND_COLL, 1, 1, b"c")).unwrap();
        let msg = recv_error(&peers);
        assert!(
            msg.contains("rank 1") && msg.contains("collective 1") && msg.contains("past"),
            "{msg}"
        );
    }

    #[test]
    fn collective_frames_only_come_from_the_previous_rank_of_the_ring() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let peers = Peers::start(listener, 0, 3, SECRET).unwrap();
        let mut s = as_rank1(&peers);
        s.write_all(&frame(KIND_COLL, 0, 1, b"x")).unwrap();
        let msg = recv_error(&peers);
        assert!(
            msg.contains("rank 1") && msg.contains("collective"),
            "{msg}"
        );
    }

    #[test]
    fn a_collective_frame_left_over_at_the_end_of_its_collective_is_refused() {
        let peers = rank0_of_2();
        let mut s = as_rank1(&peers);
        let seq = peers.begin_coll();
        s.write_all(&frame(KIND_COLL, seq, 1, b"a")).unwrap();
        s.write_all(&frame(KIND_COLL, seq, 1, b"b")).unwrap();
        assert_eq!(recv_coll(&peers, 1, seq).unwrap(), b"a");
        // Let the second frame arrive before the collective ends.
        let deadline = Instant::now() + Duration::from_secs(10);
        while peers.shared.inbox.lock().queued[1].0 == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let msg = peers.end_coll(seq).unwrap_err().msg;
        assert!(
            msg.contains("rank 1") && msg.contains("collective 0"),
            "{msg}"
        );
    }

    /// The probe's tag (the probe rank sends nothing else).
    const PROBE_TAG: u64 = 0x0070_726f_6265;

    /// Append one fuzzed frame, or something that is not one, to `out`.
    fn fuzz_item(rng: &mut Rng, out: &mut Vec<u8>) {
        let kinds = [
            KIND_USER,
            KIND_COLL,
            KIND_SUB,
            KIND_RING,
            KIND_FAIL,
            KIND_WATCH,
            KIND_BYE,
            KIND_CHECK,
            8,
            u32::MAX,
        ];
        let kind = if rng.one_in(8) {
            rng.next_u64() as u32
        } else {
            rng.pick(&kinds)
        };
        let tag = match rng.below(4) {
            0 => rng.next_u64(),
            1 => u64::MAX - rng.below(2),
            _ => rng.below(4),
        };
        let len = if rng.one_in(16) {
            rng.below(100 << 10)
        } else {
            rng.below(64)
        };
        let payload = rng.bytes(len as usize);
        match rng.below(10) {
            0 => {
                let limit = frame_limit(kind) as u64;
                let over = limit + 1 + rng.below(1 << 20);
                let huge = rng.pick(&[limit + 1, 1 << 40, u64::MAX, over]);
                out.extend(frame(kind, tag, huge, &payload));
            }
            // Announces more than comes: the rest of the stream becomes its payload.
            1 => out.extend(frame(kind, tag, len + 1 + rng.below(1000), &payload)),
            2 => {
                let n = rng.below(64) as usize;
                out.extend(rng.bytes(n));
            }
            3 => {
                let mut f = frame(kind, tag, len, &payload);
                let i = rng.below(f.len() as u64) as usize;
                f[i] ^= 1 << rng.below(8);
                out.extend(f);
            }
            _ => out.extend(frame(kind, tag, len, &payload)),
        }
    }

    /// A hello (sometimes with its magic or secret damaged) and fuzzed frames from `rank`.
    fn fuzz_stream(rng: &mut Rng, rank: i32, nranks: i32) -> Vec<u8> {
        let mut bytes = hello(rank, nranks);
        if rng.one_in(10) {
            let i = rng.below((8 + SECRET_LEN) as u64) as usize;
            bytes[i] ^= 1 + rng.below(255) as u8;
        }
        for _ in 0..1 + rng.below(24) {
            fuzz_item(rng, &mut bytes);
        }
        if rng.one_in(4) {
            bytes.truncate(rng.below(bytes.len() as u64 + 1) as usize);
        }
        bytes
    }

    /// A healthy rank's frame still arrives, unless a fuzzed peer's failure or violation
    /// (naming it) fails every wait; either way within the wait's limit.
    fn check_still_serving(peers: &Peers, fuzzed: i32, probe: i32) {
        let mut p = hello_as(peers, probe);
        p.write_all(&frame(KIND_USER, PROBE_TAG, 5, b"probe"))
            .unwrap();
        let started = Instant::now();
        let never = AtomicBool::new(false);
        let limits = Limits::new(Duration::from_secs(5), &never);
        match peers.recv(probe, KIND_USER, PROBE_TAG, &limits) {
            Ok(msg) => assert_eq!(msg, b"probe"),
            Err(e) => assert!(
                e.msg
                    .starts_with(&format!("bootstrap: rank {fuzzed} failed")),
                "{}",
                e.msg
            ),
        }
        assert!(started.elapsed() < Duration::from_secs(6));
    }

    /// The inbox's accounting matches its queues, within the caps and what was sent.
    fn check_bounded(peers: &Peers, fuzzed: i32, sent: usize) {
        let inbox = peers.shared.inbox.lock();
        for (peer, &(frames, bytes)) in inbox.queued.iter().enumerate() {
            let queues = inbox.queues.iter().filter(|(k, _)| k.0 == peer as i32);
            let held = queues.fold((0, 0), |(f, b), (_, q)| {
                (f + q.len(), b + q.iter().map(Vec::len).sum::<usize>())
            });
            assert_eq!((frames, bytes), held, "rank {peer}'s queue accounting");
            assert!(frames <= MAX_QUEUED_FRAMES && bytes <= MAX_QUEUED_BYTES);
            if peer as i32 == fuzzed {
                assert!(bytes <= sent, "{bytes} bytes queued from {sent} sent");
            }
        }
    }

    /// Close our side and wait for the peer to close its side: it has dealt with everything.
    fn await_close(mut s: TcpStream) {
        let _ = s.shutdown(Shutdown::Write);
        let deadline = Instant::now() + Duration::from_secs(5);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 64];
        while let Ok(n @ 1..) = s.read(&mut buf) {
            assert!(Instant::now() < deadline, "{n} bytes from a listener");
        }
        assert!(Instant::now() < deadline, "the connection was not closed");
    }

    fn fuzz_peer_case(rng: &mut Rng) {
        let nranks = 3 + rng.below(3) as i32;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let peers = Peers::start(listener, 0, nranks, SECRET).unwrap();
        // Somewhere in the collective sequence: between collectives or in one.
        for _ in 0..rng.below(3) {
            let seq = peers.begin_coll();
            peers.end_coll(seq).unwrap();
        }
        if rng.one_in(2) {
            peers.begin_coll();
        }
        // Most often the previous rank, the one collective frames come from.
        let fuzzed = if rng.one_in(2) {
            nranks - 1
        } else {
            1 + rng.below(nranks as u64 - 1) as i32
        };
        let probe = (1..nranks).find(|&r| r != fuzzed).unwrap();
        let bytes = fuzz_stream(rng, fuzzed, nranks);
        let mut s = TcpStream::connect(peers.listen_addr()).unwrap();
        // The peer may drop us part way: what matters is how it copes.
        let _ = s.write_all(&bytes);
        let open = if rng.one_in(4) {
            Some(s)
        } else {
            await_close(s);
            None
        };
        check_still_serving(&peers, fuzzed, probe);
        if rng.one_in(8) {
            let never = AtomicBool::new(false);
            let limits = Limits::new(Duration::from_millis(100), &never);
            let started = Instant::now();
            let kind = rng.pick(&[KIND_USER, KIND_COLL]);
            let _ = peers.recv(fuzzed, kind, rng.below(3), &limits);
            assert!(started.elapsed() < Duration::from_secs(2));
        }
        check_bounded(&peers, fuzzed, bytes.len());
        let io_ended = peers.io.lock().as_ref().is_none_or(|h| h.is_finished());
        assert!(!io_ended, "the I/O thread ended (panicked?)");
        drop(open);
    }

    /// Fuzzed streams from a peer that knows the secret: the I/O thread never panics and
    /// keeps serving, memory stays within the caps, and every wait ends within its limit.
    #[test]
    fn fuzz_peer_stream() {
        let budget = Duration::from_secs(4);
        let cases = fuzz::run("peer stream", 0xb007_57a9, 400, budget, fuzz_peer_case);
        assert!(cases >= 20, "only {cases} cases");
    }

    #[test]
    fn a_failure_report_is_shown_as_one_printable_line() {
        let peers = rank0_of_2();
        let mut s = as_rank1(&peers);
        s.write_all(&frame(KIND_FAIL, 0, 10, b"bad\n\x1b[2J\xff!"))
            .unwrap();
        let msg = recv_error(&peers);
        assert_eq!(
            msg,
            "bootstrap: rank 1 failed: bad\u{fffd}\u{fffd}[2J\u{fffd}!"
        );
    }
}
