//! `NCCL_TOPO_DUMP_FILE`: the node as this rank sees it, written in `NCCL_TOPO_FILE`'s format
//! by rank `NCCL_TOPO_DUMP_FILE_RANK` (0) at init, as NVIDIA's does. With a topology file
//! loaded, that file is what is written (it is what the node was planned with); otherwise the
//! detected node: the host's GPUs (the ranks' bus ids) and the network's devices, each below
//! the PCI switches sysfs shows above it, in its NUMA node's `<cpu>`.
//!
//! What detection knows is what is written: for a GPU its `dev`, `rank` and, when it has
//! NVLinks, one `<nvlink count=..>` with their number (NVML gives counts, not targets:
//! NVIDIA's reader also wants `target` and `tclass`, to be added by hand); for a network device
//! its `name`, `dev`, `speed` (the one in effect), `port`, `latency`, `guid`, `maxconn`, `gdr`;
//! for PCI devices `class`, `link_speed`, `link_width` as sysfs has them. A GPU sysfs does not
//! list is left out (it has no place), a network device without a PCI path hangs in the first
//! GPU's `<cpu>`.

use super::file::NodeFile;
use super::pci::{Locate, Place, Sysfs};
use super::xml::{self, Element};
use super::Topology;

/// A network device as the dump describes it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DumpNet {
    pub name: String,
    pub dev: i32,
    /// `ncclNetProperties_t.pciPath`, empty where it has none.
    pub pci_path: String,
    pub speed_mbps: u32,
    pub port: i32,
    pub latency_us: f32,
    pub guid: u64,
    pub max_comms: i32,
    /// Whether the device reads and writes GPU memory (`NCCL_PTR_CUDA`).
    pub gdr: bool,
}

/// The `<system>` of the node `topo`'s host has, as `sysfs` places its GPUs and `nets`.
pub fn detected(topo: &Topology, sysfs: &Sysfs, nets: &[DumpNet]) -> String {
    let mut root = Element::new("system").with("version", super::file::XML_VERSION);
    let mut first_numa = None;
    for (bus, rank, dev, nvlinks) in host_gpus(topo) {
        let Some(place) = sysfs.gpu_place(&bus) else {
            continue;
        };
        first_numa.get_or_insert(place.numa);
        let mut gpu = Element::new("gpu").with("dev", dev).with("rank", rank);
        if nvlinks > 0 {
            gpu.children
                .push(Element::new("nvlink").with("count", nvlinks));
        }
        device(&mut root, sysfs, &place, &bus).children.push(gpu);
    }
    for n in nets {
        let net = net_element(n);
        let bus = n.pci_path.rsplit('/').find(|c| !c.is_empty()).unwrap_or("");
        let placed = sysfs.net_place(&n.name, &n.pci_path);
        let holder = match &placed {
            Some(place) => device(&mut root, sysfs, place, bus),
            None => cpu(&mut root, first_numa.unwrap_or(-1)),
        };
        nic(holder, placed.is_some()).children.push(net);
    }
    xml::write(&root)
}

/// (bus id, lowest rank, device ordinal, NVLinks) of every GPU of this rank's host, in the
/// order of their lowest ranks.
fn host_gpus(topo: &Topology) -> Vec<(String, i32, i32, u32)> {
    let mut gpus: Vec<(String, i32, i32, u32)> = Vec::new();
    for &r in &topo.local_ranks {
        let p = &topo.peers[r as usize];
        if !gpus.iter().any(|g| g.0 == p.bus_id) {
            gpus.push((p.bus_id.clone(), p.rank, p.cuda_dev, p.nvlinks));
        }
    }
    gpus
}

fn net_element(n: &DumpNet) -> Element {
    Element::new("net")
        .with("name", &n.name)
        .with("dev", n.dev)
        .with("speed", n.speed_mbps)
        .with("port", n.port)
        .with("latency", format!("{:.6}", n.latency_us))
        .with("guid", format!("{:#x}", n.guid))
        .with("maxconn", n.max_comms)
        .with("gdr", n.gdr as i32)
}

