//! Setting up an IB connection, as NVIDIA's `net_ib` does: the receiver's listen handle
//! carries a TCP address (on the out-of-band interface); the sender connects there, makes its
//! QPs and FIFO and sends their description (QP numbers, LID, GID, MTU, FIFO address and key);
//! the receiver makes as many QPs, brings them to RTS against the sender's and answers with
//! its own; the sender brings its QPs to RTS and says it is ready. Both sides are
//! non-blocking state machines (connect and accept answer None until done); the TCP socket
//! stays open as the connection's side channel (`fifo::Conn::check_peer`).

use super::devices::Port;
use super::fifo::{Conn, Cts, DataPath, MAX_QPS, SLOTS};
use super::verbs::{self, Cq, Gid, Mr, Qp, QpAttr, QpCap};
use crate::error::{Error, Result};
use crate::transport::net::api::Handle;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

const HANDLE_MAGIC: u64 = 0x3154_454e_4249_584f; // "OXIBNET1"
const INFO_MAGIC: u64 = 0x314f_464e_4942_584f; // "OXBINFO1"
const INFO_BYTES: usize = 8 + 4 + 4 + 16 + 8 + 4 + 4 * MAX_QPS;
/// How long either side of a setup waits for the other.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(60);
const READY: u8 = 0x5a;

/// What the QP attributes take from the settings (`NCCL_IB_TC`, `_SL`, `_TIMEOUT`,
/// `_RETRY_CNT`, `_PKEY`).
#[derive(Clone, Copy, Debug)]
pub struct QpSettings {
    pub traffic_class: u8,
    pub service_level: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub pkey_index: u16,
}

/// The listener's address in a handle.
pub fn encode_handle(addr: SocketAddr) -> Handle {
    let mut h = Handle::default();
    h.0[..8].copy_from_slice(&HANDLE_MAGIC.to_le_bytes());
    h.0[8] = if addr.is_ipv4() { 4 } else { 6 };
    h.0[12..14].copy_from_slice(&addr.port().to_be_bytes());
    match addr {
        SocketAddr::V4(a) => h.0[16..20].copy_from_slice(&a.ip().octets()),
        SocketAddr::V6(a) => {
            h.0[16..32].copy_from_slice(&a.ip().octets());
            h.0[32..36].copy_from_slice(&a.scope_id().to_le_bytes());
        }
    }
    h
}

pub fn decode_handle(h: &Handle) -> Result<SocketAddr> {
    if h.0[..8] != HANDLE_MAGIC.to_le_bytes() {
        return Err(Error::internal(
            "NET/IB : malformed connection handle: not an IB handle",
        ));
    }
    let port = u16::from_be_bytes([h.0[12], h.0[13]]);
    match h.0[8] {
        4 => {
            let ip = Ipv4Addr::from(<[u8; 4]>::try_from(&h.0[16..20]).unwrap());
            Ok(SocketAddr::new(IpAddr::V4(ip), port))
        }
        6 => {
            let ip = Ipv6Addr::from(<[u8; 16]>::try_from(&h.0[16..32]).unwrap());
            let scope = u32::from_le_bytes(h.0[32..36].try_into().unwrap());
            Ok(SocketAddr::V6(std::net::SocketAddrV6::new(
                ip, port, 0, scope,
            )))
        }
        _ => Err(Error::internal(
            "NET/IB : malformed connection handle: unknown address family",
        )),
    }
}

/// One side's description of its end of a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Info {
    pub lid: u16,
    pub link_layer: u8,
    pub mtu: u8,
    pub gid: Gid,
    pub fifo_addr: u64,
    pub fifo_rkey: u32,
    /// The sender stripes each message over the QPs (the receiver follows it).
    pub split: bool,
    pub qpns: Vec<u32>,
}

impl Info {
    pub fn encode(&self) -> [u8; INFO_BYTES] {
        let mut b = [0u8; INFO_BYTES];
        b[..8].copy_from_slice(&INFO_MAGIC.to_le_bytes());
        b[8..10].copy_from_slice(&(self.qpns.len() as u16).to_le_bytes());
        b[10..12].copy_from_slice(&self.lid.to_le_bytes());
        b[12] = self.link_layer;
        b[13] = self.mtu;
        b[14] = self.split as u8;
        b[16..32].copy_from_slice(&self.gid);
        b[32..40].copy_from_slice(&self.fifo_addr.to_le_bytes());
        b[40..44].copy_from_slice(&self.fifo_rkey.to_le_bytes());
        for (i, q) in self.qpns.iter().enumerate() {
            b[44 + 4 * i..48 + 4 * i].copy_from_slice(&q.to_le_bytes());
        }
        b
    }

