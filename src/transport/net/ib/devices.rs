//! Which HCA ports the IB network uses and how it addresses them: the `NCCL_IB_HCA` filter
//! (NVIDIA's syntax), the ACTIVE ports of the devices the verbs library finds, their speed
//! (width × lane speed), PCI path, link layer, and for RoCE the GID index chosen as NVIDIA's
//! (`NCCL_IB_GID_INDEX`, else the first GID of `NCCL_IB_ROCE_VERSION_NUM` in
//! `NCCL_IB_ADDR_FAMILY`), and which ports make one network device: with
//! `NCCL_IB_MERGE_NICS` the ports of one physical NIC (devices whose PCI paths differ only in
//! the function, or ports of one device) with one link layer are merged into one device, as
//! NVIDIA's topology merges NICs at path type PORT. The parsing and choosing here is pure and
//! unit-tested.

use super::verbs::{self, Context, Gid, Lib, PortAttr};
use crate::error::Result;
use std::path::Path;
use std::sync::Arc;

/// Most ports one merged device has (NVIDIA's `NCCL_NET_MAX_DEVS_PER_NIC`).
pub const MAX_MEMBERS: usize = 8;

/// Where sysfs lists the verbs devices (`<dir>/<dev>/device` links to the PCI function).
pub const SYSFS_INFINIBAND: &str = "/sys/class/infiniband";

/// One `NCCL_IB_HCA` entry: a device name (or its prefix) and a port (None: any).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaEntry {
    pub name: String,
    pub port: Option<u8>,
}

/// `NCCL_IB_HCA` parsed: `^` excludes the listed devices, `=` matches names exactly (else a
/// name is a prefix), entries `name[:port]` separated by commas.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HcaFilter {
    pub exclude: bool,
    pub exact: bool,
    pub entries: Vec<HcaEntry>,
}

impl HcaFilter {
    pub fn parse(spec: Option<&str>) -> HcaFilter {
        let Some(mut s) = spec.map(str::trim).filter(|s| !s.is_empty()) else {
            return HcaFilter::default();
        };
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let entries = s
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| match e.split_once(':') {
                Some((n, p)) => HcaEntry {
                    name: n.to_string(),
                    port: p.trim().parse().ok(),
                },
                None => HcaEntry {
                    name: e.to_string(),
                    port: None,
                },
            })
            .collect();
        HcaFilter {
            exclude,
            exact,
            entries,
        }
    }

    /// Whether port `port` of device `name` is used.
    pub fn selects(&self, name: &str, port: u8) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let listed = self.entries.iter().any(|e| {
            let name_ok = if self.exact {
                e.name == name
            } else {
                name.starts_with(&e.name)
            };
            name_ok && e.port.is_none_or(|p| p == port)
        });
        listed != self.exclude
    }
}

/// Mbit/s of one lane at `active_speed` (a bit of verbs' speed encoding), as NVIDIA's table.
fn lane_mbps(active_speed: u8) -> i32 {
    match active_speed {
        1 => 2500,
        2 => 5000,
        4 | 8 => 10000,
        16 => 14000,
        32 => 25000,
        64 => 50000,
        128 => 100000,
        _ => 200000,
    }
}

/// Lanes of `active_width` (1x, 4x, 8x, 12x, 2x).
fn lanes(active_width: u8) -> i32 {
    match active_width {
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 1,
    }
}

/// A port's speed in Mbit/s: width × lane speed.
pub fn port_speed_mbps(a: &PortAttr) -> i32 {
    lanes(a.active_width) * lane_mbps(a.active_speed)
}

/// How a RoCE GID is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidChoice {
    /// `NCCL_IB_GID_INDEX`; negative: automatic.
    pub index: i64,
    /// `NCCL_IB_ROCE_VERSION_NUM` (1 or 2).
    pub roce_version: i64,
    /// `NCCL_IB_ADDR_FAMILY` is AF_INET6 (else AF_INET).
    pub ipv6: bool,
    /// `NCCL_IB_ADDR_RANGE`: the subnet the chosen GID's address must be in.
    pub range: Option<Subnet>,
    /// `NCCL_IB_ROUTABLE_FLID_GID_INDEX`: on an InfiniBand port, the GID used when it holds a
    /// routable FLID (else GID 0).
    pub routable_flid_index: i64,
}

