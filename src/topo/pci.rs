//! PCI distances between a GPU and the network devices, as NVIDIA's topology sees them: the
//! path type (`PIX` < `PXB` < `PHB` < `SYS`) from sysfs paths, and the small sysfs reader
//! that finds a GPU's path from its bus id, a device's NUMA node and a network interface's
//! device. The reader takes a root prefix, so tests run over a fake sysfs tree.
//!
//! NVIDIA's tree (re-derived from its `ncclTopoGetXmlFromSys`): a device's parent is the PCI
//! switch two levels up its sysfs path (the switch's upstream port; the level in between is
//! the downstream port), or its CPU — its NUMA node — when the root complex comes first. Two
//! devices below one switch are `PIX` apart, below one switch hierarchy through more than one
//! switch `PXB`, below one NUMA node `PHB`, else `SYS`. A device that is not a PCI device (no
//! path, a virtual interface, a path ending in something other than a bus id) hangs on the
//! first CPU: the NUMA node of the GPU of the host's first rank.

use std::path::PathBuf;

/// NVIDIA's PCI path types between two devices, with `NCCL_P2P_LEVEL`'s numbers (the order
/// is the distance).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathType {
    /// Below one PCIe switch.
    Pix = 2,
    /// Below one switch hierarchy, through more than one switch.
    Pxb = 3,
    /// Through the host bridge of one NUMA node.
    Phb = 4,
    /// Across NUMA nodes.
    Sys = 5,
}

impl PathType {
    /// NVIDIA's name (`topoPathTypeStr`).
    pub fn name(self) -> &'static str {
        match self {
            PathType::Pix => "PIX",
            PathType::Pxb => "PXB",
            PathType::Phb => "PHB",
            PathType::Sys => "SYS",
        }
    }

    /// The `NCCL_P2P_LEVEL` / `NCCL_NET_GDR_LEVEL` number of this type.
    pub fn level(self) -> i64 {
        self as i64
    }
}

/// Where a device hangs in NVIDIA's tree: its PCI switches from the nearest up, and its NUMA
/// node (-1: unknown, as sysfs says it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    pub switches: Vec<String>,
    pub numa: i32,
}

/// Whether `s` is a PCI bus id `DDDD:BB:DD.F` (hex digits).
pub fn is_bus_id(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b.iter().enumerate().all(|(i, &c)| match i {
            4 | 7 => c == b':',
            10 => c == b'.',
            _ => c.is_ascii_hexdigit(),
        })
}

/// The number NVIDIA's `busIdToInt64` makes of a bus id: its hex digits up to the first other
/// character, skipping `:` and `.` (`0000:17:00.1` is 0x17001), at most 16 of them.
pub fn bus_id_value(bus_id: &str) -> i64 {
    let digits: String = bus_id
        .chars()
        .filter(|&c| c != ':' && c != '.')
        .take_while(char::is_ascii_hexdigit)
        .take(16)
        .collect();
    u64::from_str_radix(&digits, 16).map_or(0, |v| v as i64)
}

/// The bus id value of the last component of a sysfs PCI path (NVIDIA's `pciPathToInt64`).
pub fn pci_path_value(path: &str) -> i64 {
    let last = path.trim_end_matches('/').rsplit('/').next().unwrap_or("");
    bus_id_value(last)
}

