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
    pub up: bool,
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
            let up = ifa.ifa_flags & libc::IFF_UP as libc::c_uint != 0;
            match (*ifa.ifa_addr).sa_family as libc::c_int {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                    out.push(IfAddr {
                        name,
                        ip: IpAddr::V4(ip),
                        scope_id: 0,
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

/// Choose the bootstrap interface among `ifaces`: with `spec`, the first up address whose
/// interface matches it; otherwise the first up non-loopback non-docker one, then docker,
/// then loopback. `want_v6` restricts the family. IPv6 link-local addresses are skipped.
pub fn choose_interface(
    ifaces: &[IfAddr],
    spec: Option<&str>,
    want_v6: Option<bool>,
) -> Option<NetIf> {
    choose_interfaces(ifaces, spec, want_v6, 1)
        .into_iter()
        .next()
}

/// Up to `max` interfaces among `ifaces`, each with its first usable address, by the rules of
/// `choose_interface` (NVIDIA's `ncclFindInterfaces`): with `spec`, every interface that
/// matches it; otherwise the non-loopback non-docker ones, or if there are none the docker
/// ones, or if none loopback.
pub fn choose_interfaces(
    ifaces: &[IfAddr],
    spec: Option<&str>,
    want_v6: Option<bool>,
    max: usize,
) -> Vec<NetIf> {
    let usable = |a: &&IfAddr| {
        a.up && want_v6.is_none_or(|v6| a.ip.is_ipv6() == v6)
            && !matches!(a.ip, IpAddr::V6(ip) if (ip.segments()[0] & 0xffc0) == 0xfe80)
    };
    let pick = |filter: IfFilter| {
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
    match spec {
        Some(spec) => pick(IfFilter::parse(spec)),
        None => [
            pick(IfFilter::parse("^docker,lo")),
            pick(IfFilter::parse("docker")),
            pick(IfFilter::parse("lo")),
        ]
        .into_iter()
        .find(|found| !found.is_empty())
        .unwrap_or_default(),
    }
}

/// Most interfaces the built-in socket network uses (NVIDIA's `MAX_IFS`).
pub const MAX_NET_INTERFACES: usize = 16;

/// The interfaces of the built-in socket network, by `NCCL_SOCKET_IFNAME` and
/// `NCCL_SOCKET_FAMILY` as for the bootstrap, up to `MAX_NET_INTERFACES`: each is a device.
pub fn net_interfaces() -> Result<Vec<NetIf>> {
    let spec = crate::env::get("NCCL_SOCKET_IFNAME");
    let family = parse_family(crate::env::get("NCCL_SOCKET_FAMILY").as_deref());
    let found = choose_interfaces(
        &list_interfaces()?,
        spec.as_deref(),
        family,
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

/// The process's bootstrap interface, chosen once per generation of the settings and logged.
pub fn bootstrap_interface() -> Result<NetIf> {
    let generation = crate::env::generation();
    let mut cached = BOOTSTRAP_IF.lock();
    if let Some((chosen_in, netif)) = cached.as_ref() {
        if *chosen_in == generation {
            return Ok(netif.clone());
        }
    }
    let spec = crate::env::get("NCCL_SOCKET_IFNAME");
    let family = parse_family(crate::env::get("NCCL_SOCKET_FAMILY").as_deref());
    let ifaces = list_interfaces()?;
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
    crate::info!(
        BOOTSTRAP,
        "Bootstrap: Using {}:{}<0>",
        chosen.name,
        chosen.ip
    );
    *cached = Some((generation, chosen.clone()));
    Ok(chosen)
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

    fn ifa(name: &str, ip: &str, up: bool) -> IfAddr {
        IfAddr {
            name: name.into(),
            ip: ip.parse().unwrap(),
            scope_id: 0,
            up,
        }
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
            ifa("ib0", "10.1.0.1", true),
        ];
        let name_ip = |n: Option<NetIf>| n.map(|n| format!("{}:{}", n.name, n.ip));
        assert_eq!(
            name_ip(choose_interface(&list, None, None)).unwrap(),
            "eth1:10.0.0.2"
        );
        assert_eq!(
            name_ip(choose_interface(&list, None, Some(true))).unwrap(),
            "eth1:fd00::2"
        );
        assert_eq!(
            name_ip(choose_interface(&list, Some("ib"), None)).unwrap(),
            "ib0:10.1.0.1"
        );
        assert_eq!(
            name_ip(choose_interface(&list, Some("^eth,lo"), None)).unwrap(),
            "docker0:172.17.0.1"
        );
        assert_eq!(name_ip(choose_interface(&list, Some("=eth"), None)), None);
        assert_eq!(
            name_ip(choose_interface(&list, Some("=lo,=eth1"), None)).unwrap(),
            "lo:127.0.0.1"
        );
        assert_eq!(
            name_ip(choose_interface(&list, Some("eth0"), None)),
            None,
            "eth0 is down"
        );
        let only_lo = vec![ifa("lo", "127.0.0.1", true), ifa("lo", "::1", true)];
        assert_eq!(
            name_ip(choose_interface(&only_lo, None, None)).unwrap(),
            "lo:127.0.0.1"
        );
        assert_eq!(
            name_ip(choose_interface(&only_lo, None, Some(true))).unwrap(),
            "lo:::1"
        );
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
            ifa("ib0", "10.1.0.1", true),
        ];
        let names = |v: Vec<NetIf>| -> Vec<String> {
            v.iter().map(|n| format!("{}:{}", n.name, n.ip)).collect()
        };
        assert_eq!(
            names(choose_interfaces(&list, None, None, 16)),
            ["eth0:10.0.0.1", "eth1:10.0.1.1", "ib0:10.1.0.1"]
        );
        assert_eq!(names(choose_interfaces(&list, None, None, 2)).len(), 2);
        assert_eq!(
            names(choose_interfaces(&list, Some("eth"), None, 16)),
            ["eth0:10.0.0.1", "eth1:10.0.1.1"]
        );
        assert_eq!(
            names(choose_interfaces(&list, Some("^eth,ib"), None, 16)),
            ["lo:127.0.0.1", "docker0:172.17.0.1"]
        );
        let only = vec![
            ifa("lo", "127.0.0.1", true),
            ifa("docker0", "172.17.0.1", true),
        ];
        assert_eq!(
            names(choose_interfaces(&only, None, None, 16)),
            ["docker0:172.17.0.1"]
        );
        assert!(choose_interfaces(&list, Some("=eth"), None, 16).is_empty());
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
