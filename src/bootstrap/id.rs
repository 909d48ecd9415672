//! The unique id: the 128 bytes of `ncclUniqueId` that carry everything a rank needs to join
//! a rendezvous (a magic, a 16-byte secret, the root's address and flags), the encoding of
//! socket addresses on the wire, secrets (random, or derived from `NCCL_COMM_ID`), and hex
//! text forms of an id.

use crate::abi::ncclUniqueId;
use crate::error::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, ToSocketAddrs};

/// Bytes of the shared secret every connection must present.
pub const SECRET_LEN: usize = 16;
/// Bytes of an encoded socket address.
pub const ADDR_LEN: usize = 28;

pub type Secret = [u8; SECRET_LEN];

const ID_MAGIC: &[u8; 8] = b"OXCCLID\x01";
const OFF_SECRET: usize = 8;
const OFF_ADDR: usize = OFF_SECRET + SECRET_LEN;
const OFF_FLAGS: usize = OFF_ADDR + ADDR_LEN;
/// Flag: no root listens yet; the first rank of this id's block starts it during init
/// (`NCCL_COMM_ID` mode).
const FLAG_ROOT_AT_INIT: u8 = 1;

/// The decoded contents of a unique id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdInfo {
    pub secret: Secret,
    pub root: SocketAddr,
    /// The root is started by a rank during init rather than by `get_unique_id`.
    pub root_at_init: bool,
}

impl IdInfo {
    pub fn encode(&self) -> ncclUniqueId {
        let mut bytes = [0u8; 128];
        bytes[..8].copy_from_slice(ID_MAGIC);
        bytes[OFF_SECRET..OFF_ADDR].copy_from_slice(&self.secret);
        bytes[OFF_ADDR..OFF_FLAGS].copy_from_slice(&encode_addr(&self.root));
        bytes[OFF_FLAGS] = if self.root_at_init {
            FLAG_ROOT_AT_INIT
        } else {
            0
        };
        ncclUniqueId {
            internal: bytes.map(|b| b as std::os::raw::c_char),
        }
    }

    pub fn decode(id: &ncclUniqueId) -> Result<IdInfo> {
        let bytes = id.internal.map(|c| c as u8);
        if &bytes[..8] != ID_MAGIC {
            return Err(Error::invalid_argument(
                "bootstrap: the unique id was not made by ncclGetUniqueId (bad magic)",
            ));
        }
        let mut secret = [0u8; SECRET_LEN];
        secret.copy_from_slice(&bytes[OFF_SECRET..OFF_ADDR]);
        let root = decode_addr(&bytes[OFF_ADDR..OFF_FLAGS]).ok_or_else(|| {
            Error::invalid_argument("bootstrap: the unique id holds no valid root address")
        })?;
        Ok(IdInfo {
            secret,
            root,
            root_at_init: bytes[OFF_FLAGS] & FLAG_ROOT_AT_INIT != 0,
        })
    }
}

/// Encode a socket address in `ADDR_LEN` bytes: family (4 or 6), port, ip, scope id, flow info.
pub fn encode_addr(addr: &SocketAddr) -> [u8; ADDR_LEN] {
    let mut out = [0u8; ADDR_LEN];
    out[2..4].copy_from_slice(&addr.port().to_be_bytes());
    match addr {
        SocketAddr::V4(a) => {
            out[0] = 4;
            out[4..8].copy_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            out[0] = 6;
            out[4..20].copy_from_slice(&a.ip().octets());
            out[20..24].copy_from_slice(&a.scope_id().to_be_bytes());
            out[24..28].copy_from_slice(&a.flowinfo().to_be_bytes());
        }
    }
    out
}

/// Decode `encode_addr`'s bytes; None if the family byte is unknown or the slice is short.
pub fn decode_addr(bytes: &[u8]) -> Option<SocketAddr> {
    if bytes.len() < ADDR_LEN {
        return None;
    }
    let port = u16::from_be_bytes([bytes[2], bytes[3]]);
    match bytes[0] {
        4 => {
            let ip = Ipv4Addr::new(bytes[4], bytes[5], bytes[6], bytes[7]);
            Some(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        }
        6 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&bytes[4..20]);
            let scope = u32::from_be_bytes(bytes[20..24].try_into().ok()?);
            let flow = u32::from_be_bytes(bytes[24..28].try_into().ok()?);
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(octets),
                port,
                flow,
                scope,
            )))
        }
        _ => None,
    }
}

