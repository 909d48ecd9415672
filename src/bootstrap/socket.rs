//! Sockets for the bootstrap: choosing the interface (`NCCL_SOCKET_IFNAME`,
//! `NCCL_SOCKET_FAMILY`, via `getifaddrs`), binding listeners, and every blocking socket
//! operation bounded by a deadline and an abort flag polled at least every 100 ms
//! (`connect`, `write_all`, `read_exact`, `poll`).

use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::ffi::CStr;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often every wait looks at its abort flag.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// When a wait must end: a deadline, and an abort flag checked every `POLL_INTERVAL`.
#[derive(Clone, Copy)]
pub struct Limits<'a> {
    pub deadline: Instant,
    /// The full timeout the deadline was computed from (for messages).
    pub timeout: Duration,
    pub abort: &'a AtomicBool,
}

impl<'a> Limits<'a> {
    pub fn new(timeout: Duration, abort: &'a AtomicBool) -> Self {
        Limits {
            deadline: Instant::now() + timeout,
            timeout,
            abort,
        }
    }
    /// Why the wait must end now, if it must.
    pub fn expired(&self) -> Option<WaitError> {
        if self.abort.load(Ordering::Acquire) {
            Some(WaitError::Aborted)
        } else if Instant::now() >= self.deadline {
            Some(WaitError::TimedOut)
        } else {
            None
        }
    }
    /// The next slice of waiting: at most `POLL_INTERVAL`, at least 1 ms.
    pub fn slice(&self) -> Duration {
        let left = self.deadline.saturating_duration_since(Instant::now());
        left.clamp(Duration::from_millis(1), POLL_INTERVAL)
    }
}

/// Why a bounded socket operation did not complete.
#[derive(Debug)]
pub enum WaitError {
    Aborted,
    TimedOut,
    Closed,
    Io(std::io::Error),
}

impl WaitError {
    /// The error to return, `what` saying what was being waited for ("receiving from rank 3").
    pub fn into_error(self, limits: &Limits<'_>, what: &str) -> Error {
        match self {
            WaitError::Aborted => Error::internal(format!("bootstrap: aborted while {what}")),
            WaitError::TimedOut => Error::system(format!(
                "bootstrap: timed out after {} while {what}",
                fmt_secs(limits.timeout)
            )),
            WaitError::Closed => Error::remote(format!(
                "bootstrap: connection closed by the other side while {what}"
            )),
            WaitError::Io(e) => Error::system(format!("bootstrap: {e} while {what}")),
        }
    }
}

