//! Bootstrap: unique ids, the TCP rendezvous among ranks, and host-side collectives
//! (allgather, barrier, tagged send/recv) used by init and by the transports.
//!
//! `get_unique_id` starts a root thread (`root.rs`) and encodes its address and a random
//! secret in the id (`id.rs`). `Bootstrap::init` opens this rank's listener (`peers.rs`),
//! registers with the root, and learns every rank's listening address: directly from the
//! root with one id, or around a ring with several. Every connection proves it knows the
//! secret. Every wait is bounded by `NCCL_BOOTSTRAP_TIMEOUT` and polls the abort flag at
//! least every 100 ms (`socket.rs`).
//!
//! Collectives (`allgather`, `barrier`) must be called in the same order on every rank, as
//! in NCCL; `send`/`recv` may be used from any thread. While the communicator lives, its
//! watchdog uses the same connections through a `Link` (`link.rs`).

pub mod crypt;
pub mod id;
pub mod link;
pub mod peers;
pub mod root;
pub mod socket;

#[cfg(test)]
pub(crate) mod fuzz;
#[cfg(test)]
mod tests;

use crate::abi::ncclUniqueId;
use crate::error::{Error, Result};
use id::{IdInfo, Secret, ADDR_LEN};
use peers::{Peers, KIND_COLL, KIND_RING, KIND_SUB, KIND_USER};
use socket::Limits;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// Settings of a rendezvous (tests pass their own instead of setting the environment).
#[derive(Clone, Copy, Debug)]
pub struct BootstrapConfig {
    /// Bound on every wait (`NCCL_BOOTSTRAP_TIMEOUT`, seconds, default 300).
    pub timeout: Duration,
}

impl BootstrapConfig {
    /// The settings from the environment.
    pub fn from_env() -> Self {
        let secs = crate::env::registry::BOOTSTRAP_TIMEOUT.int().max(1);
        BootstrapConfig {
            timeout: Duration::from_secs(secs as u64),
        }
    }

    /// How long a rank waits for the root's answer: longer than the root's own limit, so the
    /// root's message (which names the missing ranks) arrives first.
    fn root_wait(&self) -> Duration {
        self.timeout + (self.timeout / 10).max(Duration::from_secs(1))
    }

    /// How long a root waits for its first rank.
    fn root_idle(&self) -> Duration {
        self.timeout.max(Duration::from_secs(600))
    }
}

/// A fresh unique id for a new communicator.
/// `ncclSetEncryption`: the encryption of connections made from now on.
pub fn set_encryption(mode: crypt::Encryption) -> Result<()> {
    crypt::set(mode);
    Ok(())
}

pub fn get_unique_id() -> Result<ncclUniqueId> {
    get_unique_id_with(&BootstrapConfig::from_env())
}

/// `get_unique_id` with explicit settings. With `NCCL_COMM_ID` set, the id names that
/// address (and a secret derived from it) and no root starts here: rank 0 starts it in init.
pub fn get_unique_id_with(cfg: &BootstrapConfig) -> Result<ncclUniqueId> {
    if let Some(text) = crate::env::registry::COMM_ID.get() {
        crate::info!(ENV, "NCCL_COMM_ID set by environment to {text}");
        let root = id::parse_comm_id(&text)?;
        return Ok(IdInfo {
            secret: id::secret_from_text(&text),
            root,
            root_at_init: true,
        }
        .encode());
    }
    let netif = socket::bootstrap_interface()?;
    let listener = socket::listen_on(&netif)?;
    let root = listener
        .local_addr()
        .map_err(|e| Error::system(format!("bootstrap: {e}")))?;
    let secret = id::random_secret()?;
    root::spawn_root(listener, secret, cfg.timeout, cfg.root_idle())?;
    crate::info!(BOOTSTRAP, "bootstrap root listening on {root}");
    Ok(IdInfo {
        secret,
        root,
        root_at_init: false,
    }
    .encode())
}

/// One rank's membership of a communicator's bootstrap network.
pub struct Bootstrap {
    rank: i32,
    nranks: i32,
    secret: Secret,
    cfg: BootstrapConfig,
    peers: Arc<Peers>,
    abort: Arc<AtomicBool>,
}

impl Bootstrap {
    /// Join the rendezvous described by `ids` (one per root; ranks are spread over the roots
    /// in contiguous blocks). `abort` is checked during every wait.
    pub fn init(
        ids: &[ncclUniqueId],
        rank: i32,
        nranks: i32,
        abort: Arc<AtomicBool>,
    ) -> Result<Bootstrap> {
        Self::init_with(ids, rank, nranks, abort, &BootstrapConfig::from_env())
    }