/// A fresh random secret from the kernel (getrandom, falling back to /dev/urandom).
pub fn random_secret() -> Result<Secret> {
    let mut secret = [0u8; SECRET_LEN];
    let mut filled = 0;
    while filled < SECRET_LEN {
        let rest = &mut secret[filled..];
        // SAFETY: `rest` is a valid writable buffer of `rest.len()` bytes for the whole call.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n > 0 {
            filled += n as usize;
            continue;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        // getrandom unavailable: read /dev/urandom instead.
        use std::io::Read;
        let mut f = std::fs::File::open("/dev/urandom")
            .map_err(|e| Error::system(format!("bootstrap: cannot open /dev/urandom: {e}")))?;
        f.read_exact(&mut secret)
            .map_err(|e| Error::system(format!("bootstrap: cannot read /dev/urandom: {e}")))?;
        return Ok(secret);
    }
    Ok(secret)
}

/// The secret of an `NCCL_COMM_ID` rendezvous: every process derives the same one from the
/// variable's text (it only guards against stray connections, as NCCL's fixed magic does).
pub fn secret_from_text(text: &str) -> Secret {
    let mut secret = [0u8; SECRET_LEN];
    for (half, chunk) in secret.chunks_mut(8).enumerate() {
        // FNV-1a, seeded differently for each half.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ (half as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for b in b"oxccl-comm-id:".iter().chain(text.as_bytes()) {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        chunk.copy_from_slice(&h.to_le_bytes());
    }
    secret
}

/// Compare two secrets in time independent of where they differ.
pub fn secrets_equal(a: &[u8], b: &Secret) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Parse `NCCL_COMM_ID`: `ip:port`, `[ipv6]:port` or `host:port`.
pub fn parse_comm_id(text: &str) -> Result<SocketAddr> {
    let text = text.trim();
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let bad = |why: String| {
        Error::invalid_argument(format!("bootstrap: invalid NCCL_COMM_ID {text:?}: {why}"))
    };
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| bad("expected host:port".into()))?;
    let port: u16 = port
        .parse()
        .map_err(|_| bad(format!("bad port {port:?}")))?;
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let mut found = (host, port)
        .to_socket_addrs()
        .map_err(|e| bad(format!("cannot resolve {host:?}: {e}")))?;
    found
        .next()
        .ok_or_else(|| bad(format!("{host:?} resolves to no address")))
}

/// The id as 256 lowercase hex digits (to pass it between processes as text).
pub fn id_to_hex(id: &ncclUniqueId) -> String {
    id.internal
        .iter()
        .map(|c| format!("{:02x}", *c as u8))
        .collect()
}

/// Parse `id_to_hex`'s text.
pub fn id_from_hex(text: &str) -> Result<ncclUniqueId> {
    let text = text.trim();
    if text.len() != 256 || !text.is_ascii() {
        return Err(Error::invalid_argument(
            "bootstrap: a hex unique id has 256 hex digits",
        ));
    }
    let mut internal = [0 as std::os::raw::c_char; 128];
    for (i, slot) in internal.iter_mut().enumerate() {
        let byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
            .map_err(|_| Error::invalid_argument("bootstrap: bad hex digit in unique id"))?;
        *slot = byte as std::os::raw::c_char;
    }
    Ok(ncclUniqueId { internal })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_round_trips() {
        for root in ["10.1.2.3:4567", "[fd00::2]:80", "[fe80::1%3]:9"] {
            let info = IdInfo {
                secret: *b"0123456789abcdef",
                root: root.parse().unwrap(),
                root_at_init: root.starts_with('['),
            };
            let id = info.encode();
            assert_eq!(IdInfo::decode(&id).unwrap(), info);
            assert_eq!(id_from_hex(&id_to_hex(&id)).unwrap().internal, id.internal);
        }
        let zero = ncclUniqueId { internal: [0; 128] };
        assert!(IdInfo::decode(&zero).is_err());
    }

    #[test]
    fn comm_id_forms() {
        assert_eq!(
            parse_comm_id("1.2.3.4:5").unwrap(),
            "1.2.3.4:5".parse().unwrap()
        );
        assert_eq!(
            parse_comm_id("[::1]:77").unwrap(),
            "[::1]:77".parse().unwrap()
        );
        assert_eq!(parse_comm_id("localhost:99").unwrap().port(), 99);
        assert!(parse_comm_id("nonsense").is_err());
        assert!(parse_comm_id("1.2.3.4:notaport").is_err());
    }

    #[test]
    fn secrets() {
        let a = random_secret().unwrap();
        let b = random_secret().unwrap();
        assert_ne!(a, b);
        assert!(secrets_equal(&a, &a));
        assert!(!secrets_equal(&b, &a));
        assert!(!secrets_equal(&a[..8], &a));
        assert_eq!(secret_from_text("x:1"), secret_from_text("x:1"));
        assert_ne!(secret_from_text("x:1"), secret_from_text("x:2"));
    }
}