/// "5 s", "0.5 s".
pub fn fmt_secs(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

fn is_retry(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

/// Connect to `addr`, retrying slow connections until the deadline, and refused ones too when
/// `retry_refused` (a root may not be listening yet; a peer's listener always is).
pub fn connect(
    addr: &SocketAddr,
    retry_refused: bool,
    limits: &Limits<'_>,
) -> std::result::Result<TcpStream, WaitError> {
    let mut backoff = Duration::from_millis(5);
    loop {
        if let Some(why) = limits.expired() {
            return Err(why);
        }
        match TcpStream::connect_timeout(addr, limits.slice()) {
            Ok(stream) => {
                stream.set_nodelay(true).map_err(WaitError::Io)?;
                return Ok(stream);
            }
            Err(e)
                if is_retry(&e)
                    || (retry_refused
                        && matches!(
                            e.kind(),
                            ErrorKind::ConnectionRefused
                                | ErrorKind::ConnectionReset
                                | ErrorKind::AddrNotAvailable
                        )) =>
            {
                std::thread::sleep(backoff.min(limits.slice()));
                backoff = (backoff * 2).min(POLL_INTERVAL);
            }
            Err(e) => return Err(WaitError::Io(e)),
        }
    }
}

/// Text from another process as one printable line: invalid UTF-8 and control characters
/// (which could forge log lines or terminal escapes) replaced.
pub fn printable(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

/// Write all of `data`, in slices of at most `POLL_INTERVAL`.
pub fn write_all(
    stream: &TcpStream,
    data: &[u8],
    limits: &Limits<'_>,
) -> std::result::Result<(), WaitError> {
    let mut stream_ref = stream;
    let mut done = 0;
    while done < data.len() {
        if let Some(why) = limits.expired() {
            return Err(why);
        }
        stream
            .set_write_timeout(Some(limits.slice()))
            .map_err(WaitError::Io)?;
        match stream_ref.write(&data[done..]) {
            Ok(0) => return Err(WaitError::Closed),
            Ok(n) => done += n,
            Err(e) if is_retry(&e) => {}
            Err(e) if is_closed(&e) => return Err(WaitError::Closed),
            Err(e) => return Err(WaitError::Io(e)),
        }
    }
    Ok(())
}

/// Fill `buf`, in slices of at most `POLL_INTERVAL`; end of stream is `Closed`.
pub fn read_exact(
    stream: &TcpStream,
    buf: &mut [u8],
    limits: &Limits<'_>,
) -> std::result::Result<(), WaitError> {
    let mut stream_ref = stream;
    let mut done = 0;
    while done < buf.len() {
        if let Some(why) = limits.expired() {
            return Err(why);
        }
        stream
            .set_read_timeout(Some(limits.slice()))
            .map_err(WaitError::Io)?;
        match stream_ref.read(&mut buf[done..]) {
            Ok(0) => return Err(WaitError::Closed),
            Ok(n) => done += n,
            Err(e) if is_retry(&e) => {}
            Err(e) if is_closed(&e) => return Err(WaitError::Closed),
            Err(e) => return Err(WaitError::Io(e)),
        }
    }
    Ok(())
}

/// Errors that mean the other side went away.
pub fn is_closed(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::ConnectionReset
            | ErrorKind::BrokenPipe
            | ErrorKind::ConnectionAborted
            | ErrorKind::UnexpectedEof
    )
}

/// Wait until some of `fds` are ready (their `revents` are filled in) or `timeout` passes.
pub fn poll(fds: &mut [libc::pollfd], timeout: Duration) -> std::io::Result<usize> {
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd structs.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
}

/// A pollfd asking for readability.
pub fn pollfd(fd: std::os::fd::RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Whether poll found `fd` readable (or hung up, which a read then reports).
pub fn ready(p: &libc::pollfd) -> bool {
    p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}

/// Seconds after which a peer host that answers nothing counts as dead on a TCP connection
/// (`OXCCL_DEAD_PEER_S`, default 60; 0: never, as NVIDIA's library).
pub fn dead_peer_secs() -> u32 {
    crate::env::registry::DEAD_PEER_S.int().clamp(0, 86_400) as u32
}

/// Make `stream` fail once its peer's host has answered nothing for about `secs` seconds:
/// keepalive probes while it is idle, and the same bound on data left unacknowledged. A host
/// that died or a network that split then ends the connection with an error, as a killed
/// process's closed connection does, instead of leaving its reader waiting for good. The
/// peer's kernel answers the probes, so a live process that is merely busy never trips it.
/// `secs` 0: the connection is left as it is.
///
/// For the bootstrap's connections only (the watchdog's view of dead ranks): their reader
/// drains them at once. A data connection whose receiver posts late would fill its window,
/// and the same bound applies to a zero window, which would end a healthy connection.
pub fn detect_dead_peer(stream: &TcpStream, secs: u32) -> std::io::Result<()> {
    if secs == 0 {
        return Ok(());
    }
    let idle = (secs / 2).max(1);
    let interval = (secs / 10).max(1);
    let options = [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle as libc::c_int),
        (
            libc::IPPROTO_TCP,
            libc::TCP_KEEPINTVL,
            interval as libc::c_int,
        ),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 5),
        (
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            (secs.saturating_mul(1000)).min(i32::MAX as u32) as libc::c_int,
        ),
    ];
    for (level, name, value) in options {
        set_int_option(stream, level, name, value)?;
    }
    Ok(())
}

fn set_int_option(
    stream: &TcpStream,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is the stream's, open while it lives; the option value is one
    // c_int read by the kernel during the call.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The interface the bootstrap uses: its name and address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetIf {
    pub name: String,
    pub ip: IpAddr,
    /// IPv6 scope id (interface index for link-local addresses), else 0.
    pub scope_id: u32,
}

impl NetIf {
    /// A socket address on this interface.
    pub fn socket_addr(&self, port: u16) -> SocketAddr {
        match self.ip {
            IpAddr::V6(ip) => SocketAddr::V6(SocketAddrV6::new(ip, port, 0, self.scope_id)),
            ip => SocketAddr::new(ip, port),
        }
    }
}

/// One address of one interface, as getifaddrs lists it.
#[derive(Clone, Debug)]
pub struct IfAddr {
    pub name: String,
    pub ip: IpAddr,
    pub scope_id: u32,
    /// Bits of its netmask.
    pub prefix: u32,
    /// Running (`IFF_RUNNING`: up with a carrier), as NVIDIA requires of a chosen interface.
    pub up: bool,
}

/// The bits set in the netmask `mask` points to (a sockaddr of `family`; null: none).
///
/// # Safety
/// `mask` is null or points to a `sockaddr_in` (AF_INET) or `sockaddr_in6` (AF_INET6).
unsafe fn prefix_bits(mask: *const libc::sockaddr, family: libc::c_int) -> u32 {
    if mask.is_null() {
        return 0;
    }
    // SAFETY: the caller's contract names the struct behind `mask`.
    unsafe {
        match family {
            libc::AF_INET => (*(mask as *const libc::sockaddr_in))
                .sin_addr
                .s_addr
                .count_ones(),
            libc::AF_INET6 => (*(mask as *const libc::sockaddr_in6))
                .sin6_addr
                .s6_addr
                .iter()
                .map(|b| b.count_ones())
                .sum(),
            _ => 0,
        }
    }
}

/// Every IPv4/IPv6 address of every interface, in getifaddrs order.
pub fn list_interfaces() -> Result<Vec<IfAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `head`; freed with freeifaddrs below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::system(format!(
            "bootstrap: getifaddrs failed: {}",
            std::io::Error::last_os_error()
        )));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs;
        // ifa_name is a NUL-terminated string and ifa_addr, when non-null, points to a
        // sockaddr whose family says which larger struct it is.
        unsafe {
            let ifa = &*cur;
            cur = ifa.ifa_next;
            if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
                continue;
            }
            let name = CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned();
            let up = ifa.ifa_flags & libc::IFF_RUNNING as libc::c_uint != 0;
            let family = (*ifa.ifa_addr).sa_family as libc::c_int;
            let prefix = prefix_bits(ifa.ifa_netmask, family);
            match family {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                    out.push(IfAddr {
                        name,
                        ip: IpAddr::V4(ip),
                        scope_id: 0,
                        prefix,
                        up,
                    });
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                    out.push(IfAddr {
                        name,
                        ip: IpAddr::V6(ip),
                        scope_id: sin6.sin6_scope_id,
                        prefix,
                        up,
                    });
                }
                _ => {}
            }
        }
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// A parsed interface list (`NCCL_SOCKET_IFNAME` syntax): prefixes, `^` excludes, `=` exact.
#[derive(Clone, Debug)]
pub struct IfFilter {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfFilter {
    pub fn parse(spec: &str) -> Self {
        let mut rest = spec.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let names = rest
            .split(',')
            .map(|item| item.trim())
            .filter(|item| !item.is_empty())
            // NCCL allows `name:port`; the port plays no part in choosing the interface.
            .map(|item| item.split(':').next().unwrap_or(item).to_string())
            .collect();
        IfFilter {
            exclude,
            exact,
            names,
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        let hit = self.names.iter().any(|n| {
            if self.exact {
                name == n
            } else {
                name.starts_with(n.as_str())
            }
        });
        hit != self.exclude
    }
}

/// Which address family `NCCL_SOCKET_FAMILY` allows (None: either).
pub fn parse_family(value: Option<&str>) -> Option<bool> {
    match value.map(|v| v.trim().to_ascii_uppercase()) {
        Some(v) if v == "AF_INET" => Some(false),
        Some(v) if v == "AF_INET6" => Some(true),
        _ => None,
    }
}

/// Choose the bootstrap's interface among `ifaces` by the rules of `choose_interfaces`,
/// without `NCCL_COMM_ID` (with it, `bootstrap_interface` takes the one in its subnet first).
pub fn choose_interface(
    ifaces: &[IfAddr],
    spec: Option<&str>,
    want_v6: Option<bool>,
) -> Option<NetIf> {
    choose_interfaces(ifaces, spec, want_v6, None, 1)
        .into_iter()
        .next()
}

/// Whether address `a` is in the subnet of `remote`: equal under `a`'s netmask, and for IPv6
/// of the same scope (NVIDIA's `matchSubnet`).
fn same_subnet(a: &IfAddr, remote: &SocketAddr) -> bool {
    let masked = |bytes: &[u8]| -> Vec<u8> {
        bytes
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let bits = a.prefix.saturating_sub(8 * i as u32).min(8);
                b & (0xffu16 << (8 - bits)) as u8
            })
            .collect()
    };
    match (a.ip, remote) {
        (IpAddr::V4(mine), SocketAddr::V4(r)) => masked(&mine.octets()) == masked(&r.ip().octets()),
        (IpAddr::V6(mine), SocketAddr::V6(r)) => {
            masked(&mine.octets()) == masked(&r.ip().octets()) && a.scope_id == r.scope_id()
        }
        _ => false,
    }
}

