//! Node topology: what each rank is (host, process, GPU and its PCI bus id), which ranks share
//! a host or a GPU, which pairs can reach each other's memory and over what (the same GPU,
//! NVLink with its link count, or PCIe), as the scheduler and transports need it. NVML is
//! opened at run time when present (see `nvml`).
//!
//! The transport between two ranks is the first one allowed of: peer-to-peer (same GPU,
//! NVLink, PCIe; off with `NCCL_P2P_DISABLE=1` or above `NCCL_P2P_LEVEL`), host shared memory
//! (off with `NCCL_SHM_DISABLE=1`), the network — also between ranks of one host, as in
//! NVIDIA's library. Ranks of one communicator may share a GPU only with
//! `NCCL_MULTI_RANK_GPU_ENABLE=1` (NVIDIA's variable since 2.30); otherwise `ncclInvalidUsage`
//! with NVIDIA 2.32's words ("Multiple Ranks are using the same GPU/Partition ...").

pub mod affinity;
pub mod dump;
pub mod file;
pub mod nics;
pub mod nvml;
pub mod pci;
pub mod xml;

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
    /// The host's name (for messages that name a rank), at most `HOST_BYTES` bytes.
    pub host: String,
    /// The GPU's UUID (all zero when unknown): the same physical GPU whatever the host id
    /// says.
    pub gpu_uuid: [u8; 16],
}

const BUS_ID_BYTES: usize = 32;
const HOST_BYTES: usize = 64;
/// Size of a serialised `PeerInfo`.
pub const PEER_INFO_BYTES: usize = 4 + 8 + 4 + 4 + 4 + BUS_ID_BYTES + HOST_BYTES + 16;

/// `text` in a NUL-padded field of `N` bytes (cut at a character boundary).
fn padded<const N: usize>(text: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let mut end = text.len().min(N);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    out[..end].copy_from_slice(&text.as_bytes()[..end]);
    out
}

/// The text of a NUL-padded field.
fn unpadded(field: &[u8]) -> String {
    let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

impl PeerInfo {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(PEER_INFO_BYTES);
        v.extend_from_slice(&self.rank.to_le_bytes());
        v.extend_from_slice(&self.host_hash.to_le_bytes());
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&self.cuda_dev.to_le_bytes());
        v.extend_from_slice(&self.nvlinks.to_le_bytes());
        v.extend_from_slice(&padded::<BUS_ID_BYTES>(&self.bus_id));
        v.extend_from_slice(&padded::<HOST_BYTES>(&self.host));
        v.extend_from_slice(&self.gpu_uuid);
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
        let host_at = 24 + BUS_ID_BYTES;
        Ok(PeerInfo {
            rank: i32_at(0),
            host_hash: u64::from_le_bytes(b[4..12].try_into().unwrap()),
            pid: u32_at(12),
            cuda_dev: i32_at(16),
            nvlinks: u32_at(20),
            bus_id: unpadded(&b[24..host_at]),
            host: unpadded(&b[host_at..host_at + HOST_BYTES]),
            gpu_uuid: b[host_at + HOST_BYTES..].try_into().unwrap(),
        })
    }
}

/// A stable hash of this host: `NCCL_HOSTID` if set, else host name plus boot id.
pub fn host_hash() -> u64 {
    let id = crate::env::registry::HOSTID.get().unwrap_or_else(|| {
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
    /// Both ranks use the same GPU (`NCCL_MULTI_RANK_GPU_ENABLE=1`): its own memory.
    SameGpu,
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
            // A copy within one H200 moves about 1.5 TB/s.
            Path::SameGpu => 1500.0,
            // NVLink 4: about 25 GB/s per link per direction.
            Path::NvLink { links } => 25.0 * links.max(1) as f64,
            Path::Pcie => 24.0,
            Path::Shm => 12.0,
            Path::Net => 12.0,
        }
    }
    /// The path's bandwidth in Mbit/s when it is within a node (None over the network): the
    /// cap an in-node hop puts on the channels that share it (`sched::weights`).
    pub fn in_node_mbps(self) -> Option<u32> {
        (self != Path::Net).then(|| (self.bandwidth_gbs() * 8000.0).min(u32::MAX as f64) as u32)
    }

    /// NCCL_P2P_LEVEL rank of this path: LOC 0, NVL 1, PIX 2, PXB 3, PHB 4, SYS 5.
    fn level(self) -> i64 {
        match self {
            Path::SameGpu => 0,
            Path::NvLink { .. } => 1,
            Path::Pcie => 3,
            Path::Shm | Path::Net => 5,
        }
    }
}

