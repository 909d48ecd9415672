//! Setting up an IB connection, as NVIDIA's `net_ib` does: the receiver's listen handle
//! carries a TCP address (on the out-of-band interface); the sender connects there, makes its
//! QPs and FIFO and sends their description (QP numbers, LID, GID, MTU, FIFO address and key);
//! the receiver makes as many QPs, brings them to RTS against the sender's and answers with
//! its own; the sender brings its QPs to RTS and says it is ready. Both sides are
//! non-blocking state machines (connect and accept answer None until done); the TCP socket
//! stays open as the connection's side channel (`fifo::Conn::check_peer`).
//!
//! The receiver's QPs take the sender's traffic class and service level (on RoCE the traffic
//! class `NCCL_IB_FIFO_TC` where set: they carry only clear-to-send writes), as NVIDIA's. With
//! `NCCL_IB_ECE_ENABLE` the sender offers each QP's ECE options, the receiver sets them on its
//! QP and answers with what it accepted, which the sender sets before RTR.
//!
//! A merged device describes each member port (LID, GID, MTU, its key of the FIFO). As
//! NVIDIA's, ends of different shapes connect: the listen handle says how many member ports
//! the receiver has, the sender makes `NCCL_IB_QPS_PER_CONNECTION` QPs for each member port
//! of the larger end, and QP q joins local member q mod (local members) to remote member
//! q mod (remote members) on both sides (`fifo::qp_routes`). Member ports of different link
//! layers at the two ends are an error naming the peer.

use super::devices::{flid_of, ib_subnet_of, Port, MAX_MEMBERS};
use super::fifo::{qp_routes, Conn, Cts, DataPath, QpRoute, RemoteFifo, MAX_QPS, SLOTS};
use super::verbs::{self, Cq, Ece, Gid, Mr, Qp, QpAttr, QpCap};
use crate::error::{Error, Result};
use crate::transport::net::api::Handle;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

const HANDLE_MAGIC: u64 = 0x3154_454e_4249_584f; // "OXIBNET1"
const INFO_MAGIC: u64 = 0x334f_464e_4942_584f; // "OXBINFO3"
/// Bytes of the device name a description carries.
const NAME_BYTES: usize = 128;
const MEMBERS_AT: usize = 24 + NAME_BYTES;
const MEMBER_BYTES: usize = 24;
const QPNS_AT: usize = MEMBERS_AT + MEMBER_BYTES * MAX_MEMBERS;
const ECES_AT: usize = QPNS_AT + 4 * MAX_QPS;
/// Per QP: whether ECE is offered or accepted, then `struct ibv_ece`.
const ECE_BYTES: usize = 16;
const INFO_BYTES: usize = ECES_AT + ECE_BYTES * MAX_QPS;
/// How long either side of a setup waits for the other.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(60);
const READY: u8 = 0x5a;

/// What the QP attributes take from the settings (`NCCL_IB_TC`, `_SL`, `_TIMEOUT`,
/// `_RETRY_CNT`, `_PKEY`, `_FIFO_TC`, `_ECE_ENABLE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpSettings {
    pub traffic_class: u8,
    pub service_level: u8,
    /// `NCCL_IB_TC` / `NCCL_IB_SL` were set: a communicator's traffic class does not change
    /// them.
    pub traffic_class_set: bool,
    pub service_level_set: bool,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub pkey_index: u16,
    /// The RoCE traffic class of the receiver's QPs; None: the sender's.
    pub fifo_traffic_class: Option<u8>,
    /// Offer the QPs' ECE options to the receiver.
    pub ece: bool,
    /// `NCCL_IB_MQP_RETRY_*`: failed QP transitions tried again.
    pub modify_retry: verbs::ModifyRetry,
}

impl QpSettings {
    /// The settings of a communicator whose `ncclConfig_t.trafficClass` is `class`, as
    /// NVIDIA's: it is the traffic class and the service level where `NCCL_IB_TC` and
    /// `NCCL_IB_SL` are unset (the service level only where it is one, below 16).
    pub fn with_traffic_class(self, class: i32) -> QpSettings {
        let mut q = self;
        if let (false, Ok(tc)) = (q.traffic_class_set, u8::try_from(class)) {
            q.traffic_class = tc;
        }
        if !q.service_level_set && (0..16).contains(&class) {
            q.service_level = class as u8;
        }
        q
    }
}