/// The first address among `ifaces` (of any interface, in any state) in the subnet of
/// `remote` (NVIDIA's `ncclFindInterfaceMatchSubnet`).
pub fn interface_in_subnet(ifaces: &[IfAddr], remote: &SocketAddr) -> Option<NetIf> {
    ifaces
        .iter()
        .find(|a| same_subnet(a, remote))
        .map(|a| NetIf {
            name: a.name.clone(),
            ip: a.ip,
            scope_id: a.scope_id,
        })
}

/// Up to `max` interfaces among `ifaces`, each with its first usable address (running, of
/// the family `want_v6` asks for, not IPv6 link-local), as NVIDIA's `ncclFindInterfaces`:
/// with `spec` (`NCCL_SOCKET_IFNAME`, taken when longer than one character) every interface
/// that matches it; otherwise the IPoIB ones (`ib*`), else the one in the subnet of
/// `comm_id` (`NCCL_COMM_ID`'s address), else every one but docker, loopback and libvirt
/// bridges (`virbr*`), else docker, else loopback, else `virbr`. Unlike NVIDIA's, an IPv6
/// loopback address may be chosen (with `NCCL_SOCKET_FAMILY=AF_INET6` and only loopback).
pub fn choose_interfaces(
    ifaces: &[IfAddr],
    spec: Option<&str>,
    want_v6: Option<bool>,
    comm_id: Option<SocketAddr>,
    max: usize,
) -> Vec<NetIf> {
    let usable = |a: &&IfAddr| {
        a.up && want_v6.is_none_or(|v6| a.ip.is_ipv6() == v6)
            && !matches!(a.ip, IpAddr::V6(ip) if (ip.segments()[0] & 0xffc0) == 0xfe80)
    };
    let pick = |filter: &str| {
        let filter = IfFilter::parse(filter);
        let mut found: Vec<NetIf> = Vec::new();
        for a in ifaces
            .iter()
            .filter(usable)
            .filter(|a| filter.matches(&a.name))
        {
            if found.len() < max && !found.iter().any(|f| f.name == a.name) {
                found.push(NetIf {
                    name: a.name.clone(),
                    ip: a.ip,
                    scope_id: a.scope_id,
                });
            }
        }
        found
    };
    if let Some(spec) = spec.filter(|s| s.len() > 1) {
        return pick(spec);
    }
    let ib = pick("ib");
    if !ib.is_empty() {
        return ib;
    }
    if let Some(found) = comm_id.and_then(|remote| interface_in_subnet(ifaces, &remote)) {
        return vec![found];
    }
    ["^docker,lo,virbr", "docker", "lo", "virbr"]
        .into_iter()
        .map(pick)
        .find(|found| !found.is_empty())
        .unwrap_or_default()
}

