//! Connections between ranks, behind one interface. A connection carries data one way,
//! sender to receiver, through `nslots` slots in the receiver's staging buffer, with two
//! counters: `tail` (slots filled, in the receiver's memory) and `head` (slots consumed, in
//! the sender's memory). Both sides end up with an `OxConn` of pointers valid on their own GPU,
//! so one kernel serves every transport.
//!
//! This file owns what every transport shares: the layout of a side's block (counters, step,
//! staging buffer), the setup exchange through the bootstrap, and the table of connections of
//! a communicator. Each transport lives in its own file and owns its memory, its description
//! for the peer, the peer's mapping and the teardown:
//! - [`p2p`]: device memory — plain pointers in one process (peer access enabled between the
//!   GPUs; none needed for ranks sharing a GPU), CUDA IPC handles across processes;
//! - [`shm`]: host shared memory mapped into both GPUs (`NCCL_P2P_DISABLE=1`, `NCCL_P2P_LEVEL`);
//! - [`net`]: between hosts, or when neither of the others is allowed: host memory on both
//!   sides, moved by the communicator's proxy thread over a network (sockets or a plugin).
//!
//! Adding a transport: a file with `local_half` (allocate this side's block and describe it
//! as a [`Placement`]) and, for a new placement, its `map_remote`; a [`Transport`] variant;
//! and the topology rule that picks it (`topo::Allowed::choose`).

pub mod fdpass;
pub mod net;
mod p2p;
pub mod rma_socket;
mod shm;
pub mod sizes;
mod wire;

pub use net::proxy::ErrorSink;

use crate::bootstrap::Bootstrap;
use crate::error::Result;
use crate::sched::{Dir, OxConn};
use crate::topo::{Path, Topology};
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use wire::{Half, Placement};

/// Memory a connection side keeps alive (its own block, its mapping of the peer's): held only
/// so that dropping the side frees it, each kind freeing itself on drop.
type Keep = Box<dyn Any + Send + Sync>;

/// One side of one connection.
pub struct Side {
    pub conn: OxConn,
    /// A network side whose slots are in GPU memory, written or read by the network
    /// (GPUDirect RDMA): its items carry `FLAG_RECV_GPU` or `FLAG_SEND_GPU`.
    pub gpu_slots: bool,
    /// A network receiving side's count of the steps its kernels will consume, which each
    /// launch raises (`net::proxy::Announced`); None for every other side.
    pub announced: Option<net::proxy::Announced>,
    _keep: Vec<Keep>,
}

/// Every connection of one communicator, by (channel, peer), and the proxy thread of its
/// network connections (stopped before any connection's memory is freed).
#[derive(Default)]
pub struct Connections {
    pub send: HashMap<(u32, i32), Side>,
    pub recv: HashMap<(u32, i32), Side>,
    proxy: Option<net::proxy::Proxy>,
}

/// The device addresses of one connection side that a waiting kernel polls (its wait entry's
/// address, `sched::device::PROGRESS_OFFSET`): `start..end`, and the peer they belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnSpan {
    pub start: u64,
    pub end: u64,
    pub peer: i32,
}

/// The span that holds device address `at`, if any.
pub fn span_at(spans: &[ConnSpan], at: u64) -> Option<&ConnSpan> {
    spans.iter().find(|s| (s.start..s.end).contains(&at))
}

/// The spans a kernel's waits on `peer` poll: a send side's `head` (a free slot); a receive
/// side's `tail` (a filled slot) and its staging buffer (LL words).
fn side_spans(peer: i32, conn: &OxConn, sends: bool) -> Vec<ConnSpan> {
    let word = |at: u64| ConnSpan {
        start: at,
        end: at + 8,
        peer,
    };
    if sends {
        return vec![word(conn.head)];
    }
    let buf_bytes = conn.nslots as u64 * conn.slot_bytes as u64;
    vec![
        word(conn.tail),
        ConnSpan {
            start: conn.buf,
            end: conn.buf + buf_bytes,
            peer,
        },
    ]
}