/// The FLID of an InfiniBand GID in NVIDIA's routable layout (bytes 4-5, big-endian): the LID
/// that routers forward to the port from another subnet; 0 where none.
pub fn flid_of(gid: &Gid) -> u16 {
    u16::from_be_bytes([gid[4], gid[5]])
}

/// The local subnet of an InfiniBand GID (the low 16 bits of its subnet prefix, bytes 6-7).
pub fn ib_subnet_of(gid: &Gid) -> u16 {
    u16::from_be_bytes([gid[6], gid[7]])
}

/// The GID index of an InfiniBand port, as NVIDIA's `ncclIbGetGidIndex`: the routable index
/// when the table has it and its GID carries a FLID (`gid_at` reads the table), else 0.
pub fn ib_gid_index(gid_tbl_len: i32, routable: i64, gid_at: impl Fn(i32) -> Option<Gid>) -> i32 {
    match i32::try_from(routable) {
        Ok(i) if (0..gid_tbl_len).contains(&i) && gid_at(i).is_some_and(|g| flid_of(&g) != 0) => i,
        _ => 0,
    }
}

/// An address prefix: `bits` leading bits of `addr` (an IPv4 subnet is the IPv4-mapped form,
/// its prefix length counted from the mapped address's first bit, as a GID holds it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subnet {
    pub addr: Gid,
    pub bits: u32,
}

impl Subnet {
    /// `address/length` of the family (`ipv6`), as `NCCL_IB_ADDR_RANGE` gives it; None, said in
    /// an INFO line, for what does not parse (NVIDIA's library then ignores the setting too).
    pub fn parse(spec: &str, ipv6: bool) -> Option<Subnet> {
        let (addr, len) = spec.trim().split_once('/')?;
        let family = if ipv6 { "AF_INET6" } else { "AF_INET" };
        let parsed: Option<Gid> = if ipv6 {
            addr.parse::<std::net::Ipv6Addr>().ok().map(|a| a.octets())
        } else {
            addr.parse::<std::net::Ipv4Addr>()
                .ok()
                .map(|a| a.to_ipv6_mapped().octets())
        };
        let Some(addr) = parsed else {
            crate::info!(
                INIT | NET,
                "NET/IB: Ip address '{addr}' is invalid for family {family}, ignoring address"
            );
            return None;
        };
        let max = if ipv6 { 128 } else { 32 };
        match len.trim().parse::<u32>() {
            Ok(bits) if bits <= max => Some(Subnet {
                addr,
                bits: bits + 128 - max,
            }),
            _ => {
                crate::info!(
                    INIT | NET,
                    "NET/IB: Ip address mask '{len}' is invalid for family {family}, ignoring mask"
                );
                None
            }
        }
    }

    /// Whether `g` is in the subnet.
    pub fn contains(&self, g: &Gid) -> bool {
        let (a, b) = (u128::from_be_bytes(self.addr), u128::from_be_bytes(*g));
        let mask = u128::MAX.checked_shl(128 - self.bits).unwrap_or(0);
        (a ^ b) & mask == 0
    }
}