/// `NCCL_COMM_ID`'s address, when set (an error when it is not an address or a host name).
fn comm_id_address() -> Result<Option<SocketAddr>> {
    crate::env::registry::COMM_ID
        .get()
        .map(|text| {
            super::id::parse_comm_id(&text).inspect_err(|_| {
                crate::warn!(
                    "Invalid NCCL_COMM_ID, please use format: <ipv4>:<port> or [<ipv6>]:<port> \
                     or <hostname>:<port>"
                )
            })
        })
        .transpose()
}

/// Most interfaces the built-in socket network uses (NVIDIA's `MAX_IFS`).
pub const MAX_NET_INTERFACES: usize = 16;

/// The interfaces of the built-in socket network, up to `MAX_NET_INTERFACES`, by
/// `choose_interfaces` (`NCCL_SOCKET_IFNAME`, `NCCL_SOCKET_FAMILY`, `NCCL_COMM_ID`): each is a
/// device.
pub fn net_interfaces() -> Result<Vec<NetIf>> {
    let spec = crate::env::registry::SOCKET_IFNAME.get();
    let family = parse_family(crate::env::registry::SOCKET_FAMILY.get().as_deref());
    let found = choose_interfaces(
        &list_interfaces()?,
        spec.as_deref(),
        family,
        comm_id_address()?,
        MAX_NET_INTERFACES,
    );
    if found.is_empty() {
        return Err(Error::system(match &spec {
            Some(s) => format!("NET/Socket : no interface found matching NCCL_SOCKET_IFNAME={s}"),
            None => "NET/Socket : no interface found".to_string(),
        }));
    }
    Ok(found)
}

