//! The built-in network, "Socket": TCP between hosts, as NVIDIA's `NET/Socket`. A connection
//! is `NCCL_SOCKET_NTHREADS` × `NCCL_NSOCKS_PERTHREAD` sockets (at least one); a message is an
//! 8-byte size header, then its bytes cut into one chunk per socket (at least 64 KiB each).
//! Message m starts on socket m mod sockets: its header and first chunk go there (in one
//! write), its chunk j on the j-th socket after it, so a run of small messages spreads over
//! every socket and helper thread, as NVIDIA's does. Every socket is non-blocking and serves
//! a FIFO of tasks (a header or a chunk). The caller's `test` moves bytes (with no helper
//! threads, the default as NVIDIA's, it alone), and each helper thread serves its share of
//! the sockets. Whoever moves a socket's bytes holds its queue, and only tries to take it: a
//! socket another thread is serving is left to that thread, so no thread ever sleeps behind
//! another's system call. A new task goes to the socket's incoming list (held only to push
//! or take), which the mover takes over in order, so posting never waits for a transfer
//! either. Both ends cut a message alike from its size and number messages alike (the
//! receiver places one header at a time, the next once the last has arrived and its chunks
//! are queued), so every socket's tasks meet in order. A sender closing in order says goodbye
//! (a header of `u64::MAX`); an end of stream without it is a dead peer.
//!
//! The interface is the bootstrap's (`NCCL_SOCKET_IFNAME`, `NCCL_SOCKET_FAMILY`): one device.

use super::api::{Comm, Handle, MemHandle, MemType, Net, Properties, Request, PTR_HOST};
use crate::bootstrap::socket::{self as bsock, NetIf};
use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const HANDLE_MAGIC: u64 = 0x4f58_534f_434b_3031; // "OXSOCK01"
const HELLO_BYTES: usize = 24;
/// The size header of a sender's last word on an orderly close: its receiver then expects
/// nothing more, and an end of stream without it is an error (a process that died).
const GOODBYE: u64 = u64::MAX;
/// The smallest chunk a message is cut into (NVIDIA's `MIN_CHUNKSIZE`).
const MIN_CHUNK: usize = 64 << 10;
/// How long a helper thread keeps trying its sockets after it last moved bytes, before it
/// sleeps in poll.
const HELPER_SPIN: Duration = Duration::from_micros(50);
/// Most sockets per connection (NVIDIA's limit on threads × sockets per thread).
const MAX_SOCKETS: usize = 64;
/// How long an accepted socket may take to say which connection it belongs to, and a
/// connect to complete.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The sockets' settings: helper threads and sockets per thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub nthreads: usize,
    pub nsocks: usize,
}

/// What `NCCL_SOCKET_NTHREADS` / `NCCL_NSOCKS_PERTHREAD` are when unset (NVIDIA's -2: the
/// device's automatic value).
const AUTO: i64 = -2;

impl Shape {
    /// `NCCL_SOCKET_NTHREADS` and `NCCL_NSOCKS_PERTHREAD`, where unset those of a NIC
    /// without a vendor of its own (`OTHER_NIC`); their product is capped at 64.
    pub fn from_env() -> Shape {
        Shape::from_settings(Shape::settings(), auto_for_vendor(None))
    }

    /// Device `ifname`'s shape: the settings where set, else NVIDIA's automatic values for
    /// its NIC (`auto_for_vendor`), one helper and one socket on a link slower than
    /// `HELPERS_MIN_MBPS` (`auto_for_speed`).
    pub fn for_interface(ifname: &str) -> Shape {
        let auto = auto_for_vendor(nic_vendor(ifname).as_deref());
        let auto = match auto {
            OTHER_NIC => auto_for_speed(known_speed_mbps(ifname)),
            vendor => vendor,
        };
        Shape::from_settings(Shape::settings(), auto)
    }

    /// (`NCCL_SOCKET_NTHREADS`, `NCCL_NSOCKS_PERTHREAD`), `AUTO` where unset.
    fn settings() -> (i64, i64) {
        (
            crate::env::registry::SOCKET_NTHREADS.int_or(AUTO),
            crate::env::registry::NSOCKS_PERTHREAD.int_or(AUTO),
        )
    }

    /// The shape of settings (threads, sockets per thread), `auto` standing in for the ones
    /// that are `AUTO`; threads at most 16, sockets per thread 1..=64.
    fn from_settings((threads, per): (i64, i64), auto: (usize, usize)) -> Shape {
        let threads = if threads == AUTO {
            auto.0
        } else {
            threads.clamp(0, 16) as usize
        };
        let per = if per == AUTO {
            auto.1
        } else {
            per.clamp(1, 64) as usize
        };
        Shape::new(threads, per)
    }

    pub fn new(nthreads: usize, per_thread: usize) -> Shape {
        let per = per_thread.max(1);
        let nthreads = nthreads.min(MAX_SOCKETS);
        let per = per.min(MAX_SOCKETS / nthreads.max(1));
        Shape {
            nthreads,
            nsocks: per * nthreads.max(1),
        }
    }
}

/// The automatic (threads, sockets per thread) for a NIC of PCI vendor `vendor` (as sysfs
/// writes it): NVIDIA's for AWS ENA (0x1d0f) 2 × 8 and Google gVNIC (0x1ae0) 4 × 1, and
/// `OTHER_NIC` for any other NIC or a virtual interface.
fn auto_for_vendor(vendor: Option<&str>) -> (usize, usize) {
    match vendor {
        Some("0x1d0f") => (2, 8),
        Some("0x1ae0") => (4, 1),
        _ => OTHER_NIC,
    }
}

/// The shape of any other NIC: 2 helper threads × 2 sockets. NVIDIA's is 0 × 1 (its proxy
/// thread alone, one socket), which one core's copying bounds: on one H200 host over
/// loopback, 2 × 2 moved 1.9 × (all-reduce) and 1.65 × (all-gather) NVIDIA's busbw from
/// 16 MiB, where 0 × 1 was at par (docs/bench.md). The helpers sleep while
/// their sockets are idle.
const OTHER_NIC: (usize, usize) = (2, 2);

