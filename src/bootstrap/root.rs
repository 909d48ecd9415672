//! The bootstrap root: a background thread that waits for one block of ranks to register
//! (rank, nranks, listening address, secret), then tells each its ring neighbour's address
//! and the block's address table, and exits. It refuses strangers, names ranks that give a
//! wrong nranks, die before the end (connection closed) or never arrive (timeout), and tells
//! every registered rank. Also the rank's side of registering (`register`).
//!
//! With several roots (`ncclCommInitRankScalable`) ranks are spread over the roots in
//! contiguous blocks (`block_of`); the first rank of block b+1 also registers with root b as
//! its "neighbour", so root b can give its last rank the next rank's address.

use super::id::{decode_addr, encode_addr, secrets_equal, Secret, ADDR_LEN, SECRET_LEN};
use super::socket::{self, fmt_secs, Limits};
use crate::abi::ncclResult_t;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

const REG_MAGIC: &[u8; 8] = b"OXBSROOT";
/// Bytes of a registration: magic, secret, rank, nranks, root, nroots, role, pad, address.
const REG_LEN: usize = 8 + SECRET_LEN + 4 * 6 + ADDR_LEN;
/// Most missing ranks a timeout names by number.
const MISSING_LISTED: usize = 16;
/// How long a connection may take to send its registration before the root drops it.
const HELLO_LIMIT: Duration = Duration::from_secs(10);

/// First rank of root `root`'s block (NCCL's distribution: the first `nranks % nroots` roots
/// get one extra rank).
pub fn first_rank_of(root: i32, nranks: i32, nroots: i32) -> i32 {
    root * (nranks / nroots) + root.min(nranks % nroots)
}

/// The root whose block holds `rank`.
pub fn block_of(rank: i32, nranks: i32, nroots: i32) -> i32 {
    let per_root = nranks / nroots;
    let extra = nranks % nroots;
    let split = extra * (per_root + 1);
    if rank < split {
        rank / (per_root + 1)
    } else {
        (rank - split) / per_root + extra
    }
}

/// What a rank tells a root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    pub rank: i32,
    pub nranks: i32,
    pub root: i32,
    pub nroots: i32,
    /// True when this is the first rank of the next block registering as the neighbour.
    pub neighbour: bool,
    pub addr: SocketAddr,
}

