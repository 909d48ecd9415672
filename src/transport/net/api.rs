//! The network interface every network stands behind: the built-in sockets (`socket.rs`) and
//! any NCCL net plugin (`plugin.rs`, NCCL's `ncclNet_v11`..`v8` C ABI). It mirrors NCCL's
//! `ncclNet_t`: devices with properties; a receiver listens and hands the sender an opaque
//! handle (through the bootstrap); connect and accept are non-blocking (None: call again);
//! sends and receives are asynchronous requests tested until done. Comms, requests and memory
//! handles are opaque numbers (a plugin's pointers, the sockets' table indices).
//!
//! The caller (the proxy, `proxy.rs`) keeps the memory of a request valid until `test`
//! reports it done, and registers every buffer it sends from or receives into with `reg_mr`.

use crate::error::Result;
use std::sync::Arc;

/// Bytes of a connection handle (`NCCL_NET_HANDLE_MAXSIZE`).
pub const HANDLE_BYTES: usize = 128;

/// What a receiver's `listen` gives its sender to `connect` to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Handle(pub [u8; HANDLE_BYTES]);

impl Default for Handle {
    fn default() -> Self {
        Handle([0; HANDLE_BYTES])
    }
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Handle({:02x?}..)", &self.0[..16])
    }
}

/// A listening, sending or receiving communicator of one network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Comm(pub usize);

/// An asynchronous send, receive or flush.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Request(pub usize);

/// A registered memory region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemHandle(pub usize);

/// Where a registered buffer lives (NCCL's `NCCL_PTR_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemType {
    Host,
    Cuda,
}

/// `ptr_support` bits (NCCL's `NCCL_PTR_HOST`, `NCCL_PTR_CUDA`, `NCCL_PTR_DMABUF`).
pub const PTR_HOST: i32 = 1;
pub const PTR_CUDA: i32 = 2;
pub const PTR_DMABUF: i32 = 4;

/// One network device's properties (NCCL's `ncclNetProperties_t`, the fields oxccl uses).
#[derive(Clone, Debug, PartialEq)]
pub struct Properties {
    pub name: String,
    pub pci_path: String,
    pub guid: u64,
    /// `PTR_*` bits: which memory the device can send from and receive into.
    pub ptr_support: i32,
    /// Whether a registration holds for every communicator of the device.
    pub reg_is_global: bool,
    /// Link speed in Mbit/s.
    pub speed_mbps: i32,
    pub port: i32,
    /// One-way latency in microseconds.
    pub latency_us: f32,
    pub max_comms: i32,
    /// Most receives one `irecv` may group (oxccl posts one at a time).
    pub max_recvs: i32,
    /// Most bytes one send or receive may carry.
    pub max_p2p_bytes: usize,
}

/// A network: NCCL's `ncclNet_t` as a Rust trait. Every method may be called from any thread,
/// but the calls on one comm come from one thread at a time (the proxy's).
pub trait Net: Send + Sync {
    /// The network's name (`NCCL_NET` selects by it): "Socket", "IB", a plugin's.
    fn name(&self) -> &str;
    fn devices(&self) -> Result<i32>;
    fn properties(&self, dev: i32) -> Result<Properties>;
    /// Start listening on `dev`: the handle for the sender, and the listening comm.
    fn listen(&self, dev: i32) -> Result<(Handle, Comm)>;
    /// Connect to a peer's handle; None while the connection is not established yet.
    fn connect(&self, dev: i32, handle: &Handle) -> Result<Option<Comm>>;
    /// Accept the connection of the sender given the handle; None while it is not there yet.
    fn accept(&self, listen: Comm) -> Result<Option<Comm>>;
    /// Register `size` bytes at `data` for sends or receives on `comm`.
    fn reg_mr(&self, comm: Comm, data: *mut u8, size: usize, mem: MemType) -> Result<MemHandle>;
    /// Whether the network registers CUDA memory given as a dma-buf (`reg_mr_dma_buf`).
    fn has_dma_buf(&self) -> bool {
        false
    }
    /// Register `size` bytes of CUDA memory at `data` for sends or receives on `comm`, given
    /// as the dma-buf `fd` from byte `offset` (NCCL's `regMrDmaBuf`; the caller closes `fd`
    /// after the call).
    fn reg_mr_dma_buf(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        offset: u64,
        fd: i32,
    ) -> Result<MemHandle> {
        let _ = (comm, data, size, offset, fd);
        Err(crate::error::Error::internal(format!(
            "network {} does not register dma-bufs",
            self.name()
        )))
    }
    fn dereg_mr(&self, comm: Comm, mh: MemHandle) -> Result<()>;
    /// Start sending `size` bytes at `data` (registered as `mh`); None: not now, try again.
    fn isend(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        tag: i32,
        mh: MemHandle,
    ) -> Result<Option<Request>>;
    /// Start receiving at most `size` bytes into `data`; None: not now, try again.
    fn irecv(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        tag: i32,
        mh: MemHandle,
    ) -> Result<Option<Request>>;
    /// Make received data visible to the GPU (CUDA memory only); None: nothing to flush.
    fn iflush(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        mh: MemHandle,
    ) -> Result<Option<Request>>;
    /// Whether a request is done: Some(bytes moved), after which the request is gone.
    fn test(&self, req: Request) -> Result<Option<usize>>;
    fn close_send(&self, comm: Comm) -> Result<()>;
    fn close_recv(&self, comm: Comm) -> Result<()>;
    fn close_listen(&self, comm: Comm) -> Result<()>;
    /// This network as the communicator `comm_id` (its hash) uses it, with its
    /// `ncclConfig_t.trafficClass` (`NCCL_CONFIG_UNDEF_INT`: unset): a network of its own for
    /// that communicator when it keeps per-communicator state (a v11 plugin's context, from
    /// an `init` of its own, finalized when the returned network goes), else None: the
    /// communicator uses this one.
    fn for_comm(&self, comm_id: u64, traffic_class: i32) -> Result<Option<Arc<dyn Net>>> {
        let _ = (comm_id, traffic_class);
        Ok(None)
    }
}
