//! Whether a network connection's side puts its slots in GPU memory, read or written by the
//! network directly (GPUDirect RDMA), by NVIDIA's rules: the net device takes CUDA pointers
//! (`NCCL_PTR_CUDA`, or `NCCL_PTR_DMABUF` where dma-bufs can be used: `NCCL_DMABUF_ENABLE`,
//! the plugin's `regMrDmaBuf`, the GPU's support), the GPU supports GPUDirect RDMA, and the
//! PCI distance between the GPU and the NIC is within `NCCL_NET_GDR_LEVEL` (default `PXB`:
//! the two under one PCIe switch hierarchy). The distance is the PCI path type that also
//! chooses a GPU's devices (`topo::pci`): a NIC without a PCI path (the socket network, a
//! test plugin) hangs on the first CPU (`PHB` or `SYS`), and a GPU sysfs does not list is at
//! `SYS` from every NIC. A receiving side uses it whenever allowed; a sending side (the
//! network *reads* GPU memory) only with `NCCL_NET_GDR_READ`, by default on GPUs of compute
//! capability 8.0 or later, and before that only where the GPU is the machine's only one
//! (NVIDIA's also allows NVLink-connected GPUs there; we do not look). See docs/gdr.md.

use super::api::{PTR_CUDA, PTR_DMABUF};
use crate::sched::Dir;
use crate::topo::parse_p2p_level;
use crate::topo::pci::PathType;

/// `NCCL_NET_GDR_LEVEL`'s levels, as `NCCL_P2P_LEVEL`'s (`topo::parse_p2p_level`) and the PCI
/// path types' (`topo::pci::PathType::level`).
const PXB: i64 = PathType::Pxb as i64;
pub const SYS: i64 = PathType::Sys as i64;

/// What decides whether a side uses GPU memory, besides its direction and the settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Site {
    /// The net device's `ptr_support` (`PTR_*` bits).
    pub ptr_support: i32,
    /// Dma-bufs can be registered: `NCCL_DMABUF_ENABLE`, the network's `regMrDmaBuf` and the
    /// GPU's `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.
    pub dma_buf: bool,
    /// The GPU supports GPUDirect RDMA.
    pub gpu_gdr: bool,
    /// The PCI distance between the GPU and the NIC (`topo::pci::PathType::level`).
    pub distance: i64,
    /// The GPU's compute capability major version.
    pub compute_major: i32,
    /// GPUs on this machine.
    pub gpus: i32,
}

impl Site {
    /// Whether a CUDA buffer on this site is registered as a dma-buf (NVIDIA's `useDmaBuf`:
    /// preferred to a plain CUDA registration where both are possible).
    pub fn registers_dma_buf(&self) -> bool {
        self.dma_buf && self.ptr_support & PTR_DMABUF != 0
    }
}

/// The settings that decide it: `NCCL_NET_GDR_LEVEL` (None: unset) and `NCCL_NET_GDR_READ`
/// (negative: unset, NVIDIA's default by compute capability).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    pub level: Option<String>,
    pub read: i64,
}

impl Settings {
    pub fn from_env() -> Settings {
        Settings {
            level: crate::env::registry::NET_GDR_LEVEL.get(),
            read: crate::env::registry::NET_GDR_READ.int(),
        }
    }
}

/// Whether a side of direction `dir` on `site` has its slots in GPU memory under `settings`.
pub fn uses_gpu_memory(site: &Site, dir: Dir, settings: &Settings) -> bool {
    let device_takes_gpu = site.ptr_support & PTR_CUDA != 0 || site.registers_dma_buf();
    if !device_takes_gpu || !site.gpu_gdr {
        return false;
    }
    if dir == Dir::Send {
        let read = match settings.read {
            0 => false,
            r if r > 0 => true,
            _ => site.compute_major >= 8 || site.gpus == 1,
        };
        if !read {
            return false;
        }
    }
    let allowed = settings
        .level
        .as_deref()
        .and_then(parse_p2p_level)
        .unwrap_or(PXB);
    site.distance <= allowed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::net::api::PTR_HOST;

    const PIX: i64 = PathType::Pix as i64;
    const PHB: i64 = PathType::Phb as i64;

    /// A Hopper GPU of eight, under the same PCIe switch hierarchy as a NIC that takes CUDA
    /// pointers.
    fn hopper_site() -> Site {
        Site {
            ptr_support: PTR_HOST | PTR_CUDA,
            dma_buf: false,
            gpu_gdr: true,
            distance: PXB,
            compute_major: 9,
            gpus: 8,
        }
    }

    #[test]
    fn nvidias_rules() {
        let site = hopper_site();
        let set = |level: Option<&str>, read: i64| Settings {
            level: level.map(str::to_string),
            read,
        };
        let recv = |s: &Site, level| uses_gpu_memory(s, Dir::Recv, &set(level, -2));
        let at = |distance| Site { distance, ..site };
        assert!(recv(&site, None));
        assert!(recv(&at(PIX), Some("PXB")));
        // Too far for the default, allowed when the level says so.
        assert!(!recv(&at(PHB), None));
        assert!(recv(&at(SYS), Some("SYS")));
        assert!(!recv(&at(SYS), Some("PHB")));
        assert!(!recv(&site, Some("LOC")));
        // A GPU without GPUDirect RDMA, or a device without CUDA pointers.
        let no_gdr = Site {
            gpu_gdr: false,
            ..site
        };
        assert!(!recv(&no_gdr, Some("SYS")));
        let host_only = Site {
            ptr_support: PTR_HOST,
            ..site
        };
        assert!(!recv(&host_only, Some("SYS")));
        // A device that takes GPU memory only as dma-bufs: where dma-bufs can be used.
        let dma_only = Site {
            ptr_support: PTR_HOST | PTR_DMABUF,
            ..site
        };
        assert!(!recv(&dma_only, None));
        let dma = Site {
            dma_buf: true,
            ..dma_only
        };
        assert!(recv(&dma, None) && dma.registers_dma_buf());
        assert!(!site.registers_dma_buf());
    }

    #[test]
    fn sending_sides_read_gpu_memory_by_nvidias_read_rule() {
        let site = hopper_site();
        let send =
            |s: &Site, read: i64| uses_gpu_memory(s, Dir::Send, &Settings { level: None, read });
        // Default: on from compute capability 8.0; before, only as the machine's one GPU.
        assert!(send(&site, -2));
        let volta = Site {
            compute_major: 7,
            ..site
        };
        assert!(!send(&volta, -2));
        assert!(send(&Site { gpus: 1, ..volta }, -2));
        // NCCL_NET_GDR_READ=0 turns it off, =1 on; the other conditions still hold.
        assert!(!send(&site, 0));
        assert!(send(&volta, 1));
        assert!(!send(
            &Site {
                distance: SYS,
                ..site
            },
            1
        ));
        let no_gdr = Site {
            gpu_gdr: false,
            ..site
        };
        assert!(!send(&no_gdr, 1));
        // It never affects the receiving side.
        let read_off = Settings {
            level: None,
            read: 0,
        };
        assert!(uses_gpu_memory(&site, Dir::Recv, &read_off));
    }
}
