//! The data path of one IB connection, NVIDIA's `net_ib` design re-derived. The sender holds
//! a FIFO of `SLOTS` clear-to-send entries in registered memory; each `irecv` of the receiver
//! fills the next entry (where to write, its key, how many bytes at most, the tag, and the
//! message's sequence number + 1, written last) and RDMA-writes it there. `isend` waits (None)
//! until the entry of its message has arrived, then RDMA-writes the data straight into the
//! receive buffer: on one QP (messages go round the QPs) or striped over all of them
//! (`NCCL_IB_SPLIT_DATA_ON_QPS`); the last write of each QP carries its byte count as
//! immediate data, or, above `NCCL_IB_AR_THRESHOLD` with adaptive routing, the data goes as
//! plain writes followed by a zero-byte write with immediate. The receiver posted one receive
//! per QP it expects an immediate on; its request is done once all of them and its own CTS
//! write completed, with the immediates' sum as the size.
//!
//! On a merged device (several ports of one NIC) the QP list spans the member ports: QP q is
//! on local member q mod (local members) and talks to remote member q mod (remote members),
//! so round-robin and striping spread messages over every member the same way they spread
//! them over QPs. Each member has its own registration of every buffer and of the FIFO: a
//! CTS entry carries the receive buffer's key of each member, and a piece posted on QP q
//! uses the keys of q's members.
//!
//! Every completion of a connection lands on its member's CQ and is matched to its request by
//! the work request id; a failed one becomes the connection's error, naming the peer, the
//! member port and the status in words. A dead peer is also seen on the TCP side channel kept from the
//! setup (end of stream without a goodbye), so a request whose peer is gone fails instead of
//! waiting forever; so does every request of a port that went down.

use super::devices::MAX_MEMBERS;
use super::verbs::{self, Cq, Mr, Qp, RecvWr, SendWr, Sge, Wc};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::Read;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Entries of a connection's FIFO: the most receives in flight (NVIDIA's
/// `NET_IB_MAX_REQUESTS`).
pub const SLOTS: usize = 32;
/// Most QPs per member port of one connection (`NCCL_IB_QPS_PER_CONNECTION`).
pub const MAX_QPS_PER_MEMBER: usize = 16;
/// Most QPs one connection uses.
pub const MAX_QPS: usize = MAX_QPS_PER_MEMBER * MAX_MEMBERS;
/// The byte a side writes on the side channel when it closes in order.
pub const GOODBYE: u8 = 0x6b;
/// Striped messages are cut at multiples of this.
const STRIPE_ALIGN: usize = 128;
/// `IBV_WC_RECV_RDMA_WITH_IMM`.
const WC_RECV_RDMA_WITH_IMM: u32 = 129;
/// `IBV_WC_WR_FLUSH_ERR`: a request flushed after its QP failed.
const WC_WR_FLUSH_ERR: u32 = 5;

/// A clear-to-send entry, as the receiver writes it into the sender's FIFO.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct Cts {
    pub addr: u64,
    /// The receive buffer's key on each member port of the receiver.
    pub rkeys: [u32; MAX_MEMBERS],
    pub tag: i32,
    pub _pad: u32,
    pub size: u64,
    /// The message's sequence number + 1; written last, so a reader seeing it sees the rest.
    pub idx: u64,
}

/// How a connection moves data: its settings from `NCCL_IB_*`.
#[derive(Clone, Copy, Debug)]
pub struct DataPath {
    pub split: bool,
    pub adaptive_routing: bool,
    pub ar_threshold: usize,
    /// CTS entries go as inline data (`NCCL_IB_USE_INLINE`).
    pub inline_cts: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Send,
    Recv,
    Flush,
}

/// A request in flight: done when no completion is pending.
pub struct Req {
    pub kind: Kind,
    pub pending: u32,
    pub bytes: usize,
    /// A receive's FIFO slot, freed when it is done.
    pub slot: Option<usize>,
}

/// A registered buffer as the data path uses it: its keys on each member port.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemKeys {
    pub lkeys: [u32; MAX_MEMBERS],
    pub rkeys: [u32; MAX_MEMBERS],
}

/// Where the peer's FIFO is, with its key on each of the peer's member ports.
#[derive(Clone, Copy, Debug, Default)]
pub struct RemoteFifo {
    pub addr: u64,
    pub rkeys: [u32; MAX_MEMBERS],
}

