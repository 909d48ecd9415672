//! Which network devices a GPU's channels use, by NVIDIA's rule (re-derived from its
//! `ncclTopoGetLocalNet`): the devices at the smallest PCI path type from the GPU (`pci`),
//! shared among the GPUs of the host that are as close to them: each such GPU gets
//! `ceil(devices / GPUs)` of them (`NCCL_NETDEVS_POLICY=AUTO`; `ALL`: every closest device;
//! `MAX:n`: at most n), starting at its own offset (its NVML-order index modulo the sharing
//! GPUs, bit-mirrored when the device count is a power of two) so neighbours start apart.
//! Channel c uses the c-th device of the GPU's list, round robin.
//!
//! The decision is pure (`local_nets`, over path types); `choose` asks a `Locate` for the
//! places (sysfs, or a topology file over it: `topo::file::Locator`). A GPU that cannot be
//! placed (no GPU, a stand-in) uses every device.

use super::pci::{path_type, Locate, PathType, Place};
use super::Topology;

/// `NCCL_NETDEVS_POLICY`: how many of its closest devices a GPU uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetDevsPolicy {
    /// Shared out among the GPUs as close to them.
    Auto,
    /// Every closest device.
    All,
    /// At most this many (at least 1).
    Max(usize),
}

impl NetDevsPolicy {
    /// The policy `value` names (`AUTO`, `ALL`, `MAX:n`, case-insensitive), None when it
    /// names none.
    pub fn parse(value: &str) -> Option<NetDevsPolicy> {
        let v = value.trim();
        if v.eq_ignore_ascii_case("AUTO") {
            return Some(NetDevsPolicy::Auto);
        }
        if v.eq_ignore_ascii_case("ALL") {
            return Some(NetDevsPolicy::All);
        }
        let count = v
            .get(..4)
            .filter(|p| p.eq_ignore_ascii_case("MAX:"))
            .map(|_| &v[4..])?;
        count
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .map(NetDevsPolicy::Max)
    }

    /// `NCCL_NETDEVS_POLICY` (unset or not understood: `AUTO`, said once in an INFO line).
    pub fn from_env() -> NetDevsPolicy {
        let Some(v) = crate::env::registry::NETDEVS_POLICY.get() else {
            return NetDevsPolicy::Auto;
        };
        NetDevsPolicy::parse(&v).unwrap_or_else(|| {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                crate::info!(
                    ENV,
                    "Unable to recognize NCCL_NETDEVS_POLICY={v}, using NCCL_NETDEVS_POLICY_AUTO \
                     instead."
                );
            });
            NetDevsPolicy::Auto
        })
    }

    /// How many devices each GPU uses of `closest`, shared by `sharing` GPUs.
    fn per_gpu(self, closest: usize, sharing: usize) -> usize {
        match self {
            NetDevsPolicy::Auto => closest.div_ceil(sharing.max(1)),
            NetDevsPolicy::All => closest,
            NetDevsPolicy::Max(n) => n.min(closest),
        }
    }
}

/// `val`'s bits below `pow2` in reverse order (NVIDIA's `mirrorBits`): GPUs 0, 1, 2, 3 of
/// four sharing start at devices 0, 2, 1, 3.
fn mirror_bits(val: usize, pow2: usize) -> usize {
    let mut mirrored = 0;
    let (mut b, mut mb) = (1, pow2 >> 1);
    while b < pow2 {
        if val & b != 0 {
            mirrored |= mb;
        }
        b <<= 1;
        mb >>= 1;
    }
    mirrored
}

/// The devices GPU `me` uses, in channel order (channel c: the entry c mod length), from
/// `types[g][n]`, the path type between the host's GPU g and device n (every row as long);
/// `ordinal` is GPU `me`'s NVML-order index.
pub fn local_nets(
    types: &[Vec<PathType>],
    me: usize,
    ordinal: usize,
    policy: NetDevsPolicy,
) -> Vec<usize> {
    let Some(mine) = types.get(me).filter(|t| !t.is_empty()) else {
        return Vec::new();
    };
    let best = *mine.iter().min().expect("not empty");
    let closest: Vec<usize> = (0..mine.len()).filter(|&n| mine[n] == best).collect();
    // The GPUs closest to the first of them share them.
    let first = closest[0];
    let nearest_gpu = types.iter().map(|t| t[first]).min().expect("me among them");
    let sharing = types.iter().filter(|t| t[first] == nearest_gpu).count();
    let per_gpu = policy.per_gpu(closest.len(), sharing).max(1);
    let mut start = ordinal % sharing;
    if closest.len().is_power_of_two() {
        start = mirror_bits(start, closest.len());
    }
    (0..per_gpu)
        .map(|k| closest[(start + k) % closest.len()])
        .collect()
}

/// What a GPU was given: its devices in channel order and the path type of every device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// Channel c uses device `devices[c % len]`.
    pub devices: Vec<usize>,
    /// `[device]`: its path type from the GPU; empty when the GPU cannot be placed.
    pub types: Vec<PathType>,
}

/// A network device as `choose` places it: its name and PCI path
/// (`ncclNetProperties_t.name` and `.pciPath`, empty where it has none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetDevice {
    pub name: String,
    pub pci_path: String,
}

