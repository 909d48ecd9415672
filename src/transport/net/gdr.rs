//! Whether a network connection's receiving side puts its slots in GPU memory, written by the
//! network directly (GPUDirect RDMA), by NVIDIA's rules: the net device takes CUDA pointers
//! (`NCCL_PTR_CUDA`), the GPU supports GPUDirect RDMA, and the PCI distance between the GPU
//! and the NIC is within `NCCL_NET_GDR_LEVEL` (default `PXB`: the two under one PCIe switch
//! hierarchy). A NIC without a PCI path (the socket network, a test plugin) is at `SYS`.
//! Sending sides stage in host memory (as NVIDIA's with `NCCL_NET_GDR_READ=0`); see
//! docs/gdr.md.

use super::api::{Properties, PTR_CUDA};
use crate::topo::parse_p2p_level;

/// `NCCL_NET_GDR_LEVEL`'s levels, as `NCCL_P2P_LEVEL`'s (`topo::parse_p2p_level`).
const PIX: i64 = 2;
const PXB: i64 = 3;
const PHB: i64 = 4;
const SYS: i64 = 5;

/// The PCI distance between two devices from their sysfs paths (`/sys/devices/pci0000:00/
/// 0000:00:01.0/.../0000:19:00.0`), as NVIDIA's path types: `PIX` below one switch, `PXB`
/// below one root port through several, `PHB` through the host bridge of one NUMA node, `SYS`
/// across NUMA nodes or when a path is unknown.
pub fn pci_distance(gpu: &str, nic: &str, same_numa_node: bool) -> i64 {
    let parts = |p: &str| -> Vec<String> {
        p.split('/')
            .filter(|c| !c.is_empty())
            .map(str::to_ascii_lowercase)
            .collect()
    };
    let (g, n) = (parts(gpu), parts(nic));
    // The root complex ("pci0000:15"), then the bridges, then the device itself.
    let root = |p: &[String]| p.iter().position(|c| c.starts_with("pci"));
    let (Some(gr), Some(nr)) = (root(&g), root(&n)) else {
        return SYS;
    };
    if g.len() < gr + 2 || n.len() < nr + 2 {
        return SYS;
    }
    if g[gr] != n[nr] {
        return if same_numa_node { PHB } else { SYS };
    }
    let (gb, nb) = (&g[gr + 1..g.len() - 1], &n[nr + 1..n.len() - 1]);
    let shared = gb.iter().zip(nb).take_while(|(a, b)| a == b).count();
    if shared == 0 {
        PHB
    } else if shared + 1 >= gb.len() && shared + 1 >= nb.len() {
        // One switch: they part at its downstream ports at most.
        PIX
    } else {
        PXB
    }
}

/// Whether receiving sides on a net device with `props` use GPU memory, for a GPU that
/// `supports_gdr` at PCI `distance` from the NIC, with `NCCL_NET_GDR_LEVEL` = `level` (None:
/// unset).
pub fn receives_into_gpu(
    props: &Properties,
    supports_gdr: bool,
    distance: i64,
    level: Option<&str>,
) -> bool {
    let allowed = level.and_then(parse_p2p_level).unwrap_or(PXB);
    props.ptr_support & PTR_CUDA != 0 && supports_gdr && distance <= allowed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::net::api::PTR_HOST;

    #[test]
    fn distances_from_sysfs_paths() {
        let gpu = "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0";
        // The NIC behind the same switch port as the GPU.
        let nic = "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:04.0/0000:1a:00.0";
        assert_eq!(pci_distance(gpu, nic, true), PIX);
        // Below the same root port through another switch.
        let deeper = "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:08.0/0000:20:00.0/0000:21:00.0/0000:22:00.0";
        assert_eq!(pci_distance(gpu, deeper, true), PXB);
        // Another root port of the same root complex.
        let other_port = "/sys/devices/pci0000:15/0000:15:02.0/0000:30:00.0";
        assert_eq!(pci_distance(gpu, other_port, true), PHB);
        // Another root complex: PHB on the same NUMA node, else SYS.
        let other_root = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0";
        assert_eq!(pci_distance(gpu, other_root, true), PHB);
        assert_eq!(pci_distance(gpu, other_root, false), SYS);
        // No PCI path (sockets, test plugins).
        assert_eq!(pci_distance(gpu, "", true), SYS);
        assert_eq!(pci_distance("", nic, true), SYS);
    }

    #[test]
    fn nvidias_rules() {
        let mut p = Properties {
            name: "mlx5_0".into(),
            pci_path: String::new(),
            guid: 0,
            ptr_support: PTR_HOST | PTR_CUDA,
            reg_is_global: false,
            speed_mbps: 400_000,
            port: 1,
            latency_us: 0.0,
            max_comms: 65536,
            max_recvs: 1,
            max_p2p_bytes: 1 << 30,
        };
        assert!(receives_into_gpu(&p, true, PXB, None));
        assert!(receives_into_gpu(&p, true, PIX, Some("PXB")));
        // Too far for the default, allowed when the level says so.
        assert!(!receives_into_gpu(&p, true, PHB, None));
        assert!(receives_into_gpu(&p, true, SYS, Some("SYS")));
        assert!(!receives_into_gpu(&p, true, SYS, Some("PHB")));
        assert!(!receives_into_gpu(&p, true, PXB, Some("LOC")));
        // A GPU without GPUDirect RDMA, or a device without CUDA pointers.
        assert!(!receives_into_gpu(&p, false, PIX, Some("SYS")));
        p.ptr_support = PTR_HOST;
        assert!(!receives_into_gpu(&p, true, PIX, Some("SYS")));
    }
}