    /// `init` with explicit settings.
    pub fn init_with(
        ids: &[ncclUniqueId],
        rank: i32,
        nranks: i32,
        abort: Arc<AtomicBool>,
        cfg: &BootstrapConfig,
    ) -> Result<Bootstrap> {
        if nranks < 1 || rank < 0 || rank >= nranks {
            crate::bail_arg!("bootstrap: rank {rank} is not within nranks {nranks}");
        }
        crypt::check_plaintext("bootstrap")?;
        if nranks > root::MAX_NRANKS {
            crate::bail_arg!(
                "bootstrap: nranks {nranks} is more than the {} ranks supported",
                root::MAX_NRANKS
            );
        }
        if ids.is_empty() || ids.len() > nranks as usize {
            crate::bail_arg!(
                "bootstrap: {} unique ids for {nranks} ranks (need 1 to nranks)",
                ids.len()
            );
        }
        let infos = ids.iter().map(IdInfo::decode).collect::<Result<Vec<_>>>()?;
        let nroots = infos.len() as i32;
        let my_root = root::block_of(rank, nranks, nroots);
        let first_of_block = root::first_rank_of(my_root, nranks, nroots);
        if rank == first_of_block && infos[my_root as usize].root_at_init {
            let info = &infos[my_root as usize];
            let listener = TcpListener::bind(info.root).map_err(|e| {
                Error::system(format!(
                    "bootstrap: rank {rank} cannot start the bootstrap root at {} (NCCL_COMM_ID): {e}",
                    info.root
                ))
            })?;
            root::spawn_root(listener, info.secret, cfg.timeout, cfg.root_idle())?;
        }
        let netif = socket::bootstrap_interface()?;
        let listener = socket::listen_on(&netif)?;
        let boot = Bootstrap::start(listener, rank, nranks, infos[0].secret, *cfg, abort)?;
        boot.rendezvous(&infos, my_root, first_of_block)
            .and_then(|_| boot.connect_ring())
            .inspect_err(|e| boot.fail(e))?;
        crate::info!(
            INIT,
            "bootstrap: rank {rank} of {nranks} joined ({} root(s))",
            nroots
        );
        Ok(boot)
    }

    fn start(
        listener: TcpListener,
        rank: i32,
        nranks: i32,
        secret: Secret,
        cfg: BootstrapConfig,
        abort: Arc<AtomicBool>,
    ) -> Result<Bootstrap> {
        let peers = Arc::new(Peers::start(listener, rank, nranks, secret)?);
        peers.set_addr(rank, peers.listen_addr());
        Ok(Bootstrap {
            rank,
            nranks,
            secret,
            cfg,
            peers,
            abort,
        })
    }