/// The devices of this rank's GPU among the network devices `nics`, with the places `locate`
/// gives the host's GPUs (those of `topo`'s ranks on this host) and the devices.
pub fn choose(
    locate: &dyn Locate,
    topo: &Topology,
    nics: &[NetDevice],
    policy: NetDevsPolicy,
) -> Choice {
    let every = || Choice {
        devices: (0..nics.len()).collect(),
        types: Vec::new(),
    };
    let my_bus = &topo.peers[topo.my_rank as usize].bus_id;
    let mut gpus: Vec<&str> = Vec::new();
    for &r in &topo.local_ranks {
        let bus = topo.peers[r as usize].bus_id.as_str();
        if !gpus.contains(&bus) {
            gpus.push(bus);
        }
    }
    let places: Vec<Option<Place>> = gpus.iter().map(|b| locate.gpu_place(b)).collect();
    let Some(me) = gpus.iter().position(|b| *b == my_bus) else {
        return every();
    };
    if places[me].is_none() || nics.is_empty() {
        return every();
    }
    // A device that is no PCI device hangs on the CPU of the host's first GPU.
    let first_numa = places.iter().flatten().next().map_or(-1, |p| p.numa);
    let nics: Vec<Place> = nics
        .iter()
        .map(|n| {
            locate.net_place(&n.name, &n.pci_path).unwrap_or(Place {
                switches: Vec::new(),
                numa: first_numa,
            })
        })
        .collect();
    let row = |gpu: &Place| -> Vec<PathType> { nics.iter().map(|n| path_type(gpu, n)).collect() };
    let mut types = Vec::new();
    let mut my_row = 0;
    for (g, place) in places.iter().enumerate() {
        if let Some(p) = place {
            if g == me {
                my_row = types.len();
            }
            types.push(row(p));
        }
    }
    let ordinal = locate.gpu_ordinal(my_bus).unwrap_or_else(|| {
        let mut sorted = gpus.clone();
        sorted.sort();
        sorted.iter().position(|b| *b == my_bus).unwrap_or(0)
    });
    Choice {
        devices: local_nets(&types, my_row, ordinal, policy),
        types: types.swap_remove(my_row),
    }
}

#[cfg(test)]
mod tests {
    use super::super::pci::tests::FakeSysfs;
    use super::super::Topology;
    use super::PathType::{Phb, Pix, Pxb, Sys};
    use super::*;

    #[test]
    fn policies_parse_as_nvidias() {
        assert_eq!(NetDevsPolicy::parse("auto"), Some(NetDevsPolicy::Auto));
        assert_eq!(NetDevsPolicy::parse(" ALL "), Some(NetDevsPolicy::All));
        assert_eq!(NetDevsPolicy::parse("MAX:2"), Some(NetDevsPolicy::Max(2)));
        assert_eq!(NetDevsPolicy::parse("max:1"), Some(NetDevsPolicy::Max(1)));
        assert_eq!(NetDevsPolicy::parse("MAX:0"), None);
        assert_eq!(NetDevsPolicy::parse("MAX:"), None);
        assert_eq!(NetDevsPolicy::parse("some"), None);
    }

    #[test]
    fn mirrored_starts_spread_neighbours() {
        let starts: Vec<usize> = (0..4).map(|g| mirror_bits(g, 4)).collect();
        assert_eq!(starts, vec![0, 2, 1, 3]);
        assert_eq!(mirror_bits(1, 2), 1);
        assert_eq!(mirror_bits(0, 1), 0);
    }

    #[test]
    fn only_the_closest_devices_are_used() {
        // One GPU: a NIC under its switch, one on another root complex.
        assert_eq!(
            local_nets(&[vec![Pix, Sys]], 0, 0, NetDevsPolicy::Auto),
            vec![0]
        );
        assert_eq!(
            local_nets(&[vec![Phb, Pxb]], 0, 0, NetDevsPolicy::Auto),
            vec![1]
        );
        // Two equally close: both, round robin.
        assert_eq!(
            local_nets(&[vec![Pix, Sys, Pix]], 0, 0, NetDevsPolicy::Auto),
            vec![0, 2]
        );
        // Nothing close: the least far ones.
        assert_eq!(
            local_nets(&[vec![Sys, Sys]], 0, 3, NetDevsPolicy::Auto),
            vec![0, 1]
        );
        assert_eq!(
            local_nets(&[vec![]], 0, 0, NetDevsPolicy::Auto),
            Vec::<usize>::new()
        );
    }