/// The chosen interface and the settings' generation (`crate::env::generation`) it was
/// chosen in: `ncclResetDebugInit` (which reloads the settings) makes the next use choose again.
static BOOTSTRAP_IF: Mutex<Option<(u64, NetIf)>> = Mutex::new(None);

/// The process's bootstrap interface, chosen once per generation of the settings and logged:
/// with `NCCL_COMM_ID`, the interface in the subnet of its address (NVIDIA's rule, which
/// ignores `NCCL_SOCKET_IFNAME` then); otherwise, or when none is, as `choose_interface`
/// chooses by `NCCL_SOCKET_IFNAME` and `NCCL_SOCKET_FAMILY`.
pub fn bootstrap_interface() -> Result<NetIf> {
    let generation = crate::env::generation();
    let mut cached = BOOTSTRAP_IF.lock();
    if let Some((chosen_in, netif)) = cached.as_ref() {
        if *chosen_in == generation {
            return Ok(netif.clone());
        }
    }
    let spec = crate::env::registry::SOCKET_IFNAME.get();
    let family = parse_family(crate::env::registry::SOCKET_FAMILY.get().as_deref());
    let ifaces = list_interfaces()?;
    // As NVIDIA's: with NCCL_COMM_ID, the interface in its subnet, whatever else is set.
    // NVIDIA's fails when there is none (a rank routed to rank 0's subnet); this one then
    // chooses as without NCCL_COMM_ID.
    if let Some(remote) = comm_id_address()? {
        if let Some(chosen) = interface_in_subnet(&ifaces, &remote) {
            return Ok(remember_bootstrap_interface(
                &mut cached,
                generation,
                chosen,
            ));
        }
        crate::info!(
            BOOTSTRAP,
            "Bootstrap: no interface in the subnet of NCCL_COMM_ID {remote}; choosing by \
             NCCL_SOCKET_IFNAME and NCCL_SOCKET_FAMILY"
        );
    }
    let chosen = choose_interface(&ifaces, spec.as_deref(), family).ok_or_else(|| {
        let msg = match &spec {
            Some(s) => {
                format!("Bootstrap: no socket interface found matching NCCL_SOCKET_IFNAME={s}")
            }
            None => "Bootstrap: no socket interface found".to_string(),
        };
        crate::warn!("{msg}");
        Error::system(msg)
    })?;
    Ok(remember_bootstrap_interface(
        &mut cached,
        generation,
        chosen,
    ))
}

/// Log the bootstrap interface as NVIDIA's does and keep it for `generation`.
fn remember_bootstrap_interface(
    cached: &mut Option<(u64, NetIf)>,
    generation: u64,
    chosen: NetIf,
) -> NetIf {
    crate::info!(
        BOOTSTRAP,
        "Bootstrap: Using {}:{}<0>",
        chosen.name,
        chosen.ip
    );
    *cached = Some((generation, chosen.clone()));
    chosen
}