impl Connections {
    /// Every connection's wait spans (`ConnSpan`), sends then receives.
    pub fn wait_spans(&self) -> Vec<ConnSpan> {
        let sends = self
            .send
            .iter()
            .map(|(&(_, peer), s)| (peer, &s.conn, true));
        let recvs = self
            .recv
            .iter()
            .map(|(&(_, peer), s)| (peer, &s.conn, false));
        sends
            .chain(recvs)
            .flat_map(|(peer, c, sends)| side_spans(peer, c, sends))
            .filter(|s| s.start != 0)
            .collect()
    }

    /// Let the proxy send what finished kernels left in network staging (an orderly
    /// destroy); the error says why not (`Proxy::drain`).
    pub fn drain_network(&self, limit: std::time::Duration) -> std::result::Result<(), String> {
        self.proxy.as_ref().map_or(Ok(()), |p| p.drain(limit))
    }
}

impl Drop for Connections {
    /// The proxy stops first (at most `STOP_LIMIT`). A proxy thread left behind in a network
    /// call may still touch the memory of the sides it drives when the call returns: then no
    /// side's memory is freed (leaked), rather than freed under it.
    fn drop(&mut self) {
        let Some(proxy) = self.proxy.take() else {
            return;
        };
        if !proxy.stop(net::proxy::STOP_LIMIT) {
            for (_, side) in self.send.drain() {
                std::mem::forget(side);
            }
            for (_, side) in self.recv.drain() {
                std::mem::forget(side);
            }
        }
    }
}

/// What a connection setup needs to know about this rank.
pub struct Setup<'a> {
    pub bootstrap: &'a Bootstrap,
    pub topo: &'a Topology,
    pub slot_bytes: u32,
    pub nslots: u32,
    /// The communicator's channels (connection rows past them are P2P and one-shot rows,
    /// `sched::plan::conn_channels`).
    pub nchannels: u32,
    /// Makes shared-memory names unique per communicator.
    pub comm_hash: u64,
    /// The communicator's abort flag (stops connection waits and the proxy).
    pub abort: &'a Arc<AtomicBool>,
    /// Host address of the u32 kernels poll, raised by the proxy when a connection fails.
    pub device_abort: usize,
    /// Where the proxy reports a failed connection (the communicator's async error).
    pub sink: &'a net::proxy::ErrorSink,
    /// The network this communicator uses (`netName`, else `NCCL_NET`), opened for it.
    pub net: &'a net::CommNet,
    /// The device of every network connection row (`sched::weights`, agreed at init); None:
    /// row mod devices.
    pub routes: Option<&'a crate::sched::Routes>,
    /// Where network sends count their bytes and busy time per device, for the channel
    /// weights' exchange (`core::adaptive`); None when the weights do not adapt.
    pub meter: Option<&'a std::sync::Arc<net::meter::NetMeter>>,
}

/// The transport of one connection, from the topology's path to the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    P2p,
    Shm,
    Net,
}

impl Transport {
    pub fn for_path(path: Path) -> Transport {
        match path {
            Path::SameGpu | Path::NvLink { .. } | Path::Pcie => Transport::P2p,
            Path::Shm => Transport::Shm,
            Path::Net => Transport::Net,
        }
    }

    /// Allocate this rank's block for (channel, peer, dir) and describe it for the peer.
    fn local_half(self, setup: &Setup<'_>, ch: u32, peer: i32, dir: Dir) -> Result<(Half, Local)> {
        let bytes = block_bytes(dir, setup.slot_bytes, setup.nslots);
        let (half, keep) = match self {
            Transport::P2p => p2p::local_half(setup.topo, peer, bytes)?,
            Transport::Shm => shm::local_half(setup, ch, peer, dir, bytes)?,
            Transport::Net => {
                let (half, local) = net::local_half(setup, ch, dir)?;
                return Ok((half, Local::Net(local)));
            }
        };
        Ok((half, Local::Mapped(keep)))
    }
}

