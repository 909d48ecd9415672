//! One-sided operations with peers on other hosts, over TCP: what `ncclPutSignal` and
//! `ncclSignal` do where the peer's window cannot be reached by load/store.
//!
//! Each communicator that registered a window has a listener; a sending rank keeps one
//! connection per remote peer, fed by one sender thread, so that operations to a peer arrive
//! in the order they were issued. A put is stream-ordered on the sending side: the user's
//! stream records an event and then waits on the GPU for a ticket; the sender thread waits for
//! the event, copies the source out of GPU memory, hands the ticket back (the stream goes on:
//! the source may be reused) and sends header and payload. The receiving side's thread hands
//! each operation to the communicator's `Deliver` (which writes the payload into the window
//! and then the signal counter, in that order). Errors are logged and stop that connection;
//! a waiter then waits until its communicator is aborted, which releases every wait.

use crate::cuda::{self, CUcontext, CUstream, Event, HostMapped};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::Duration;

/// What one operation carries besides its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The window, by its registration number on the communicator (every rank numbers alike).
    pub window: u64,
    pub offset: u64,
    pub bytes: u64,
    pub ctx: u32,
    pub sig: u32,
    /// The sending rank and the new value of its signal counter at the receiver.
    pub sender: u32,
    pub value: u64,
}

const HEADER_BYTES: usize = 8 * 4 + 4 * 3 + 4;
const MAGIC: u32 = 0x6f78_726d; // "oxrm"

impl Header {
    fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..12].copy_from_slice(&self.window.to_le_bytes());
        b[12..20].copy_from_slice(&self.offset.to_le_bytes());
        b[20..28].copy_from_slice(&self.bytes.to_le_bytes());
        b[28..32].copy_from_slice(&self.ctx.to_le_bytes());
        b[32..36].copy_from_slice(&self.sig.to_le_bytes());
        b[36..40].copy_from_slice(&self.sender.to_le_bytes());
        b[40..48].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    fn decode(b: &[u8; HEADER_BYTES]) -> Result<Header> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        if u32_at(0) != MAGIC {
            return Err(Error::system(
                "RMA/Socket: a message without the header magic",
            ));
        }
        Ok(Header {
            window: u64_at(4),
            offset: u64_at(12),
            bytes: u64_at(20),
            ctx: u32_at(28),
            sig: u32_at(32),
            sender: u32_at(36),
            value: u64_at(40),
        })
    }
}

/// Applies one arrived operation (payload, then signal) to this rank's memory.
pub type Deliver = Arc<dyn Fn(&Header, &[u8]) -> Result<()> + Send + Sync>;

/// A CUDA context handed to a thread.
#[derive(Clone, Copy)]
struct Ctx(usize);

impl Ctx {
    fn enter(self) -> Result<()> {
        cuda::set_current(self.0 as CUcontext)
    }
}

struct Request {
    addr: SocketAddr,
    ready: Event,
    src: u64,
    header: Header,
    ticket: u64,
}

/// The network side of a communicator's one-sided operations.
pub struct RmaSocket {
    addr: SocketAddr,
    sender: Mutex<Sender<Request>>,
    /// The ticket the sender thread has reached; user streams wait for theirs on the GPU.
    released: Arc<HostMapped>,
    next_ticket: Mutex<u64>,
    stop: Arc<AtomicBool>,
}

fn sys(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::system(format!("RMA/Socket: {what}: {e}"))
}