/// The listener's address in a handle, with how many member ports its device has (the
/// sender makes QPs for the larger of both ends).
pub fn encode_handle(addr: SocketAddr, members: usize) -> Handle {
    let mut h = Handle::default();
    h.0[..8].copy_from_slice(&HANDLE_MAGIC.to_le_bytes());
    h.0[8] = if addr.is_ipv4() { 4 } else { 6 };
    h.0[9] = members as u8;
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

/// The listener's address and its device's member port count.
pub fn decode_handle(h: &Handle) -> Result<(SocketAddr, usize)> {
    if h.0[..8] != HANDLE_MAGIC.to_le_bytes() {
        return Err(Error::internal(
            "NET/IB : malformed connection handle: not an IB handle",
        ));
    }
    let members = h.0[9] as usize;
    if members == 0 || members > MAX_MEMBERS {
        return Err(Error::internal(format!(
            "NET/IB : malformed connection handle: {members} member ports (1..{MAX_MEMBERS})"
        )));
    }
    let port = u16::from_be_bytes([h.0[12], h.0[13]]);
    let addr = match h.0[8] {
        4 => {
            let ip = Ipv4Addr::from(<[u8; 4]>::try_from(&h.0[16..20]).unwrap());
            SocketAddr::new(IpAddr::V4(ip), port)
        }
        6 => {
            let ip = Ipv6Addr::from(<[u8; 16]>::try_from(&h.0[16..32]).unwrap());
            let scope = u32::from_le_bytes(h.0[32..36].try_into().unwrap());
            SocketAddr::V6(std::net::SocketAddrV6::new(ip, port, 0, scope))
        }
        _ => {
            return Err(Error::internal(
                "NET/IB : malformed connection handle: unknown address family",
            ))
        }
    };
    Ok((addr, members))
}

/// How one member port of a side is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    pub lid: u16,
    pub link_layer: u8,
    pub mtu: u8,
    pub gid: Gid,
    /// The side's FIFO registered on this port.
    pub fifo_rkey: u32,
}

/// One side's description of its end of a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Info {
    /// The device's name ("mlx5_0+mlx5_1"), for messages.
    pub name: String,
    pub fifo_addr: u64,
    /// The sender stripes each message over the QPs (the receiver follows it).
    pub split: bool,
    /// The side's traffic class and service level (the receiver takes the sender's).
    pub traffic_class: u8,
    pub service_level: u8,
    /// The device's member ports (one unless merged).
    pub members: Vec<MemberInfo>,
    pub qpns: Vec<u32>,
    /// Per QP: the sender's ECE offer, the receiver's accepted options; None: no ECE.
    pub eces: Vec<Option<Ece>>,
}