/// This side of a connection between its setup message and its mapping of the peer's: memory
/// the peer maps, or a network side still to connect.
enum Local {
    Mapped(Keep),
    Net(net::Local),
}

/// Map the peer's block into this process; returns its base address here.
fn map_remote(h: &Half) -> Result<(u64, Option<Keep>)> {
    match &h.placement {
        Placement::Pointer(p) => Ok((*p, None)),
        Placement::Ipc(handle) => p2p::map_remote(handle),
        Placement::Shm { name, bytes } => shm::map_remote(name, *bytes as usize),
        Placement::Net(_) => Err(crate::error::Error::internal(
            "connection setup: the peer's side is a network side, this one is not",
        )),
    }
}

const TAG_BASE: u64 = 0x4f58_0000_0000_0000;

/// Bootstrap tag of a setup message for (channel, dir as seen by the *receiver* of the message).
fn tag(channel: u32, from_sender_side: bool) -> u64 {
    TAG_BASE | ((from_sender_side as u64) << 32) | channel as u64
}

/// Counters live at the start of a side's block: tail (or head) at 0, the step at 64 (separate
/// cache lines); the staging buffer of a receiver starts at 4096.
const COUNTER_OFFSET: u64 = 0;
const STEP_OFFSET: u64 = 64;
const BUF_OFFSET: u64 = 4096;

/// Bytes of one side's block: counters only for a sender, counters and staging for a receiver.
fn block_bytes(dir: Dir, slot_bytes: u32, nslots: u32) -> usize {
    match dir {
        Dir::Send => BUF_OFFSET as usize,
        Dir::Recv => BUF_OFFSET as usize + slot_bytes as usize * nslots as usize,
    }
}

/// The kernel's view of one side, from this side's block and the peer's (both as addresses
/// valid here).
fn side_conn(dir: Dir, mine: u64, theirs: u64, slot_bytes: u32, nslots: u32) -> OxConn {
    let (receiver, sender) = match dir {
        // I send: the buffer and tail are the peer's; head and step are mine.
        Dir::Send => (theirs, mine),
        Dir::Recv => (mine, theirs),
    };
    OxConn {
        buf: receiver + BUF_OFFSET,
        tail: receiver + COUNTER_OFFSET,
        head: sender + COUNTER_OFFSET,
        step: mine + STEP_OFFSET,
        slot_bytes,
        nslots,
    }
}

impl Connections {
    /// Whether (channel, peer, dir) is connected.
    pub fn has(&self, ch: u32, peer: i32, dir: Dir) -> bool {
        match dir {
            Dir::Send => self.send.contains_key(&(ch, peer)),
            Dir::Recv => self.recv.contains_key(&(ch, peer)),
        }
    }

    fn insert(&mut self, (ch, peer, dir): (u32, i32, Dir), side: Side) {
        match dir {
            Dir::Send => self.send.insert((ch, peer), side),
            Dir::Recv => self.recv.insert((ch, peer), side),
        };
    }

    /// Connect every (channel, peer, dir) not yet connected. Both ranks of each connection
    /// must call this for the matching direction in the same group.
    pub fn connect(&mut self, setup: &Setup<'_>, needed: &[(u32, i32, Dir)]) -> Result<()> {
        let todo: Vec<(u32, i32, Dir)> = needed
            .iter()
            .copied()
            .filter(|&(ch, peer, dir)| !self.has(ch, peer, dir))
            .collect();
        let mut halves = Vec::with_capacity(todo.len());
        for &(ch, peer, dir) in &todo {
            let transport = Transport::for_path(setup.topo.paths[peer as usize]);
            let (half, local) = transport.local_half(setup, ch, peer, dir)?;
            setup
                .bootstrap
                .send(peer, tag(ch, dir == Dir::Send), &half.encode())?;
            halves.push((half, local));
        }
        let mut networked = Vec::new();
        for (&key, (mine, local)) in todo.iter().zip(halves) {
            let (ch, peer, dir) = key;
            let bytes = setup.bootstrap.recv(peer, tag(ch, dir == Dir::Recv))?;
            let theirs = Half::decode(&bytes)?;
            match local {
                Local::Net(local) => networked.push(net::Pending { key, local, theirs }),
                Local::Mapped(keep) => {
                    let side = mapped_side(setup, key, &mine, keep, &theirs)?;
                    self.insert(key, side);
                }
            }
        }
        if !networked.is_empty() {
            for (key, side) in net::establish(setup, networked, &mut self.proxy)? {
                self.insert(key, side);
            }
        }
        Ok(())
    }
}