/// The PCI switches above the device at sysfs path `path`, nearest first, as NVIDIA's tree
/// has them; None when the path is not a PCI device's (empty, virtual, no root complex, a
/// component after the root complex that is not a bus id).
pub fn switches_of(path: &str) -> Option<Vec<String>> {
    let parts: Vec<String> = path
        .split('/')
        .filter(|c| !c.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    let root = parts.iter().position(|c| c.starts_with("pci"))?;
    let below = &parts[root + 1..];
    if below.is_empty() || !below.iter().all(|c| is_bus_id(c)) {
        return None;
    }
    // From the device, two levels up at a time while both levels are below the root.
    let mut switches = Vec::new();
    let mut k = below.len() - 1;
    while k >= 2 {
        switches.push(below[k - 2].clone());
        k -= 2;
    }
    Some(switches)
}

/// The path type between two places.
pub fn path_type(a: &Place, b: &Place) -> PathType {
    for (i, s) in a.switches.iter().enumerate() {
        if let Some(j) = b.switches.iter().position(|t| t == s) {
            return if i == 0 && j == 0 {
                PathType::Pix
            } else {
                PathType::Pxb
            };
        }
    }
    if a.numa == b.numa {
        PathType::Phb
    } else {
        PathType::Sys
    }
}

/// Where the devices of a node hang: what `topo::nics` asks to place a GPU and the network
/// devices. `Sysfs` answers from the machine; `topo::file::Locator` from a topology file first.
pub trait Locate {
    /// The place of the GPU at PCI bus id `bus_id`, None where it cannot be placed.
    fn gpu_place(&self, bus_id: &str) -> Option<Place>;
    /// The place of the network device `name` whose PCI path is `pci_path`
    /// (`ncclNetProperties_t`), None when it is not a PCI device.
    fn net_place(&self, name: &str, pci_path: &str) -> Option<Place>;
    /// The position of the GPU `bus_id` among the node's GPUs in bus id order (NVML's order).
    fn gpu_ordinal(&self, bus_id: &str) -> Option<usize>;
}

impl Locate for Sysfs {
    fn gpu_place(&self, bus_id: &str) -> Option<Place> {
        self.pci_device_path(bus_id).and_then(|p| self.place(&p))
    }

    fn net_place(&self, _name: &str, pci_path: &str) -> Option<Place> {
        self.place(pci_path)
    }

    fn gpu_ordinal(&self, bus_id: &str) -> Option<usize> {
        Sysfs::gpu_ordinal(self, bus_id)
    }
}

/// The sysfs tree under a root prefix (`/` on a machine, a temporary folder in tests).
#[derive(Clone, Debug)]
pub struct Sysfs {
    root: PathBuf,
}

impl Sysfs {
    /// The machine's sysfs.
    pub fn system() -> Sysfs {
        Sysfs::at("/")
    }

    /// The sysfs tree whose `sys/` folder is under `root`.
    pub fn at(root: impl Into<PathBuf>) -> Sysfs {
        Sysfs { root: root.into() }
    }

    /// `path` (absolute, as sysfs names it) under the root.
    fn under(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// The resolved path of `link` (as sysfs names it), as sysfs names it; None where it
    /// does not exist.
    fn resolve(&self, link: &str) -> Option<String> {
        let real = std::fs::canonicalize(self.under(link)).ok()?;
        let root = std::fs::canonicalize(&self.root).ok()?;
        let rel = real.strip_prefix(&root).ok()?;
        Some(format!("/{}", rel.to_string_lossy()))
    }

    /// The sysfs path of the PCI device `bus_id` (`/sys/devices/pci0000:15/.../0000:18:00.0`),
    /// None where sysfs has no such device.
    pub fn pci_device_path(&self, bus_id: &str) -> Option<String> {
        let id = bus_id.trim().to_ascii_lowercase();
        if !is_bus_id(&id) {
            return None;
        }
        self.resolve(&format!("/sys/bus/pci/devices/{id}"))
    }

    /// The device of network interface `ifname` (`/sys/class/net/<if>/device` resolved), empty
    /// where it has none (loopback, veth, bridges).
    pub fn net_interface_device(&self, ifname: &str) -> String {
        if ifname.is_empty() || ifname.contains('/') || ifname.starts_with('.') {
            return String::new();
        }
        self.resolve(&format!("/sys/class/net/{ifname}/device"))
            .unwrap_or_default()
    }

    /// The trimmed content of file `name` of the device at sysfs path `path` (`class`,
    /// `current_link_speed`, ...), None where it cannot be read or is empty.
    pub fn read(&self, path: &str, name: &str) -> Option<String> {
        if path.is_empty() || name.contains('/') {
            return None;
        }
        let text = std::fs::read_to_string(self.under(path).join(name)).ok()?;
        Some(text.trim().to_string()).filter(|t| !t.is_empty())
    }

    /// The NUMA node of the device at sysfs path `path` (-1 where unknown).
    pub fn numa_node(&self, path: &str) -> i32 {
        if path.is_empty() {
            return -1;
        }
        std::fs::read_to_string(self.under(path).join("numa_node"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(-1)
    }

    /// The CPU list of NUMA node `node` (`/sys/devices/system/node/node<N>/cpulist`).
    pub fn node_cpulist(&self, node: i32) -> Option<String> {
        std::fs::read_to_string(
            self.under(&format!("/sys/devices/system/node/node{node}"))
                .join("cpulist"),
        )
        .ok()
    }

    /// The place of the device at sysfs path `path`, or None when it is not a PCI device.
    pub fn place(&self, path: &str) -> Option<Place> {
        Some(Place {
            switches: switches_of(path)?,
            numa: self.numa_node(path),
        })
    }

    /// The place of a network device at `pci_path` (its `ncclNetProperties_t.pciPath`): its
    /// own, or on the first CPU (`first_numa`) when it is not a PCI device (NVIDIA's rule).
    pub fn nic_place(&self, pci_path: &str, first_numa: i32) -> Place {
        self.place(pci_path).unwrap_or(Place {
            switches: Vec::new(),
            numa: first_numa,
        })
    }

    /// The position of the GPU `bus_id` among the machine's NVIDIA GPUs in bus id order (the
    /// order NVML numbers them in), None where sysfs does not list it.
    pub fn gpu_ordinal(&self, bus_id: &str) -> Option<usize> {
        let id = bus_id.trim().to_ascii_lowercase();
        let dir = self.under("/sys/bus/pci/devices");
        let mut gpus: Vec<String> = std::fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_ascii_lowercase())
            .filter(|name| is_bus_id(name) && self.is_nvidia_gpu(name))
            .collect();
        gpus.sort();
        gpus.iter().position(|g| *g == id)
    }

    /// Whether the PCI device `bus_id` is an NVIDIA display or 3D controller.
    fn is_nvidia_gpu(&self, bus_id: &str) -> bool {
        let read = |file: &str| {
            std::fs::read_to_string(self.under(&format!("/sys/bus/pci/devices/{bus_id}/{file}")))
                .map(|s| s.trim().to_ascii_lowercase())
                .unwrap_or_default()
        };
        read("vendor") == "0x10de" && read("class").starts_with("0x03")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fake sysfs tree in a temporary folder: PCI devices under `sys/devices`, each listed
    /// in `sys/bus/pci/devices`, network interfaces in `sys/class/net`.
    /// Removed with its contents when dropped.
    pub struct FakeSysfs {
        root: PathBuf,
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    impl FakeSysfs {
        pub fn new() -> FakeSysfs {
            use std::sync::atomic::{AtomicUsize, Ordering};
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let root = std::env::temp_dir().join(format!(
                "oxccl-sysfs-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&root).unwrap();
            FakeSysfs { root }
        }

        pub fn sysfs(&self) -> Sysfs {
            Sysfs::at(&self.root)
        }

        /// Add the PCI device at `path` (`/sys/devices/pci.../<bus id>`) on NUMA node `numa`,
        /// an NVIDIA GPU when `gpu`; returns `path`.
        pub fn device(&self, path: &str, numa: i32, gpu: bool) -> String {
            let dir = self.root.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("numa_node"), format!("{numa}\n")).unwrap();
            let (vendor, class) = match gpu {
                true => ("0x10de", "0x030200"),
                false => ("0x15b3", "0x020700"),
            };
            std::fs::write(dir.join("vendor"), vendor).unwrap();
            std::fs::write(dir.join("class"), class).unwrap();
            let bus = self.root.join("sys/bus/pci/devices");
            std::fs::create_dir_all(&bus).unwrap();
            let id = path.rsplit('/').next().unwrap();
            std::os::unix::fs::symlink(&dir, bus.join(id)).unwrap();
            path.to_string()
        }

        /// NUMA node `node` with the CPU list `cpus`.
        pub fn node_cpus(&self, node: i32, cpus: &str) {
            let dir = self
                .root
                .join(format!("sys/devices/system/node/node{node}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cpulist"), format!("{cpus}\n")).unwrap();
        }

        /// Add network interface `ifname`, whose device is `device` (a sysfs path) if given.
        pub fn interface(&self, ifname: &str, device: Option<&str>) {
            let dir = self.root.join("sys/class/net").join(ifname);
            std::fs::create_dir_all(&dir).unwrap();
            if let Some(d) = device {
                let target = self.root.join(d.trim_start_matches('/'));
                std::os::unix::fs::symlink(target, dir.join("device")).unwrap();
            }
        }
    }

    const GPU: &str = "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0";

    fn place(path: &str, numa: i32) -> Place {
        Place {
            switches: switches_of(path).unwrap(),
            numa,
        }
    }

    #[test]
    fn bus_ids_read_as_nvidias_numbers() {
        assert_eq!(bus_id_value("0000:17:00.1"), 0x17001);
        assert_eq!(bus_id_value("0001:a0:1f.7"), 0x1_a01f7);
        assert_eq!(bus_id_value("zz"), 0);
        assert_eq!(
            pci_path_value("/sys/devices/pci0000:16/0000:16:02.0/0000:17:00.1/"),
            0x17001
        );
        assert_eq!(pci_path_value(""), 0);
    }

    #[test]
    fn bus_ids_are_recognised() {
        assert!(is_bus_id("0000:18:00.0") && is_bus_id("000a:ff:1f.7"));
        assert!(!is_bus_id("pci0000:15") && !is_bus_id("virtio0") && !is_bus_id("0000:18:00"));
    }

    #[test]
    fn switches_are_two_levels_up_as_nvidias_tree() {
        assert_eq!(switches_of(GPU).unwrap(), vec!["0000:16:00.0"]);
        let deep = "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:08.0/0000:20:00.0/0000:21:00.0/0000:22:00.0";
        assert_eq!(
            switches_of(deep).unwrap(),
            vec!["0000:20:00.0", "0000:16:00.0"]
        );
        // Directly below a root port: on its CPU.
        assert_eq!(
            switches_of("/sys/devices/pci0000:00/0000:00:03.0/0000:03:00.0").unwrap(),
            Vec::<String>::new()
        );
        // Not PCI devices.
        assert_eq!(switches_of(""), None);
        assert_eq!(switches_of("/sys/devices/virtual/net/veth0"), None);
        assert_eq!(
            switches_of("/sys/devices/pci0000:00/0000:00:03.0/virtio0"),
            None
        );
    }

    #[test]
    fn path_types_from_sysfs_paths() {
        let gpu = place(GPU, 0);
        // The NIC behind the same switch as the GPU.
        let nic = "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:04.0/0000:1a:00.0";
        assert_eq!(path_type(&gpu, &place(nic, 0)), PathType::Pix);
        // Below the same switch through another one.
        let deeper = "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:08.0/0000:20:00.0/0000:21:00.0/0000:22:00.0";
        assert_eq!(path_type(&gpu, &place(deeper, 0)), PathType::Pxb);
        // Another root port of the same root complex, or another root complex of the node.
        let other_port = "/sys/devices/pci0000:15/0000:15:02.0/0000:30:00.0";
        assert_eq!(path_type(&gpu, &place(other_port, 0)), PathType::Phb);
        let other_root = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0";
        assert_eq!(path_type(&gpu, &place(other_root, 0)), PathType::Phb);
        assert_eq!(path_type(&gpu, &place(other_root, 1)), PathType::Sys);
        // Symmetric.
        assert_eq!(path_type(&place(deeper, 0), &gpu), PathType::Pxb);
        assert!(PathType::Pix < PathType::Pxb && PathType::Phb < PathType::Sys);
        assert_eq!(PathType::Pxb.level(), 3);
    }

    #[test]
    fn the_reader_finds_paths_numa_nodes_interfaces_and_gpu_order() {
        let fake = FakeSysfs::new();
        let gpu = fake.device(GPU, 1, true);
        let other = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0/0000:83:00.0";
        fake.device(other, 0, true);
        let nic = fake.device(
            "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:04.0/0000:1a:00.0",
            1,
            false,
        );
        fake.interface("eth0", Some(&nic));
        fake.interface("veth0", None);
        let sys = fake.sysfs();
        assert_eq!(sys.pci_device_path("0000:18:00.0").as_deref(), Some(GPU));
        assert_eq!(sys.pci_device_path("0000:18:00.0 ").as_deref(), Some(GPU));
        assert_eq!(sys.pci_device_path("0000:99:00.0"), None);
        assert_eq!(sys.pci_device_path("../../etc"), None);
        assert_eq!(sys.numa_node(&gpu), 1);
        assert_eq!(sys.numa_node(""), -1);
        assert_eq!(sys.numa_node("/sys/devices/none"), -1);
        assert_eq!(sys.net_interface_device("eth0"), nic);
        assert_eq!(sys.net_interface_device("veth0"), "");
        assert_eq!(sys.net_interface_device("../x"), "");
        // GPUs in bus id order; the NIC is none.
        assert_eq!(sys.gpu_ordinal("0000:18:00.0"), Some(0));
        assert_eq!(sys.gpu_ordinal("0000:83:00.0"), Some(1));
        assert_eq!(sys.gpu_ordinal("0000:1a:00.0"), None);
        // A NIC without a PCI path hangs on the first CPU.
        let p = sys.place(&gpu).unwrap();
        assert_eq!(p.numa, 1);
        assert_eq!(sys.nic_place("", 1).switches, Vec::<String>::new());
        assert_eq!(path_type(&p, &sys.nic_place("", 1)), PathType::Phb);
        assert_eq!(path_type(&p, &sys.nic_place("", 0)), PathType::Sys);
        assert_eq!(path_type(&p, &sys.nic_place(&nic, 0)), PathType::Pix);
    }
}