impl Path {
    /// Whether this is a peer-to-peer path (the peer's GPU memory is mapped directly).
    pub fn is_p2p(self) -> bool {
        matches!(self, Path::SameGpu | Path::NvLink { .. } | Path::Pcie)
    }
}

/// Whether two ranks use the same GPU (same host and PCI bus id).
pub fn same_gpu(a: &PeerInfo, b: &PeerInfo) -> bool {
    a.host_hash == b.host_hash && a.bus_id == b.bus_id
}

/// The first pair of ranks on one GPU, if any.
fn first_shared_gpu(peers: &[PeerInfo]) -> Option<(&PeerInfo, &PeerInfo)> {
    peers.iter().enumerate().find_map(|(i, a)| {
        peers[i + 1..]
            .iter()
            .find(|b| same_gpu(a, b))
            .map(|b| (a, b))
    })
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
    if peer.rank == me.rank || peer.bus_id == me.bus_id {
        return Path::SameGpu;
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

/// Which transports the environment allows between ranks of one host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allowed {
    pub p2p: bool,
    /// Highest `NCCL_P2P_LEVEL` allowed for peer-to-peer (None: any).
    pub p2p_level: Option<i64>,
    pub shm: bool,
}

impl Allowed {
    /// `NCCL_P2P_DISABLE`, `NCCL_P2P_LEVEL` and `NCCL_SHM_DISABLE`.
    pub fn from_env() -> Allowed {
        Allowed {
            p2p: !crate::env::registry::P2P_DISABLE.flag(),
            p2p_level: crate::env::registry::P2P_LEVEL
                .get()
                .and_then(|v| parse_p2p_level(&v)),
            shm: !crate::env::registry::SHM_DISABLE.flag(),
        }
    }

    /// The path that carries data over `reachable` (what the hardware offers): that path if
    /// it is peer-to-peer and allowed, else host shared memory if allowed, else the network.
    pub fn choose(self, reachable: Path) -> Path {
        if reachable == Path::Net {
            return Path::Net;
        }
        let p2p_ok =
            reachable.is_p2p() && self.p2p && self.p2p_level.is_none_or(|l| reachable.level() <= l);
        if p2p_ok {
            reachable
        } else if self.shm {
            Path::Shm
        } else {
            Path::Net
        }
    }
}

/// Whether the CUDA MPS daemon of this host is running (its control pipe exists in
/// `CUDA_MPS_PIPE_DIRECTORY`, default `/tmp/nvidia-mps`): then kernels of processes sharing
/// a GPU run side by side instead of time-slicing.
pub fn mps_active() -> bool {
    let dir = std::env::var("CUDA_MPS_PIPE_DIRECTORY").unwrap_or_else(|_| "/tmp/nvidia-mps".into());
    std::path::Path::new(&dir).join("control").exists()
}

/// What the environment lets a communicator do with the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// `NCCL_MULTI_RANK_GPU_ENABLE`: ranks of one communicator may share a GPU.
    pub multi_rank_gpu: bool,
    pub allowed: Allowed,
}

impl Policy {
    pub fn from_env() -> Policy {
        Policy {
            multi_rank_gpu: crate::env::registry::MULTI_RANK_GPU_ENABLE.flag(),
            allowed: Allowed::from_env(),
        }
    }
}

impl Topology {
    /// Build from every rank's info, under the environment's policy (`Policy::from_env`).
    /// Fails with `ncclInvalidUsage` when two ranks share a GPU and that is not enabled.
    pub fn new(
        peers: Vec<PeerInfo>,
        my_rank: i32,
        my_dev_of: impl Fn(&str) -> Option<i32>,
        can_access: impl Fn(i32, i32) -> bool,
    ) -> Result<Topology> {
        Topology::with_policy(peers, my_rank, my_dev_of, can_access, Policy::from_env())
    }

