//! Node topology: what each rank is (host, process, GPU and its PCI bus id), which ranks share
//! a host, which pairs can reach each other's memory and over what (NVLink with its link count,
//! or PCIe), as the scheduler and transports need it. NVML is opened at run time when present
//! (see `nvml`); `NCCL_P2P_DISABLE`, `NCCL_SHM_DISABLE` and `NCCL_P2P_LEVEL` are honoured.

pub mod nvml;

use crate::error::{Error, Result};

/// What one rank tells the others at init.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    pub rank: i32,
    /// Identifies the host (host name and boot id, or `NCCL_HOSTID`).
    pub host_hash: u64,
    pub pid: u32,
    /// Device ordinal in the peer's own process.
    pub cuda_dev: i32,
    /// PCI bus id, lower case, e.g. `0000:19:00.0`.
    pub bus_id: String,
    /// NVLink links active on this GPU (0 without NVML or NVLink).
    pub nvlinks: u32,
}

const BUS_ID_BYTES: usize = 32;
/// Size of a serialised `PeerInfo`.
pub const PEER_INFO_BYTES: usize = 4 + 8 + 4 + 4 + 4 + BUS_ID_BYTES;

impl PeerInfo {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(PEER_INFO_BYTES);
        v.extend_from_slice(&self.rank.to_le_bytes());
        v.extend_from_slice(&self.host_hash.to_le_bytes());
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&self.cuda_dev.to_le_bytes());
        v.extend_from_slice(&self.nvlinks.to_le_bytes());
        let mut bus = [0u8; BUS_ID_BYTES];
        let b = self.bus_id.as_bytes();
        bus[..b.len().min(BUS_ID_BYTES)].copy_from_slice(&b[..b.len().min(BUS_ID_BYTES)]);
        v.extend_from_slice(&bus);
        v
    }

    pub fn from_bytes(b: &[u8]) -> Result<PeerInfo> {
        if b.len() != PEER_INFO_BYTES {
            return Err(Error::internal(format!(
                "peer info of {} bytes, expected {PEER_INFO_BYTES}",
                b.len()
            )));
        }
        let i32_at = |o: usize| i32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let bus = &b[24..24 + BUS_ID_BYTES];
        let end = bus.iter().position(|&c| c == 0).unwrap_or(BUS_ID_BYTES);
        Ok(PeerInfo {
            rank: i32_at(0),
            host_hash: u64::from_le_bytes(b[4..12].try_into().unwrap()),
            pid: u32_at(12),
            cuda_dev: i32_at(16),
            nvlinks: u32_at(20),
            bus_id: String::from_utf8_lossy(&bus[..end]).into_owned(),
        })
    }
}

/// A stable hash of this host: `NCCL_HOSTID` if set, else host name plus boot id.
pub fn host_hash() -> u64 {
    let id = crate::env::get("NCCL_HOSTID").unwrap_or_else(|| {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        format!("{}{}", crate::debug::hostname(), boot.trim())
    });
    fnv1a(id.as_bytes())
}

/// FNV-1a, 64 bits: small, stable across processes and builds.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// How two ranks' GPUs reach each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Direct loads and stores over NVLink (`links` active links on the slower side).
    NvLink { links: u32 },
    /// Peer-to-peer over PCIe.
    Pcie,
    /// No peer access: through host shared memory.
    Shm,
    /// Different hosts.
    Net,
}

impl Path {
    /// Bandwidth estimate in GB/s per direction, for the scheduler's cost model.
    pub fn bandwidth_gbs(self) -> f64 {
        match self {
            // NVLink 4: about 25 GB/s per link per direction.
            Path::NvLink { links } => 25.0 * links.max(1) as f64,
            Path::Pcie => 24.0,
            Path::Shm => 12.0,
            Path::Net => 12.0,
        }
    }
    /// NCCL_P2P_LEVEL rank of this path: LOC 0, NVL 1, PIX 2, PXB 3, PHB 4, SYS 5.
    fn level(self) -> i64 {
        match self {
            Path::NvLink { .. } => 1,
            Path::Pcie => 3,
            Path::Shm | Path::Net => 5,
        }
    }
}

/// Parse `NCCL_P2P_LEVEL` (name or number).
pub fn parse_p2p_level(v: &str) -> Option<i64> {
    match v.trim().to_ascii_uppercase().as_str() {
        "LOC" => Some(0),
        "NVL" => Some(1),
        "PIX" => Some(2),
        "PXB" => Some(3),
        "PHB" => Some(4),
        "SYS" => Some(5),
        other => crate::env::parse_int(other),
    }
}

/// The node as this rank sees it.
#[derive(Clone, Debug)]
pub struct Topology {
    pub peers: Vec<PeerInfo>,
    /// Ranks on this rank's host, in rank order.
    pub local_ranks: Vec<i32>,
    pub my_rank: i32,
    /// Path from this rank to every rank.
    pub paths: Vec<Path>,
}

/// Whether this rank (device `my_dev`, this process) can map memory of `peer`'s GPU.
/// `can_access(dev, peer_dev)` answers for two device ordinals of this process.
fn peer_path(
    me: &PeerInfo,
    peer: &PeerInfo,
    my_dev_of: impl Fn(&str) -> Option<i32>,
    can_access: impl Fn(i32, i32) -> bool,
) -> Path {
    if peer.host_hash != me.host_hash {
        return Path::Net;
    }
    if peer.rank == me.rank {
        return Path::NvLink {
            links: me.nvlinks.max(1),
        };
    }
    let p2p = match my_dev_of(&peer.bus_id) {
        Some(peer_dev) => can_access(me.cuda_dev, peer_dev),
        None => false,
    };
    if !p2p {
        Path::Shm
    } else if me.nvlinks > 0 && peer.nvlinks > 0 {
        Path::NvLink {
            links: me.nvlinks.min(peer.nvlinks),
        }
    } else {
        Path::Pcie
    }
}