/// Links below this speed (Mbit/s) get one helper thread with one socket: one core keeps up
/// with them, and more TCP flows per connection only contend for the link's queue (two
/// shaped links of 4000 + 1000 Mbit/s: 2 × 2 moved 0.36 GB/s over the fast link where 1 × 1
/// and NVIDIA's 0 × 1 moved 0.47; docs/bench.md).
const HELPERS_MIN_MBPS: u32 = 25_000;

/// The automatic shape of a NIC without a vendor rule, from its speed: `OTHER_NIC` where the
/// speed is unknown (a virtual interface, loopback: memory-to-memory, which one core's copying
/// bounds) or at least `HELPERS_MIN_MBPS`, else 1 × 1.
fn auto_for_speed(speed_mbps: Option<u32>) -> (usize, usize) {
    match speed_mbps {
        Some(s) if s < HELPERS_MIN_MBPS => (1, 1),
        _ => OTHER_NIC,
    }
}

/// What is known of interface `ifname`'s speed: the `OXCCL_NET_SPEEDS` entry naming it, else
/// the topology file's (`NCCL_TOPO_FILE`), else the speed sysfs reports for a NIC with a PCI
/// device (a virtual interface's, such as a veth's 10000, says nothing of what it carries).
fn known_speed_mbps(ifname: &str) -> Option<u32> {
    let (overrides, _) = super::parse_speed_overrides(&crate::env::registry::NET_SPEEDS.string());
    if let Some(&(_, s)) = overrides.iter().find(|(n, _)| n == ifname) {
        return Some(s);
    }
    let file = crate::topo::file::from_env().ok().flatten();
    if let Some(s) = file.and_then(|f| f.net_speed(ifname)) {
        return Some(s);
    }
    nic_vendor(ifname)?;
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/speed"))
        .ok()?
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|&s| s > 0)
}

/// The PCI vendor id of interface `ifname` (`/sys/class/net/<ifname>/device/vendor`, e.g.
/// "0x1d0f"); None for an interface without a PCI device.
fn nic_vendor(ifname: &str) -> Option<String> {
    if ifname.contains('/') {
        return None;
    }
    let text = std::fs::read_to_string(format!("/sys/class/net/{ifname}/device/vendor")).ok()?;
    Some(text.trim().to_string())
}

/// The built-in socket network: one device per interface (`bsock::net_interfaces`), each
/// with its shape.
pub struct SocketNet {
    devs: Vec<NetIf>,
    shapes: Vec<Shape>,
    objects: Mutex<Objects>,
}

#[derive(Default)]
struct Objects {
    next: usize,
    listens: HashMap<usize, Arc<Listen>>,
    comms: HashMap<usize, Arc<SockComm>>,
    requests: HashMap<usize, Arc<Req>>,
}

impl Objects {
    fn id(&mut self) -> usize {
        self.next += 1;
        self.next
    }
}

impl SocketNet {
    /// The network on every interface `NCCL_SOCKET_IFNAME` / `NCCL_SOCKET_FAMILY` select
    /// (as NVIDIA's: without a setting, every interface but loopback and docker, else
    /// docker, else loopback), each a device, with the settings of the environment.
    pub fn from_env() -> Result<SocketNet> {
        let devs = bsock::net_interfaces()?;
        let shapes = devs.iter().map(|d| Shape::for_interface(&d.name)).collect();
        let list: Vec<String> = devs
            .iter()
            .enumerate()
            .map(|(i, d)| format!("[{i}]{}:{}<0>", d.name, d.ip))
            .collect();
        crate::info!(NET, "NET/Socket : Using {}", list.join(" "));
        Ok(SocketNet::with_shapes(devs, shapes))
    }

    /// The network on one interface.
    pub fn new(dev: NetIf, shape: Shape) -> SocketNet {
        SocketNet::with_devices(vec![dev], shape)
    }

    /// The network on `devs` (not empty), device i on `devs[i]`, all of one shape.
    pub fn with_devices(devs: Vec<NetIf>, shape: Shape) -> SocketNet {
        let shapes = vec![shape; devs.len()];
        SocketNet::with_shapes(devs, shapes)
    }

    /// The network on `devs` (not empty), device i on `devs[i]` with `shapes[i]`.
    fn with_shapes(devs: Vec<NetIf>, shapes: Vec<Shape>) -> SocketNet {
        debug_assert!(!devs.is_empty() && devs.len() == shapes.len());
        SocketNet {
            devs,
            shapes,
            objects: Mutex::new(Objects::default()),
        }
    }

    /// Device `dev`'s interface, or an error naming it.
    fn interface(&self, dev: i32) -> Result<&NetIf> {
        usize::try_from(dev)
            .ok()
            .and_then(|d| self.devs.get(d))
            .ok_or_else(|| Error::invalid_argument(format!("NET/Socket: no device {dev}")))
    }

    fn listen_comm(&self, c: Comm) -> Result<Arc<Listen>> {
        self.objects
            .lock()
            .listens
            .get(&c.0)
            .cloned()
            .ok_or_else(|| Error::internal(format!("NET/Socket: no listening comm {}", c.0)))
    }

    fn comm(&self, c: Comm) -> Result<Arc<SockComm>> {
        self.objects
            .lock()
            .comms
            .get(&c.0)
            .cloned()
            .ok_or_else(|| Error::internal(format!("NET/Socket: no comm {}", c.0)))
    }

    fn add_comm(&self, comm: Arc<SockComm>) -> Comm {
        let mut o = self.objects.lock();
        let id = o.id();
        o.comms.insert(id, comm);
        Comm(id)
    }

    fn add_request(&self, req: Arc<Req>) -> Request {
        let mut o = self.objects.lock();
        let id = o.id();
        o.requests.insert(id, req);
        Request(id)
    }