/// A QP's place on a merged device: its local member port and the peer's member it talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpRoute {
    pub local: usize,
    pub remote: usize,
}

/// The routes of `nqps` QPs between `local` and `remote` member ports: QP q on local member
/// q mod `local`, to remote member q mod `remote`.
pub fn qp_routes(nqps: usize, local: usize, remote: usize) -> Vec<QpRoute> {
    (0..nqps)
        .map(|q| QpRoute {
            local: q % local.max(1),
            remote: q % remote.max(1),
        })
        .collect()
}

/// One side of a connection (a sender or a receiver).
pub struct Conn {
    // Field order is drop order: the QPs go before their CQs.
    pub qps: Vec<Qp>,
    /// Per QP: its member ports, here and at the peer.
    pub routes: Vec<QpRoute>,
    /// On the first member port.
    pub flush_qp: Option<Qp>,
    /// One CQ per local member port.
    pub cqs: Vec<Cq>,
    /// The sender's FIFO (written by the peer), or the receiver's CTS entries it writes from.
    pub fifo: Box<[Cts; SLOTS]>,
    /// The FIFO registered on each member port.
    pub fifo_mrs: Vec<Mr>,
    /// One byte the flush reads land in (receivers with a flush QP).
    pub flush_buf: Box<[u8; 64]>,
    pub flush_mr: Option<Mr>,
    /// A receiver's view of its sender's FIFO.
    pub remote_fifo: RemoteFifo,
    pub seq: u64,
    pub reqs: HashMap<u64, Req>,
    /// A receiver's FIFO slots in use, by request.
    pub slots: [Option<u64>; SLOTS],
    pub side_channel: TcpStream,
    pub peer: String,
    /// The device as errors name it ("soft_0:1", merged "soft_0:1+soft_1:1").
    pub device: String,
    /// Each member port, as errors name it ("soft_1:1").
    pub members: Vec<String>,
    /// Per member port: it went down.
    pub port_down: Vec<Arc<AtomicBool>>,
    pub path: DataPath,
    pub error: Option<Error>,
    /// The peer said goodbye on the side channel.
    pub peer_closed: bool,
}

/// The words for a failed completion, naming the peer, the device and the status.
pub fn completion_error(peer: &str, device: &str, wc: &Wc, kind: Option<Kind>) -> Error {
    let what = match kind {
        Some(Kind::Send) => "send",
        Some(Kind::Recv) => "receive",
        Some(Kind::Flush) => "flush",
        None => "request",
    };
    Error::remote(format!(
        "NET/IB : Got completion from peer {peer} with status={}({}) on a {what} \
         (qp {:#x}, vendor err {}) on device {device}",
        verbs::wc_status_str(wc.status),
        wc.status,
        wc.qp_num,
        wc.vendor_err
    ))
}

/// The (QP index, offset, bytes) pieces of message `seq` of `size` bytes over `nqps` QPs.
pub fn pieces(seq: u64, size: usize, nqps: usize, split: bool) -> Vec<(usize, usize, usize)> {
    if !split || nqps == 1 {
        return vec![((seq % nqps as u64) as usize, 0, size)];
    }
    let chunk = size.div_ceil(nqps).next_multiple_of(STRIPE_ALIGN);
    (0..nqps)
        .map(|q| {
            let off = (q * chunk).min(size);
            (q, off, chunk.min(size - off))
        })
        .collect()
}

/// The QPs message `seq` arrives on (one immediate each).
fn receiving_qps(seq: u64, nqps: usize, split: bool) -> Vec<usize> {
    pieces(seq, 0, nqps, split)
        .into_iter()
        .map(|(q, _, _)| q)
        .collect()
}

impl Conn {
    /// The connection's error, if it failed: a completion, the port, or the peer.
    fn check(&mut self) -> Result<()> {
        let down = self
            .port_down
            .iter()
            .position(|d| d.load(Ordering::Acquire));
        if let (None, Some(m)) = (&self.error, down) {
            self.error = Some(Error::remote(format!(
                "NET/IB : port {} is down (async event: port error); connection with peer {} \
                 failed",
                self.members[m], self.peer
            )));
        }
        match &self.error {
            Some(e) => Err(Error::new(e.code, e.msg.clone())),
            None => Ok(()),
        }
    }