/// The `<cpu>` of NUMA node `numa` in `root`, added when missing.
fn cpu(root: &mut Element, numa: i32) -> &mut Element {
    let numa = numa.to_string();
    let at = match root
        .children
        .iter()
        .position(|c| c.attr("numaid") == Some(numa.as_str()))
    {
        Some(at) => at,
        None => {
            root.children.push(Element::new("cpu").with("numaid", numa));
            root.children.len() - 1
        }
    };
    &mut root.children[at]
}

/// The `<pci>` of bus id `bus` in `parent`, added (with what sysfs says of it) when missing.
fn pci<'a>(parent: &'a mut Element, sysfs: &Sysfs, bus: &str) -> &'a mut Element {
    let at = match parent
        .children
        .iter()
        .position(|c| c.name == "pci" && c.attr("busid") == Some(bus))
    {
        Some(at) => at,
        None => {
            parent.children.push(pci_element(sysfs, bus));
            parent.children.len() - 1
        }
    };
    &mut parent.children[at]
}

fn pci_element(sysfs: &Sysfs, bus: &str) -> Element {
    let mut e = Element::new("pci").with("busid", bus);
    let path = sysfs.pci_device_path(bus).unwrap_or_default();
    for (file, key) in [
        ("class", "class"),
        ("current_link_speed", "link_speed"),
        ("current_link_width", "link_width"),
    ] {
        if let Some(v) = sysfs.read(&path, file) {
            e = e.with(key, v);
        }
    }
    e
}

/// The `<pci>` of the device `bus` at `place`, its switches and `<cpu>` added when missing.
fn device<'a>(root: &'a mut Element, sysfs: &Sysfs, place: &Place, bus: &str) -> &'a mut Element {
    let mut node = cpu(root, place.numa);
    for switch in place.switches.iter().rev() {
        node = pci(node, sysfs, switch);
    }
    pci(node, sysfs, bus)
}

/// The `<nic>` of `holder` (a NIC's `<pci>`, or a `<cpu>` when `shared` is false: one `<nic>`
/// per device there, as it has no PCI device to share), added when missing.
fn nic(holder: &mut Element, shared: bool) -> &mut Element {
    match holder.children.iter().position(|c| c.name == "nic") {
        Some(at) if shared => &mut holder.children[at],
        _ => {
            holder.children.push(Element::new("nic"));
            holder.children.last_mut().expect("just pushed")
        }
    }
}

/// What `NCCL_TOPO_DUMP_FILE` gets: the loaded file if there is one, else the detected node.
pub fn text(file: Option<&NodeFile>, topo: &Topology, sysfs: &Sysfs, nets: &[DumpNet]) -> String {
    match file {
        Some(f) => f.to_xml(),
        None => detected(topo, sysfs, nets),
    }
}

/// Whether this rank writes `NCCL_TOPO_DUMP_FILE`, and where.
pub fn target(topo: &Topology) -> Option<String> {
    let path = crate::env::registry::TOPO_DUMP_FILE
        .get()
        .filter(|p| !p.trim().is_empty())?;
    (topo.my_rank as i64 == crate::env::registry::TOPO_DUMP_FILE_RANK.int()).then_some(path)
}