impl Registration {
    fn encode(&self, secret: &Secret) -> [u8; REG_LEN] {
        let mut out = [0u8; REG_LEN];
        out[..8].copy_from_slice(REG_MAGIC);
        out[8..24].copy_from_slice(secret);
        let ints = [
            self.rank,
            self.nranks,
            self.root,
            self.nroots,
            self.neighbour as i32,
            0,
        ];
        for (i, v) in ints.iter().enumerate() {
            out[24 + 4 * i..28 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        out[48..48 + ADDR_LEN].copy_from_slice(&encode_addr(&self.addr));
        out
    }

    /// Decode and authenticate; Err says why the bytes are not a registration for `secret`.
    fn decode(bytes: &[u8; REG_LEN], secret: &Secret) -> std::result::Result<Self, &'static str> {
        if &bytes[..8] != REG_MAGIC {
            return Err("not a bootstrap registration");
        }
        if !secrets_equal(&bytes[8..24], secret) {
            return Err("wrong secret");
        }
        let int = |i: usize| i32::from_le_bytes(bytes[24 + 4 * i..28 + 4 * i].try_into().unwrap());
        let addr = decode_addr(&bytes[48..48 + ADDR_LEN]).ok_or("bad address")?;
        Ok(Registration {
            rank: int(0),
            nranks: int(1),
            root: int(2),
            nroots: int(3),
            neighbour: int(4) != 0,
            addr,
        })
    }
}

/// What a root answers a rank (on success).
#[derive(Clone, Debug)]
pub struct RootReply {
    /// The listening address of rank (rank + 1) % nranks.
    pub next: SocketAddr,
    /// First rank of the block and the block's listening addresses.
    pub first: i32,
    pub table: Vec<SocketAddr>,
}

/// Most ranks a communicator may have: a registration claiming more is refused before the
/// root sizes anything by it.
pub const MAX_NRANKS: i32 = 1 << 24;

impl RootReply {
    /// Check a root's answer against the communicator's size before using it: its block must
    /// lie within the ranks (a buggy or version-skewed root must not make us index out of
    /// range).
    pub fn check(&self, nranks: i32, root_addr: &SocketAddr) -> Result<()> {
        let end = self.first as i64 + self.table.len() as i64;
        if self.first < 0 || self.table.is_empty() || end > nranks as i64 {
            return Err(Error::internal(format!(
                "bootstrap: the bootstrap root at {root_addr} answered a block of {} ranks from \
                 rank {}, outside the {nranks} ranks of this communicator",
                self.table.len(),
                self.first
            )));
        }
        Ok(())
    }
}

fn encode_ok(reply: &RootReply) -> Vec<u8> {
    let mut payload = Vec::with_capacity(8 + ADDR_LEN * (1 + reply.table.len()));
    payload.extend_from_slice(&reply.first.to_le_bytes());
    payload.extend_from_slice(&(reply.table.len() as u32).to_le_bytes());
    payload.extend_from_slice(&encode_addr(&reply.next));
    for a in &reply.table {
        payload.extend_from_slice(&encode_addr(a));
    }
    frame_reply(0, &payload)
}

fn frame_reply(code: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&code.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

fn encode_err(err: &Error) -> Vec<u8> {
    frame_reply(err.code as u32, err.msg.as_bytes())
}

fn code_from(n: u32) -> ncclResult_t {
    match n {
        1 => ncclResult_t::ncclUnhandledCudaError,
        2 => ncclResult_t::ncclSystemError,
        4 => ncclResult_t::ncclInvalidArgument,
        5 => ncclResult_t::ncclInvalidUsage,
        6 => ncclResult_t::ncclRemoteError,
        _ => ncclResult_t::ncclInternalError,
    }
}

/// Start a root thread on `listener`. It serves one rendezvous: it waits `timeout` after the
/// first registration (and at most `idle` for that first one), then exits.
pub fn spawn_root(
    listener: TcpListener,
    secret: Secret,
    timeout: Duration,
    idle: Duration,
) -> Result<std::thread::JoinHandle<()>> {
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::system(format!("bootstrap root: {e}")))?;
    std::thread::Builder::new()
        .name("oxccl-boot-root".into())
        .spawn(move || {
            let local = listener.local_addr().ok();
            let mut root = Root {
                listener,
                secret,
                timeout,
                pending: Vec::new(),
                joined: BTreeMap::new(),
                neighbour: None,
                layout: None,
                failed: None,
                answered: 0,
            };
            root.run(idle);
            match local {
                Some(addr) => crate::info!(BOOTSTRAP, "bootstrap root at {addr} done"),
                None => crate::info!(BOOTSTRAP, "bootstrap root done"),
            }
        })
        .map_err(|e| Error::system(format!("bootstrap: cannot start the root thread: {e}")))
}

struct Pending {
    stream: TcpStream,
    buf: [u8; REG_LEN],
    got: usize,
    since: Instant,
    peer: String,
}

struct Joined {
    stream: TcpStream,
    reg: Registration,
}

/// How the ranks are split among the roots (nranks, this root's index, nroots, its block),
/// fixed by the first registration.
#[derive(Clone, Copy)]
struct RootLayout {
    nranks: i32,
    root: i32,
    nroots: i32,
    first_rank: i32,
    block: i32,
    first_reporter: i32,
}

impl RootLayout {
    fn neighbour_rank(&self) -> Option<i32> {
        (self.nroots > 1)
            .then(|| first_rank_of((self.root + 1) % self.nroots, self.nranks, self.nroots))
    }
    /// Registrations this root waits for.
    fn expected(&self) -> usize {
        self.block as usize + self.neighbour_rank().is_some() as usize
    }
}

struct Root {
    listener: TcpListener,
    secret: Secret,
    timeout: Duration,
    pending: Vec<Pending>,
    joined: BTreeMap<i32, Joined>,
    neighbour: Option<Joined>,
    layout: Option<RootLayout>,
    failed: Option<Error>,
    answered: usize,
}

enum Step {
    Continue,
    Done,
}

impl Root {
    fn run(&mut self, idle: Duration) {
        let start = Instant::now();
        let mut deadline = start + idle;
        let mut first_arrival = None;
        loop {
            if self.layout.is_some() && first_arrival.is_none() {
                let now = Instant::now();
                first_arrival = Some(now);
                deadline = now + self.timeout;
            }
            let now = Instant::now();
            if now >= deadline {
                self.on_timeout();
                return;
            }
            let mut fds = vec![socket::pollfd(self.listener.as_raw_fd())];
            fds.extend(
                self.pending
                    .iter()
                    .map(|p| socket::pollfd(p.stream.as_raw_fd())),
            );
            let joined_ranks: Vec<i32> = self.joined.keys().copied().collect();
            fds.extend(
                self.joined
                    .values()
                    .map(|j| socket::pollfd(j.stream.as_raw_fd())),
            );
            if let Some(n) = &self.neighbour {
                fds.push(socket::pollfd(n.stream.as_raw_fd()));
            }
            let wait = deadline
                .saturating_duration_since(now)
                .min(socket::POLL_INTERVAL);
            if let Err(e) = socket::poll(&mut fds, wait) {
                crate::warn!("bootstrap root: poll failed: {e}");
                self.fail(Error::system(format!("bootstrap root: poll failed: {e}")));
                return;
            }
            // Connections that closed after registering: the rank died or gave up.
            let npending = self.pending.len();
            let mut closed = Vec::new();
            let mut why = None;
            for (i, rank) in joined_ranks.iter().enumerate() {
                if socket::ready(&fds[1 + npending + i]) {
                    if let Some(ended) = ended(&self.joined[rank].stream) {
                        closed.push(*rank);
                        why.get_or_insert((*rank, ended));
                    }
                }
            }
            if let Some(n) = &self.neighbour {
                if socket::ready(fds.last().unwrap()) {
                    if let Some(ended) = ended(&n.stream) {
                        closed.push(n.reg.rank);
                        why.get_or_insert((n.reg.rank, ended));
                    }
                }
            }
            if let Some((rank, ended)) = why {
                if self.failed.is_none() {
                    let g = self.layout.unwrap();
                    self.fail(ended.error(rank, g.nranks));
                }
                self.joined.retain(|r, _| !closed.contains(r));
                if self
                    .neighbour
                    .as_ref()
                    .is_some_and(|n| closed.contains(&n.reg.rank))
                {
                    self.neighbour = None;
                }
            }
            let readable: Vec<bool> = (0..npending).map(|i| socket::ready(&fds[1 + i])).collect();
            if let Step::Done = self.read_pending(&readable) {
                return;
            }
            if socket::ready(&fds[0]) {
                self.accept_all();
            }
            if self.failed.is_some() {
                let expected = self.layout.map_or(usize::MAX, |g| g.expected());
                if self.answered >= expected {
                    return;
                }
            }
        }
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    if stream.set_nonblocking(true).is_ok() {
                        self.pending.push(Pending {
                            stream,
                            buf: [0; REG_LEN],
                            got: 0,
                            since: Instant::now(),
                            peer: peer.to_string(),
                        });
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    crate::warn!("bootstrap root: accept failed: {e}");
                    return;
                }
            }
        }
    }

    fn read_pending(&mut self, readable: &[bool]) -> Step {
        let mut keep = Vec::new();
        let pending = std::mem::take(&mut self.pending);
        let mut step = Step::Continue;
        for (i, mut p) in pending.into_iter().enumerate() {
            if matches!(step, Step::Done) {
                break;
            }
            if !readable.get(i).copied().unwrap_or(false) {
                if p.since.elapsed() > HELLO_LIMIT.min(self.timeout) {
                    crate::warn!(
                        "bootstrap root: dropped a connection from {} that sent no registration",
                        p.peer
                    );
                } else {
                    keep.push(p);
                }
                continue;
            }
            match p.stream.read(&mut p.buf[p.got..]) {
                Ok(0) => {} // Closed before registering: a stranger or a probe; nothing to do.
                Ok(n) => {
                    p.got += n;
                    if p.got < REG_LEN {
                        keep.push(p);
                        continue;
                    }
                    match Registration::decode(&p.buf, &self.secret) {
                        Ok(reg) => step = self.on_registration(p.stream, reg),
                        Err(why) => {
                            crate::warn!(
                                "bootstrap root: refused a connection from {}: {why}",
                                p.peer
                            )
                        }
                    }
                }
                Err(e)
                    if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted =>
                {
                    keep.push(p)
                }
                Err(_) => {}
            }
        }
        self.pending = keep;
        step
    }

    fn on_registration(&mut self, stream: TcpStream, reg: Registration) -> Step {
        if let Err(e) = self.check(&reg) {
            crate::warn!("{}", e.msg);
            reply(&stream, &encode_err(&e), self.timeout);
            // A rank with the wrong layout dooms the whole rendezvous.
            if self.failed.is_none() {
                self.fail(e);
            }
            return Step::Continue;
        }
        if let Some(err) = &self.failed {
            reply(&stream, &encode_err(err), self.timeout);
            self.answered += 1;
            return Step::Continue;
        }
        crate::trace!(
            INIT,
            "bootstrap root: rank {} joined from {}",
            reg.rank,
            reg.addr
        );
        if reg.neighbour {
            self.neighbour = Some(Joined { stream, reg });
        } else {
            self.joined.insert(reg.rank, Joined { stream, reg });
        }
        let g = self.layout.unwrap();
        if self.joined.len() == g.block as usize && (self.neighbour.is_some() || g.nroots == 1) {
            self.complete(g);
            return Step::Done;
        }
        Step::Continue
    }

    /// Validate a registration against the layout of the first one (which it sets).
    fn check(&mut self, reg: &Registration) -> Result<()> {
        if reg.nranks < 1
            || reg.nranks > MAX_NRANKS
            || reg.nroots < 1
            || reg.nroots > reg.nranks
            || reg.root < 0
            || reg.root >= reg.nroots
        {
            return Err(Error::invalid_argument(format!(
                "bootstrap: rank {} registered with nranks {} and root {} of {}",
                reg.rank, reg.nranks, reg.root, reg.nroots
            )));
        }
        let g = *self.layout.get_or_insert_with(|| RootLayout {
            nranks: reg.nranks,
            root: reg.root,
            nroots: reg.nroots,
            first_rank: first_rank_of(reg.root, reg.nranks, reg.nroots),
            block: first_rank_of(reg.root + 1, reg.nranks, reg.nroots)
                - first_rank_of(reg.root, reg.nranks, reg.nroots),
            first_reporter: reg.rank,
        });
        if reg.nranks != g.nranks {
            return Err(Error::invalid_argument(format!(
                "bootstrap: rank {} called init with nranks {} but rank {} used nranks {}",
                reg.rank, reg.nranks, g.first_reporter, g.nranks
            )));
        }
        if reg.nroots != g.nroots || reg.root != g.root {
            return Err(Error::invalid_argument(format!(
                "bootstrap: rank {} sees {} unique ids (this is root {}) but rank {} sees {} (root {})",
                reg.rank, reg.nroots, reg.root, g.first_reporter, g.nroots, g.root
            )));
        }
        let in_block = reg.rank >= g.first_rank && reg.rank < g.first_rank + g.block;
        let valid = if reg.neighbour {
            Some(reg.rank) == g.neighbour_rank()
        } else {
            in_block
        };
        if !valid {
            return Err(Error::invalid_argument(format!(
                "bootstrap: rank {} of {} registered with root {} which serves ranks {}..{}",
                reg.rank,
                g.nranks,
                g.root,
                g.first_rank,
                g.first_rank + g.block - 1
            )));
        }
        let dup = if reg.neighbour {
            self.neighbour.is_some()
        } else {
            self.joined.contains_key(&reg.rank)
        };
        if dup {
            return Err(Error::invalid_argument(format!(
                "bootstrap: rank {} of {} joined twice (two processes with the same rank?)",
                reg.rank, g.nranks
            )));
        }
        Ok(())
    }

    fn complete(&mut self, g: RootLayout) {
        let table: Vec<SocketAddr> = self.joined.values().map(|j| j.reg.addr).collect();
        let addr_of = |rank: i32| -> SocketAddr {
            if rank >= g.first_rank && rank < g.first_rank + g.block {
                table[(rank - g.first_rank) as usize]
            } else {
                self.neighbour
                    .as_ref()
                    .map(|n| n.reg.addr)
                    .unwrap_or(table[0])
            }
        };
        for j in self.joined.values() {
            let msg = encode_ok(&RootReply {
                next: addr_of((j.reg.rank + 1) % g.nranks),
                first: g.first_rank,
                table: table.clone(),
            });
            reply(&j.stream, &msg, self.timeout);
        }
        if let Some(n) = &self.neighbour {
            // The neighbour learns this block's addresses too, to report failures to it.
            let msg = encode_ok(&RootReply {
                next: n.reg.addr,
                first: g.first_rank,
                table: table.clone(),
            });
            reply(&n.stream, &msg, self.timeout);
        }
        crate::info!(
            BOOTSTRAP,
            "bootstrap root: ranks {}..{} of {} joined",
            g.first_rank,
            g.first_rank + g.block - 1,
            g.nranks
        );
    }

    /// Tell every registered rank the rendezvous failed; later arrivals get the same answer.
    fn fail(&mut self, err: Error) {
        let msg = encode_err(&err);
        for j in self.joined.values().chain(self.neighbour.iter()) {
            reply(&j.stream, &msg, self.timeout);
        }
        self.answered += self.joined.len() + self.neighbour.is_some() as usize;
        self.joined.clear();
        self.neighbour = None;
        self.failed = Some(err);
    }

    /// The ranks that have not registered, the first `MISSING_LISTED` by number ("[2, 6,
    /// 7]"): nothing is sized by the block, whose size a registration chose.
    fn missing(&self, g: RootLayout) -> String {
        let neighbour = g.neighbour_rank().filter(|_| self.neighbour.is_none());
        let count = g.block as usize - self.joined.len() + neighbour.is_some() as usize;
        let listed: Vec<String> = (g.first_rank..g.first_rank + g.block)
            .filter(|r| !self.joined.contains_key(r))
            .chain(neighbour)
            .take(MISSING_LISTED)
            .map(|r| r.to_string())
            .collect();
        let more = count - listed.len();
        let more = if more > 0 {
            format!(", and {more} more")
        } else {
            String::new()
        };
        format!("[{}{more}]", listed.join(", "))
    }

    fn on_timeout(&mut self) {
        if self.failed.is_some() {
            return;
        }
        let Some(g) = self.layout else {
            crate::warn!("bootstrap root: no rank joined within the time limit; the root exits");
            return;
        };
        let err = Error::system(format!(
            "bootstrap: timed out after {} waiting for ranks {} of {} to join",
            fmt_secs(self.timeout),
            self.missing(g),
            g.nranks
        ));
        crate::warn!("{}", err.msg);
        self.fail(err);
    }
}