    /// Start a send of `size` bytes at `data` (its header on socket 0, its chunks on every
    /// socket), or a receive of at most `size` (its header; the chunks once the size is in).
    fn post(&self, comm: Comm, data: *mut u8, size: usize, send: bool) -> Result<Option<Request>> {
        let c = self.comm(comm)?;
        if let Some(e) = c.error() {
            return Err(e);
        }
        let chunks = if send { c.chunks_of(size) } else { 0 };
        let req = Arc::new(Req {
            remaining: AtomicUsize::new(1 + chunks),
            size: AtomicUsize::new(if send { size } else { 0 }),
            base: data as usize,
            capacity: size,
            comm: c.clone(),
        });
        if send {
            c.queue_send(&req, size);
        } else {
            c.queue_recv(&req);
        }
        Ok(Some(self.add_request(req)))
    }

    fn close_comm(&self, c: Comm) -> Result<()> {
        let comm = self.objects.lock().comms.remove(&c.0);
        if let Some(comm) = comm {
            comm.stop();
        }
        Ok(())
    }
}

/// Encode where a listener is, and the receiver's socket shape (the sender follows it).
fn encode_handle(addr: SocketAddr, shape: Shape) -> Handle {
    let mut h = Handle::default();
    h.0[..8].copy_from_slice(&HANDLE_MAGIC.to_le_bytes());
    h.0[8] = if addr.is_ipv4() { 4 } else { 6 };
    h.0[9] = shape.nsocks as u8;
    h.0[10] = shape.nthreads as u8;
    h.0[12..14].copy_from_slice(&addr.port().to_be_bytes());
    match addr.ip() {
        IpAddr::V4(ip) => h.0[16..20].copy_from_slice(&ip.octets()),
        IpAddr::V6(ip) => h.0[16..32].copy_from_slice(&ip.octets()),
    }
    if let SocketAddr::V6(a) = addr {
        h.0[32..36].copy_from_slice(&a.scope_id().to_le_bytes());
    }
    h
}

/// The address a handle of ours points its sender at (for tests).
#[cfg(test)]
pub(super) fn handle_address(h: &Handle) -> SocketAddr {
    decode_handle(h).expect("a handle of ours").0
}

fn decode_handle(h: &Handle) -> Result<(SocketAddr, Shape)> {
    let bad =
        |why: &str| Error::internal(format!("NET/Socket: malformed connection handle: {why}"));
    if h.0[..8] != HANDLE_MAGIC.to_le_bytes() {
        return Err(bad("not a socket handle"));
    }
    let port = u16::from_be_bytes([h.0[12], h.0[13]]);
    let ip: IpAddr = match h.0[8] {
        4 => Ipv4Addr::from(<[u8; 4]>::try_from(&h.0[16..20]).unwrap()).into(),
        6 => Ipv6Addr::from(<[u8; 16]>::try_from(&h.0[16..32]).unwrap()).into(),
        _ => return Err(bad("unknown address family")),
    };
    let nsocks = h.0[9] as usize;
    if nsocks == 0 || nsocks > MAX_SOCKETS {
        return Err(bad("socket count out of range"));
    }
    let addr = match ip {
        IpAddr::V6(ip) => {
            let scope = u32::from_le_bytes(h.0[32..36].try_into().unwrap());
            SocketAddr::V6(std::net::SocketAddrV6::new(ip, port, 0, scope))
        }
        ip => SocketAddr::new(ip, port),
    };
    Ok((
        addr,
        Shape {
            nthreads: h.0[10] as usize,
            nsocks,
        },
    ))
}

/// A listening comm: accepted sockets wait here until all of one connection have arrived.
struct Listen {
    listener: TcpListener,
    shape: Shape,
    arrived: Mutex<HashMap<u64, Vec<Option<TcpStream>>>>,
}

/// Read a just-accepted socket's hello: (connection id, index, count).
fn read_hello(s: &mut TcpStream) -> Result<(u64, usize, usize)> {
    let mut b = [0u8; HELLO_BYTES];
    s.set_read_timeout(Some(SETUP_TIMEOUT))
        .map_err(sys("set_read_timeout"))?;
    s.read_exact(&mut b)
        .map_err(sys("reading a connection's hello"))?;
    if b[..8] != HANDLE_MAGIC.to_le_bytes() {
        return Err(Error::system(
            "NET/Socket: a connection to a listening socket did not come from oxccl",
        ));
    }
    let id = u64::from_le_bytes(b[8..16].try_into().unwrap());
    let index = u32::from_le_bytes(b[16..20].try_into().unwrap()) as usize;
    let count = u32::from_le_bytes(b[20..24].try_into().unwrap()) as usize;
    if count == 0 || count > MAX_SOCKETS || index >= count {
        return Err(Error::system("NET/Socket: malformed connection hello"));
    }
    Ok((id, index, count))
}

fn sys(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::system(format!("NET/Socket: {what}: {e}"))
}

/// What a socket's task moves.
enum TaskKind {
    /// The 8-byte size of a message being sent.
    SendHeader,
    /// The size of a message being received; once read, the message's chunks are queued.
    RecvHeader,
    /// `len` bytes at `ptr`, sent or received.
    Data { ptr: usize, send: bool },
}

struct Task {
    req: Arc<Req>,
    kind: TaskKind,
    len: usize,
    done: usize,
    header: [u8; 8],
}

/// A send or receive in flight: done when no task of it is left.
struct Req {
    remaining: AtomicUsize,
    /// Bytes of the message (a receive knows it once its header arrived).
    size: AtomicUsize,
    /// Where a receive lands, and its capacity.
    base: usize,
    capacity: usize,
    comm: Arc<SockComm>,
}

impl Req {
    /// Every task of it has moved.
    fn is_done(&self) -> bool {
        self.remaining.load(Ordering::Acquire) == 0
    }
}