/// Write `text` to `path` (NVIDIA's INFO lines; a file that cannot be written is said and
/// skipped, as NVIDIA's does).
pub fn write(path: &str, text: &str) {
    crate::info!(ENV, "NCCL_TOPO_DUMP_FILE set by environment to {path}");
    if let Err(e) = std::fs::write(path, text) {
        crate::info!(
            GRAPH | ENV,
            "Unable to open {path}, not dumping topology. ({e})"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo::file::{Locator, NodeFile};
    use crate::topo::nics::{choose, NetDevice, NetDevsPolicy};
    use crate::topo::pci::tests::FakeSysfs;
    use std::sync::Arc;

    const GPU0: &str =
        "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0";
    const NIC0: &str =
        "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:04.0/0000:1a:00.0";
    const GPU1: &str =
        "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0/0000:83:00.0";
    const NIC1: &str =
        "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:04.0/0000:84:00.0";

    fn topo(buses: &[&str], nvlinks: u32) -> Topology {
        crate::topo::one_host_for_tests(buses, 0, nvlinks)
    }

    fn net(name: &str, dev: i32, path: &str, speed: u32) -> DumpNet {
        DumpNet {
            name: name.into(),
            dev,
            pci_path: path.into(),
            speed_mbps: speed,
            port: 1,
            latency_us: 0.0,
            guid: 0xabc0 + dev as u64,
            max_comms: 65536,
            gdr: dev == 0,
        }
    }

    /// Two sockets, a GPU and a NIC below one switch on each.
    fn two_sockets() -> FakeSysfs {
        let fake = FakeSysfs::new();
        fake.device(GPU0, 0, true);
        fake.device(GPU1, 1, true);
        fake.device(NIC0, 0, false);
        fake.device(NIC1, 1, false);
        fake
    }

    #[test]
    fn the_detected_node_loads_back_with_the_same_places() {
        let fake = two_sockets();
        let sys = fake.sysfs();
        let t = topo(&["0000:18:00.0", "0000:83:00.0"], 18);
        let nets = [
            net("mlx5_0", 0, NIC0, 100000),
            net("eth1", 1, NIC1, 25000),
            net("lo", 2, "", 10000),
        ];
        let text = detected(&t, &sys, &nets);
        let f = NodeFile::parse(&text, "dump").unwrap();
        assert_eq!(f.cpus.len(), 2);
        for bus in ["0000:18:00.0", "0000:83:00.0"] {
            assert_eq!(f.pci_place(bus), sys.gpu_place(bus), "{bus}");
            assert_eq!(f.gpu_nvlinks(bus), Some(18));
        }
        for n in &nets[..2] {
            assert_eq!(f.net(&n.name).unwrap().1, sys.place(&n.pci_path).unwrap());
            assert_eq!(f.net_speed(&n.name), Some(n.speed_mbps));
        }
        let (lo, place) = f.net("lo").unwrap();
        assert_eq!((place.switches.len(), place.numa), (0, 0), "on GPU 0's CPU");
        assert_eq!(lo.gdr, Some(false));
        assert_eq!(f.gpu_bus_ids(), vec!["0000:18:00.0", "0000:83:00.0"]);
        // The choice over the dump alone is the choice over sysfs.
        let devices: Vec<NetDevice> = nets
            .iter()
            .map(|n| NetDevice {
                name: n.name.clone(),
                pci_path: n.pci_path.clone(),
            })
            .collect();
        let empty = FakeSysfs::new();
        let from_dump = Locator {
            sysfs: empty.sysfs(),
            file: Some(Arc::new(f)),
        };
        for me in 0..2 {
            let mut t = t.clone();
            t.my_rank = me;
            assert_eq!(
                choose(&from_dump, &t, &devices, NetDevsPolicy::Auto),
                choose(&sys, &t, &devices, NetDevsPolicy::Auto),
                "rank {me}"
            );
        }
        // The shared switch is written once, with both devices below it.
        assert_eq!(text.matches("busid=\"0000:16:00.0\"").count(), 1, "{text}");
        assert!(text.contains("<nvlink count=\"18\"/>"), "{text}");
        assert!(text.contains("class=\"0x030200\""), "{text}");
    }

    #[test]
    fn gpus_sysfs_does_not_list_are_left_out_and_a_loaded_file_is_written_as_loaded() {
        let fake = two_sockets();
        let t = topo(&["0000:18:00.0", "0000:99:00.0"], 0);
        let text = detected(&t, &fake.sysfs(), &[]);
        let f = NodeFile::parse(&text, "dump").unwrap();
        assert_eq!(f.gpu_bus_ids(), vec!["0000:18:00.0"]);
        assert_eq!(
            f.gpu_nvlinks("0000:18:00.0"),
            None,
            "no NVLinks: no <nvlink>"
        );
        let loaded = NodeFile::parse(include_str!("testdata/asymmetric-2gpu.xml"), "a").unwrap();
        let written = text_of(Some(&loaded), &t, &fake.sysfs());
        assert_eq!(NodeFile::parse(&written, "w").unwrap(), loaded);
    }

    fn text_of(file: Option<&NodeFile>, t: &Topology, sys: &Sysfs) -> String {
        text(file, t, sys, &[])
    }
}
