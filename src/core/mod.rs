//! Communicator state and lifecycle: the registry of live handles, ranks and devices, the
//! async error and abort flag, user-defined reduction ops, and the group/enqueue machinery.

pub mod adaptive;
pub mod coll_config;
pub mod config;
pub mod enqueue;
pub mod group;
pub mod grow;
pub mod int_map;
pub mod lifecycle;
pub mod memory;
pub mod progress;
pub mod registry;
pub mod runtime;
pub mod watchdog;
pub mod window;
pub mod yielding;

/// Reduction operators live with the scheduler (which must import nothing above it).
pub use crate::sched::redop;

use crate::abi::{ncclComm, ncclComm_t, ncclResult_t};
use crate::error::{Error, LastError, Result};
use int_map::IntMap;
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;

pub use config::CommConfig;

/// One rank's communicator.
pub struct Comm {
    /// Rank and size: known at creation, except for split/shrink children (set by their init).
    rank: AtomicI32,
    nranks: AtomicI32,
    pub cuda_dev: i32,
    /// `NCCL_CHECK_MODE` as it was when the communicator was made (NVIDIA reads it then).
    pub check_mode: watchdog::check::Mode,
    /// The GPU's PCI bus id as a number (NVIDIA's `busId` in log lines), once init knows it.
    pub bus_id: std::sync::OnceLock<i64>,
    /// This rank's index among the ranks of its host, and how many share the host.
    pub local_rank: AtomicI32,
    pub local_nranks: AtomicI32,
    /// Device-side state, present once init completed.
    pub rt: Mutex<Option<runtime::Runtime>>,
    /// Splits and shrinks made from this communicator so far (tags their rendezvous).
    pub children: AtomicU64,
    /// Buffers registered with `ncclCommRegister`.
    pub registrations: registry::Registrations,
    /// Signal counters of one-sided operations, made at the first window registration.
    pub rma: Mutex<Option<Arc<window::Signals>>>,
    /// The device memory it holds, and whether it is suspended.
    pub mem: memory::Usage,
    /// Set by `ncclCommRevoke`: no new operations.
    pub revoked: AtomicBool,
    pub config: CommConfig,
    pub last_error: LastError,
    /// `ncclResult_t` of an error found after the call that caused it returned.
    async_error: AtomicI32,
    /// That error's message (kept apart from `last_error`, which later calls overwrite).
    async_message: Mutex<Option<String>>,
    /// Set by `ncclCommAbort`; every wait of this communicator checks it.
    pub abort: Arc<AtomicBool>,
    pub redops: redop::RedOpTable,
    /// The operations enqueued, numbered as every rank numbers them.
    pub progress: progress::Progress,
    /// The channel weights epoch of each collective (`adaptive`; inactive: always 0).
    pub weights: adaptive::Schedule,
    /// The watchdog thread (dead ranks, hang reports) and what transports report to it.
    pub watch: watchdog::Slot,
    /// The ids `ncclCommGetUniqueId` handed out for growing this communicator.
    pub grow: grow::GrowIds,
    destroyed: AtomicBool,
}

/// The live communicators by handle. Every call looks its handle up here: an `IntMap`.
static REGISTRY: Lazy<Mutex<IntMap<usize, Arc<Comm>>>> =
    Lazy::new(|| Mutex::new(IntMap::default()));

impl Comm {
    /// A communicator with no transport yet (filled in by init).
    pub fn new(rank: i32, nranks: i32, cuda_dev: i32, config: CommConfig) -> Self {
        Comm {
            rank: AtomicI32::new(rank),
            nranks: AtomicI32::new(nranks),
            cuda_dev,
            check_mode: watchdog::check::mode(),
            bus_id: std::sync::OnceLock::new(),
            local_rank: AtomicI32::new(rank),
            local_nranks: AtomicI32::new(nranks),
            rt: Mutex::new(None),
            children: AtomicU64::new(0),
            revoked: AtomicBool::new(false),
            registrations: registry::Registrations::default(),
            rma: Mutex::new(None),
            mem: memory::Usage::default(),
            config,
            last_error: LastError::default(),
            async_error: AtomicI32::new(ncclResult_t::ncclSuccess as i32),
            async_message: Mutex::new(None),
            abort: Arc::new(AtomicBool::new(false)),
            redops: redop::RedOpTable::default(),
            progress: progress::Progress::default(),
            weights: adaptive::Schedule::default(),
            watch: watchdog::Slot::default(),
            grow: grow::GrowIds::default(),
            destroyed: AtomicBool::new(false),
        }
    }

    pub fn rank(&self) -> i32 {
        self.rank.load(Ordering::Acquire)
    }

    pub fn nranks(&self) -> i32 {
        self.nranks.load(Ordering::Acquire)
    }

    /// Settle rank and size (split and shrink children learn them during init).
    pub fn set_rank(&self, rank: i32, nranks: i32) {
        self.rank.store(rank, Ordering::Release);
        self.nranks.store(nranks, Ordering::Release);
    }

    /// Publish a communicator and return the handle C will hold.
    pub fn register(comm: Arc<Comm>) -> ncclComm_t {
        let handle = Arc::as_ptr(&comm) as *mut ncclComm;
        REGISTRY.lock().insert(handle as usize, comm);
        handle
    }