impl Info {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; INFO_BYTES];
        b[..8].copy_from_slice(&INFO_MAGIC.to_le_bytes());
        b[8..10].copy_from_slice(&(self.qpns.len() as u16).to_le_bytes());
        b[10] = self.members.len() as u8;
        b[11] = self.split as u8;
        b[12] = self.traffic_class;
        b[13] = self.service_level;
        b[16..24].copy_from_slice(&self.fifo_addr.to_le_bytes());
        let name = &self.name.as_bytes()[..self.name.len().min(NAME_BYTES - 1)];
        b[24..24 + name.len()].copy_from_slice(name);
        for (i, m) in self.members.iter().enumerate() {
            let at = MEMBERS_AT + MEMBER_BYTES * i;
            b[at..at + 2].copy_from_slice(&m.lid.to_le_bytes());
            b[at + 2] = m.link_layer;
            b[at + 3] = m.mtu;
            b[at + 4..at + 20].copy_from_slice(&m.gid);
            b[at + 20..at + 24].copy_from_slice(&m.fifo_rkey.to_le_bytes());
        }
        for (i, q) in self.qpns.iter().enumerate() {
            b[QPNS_AT + 4 * i..QPNS_AT + 4 * i + 4].copy_from_slice(&q.to_le_bytes());
        }
        for (i, e) in self.eces.iter().enumerate() {
            let Some(e) = e else { continue };
            let at = ECES_AT + ECE_BYTES * i;
            for (k, v) in [1, e.vendor_id, e.options, e.comp_mask]
                .into_iter()
                .enumerate()
            {
                b[at + 4 * k..at + 4 * k + 4].copy_from_slice(&v.to_le_bytes());
            }
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
        let members = b[10] as usize;
        if members == 0 || members > MAX_MEMBERS {
            return Err(bad(&format!("{members} member ports (1..{MAX_MEMBERS})")));
        }
        let name = &b[24..24 + NAME_BYTES];
        let name_len = name.iter().position(|&c| c == 0).unwrap_or(NAME_BYTES);
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        Ok(Info {
            name: String::from_utf8_lossy(&name[..name_len]).into_owned(),
            fifo_addr: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            split: b[11] != 0,
            traffic_class: b[12],
            service_level: b[13],
            members: (0..members)
                .map(|i| {
                    let at = MEMBERS_AT + MEMBER_BYTES * i;
                    MemberInfo {
                        lid: u16::from_le_bytes([b[at], b[at + 1]]),
                        link_layer: b[at + 2],
                        mtu: b[at + 3],
                        gid: b[at + 4..at + 20].try_into().unwrap(),
                        fifo_rkey: u32_at(at + 20),
                    }
                })
                .collect(),
            qpns: (0..n).map(|i| u32_at(QPNS_AT + 4 * i)).collect(),
            eces: (0..n)
                .map(|i| {
                    let at = ECES_AT + ECE_BYTES * i;
                    (u32_at(at) != 0).then(|| Ece {
                        vendor_id: u32_at(at + 4),
                        options: u32_at(at + 8),
                        comp_mask: u32_at(at + 12),
                    })
                })
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

/// Room on each QP: per message two writes on each QP and a CTS, `SLOTS` messages in flight;
/// a CTS entry inline where they are posted inline.
fn qp_cap(inline_cts: bool) -> QpCap {
    QpCap {
        max_send_wr: 4 * SLOTS as u32 + 64,
        max_recv_wr: SLOTS as u32 + 32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: if inline_cts {
            std::mem::size_of::<Cts>() as u32
        } else {
            0
        },
    }
}

/// One CQ per member port of `site` and a QP per route on its local member, in INIT.
fn make_qps(site: &Site<'_>, routes: &[QpRoute]) -> Result<(Vec<Cq>, Vec<Qp>)> {
    let cap = qp_cap(site.path.inline_cts);
    let mut cqs = Vec::with_capacity(site.ports.len());
    for (m, port) in site.ports.iter().enumerate() {
        let on_member = routes.iter().filter(|r| r.local == m).count();
        let cqe = (cap.max_send_wr + cap.max_recv_wr) as i32 * (on_member as i32 + 1);
        cqs.push(port.ctx.create_cq(cqe)?);
    }
    let mut qps = Vec::with_capacity(routes.len());
    for r in routes {
        let port = site.ports[r.local];
        let qp = port.ctx.create_qp(&cqs[r.local], cap)?;
        to_init(&qp, port, &site.qp)?;
        qps.push(qp);
    }
    Ok((cqs, qps))
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
        &qs.modify_retry,
    )
}

/// How a QP addresses its packets: traffic class (RoCE) and service level.
#[derive(Clone, Copy, Debug)]
struct Marking {
    traffic_class: u8,
    service_level: u8,
}

impl Marking {
    fn own(qs: &QpSettings) -> Marking {
        Marking {
            traffic_class: qs.traffic_class,
            service_level: qs.service_level,
        }
    }

    /// The receiver's: the sender's, with `NCCL_IB_FIFO_TC` on RoCE where set.
    fn receiver(qs: &QpSettings, sender: &Info, roce: bool) -> Marking {
        Marking {
            traffic_class: match qs.fifo_traffic_class {
                Some(tc) if roce => tc,
                _ => sender.traffic_class,
            },
            service_level: sender.service_level,
        }
    }
}

/// How a QP on an InfiniBand port reaches the remote port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IbRoute {
    dlid: u16,
    /// With a global route header (`is_global`, the remote GID).
    global: bool,
}

/// NVIDIA's rule: within one subnet (the low 16 bits of the GIDs' subnet prefixes agree) by
/// LID, with a GRH only where the port requires one; across subnets globally, to the remote
/// port's routable FLID (its LID, with a WARN, where its GID carries none).
fn ib_route(local_gid: &Gid, remote: &MemberInfo, grh_required: bool) -> IbRoute {
    let same_subnet = ib_subnet_of(local_gid) == ib_subnet_of(&remote.gid);
    let dlid = match (same_subnet, flid_of(&remote.gid)) {
        (true, _) => remote.lid,
        (false, 0) => {
            crate::warn!(
                "NET/IB : remote FLID configured as zero even when endpoints are on different \
                 subnets, using dlid {} as fallback",
                remote.lid
            );
            remote.lid
        }
        (false, flid) => flid,
    };
    IbRoute {
        dlid,
        global: !same_subnet || grh_required,
    }
}

/// Bring `qp` to RTR then RTS against the remote QP `remote_qpn` on the port `remote`.
fn to_rts(
    qp: &Qp,
    port: &Port,
    remote: &MemberInfo,
    remote_qpn: u32,
    qs: &QpSettings,
    mark: Marking,
) -> Result<()> {
    let mut a = QpAttr {
        qp_state: verbs::QPS_RTR,
        path_mtu: (port.attr.active_mtu as u8).min(remote.mtu) as u32,
        dest_qp_num: remote_qpn,
        rq_psn: 0,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ..QpAttr::default()
    };
    a.ah_attr.sl = mark.service_level;
    a.ah_attr.port_num = port.port;
    if remote.link_layer == verbs::LINK_LAYER_ETHERNET {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = remote.gid;
        a.ah_attr.grh.sgid_index = port.gid_index as u8;
        a.ah_attr.grh.hop_limit = 255;
        a.ah_attr.grh.traffic_class = mark.traffic_class;
    } else {
        let route = ib_route(
            &port.gid,
            remote,
            port.attr.flags & verbs::QPF_GRH_REQUIRED != 0,
        );
        a.ah_attr.dlid = route.dlid;
        if route.global {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = remote.gid;
            a.ah_attr.grh.sgid_index = port.gid_index as u8;
            a.ah_attr.grh.hop_limit = 255;
        }
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
        &qs.modify_retry,
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
        &qs.modify_retry,
    )
}

/// How `port` is reached, with the FIFO's key on it.
fn member_info(port: &Port, fifo_rkey: u32) -> MemberInfo {
    MemberInfo {
        lid: port.attr.lid,
        link_layer: port.attr.link_layer,
        mtu: port.attr.active_mtu as u8,
        gid: port.gid,
        fifo_rkey,
    }
}

/// This side's description: its member ports, QPs and FIFO (`fifo_addr` 0: not for the peer),
/// with the ECE options of each QP.
fn local_info(
    site: &Site<'_>,
    parts: &Parts,
    fifo_addr: u64,
    split: bool,
    eces: Vec<Option<Ece>>,
) -> Info {
    Info {
        name: site.name.clone(),
        fifo_addr,
        split,
        traffic_class: site.qp.traffic_class,
        service_level: site.qp.service_level,
        eces,
        members: site
            .ports
            .iter()
            .zip(&parts.fifo_mrs)
            .map(|(p, mr)| member_info(p, mr.rkey()))
            .collect(),
        qpns: parts.qps.iter().map(Qp::num).collect(),
    }
}

/// A FIFO of CTS entries, registered on each member port of `site`.
fn new_fifo(site: &Site<'_>) -> Result<(Box<[Cts; SLOTS]>, Vec<Mr>)> {
    let mut fifo = Box::new([Cts::default(); SLOTS]);
    let ptr = fifo.as_mut_ptr() as *mut u8;
    let mrs = site
        .ports
        .iter()
        .map(|p| p.ctx.reg_mr(ptr, std::mem::size_of::<[Cts; SLOTS]>()))
        .collect::<Result<Vec<Mr>>>()?;
    Ok((fifo, mrs))
}

/// The link layer names NVIDIA's messages use.
fn link_layer_name(ll: u8) -> &'static str {
    if ll == verbs::LINK_LAYER_ETHERNET {
        "RoCE"
    } else {
        "IB"
    }
}