    pub fn decode(b: &[u8], peer: &str) -> Result<Info> {
        let bad = |why: &str| Error::remote(format!("NET/IB : peer {peer} sent {why}"));
        if b.len() != INFO_BYTES || b[..8] != INFO_MAGIC.to_le_bytes() {
            return Err(bad("a connection description that is not oxccl's"));
        }
        let n = u16::from_le_bytes([b[8], b[9]]) as usize;
        if n == 0 || n > MAX_QPS {
            return Err(bad(&format!("{n} queue pairs (1..{MAX_QPS})")));
        }
        Ok(Info {
            lid: u16::from_le_bytes([b[10], b[11]]),
            link_layer: b[12],
            mtu: b[13],
            gid: b[16..32].try_into().unwrap(),
            fifo_addr: u64::from_le_bytes(b[32..40].try_into().unwrap()),
            fifo_rkey: u32::from_le_bytes(b[40..44].try_into().unwrap()),
            split: b[14] != 0,
            qpns: (0..n)
                .map(|i| u32::from_le_bytes(b[44 + 4 * i..48 + 4 * i].try_into().unwrap()))
                .collect(),
        })
    }
}

/// A fixed-size message read piecewise from a non-blocking socket.
struct Inbox {
    buf: Vec<u8>,
    got: usize,
}

impl Inbox {
    fn new(n: usize) -> Inbox {
        Inbox {
            buf: vec![0; n],
            got: 0,
        }
    }

    /// Read what is there; true once the whole message is in.
    fn fill(&mut self, s: &mut TcpStream, peer: &str) -> Result<bool> {
        while self.got < self.buf.len() {
            match s.read(&mut self.buf[self.got..]) {
                Ok(0) => {
                    return Err(Error::remote(format!(
                        "NET/IB : peer {peer} closed the connection during its setup"
                    )))
                }
                Ok(n) => self.got += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(Error::remote(format!(
                        "NET/IB : connection setup with peer {peer} failed: {e}"
                    )))
                }
            }
        }
        Ok(true)
    }
}

fn sys(peer: &str, what: &str) -> impl Fn(std::io::Error) -> Error {
    let (peer, what) = (peer.to_string(), what.to_string());
    move |e| Error::system(format!("NET/IB : {what} (peer {peer}): {e}"))
}