/// A listener on `ip` with a kernel-chosen port.
pub fn listen_on(netif: &NetIf) -> Result<TcpListener> {
    let addr = netif.socket_addr(0);
    TcpListener::bind(addr)
        .map_err(|e| Error::system(format!("bootstrap: cannot listen on {addr}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An address with a /24 (IPv4) or /64 (IPv6) netmask.
    fn ifa(name: &str, ip: &str, up: bool) -> IfAddr {
        let ip: IpAddr = ip.parse().unwrap();
        IfAddr {
            name: name.into(),
            ip,
            scope_id: 0,
            prefix: if ip.is_ipv6() { 64 } else { 24 },
            up,
        }
    }

    fn name_ip(n: Option<NetIf>) -> Option<String> {
        n.map(|n| format!("{}:{}", n.name, n.ip))
    }

    fn names(v: Vec<NetIf>) -> Vec<String> {
        v.iter().map(|n| format!("{}:{}", n.name, n.ip)).collect()
    }

    #[test]
    fn interface_choice() {
        let list = vec![
            ifa("lo", "127.0.0.1", true),
            ifa("docker0", "172.17.0.1", true),
            ifa("eth0", "10.0.0.1", false),
            ifa("eth1", "fe80::1", true),
            ifa("eth1", "10.0.0.2", true),
            ifa("eth1", "fd00::2", true),
            ifa("virbr0", "192.168.122.1", true),
        ];
        let choose = |spec, v6| name_ip(choose_interface(&list, spec, v6));
        assert_eq!(choose(None, None).unwrap(), "eth1:10.0.0.2");
        assert_eq!(choose(None, Some(true)).unwrap(), "eth1:fd00::2");
        assert_eq!(choose(Some("virbr"), None).unwrap(), "virbr0:192.168.122.1");
        assert_eq!(choose(Some("^eth,lo"), None).unwrap(), "docker0:172.17.0.1");
        assert_eq!(choose(Some("=eth"), None), None);
        assert_eq!(choose(Some("=lo,=eth1"), None).unwrap(), "lo:127.0.0.1");
        assert_eq!(choose(Some("eth0"), None), None, "eth0 is not running");
        // A setting of one character is no setting (NVIDIA's `strlen(env) > 1`).
        assert_eq!(choose(Some("l"), None).unwrap(), "eth1:10.0.0.2");
        let only_lo = vec![ifa("lo", "127.0.0.1", true), ifa("lo", "::1", true)];
        let only = |v6| name_ip(choose_interface(&only_lo, None, v6));
        assert_eq!(only(None).unwrap(), "lo:127.0.0.1");
        assert_eq!(only(Some(true)).unwrap(), "lo:::1");
    }

    #[test]
    fn ipoib_first_then_the_comm_id_subnet_then_all_but_docker_loopback_and_libvirt() {
        let mut list = vec![
            ifa("lo", "127.0.0.1", true),
            ifa("virbr0", "192.168.122.1", true),
            ifa("eth0", "10.0.0.1", true),
            ifa("eth1", "10.0.1.1", true),
            ifa("ib0", "10.1.0.1", true),
        ];
        let id = |text: &str| Some(text.parse::<SocketAddr>().unwrap());
        // IPoIB first, even with NCCL_COMM_ID elsewhere.
        assert_eq!(
            names(choose_interfaces(&list, None, None, id("10.0.1.9:80"), 16)),
            ["ib0:10.1.0.1"]
        );
        list.pop();
        // Then the one interface in NCCL_COMM_ID's subnet.
        assert_eq!(
            names(choose_interfaces(&list, None, None, id("10.0.1.9:80"), 16)),
            ["eth1:10.0.1.1"]
        );
        // A COMM_ID in no subnet of ours, or none: every one but lo, docker and virbr.
        for comm_id in [id("10.9.9.9:80"), None] {
            assert_eq!(
                names(choose_interfaces(&list, None, None, comm_id, 16)),
                ["eth0:10.0.0.1", "eth1:10.0.1.1"]
            );
        }
        // libvirt's bridge only after loopback.
        let bridged = vec![
            ifa("virbr0", "192.168.122.1", true),
            ifa("lo", "127.0.0.1", true),
        ];
        assert_eq!(
            names(choose_interfaces(&bridged, None, None, None, 16)),
            ["lo:127.0.0.1"]
        );
        assert_eq!(
            names(choose_interfaces(&bridged[..1], None, None, None, 16)),
            ["virbr0:192.168.122.1"]
        );
    }

    #[test]
    fn the_comm_id_subnet_is_nvidias_match() {
        let mut list = vec![
            ifa("eth0", "10.0.0.1", false),
            ifa("eth1", "fe80::5", true),
            ifa("eth1", "fd00:1:2:3::5", true),
        ];
        list[1].scope_id = 3;
        let find = |text: &str| {
            name_ip(interface_in_subnet(
                &list,
                &text.parse::<SocketAddr>().unwrap(),
            ))
        };
        // Any state: NVIDIA's match looks at the address and netmask only.
        assert_eq!(find("10.0.0.200:1").unwrap(), "eth0:10.0.0.1");
        assert_eq!(find("10.0.1.1:1"), None, "outside the /24");
        assert_eq!(find("[fd00:1:2:3::77]:1").unwrap(), "eth1:fd00:1:2:3::5");
        assert_eq!(find("[fd00:1:2:4::77]:1"), None, "outside the /64");
        // A link-local address matches only a remote of the same scope.
        assert_eq!(find("[fe80::9]:1"), None);
        assert_eq!(find("[fe80::9%3]:1").unwrap(), "eth1:fe80::5");
        let odd = IfAddr {
            prefix: 20,
            ..ifa("eth2", "10.16.0.1", true)
        };
        assert!(same_subnet(&odd, &"10.16.15.254:1".parse().unwrap()));
        assert!(!same_subnet(&odd, &"10.16.16.1:1".parse().unwrap()));
    }

    #[test]
    fn every_matching_interface_once_for_the_network() {
        let list = vec![
            ifa("lo", "127.0.0.1", true),
            ifa("eth0", "10.0.0.1", true),
            ifa("eth0", "10.0.0.9", true),
            ifa("docker0", "172.17.0.1", true),
            ifa("eth1", "10.0.1.1", true),
            ifa("eth2", "10.0.2.1", false),
        ];
        let choose = |spec, max| names(choose_interfaces(&list, spec, None, None, max));
        assert_eq!(choose(None, 16), ["eth0:10.0.0.1", "eth1:10.0.1.1"]);
        assert_eq!(choose(None, 1).len(), 1);
        assert_eq!(choose(Some("eth"), 16), ["eth0:10.0.0.1", "eth1:10.0.1.1"]);
        assert_eq!(
            choose(Some("^eth,ib"), 16),
            ["lo:127.0.0.1", "docker0:172.17.0.1"]
        );
        let only = vec![
            ifa("lo", "127.0.0.1", true),
            ifa("docker0", "172.17.0.1", true),
        ];
        assert_eq!(
            names(choose_interfaces(&only, None, None, None, 16)),
            ["docker0:172.17.0.1"]
        );
        assert!(choose(Some("=eth"), 16).is_empty());
    }

    fn int_option(stream: &TcpStream, level: libc::c_int, name: libc::c_int) -> libc::c_int {
        use std::os::fd::AsRawFd;
        let mut value: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: reads one c_int option of the stream's open descriptor into `value`.
        let rc = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                level,
                name,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "getsockopt");
        value
    }

    #[test]
    fn a_dead_peer_bound_sets_keepalive_and_the_user_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        detect_dead_peer(&stream, 0).unwrap();
        assert_eq!(int_option(&stream, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 0);
        detect_dead_peer(&stream, 30).unwrap();
        let tcp = |name| int_option(&stream, libc::IPPROTO_TCP, name);
        assert_ne!(int_option(&stream, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 0);
        assert_eq!(tcp(libc::TCP_KEEPIDLE), 15);
        assert_eq!(tcp(libc::TCP_KEEPINTVL), 3);
        assert_eq!(tcp(libc::TCP_KEEPCNT), 5);
        assert_eq!(tcp(libc::TCP_USER_TIMEOUT), 30_000);
        detect_dead_peer(&stream, 3).unwrap();
        assert_eq!((tcp(libc::TCP_KEEPIDLE), tcp(libc::TCP_KEEPINTVL)), (1, 1));
    }

    #[test]
    fn families() {
        assert_eq!(parse_family(Some("AF_INET")), Some(false));
        assert_eq!(parse_family(Some("af_inet6")), Some(true));
        assert_eq!(parse_family(None), None);
    }

    #[test]
    fn real_interfaces_listed() {
        let list = list_interfaces().unwrap();
        assert!(list.iter().any(|a| a.ip.is_loopback()), "{list:?}");
        assert!(bootstrap_interface().is_ok());
    }
}