    #[test]
    fn gpus_as_close_share_the_devices_out() {
        // Two GPUs and two NICs under one switch (DGX A100): one NIC each, apart.
        let t = vec![vec![Pix, Pix], vec![Pix, Pix]];
        assert_eq!(local_nets(&t, 0, 0, NetDevsPolicy::Auto), vec![0]);
        assert_eq!(local_nets(&t, 1, 1, NetDevsPolicy::Auto), vec![1]);
        // ALL: both each; MAX:1 as AUTO here.
        assert_eq!(local_nets(&t, 1, 1, NetDevsPolicy::All), vec![1, 0]);
        assert_eq!(local_nets(&t, 0, 0, NetDevsPolicy::Max(1)), vec![0]);
        // Four GPUs on two NICs: two GPUs per NIC, mirrored starts.
        let t = vec![vec![Pix, Pix]; 4];
        let firsts: Vec<usize> = (0..4)
            .map(|g| local_nets(&t, g, g, NetDevsPolicy::Auto)[0])
            .collect();
        assert_eq!(firsts, vec![0, 1, 0, 1]);
        // A GPU farther from the NICs does not share them with the near one.
        let t = vec![vec![Pix, Pix], vec![Phb, Phb]];
        assert_eq!(local_nets(&t, 0, 0, NetDevsPolicy::Auto), vec![0, 1]);
    }

    const GPU0: &str =
        "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0";
    const GPU1: &str =
        "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0/0000:83:00.0";
    const NIC_NEAR0: &str =
        "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:04.0/0000:1a:00.0";
    const NIC_NEAR0_B: &str =
        "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:08.0/0000:1b:00.0";
    const NIC_NEAR1: &str =
        "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:04.0/0000:84:00.0";

    fn topo(buses: &[&str], me: i32) -> Topology {
        crate::topo::one_host_for_tests(buses, me, 0)
    }

    fn paths(p: &[&str]) -> Vec<NetDevice> {
        p.iter()
            .map(|s| NetDevice {
                name: String::new(),
                pci_path: s.to_string(),
            })
            .collect()
    }

    /// Two sockets: GPU 0 and two NICs on NUMA node 0, GPU 1 and one NIC on node 1.
    fn two_sockets() -> FakeSysfs {
        let fake = FakeSysfs::new();
        fake.device(GPU0, 0, true);
        fake.device(GPU1, 1, true);
        fake.device(NIC_NEAR0, 0, false);
        fake.device(NIC_NEAR0_B, 0, false);
        fake.device(NIC_NEAR1, 1, false);
        fake
    }

    #[test]
    fn each_gpu_takes_the_nics_near_it_from_sysfs() {
        let fake = two_sockets();
        let sys = fake.sysfs();
        let nics = paths(&[NIC_NEAR1, NIC_NEAR0, ""]);
        let t = topo(&["0000:18:00.0", "0000:83:00.0"], 0);
        let c = choose(&sys, &t, &nics, NetDevsPolicy::Auto);
        assert_eq!(c.devices, vec![1]);
        // The device without a PCI path hangs on the first GPU's CPU (node 0).
        assert_eq!(c.types, vec![Sys, Pix, Phb]);
        let t = topo(&["0000:18:00.0", "0000:83:00.0"], 1);
        let c = choose(&sys, &t, &nics, NetDevsPolicy::Auto);
        assert_eq!((c.devices, c.types), (vec![0], vec![Pix, Sys, Sys]));
        // Two NICs under GPU 0's switch: both, round robin.
        let nics = paths(&[NIC_NEAR0, NIC_NEAR1, NIC_NEAR0_B]);
        let t = topo(&["0000:18:00.0", "0000:83:00.0"], 0);
        assert_eq!(
            choose(&sys, &t, &nics, NetDevsPolicy::Auto).devices,
            vec![0, 2]
        );
        assert_eq!(
            choose(&sys, &t, &nics, NetDevsPolicy::Max(1)).devices,
            vec![0]
        );
    }

    #[test]
    fn devices_without_pci_paths_are_used_as_nvidias() {
        let fake = two_sockets();
        let sys = fake.sysfs();
        let t = topo(&["0000:18:00.0", "0000:83:00.0"], 0);
        // Only devices without a path (sockets on veths): all on the first CPU, all used.
        let c = choose(&sys, &t, &paths(&["", ""]), NetDevsPolicy::Auto);
        assert_eq!((c.devices, c.types), (vec![0, 1], vec![Phb, Phb]));
        // A PCI device near the GPU wins over them.
        let c = choose(&sys, &t, &paths(&["", NIC_NEAR0]), NetDevsPolicy::Auto);
        assert_eq!(c.devices, vec![1]);
        // An interface's device found through /sys/class/net.
        fake.interface("eth9", Some(NIC_NEAR0_B));
        fake.interface("veth9", None);
        let eth = sys.net_interface_device("eth9");
        let veth = sys.net_interface_device("veth9");
        let c = choose(&sys, &t, &paths(&[&veth, &eth]), NetDevsPolicy::Auto);
        assert_eq!(c.devices, vec![1]);
    }

    #[test]
    fn a_gpu_sysfs_does_not_list_uses_every_device() {
        let fake = two_sockets();
        let t = topo(&["0000:99:00.0"], 0);
        let c = choose(
            &fake.sysfs(),
            &t,
            &paths(&[NIC_NEAR0, NIC_NEAR1]),
            NetDevsPolicy::Auto,
        );
        assert_eq!((c.devices, c.types), (vec![0, 1], vec![]));
        let none = choose(&fake.sysfs(), &t, &[], NetDevsPolicy::Auto);
        assert!(none.devices.is_empty());
    }
}