    /// Whether the peer is still there; an error naming it once it left (or died).
    fn check_peer(&mut self) -> Result<()> {
        let mut b = [0u8; 16];
        loop {
            match (&self.side_channel).read(&mut b) {
                Ok(0) => {
                    let why = if self.peer_closed {
                        "closed the connection while a request was in flight"
                    } else {
                        "closed the connection without a goodbye (its process exited or was \
                         killed)"
                    };
                    self.error = Some(Error::remote(format!(
                        "NET/IB : peer {} {why}; device {}",
                        self.peer, self.device
                    )));
                    return self.check();
                }
                Ok(n) => {
                    self.peer_closed |= b[..n].contains(&GOODBYE);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.error = Some(Error::remote(format!(
                        "NET/IB : side channel to peer {} failed: {e}; device {}",
                        self.peer, self.device
                    )));
                    return self.check();
                }
            }
        }
    }

    /// Take what completed from the CQ and account it to its requests.
    pub fn poll(&mut self) -> Result<()> {
        let mut wcs = [Wc::default(); 16];
        for c in 0..self.cqs.len() {
            loop {
                let n = self.cqs[c].poll(&mut wcs)?;
                for wc in &wcs[..n] {
                    self.complete(wc);
                }
                if n < wcs.len() {
                    break;
                }
            }
        }
        Ok(())
    }

    /// The member port of the QP numbered `qp_num` (the flush QP's is the first).
    fn member_of(&self, qp_num: u32) -> &str {
        let m = self
            .qps
            .iter()
            .position(|q| q.num() == qp_num)
            .map_or(0, |q| self.routes[q].local);
        &self.members[m]
    }

    fn complete(&mut self, wc: &Wc) {
        let req = self.reqs.get_mut(&wc.wr_id);
        if wc.status != 0 {
            let kind = req.map(|r| r.kind);
            // The first real failure names the cause: a flush only stands until one comes.
            let replace = match &self.error {
                None => true,
                Some(e) => e.msg.contains("Flushed") && wc.status != WC_WR_FLUSH_ERR,
            };
            if replace {
                let member = self.member_of(wc.qp_num).to_string();
                self.error = Some(completion_error(&self.peer, &member, wc, kind));
            }
            return;
        }
        let Some(req) = req else { return };
        req.pending = req.pending.saturating_sub(1);
        if wc.opcode == WC_RECV_RDMA_WITH_IMM && wc.wc_flags & verbs::WC_WITH_IMM != 0 {
            req.bytes += u32::from_be(wc.imm_data) as usize;
        }
    }

    /// Start sending `size` bytes at `data` (keys `mem`); None until the receiver's CTS for
    /// this message is in.
    pub fn isend(
        &mut self,
        id: u64,
        data: *mut u8,
        size: usize,
        tag: i32,
        mem: &MemKeys,
    ) -> Result<Option<()>> {
        self.check()?;
        let slot = (self.seq % SLOTS as u64) as usize;
        let entry = &self.fifo[slot] as *const Cts;
        // SAFETY: the entry is in this connection's FIFO, which the peer's NIC writes; read
        // volatile, the index first, the rest after an acquire fence.
        let idx = unsafe { std::ptr::read_volatile(&(*entry).idx) };
        if idx != self.seq + 1 {
            self.check_peer()?;
            return Ok(None);
        }
        std::sync::atomic::fence(Ordering::Acquire);
        // SAFETY: as above; the entry is complete once its index is there.
        let cts = unsafe { std::ptr::read_volatile(entry) };
        if cts.tag != tag {
            return Err(Error::internal(format!(
                "NET/IB : message {} to peer {} has tag {tag} but the receive posted for it \
                 has tag {}",
                self.seq, self.peer, cts.tag
            )));
        }
        if size as u64 > cts.size {
            return Err(Error::invalid_usage(format!(
                "NET/IB : message {} of {size} bytes to peer {} is larger than the receive of \
                 {} bytes posted for it",
                self.seq, self.peer, cts.size
            )));
        }
        let pieces = pieces(self.seq, size, self.qps.len(), self.path.split);
        for &(q, off, len) in &pieces {
            let route = self.routes[q];
            self.post_piece(
                q,
                id,
                data as u64 + off as u64,
                len,
                cts.addr + off as u64,
                cts.rkeys[route.remote],
                mem.lkeys[route.local],
            )?;
        }
        self.reqs.insert(
            id,
            Req {
                kind: Kind::Send,
                pending: pieces.len() as u32,
                bytes: size,
                slot: None,
            },
        );
        self.seq += 1;
        Ok(Some(()))
    }