impl RmaSocket {
    /// Listen on `ip` (this rank's bootstrap address) and start the threads.
    pub fn start(ip: std::net::IpAddr, ctx: CUcontext, deliver: Deliver) -> Result<RmaSocket> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(sys("bind"))?;
        let addr = listener.local_addr().map_err(sys("local_addr"))?;
        listener
            .set_nonblocking(true)
            .map_err(sys("set_nonblocking"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let ctx = Ctx(ctx as usize);
        {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("oxccl-rma-accept".into())
                .spawn(move || accept_loop(listener, ctx, deliver, stop))
                .map_err(sys("spawn"))?;
        }
        let released = Arc::new(HostMapped::new(8)?);
        let (tx, rx) = channel::<Request>();
        {
            let released = released.clone();
            std::thread::Builder::new()
                .name("oxccl-rma-send".into())
                .spawn(move || send_loop(rx, ctx, released))
                .map_err(sys("spawn"))?;
        }
        Ok(RmaSocket {
            addr,
            sender: Mutex::new(tx),
            released,
            next_ticket: Mutex::new(0),
            stop,
        })
    }

    /// Where peers connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Send `header` (and `header.bytes` from `src`, read once `stream` reaches this point) to
    /// the rank listening at `addr`; `stream` continues once the source has been read.
    pub fn send(&self, addr: SocketAddr, src: u64, header: Header, stream: CUstream) -> Result<()> {
        if cuda::stream_is_capturing(stream)? {
            return Err(Error::invalid_usage(
                "one-sided operations with a peer on another host cannot be captured in a CUDA graph",
            ));
        }
        let ready = Event::new()?;
        ready.record(stream)?;
        let mut next = self.next_ticket.lock();
        let ticket = *next + 1;
        self.sender
            .lock()
            .send(Request {
                addr,
                ready,
                src,
                header,
                ticket,
            })
            .map_err(|_| Error::system("RMA/Socket: the sender thread has stopped"))?;
        cuda::wait_u64_geq(stream, self.released.dev(), ticket)?;
        *next = ticket;
        Ok(())
    }
}

impl Drop for RmaSocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

fn accept_loop(listener: TcpListener, ctx: Ctx, deliver: Deliver, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, from)) => {
                let deliver = deliver.clone();
                let stop = stop.clone();
                let _ = std::thread::Builder::new()
                    .name("oxccl-rma-recv".into())
                    .spawn(move || {
                        if let Err(e) = receive_loop(stream, ctx, &deliver, &stop) {
                            crate::warn!("RMA/Socket: connection from {from}: {}", e.msg);
                        }
                    });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                crate::warn!("RMA/Socket: accept: {e}");
                return;
            }
        }
    }
}

fn receive_loop(mut s: TcpStream, ctx: Ctx, deliver: &Deliver, stop: &AtomicBool) -> Result<()> {
    s.set_nonblocking(false).map_err(sys("set_nonblocking"))?;
    s.set_nodelay(true).map_err(sys("set_nodelay"))?;
    ctx.enter()?;
    let mut payload = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let mut h = [0u8; HEADER_BYTES];
        match s.read_exact(&mut h) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(sys("receive")(e)),
        }
        let header = Header::decode(&h)?;
        payload.resize(header.bytes as usize, 0);
        s.read_exact(&mut payload).map_err(sys("receive payload"))?;
        deliver(&header, &payload)?;
    }
    Ok(())
}

fn send_loop(rx: std::sync::mpsc::Receiver<Request>, ctx: Ctx, released: Arc<HostMapped>) {
    let mut conns: std::collections::HashMap<SocketAddr, TcpStream> = Default::default();
    if let Err(e) = ctx.enter() {
        crate::warn!("RMA/Socket: sender: {}", e.msg);
        return;
    }
    let mut payload = Vec::new();
    while let Ok(req) = rx.recv() {
        let outcome = (|| -> Result<()> {
            while !req.ready.done()? {
                std::thread::sleep(Duration::from_micros(20));
            }
            payload.resize(req.header.bytes as usize, 0);
            if !payload.is_empty() {
                cuda::read_device(&mut payload, req.src)?;
            }
            Ok(())
        })();
        // The source is read (or cannot be): the user's stream may go on either way.
        // SAFETY: `released` holds 8 bytes of host memory the GPU reads; this thread alone
        // writes it, and volatile keeps the store.
        unsafe { std::ptr::write_volatile(released.host() as *mut u64, req.ticket) };
        if let Err(e) = outcome.and_then(|()| {
            let conn = match conns.entry(req.addr) {
                std::collections::hash_map::Entry::Occupied(c) => c.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let s = TcpStream::connect_timeout(&req.addr, Duration::from_secs(30))
                        .map_err(sys("connect"))?;
                    s.set_nodelay(true).map_err(sys("set_nodelay"))?;
                    v.insert(s)
                }
            };
            conn.write_all(&req.header.encode()).map_err(sys("send"))?;
            conn.write_all(&payload).map_err(sys("send payload"))
        }) {
            crate::warn!("RMA/Socket: to {}: {}", req.addr, e.msg);
            conns.remove(&req.addr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = Header {
            window: 3,
            offset: 4096,
            bytes: 1 << 20,
            ctx: 1,
            sig: 2,
            sender: 5,
            value: 17,
        };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert!(Header::decode(&bad).is_err());
    }
}