impl Topology {
    /// Build from every rank's info. Fails with `ncclInvalidUsage` when two ranks share a GPU.
    pub fn new(
        peers: Vec<PeerInfo>,
        my_rank: i32,
        my_dev_of: impl Fn(&str) -> Option<i32>,
        can_access: impl Fn(i32, i32) -> bool,
    ) -> Result<Topology> {
        let me = peers[my_rank as usize].clone();
        for (i, a) in peers.iter().enumerate() {
            for b in &peers[i + 1..] {
                if a.host_hash == b.host_hash && a.bus_id == b.bus_id {
                    return Err(Error::invalid_usage(format!(
                        "Duplicate GPU detected : rank {} and rank {} both on CUDA device {} (bus id {})",
                        a.rank, b.rank, a.cuda_dev, a.bus_id
                    )));
                }
            }
        }
        let local_ranks = peers
            .iter()
            .filter(|p| p.host_hash == me.host_hash)
            .map(|p| p.rank)
            .collect();
        let p2p_disabled = crate::env::flag("NCCL_P2P_DISABLE", false);
        let p2p_level = crate::env::get("NCCL_P2P_LEVEL").and_then(|v| parse_p2p_level(&v));
        let paths = peers
            .iter()
            .map(|p| {
                let path = peer_path(&me, p, &my_dev_of, &can_access);
                let allowed = match path {
                    Path::NvLink { .. } | Path::Pcie => {
                        !p2p_disabled && p2p_level.is_none_or(|l| path.level() <= l)
                    }
                    _ => true,
                };
                if allowed || p.rank == me.rank {
                    path
                } else {
                    Path::Shm
                }
            })
            .collect();
        Ok(Topology {
            peers,
            local_ranks,
            my_rank,
            paths,
        })
    }

    /// This rank's index among its host's ranks.
    pub fn local_rank(&self) -> i32 {
        self.local_ranks
            .iter()
            .position(|&r| r == self.my_rank)
            .unwrap_or(0) as i32
    }

    /// Whether `peer` runs in this process.
    pub fn same_process(&self, peer: i32) -> bool {
        let me = &self.peers[self.my_rank as usize];
        let p = &self.peers[peer as usize];
        p.host_hash == me.host_hash && p.pid == me.pid
    }

    /// Log the topology under NCCL_DEBUG=INFO (subsystem GRAPH).
    pub fn log(&self) {
        let me = &self.peers[self.my_rank as usize];
        crate::info!(
            INIT,
            "Rank {} : device {} busId {} nvlinks {} localRanks {} of {}",
            me.rank,
            me.cuda_dev,
            me.bus_id,
            me.nvlinks,
            self.local_rank(),
            self.local_ranks.len()
        );
        for (r, path) in self.paths.iter().enumerate() {
            if r as i32 != self.my_rank {
                crate::info!(
                    GRAPH,
                    "Path rank {} -> rank {} : {:?} ({} GB/s)",
                    self.my_rank,
                    r,
                    path,
                    path.bandwidth_gbs()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(rank: i32, host: u64, dev: i32, links: u32) -> PeerInfo {
        PeerInfo {
            rank,
            host_hash: host,
            pid: 7,
            cuda_dev: dev,
            bus_id: format!("0000:{:02x}:00.0", dev + 1),
            nvlinks: links,
        }
    }

    #[test]
    fn peer_info_round_trip() {
        let p = peer(3, 0xdead_beef, 2, 18);
        assert_eq!(PeerInfo::from_bytes(&p.to_bytes()).unwrap(), p);
        assert!(PeerInfo::from_bytes(&[0u8; 3]).is_err());
    }

    #[test]
    fn duplicate_gpu_is_invalid_usage() {
        let peers = vec![peer(0, 1, 0, 0), peer(1, 1, 0, 0)];
        let e = Topology::new(peers, 0, |_| Some(0), |_, _| true).unwrap_err();
        assert_eq!(e.code, crate::abi::ncclResult_t::ncclInvalidUsage);
        // Same device number on another host is fine.
        let peers = vec![peer(0, 1, 0, 0), peer(1, 2, 0, 0)];
        assert!(Topology::new(peers, 0, |_| Some(0), |_, _| true).is_ok());
    }

    #[test]
    fn paths_and_local_ranks() {
        let peers = vec![
            peer(0, 1, 0, 18),
            peer(1, 1, 1, 18),
            peer(2, 2, 0, 18),
            peer(3, 1, 2, 0),
        ];
        let dev_of = |bus: &str| Some(i32::from_str_radix(&bus[5..7], 16).unwrap() - 1);
        let t = Topology::new(peers, 0, dev_of, |_, _| true).unwrap();
        assert_eq!(t.local_ranks, vec![0, 1, 3]);
        assert_eq!(t.paths[1], Path::NvLink { links: 18 });
        assert_eq!(t.paths[2], Path::Net);
        assert_eq!(t.paths[3], Path::Pcie);
        let t = Topology::new(t.peers.clone(), 0, dev_of, |_, _| false).unwrap();
        assert_eq!(t.paths[1], Path::Shm);
    }

    #[test]
    fn p2p_levels() {
        assert_eq!(parse_p2p_level("nvl"), Some(1));
        assert_eq!(parse_p2p_level("SYS"), Some(5));
        assert_eq!(parse_p2p_level("3"), Some(3));
        assert_eq!(parse_p2p_level("bogus"), None);
    }
}
