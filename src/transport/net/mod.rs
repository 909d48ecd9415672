//! The network transport (between hosts, or between ranks of one host when P2P and SHM are
//! disabled): not built yet. Until it is, a connection that needs it fails with an error that
//! says why the network is needed.

pub mod api;
pub mod plugin;

use crate::error::Error;
use crate::topo::Topology;

/// The error for a connection to `peer` that needs the network transport.
pub(super) fn unavailable(topo: &Topology, peer: i32) -> Error {
    let me = &topo.peers[topo.my_rank as usize];
    let why = if topo.peers[peer as usize].host_hash != me.host_hash {
        "it is on another host"
    } else {
        "peer-to-peer and shared memory are unavailable or disabled (NCCL_P2P_DISABLE, \
         NCCL_P2P_LEVEL, NCCL_SHM_DISABLE)"
    };
    Error::invalid_usage(format!(
        "rank {} needs the network transport to reach rank {peer} ({why}): the network \
         transport is not yet supported by oxccl",
        topo.my_rank
    ))
}
