//! Connections between ranks. A connection carries data one way, sender to receiver, through
//! `nslots` slots in the receiver's staging buffer, with two counters: `tail` (slots filled,
//! in the receiver's memory) and `head` (slots consumed, in the sender's memory). Both sides
//! end up with an `OxConn` of pointers valid on their own GPU, so one kernel serves every
//! transport:
//! - P2P, same process: plain device pointers (peer access enabled between the contexts);
//! - P2P, other process: device memory exported with CUDA IPC handles;
//! - P2P, same GPU (ranks sharing a GPU, `NCCL_MULTI_RANK_GPU_ENABLE=1`): the same two cases,
//!   with no peer access to enable;
//! - SHM: staging buffer and counters in host shared memory mapped into both GPUs, used when
//!   peer access is impossible or disabled (`NCCL_P2P_DISABLE=1`, `NCCL_P2P_LEVEL`);
//! - NET (the topology's choice when neither is allowed, or between hosts): not built yet.
//!
//! Setup runs through the bootstrap: each side allocates its half, sends a description, then
//! maps the peer's half.

mod wire;

use crate::bootstrap::Bootstrap;
use crate::cuda::{self, DeviceBuffer, HostMapped, SharedHostMem};
use crate::error::{Error, Result};
use crate::sched::{Dir, OxConn};
use crate::topo::{Path, Topology};
use std::collections::HashMap;
use wire::{Half, Placement};

/// Memory a connection side keeps alive: held only so that dropping the side frees it.
#[allow(dead_code)]
enum Resource {
    Device(DeviceBuffer),
    Host(HostMapped),
    Shared(SharedHostMem),
    Ipc(u64),
}

impl Drop for Resource {
    fn drop(&mut self) {
        if let Resource::Ipc(p) = self {
            let _ = cuda::ipc_close(*p);
        }
    }
}

/// One side of one connection.
pub struct Side {
    pub conn: OxConn,
    _keep: Vec<Resource>,
}

/// Every connection of one communicator, by (channel, peer).
#[derive(Default)]
pub struct Connections {
    pub send: HashMap<(u32, i32), Side>,
    pub recv: HashMap<(u32, i32), Side>,
}

/// What a connection setup needs to know about this rank.
pub struct Setup<'a> {
    pub bootstrap: &'a Bootstrap,
    pub topo: &'a Topology,
    pub slot_bytes: u32,
    pub nslots: u32,
    /// Makes shared-memory names unique per communicator.
    pub comm_hash: u64,
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

