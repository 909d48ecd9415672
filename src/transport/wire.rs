//! The setup message one side of a connection sends the other: where its half lives.

use crate::error::{Error, Result};

/// How the peer can reach a block of memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// A device address valid in the peer's process too (same process).
    Pointer(u64),
    /// A CUDA IPC handle of device memory in another process.
    Ipc([u8; 64]),
    /// A /dev/shm segment of host memory.
    Shm { name: String, bytes: u64 },
    /// A network side: a receiver's handle to connect to (a sender's is all zero).
    Net(Box<[u8; 128]>),
}

/// This rank's half of a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Half {
    /// The block's address on this rank's GPU (not sent).
    pub local_base: u64,
    pub placement: Placement,
}

impl Half {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        match &self.placement {
            Placement::Pointer(p) => {
                v.push(0);
                v.extend_from_slice(&p.to_le_bytes());
            }
            Placement::Ipc(h) => {
                v.push(1);
                v.extend_from_slice(h);
            }
            Placement::Shm { name, bytes } => {
                v.push(2);
                v.extend_from_slice(&bytes.to_le_bytes());
                v.extend_from_slice(name.as_bytes());
            }
            Placement::Net(h) => {
                v.push(3);
                v.extend_from_slice(&h[..]);
            }
        }
        v
    }

    /// Decode a peer's message (`local_base` is 0: it is the peer's address space).
    pub fn decode(b: &[u8]) -> Result<Half> {
        let bad = || {
            Error::internal(format!(
                "malformed connection setup message of {} bytes",
                b.len()
            ))
        };
        let (&kind, rest) = b.split_first().ok_or_else(bad)?;
        let placement = match kind {
            0 if rest.len() == 8 => {
                Placement::Pointer(u64::from_le_bytes(rest.try_into().unwrap()))
            }
            1 if rest.len() == 64 => Placement::Ipc(rest.try_into().unwrap()),
            2 if rest.len() > 8 => Placement::Shm {
                bytes: u64::from_le_bytes(rest[..8].try_into().unwrap()),
                name: String::from_utf8(rest[8..].to_vec()).map_err(|_| bad())?,
            },
            3 if rest.len() == 128 => Placement::Net(Box::new(rest.try_into().unwrap())),
            _ => return Err(bad()),
        };
        Ok(Half {
            local_base: 0,
            placement,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for placement in [
            Placement::Pointer(0x7f00_1234_5000),
            Placement::Ipc([7u8; 64]),
            Placement::Shm {
                name: "oxccl-abc-1-0-1-3-r".into(),
                bytes: 4 << 20,
            },
            Placement::Net(Box::new([5u8; 128])),
        ] {
            let h = Half {
                local_base: 99,
                placement,
            };
            let d = Half::decode(&h.encode()).unwrap();
            assert_eq!(d.placement, h.placement);
            assert_eq!(d.local_base, 0);
        }
        assert!(Half::decode(&[]).is_err());
        assert!(Half::decode(&[0, 1, 2]).is_err());
        assert!(Half::decode(&[9; 9]).is_err());
    }
}