    /// Post one QP's share of a message: its data and the immediate carrying its size.
    #[allow(clippy::too_many_arguments)]
    fn post_piece(
        &self,
        q: usize,
        id: u64,
        local: u64,
        len: usize,
        remote: u64,
        rkey: u32,
        lkey: u32,
    ) -> Result<()> {
        let mut sge = Sge {
            addr: local,
            length: len as u32,
            lkey,
        };
        let imm = (len as u32).to_be();
        let separate = self.path.adaptive_routing && len > self.path.ar_threshold;
        let mut last = SendWr {
            wr_id: id,
            opcode: verbs::WR_RDMA_WRITE_WITH_IMM,
            send_flags: verbs::SEND_SIGNALED,
            imm_data: imm,
            remote_addr: remote,
            rkey,
            ..SendWr::default()
        };
        if !separate && len > 0 {
            last.sg_list = &mut sge;
            last.num_sge = 1;
        }
        if separate {
            let mut data = SendWr {
                wr_id: id,
                opcode: verbs::WR_RDMA_WRITE,
                sg_list: &mut sge,
                num_sge: 1,
                remote_addr: remote,
                rkey,
                next: &mut last,
                ..SendWr::default()
            };
            return self.qps[q].post_send(&mut data);
        }
        self.qps[q].post_send(&mut last)
    }

    /// Start receiving at most `size` bytes into `data` (keys `mem`); None while `SLOTS`
    /// receives are in flight.
    pub fn irecv(
        &mut self,
        id: u64,
        data: *mut u8,
        size: usize,
        tag: i32,
        mem: &MemKeys,
    ) -> Result<Option<()>> {
        self.check()?;
        let slot = (self.seq % SLOTS as u64) as usize;
        if self.slots[slot].is_some() {
            return Ok(None);
        }
        let expected = receiving_qps(self.seq, self.qps.len(), self.path.split);
        for &q in &expected {
            let mut wr = RecvWr {
                wr_id: id,
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: 0,
            };
            self.qps[q].post_recv(&mut wr)?;
        }
        self.fifo[slot] = Cts {
            addr: data as u64,
            rkeys: mem.rkeys,
            tag,
            _pad: 0,
            size: size as u64,
            idx: self.seq + 1,
        };
        let route = self.routes[expected[0]];
        let mut sge = Sge {
            addr: &self.fifo[slot] as *const Cts as u64,
            length: std::mem::size_of::<Cts>() as u32,
            lkey: self.fifo_mrs[route.local].lkey(),
        };
        let (fifo_addr, fifo_rkey) = (self.remote_fifo.addr, self.remote_fifo.rkeys[route.remote]);
        let inline = if self.path.inline_cts {
            verbs::SEND_INLINE
        } else {
            0
        };
        let mut wr = SendWr {
            wr_id: id,
            opcode: verbs::WR_RDMA_WRITE,
            send_flags: verbs::SEND_SIGNALED | inline,
            sg_list: &mut sge,
            num_sge: 1,
            remote_addr: fifo_addr + (slot * std::mem::size_of::<Cts>()) as u64,
            rkey: fifo_rkey,
            ..SendWr::default()
        };
        self.qps[expected[0]].post_send(&mut wr)?;
        self.reqs.insert(
            id,
            Req {
                kind: Kind::Recv,
                pending: expected.len() as u32 + 1,
                bytes: 0,
                slot: Some(slot),
            },
        );
        self.slots[slot] = Some(id);
        self.seq += 1;
        Ok(Some(()))
    }

