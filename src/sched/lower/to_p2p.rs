//! Send/recv, alltoall, gather and scatter as point-to-point operations: each task becomes
//! the list of (peer, direction, address, bytes) it moves, in a fixed order on every rank.
//! Operations with this rank itself as peer stay in the list; `p2p` pairs them into copies.

use crate::error::{Error, Result};
use crate::sched::plan::Dir;
use crate::sched::{CollKind, Task};

/// A P2P operation: `bytes` from `addr` to `peer` (Send) or from `peer` into `addr` (Recv).
pub struct P2pOp {
    pub peer: i32,
    pub dir: Dir,
    pub addr: u64,
    pub bytes: u64,
}

/// The P2P operations of `task` on `rank` of `nranks`.
pub fn ops_of(task: &Task, rank: i32, nranks: i32) -> Result<Vec<P2pOp>> {
    let bytes = task.count as u64 * task.dtype.size() as u64;
    match task.kind {
        CollKind::Send | CollKind::Recv => {
            if !(0..nranks).contains(&task.root) {
                return Err(Error::invalid_argument(format!(
                    "peer {} out of range",
                    task.root
                )));
            }
            Ok(vec![send_recv(task, bytes)])
        }
        CollKind::AlltoAll => Ok(all_to_all(task, nranks, bytes)),
        CollKind::Gather | CollKind::Scatter => {
            if !(0..nranks).contains(&task.root) {
                return Err(Error::invalid_argument(format!(
                    "root {} out of range",
                    task.root
                )));
            }
            Ok(rooted(task, rank, nranks, bytes))
        }
        _ => unreachable!("only P2P kinds use Algo::P2p"),
    }
}

/// A send to, or a receive from, the task's peer.
fn send_recv(task: &Task, bytes: u64) -> P2pOp {
    let (dir, addr) = if task.kind == CollKind::Send {
        (Dir::Send, task.sendbuff)
    } else {
        (Dir::Recv, task.recvbuff)
    };
    P2pOp {
        peer: task.root,
        dir,
        addr,
        bytes,
    }
}

/// Block p of the input to rank p and block p of the output from rank p, for every p.
fn all_to_all(task: &Task, nranks: i32, block: u64) -> Vec<P2pOp> {
    let mut ops = Vec::with_capacity(2 * nranks as usize);
    for peer in 0..nranks {
        let o = peer as u64 * block;
        ops.push(P2pOp {
            peer,
            dir: Dir::Send,
            addr: task.sendbuff + o,
            bytes: block,
        });
        ops.push(P2pOp {
            peer,
            dir: Dir::Recv,
            addr: task.recvbuff + o,
            bytes: block,
        });
    }
    ops
}

/// Gather (every rank's input to block p of the root's output) or scatter (block p of the
/// root's input to rank p's output); the root's own block is a send and receive to itself.
fn rooted(task: &Task, rank: i32, nranks: i32, block: u64) -> Vec<P2pOp> {
    let gather = task.kind == CollKind::Gather;
    let op = |peer, dir, addr| P2pOp {
        peer,
        dir,
        addr,
        bytes: block,
    };
    if rank != task.root {
        return vec![if gather {
            op(task.root, Dir::Send, task.sendbuff)
        } else {
            op(task.root, Dir::Recv, task.recvbuff)
        }];
    }
    let mut ops = Vec::with_capacity(nranks as usize + 1);
    for peer in 0..nranks {
        let o = peer as u64 * block;
        let (own_send, own_recv, remote) = if gather {
            let addr = task.recvbuff + o;
            (task.sendbuff, addr, op(peer, Dir::Recv, addr))
        } else {
            let addr = task.sendbuff + o;
            (addr, task.recvbuff, op(peer, Dir::Send, addr))
        };
        if peer == rank {
            ops.push(op(peer, Dir::Send, own_send));
            ops.push(op(peer, Dir::Recv, own_recv));
        } else {
            ops.push(remote);
        }
    }
    ops
}