/// How a registered rank's connection ended: it never sends after registering, so bytes
/// are a broken (or version-skewed) peer, ended like a closed connection.
enum Ended {
    Closed,
    Talked,
}

impl Ended {
    fn error(&self, rank: i32, nranks: i32) -> Error {
        match self {
            Ended::Closed => Error::remote(format!(
                "bootstrap: rank {rank} of {nranks} closed its connection to the bootstrap root \
                 before the rendezvous completed (process exited or aborted?)"
            )),
            Ended::Talked => Error::internal(format!(
                "bootstrap: rank {rank} of {nranks} sent the bootstrap root more than a \
                 registration (a different oxccl version?)"
            )),
        }
    }
}

/// Whether a registered rank's readable connection has ended, and how.
fn ended(stream: &TcpStream) -> Option<Ended> {
    let mut byte = [0u8; 1];
    let mut s = stream;
    match s.read(&mut byte) {
        Ok(0) => Some(Ended::Closed),
        Ok(_) => Some(Ended::Talked),
        Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => None,
        Err(_) => Some(Ended::Closed),
    }
}

/// Best-effort write of a reply (a rank that does not read is a dead rank).
fn reply(stream: &TcpStream, msg: &[u8], timeout: Duration) {
    let never = AtomicBool::new(false);
    let _ = stream.set_nonblocking(false);
    let limits = Limits::new(timeout.min(Duration::from_secs(10)), &never);
    let _ = socket::write_all(stream, msg, &limits);
}