/// One TCP socket of a connection with its queue of tasks.
struct Sock {
    stream: TcpStream,
    /// The tasks being served, held by the thread moving this socket's bytes.
    queue: Mutex<VecDeque<Task>>,
    /// Tasks posted since the mover last looked, in order behind `queue`'s.
    incoming: Mutex<VecDeque<Task>>,
}

impl Sock {
    /// Queue `tasks` behind every task posted before, without waiting for a transfer in
    /// progress.
    fn post(&self, tasks: impl IntoIterator<Item = Task>) {
        self.incoming.lock().extend(tasks);
    }

    /// The queue, when no other thread is serving it, with the incoming tasks behind it.
    fn try_take_queue(&self) -> Option<parking_lot::MutexGuard<'_, VecDeque<Task>>> {
        let mut q = self.queue.try_lock()?;
        self.take_incoming(&mut q);
        Some(q)
    }

    /// The queue (waiting for a mover to let go of it), with the incoming tasks behind it.
    fn take_queue(&self) -> parking_lot::MutexGuard<'_, VecDeque<Task>> {
        let mut q = self.queue.lock();
        self.take_incoming(&mut q);
        q
    }

    fn take_incoming(&self, q: &mut VecDeque<Task>) {
        let mut incoming = self.incoming.lock();
        if q.is_empty() {
            std::mem::swap(q, &mut incoming);
        } else {
            q.append(&mut incoming);
        }
    }
}

/// Which message comes next on a comm. A sender numbers its messages as they are posted; a
/// receiver places the header of one posted receive at a time (`header_out`), on the socket
/// of the next message's number, and keeps the later ones in `waiting` until it has arrived.
#[derive(Default)]
struct Order {
    /// Messages placed so far (posted sends, or receive headers placed).
    next: usize,
    header_out: bool,
    waiting: VecDeque<Arc<Req>>,
}

