//! The channel scheduler: turns a group of operations into per-channel work for the kernels.
//! Pure, safe Rust: what runs where is decided here and unit-tested without a GPU.

use crate::abi::ncclDataType_t;
use redop::RedOp;

/// Which operation a task performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollKind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AlltoAll,
    Gather,
    Scatter,
    Send,
    Recv,
}

impl CollKind {
    /// Every operation, in declaration order.
    pub const ALL: [CollKind; 10] = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AlltoAll,
        CollKind::Gather,
        CollKind::Scatter,
        CollKind::Send,
        CollKind::Recv,
    ];

    /// The collectives that run as rings (the others are P2P operations).
    pub const RINGS: [CollKind; 5] = [
        CollKind::AllReduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::Broadcast,
        CollKind::Reduce,
    ];

    /// Whether the operation names a rank: the root of a rooted collective, the peer of a
    /// send or receive.
    pub fn has_root(self) -> bool {
        matches!(
            self,
            CollKind::Broadcast
                | CollKind::Reduce
                | CollKind::Gather
                | CollKind::Scatter
                | CollKind::Send
                | CollKind::Recv
        )
    }

    /// NCCL's name for the operation, as logs print it.
    pub fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "AllReduce",
            CollKind::Broadcast => "Broadcast",
            CollKind::Reduce => "Reduce",
            CollKind::AllGather => "AllGather",
            CollKind::ReduceScatter => "ReduceScatter",
            CollKind::AlltoAll => "AlltoAll",
            CollKind::Gather => "Gather",
            CollKind::Scatter => "Scatter",
            CollKind::Send => "Send",
            CollKind::Recv => "Recv",
        }
    }
}

/// One operation of a group, as the user called it. `count` keeps the API's meaning:
/// per-rank count for AllGather (sendcount), ReduceScatter (recvcount), AlltoAll, Gather and
/// Scatter; the whole buffer otherwise. `root` is the root rank, or the peer for Send/Recv.
/// `opts` are the call's own options (`ncclXConfig`; the default for every other call).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Task {
    pub kind: CollKind,
    pub dtype: ncclDataType_t,
    pub op: RedOp,
    pub count: usize,
    pub sendbuff: u64,
    pub recvbuff: u64,
    pub root: i32,
    pub opts: TaskOptions,
    /// The channel weights its ring split uses (`weights::Routes::at_epoch`): 0, the weights
    /// agreed at init, unless the communicator's weights adapt (`core::adaptive`).
    pub weights_epoch: u32,
}

pub mod adaptive;
pub mod cost;
pub mod device;
#[cfg(test)]
mod fingerprint;
mod lower;
pub mod options;
pub mod plan;
pub mod proto;
pub mod redop;
pub mod relocate;
pub mod ring;
#[cfg(test)]
mod sim;
pub mod steps;
pub mod tune;
pub mod weights;

pub use cost::NetLink;
pub use cost::{NCHANNELS, NSLOTS, SLOT_BYTES};
pub use device::OxConn;
pub use options::TaskOptions;
pub use plan::{connections_needed, plan, Dir, Geometry, NetView, Plan};
pub use ring::RingOrder;
pub use tune::Tuner;
pub use weights::Routes;

/// Estimated time in µs of a group of `(nranks, network link, task)`
/// (`ncclGroupSimulateEnd`; the link of a communicator that uses the network, see `NetView`),
/// from the cost model, for the choices the planner makes: the slowest task, since a group's
/// tasks share one launch.
pub fn estimate_us(tasks: &[(i32, Option<NetLink>, Task)]) -> f32 {
    tasks
        .iter()
        .map(|&(nranks, net, t)| {
            let bytes = (t.count * t.dtype.size()) as u64;
            cost::planned_time_on(t.kind, bytes, nranks, NCHANNELS, net)
        })
        .fold(0.0, f64::max) as f32
}