    /// Remove a handle from the registry; later calls with it get `ncclInvalidArgument`.
    pub fn unregister(handle: ncclComm_t) -> Option<Arc<Comm>> {
        REGISTRY.lock().remove(&(handle as usize))
    }

    /// The communicator behind a handle: NULL and unknown (or destroyed) handles are
    /// `ncclInvalidArgument`, never a dereference.
    pub fn from_handle(handle: ncclComm_t) -> Result<Arc<Comm>> {
        if handle.is_null() {
            return Err(Error::invalid_argument("comm argument is NULL"));
        }
        REGISTRY
            .lock()
            .get(&(handle as usize))
            .cloned()
            .ok_or_else(|| {
                Error::invalid_argument(format!("comm {handle:p} is not a live communicator"))
            })
    }

    /// The asynchronous error state (`ncclCommGetAsyncError`).
    pub fn async_error(&self) -> ncclResult_t {
        ncclResult_t::from_raw(self.async_error.load(Ordering::Acquire))
            .unwrap_or(ncclResult_t::ncclInternalError)
    }

    /// Set the async state directly (used for `ncclInProgress` during non-blocking init).
    pub fn set_async_state(&self, code: ncclResult_t) {
        self.async_error.store(code as i32, Ordering::Release);
    }

    /// Record an asynchronous error (the first one wins).
    pub fn set_async_error(&self, e: &Error) {
        if self
            .async_error
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                let settled = cur == ncclResult_t::ncclSuccess as i32
                    || cur == ncclResult_t::ncclInProgress as i32;
                settled.then_some(e.code as i32)
            })
            .is_ok()
        {
            *self.async_message.lock() = Some(e.msg.clone());
            self.last_error.set(&e.msg);
        }
    }

    /// The message of the async error, if one was recorded.
    pub fn async_message(&self) -> Option<String> {
        self.async_message.lock().clone()
    }

    /// Whether init completed without error and nothing failed since (no async error).
    pub fn is_ready(&self) -> bool {
        self.async_error() == ncclResult_t::ncclSuccess
    }

    /// Whether `ncclCommAbort` was called.
    pub fn aborted(&self) -> bool {
        self.abort.load(Ordering::Acquire)
    }

    /// Fail with `ncclInvalidUsage` if the communicator was destroyed or aborted, or with its
    /// async error if one is pending.
    pub fn check_usable(&self) -> Result<()> {
        if self.destroyed.load(Ordering::Acquire) || self.aborted() {
            return Err(Error::invalid_usage(
                "communicator was destroyed or aborted",
            ));
        }
        if self.revoked.load(Ordering::Acquire) {
            return Err(Error::invalid_usage(
                "communicator was revoked: only destroy, split and shrink are allowed",
            ));
        }
        if self.mem.is_suspended() {
            return Err(Error::invalid_usage(
                "communicator is suspended (ncclCommSuspend): call ncclCommResume first",
            ));
        }
        match self.async_error() {
            ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress => Ok(()),
            // With the reason: a caller that reads only this call's message (PyTorch's next
            // collective after a dead rank) still learns who and why.
            code => Err(Error::new(
                code,
                match self.async_message() {
                    Some(why) => format!("communicator has a pending asynchronous error: {why}"),
                    None => "communicator has a pending asynchronous error".into(),
                },
            )),
        }
    }

    /// Fail if destroyed or aborted (revoked communicators may still be split or shrunk).
    pub fn check_live(&self) -> Result<()> {
        if self.destroyed.load(Ordering::Acquire) || self.aborted() {
            return Err(Error::invalid_usage(
                "communicator was destroyed or aborted",
            ));
        }
        Ok(())
    }

    /// Mark as destroyed (the handle is unregistered by the caller).
    pub fn mark_destroyed(&self) {
        self.destroyed.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revoked_and_destroyed_communicators_refuse_work() {
        let c = Comm::new(0, 2, 0, CommConfig::default());
        assert!(c.check_usable().is_ok());
        c.revoked.store(true, Ordering::Release);
        assert_eq!(
            c.check_usable().unwrap_err().code,
            ncclResult_t::ncclInvalidUsage
        );
        assert!(
            c.check_live().is_ok(),
            "a revoked communicator can still be split or shrunk"
        );
        c.mark_destroyed();
        assert!(c.check_live().is_err());
    }

    #[test]
    fn first_async_error_wins() {
        let c = Comm::new(0, 1, 0, CommConfig::default());
        c.set_async_state(ncclResult_t::ncclInProgress);
        c.set_async_error(&Error::remote("peer 1 died"));
        c.set_async_error(&Error::system("later"));
        assert_eq!(c.async_error(), ncclResult_t::ncclRemoteError);
        // Later calls overwrite the last error; the refusal of the next one still says why.
        c.last_error.set("ncclAllReduce: something else");
        let refused = c.check_usable().unwrap_err();
        assert_eq!(refused.code, ncclResult_t::ncclRemoteError);
        assert_eq!(
            refused.msg,
            "communicator has a pending asynchronous error: peer 1 died"
        );
    }
}