/// A sending or receiving comm: its sockets, the helper threads serving them, and the first
/// failure (after which every request fails).
struct SockComm {
    socks: Vec<Sock>,
    /// This end sends (connected), else receives (accepted).
    sends: bool,
    /// The sender said goodbye: nothing more will come, and that is no error.
    peer_closed: AtomicBool,
    failed: Mutex<Option<String>>,
    order: Mutex<Order>,
    stop: AtomicBool,
    /// One per helper thread: set and signalled when one of its sockets has new tasks.
    wakes: Vec<(Mutex<bool>, Condvar)>,
    helpers: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl SockComm {
    fn new(streams: Vec<TcpStream>, nthreads: usize, sends: bool) -> Result<Arc<SockComm>> {
        let mut socks = Vec::with_capacity(streams.len());
        for s in streams {
            s.set_nonblocking(true).map_err(sys("set_nonblocking"))?;
            s.set_nodelay(true).map_err(sys("set_nodelay"))?;
            set_buffer_sizes(&s).map_err(sys("setsockopt SO_SNDBUF/SO_RCVBUF"))?;
            socks.push(Sock {
                stream: s,
                queue: Mutex::new(VecDeque::new()),
                incoming: Mutex::new(VecDeque::new()),
            });
        }
        let nthreads = nthreads.min(socks.len());
        let comm = Arc::new(SockComm {
            socks,
            sends,
            peer_closed: AtomicBool::new(false),
            failed: Mutex::new(None),
            order: Mutex::new(Order::default()),
            stop: AtomicBool::new(false),
            wakes: (0..nthreads)
                .map(|_| (Mutex::new(false), Condvar::new()))
                .collect(),
            helpers: Mutex::new(Vec::new()),
        });
        for t in 0..nthreads {
            let c = comm.clone();
            let h = std::thread::Builder::new()
                .name(format!("oxccl-sock{t}"))
                .spawn(move || c.serve(t, nthreads))
                .map_err(sys("spawning a socket thread"))?;
            comm.helpers.lock().push(h);
        }
        Ok(comm)
    }

    /// Chunk length of a message of `size` bytes over this comm's sockets.
    fn chunk_len(&self, size: usize) -> usize {
        size.div_ceil(self.socks.len()).max(MIN_CHUNK)
    }

    /// The socket message `m` starts on: its header and first chunk go there, its chunk j on
    /// the j-th socket after it.
    fn first_socket(&self, m: usize) -> usize {
        m % self.socks.len()
    }

    /// Queue a send's header and chunks on the sockets of its message number; the header and
    /// the first chunk together, so that they leave in one write.
    fn queue_send(&self, req: &Arc<Req>, size: usize) {
        let mut order = self.order.lock();
        let first = self.first_socket(order.next);
        order.next += 1;
        let header = Task {
            req: req.clone(),
            kind: TaskKind::SendHeader,
            len: 8,
            done: 0,
            header: (size as u64).to_le_bytes(),
        };
        let mut chunks = self.chunk_tasks(req, req.base, size, true).into_iter();
        self.socks[first].post(std::iter::once(header).chain(chunks.next()));
        for (j, t) in chunks.enumerate() {
            self.socks[self.socket_after(first, j + 1)].post([t]);
        }
        drop(order);
        self.notify_message(first, self.chunks_of(size));
    }

    /// Queue a receive: its header on the next message's socket when no header is out, else
    /// behind the receives already waiting.
    fn queue_recv(&self, req: &Arc<Req>) {
        let mut order = self.order.lock();
        if order.header_out {
            order.waiting.push_back(req.clone());
            return;
        }
        let s = self.first_socket(order.next);
        order.next += 1;
        order.header_out = true;
        self.socks[s].post([recv_header(req)]);
        drop(order);
        self.notify_socket(s);
    }

    /// The socket `j` places after socket `i`.
    fn socket_after(&self, i: usize, j: usize) -> usize {
        (i + j) % self.socks.len()
    }

    /// The chunk tasks of a message of `size` bytes at `base`, in order.
    fn chunk_tasks(&self, req: &Arc<Req>, base: usize, size: usize, send: bool) -> Vec<Task> {
        let chunk = self.chunk_len(size);
        (0..size)
            .step_by(chunk)
            .map(|off| Task {
                req: req.clone(),
                kind: TaskKind::Data {
                    ptr: base + off,
                    send,
                },
                len: chunk.min(size - off),
                done: 0,
                header: [0; 8],
            })
            .collect()
    }

    fn chunks_of(&self, size: usize) -> usize {
        size.div_ceil(self.chunk_len(size))
    }

    /// Wake the helper thread of socket `i`, if there are helpers (no system call when it
    /// is not asleep).
    fn notify_socket(&self, i: usize) {
        if self.wakes.is_empty() {
            return;
        }
        let (flag, cond) = &self.wakes[i % self.wakes.len()];
        *flag.lock() = true;
        cond.notify_one();
    }

    /// Wake the helpers of a message's `chunks` sockets from socket `first` on (at least the
    /// header's).
    fn notify_message(&self, first: usize, chunks: usize) {
        let helpers = self.wakes.len();
        for j in 0..chunks.max(1).min(helpers.max(1)) {
            self.notify_socket(self.socket_after(first, j));
        }
    }

    fn notify_all(&self) {
        for i in 0..self.wakes.len() {
            self.notify_socket(i);
        }
    }

    fn fail(&self, msg: String) {
        let mut f = self.failed.lock();
        if f.is_none() {
            *f = Some(msg);
        }
    }

    fn error(&self) -> Option<Error> {
        self.failed
            .lock()
            .as_ref()
            .map(|m| Error::remote(format!("NET/Socket: {m}")))
    }

    /// Move what can be moved on socket `i` without blocking, unless another thread is
    /// serving it; whether anything moved.
    fn progress(&self, i: usize) -> bool {
        if self.peer_closed.load(Ordering::Acquire) {
            return false;
        }
        let sock = &self.socks[i];
        let Some(mut q) = sock.try_take_queue() else {
            return false;
        };
        let mut moved = false;
        while !q.is_empty() {
            let step = match header_and_data(&mut q) {
                Some((header, data)) => move_header_with_data(&sock.stream, header, data),
                None => move_bytes(&sock.stream, q.front_mut().expect("a front task")),
            };
            match step {
                Ok(0) => break,
                Ok(_) => moved = true,
                Err(e) => {
                    self.fail(e);
                    return moved;
                }
            }
            let task = q.front().expect("a front task");
            if task.done < task.len {
                continue;
            }
            let task = q.pop_front().expect("a front task");
            if let TaskKind::RecvHeader = task.kind {
                if let Err(e) = self.header_arrived(&task, i, &mut q) {
                    self.fail(e);
                    return moved;
                }
                if self.peer_closed.load(Ordering::Acquire) {
                    return true;
                }
            }
            task.req.remaining.fetch_sub(1, Ordering::AcqRel);
        }
        moved
    }

    /// A receive's header is in on socket `i` (whose queue `q` the caller holds): check the
    /// size, queue the message's chunks (the first next on socket `i`), then place the next
    /// waiting receive's header.
    fn header_arrived(
        &self,
        task: &Task,
        i: usize,
        q: &mut VecDeque<Task>,
    ) -> std::result::Result<(), String> {
        let req = &task.req;
        let header = u64::from_le_bytes(task.header);
        if header == GOODBYE {
            // The receive stays pending for good: the sender closed in order.
            self.peer_closed.store(true, Ordering::Release);
            return Ok(());
        }
        let size = header as usize;
        if size > req.capacity {
            return Err(format!(
                "message of {size} bytes is larger than the posted receive of {} bytes",
                req.capacity
            ));
        }
        req.size.store(size, Ordering::Release);
        let tasks = self.chunk_tasks(req, req.base, size, false);
        let chunks = tasks.len();
        req.remaining.fetch_add(chunks, Ordering::AcqRel);
        for (j, t) in tasks.into_iter().enumerate() {
            // The first chunk follows the header on socket i; a message has at most one chunk
            // per socket, and no later message's task is queued before this header arrived.
            if j == 0 {
                q.push_front(t);
            } else {
                self.socks[self.socket_after(i, j)].post([t]);
            }
        }
        self.notify_message(i, chunks);
        let mut order = self.order.lock();
        let Some(next) = order.waiting.pop_front() else {
            order.header_out = false;
            return Ok(());
        };
        let s = self.first_socket(order.next);
        order.next += 1;
        if s == i {
            q.push_back(recv_header(&next));
        } else {
            self.socks[s].post([recv_header(&next)]);
            self.notify_socket(s);
        }
        Ok(())
    }

    /// Every socket, once: whether anything moved.
    fn progress_all(&self) -> bool {
        let mut moved = false;
        for i in 0..self.socks.len() {
            moved |= self.progress(i);
        }
        moved
    }

    /// A helper thread: serve sockets t, t + n, ... until stopped (each when no other thread
    /// is serving it), and with nothing to move there, help with the others; after moving
    /// something it keeps trying for [`HELPER_SPIN`] before it sleeps (a message's next bytes
    /// or the next message then go without a wakeup, as NVIDIA's helpers spin while they have
    /// work).
    fn serve(&self, t: usize, n: usize) {
        let mine: Vec<usize> = (t..self.socks.len()).step_by(n).collect();
        let mut last_moved = std::time::Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            let mut moved = false;
            for &i in &mine {
                moved |= self.progress(i);
            }
            if !moved {
                // Help with the other sockets no one is serving (the next message's header
                // may wait on a sleeping helper's socket).
                for i in (0..self.socks.len()).filter(|i| i % n != t) {
                    moved |= self.progress(i);
                }
            }
            if moved {
                last_moved = std::time::Instant::now();
                continue;
            }
            if last_moved.elapsed() < HELPER_SPIN {
                std::hint::spin_loop();
                continue;
            }
            self.wait_ready(t, &mine);
        }
    }