impl Connections {
    /// Whether (channel, peer, dir) is connected.
    pub fn has(&self, ch: u32, peer: i32, dir: Dir) -> bool {
        match dir {
            Dir::Send => self.send.contains_key(&(ch, peer)),
            Dir::Recv => self.recv.contains_key(&(ch, peer)),
        }
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
            let (half, keep) = self.local_half(setup, ch, peer, dir)?;
            setup
                .bootstrap
                .send(peer, tag(ch, dir == Dir::Send), &half.encode())?;
            halves.push((half, keep));
        }
        for (&(ch, peer, dir), (mine, mut keep)) in todo.iter().zip(halves) {
            let bytes = setup.bootstrap.recv(peer, tag(ch, dir == Dir::Recv))?;
            let theirs = Half::decode(&bytes)?;
            let (remote_base, mapping) = map_remote(&theirs)?;
            keep.extend(mapping);
            let conn = match dir {
                // I send: the buffer and tail are the peer's; head and step are mine.
                Dir::Send => OxConn {
                    buf: remote_base + BUF_OFFSET,
                    tail: remote_base + COUNTER_OFFSET,
                    head: mine.local_base + COUNTER_OFFSET,
                    step: mine.local_base + STEP_OFFSET,
                    slot_bytes: setup.slot_bytes,
                    nslots: setup.nslots,
                },
                Dir::Recv => OxConn {
                    buf: mine.local_base + BUF_OFFSET,
                    tail: mine.local_base + COUNTER_OFFSET,
                    head: remote_base + COUNTER_OFFSET,
                    step: mine.local_base + STEP_OFFSET,
                    slot_bytes: setup.slot_bytes,
                    nslots: setup.nslots,
                },
            };
            crate::trace!(
                P2P,
                "Channel {ch:02} : {:?} peer {peer} via {:?}",
                dir,
                theirs.placement
            );
            let side = Side { conn, _keep: keep };
            match dir {
                Dir::Send => self.send.insert((ch, peer), side),
                Dir::Recv => self.recv.insert((ch, peer), side),
            };
        }
        Ok(())
    }

    /// Allocate this rank's half of a connection and describe it for the peer.
    fn local_half(
        &self,
        setup: &Setup<'_>,
        ch: u32,
        peer: i32,
        dir: Dir,
    ) -> Result<(Half, Vec<Resource>)> {
        let bytes = match dir {
            Dir::Send => BUF_OFFSET as usize,
            Dir::Recv => BUF_OFFSET as usize + setup.slot_bytes as usize * setup.nslots as usize,
        };
        let path = setup.topo.paths[peer as usize];
        let same_process = setup.topo.same_process(peer);
        let (placement, base, res) = match path {
            Path::SameGpu | Path::NvLink { .. } | Path::Pcie => {
                if same_process && path != Path::SameGpu {
                    let peer_dev = setup.topo.peers[peer as usize].cuda_dev;
                    cuda::enable_peer_access(cuda::primary_ctx(peer_dev)?)?;
                }
                let buf = DeviceBuffer::zeroed(bytes)?;
                let base = buf.ptr();
                let placement = if same_process {
                    Placement::Pointer(base)
                } else {
                    Placement::Ipc(cuda::ipc_handle(base)?)
                };
                (placement, base, Resource::Device(buf))
            }
            Path::Shm if same_process => {
                let mem = HostMapped::new(bytes)?;
                let base = mem.dev();
                (Placement::Pointer(base), base, Resource::Host(mem))
            }
            Path::Shm => {
                let me = setup.topo.my_rank;
                let name = format!(
                    "oxccl-{:x}-{}-{}-{}-{}-{}",
                    setup.comm_hash,
                    std::process::id(),
                    me,
                    peer,
                    ch,
                    if dir == Dir::Send { "s" } else { "r" }
                );
                let mem = SharedHostMem::open(&name, bytes, true)?;
                let base = mem.dev();
                (
                    Placement::Shm {
                        name,
                        bytes: bytes as u64,
                    },
                    base,
                    Resource::Shared(mem),
                )
            }
            Path::Net => return Err(no_network(setup.topo, peer)),
        };
        Ok((
            Half {
                local_base: base,
                placement,
            },
            vec![res],
        ))
    }
}

/// The error for a connection that needs the network transport, which is not built yet.
fn no_network(topo: &Topology, peer: i32) -> Error {
    let me = &topo.peers[topo.my_rank as usize];
    let why = if topo.peers[peer as usize].host_hash != me.host_hash {
        "it is on another host".to_string()
    } else {
        "peer-to-peer and shared memory are unavailable or disabled (NCCL_P2P_DISABLE, \
         NCCL_P2P_LEVEL, NCCL_SHM_DISABLE)"
            .to_string()
    };
    Error::invalid_usage(format!(
        "rank {} needs the network transport to reach rank {peer} ({why}): the network \
         transport is not yet supported by oxccl",
        topo.my_rank
    ))
}

/// Map the peer's half into this process; returns its base address here.
fn map_remote(h: &Half) -> Result<(u64, Option<Resource>)> {
    Ok(match &h.placement {
        Placement::Pointer(p) => (*p, None),
        Placement::Ipc(handle) => {
            let p = cuda::ipc_open(handle)?;
            (p, Some(Resource::Ipc(p)))
        }
        Placement::Shm { name, bytes } => {
            let mem = SharedHostMem::open(name, *bytes as usize, false)?;
            (mem.dev(), Some(Resource::Shared(mem)))
        }
    })
}
