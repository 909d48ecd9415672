//! Passing a file descriptor to processes of the same host: the owner listens on an abstract
//! Unix socket (no file in the file system; gone with the process) and sends the descriptor
//! to each peer that connects (`SCM_RIGHTS`); a peer connects by name and receives it. Used to
//! share memory that has no CUDA IPC handle (`ncclMemAlloc`'s, exported as a POSIX fd).
//! Every wait is bounded by a deadline.

use crate::error::{Error, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// A listening abstract socket that hands out one descriptor.
pub struct FdServer {
    sock: OwnedFd,
    name: String,
}

fn sys_err(what: &str) -> Error {
    Error::system(format!("{what}: {}", std::io::Error::last_os_error()))
}

/// The abstract socket address for `name` (a leading NUL byte, then the name).
fn address(name: &str) -> Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = name.as_bytes();
    if bytes.len() + 1 > addr.sun_path.len() {
        return Err(Error::internal(format!("socket name {name} is too long")));
    }
    for (i, &b) in bytes.iter().enumerate() {
        addr.sun_path[i + 1] = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + bytes.len();
    Ok((addr, len as libc::socklen_t))
}

fn unix_socket() -> Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(sys_err("socket(AF_UNIX)"));
    }
    // SAFETY: fd is a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl FdServer {
    /// Listen on the abstract socket `name`.
    pub fn listen(name: &str) -> Result<FdServer> {
        let sock = unix_socket()?;
        let (addr, len) = address(name)?;
        // SAFETY: addr/len describe a valid sockaddr_un; sock is a Unix stream socket.
        if unsafe {
            libc::bind(
                sock.as_raw_fd(),
                &addr as *const _ as *const libc::sockaddr,
                len,
            )
        } != 0
        {
            return Err(sys_err(&format!("bind(@{name})")));
        }
        // SAFETY: sock is bound.
        if unsafe { libc::listen(sock.as_raw_fd(), 64) } != 0 {
            return Err(sys_err(&format!("listen(@{name})")));
        }
        Ok(FdServer {
            sock,
            name: name.to_string(),
        })
    }

    /// Send `fd` to `count` connecting peers, within `limit`.
    pub fn serve(&self, fd: RawFd, count: usize, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        for _ in 0..count {
            wait_readable(self.sock.as_raw_fd(), deadline, &self.name)?;
            // SAFETY: accepts one connection on a listening socket; the result is checked.
            let conn = unsafe {
                libc::accept4(
                    self.sock.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if conn < 0 {
                return Err(sys_err(&format!("accept(@{})", self.name)));
            }
            // SAFETY: conn is a new descriptor owned here.
            let conn = unsafe { OwnedFd::from_raw_fd(conn) };
            send_fd(conn.as_raw_fd(), fd)?;
        }
        Ok(())
    }
}

/// Wait until `fd` is readable, or fail at `deadline`.
fn wait_readable(fd: RawFd, deadline: Instant, name: &str) -> Result<()> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::system(format!(
                "socket @{name}: no peer came for the memory handle in time"
            )));
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(100) as i32) };
        if n > 0 {
            return Ok(());
        }
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Err(sys_err("poll"));
        }
    }
}

/// A one-byte message with room for one descriptor: its buffers, and the header pointing at
/// them (valid while the buffers live and do not move: the caller keeps `Message` in place).
struct Message {
    byte: [u8; 1],
    iov: libc::iovec,
    control: Vec<u8>,
    msg: libc::msghdr,
}

impl Message {
    fn new() -> Box<Message> {
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        // SAFETY: iovec and msghdr are plain data; all zero is valid until filled in below.
        let mut m = Box::new(Message {
            byte: [0],
            iov: unsafe { std::mem::zeroed() },
            control: vec![0u8; space],
            msg: unsafe { std::mem::zeroed() },
        });
        m.iov.iov_base = m.byte.as_mut_ptr() as *mut libc::c_void;
        m.iov.iov_len = 1;
        m.msg.msg_iov = &mut m.iov;
        m.msg.msg_iovlen = 1;
        m.msg.msg_control = m.control.as_mut_ptr() as *mut libc::c_void;
        m.msg.msg_controllen = space as _;
        m
    }
}

fn send_fd(conn: RawFd, fd: RawFd) -> Result<()> {
    let m = Message::new();
    let msg = &m.msg;
    // SAFETY: the control buffer holds one cmsg with room for one descriptor.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut RawFd, fd);
    }
    // SAFETY: msg describes live buffers; conn is a connected socket.
    if unsafe { libc::sendmsg(conn, msg, libc::MSG_NOSIGNAL) } != 1 {
        return Err(sys_err("sendmsg(SCM_RIGHTS)"));
    }
    Ok(())
}

/// Connect to the abstract socket `name` (retrying until it listens) and receive its
/// descriptor, within `limit`.
pub fn receive(name: &str, limit: Duration) -> Result<OwnedFd> {
    let deadline = Instant::now() + limit;
    let (addr, len) = address(name)?;
    let sock = loop {
        let sock = unix_socket()?;
        // SAFETY: addr/len describe a valid sockaddr_un.
        if unsafe {
            libc::connect(
                sock.as_raw_fd(),
                &addr as *const _ as *const libc::sockaddr,
                len,
            )
        } == 0
        {
            break sock;
        }
        if Instant::now() >= deadline {
            return Err(sys_err(&format!("connect(@{name})")));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    wait_readable(sock.as_raw_fd(), deadline, name)?;
    let mut m = Message::new();
    let msg = &mut m.msg;
    // SAFETY: msg describes live buffers; sock is connected.
    if unsafe { libc::recvmsg(sock.as_raw_fd(), msg, libc::MSG_CMSG_CLOEXEC) } != 1 {
        return Err(sys_err(&format!("recvmsg(@{name})")));
    }
    // SAFETY: msg was filled by recvmsg; a SCM_RIGHTS message carries one descriptor.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(msg);
        if cmsg.is_null() || (*cmsg).cmsg_type != libc::SCM_RIGHTS {
            return Err(Error::system(format!("@{name} sent no descriptor")));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const RawFd);
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_reaches_two_peers() {
        let name = format!("oxccl-test-fdpass-{}", std::process::id());
        let server = FdServer::listen(&name).unwrap();
        let (r, w) = std::os::unix::net::UnixStream::pair().unwrap();
        let served = std::thread::spawn({
            let fd = w.as_raw_fd();
            move || server.serve(fd, 2, Duration::from_secs(10))
        });
        for _ in 0..2 {
            let got = receive(&name, Duration::from_secs(10)).unwrap();
            // The received descriptor is the same socket end: a write through it reaches `r`.
            let n =
                unsafe { libc::write(got.as_raw_fd(), b"x".as_ptr() as *const libc::c_void, 1) };
            assert_eq!(n, 1);
        }
        served.join().unwrap().unwrap();
        let mut buf = [0u8; 2];
        use std::io::Read;
        (&r).read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"xx");
        drop(w);
    }

    #[test]
    fn nobody_listening_ends_in_time() {
        let t = Instant::now();
        assert!(receive("oxccl-test-nobody-listens", Duration::from_millis(200)).is_err());
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