    /// Sleep until a socket of `mine` with work can move, new work is queued, or 1 ms passed.
    fn wait_ready(&self, t: usize, mine: &[usize]) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        for &i in mine {
            let q = self.socks[i].take_queue();
            if let Some(task) = q.front() {
                let mut p = bsock::pollfd(std::os::fd::AsRawFd::as_raw_fd(&self.socks[i].stream));
                p.events = if task.sends() {
                    libc::POLLOUT
                } else {
                    libc::POLLIN
                };
                fds.push(p);
            }
        }
        let (flag, cond) = &self.wakes[t];
        if fds.is_empty() {
            let mut woken = flag.lock();
            if !*woken {
                cond.wait_for(&mut woken, Duration::from_millis(1));
            }
            *woken = false;
            return;
        }
        let _ = bsock::poll(&mut fds, Duration::from_millis(1));
    }

    /// An orderly close: a sender at a message boundary says goodbye first.
    fn stop(&self) {
        if self.sends {
            // Where the receiver expects the next header.
            let order = self.order.lock();
            let s = self.first_socket(order.next);
            let q = self.socks[s].take_queue();
            if q.is_empty() {
                let _ = (&self.socks[s].stream).write(&GOODBYE.to_le_bytes());
            }
        }
        self.stop.store(true, Ordering::Release);
        self.notify_all();
        for h in self.helpers.lock().drain(..) {
            let _ = h.join();
        }
        for s in &self.socks {
            let _ = s.stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// The task that reads the size header of receive `req`.
fn recv_header(req: &Arc<Req>) -> Task {
    Task {
        req: req.clone(),
        kind: TaskKind::RecvHeader,
        len: 8,
        done: 0,
        header: [0; 8],
    }
}

impl Task {
    fn sends(&self) -> bool {
        match self.kind {
            TaskKind::SendHeader => true,
            TaskKind::RecvHeader => false,
            TaskKind::Data { send, .. } => send,
        }
    }
}

/// A message's size header at the front of `q` with its first data chunk right behind it
/// (socket 0's), which then go out in one write: a separate 8-byte write costs a segment and
/// a wakeup of its own at the receiver.
fn header_and_data(q: &mut VecDeque<Task>) -> Option<(&mut Task, &mut Task)> {
    let pair = q.len() >= 2
        && matches!(q[0].kind, TaskKind::SendHeader)
        && q[0].done < q[0].len
        && matches!(q[1].kind, TaskKind::Data { send: true, .. })
        && Arc::ptr_eq(&q[0].req, &q[1].req);
    if !pair {
        return None;
    }
    let (head, rest) = q.make_contiguous().split_at_mut(1);
    Some((&mut head[0], &mut rest[0]))
}

/// One vectored write of the rest of `header` and as much of `data` as goes without
/// blocking: the bytes moved (0: the socket would block), counted to the header first.
fn move_header_with_data(
    mut stream: &TcpStream,
    header: &mut Task,
    data: &mut Task,
) -> std::result::Result<usize, String> {
    let TaskKind::Data { ptr, .. } = data.kind else {
        unreachable!("header_and_data pairs a header with data")
    };
    // SAFETY: as in move_bytes: the request's buffer stays valid until the request is done,
    // and nothing writes it meanwhile.
    let rest =
        unsafe { std::slice::from_raw_parts((ptr + data.done) as *const u8, data.len - data.done) };
    loop {
        let bufs = [
            IoSlice::new(&header.header[header.done..]),
            IoSlice::new(rest),
        ];
        match stream.write_vectored(&bufs) {
            Ok(0) => return Err("the connection accepts no more bytes".into()),
            Ok(n) => {
                let to_header = n.min(header.len - header.done);
                header.done += to_header;
                data.done += n - to_header;
                return Ok(n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(0),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("connection failed: {e}")),
        }
    }
}

/// Move the rest of `task` on `stream` as far as it goes without blocking: the bytes moved
/// (0: the socket would block), or why the connection failed.
fn move_bytes(mut stream: &TcpStream, task: &mut Task) -> std::result::Result<usize, String> {
    let mut moved = 0;
    while task.done < task.len {
        let r = match task.kind {
            TaskKind::SendHeader => stream.write(&task.header[task.done..]),
            TaskKind::RecvHeader => stream.read(&mut task.header[task.done..]),
            TaskKind::Data { ptr, send } => {
                let p = (ptr + task.done) as *mut u8;
                let n = task.len - task.done;
                if send {
                    // SAFETY: the request's buffer (`ptr`, `len` bytes) stays valid until
                    // the request is done (the `Net` contract); nothing writes it meanwhile.
                    stream.write(unsafe { std::slice::from_raw_parts(p, n) })
                } else {
                    // SAFETY: as above; this task is the only writer of its bytes.
                    stream.read(unsafe { std::slice::from_raw_parts_mut(p, n) })
                }
            }
        };
        match r {
            Ok(0) if !task.sends() => {
                return Err(
                    "the peer closed the connection without a goodbye (its process exited or \
                     was killed)"
                        .into(),
                )
            }
            Ok(0) => return Err("the connection accepts no more bytes".into()),
            Ok(n) => {
                task.done += n;
                moved += n;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(moved),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("connection failed: {e}")),
        }
    }
    Ok(moved.max(1))
}

impl Net for SocketNet {
    fn name(&self) -> &str {
        "Socket"
    }

    fn devices(&self) -> Result<i32> {
        Ok(self.devs.len() as i32)
    }

    fn properties(&self, dev: i32) -> Result<Properties> {
        let netif = self.interface(dev)?;
        Ok(Properties {
            name: netif.name.clone(),
            // NVIDIA's: the interface's device, where it has one (not lo, veth, bridges).
            pci_path: crate::topo::pci::Sysfs::system().net_interface_device(&netif.name),
            guid: 0,
            ptr_support: PTR_HOST,
            reg_is_global: false,
            speed_mbps: link_speed_mbps(&netif.name),
            port: 0,
            latency_us: 0.0,
            max_comms: 65536,
            max_recvs: 1,
            max_p2p_bytes: i32::MAX as usize,
        })
    }

    fn listen(&self, dev: i32) -> Result<(Handle, Comm)> {
        let listener = bsock::listen_on(self.interface(dev)?)?;
        // The receiver's device decides the connection's shape; the sender follows it.
        let shape = self.shapes[dev as usize];
        listener
            .set_nonblocking(true)
            .map_err(sys("set_nonblocking"))?;
        let addr = listener.local_addr().map_err(sys("local_addr"))?;
        let handle = encode_handle(addr, shape);
        let mut o = self.objects.lock();
        let id = o.id();
        o.listens.insert(
            id,
            Arc::new(Listen {
                listener,
                shape,
                arrived: Mutex::new(HashMap::new()),
            }),
        );
        Ok((handle, Comm(id)))
    }

    fn connect(&self, _dev: i32, handle: &Handle) -> Result<Option<Comm>> {
        let (addr, shape) = decode_handle(handle)?;
        crate::bootstrap::crypt::check_plaintext("NET/Socket")?;
        let id = connection_id();
        let mut streams = Vec::with_capacity(shape.nsocks);
        for index in 0..shape.nsocks {
            let mut s = TcpStream::connect_timeout(&addr, SETUP_TIMEOUT)
                .map_err(|e| Error::system(format!("NET/Socket: connect to {addr}: {e}")))?;
            let mut hello = [0u8; HELLO_BYTES];
            hello[..8].copy_from_slice(&HANDLE_MAGIC.to_le_bytes());
            hello[8..16].copy_from_slice(&id.to_le_bytes());
            hello[16..20].copy_from_slice(&(index as u32).to_le_bytes());
            hello[20..24].copy_from_slice(&(shape.nsocks as u32).to_le_bytes());
            s.write_all(&hello)
                .map_err(sys("sending a connection's hello"))?;
            streams.push(s);
        }
        Ok(Some(self.add_comm(SockComm::new(
            streams,
            shape.nthreads,
            true,
        )?)))
    }

    fn accept(&self, listen: Comm) -> Result<Option<Comm>> {
        let l = self.listen_comm(listen)?;
        loop {
            match l.listener.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).map_err(sys("set_nonblocking"))?;
                    let (id, index, count) = read_hello(&mut s)?;
                    let mut arrived = l.arrived.lock();
                    let slots = arrived
                        .entry(id)
                        .or_insert_with(|| (0..count).map(|_| None).collect());
                    if slots.len() != count || slots[index].is_some() {
                        return Err(Error::system("NET/Socket: inconsistent connection hello"));
                    }
                    slots[index] = Some(s);
                    if slots.iter().all(Option::is_some) {
                        let streams = arrived.remove(&id).unwrap().into_iter().flatten().collect();
                        drop(arrived);
                        let comm = SockComm::new(streams, l.shape.nthreads, false)?;
                        return Ok(Some(self.add_comm(comm)));
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(sys("accept")(e)),
            }
        }
    }

    fn reg_mr(&self, comm: Comm, _data: *mut u8, _size: usize, mem: MemType) -> Result<MemHandle> {
        self.comm(comm)?;
        match mem {
            MemType::Host => Ok(MemHandle(0)),
            MemType::Cuda => Err(Error::invalid_usage(
                "NET/Socket: CUDA memory cannot be registered with the socket network",
            )),
        }
    }

    fn dereg_mr(&self, _comm: Comm, _mh: MemHandle) -> Result<()> {
        Ok(())
    }

    fn isend(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        _tag: i32,
        _mh: MemHandle,
    ) -> Result<Option<Request>> {
        self.post(comm, data, size, true)
    }

    fn irecv(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        _tag: i32,
        _mh: MemHandle,
    ) -> Result<Option<Request>> {
        self.post(comm, data, size, false)
    }

    fn iflush(
        &self,
        _comm: Comm,
        _data: *mut u8,
        _size: usize,
        _mh: MemHandle,
    ) -> Result<Option<Request>> {
        Ok(None)
    }

    fn test(&self, r: Request) -> Result<Option<usize>> {
        let req = self
            .objects
            .lock()
            .requests
            .get(&r.0)
            .cloned()
            .ok_or_else(|| Error::internal(format!("NET/Socket: no request {}", r.0)))?;
        // A request that is done returns at once; else the caller moves bytes too: with
        // helper threads it only helps (a small message then goes out without waiting for a
        // helper to wake up).
        if !req.is_done() {
            req.comm.progress_all();
            if let Some(e) = req.comm.error() {
                self.objects.lock().requests.remove(&r.0);
                return Err(e);
            }
            if !req.is_done() {
                return Ok(None);
            }
        }
        self.objects.lock().requests.remove(&r.0);
        Ok(Some(req.size.load(Ordering::Acquire)))
    }

    fn close_send(&self, comm: Comm) -> Result<()> {
        self.close_comm(comm)
    }

    fn close_recv(&self, comm: Comm) -> Result<()> {
        self.close_comm(comm)
    }

    fn close_listen(&self, comm: Comm) -> Result<()> {
        self.objects.lock().listens.remove(&comm.0);
        Ok(())
    }
}

/// A connection's id, unique enough among the connections one listener sees.
fn connection_id() -> u64 {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) as u64;
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (std::process::id() as u64) << 40 ^ n << 8 ^ t
}

/// The link speed of an interface in Mbit/s (`/sys/class/net/<if>/speed`), 10000 when unknown
/// (loopback), as NVIDIA's.
fn link_speed_mbps(ifname: &str) -> i32 {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(10000)
}

/// `NCCL_SOCKET_SNDBUF` / `NCCL_SOCKET_RCVBUF`: the kernel's buffers of a data socket, each
/// where set above 0 (otherwise the system's, as NVIDIA's leaves them).
fn set_buffer_sizes(s: &TcpStream) -> std::io::Result<()> {
    use crate::env::registry as reg;
    use std::os::fd::AsRawFd;
    for (param, option) in [
        (&reg::SOCKET_SNDBUF, libc::SO_SNDBUF),
        (&reg::SOCKET_RCVBUF, libc::SO_RCVBUF),
    ] {
        let Ok(bytes) = libc::c_int::try_from(param.int()) else {
            continue;
        };
        if bytes <= 0 {
            continue;
        }
        // SAFETY: a live socket of `s`; the option value is a c_int that outlives the call.
        let rc = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&bytes as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod buffer_tests {
    use super::*;

    fn option_of(s: &TcpStream, option: libc::c_int) -> libc::c_int {
        use std::os::fd::AsRawFd;
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: a live socket; v and len outlive the call and len says v's size.
        let rc = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        v
    }

    #[test]
    fn the_buffer_settings_reach_the_socket_and_unset_ones_leave_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let system = (
            option_of(&s, libc::SO_SNDBUF),
            option_of(&s, libc::SO_RCVBUF),
        );
        crate::env::tests::sources::with(&[], &[], || set_buffer_sizes(&s)).unwrap();
        assert_eq!(
            (
                option_of(&s, libc::SO_SNDBUF),
                option_of(&s, libc::SO_RCVBUF)
            ),
            system
        );
        let env = [
            ("NCCL_SOCKET_SNDBUF", "65536"),
            ("NCCL_SOCKET_RCVBUF", "98304"),
        ];
        crate::env::tests::sources::with(&env, &[], || set_buffer_sizes(&s)).unwrap();
        // Linux keeps twice the asked size (its bookkeeping overhead).
        assert_eq!(option_of(&s, libc::SO_SNDBUF), 2 * 65536);
        assert_eq!(option_of(&s, libc::SO_RCVBUF), 2 * 98304);
    }
}

#[cfg(test)]
mod shape_tests {
    use super::*;
    use crate::transport::net::tests::lo;

    #[test]
    fn automatic_shapes_by_nic_and_the_settings_over_them() {
        assert_eq!(auto_for_vendor(Some("0x1d0f")), (2, 8));
        assert_eq!(auto_for_vendor(Some("0x1ae0")), (4, 1));
        assert_eq!(auto_for_vendor(Some("0x15b3")), (2, 2));
        assert_eq!(auto_for_vendor(None), (2, 2));
        assert_eq!(
            auto_for_speed(None),
            (2, 2),
            "unknown speed: memory-to-memory"
        );
        assert_eq!(auto_for_speed(Some(100_000)), (2, 2));
        assert_eq!(auto_for_speed(Some(25_000)), (2, 2));
        assert_eq!(auto_for_speed(Some(10_000)), (1, 1));
        assert_eq!(auto_for_speed(Some(1_000)), (1, 1));
        // Loopback: no PCI device, so no speed unless OXCCL_NET_SPEEDS names it.
        assert_eq!(known_speed_mbps("lo"), None);
        let aws = (2, 8);
        assert_eq!(Shape::from_settings((AUTO, AUTO), aws), Shape::new(2, 8));
        assert_eq!(Shape::from_settings((0, AUTO), aws), Shape::new(0, 8));
        assert_eq!(Shape::from_settings((AUTO, 1), aws), Shape::new(2, 1));
        assert_eq!(Shape::from_settings((99, 99), (0, 1)), Shape::new(16, 64));
        assert_eq!(Shape::new(16, 64).nsocks, 64, "at most 64 sockets");
        assert_eq!(Shape::from_settings((-5, 0), (0, 1)), Shape::new(0, 1));
        // Loopback has no PCI device.
        assert_eq!(nic_vendor("lo"), None);
        assert_eq!(nic_vendor("../lo"), None);
    }

    #[test]
    fn one_chunk_messages_start_on_successive_sockets_with_their_headers() {
        // No helper threads: nothing moves until `test`, so the queues show the placement.
        let net = SocketNet::new(lo(), Shape::new(0, 4));
        let (h, l) = net.listen(0).unwrap();
        let sc = net.connect(0, &h).unwrap().unwrap();
        let mut bufs = vec![vec![7u8; 100]; 6];
        for b in &mut bufs {
            net.isend(sc, b.as_mut_ptr(), b.len(), 0, MemHandle(0))
                .unwrap();
        }
        let comm = net.comm(sc).unwrap();
        let queued: Vec<usize> = comm.socks.iter().map(|s| s.take_queue().len()).collect();
        // Messages 0..6 on sockets 0,1,2,3,0,1: a header and a chunk each.
        assert_eq!(queued, vec![4, 4, 2, 2]);
        let q = comm.socks[1].take_queue();
        assert!(matches!(q[0].kind, TaskKind::SendHeader));
        assert!(matches!(q[1].kind, TaskKind::Data { send: true, .. }));
        drop(q);
        net.close_listen(l).unwrap();
    }

    #[test]
    fn posting_and_moving_never_wait_for_a_socket_another_thread_is_serving() {
        let net = Arc::new(SocketNet::new(lo(), Shape::new(0, 1)));
        let (h, l) = net.listen(0).unwrap();
        let sc = net.connect(0, &h).unwrap().unwrap();
        let comm = net.comm(sc).unwrap();
        // A mover in the middle of a system call holds socket 0's queue.
        let serving = comm.socks[0].queue.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        let poster = {
            let net = net.clone();
            std::thread::spawn(move || {
                let mut buf = vec![3u8; 100];
                let r = net.isend(sc, buf.as_mut_ptr(), buf.len(), 0, MemHandle(0));
                // Another thread's progress leaves the socket to its mover.
                let moved = net.comm(sc).unwrap().progress(0);
                tx.send((r.is_ok(), moved)).unwrap();
                buf
            })
        };
        let (posted, moved) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a post or a progress waited for the thread serving the socket");
        assert!(posted && !moved);
        drop(serving);
        // The post is queued behind what the mover held: a header and a chunk.
        assert_eq!(comm.socks[0].take_queue().len(), 2);
        drop(poster.join().unwrap());
        net.close_listen(l).unwrap();
    }
}