/// An error unless every member port of the peer has the link layer of ours.
fn check_link_layers(site: &Site<'_>, remote: &Info, peer: &str) -> Result<()> {
    let local = site.ports[0];
    match remote
        .members
        .iter()
        .find(|m| m.link_layer != local.attr.link_layer)
    {
        Some(m) => Err(Error::remote(format!(
            "NET/IB : Remote {} device {} of peer {peer} is incompatible with the local {}. \
             Try selecting NICs of only one link type using NCCL_IB_HCA",
            link_layer_name(m.link_layer),
            remote.name,
            local.label()
        ))),
        None => Ok(()),
    }
}

/// Bring every QP of `parts` to RTS against the peer's QPs `remote` describes; the receiver
/// marks its packets as the sender does.
fn connect_qps(site: &Site<'_>, parts: &Parts, remote: &Info, receiver: bool) -> Result<()> {
    for ((qp, r), &rq) in parts.qps.iter().zip(&parts.routes).zip(&remote.qpns) {
        let port = site.ports[r.local];
        let mark = if receiver {
            Marking::receiver(&site.qp, remote, port.is_roce())
        } else {
            Marking::own(&site.qp)
        };
        to_rts(qp, port, &remote.members[r.remote], rq, &site.qp, mark)?;
    }
    Ok(())
}