    fn rendezvous(&self, infos: &[IdInfo], my_root: i32, first_of_block: i32) -> Result<()> {
        let (rank, nranks, nroots) = (self.rank, self.nranks, infos.len() as i32);
        let limits = Limits::new(self.cfg.root_wait(), &self.abort);
        let my_addr = self.peers.listen_addr();
        let reg = root::Registration {
            rank,
            nranks,
            root: my_root,
            nroots,
            neighbour: false,
            addr: my_addr,
        };
        let root_info = &infos[my_root as usize];
        let stream = root::register(&root_info.root, &root_info.secret, &reg, &limits)?;
        // The first rank of a block also tells the previous block's root where it listens.
        let neighbour = if nroots > 1 && rank == first_of_block {
            let prev_root = (my_root + nroots - 1) % nroots;
            let prev = &infos[prev_root as usize];
            let reg = root::Registration {
                root: prev_root,
                neighbour: true,
                ..reg
            };
            Some((
                root::register(&prev.root, &prev.secret, &reg, &limits)?,
                prev.root,
            ))
        } else {
            None
        };
        let reply = root::await_reply(&stream, &root_info.root, &limits)
            .and_then(|r| r.check(nranks, &root_info.root).map(|_| r));
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => {
                // Our block failed. The previous block may have completed; tell its ranks,
                // who would otherwise wait for the addresses of ours until they time out.
                if let Some((stream, addr)) = &neighbour {
                    let never = AtomicBool::new(false);
                    let brief = Limits::new(Duration::from_secs(1), &never);
                    let prev = root::await_reply(stream, addr, &brief);
                    if let Ok(prev) = prev.and_then(|p| p.check(nranks, addr).map(|_| p)) {
                        for (i, a) in prev.table.iter().enumerate() {
                            self.peers.set_addr(prev.first + i as i32, *a);
                        }
                    }
                }
                return Err(e);
            }
        };
        if let Some((stream, addr)) = &neighbour {
            root::await_reply(stream, addr, &limits)?.check(nranks, addr)?;
        }
        drop(stream);
        drop(neighbour);
        if nroots == 1 {
            if reply.table.len() != nranks as usize {
                return Err(Error::internal(
                    "bootstrap: the root's address table has the wrong size",
                ));
            }
            for (r, addr) in reply.table.iter().enumerate() {
                self.peers.set_addr(r as i32, *addr);
            }
            return Ok(());
        }
        // Several roots: each knows one block; pass every address around the ring.
        self.peers.set_addr((rank + 1) % nranks, reply.next);
        // Wait as long as for the root: a missing rank in another block is named by that
        // block's root, and its first rank passes the message on to us.
        let all = self.allgather_within(&id::encode_addr(&my_addr), &limits)?;
        for (r, bytes) in all.iter().enumerate() {
            let addr = id::decode_addr(bytes).ok_or_else(|| {
                Error::internal(format!("bootstrap: rank {r} sent a malformed address"))
            })?;
            self.peers.set_addr(r as i32, addr);
        }
        Ok(())
    }

    /// A bootstrap for a sub-communicator whose members are these parent ranks, in new-rank
    /// order. Every member calls it with the same `members` and `tag`.
    pub fn sub(&self, members: &[i32], tag: u64, abort: Arc<AtomicBool>) -> Result<Bootstrap> {
        let me = self.rank;
        let mut seen = vec![false; self.nranks as usize];
        for &m in members {
            if m < 0 || m >= self.nranks || std::mem::replace(&mut seen[m as usize], true) {
                crate::bail_arg!(
                    "bootstrap: bad member list {members:?} for a communicator of {}",
                    self.nranks
                );
            }
        }
        let new_rank = members.iter().position(|&m| m == me).ok_or_else(|| {
            Error::invalid_argument(format!("bootstrap: rank {me} is not in {members:?}"))
        })? as i32;
        let n = members.len() as i32;
        let netif = socket::bootstrap_interface()?;
        let listener = socket::listen_on(&netif)?;
        let secret = sub_secret(&self.secret, tag, members);
        let child = Bootstrap::start(listener, new_rank, n, secret, self.cfg, abort.clone())?;
        let limits = Limits::new(self.cfg.timeout, &abort);
        let leader = members[0];
        let exchange = || -> Result<()> {
            let table = if new_rank == 0 {
                let mut table = Vec::with_capacity(ADDR_LEN * n as usize);
                table.extend_from_slice(&id::encode_addr(&child.peers.listen_addr()));
                for &m in &members[1..] {
                    let addr = self.peers.recv(m, KIND_SUB, tag, &limits)?;
                    if addr.len() != ADDR_LEN {
                        return Err(Error::internal(format!(
                            "bootstrap: rank {m} sent a malformed address"
                        )));
                    }
                    table.extend_from_slice(&addr);
                }
                for &m in &members[1..] {
                    self.peers.send(m, KIND_SUB, tag, &table, &limits)?;
                }
                table
            } else {
                let mine = id::encode_addr(&child.peers.listen_addr());
                self.peers.send(leader, KIND_SUB, tag, &mine, &limits)?;
                self.peers.recv(leader, KIND_SUB, tag, &limits)?
            };
            if table.len() != ADDR_LEN * n as usize {
                return Err(Error::internal(
                    "bootstrap: malformed address table for a sub-communicator",
                ));
            }
            for (r, bytes) in table.chunks(ADDR_LEN).enumerate() {
                let addr = id::decode_addr(bytes)
                    .ok_or_else(|| Error::internal("bootstrap: malformed address"))?;
                child.peers.set_addr(r as i32, addr);
            }
            Ok(())
        };
        exchange()
            .and_then(|_| child.connect_ring())
            .inspect_err(|e| child.fail(e))
            .map_err(|e| {
                e.context(format!(
                    "creating a sub-communicator of {n} ranks (tag {tag})"
                ))
            })?;
        Ok(child)
    }

    /// Open the ring connections now (an empty message to the next rank, one from the
    /// previous), so a neighbour that dies later is noticed by its closed connection.
    fn connect_ring(&self) -> Result<()> {
        if self.nranks == 1 {
            return Ok(());
        }
        let limits = self.limits();
        let next = (self.rank + 1) % self.nranks;
        let prev = (self.rank + self.nranks - 1) % self.nranks;
        self.peers.send(next, KIND_RING, 0, &[], &limits)?;
        self.peers.recv(prev, KIND_RING, 0, &limits)?;
        Ok(())
    }

    /// After a failure that leaves this bootstrap unusable: tell the peers, and close the
    /// connections so ranks waiting on this one fail promptly.
    fn fail(&self, err: &Error) {
        self.peers.notify_failure(err);
        self.peers.break_links();
    }

    pub fn rank(&self) -> i32 {
        self.rank
    }

    pub fn nranks(&self) -> i32 {
        self.nranks
    }

    pub fn abort_flag(&self) -> &Arc<AtomicBool> {
        &self.abort
    }

    /// The out-of-band channel over this bootstrap's connections, for the watchdog.
    pub fn link(&self) -> link::Link {
        link::Link::new(self.rank, self.nranks, self.peers.clone())
    }

    /// Every rank's listening address (known after init).
    pub fn peer_addrs(&self) -> Vec<Option<SocketAddr>> {
        self.peers.addrs()
    }

    fn limits(&self) -> Limits<'_> {
        Limits::new(self.cfg.timeout, &self.abort)
    }

    fn check_peer(&self, peer: i32) -> Result<()> {
        if peer < 0 || peer >= self.nranks {
            crate::bail_arg!("bootstrap: peer {peer} is not a rank of {}", self.nranks);
        }
        Ok(())
    }

    /// Every rank's `mine`, indexed by rank (a ring: nranks - 1 steps).
    pub fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.allgather_within(mine, &self.limits())
    }

    fn allgather_within(&self, mine: &[u8], limits: &Limits<'_>) -> Result<Vec<Vec<u8>>> {
        // The sequence number tags the collective's frames (see `Peers::begin_coll`).
        let seq = self.peers.begin_coll();
        let (rank, n) = (self.rank, self.nranks);
        let mut out = vec![Vec::new(); n as usize];
        out[rank as usize] = mine.to_vec();
        // A failed collective leaves the ring unusable: break it so the others fail fast too.
        self.ring_allgather(seq, mine, &mut out, limits)
            .and_then(|_| self.peers.end_coll(seq))
            .inspect_err(|e| self.fail(e))?;
        Ok(out)
    }

    fn ring_allgather(
        &self,
        seq: u64,
        mine: &[u8],
        out: &mut [Vec<u8>],
        limits: &Limits<'_>,
    ) -> Result<()> {
        let (rank, n) = (self.rank, self.nranks);
        let next = (rank + 1) % n;
        let prev = (rank + n - 1) % n;
        for step in 0..n - 1 {
            let send_idx = (rank - step).rem_euclid(n) as usize;
            let recv_idx = (rank - step - 1).rem_euclid(n) as usize;
            self.peers
                .send(next, KIND_COLL, seq, &out[send_idx], limits)?;
            let got = self.peers.recv(prev, KIND_COLL, seq, limits)?;
            if got.len() != mine.len() {
                return Err(Error::invalid_usage(format!(
                    "bootstrap: allgather: rank {recv_idx} contributed {} bytes but rank {rank} contributed {}",
                    got.len(),
                    mine.len()
                )));
            }
            out[recv_idx] = got;
        }
        Ok(())
    }

    /// Wait until every rank has reached the barrier.
    pub fn barrier(&self) -> Result<()> {
        self.allgather(&[]).map(|_| ())
    }

    /// The same membership for another thread, whose waits stop when `abort` is raised
    /// (instead of the communicator's flag): for traffic of its own tags beside the
    /// communicator's, such as the channel weights' exchange (`core::adaptive`).
    pub fn handle(&self, abort: Arc<AtomicBool>) -> Bootstrap {
        Bootstrap {
            rank: self.rank,
            nranks: self.nranks,
            secret: self.secret,
            cfg: self.cfg,
            peers: self.peers.clone(),
            abort,
        }
    }

    /// Send `data` to `peer`, tagged; any size.
    pub fn send(&self, peer: i32, tag: u64, data: &[u8]) -> Result<()> {
        self.check_peer(peer)?;
        self.peers.send(peer, KIND_USER, tag, data, &self.limits())
    }

    /// Receive the oldest message from `peer` with `tag`.
    pub fn recv(&self, peer: i32, tag: u64) -> Result<Vec<u8>> {
        self.check_peer(peer)?;
        self.peers.recv(peer, KIND_USER, tag, &self.limits())
    }
}

/// A sub-communicator's secret: derived from the parent's, the tag and the members, so every
/// member knows it before any exchange and strangers cannot.
fn sub_secret(parent: &Secret, tag: u64, members: &[i32]) -> Secret {
    let mut text = String::with_capacity(64 + 4 * members.len());
    for b in parent {
        text.push_str(&format!("{b:02x}"));
    }
    text.push_str(&format!("/{tag}/{members:?}"));
    id::secret_from_text(&text)
}