    /// Make received data at `data` visible: an RDMA read of it on the loopback QP.
    pub fn iflush(&mut self, id: u64, data: *mut u8, rkey: u32) -> Result<Option<()>> {
        self.check()?;
        let (Some(qp), Some(mr)) = (&self.flush_qp, &self.flush_mr) else {
            return Ok(None);
        };
        let mut sge = Sge {
            addr: self.flush_buf.as_ptr() as u64,
            length: 1,
            lkey: mr.lkey(),
        };
        let mut wr = SendWr {
            wr_id: id,
            opcode: verbs::WR_RDMA_READ,
            send_flags: verbs::SEND_SIGNALED,
            sg_list: &mut sge,
            num_sge: 1,
            remote_addr: data as u64,
            rkey,
            ..SendWr::default()
        };
        qp.post_send(&mut wr)?;
        self.reqs.insert(
            id,
            Req {
                kind: Kind::Flush,
                pending: 1,
                bytes: 0,
                slot: None,
            },
        );
        Ok(Some(()))
    }

    /// Whether request `id` is done: its bytes, after which it is gone.
    pub fn test(&mut self, id: u64) -> Result<Option<usize>> {
        self.poll()?;
        let done = match self.reqs.get(&id) {
            None => {
                return Err(Error::internal(format!(
                    "NET/IB : no request {id} on the connection with peer {}",
                    self.peer
                )))
            }
            Some(r) => r.pending == 0,
        };
        if !done {
            if let Err(e) = self.check().and_then(|_| self.check_peer()) {
                self.forget(id);
                return Err(e);
            }
            return Ok(None);
        }
        let r = self.forget(id).expect("present above");
        Ok(Some(r.bytes))
    }

    fn forget(&mut self, id: u64) -> Option<Req> {
        let r = self.reqs.remove(&id)?;
        if let Some(s) = r.slot {
            self.slots[s] = None;
        }
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_go_round_the_qps_or_are_striped_over_them() {
        assert_eq!(pieces(5, 1000, 1, false), vec![(0, 0, 1000)]);
        assert_eq!(pieces(5, 1000, 4, false), vec![(1, 0, 1000)]);
        assert_eq!(pieces(0, 0, 4, false), vec![(0, 0, 0)]);
        // Striped: 128-byte aligned pieces, empty ones at the end still carry an immediate.
        assert_eq!(
            pieces(0, 1000, 4, true),
            vec![(0, 0, 256), (1, 256, 256), (2, 512, 256), (3, 768, 232)]
        );
        assert_eq!(
            pieces(0, 100, 4, true),
            vec![(0, 0, 100), (1, 100, 0), (2, 100, 0), (3, 100, 0)]
        );
        assert_eq!(pieces(0, 0, 2, true), vec![(0, 0, 0), (1, 0, 0)]);
        assert_eq!(receiving_qps(6, 4, false), vec![2]);
        assert_eq!(receiving_qps(6, 4, true), vec![0, 1, 2, 3]);
        let total: usize = pieces(3, 64 << 20, 4, true).iter().map(|p| p.2).sum();
        assert_eq!(total, 64 << 20);
    }

    #[test]
    fn qps_span_the_member_ports_of_both_ends() {
        let r = |l, m| QpRoute {
            local: l,
            remote: m,
        };
        assert_eq!(qp_routes(2, 1, 1), vec![r(0, 0), r(0, 0)]);
        assert_eq!(qp_routes(4, 2, 2), vec![r(0, 0), r(1, 1), r(0, 0), r(1, 1)]);
        // Two members talking to one: both local members reach the peer's only port.
        assert_eq!(qp_routes(2, 2, 1), vec![r(0, 0), r(1, 0)]);
        assert_eq!(qp_routes(2, 1, 2), vec![r(0, 0), r(0, 1)]);
        // The CTS entry (with a key per member) keeps its index last and is 64 bytes.
        assert_eq!(std::mem::size_of::<Cts>(), 64);
        assert_eq!(std::mem::offset_of!(Cts, idx), 56);
    }

    #[test]
    fn failed_completions_are_told_in_words() {
        let wc = Wc {
            status: 12,
            qp_num: 0x401,
            ..Wc::default()
        };
        let e = completion_error("127.0.0.1:4000", "soft_0:1", &wc, Some(Kind::Send));
        assert!(
            e.msg.contains("transport retry counter exceeded(12)"),
            "{}",
            e.msg
        );
        assert!(e.msg.contains("peer 127.0.0.1:4000") && e.msg.contains("soft_0:1"));
        assert_eq!(verbs::wc_status_str(10), "remote access error");
        assert_eq!(verbs::wc_status_str(99), "unknown");
    }
}