    /// `new` under an explicit policy.
    pub fn with_policy(
        peers: Vec<PeerInfo>,
        my_rank: i32,
        my_dev_of: impl Fn(&str) -> Option<i32>,
        can_access: impl Fn(i32, i32) -> bool,
        policy: Policy,
    ) -> Result<Topology> {
        let me = peers[my_rank as usize].clone();
        if !policy.multi_rank_gpu {
            if let Some((a, b)) = first_shared_gpu(&peers) {
                return Err(Error::invalid_usage(format!(
                    "Multiple Ranks are using the same GPU/Partition (rank {} and rank {} on \
                     CUDA device {}, bus id {}). Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable \
                     this configuration.",
                    a.rank, b.rank, a.cuda_dev, a.bus_id
                )));
            }
        }
        let local_ranks = peers
            .iter()
            .filter(|p| p.host_hash == me.host_hash)
            .map(|p| p.rank)
            .collect();
        let allowed = policy.allowed;
        let paths = peers
            .iter()
            .map(|p| {
                let reachable = peer_path(&me, p, &my_dev_of, &can_access);
                if p.rank == me.rank {
                    reachable
                } else {
                    allowed.choose(reachable)
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

    /// The ranks on this rank's GPU (this rank included), in rank order.
    pub fn gpu_ranks(&self) -> Vec<i32> {
        let me = &self.peers[self.my_rank as usize];
        self.peers
            .iter()
            .filter(|p| same_gpu(p, me))
            .map(|p| p.rank)
            .collect()
    }

    /// The most ranks any one GPU of the communicator carries (1 when no GPU is shared).
    pub fn max_ranks_per_gpu(&self) -> usize {
        self.peers
            .iter()
            .map(|a| self.peers.iter().filter(|b| same_gpu(a, b)).count())
            .max()
            .unwrap_or(1)
    }

    /// This rank's index among its host's ranks.
    pub fn local_rank(&self) -> i32 {
        self.local_ranks
            .iter()
            .position(|&r| r == self.my_rank)
            .unwrap_or(0) as i32
    }

    /// How many hosts the ranks are on (NVIDIA's `nNodes`).
    pub fn nnodes(&self) -> usize {
        let mut hosts: Vec<u64> = self.peers.iter().map(|p| p.host_hash).collect();
        hosts.sort_unstable();
        hosts.dedup();
        hosts.len()
    }

    /// Whether the communicator uses the network anywhere: its ranks span hosts, or this
    /// rank reaches a peer only over the network (P2P and SHM disallowed). Every rank
    /// answers alike (the hosts are common knowledge, the settings the job's), so every
    /// rank plans alike.
    pub fn uses_net(&self) -> bool {
        let me = self.peers[self.my_rank as usize].host_hash;
        self.peers.iter().any(|p| p.host_hash != me) || self.paths.contains(&Path::Net)
    }

    /// `[peer]`: the peer is another process on this rank's GPU (the same GPU UUID, another
    /// pid), so the GPU runs its kernels and this rank's in turns (time slices).
    pub fn time_sliced_peers(&self) -> Vec<bool> {
        let me = &self.peers[self.my_rank as usize];
        self.peers
            .iter()
            .map(|p| p.gpu_uuid != [0; 16] && p.gpu_uuid == me.gpu_uuid && p.pid != me.pid)
            .collect()
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

/// For tests: one host, one rank per GPU of `buses` (PCI bus ids), seen from rank `me`, each
/// GPU with `nvlinks` NVLinks; no peer access and no shared memory between the ranks.
#[cfg(test)]
pub(crate) fn one_host_for_tests(buses: &[&str], me: i32, nvlinks: u32) -> Topology {
    let peers = buses
        .iter()
        .enumerate()
        .map(|(r, b)| PeerInfo {
            rank: r as i32,
            host_hash: 1,
            pid: 7,
            cuda_dev: r as i32,
            bus_id: b.to_string(),
            nvlinks,
            host: "h".into(),
            gpu_uuid: [0; 16],
        })
        .collect();
    let policy = Policy {
        multi_rank_gpu: true,
        allowed: Allowed {
            p2p: false,
            p2p_level: None,
            shm: false,
        },
    };
    Topology::with_policy(peers, me, |_| None, |_, _| false, policy).expect("a test topology")
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
            host: format!("host{host}"),
            gpu_uuid: [0; 16],
        }
    }

    #[test]
    fn peer_info_round_trip() {
        let p = peer(3, 0xdead_beef, 2, 18);
        assert_eq!(PeerInfo::from_bytes(&p.to_bytes()).unwrap(), p);
        assert!(PeerInfo::from_bytes(&[0u8; 3]).is_err());
    }

    const ALL_ALLOWED: Allowed = Allowed {
        p2p: true,
        p2p_level: None,
        shm: true,
    };

    fn policy(multi_rank_gpu: bool, allowed: Allowed) -> Policy {
        Policy {
            multi_rank_gpu,
            allowed,
        }
    }

    #[test]
    fn duplicate_gpu_is_invalid_usage_unless_enabled() {
        let peers = vec![peer(0, 1, 0, 0), peer(1, 1, 0, 0)];
        let e = Topology::with_policy(
            peers.clone(),
            0,
            |_| Some(0),
            |_, _| true,
            policy(false, ALL_ALLOWED),
        )
        .unwrap_err();
        assert_eq!(e.code, crate::abi::ncclResult_t::ncclInvalidUsage);
        assert!(
            e.msg.contains("Multiple Ranks are using the same GPU"),
            "{}",
            e.msg
        );
        assert!(e.msg.contains("NCCL_MULTI_RANK_GPU_ENABLE"), "{}", e.msg);
        // Same device number on another host is fine.
        let other_host = vec![peer(0, 1, 0, 0), peer(1, 2, 0, 0)];
        let t = Topology::with_policy(
            other_host,
            0,
            |_| Some(0),
            |_, _| true,
            policy(false, ALL_ALLOWED),
        )
        .unwrap();
        assert_eq!(t.max_ranks_per_gpu(), 1);
        // Enabled: the two ranks share the GPU over its own memory.
        let t = Topology::with_policy(
            peers,
            0,
            |_| Some(0),
            |_, _| false,
            policy(true, ALL_ALLOWED),
        )
        .unwrap();
        assert_eq!(t.paths[1], Path::SameGpu);
        assert_eq!(t.gpu_ranks(), vec![0, 1]);
        assert_eq!(t.max_ranks_per_gpu(), 2);
    }

    #[test]
    fn transports_fall_back_p2p_then_shm_then_net() {
        // Ranks 0, 1, 2 on GPU 0, rank 3 on GPU 1 (NVLink), all on one host.
        let peers = vec![
            peer(0, 1, 0, 18),
            peer(1, 1, 0, 18),
            peer(2, 1, 0, 18),
            peer(3, 1, 1, 18),
        ];
        let dev_of = |bus: &str| Some(i32::from_str_radix(&bus[5..7], 16).unwrap() - 1);
        let topo = |allowed| {
            Topology::with_policy(peers.clone(), 0, dev_of, |_, _| true, policy(true, allowed))
                .unwrap()
        };
        let t = topo(ALL_ALLOWED);
        assert_eq!(t.paths[1], Path::SameGpu);
        assert_eq!(t.paths[3], Path::NvLink { links: 18 });
        assert_eq!(t.gpu_ranks(), vec![0, 1, 2]);
        assert_eq!(t.max_ranks_per_gpu(), 3);
        let no_p2p = Allowed {
            p2p: false,
            ..ALL_ALLOWED
        };
        assert_eq!(topo(no_p2p).paths[1], Path::Shm);
        assert_eq!(topo(no_p2p).paths[3], Path::Shm);
        let loc_only = Allowed {
            p2p_level: Some(0),
            ..ALL_ALLOWED
        };
        assert_eq!(topo(loc_only).paths[1], Path::SameGpu);
        assert_eq!(topo(loc_only).paths[3], Path::Shm);
        let neither = Allowed {
            p2p: false,
            p2p_level: None,
            shm: false,
        };
        assert_eq!(topo(neither).paths[1], Path::Net);
        assert_eq!(
            topo(neither).paths[0],
            Path::SameGpu,
            "a rank reaches itself"
        );
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
        let t = Topology::with_policy(peers, 0, dev_of, |_, _| true, policy(false, ALL_ALLOWED))
            .unwrap();
        assert_eq!(t.local_ranks, vec![0, 1, 3]);
        assert_eq!(t.paths[1], Path::NvLink { links: 18 });
        assert_eq!(t.paths[2], Path::Net);
        assert_eq!(t.paths[3], Path::Pcie);
        let t = Topology::with_policy(
            t.peers.clone(),
            0,
            dev_of,
            |_, _| false,
            policy(false, ALL_ALLOWED),
        )
        .unwrap();
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