/// Room on each QP: per message two writes on each QP and a CTS, `SLOTS` messages in flight.
fn qp_cap() -> QpCap {
    QpCap {
        max_send_wr: 4 * SLOTS as u32 + 64,
        max_recv_wr: SLOTS as u32 + 32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// A CQ and `nqps` QPs on `port`, in INIT.
fn make_qps(port: &Port, nqps: usize, qs: &QpSettings) -> Result<(Cq, Vec<Qp>)> {
    let cap = qp_cap();
    let cqe = (cap.max_send_wr + cap.max_recv_wr) as i32 * (nqps as i32 + 1);
    let cq = port.ctx.create_cq(cqe)?;
    let mut qps = Vec::with_capacity(nqps);
    for _ in 0..nqps {
        let qp = port.ctx.create_qp(&cq, cap)?;
        to_init(&qp, port, qs)?;
        qps.push(qp);
    }
    Ok((cq, qps))
}

fn to_init(qp: &Qp, port: &Port, qs: &QpSettings) -> Result<()> {
    let mut a = QpAttr {
        qp_state: verbs::QPS_INIT,
        pkey_index: qs.pkey_index,
        port_num: port.port,
        qp_access_flags: (verbs::ACCESS_REMOTE_WRITE | verbs::ACCESS_REMOTE_READ) as u32,
        ..QpAttr::default()
    };
    qp.modify(
        &mut a,
        verbs::QP_STATE | verbs::QP_PKEY_INDEX | verbs::QP_PORT | verbs::QP_ACCESS_FLAGS,
    )
}

/// Bring `qp` to RTR then RTS against the remote QP `remote_qpn` described by `remote`.
fn to_rts(qp: &Qp, port: &Port, remote: &Info, remote_qpn: u32, qs: &QpSettings) -> Result<()> {
    let mut a = QpAttr {
        qp_state: verbs::QPS_RTR,
        path_mtu: (port.attr.active_mtu as u8).min(remote.mtu) as u32,
        dest_qp_num: remote_qpn,
        rq_psn: 0,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ..QpAttr::default()
    };
    a.ah_attr.sl = qs.service_level;
    a.ah_attr.port_num = port.port;
    if remote.link_layer == verbs::LINK_LAYER_ETHERNET {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = remote.gid;
        a.ah_attr.grh.sgid_index = port.gid_index as u8;
        a.ah_attr.grh.hop_limit = 255;
        a.ah_attr.grh.traffic_class = qs.traffic_class;
    } else {
        a.ah_attr.dlid = remote.lid;
    }
    qp.modify(
        &mut a,
        verbs::QP_STATE
            | verbs::QP_AV
            | verbs::QP_PATH_MTU
            | verbs::QP_DEST_QPN
            | verbs::QP_RQ_PSN
            | verbs::QP_MAX_DEST_RD_ATOMIC
            | verbs::QP_MIN_RNR_TIMER,
    )?;
    let mut a = QpAttr {
        qp_state: verbs::QPS_RTS,
        timeout: qs.timeout,
        retry_cnt: qs.retry_cnt,
        rnr_retry: 7,
        sq_psn: 0,
        max_rd_atomic: 1,
        ..QpAttr::default()
    };
    qp.modify(
        &mut a,
        verbs::QP_STATE
            | verbs::QP_TIMEOUT
            | verbs::QP_RETRY_CNT
            | verbs::QP_RNR_RETRY
            | verbs::QP_SQ_PSN
            | verbs::QP_MAX_QP_RD_ATOMIC,
    )
}

fn local_info(port: &Port, qps: &[Qp], fifo: Option<(u64, u32)>, split: bool) -> Info {
    let (fifo_addr, fifo_rkey) = fifo.unwrap_or((0, 0));
    Info {
        lid: port.attr.lid,
        link_layer: port.attr.link_layer,
        mtu: port.attr.active_mtu as u8,
        gid: port.gid,
        fifo_addr,
        fifo_rkey,
        split,
        qpns: qps.iter().map(Qp::num).collect(),
    }
}

/// A FIFO of CTS entries and its registration.
fn new_fifo(port: &Port) -> Result<(Box<[Cts; SLOTS]>, Mr)> {
    let mut fifo = Box::new([Cts::default(); SLOTS]);
    let mr = port.ctx.reg_mr(
        fifo.as_mut_ptr() as *mut u8,
        std::mem::size_of::<[Cts; SLOTS]>(),
    )?;
    Ok((fifo, mr))
}

/// What a connection is made of before its last step.
struct Parts {
    cq: Cq,
    qps: Vec<Qp>,
    fifo: Box<[Cts; SLOTS]>,
    fifo_mr: Mr,
}

/// Everything a new connection takes from its network.
pub struct Site<'a> {
    pub port: &'a Port,
    pub port_down: Arc<AtomicBool>,
    pub qp: QpSettings,
    pub path: DataPath,
}

fn finish(site: &Site<'_>, parts: Parts, stream: TcpStream, peer: String) -> Conn {
    Conn {
        qps: parts.qps,
        flush_qp: None,
        cq: parts.cq,
        fifo: parts.fifo,
        fifo_mr: parts.fifo_mr,
        flush_buf: Box::new([0; 64]),
        flush_mr: None,
        remote_fifo: (0, 0),
        seq: 0,
        reqs: HashMap::new(),
        slots: [None; SLOTS],
        side_channel: stream,
        peer,
        device: format!("{}:{}", site.port.dev_name, site.port.port),
        port_down: site.port_down.clone(),
        path: site.path,
        error: None,
        peer_closed: false,
    }
}

/// A sender between its first `connect` call and its connection.
pub struct Connecting {
    stream: TcpStream,
    peer: String,
    parts: Parts,
    inbox: Inbox,
    since: Instant,
}

impl Connecting {
    /// Connect to the listener at `addr`, make `nqps` QPs and the FIFO, and describe them.
    pub fn start(site: &Site<'_>, addr: SocketAddr, nqps: usize) -> Result<Connecting> {
        let peer = addr.to_string();
        let mut stream =
            TcpStream::connect_timeout(&addr, SETUP_TIMEOUT).map_err(sys(&peer, "connect"))?;
        stream
            .set_nodelay(true)
            .map_err(sys(&peer, "set_nodelay"))?;
        let (cq, qps) = make_qps(site.port, nqps, &site.qp)?;
        let (mut fifo, fifo_mr) = new_fifo(site.port)?;
        let info = local_info(
            site.port,
            &qps,
            Some((fifo.as_mut_ptr() as u64, fifo_mr.rkey())),
            site.path.split,
        );
        stream
            .write_all(&info.encode())
            .map_err(sys(&peer, "sending the connection description"))?;
        stream
            .set_nonblocking(true)
            .map_err(sys(&peer, "set_nonblocking"))?;
        Ok(Connecting {
            stream,
            peer,
            parts: Parts {
                cq,
                qps,
                fifo,
                fifo_mr,
            },
            inbox: Inbox::new(INFO_BYTES),
            since: Instant::now(),
        })
    }

    /// Ok(Err(self)) while the receiver has not answered; the connection once it has.
    pub fn progress(mut self, site: &Site<'_>) -> Result<std::result::Result<Conn, Connecting>> {
        if !self.inbox.fill(&mut self.stream, &self.peer)? {
            if self.since.elapsed() > SETUP_TIMEOUT {
                return Err(Error::remote(format!(
                    "NET/IB : peer {} did not answer the connection setup within {} s",
                    self.peer,
                    SETUP_TIMEOUT.as_secs()
                )));
            }
            return Ok(Err(self));
        }
        let remote = Info::decode(&self.inbox.buf, &self.peer)?;
        if remote.qpns.len() != self.parts.qps.len() {
            return Err(Error::remote(format!(
                "NET/IB : peer {} answered with {} queue pairs for {}",
                self.peer,
                remote.qpns.len(),
                self.parts.qps.len()
            )));
        }
        for (qp, &rq) in self.parts.qps.iter().zip(&remote.qpns) {
            to_rts(qp, site.port, &remote, rq, &site.qp)?;
        }
        self.stream
            .set_nonblocking(false)
            .map_err(sys(&self.peer, "set_nonblocking"))?;
        self.stream
            .write_all(&[READY])
            .map_err(sys(&self.peer, "sending ready"))?;
        self.stream
            .set_nonblocking(true)
            .map_err(sys(&self.peer, "set_nonblocking"))?;
        Ok(Ok(finish(site, self.parts, self.stream, self.peer)))
    }
}

/// A listening comm and the one sender it is setting up with.
pub struct Listening {
    pub listener: TcpListener,
    pub dev: usize,
    stage: Option<AcceptStage>,
}

enum AcceptStage {
    /// The sender's description is coming.
    Described {
        stream: TcpStream,
        peer: String,
        inbox: Inbox,
        since: Instant,
    },
    /// Answered; its ready byte is coming.
    Answered {
        stream: TcpStream,
        peer: String,
        parts: Parts,
        remote_fifo: (u64, u32),
        split: bool,
        inbox: Inbox,
        since: Instant,
    },
}

impl Listening {
    pub fn new(listener: TcpListener, dev: usize) -> Listening {
        Listening {
            listener,
            dev,
            stage: None,
        }
    }

    /// One step of accepting: the connection once the sender is ready.
    pub fn progress(&mut self, site: &Site<'_>) -> Result<Option<Conn>> {
        if self.stage.is_none() {
            match self.listener.accept() {
                Ok((stream, addr)) => {
                    stream
                        .set_nonblocking(true)
                        .map_err(sys(&addr.to_string(), "set_nonblocking"))?;
                    let _ = stream.set_nodelay(true);
                    self.stage = Some(AcceptStage::Described {
                        stream,
                        peer: addr.to_string(),
                        inbox: Inbox::new(INFO_BYTES),
                        since: Instant::now(),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(None),
                Err(e) => return Err(Error::system(format!("NET/IB : accept: {e}"))),
            }
        }
        let stage = self.stage.take().expect("set above");
        let (next, done) = self.advance(stage, site)?;
        self.stage = next;
        Ok(done)
    }

    fn advance(
        &self,
        stage: AcceptStage,
        site: &Site<'_>,
    ) -> Result<(Option<AcceptStage>, Option<Conn>)> {
        match stage {
            AcceptStage::Described {
                mut stream,
                peer,
                mut inbox,
                since,
            } => {
                if !inbox.fill(&mut stream, &peer)? {
                    timed_out(since, &peer)?;
                    let s = AcceptStage::Described {
                        stream,
                        peer,
                        inbox,
                        since,
                    };
                    return Ok((Some(s), None));
                }
                let remote = Info::decode(&inbox.buf, &peer)?;
                let (cq, qps) = make_qps(site.port, remote.qpns.len(), &site.qp)?;
                for (qp, &rq) in qps.iter().zip(&remote.qpns) {
                    to_rts(qp, site.port, &remote, rq, &site.qp)?;
                }
                let (fifo, fifo_mr) = new_fifo(site.port)?;
                let info = local_info(site.port, &qps, None, remote.split);
                stream
                    .set_nonblocking(false)
                    .map_err(sys(&peer, "set_nonblocking"))?;
                stream
                    .write_all(&info.encode())
                    .map_err(sys(&peer, "answering the connection setup"))?;
                stream
                    .set_nonblocking(true)
                    .map_err(sys(&peer, "set_nonblocking"))?;
                let s = AcceptStage::Answered {
                    stream,
                    peer,
                    parts: Parts {
                        cq,
                        qps,
                        fifo,
                        fifo_mr,
                    },
                    remote_fifo: (remote.fifo_addr, remote.fifo_rkey),
                    split: remote.split,
                    inbox: Inbox::new(1),
                    since: Instant::now(),
                };
                self.advance(s, site)
            }
            AcceptStage::Answered {
                mut stream,
                peer,
                parts,
                remote_fifo,
                split,
                mut inbox,
                since,
            } => {
                if !inbox.fill(&mut stream, &peer)? {
                    timed_out(since, &peer)?;
                    let s = AcceptStage::Answered {
                        stream,
                        peer,
                        parts,
                        remote_fifo,
                        split,
                        inbox,
                        since,
                    };
                    return Ok((Some(s), None));
                }
                if inbox.buf[0] != READY {
                    return Err(Error::remote(format!(
                        "NET/IB : peer {peer} ended the connection setup with {:#x}",
                        inbox.buf[0]
                    )));
                }
                let mut conn = finish(site, parts, stream, peer);
                conn.remote_fifo = remote_fifo;
                conn.path.split = split;
                Ok((None, Some(conn)))
            }
        }
    }
}

fn timed_out(since: Instant, peer: &str) -> Result<()> {
    if since.elapsed() > SETUP_TIMEOUT {
        return Err(Error::remote(format!(
            "NET/IB : peer {peer} did not finish the connection setup within {} s",
            SETUP_TIMEOUT.as_secs()
        )));
    }
    Ok(())
}

/// A QP connected to itself on `port`, for flushes (RDMA reads of received data), with the
/// buffer its reads land in registered.
pub fn add_flush_qp(conn: &mut Conn, port: &Port, qs: &QpSettings) -> Result<()> {
    let qp = port.ctx.create_qp(&conn.cq, qp_cap())?;
    to_init(&qp, port, qs)?;
    let me = local_info(port, std::slice::from_ref(&qp), None, false);
    to_rts(&qp, port, &me, qp.num(), qs)?;
    let mr = port
        .ctx
        .reg_mr(conn.flush_buf.as_mut_ptr(), conn.flush_buf.len())?;
    conn.flush_qp = Some(qp);
    conn.flush_mr = Some(mr);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_and_descriptions_round_trip() {
        let a: SocketAddr = "127.0.0.1:4567".parse().unwrap();
        assert_eq!(decode_handle(&encode_handle(a)).unwrap(), a);
        let b: SocketAddr = "[fe80::1%3]:99".parse().unwrap();
        assert_eq!(decode_handle(&encode_handle(b)).unwrap(), b);
        let e = decode_handle(&Handle::default()).unwrap_err();
        assert!(e.msg.contains("not an IB handle"), "{}", e.msg);
        let info = Info {
            lid: 0x1234,
            link_layer: verbs::LINK_LAYER_ETHERNET,
            mtu: 5,
            gid: [7; 16],
            fifo_addr: 0xdead_beef_0000,
            fifo_rkey: 0x55,
            split: true,
            qpns: vec![0x401, 0x402, 0x403],
        };
        assert_eq!(Info::decode(&info.encode(), "p").unwrap(), info);
        let mut bad = info.encode();
        bad[8] = 0;
        let e = Info::decode(&bad, "10.0.0.2:5").unwrap_err();
        assert!(
            e.msg.contains("peer 10.0.0.2:5 sent 0 queue pairs"),
            "{}",
            e.msg
        );
    }
}
