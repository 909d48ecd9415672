//! The P2P transport: a side's block in device memory. In one process the peer gets the plain
//! device pointer (peer access enabled between two GPUs; ranks sharing a GPU need none);
//! across processes a CUDA IPC handle, which the peer opens and closes.

use super::wire::{Half, Placement};
use super::Keep;
use crate::cuda::{self, DeviceBuffer};
use crate::error::Result;
use crate::topo::{Path, Topology};

/// A peer's block opened from its IPC handle; closed on drop.
struct IpcMapping(u64);

impl Drop for IpcMapping {
    fn drop(&mut self) {
        let _ = cuda::ipc_close(self.0);
    }
}

/// Allocate `bytes` of zeroed device memory and describe it for `peer`.
pub(super) fn local_half(topo: &Topology, peer: i32, bytes: usize) -> Result<(Half, Keep)> {
    let same_process = topo.same_process(peer);
    if same_process && topo.paths[peer as usize] != Path::SameGpu {
        let peer_dev = topo.peers[peer as usize].cuda_dev;
        cuda::enable_peer_access(cuda::primary_ctx(peer_dev)?)?;
    }
    let buf = DeviceBuffer::zeroed(bytes)?;
    let base = buf.ptr();
    let placement = if same_process {
        Placement::Pointer(base)
    } else {
        Placement::Ipc(cuda::ipc_handle(base)?)
    };
    let half = Half {
        local_base: base,
        placement,
    };
    Ok((half, Box::new(buf)))
}

/// Open a peer's block from another process.
pub(super) fn map_remote(handle: &[u8; 64]) -> Result<(u64, Option<Keep>)> {
    let p = cuda::ipc_open(handle)?;
    Ok((p, Some(Box::new(IpcMapping(p)))))
}