/// Whether a GID holds an IPv4 address: IPv4-mapped (`::ffff:a.b.c.d`) or an IPv4-mapped
/// multicast address (`ff0e::ffff:a.b.c.d`).
fn is_v4(g: &Gid) -> bool {
    let mapped_tail = g[4..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff;
    mapped_tail && (g[..4] == [0, 0, 0, 0] || g[..4] == [0xff, 0x0e, 0, 0])
}

/// Whether a GID is a configured address that is not link-local: not all zero, not
/// `fe80::` alone, and not in `fe80::/64`.
fn is_valid(g: &Gid) -> bool {
    let link_local_prefix = g[..4] == [0xfe, 0x80, 0, 0];
    let unset = g.iter().all(|&b| b == 0) || (link_local_prefix && g[4..].iter().all(|&b| b == 0));
    let link_local = link_local_prefix && g[4..8] == [0, 0, 0, 0];
    !unset && !link_local
}

/// The RoCE version of a GID type.
fn roce_version(gid_type: u32) -> i64 {
    if gid_type == verbs::GID_TYPE_ROCE_V2 {
        2
    } else {
        1
    }
}

/// The GID index to use among `gids` (index, GID, `GID_TYPE_*`, in table order) of a RoCE
/// port: the set one, else NVIDIA's choice (`ncclIbGetGidIndex`) re-derived: starting from
/// the first entry, each later one replaces the current choice when it brings the wanted
/// address family (and subnet) where the current one has the other family, or, being of the
/// wanted family, valid and in the subnet, the wanted RoCE version where the current one has
/// another version or is not valid. In effect the first valid GID of the wanted family,
/// subnet and version; else the first entry.
pub fn choose_gid(gids: &[(i32, Gid, u32)], choice: GidChoice) -> i32 {
    if choice.index >= 0 {
        return choice.index as i32;
    }
    let wanted_v4 = !choice.ipv6;
    let in_range = |g: &Gid| choice.range.is_none_or(|r| r.contains(g));
    let Some(mut current) = gids.first() else {
        return 0;
    };
    for cand in &gids[1..] {
        let (g, c) = (&current.1, &cand.1);
        let brings_family = is_v4(c) != is_v4(g) && is_v4(c) == wanted_v4 && in_range(c);
        let eligible = is_v4(c) == wanted_v4 && is_valid(c) && in_range(c);
        let brings_version = (roce_version(current.2) != roce_version(cand.2) || !is_valid(g))
            && roce_version(cand.2) == choice.roce_version;
        if brings_family || (eligible && brings_version) {
            current = cand;
        }
    }
    current.0
}

/// One usable port of a device: a device of the IB network.
pub struct Port {
    pub dev_name: String,
    pub port: u8,
    pub ctx: Arc<Context>,
    pub attr: PortAttr,
    /// The GID index used (RoCE, or InfiniBand's routable FLID GID), and the GID.
    pub gid_index: i32,
    pub gid: Gid,
    pub pci_path: String,
    pub speed_mbps: i32,
    /// The adapter's system image GUID (`Context::sys_image_guid`), NVIDIA's device GUID.
    pub guid: u64,
}

impl Port {
    pub fn is_roce(&self) -> bool {
        self.attr.link_layer == verbs::LINK_LAYER_ETHERNET
    }

    /// "soft_0:1/IB" or "mlx5_0:1/RoCE", as NVIDIA's device list shows it.
    pub fn label(&self) -> String {
        let ll = if self.is_roce() { "RoCE" } else { "IB" };
        format!("{}:{}/{ll}", self.dev_name, self.port)
    }
}

/// `<sysfs>/<dev>/device` resolved (`sysfs`: `SYSFS_INFINIBAND`), empty where it does not
/// exist.
pub fn pci_path(sysfs: &Path, dev: &str) -> String {
    if dev.contains('/') {
        return String::new();
    }
    std::fs::canonicalize(sysfs.join(dev).join("device"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Order `ports` by their PCI path's bus id, ports without a path last, keeping the order of
/// equal ones (NVIDIA's `NCCL_IB_DEVICE_PCI_ORDER`, on by default): device numbers then follow
/// the PCI bus rather than the verbs library's list.
pub fn in_pci_order(ports: &mut [Port]) {
    ports.sort_by_key(|p| pci_order_key(&p.pci_path));
}

fn pci_order_key(pci_path: &str) -> (bool, i64) {
    (
        pci_path.is_empty(),
        crate::topo::pci::pci_path_value(pci_path),
    )
}

/// The physical NIC of a PCI path: the path without the function of its last component
/// (`.../0000:17:00.1` and `.../0000:17:00.0` are one NIC); None without a path.
pub fn nic_of(pci_path: &str) -> Option<&str> {
    if pci_path.is_empty() {
        return None;
    }
    let last = pci_path.rsplit('/').next().unwrap_or(pci_path);
    match last.rfind('.') {
        Some(dot) => Some(&pci_path[..pci_path.len() - last.len() + dot]),
        None => Some(pci_path),
    }
}

/// The ports (indices into `keys`: each port's NIC and link layer) that make each network
/// device, in the order of each device's first port. With `merge`, a port joins the first
/// device before it of the same NIC and link layer that has fewer than `MAX_MEMBERS` ports;
/// a port without a NIC (no PCI path) stays alone. Without `merge`, one device per port.
pub fn merge_groups(keys: &[(Option<&str>, u8)], merge: bool) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, &(nic, link)) in keys.iter().enumerate() {
        let joins = |g: &&mut Vec<usize>| {
            let (first_nic, first_link) = keys[g[0]];
            merge
                && nic.is_some()
                && first_nic == nic
                && first_link == link
                && g.len() < MAX_MEMBERS
        };
        match groups.iter_mut().find(|g| joins(g)) {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
}

/// One network device of the IB network: a port, or the merged ports of one NIC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// Its ports, indices into the network's port list (at least one).
    pub members: Vec<usize>,
    /// The member device names joined with `+` (`mlx5_0+mlx5_1`), as NVIDIA names it.
    pub name: String,
    /// The members' speeds summed.
    pub speed_mbps: i32,
}

impl Device {
    /// The device of the ports `members` of `ports`.
    pub fn of(ports: &[Port], members: Vec<usize>) -> Device {
        let name = members
            .iter()
            .map(|&m| ports[m].dev_name.as_str())
            .collect::<Vec<_>>()
            .join("+");
        let speed_mbps = members.iter().map(|&m| ports[m].speed_mbps).sum();
        Device {
            members,
            name,
            speed_mbps,
        }
    }
}

/// The network devices of `ports`: merged per NIC with `merge` (`NCCL_IB_MERGE_NICS`).
pub fn make_devices(ports: &[Port], merge: bool) -> Vec<Device> {
    let keys: Vec<(Option<&str>, u8)> = ports
        .iter()
        .map(|p| (nic_of(&p.pci_path), p.attr.link_layer))
        .collect();
    merge_groups(&keys, merge)
        .into_iter()
        .map(|g| Device::of(ports, g))
        .collect()
}

/// Every ACTIVE port `filter` selects, of every device `lib` finds, with its GID and its PCI
/// path under `sysfs`.
pub fn find_ports(
    lib: &Arc<Lib>,
    filter: &HcaFilter,
    gid: GidChoice,
    sysfs: &Path,
) -> Result<Vec<Port>> {
    let mut ports = Vec::new();
    // A library without kernel support finds no device list at all: no device either.
    let names = lib.device_names().unwrap_or_else(|e| {
        crate::info!(NET, "{}", e.msg);
        Vec::new()
    });
    for name in names {
        let ctx = match lib.open_device(&name) {
            Ok(c) => c,
            Err(e) => {
                crate::warn!("NET/IB : {}", e.msg);
                continue;
            }
        };
        for port in 1..=u8::MAX {
            let Ok(attr) = ctx.query_port(port) else {
                break;
            };
            if attr.state != verbs::PORT_ACTIVE || !filter.selects(&name, port) {
                continue;
            }
            let roce = attr.link_layer == verbs::LINK_LAYER_ETHERNET;
            if !roce && attr.link_layer != verbs::LINK_LAYER_INFINIBAND && attr.link_layer != 0 {
                continue;
            }
            let gid_index = if roce {
                let gids: Vec<(i32, Gid, u32)> = (0..attr.gid_tbl_len.max(0))
                    .filter_map(|i| ctx.query_gid(port, i).map(|(g, t)| (i, g, t)))
                    .collect();
                choose_gid(&gids, gid)
            } else {
                ib_gid_index(attr.gid_tbl_len, gid.routable_flid_index, |i| {
                    ctx.query_gid(port, i).map(|(g, _)| g)
                })
            };
            let gid_bytes = ctx.query_gid(port, gid_index).map_or([0; 16], |(g, _)| g);
            ports.push(Port {
                dev_name: name.clone(),
                port,
                ctx: ctx.clone(),
                attr,
                gid_index,
                gid: gid_bytes,
                pci_path: pci_path(sysfs, &name),
                speed_mbps: port_speed_mbps(&attr),
                guid: ctx.sys_image_guid(),
            });
        }
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, port: Option<u8>) -> HcaEntry {
        HcaEntry {
            name: name.into(),
            port,
        }
    }

    #[test]
    fn hca_lists_parse_as_nvidias() {
        assert_eq!(HcaFilter::parse(None), HcaFilter::default());
        assert_eq!(HcaFilter::parse(Some("  ")), HcaFilter::default());
        let f = HcaFilter::parse(Some("mlx5_0:1,mlx5_1"));
        assert!(!f.exclude && !f.exact);
        assert_eq!(
            f.entries,
            vec![entry("mlx5_0", Some(1)), entry("mlx5_1", None)]
        );
        let f = HcaFilter::parse(Some("^=mlx5_3"));
        assert!(f.exclude && f.exact);
        assert_eq!(f.entries, vec![entry("mlx5_3", None)]);
        let f = HcaFilter::parse(Some("=mlx5_1:2"));
        assert!(!f.exclude && f.exact);
        assert_eq!(f.entries, vec![entry("mlx5_1", Some(2))]);
    }

    #[test]
    fn hca_filters_match_prefixes_exact_names_ports_and_exclusions() {
        let all = HcaFilter::parse(None);
        assert!(all.selects("mlx5_0", 1));
        let prefix = HcaFilter::parse(Some("mlx5"));
        assert!(prefix.selects("mlx5_0", 1) && prefix.selects("mlx5_10", 2));
        assert!(!prefix.selects("soft_0", 1));
        let exact = HcaFilter::parse(Some("=mlx5_1"));
        assert!(exact.selects("mlx5_1", 1) && !exact.selects("mlx5_10", 1));
        let port = HcaFilter::parse(Some("mlx5_0:2"));
        assert!(port.selects("mlx5_0", 2) && !port.selects("mlx5_0", 1));
        let not = HcaFilter::parse(Some("^mlx5_0"));
        assert!(!not.selects("mlx5_0", 1) && not.selects("mlx5_1", 1));
        // Prefix exclusion: "^mlx5_1" also excludes mlx5_10, "^=mlx5_1" does not.
        assert!(!HcaFilter::parse(Some("^mlx5_1")).selects("mlx5_10", 1));
        assert!(HcaFilter::parse(Some("^=mlx5_1")).selects("mlx5_10", 1));
        let not_port = HcaFilter::parse(Some("^soft_0:2"));
        assert!(not_port.selects("soft_0", 1) && !not_port.selects("soft_0", 2));
    }

    #[test]
    fn ports_sort_by_bus_id_with_pathless_ones_last() {
        let paths = [
            "",
            "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0",
            "/sys/devices/pci0000:16/0000:16:02.0/0000:17:00.1",
            "/sys/devices/pci0000:16/0000:16:02.0/0000:17:00.0",
        ];
        let mut keyed: Vec<(usize, (bool, i64))> = paths
            .iter()
            .enumerate()
            .map(|(i, p)| (i, pci_order_key(p)))
            .collect();
        keyed.sort_by_key(|&(_, k)| k);
        let order: Vec<usize> = keyed.iter().map(|&(i, _)| i).collect();
        assert_eq!(order, vec![3, 2, 1, 0]);
    }

    #[test]
    fn a_nic_is_its_pci_path_without_the_function() {
        let a = "/sys/devices/pci0000:16/0000:16:02.0/0000:17:00.0";
        let b = "/sys/devices/pci0000:16/0000:16:02.0/0000:17:00.1";
        assert_eq!(
            nic_of(a),
            Some("/sys/devices/pci0000:16/0000:16:02.0/0000:17:00")
        );
        assert_eq!(nic_of(a), nic_of(b));
        assert_ne!(
            nic_of(a),
            nic_of("/sys/devices/pci0000:16/0000:16:02.0/0000:18:00.1")
        );
        assert_eq!(nic_of(""), None);
    }

    #[test]
    fn ports_of_one_nic_and_link_layer_merge_and_others_do_not() {
        let (ib, eth) = (verbs::LINK_LAYER_INFINIBAND, verbs::LINK_LAYER_ETHERNET);
        let keys = [
            (Some("nicA"), ib),
            (Some("nicB"), ib),
            (Some("nicA"), ib),
            (None, ib),
            (None, ib),
            (Some("nicB"), eth),
            (Some("nicB"), ib),
        ];
        assert_eq!(
            merge_groups(&keys, true),
            vec![vec![0, 2], vec![1, 6], vec![3], vec![4], vec![5]]
        );
        let apart: Vec<Vec<usize>> = (0..keys.len()).map(|i| vec![i]).collect();
        assert_eq!(merge_groups(&keys, false), apart);
        // At most MAX_MEMBERS ports in one device; the rest start another.
        let many = vec![(Some("nic"), ib); MAX_MEMBERS + 2];
        let g = merge_groups(&many, true);
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].len(), MAX_MEMBERS);
        assert_eq!(g[1], vec![MAX_MEMBERS, MAX_MEMBERS + 1]);
    }

    #[test]
    fn port_speed_is_width_times_lane_speed() {
        let a = |w, s| PortAttr {
            active_width: w,
            active_speed: s,
            ..PortAttr::default()
        };
        assert_eq!(port_speed_mbps(&a(2, 32)), 100_000, "4x EDR");
        assert_eq!(port_speed_mbps(&a(2, 64)), 200_000, "4x HDR");
        assert_eq!(port_speed_mbps(&a(2, 128)), 400_000, "4x NDR");
        assert_eq!(port_speed_mbps(&a(1, 1)), 2500, "1x SDR");
        assert_eq!(port_speed_mbps(&a(16, 64)), 100_000, "2x HDR");
        assert_eq!(port_speed_mbps(&a(8, 4)), 120_000, "12x QDR");
    }

    fn v4(a: [u8; 4]) -> Gid {
        let mut g = [0; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&a);
        g
    }

    fn v6(first: u8) -> Gid {
        let mut g = [0; 16];
        g[0] = first;
        g[1] = 0x80;
        g[15] = 1;
        g
    }

    #[test]
    fn roce_gids_are_chosen_by_version_and_family_unless_an_index_is_set() {
        use verbs::{GID_TYPE_ROCE_V1 as V1, GID_TYPE_ROCE_V2 as V2};
        // A typical table: link-local v1/v2, then the IPv4 address v1/v2, then a global IPv6.
        let gids = vec![
            (0, v6(0xfe), V1),
            (1, v6(0xfe), V2),
            (2, v4([10, 0, 0, 1]), V1),
            (3, v4([10, 0, 0, 1]), V2),
            (4, v6(0x20), V1),
            (5, v6(0x20), V2),
        ];
        let auto = GidChoice {
            index: -1,
            roce_version: 2,
            ipv6: false,
            range: None,
            routable_flid_index: 1,
        };
        assert_eq!(choose_gid(&gids, auto), 3, "RoCE v2, IPv4");
        assert_eq!(
            choose_gid(
                &gids,
                GidChoice {
                    roce_version: 1,
                    ..auto
                }
            ),
            2
        );
        assert_eq!(choose_gid(&gids, GidChoice { ipv6: true, ..auto }), 5);
        assert_eq!(choose_gid(&gids, GidChoice { index: 4, ..auto }), 4);
        // No address of the family: the first entry, as NVIDIA's.
        assert_eq!(choose_gid(&gids[..2], auto), 0);
        assert_eq!(choose_gid(&gids[..1], auto), 0);
        assert_eq!(choose_gid(&[], auto), 0);
        // Empty entries are skipped.
        let with_empty = vec![(0, [0; 16], V2), (1, v4([1, 2, 3, 4]), V2)];
        assert_eq!(choose_gid(&with_empty, auto), 1);
    }

    #[test]
    fn the_address_range_picks_the_gid_in_its_subnet() {
        use verbs::GID_TYPE_ROCE_V2 as V2;
        let gids = vec![
            (0, v6(0xfe), V2),
            (1, v4([10, 1, 0, 7]), V2),
            (2, v4([192, 168, 5, 7]), V2),
            (3, v6(0x20), V2),
        ];
        let v4_range = |spec| GidChoice {
            index: -1,
            roce_version: 2,
            ipv6: false,
            range: Subnet::parse(spec, false),
            routable_flid_index: 1,
        };
        assert_eq!(choose_gid(&gids, v4_range("0.0.0.0/0")), 1);
        assert_eq!(choose_gid(&gids, v4_range("192.168.0.0/16")), 2);
        assert_eq!(choose_gid(&gids, v4_range("192.168.5.7/32")), 2);
        assert_eq!(choose_gid(&gids, v4_range("10.0.0.0/8")), 1);
        assert_eq!(choose_gid(&gids, v4_range("10.1.0.0/24")), 1);
        assert_eq!(
            choose_gid(&gids, v4_range("10.2.0.0/16")),
            0,
            "nothing in range: the first entry"
        );
        // What does not parse is ignored, as NVIDIA's.
        assert_eq!(Subnet::parse("10.0.0.0", false), None);
        assert_eq!(Subnet::parse("10.0.0/8", false), None);
        assert_eq!(Subnet::parse("10.0.0.0/33", false), None);
        assert_eq!(Subnet::parse("2001:db8::/129", true), None);
        let v6_range = GidChoice {
            ipv6: true,
            range: Subnet::parse("2000::/8", true),
            ..v4_range("")
        };
        assert_eq!(choose_gid(&gids, v6_range), 3);
        let elsewhere = GidChoice {
            range: Subnet::parse("2001:db8::/32", true),
            ..v6_range
        };
        assert_eq!(choose_gid(&gids, elsewhere), 0);
    }

    /// An InfiniBand GID in NVIDIA's routable layout.
    fn routable(flid: u16, subnet: u16) -> Gid {
        let mut g = [0u8; 16];
        g[..2].copy_from_slice(&[0xfe, 0x80]);
        g[4..6].copy_from_slice(&flid.to_be_bytes());
        g[6..8].copy_from_slice(&subnet.to_be_bytes());
        g[8..].copy_from_slice(&0x0002_c903_0001_0203_u64.to_be_bytes());
        g
    }

    #[test]
    fn an_ib_port_uses_its_routable_gid_where_it_has_a_flid() {
        let table = [routable(0, 0), routable(0xc123, 7)];
        let at = |i: i32| table.get(i as usize).copied();
        assert_eq!(flid_of(&table[1]), 0xc123);
        assert_eq!(ib_subnet_of(&table[1]), 7);
        assert_eq!(ib_gid_index(2, 1, at), 1);
        assert_eq!(ib_gid_index(1, 1, at), 0, "past the table");
        assert_eq!(ib_gid_index(2, 0, at), 0);
        assert_eq!(ib_gid_index(2, -1, at), 0);
        let no_flid = [routable(0, 0), routable(0, 7)];
        assert_eq!(ib_gid_index(2, 1, |i| no_flid.get(i as usize).copied()), 0);
    }
}