/// The sender's ECE offer of each QP (None: ECE off or not supported).
fn ece_offers(qs: &QpSettings, qps: &[Qp]) -> Result<Vec<Option<Ece>>> {
    qps.iter()
        .map(|qp| if qs.ece { qp.query_ece() } else { Ok(None) })
        .collect()
}

/// The receiver takes the sender's offers on its QPs (in INIT); which QPs accepted one.
fn accept_eces(qps: &[Qp], offers: &[Option<Ece>]) -> Result<Vec<bool>> {
    qps.iter()
        .zip(offers)
        .map(|(qp, offer)| match offer {
            Some(e) => qp.set_ece(*e),
            None => Ok(false),
        })
        .collect()
}

/// The options each receiver QP that accepted an offer ended with (after RTR).
fn accepted_eces(qps: &[Qp], accepted: &[bool]) -> Result<Vec<Option<Ece>>> {
    qps.iter()
        .zip(accepted)
        .map(|(qp, &ok)| if ok { qp.query_ece() } else { Ok(None) })
        .collect()
}

/// The sender sets the options the receiver accepted on each QP it offered ECE on.
fn set_accepted_eces(
    qps: &[Qp],
    offers: &[Option<Ece>],
    answers: &[Option<Ece>],
    device: &str,
) -> Result<()> {
    for ((qp, offer), answer) in qps.iter().zip(offers).zip(answers) {
        if let (Some(_), Some(e)) = (offer, answer) {
            crate::info!(
                NET,
                "NET/IB : {device} qp_num {} set ECE vendor_id {:#x} options {:#x} comp_mask {:#x}",
                qp.num(),
                e.vendor_id,
                e.options,
                e.comp_mask
            );
            qp.set_ece(*e)?;
        }
    }
    Ok(())
}

/// What a connection is made of before its last step.
struct Parts {
    cqs: Vec<Cq>,
    qps: Vec<Qp>,
    routes: Vec<QpRoute>,
    fifo: Box<[Cts; SLOTS]>,
    fifo_mrs: Vec<Mr>,
}

impl Parts {
    /// The CQs, QPs (`routes`) and FIFO of a connection on `site`.
    fn new(site: &Site<'_>, routes: Vec<QpRoute>) -> Result<Parts> {
        let (cqs, qps) = make_qps(site, &routes)?;
        let (fifo, fifo_mrs) = new_fifo(site)?;
        Ok(Parts {
            cqs,
            qps,
            routes,
            fifo,
            fifo_mrs,
        })
    }
}

/// Everything a new connection takes from its network.
pub struct Site<'a> {
    /// The device's member ports (one unless merged).
    pub ports: Vec<&'a Port>,
    /// The device's name ("soft_0", merged "soft_0+soft_1").
    pub name: String,
    /// Per member port: it went down.
    pub port_down: Vec<Arc<AtomicBool>>,
    pub qp: QpSettings,
    pub path: DataPath,
}

impl Site<'_> {
    /// "soft_0:1", merged "soft_0:1+soft_1:1".
    fn label(&self) -> String {
        self.member_labels().join("+")
    }

    fn member_labels(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("{}:{}", p.dev_name, p.port))
            .collect()
    }
}