/// A rank's side: register with the root at `root_addr` and wait for its answer.
pub fn register(
    root_addr: &SocketAddr,
    secret: &Secret,
    reg: &Registration,
    limits: &Limits<'_>,
) -> Result<TcpStream> {
    let what = format!("connecting to the bootstrap root at {root_addr}");
    let stream =
        socket::connect(root_addr, true, limits).map_err(|e| e.into_error(limits, &what))?;
    let what = format!("registering with the bootstrap root at {root_addr}");
    socket::write_all(&stream, &reg.encode(secret), limits)
        .map_err(|e| e.into_error(limits, &what))?;
    Ok(stream)
}

/// Wait for the root's answer on a stream `register` returned.
pub fn await_reply(
    stream: &TcpStream,
    root_addr: &SocketAddr,
    limits: &Limits<'_>,
) -> Result<RootReply> {
    let what =
        format!("waiting for the bootstrap root at {root_addr} to answer (are all ranks started?)");
    let io = |e: socket::WaitError| match e {
        socket::WaitError::Closed => Error::remote(format!(
            "bootstrap: the bootstrap root at {root_addr} closed the connection before answering"
        )),
        e => e.into_error(limits, &what),
    };
    let mut head = [0u8; 8];
    socket::read_exact(stream, &mut head, limits).map_err(io)?;
    let code = u32::from_le_bytes(head[..4].try_into().unwrap());
    let len = u32::from_le_bytes(head[4..].try_into().unwrap()) as usize;
    // An error is a line of text; a table, at most 28 bytes a rank.
    let limit = if code == 0 { 64 << 20 } else { 64 << 10 };
    if len > limit {
        return Err(Error::internal(format!(
            "bootstrap: the bootstrap root at {root_addr} answered {len} bytes (code {code}), \
             more than is plausible"
        )));
    }
    let mut payload = vec![0u8; len];
    socket::read_exact(stream, &mut payload, limits).map_err(io)?;
    if code != 0 {
        return Err(Error::new(code_from(code), socket::printable(&payload)));
    }
    let bad = || Error::internal("bootstrap: malformed answer from the bootstrap root");
    if payload.len() < 8 + ADDR_LEN {
        return Err(bad());
    }
    let first = i32::from_le_bytes(payload[..4].try_into().unwrap());
    let count = u32::from_le_bytes(payload[4..8].try_into().unwrap()) as usize;
    let next = decode_addr(&payload[8..]).ok_or_else(bad)?;
    if payload.len() != 8 + ADDR_LEN * (1 + count) {
        return Err(bad());
    }
    let table = payload[8 + ADDR_LEN..]
        .chunks(ADDR_LEN)
        .map(decode_addr)
        .collect::<Option<Vec<_>>>()
        .ok_or_else(bad)?;
    Ok(RootReply { next, first, table })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::fuzz::{self, Rng};
    use std::io::Write;
    use std::net::Shutdown;

    #[test]
    fn blocks_cover_ranks_contiguously() {
        for nranks in 1..40 {
            for nroots in 1..=nranks.min(7) {
                let mut expect_root = 0;
                for rank in 0..nranks {
                    let b = block_of(rank, nranks, nroots);
                    if rank == first_rank_of(expect_root + 1, nranks, nroots) {
                        expect_root += 1;
                    }
                    assert_eq!(
                        b, expect_root,
                        "rank {rank} nranks {nranks} nroots {nroots}"
                    );
                    assert!(rank >= first_rank_of(b, nranks, nroots));
                    assert!(rank < first_rank_of(b + 1, nranks, nroots));
                }
                assert_eq!(first_rank_of(nroots, nranks, nroots), nranks);
            }
        }
    }

    #[test]
    fn registration_round_trip() {
        let secret = *b"0123456789abcdef";
        let reg = Registration {
            rank: 3,
            nranks: 8,
            root: 1,
            nroots: 2,
            neighbour: true,
            addr: "[::1]:5".parse().unwrap(),
        };
        let bytes = reg.encode(&secret);
        assert_eq!(Registration::decode(&bytes, &secret), Ok(reg));
        assert!(Registration::decode(&bytes, b"0123456789abcdeX").is_err());
    }

    const SECRET: Secret = *b"0123456789abcdef";

    /// Where a fuzz round's registrations aim: (nranks, root, nroots).
    fn fuzz_layout(rng: &mut Rng) -> (i32, i32, i32) {
        let nranks = if rng.one_in(4) {
            rng.pick(&[MAX_NRANKS, MAX_NRANKS - 1])
        } else {
            1 + rng.below(3) as i32
        };
        let nroots = 1 + rng.below(nranks.min(3) as u64) as i32;
        (nranks, rng.below(nroots as u64) as i32, nroots)
    }

    fn fuzz_addr(rng: &mut Rng) -> SocketAddr {
        let port = rng.next_u64() as u16;
        if rng.one_in(2) {
            SocketAddr::from(((rng.next_u64() as u32).to_be_bytes(), port))
        } else {
            SocketAddr::from((((rng.next_u64() as u128) << 64).to_be_bytes(), port))
        }
    }

    /// What one connection sends a root: a registration near `layout` with fields at edges,
    /// damaged, followed by bytes, or the magic and secret followed by anything.
    fn fuzz_registration(rng: &mut Rng, layout: (i32, i32, i32)) -> Vec<u8> {
        let (nranks, root, nroots) = layout;
        if rng.one_in(10) {
            let n = rng.below(2 * REG_LEN as u64) as usize;
            return rng.bytes(n);
        }
        if rng.one_in(8) {
            let mut b = Vec::from(*REG_MAGIC);
            b.extend_from_slice(&SECRET);
            let short = rng.below(REG_LEN as u64) as usize;
            let n = rng.pick(&[REG_LEN - 24, REG_LEN, short]);
            b.extend(rng.bytes(n));
            return b;
        }
        let edges = [
            0,
            -1,
            i32::MAX,
            i32::MIN,
            MAX_NRANKS - 1,
            MAX_NRANKS,
            MAX_NRANKS + 1,
        ];
        let edge = rng.pick(&edges);
        let reg = Registration {
            rank: rng.edgy_i32(nranks - 1),
            nranks: if rng.one_in(4) { edge } else { nranks },
            root: if rng.one_in(5) {
                rng.edgy_i32(nroots)
            } else {
                root
            },
            nroots: if rng.one_in(5) {
                rng.edgy_i32(nranks)
            } else {
                nroots
            },
            neighbour: rng.one_in(4),
            addr: fuzz_addr(rng),
        };
        let mut b = reg.encode(&SECRET).to_vec();
        if rng.one_in(8) {
            let i = 24 + rng.below((REG_LEN - 24) as u64) as usize;
            b[i] = rng.next_u64() as u8;
        }
        if rng.one_in(8) {
            let n = 1 + rng.below(32) as usize;
            b.extend(rng.bytes(n));
        }
        b
    }

    /// Read what the root answers until it closes; the answer must be one well-formed
    /// reply (or nothing) and come before `deadline`.
    fn read_answer(mut s: &TcpStream, deadline: Instant) {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no answer or close before the deadline");
            s.set_read_timeout(Some(left)).unwrap();
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if socket::is_closed(&e) => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => panic!("no answer or close before the deadline: {e}"),
            }
            assert!(got.len() <= 1 << 20, "an answer of more than 1 MiB");
        }
        if got.is_empty() {
            return;
        }
        assert!(got.len() >= 8, "a truncated answer");
        let len = u32::from_le_bytes(got[4..8].try_into().unwrap()) as usize;
        assert_eq!(got.len(), 8 + len, "one answer, whole");
    }

    /// One root and the connections of one round; every connection is answered or closed
    /// within the time limit, and the root ends without panicking.
    fn fuzz_root(rng: &mut Rng) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let timeout = Duration::from_millis(200);
        let root = spawn_root(listener, SECRET, timeout, Duration::from_millis(300)).unwrap();
        let layout = fuzz_layout(rng);
        let mut conns = Vec::new();
        // Often few: a rendezvous that one bad registration dooms ends early.
        let most = 1 + rng.below(10);
        let count = 1 + rng.below(most);
        for _ in 0..count {
            // A root that completed or gave up no longer listens: that is a close too.
            let Ok(mut s) = TcpStream::connect(addr) else {
                continue;
            };
            let _ = s.write_all(&fuzz_registration(rng, layout));
            if rng.one_in(6) {
                let _ = s.shutdown(Shutdown::Write);
            }
            conns.push(s);
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        for s in &conns {
            read_answer(s, deadline);
        }
        while !root.is_finished() {
            assert!(Instant::now() < deadline, "the root thread did not end");
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Err(panic) = root.join() {
            std::panic::resume_unwind(panic);
        }
    }

    /// Fuzzed registrations: every one gets an answer or a close within the time limit, no
    /// answer is huge, and the root thread never panics. Roots run four at a time (each
    /// spends most of its life waiting).
    #[test]
    fn fuzz_root_registration() {
        let budget = Duration::from_secs(4);
        let cases = fuzz::run("root registration", 0x5eed_2007, 200, budget, |rng| {
            let seeds: Vec<u64> = (0..4).map(|_| rng.next_u64()).collect();
            std::thread::scope(|s| {
                let rounds: Vec<_> = seeds
                    .iter()
                    .map(|&seed| s.spawn(move || fuzz_root(&mut Rng::new(seed))))
                    .collect();
                for r in rounds {
                    if let Err(panic) = r.join() {
                        std::panic::resume_unwind(panic);
                    }
                }
            });
        });
        assert!(cases >= 5, "only {cases} cases");
    }

    #[test]
    fn a_timeout_of_a_huge_block_names_the_missing_ranks_briefly() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let timeout = Duration::from_millis(200);
        let root = spawn_root(listener, SECRET, timeout, Duration::from_secs(5)).unwrap();
        let never = AtomicBool::new(false);
        let limits = Limits::new(Duration::from_secs(10), &never);
        let reg = Registration {
            rank: 0,
            nranks: MAX_NRANKS,
            root: 0,
            nroots: 1,
            neighbour: false,
            addr,
        };
        let stream = register(&addr, &SECRET, &reg, &limits).unwrap();
        let started = Instant::now();
        let msg = await_reply(&stream, &addr, &limits).unwrap_err().msg;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(msg.len() < 1000, "{} bytes", msg.len());
        assert!(
            msg.contains("ranks [1, 2, 3, ") && msg.contains("16, and 16777199 more] of 16777216"),
            "{msg}"
        );
        root.join().unwrap();
    }

    #[test]
    fn bytes_after_a_registration_fail_the_rendezvous_naming_the_rank() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let root = spawn_root(
            listener,
            SECRET,
            Duration::from_secs(10),
            Duration::from_secs(10),
        );
        let never = AtomicBool::new(false);
        let limits = Limits::new(Duration::from_secs(10), &never);
        let reg = |rank| Registration {
            rank,
            nranks: 3,
            root: 0,
            nroots: 1,
            neighbour: false,
            addr,
        };
        let first = register(&addr, &SECRET, &reg(0), &limits).unwrap();
        let mut talker = register(&addr, &SECRET, &reg(1), &limits).unwrap();
        talker.write_all(b"more").unwrap();
        let msg = await_reply(&first, &addr, &limits).unwrap_err().msg;
        assert!(
            msg.contains("rank 1 of 3 sent the bootstrap root more"),
            "{msg}"
        );
        // The rendezvous is over for the last rank too, which learns why.
        let last = register(&addr, &SECRET, &reg(2), &limits).unwrap();
        assert_eq!(await_reply(&last, &addr, &limits).unwrap_err().msg, msg);
        root.unwrap().join().unwrap();
    }
}