/// The side of a connection through memory: map the peer's block, point at both.
fn mapped_side(
    setup: &Setup<'_>,
    (ch, peer, dir): (u32, i32, Dir),
    mine: &Half,
    keep: Keep,
    theirs: &Half,
) -> Result<Side> {
    let (remote_base, mapping) = map_remote(theirs)?;
    let conn = side_conn(
        dir,
        mine.local_base,
        remote_base,
        setup.slot_bytes,
        setup.nslots,
    );
    crate::trace!(
        P2P,
        "Channel {ch:02} : {:?} peer {peer} via {:?}",
        dir,
        theirs.placement
    );
    Ok(Side {
        conn,
        gpu_slots: false,
        announced: None,
        _keep: std::iter::once(keep).chain(mapping).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_address_names_the_connections_peer() {
        // Each connection side has a block of its own, on both ends.
        let (my_send, my_recv) = (0x1000_0000u64, 0x1100_0000u64);
        let (left, right) = (0x2000_0000u64, 0x3000_0000u64);
        let to_right = side_conn(Dir::Send, my_send, right, 65536, 8);
        let from_left = side_conn(Dir::Recv, my_recv, left, 65536, 8);
        let mut spans = side_spans(2, &to_right, true);
        spans.extend(side_spans(1, &from_left, false));
        let peer = |at: u64| span_at(&spans, at).map(|s| s.peer);
        assert_eq!(peer(to_right.head), Some(2));
        assert_eq!(peer(from_left.tail), Some(1));
        assert_eq!(peer(from_left.buf + 8 * 65536 - 8), Some(1));
        assert_eq!(peer(from_left.buf + 8 * 65536), None);
        assert_eq!(
            peer(to_right.tail),
            None,
            "the receiver polls its own copy of tail"
        );
        assert_eq!(peer(0), None);
    }

    #[test]
    fn both_sides_agree_on_the_receivers_buffer_and_counters() {
        let (sender, receiver) = (0x1000_0000u64, 0x2000_0000u64);
        let s = side_conn(Dir::Send, sender, receiver, 65536, 8);
        let r = side_conn(Dir::Recv, receiver, sender, 65536, 8);
        assert_eq!(s.buf, r.buf);
        assert_eq!(s.buf, receiver + BUF_OFFSET);
        assert_eq!(s.tail, r.tail);
        assert_eq!(s.head, r.head);
        assert_eq!(s.head, sender + COUNTER_OFFSET);
        assert_eq!(s.step, sender + STEP_OFFSET);
        assert_eq!(r.step, receiver + STEP_OFFSET);
        assert_eq!(block_bytes(Dir::Recv, 65536, 8), 4096 + 8 * 65536);
        assert_eq!(block_bytes(Dir::Send, 65536, 8), 4096);
    }

    #[test]
    fn every_path_has_one_transport() {
        assert_eq!(Transport::for_path(Path::SameGpu), Transport::P2p);
        assert_eq!(Transport::for_path(Path::Pcie), Transport::P2p);
        assert_eq!(Transport::for_path(Path::Shm), Transport::Shm);
        assert_eq!(Transport::for_path(Path::Net), Transport::Net);
    }
}