fn finish(site: &Site<'_>, parts: Parts, stream: TcpStream, peer: String) -> Conn {
    Conn {
        qps: parts.qps,
        routes: parts.routes,
        flush_qp: None,
        cqs: parts.cqs,
        fifo: parts.fifo,
        fifo_mrs: parts.fifo_mrs,
        flush_buf: Box::new([0; 64]),
        flush_mr: None,
        remote_fifo: RemoteFifo::default(),
        seq: 0,
        reqs: HashMap::new(),
        slots: [None; SLOTS],
        side_channel: stream,
        peer,
        device: site.label(),
        members: site.member_labels(),
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
    /// The receiver's member port count, from its handle.
    remote_members: usize,
    parts: Parts,
    /// The ECE options offered on each QP.
    offers: Vec<Option<Ece>>,
    inbox: Inbox,
    since: Instant,
}

impl Connecting {
    /// Connect to the listener at `addr` (whose device has `remote_members` member ports),
    /// make `qps_per_member` QPs for each member port of the larger end and the FIFO, and
    /// describe them.
    pub fn start(
        site: &Site<'_>,
        addr: SocketAddr,
        remote_members: usize,
        qps_per_member: usize,
    ) -> Result<Connecting> {
        let peer = addr.to_string();
        let mut stream =
            TcpStream::connect_timeout(&addr, SETUP_TIMEOUT).map_err(sys(&peer, "connect"))?;
        stream
            .set_nodelay(true)
            .map_err(sys(&peer, "set_nodelay"))?;
        let local = site.ports.len();
        let nqps = (qps_per_member * local.max(remote_members)).min(MAX_QPS);
        let mut parts = Parts::new(site, qp_routes(nqps, local, remote_members))?;
        let fifo_addr = parts.fifo.as_mut_ptr() as u64;
        let offers = ece_offers(&site.qp, &parts.qps)?;
        let info = local_info(site, &parts, fifo_addr, site.path.split, offers.clone());
        stream
            .write_all(&info.encode())
            .map_err(sys(&peer, "sending the connection description"))?;
        stream
            .set_nonblocking(true)
            .map_err(sys(&peer, "set_nonblocking"))?;
        Ok(Connecting {
            stream,
            peer,
            remote_members,
            parts,
            offers,
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
        if remote.qpns.len() != self.parts.qps.len() || remote.members.len() != self.remote_members
        {
            return Err(Error::remote(format!(
                "NET/IB : peer {} answered with {} queue pairs on {} member ports ({}) for {} \
                 on {}",
                self.peer,
                remote.qpns.len(),
                remote.members.len(),
                remote.name,
                self.parts.qps.len(),
                self.remote_members
            )));
        }
        check_link_layers(site, &remote, &self.peer)?;
        set_accepted_eces(&self.parts.qps, &self.offers, &remote.eces, &site.label())?;
        connect_qps(site, &self.parts, &remote, false)?;
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
        remote_fifo: RemoteFifo,
        split: bool,
        inbox: Inbox,
        since: Instant,
    },
}

/// The receiver's QPs for the sender's description `remote`: as many as the sender's, on
/// the member ports of both ends in turn; every local member port needs one.
fn receiver_routes(site: &Site<'_>, remote: &Info, peer: &str) -> Result<Vec<QpRoute>> {
    let local = site.ports.len();
    if remote.members.len() != local {
        crate::info!(
            NET,
            "NET/IB : Local mergedDev {} has a different number of devices={} as remote {} {}",
            site.name,
            local,
            remote.name,
            remote.members.len()
        );
    }
    if remote.qpns.len() < local {
        return Err(Error::remote(format!(
            "NET/IB : peer {peer} made {} queue pairs for the {local} member ports of {}",
            remote.qpns.len(),
            site.label()
        )));
    }
    Ok(qp_routes(remote.qpns.len(), local, remote.members.len()))
}

/// The peer's FIFO as `remote` describes it.
fn remote_fifo_of(remote: &Info) -> RemoteFifo {
    let mut f = RemoteFifo {
        addr: remote.fifo_addr,
        ..RemoteFifo::default()
    };
    for (k, m) in f.rkeys.iter_mut().zip(&remote.members) {
        *k = m.fifo_rkey;
    }
    f
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
                check_link_layers(site, &remote, &peer)?;
                let parts = Parts::new(site, receiver_routes(site, &remote, &peer)?)?;
                let accepted = accept_eces(&parts.qps, &remote.eces)?;
                connect_qps(site, &parts, &remote, true)?;
                let eces = accepted_eces(&parts.qps, &accepted)?;
                let info = local_info(site, &parts, 0, remote.split, eces);
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
                    parts,
                    remote_fifo: remote_fifo_of(&remote),
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

/// A QP connected to itself on `port` (the first member port), for flushes (RDMA reads of
/// received data), with the buffer its reads land in registered.
pub fn add_flush_qp(conn: &mut Conn, port: &Port, qs: &QpSettings) -> Result<()> {
    let qp = port.ctx.create_qp(&conn.cqs[0], qp_cap(false))?;
    to_init(&qp, port, qs)?;
    let mark = Marking::own(qs);
    to_rts(&qp, port, &member_info(port, 0), qp.num(), qs, mark)?;
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

    /// An InfiniBand GID in NVIDIA's routable layout.
    fn gid(flid: u16, subnet: u16) -> Gid {
        let mut g = [0u8; 16];
        g[..2].copy_from_slice(&[0xfe, 0x80]);
        g[4..6].copy_from_slice(&flid.to_be_bytes());
        g[6..8].copy_from_slice(&subnet.to_be_bytes());
        g
    }

    #[test]
    fn ib_routes_stay_local_within_a_subnet_and_go_to_the_flid_across() {
        let remote = |flid, subnet| MemberInfo {
            lid: 17,
            link_layer: verbs::LINK_LAYER_INFINIBAND,
            mtu: 5,
            gid: gid(flid, subnet),
            fifo_rkey: 0,
        };
        let local = gid(0x4011, 1);
        let route = |r: &MemberInfo, grh| ib_route(&local, r, grh);
        assert_eq!(
            route(&remote(0x4022, 1), false),
            IbRoute {
                dlid: 17,
                global: false
            }
        );
        assert_eq!(
            route(&remote(0x4022, 1), true),
            IbRoute {
                dlid: 17,
                global: true
            },
            "a port that requires a GRH"
        );
        assert_eq!(
            route(&remote(0x4022, 2), false),
            IbRoute {
                dlid: 0x4022,
                global: true
            }
        );
        assert_eq!(
            route(&remote(0, 2), false),
            IbRoute {
                dlid: 17,
                global: true
            },
            "no FLID: the LID"
        );
        // GID 0 on both sides (no FLID anywhere): one subnet, LIDs as before.
        assert_eq!(
            ib_route(&[0; 16], &remote(0, 0), false),
            IbRoute {
                dlid: 17,
                global: false
            }
        );
    }

    #[test]
    fn handles_and_descriptions_round_trip() {
        let a: SocketAddr = "127.0.0.1:4567".parse().unwrap();
        assert_eq!(decode_handle(&encode_handle(a, 1)).unwrap(), (a, 1));
        let b: SocketAddr = "[fe80::1%3]:99".parse().unwrap();
        assert_eq!(decode_handle(&encode_handle(b, 2)).unwrap(), (b, 2));
        let e = decode_handle(&Handle::default()).unwrap_err();
        assert!(e.msg.contains("not an IB handle"), "{}", e.msg);
        let e = decode_handle(&encode_handle(a, MAX_MEMBERS + 1)).unwrap_err();
        assert!(e.msg.contains("member ports"), "{}", e.msg);
        let member = |lid, rkey| MemberInfo {
            lid,
            link_layer: verbs::LINK_LAYER_ETHERNET,
            mtu: 5,
            gid: [7; 16],
            fifo_rkey: rkey,
        };
        let ece = |options| Ece {
            vendor_id: 0x15b3,
            options,
            comp_mask: 0,
        };
        let info = Info {
            name: "mlx5_0+mlx5_1".into(),
            fifo_addr: 0xdead_beef_0000,
            split: true,
            traffic_class: 106,
            service_level: 3,
            members: vec![member(0x1234, 0x55), member(0x1235, 0x66)],
            qpns: vec![0x401, 0x402, 0x403, 0x404],
            eces: vec![Some(ece(5)), None, Some(ece(0)), None],
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
        let mut bad = info.encode();
        bad[10] = 0;
        let e = Info::decode(&bad, "10.0.0.2:5").unwrap_err();
        assert!(e.msg.contains("0 member ports"), "{}", e.msg);
    }
}
