//! Tests of topology files: the fixtures under `testdata/` read, written back, and what they
//! make of GPU–NIC affinity, NVLink counts, network speeds and the channel weights.

use super::*;
use crate::abi::ncclResult_t;
use crate::sched::weights::{RouteClaim, Routes, Verdict};
use crate::topo::nics::{choose, Choice, NetDevice, NetDevsPolicy};
use crate::topo::pci::tests::FakeSysfs;
use crate::topo::pci::PathType::{Phb, Pix, Sys};
use crate::topo::Topology;
use crate::transport::net::resolve_speed;

const DGX: &str = include_str!("testdata/dgx-h100.xml");
const ASYM: &str = include_str!("testdata/asymmetric-2gpu.xml");

const DGX_GPUS: [&str; 8] = [
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
];

fn dgx() -> NodeFile {
    NodeFile::parse(DGX, "dgx-h100.xml").unwrap()
}

fn asym() -> NodeFile {
    NodeFile::parse(ASYM, "asymmetric-2gpu.xml").unwrap()
}

/// One rank per GPU of `buses` on one host, seen from rank `me`.
fn topo(buses: &[&str], me: i32) -> Topology {
    crate::topo::one_host_for_tests(buses, me, 0)
}

fn named(names: &[&str]) -> Vec<NetDevice> {
    names
        .iter()
        .map(|n| NetDevice {
            name: n.to_string(),
            pci_path: String::new(),
        })
        .collect()
}

/// The file over an empty sysfs: only what the file says places anything.
fn choice(file: &NodeFile, buses: &[&str], me: i32, nics: &[NetDevice]) -> Choice {
    let fake = FakeSysfs::new();
    let locator = Locator {
        sysfs: fake.sysfs(),
        file: Some(Arc::new(file.clone())),
    };
    choose(&locator, &topo(buses, me), nics, NetDevsPolicy::Auto)
}

#[test]
fn the_dgx_fixture_reads_as_a_dgx() {
    let f = dgx();
    assert_eq!(f.name(), Some("dgx-h100-like"));
    assert_eq!(f.cpus.len(), 2);
    assert_eq!(f.gpu_bus_ids(), DGX_GPUS);
    assert_eq!(f.pcis().len(), 24, "8 switches, 8 GPUs, 8 NICs");
    for bus in DGX_GPUS {
        assert_eq!(f.gpu_nvlinks(bus), Some(18), "{bus}");
    }
    assert_eq!(f.gpu_nvlinks("0000:19:00.0"), None, "a NIC has no NVLinks");
    let nets = f.nets();
    assert_eq!(nets.len(), 8);
    let (n, place) = f.net("mlx5_4").unwrap();
    assert_eq!(
        (n.speed_mbps, n.port, n.gdr),
        (Some(400000), Some(1), Some(true))
    );
    assert_eq!(place.switches, vec!["0000:98:00.0"]);
    assert_eq!(place.numa, 1);
    let gpu4 = f.pci_place("0000:9A:00.0").unwrap();
    assert_eq!(gpu4, place, "GPU 4 and mlx5_4 below one switch");
    assert_eq!(f.pci_place("9a:00.0"), Some(gpu4), "domain 0 by default");
    assert_eq!(f.pci_place("0000:9c:00.0"), None);
}

#[test]
fn files_written_back_read_the_same() {
    for (text, name) in [(DGX, "dgx"), (ASYM, "asym")] {
        let f = NodeFile::parse(text, name).unwrap();
        let written = f.to_xml();
        let again = NodeFile::parse(&written, "written").unwrap();
        assert_eq!(again, f, "{name}");
        assert_eq!(again.to_xml(), written, "{name}: a fixed point");
    }
    // Attributes are kept in their order, with their values as written.
    let written = dgx().to_xml();
    assert!(written.contains(
        "<net name=\"mlx5_0\" dev=\"0\" speed=\"400000\" port=\"1\" latency=\"0.000000\" \
         guid=\"0xa088c20300e1f000\" maxconn=\"131072\" gdr=\"1\"/>"
    ));
    assert!(
        written.contains("<nvlink target=\"fffffff:ffff:ff\" count=\"18\" tclass=\"0x068000\"/>")
    );
}

#[test]
fn each_dgx_gpu_takes_the_nic_below_its_switch() {
    let f = dgx();
    let nics = named(&[
        "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7",
    ]);
    for g in 0..8 {
        let c = choice(&f, &DGX_GPUS, g, &nics);
        assert_eq!(c.devices, vec![g as usize], "GPU {g}");
        let expected: Vec<_> = (0..8)
            .map(|n| match (n == g, n / 4 == g / 4) {
                (true, _) => Pix,
                (false, true) => Phb,
                (false, false) => Sys,
            })
            .collect();
        assert_eq!(c.types, expected, "GPU {g}");
    }
}

#[test]
fn a_device_the_file_does_not_name_is_found_by_its_pci_bus_id() {
    // The network calls the ports ib0..; their PCI paths end in the file's NIC bus ids.
    let f = dgx();
    let nics: Vec<NetDevice> = ["19", "2b", "9b"]
        .iter()
        .enumerate()
        .map(|(i, b)| NetDevice {
            name: format!("ib{i}"),
            pci_path: format!("/sys/devices/pci0000:00/0000:00:01.0/0000:{b}:00.0"),
        })
        .collect();
    let c = choice(&f, &DGX_GPUS, 4, &nics);
    assert_eq!((c.devices, c.types), (vec![2], vec![Sys, Sys, Pix]));
    // A file that is only a PCI tree (as the ones cloud images ship): GPUs and NICs by bus id.
    let tree = "<system version=\"1\">\n<cpu numaid=\"0\">\n\
        <pci busid=\"ffff:ff:01.0\" class=\"0x060400\">\n\
        <pci busid=\"0001:00:00.0\" class=\"0x030200\"/>\n\
        <pci busid=\"0101:00:00.0\" class=\"0x020700\"/>\n</pci>\n\
        <pci busid=\"ffff:ff:02.0\" class=\"0x060400\">\n\
        <pci busid=\"0002:00:00.0\" class=\"0x030200\"/>\n\
        <pci busid=\"0102:00:00.0\" class=\"0x020700\"/>\n</pci>\n</cpu>\n</system>\n";
    let f = NodeFile::parse(tree, "tree").unwrap();
    assert_eq!(f.gpu_bus_ids(), vec!["0001:00:00.0", "0002:00:00.0"]);
    let nics: Vec<NetDevice> = ["0101", "0102"]
        .iter()
        .map(|d| NetDevice {
            name: "x".into(),
            pci_path: format!("/sys/devices/pci{d}:00/{d}:00:00.0"),
        })
        .collect();
    let gpus = ["0001:00:00.0", "0002:00:00.0"];
    assert_eq!(choice(&f, &gpus, 0, &nics).devices, vec![0]);
    assert_eq!(choice(&f, &gpus, 1, &nics).devices, vec![1]);
    assert_eq!(
        f.gpu_nvlinks("0001:00:00.0"),
        None,
        "no <gpu>: detected NVLinks"
    );
}

#[test]
fn the_asymmetric_box_gives_each_gpu_its_own_nic_and_speed() {
    let f = asym();
    let gpus = ["0000:17:00.0", "0000:86:00.0"];
    let nics = named(&["mlx5_0", "eth1"]);
    let c0 = choice(&f, &gpus, 0, &nics);
    assert_eq!((c0.devices, c0.types), (vec![0], vec![Pix, Sys]));
    let c1 = choice(&f, &gpus, 1, &nics);
    assert_eq!((c1.devices, c1.types), (vec![1], vec![Sys, Pix]));
    // The speeds that go into the route claims: the file's over what the devices report,
    // OXCCL_NET_SPEEDS over the file's; devices it does not name keep theirs.
    assert_eq!(resolve_speed("mlx5_0", 200000, &[], Some(&f)), 100000);
    assert_eq!(resolve_speed("eth1", 0, &[], Some(&f)), 25000);
    let over = [("eth1".to_string(), 1000)];
    assert_eq!(resolve_speed("eth1", 10000, &over, Some(&f)), 1000);
    assert_eq!(resolve_speed("eth9", 10000, &[], Some(&f)), 10000);
    assert_eq!(
        f.gpu_nvlinks("0000:17:00.0"),
        None,
        "a <gpu> without <nvlink>"
    );
}

fn claim(speeds: Vec<u32>) -> RouteClaim {
    RouteClaim {
        speeds_mbps: speeds,
        weighted: true,
        hop_mbps: 0,
        adaptive: false,
    }
}

#[test]
fn the_asymmetric_speeds_weight_the_channels() {
    let f = asym();
    let nics = named(&["mlx5_0", "eth1"]);
    let speeds = |c: &Choice| -> Vec<u32> {
        c.devices
            .iter()
            .map(|&d| resolve_speed(&nics[d].name, 10000, &[], Some(&f)))
            .collect()
    };
    // Two such boxes, a rank on GPU 0 of each: one device each, even routes.
    let gpu0 = choice(&f, &["0000:17:00.0", "0000:86:00.0"], 0, &nics);
    let claims = vec![claim(speeds(&gpu0)); 2];
    assert_eq!(claims[0].speeds_mbps, vec![100000]);
    assert_eq!(Routes::agree(64, &claims).1, Verdict::OneDevice);
    // A GPU the file does not describe (and sysfs does not list) uses both NICs: 4:1.
    let both = choice(&f, &["0000:c1:00.0"], 0, &nics);
    assert_eq!(both.devices, vec![0, 1]);
    let claims = vec![claim(speeds(&both)); 2];
    assert_eq!(claims[0].speeds_mbps, vec![100000, 25000]);
    let (routes, verdict) = Routes::agree(64, &claims);
    assert_eq!(verdict, Verdict::Weighted);
    let names = vec!["mlx5_0".to_string(), "eth1".to_string()];
    assert_eq!(
        routes.describe(64, &names),
        vec![
            "dev 0 (mlx5_0) 100000 Mbit/s: 51 channels",
            "dev 1 (eth1) 25000 Mbit/s: 13 channels"
        ]
    );
    // Five channels: four on the fast NIC, one on the slow; equal weights per channel.
    assert_eq!(
        routes.describe(5, &names)[0],
        "dev 0 (mlx5_0) 100000 Mbit/s: 4 channels"
    );
    assert_eq!(routes.weights(5), None, "each channel carries 25000 Mbit/s");
    // Three channels: two share the fast NIC, one has the slow one: bytes 2:2:1.
    let w = routes.weights(3).unwrap();
    assert_eq!((w[0], w[1]), (2 * w[2], 2 * w[2]));
}

#[test]
fn without_a_file_nothing_changes() {
    let fake = FakeSysfs::new();
    let gpu = "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0";
    let nic = "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:04.0/0000:1a:00.0";
    fake.device(gpu, 0, true);
    fake.device(nic, 0, false);
    let nics = vec![
        NetDevice {
            name: "far".into(),
            pci_path: String::new(),
        },
        NetDevice {
            name: "near".into(),
            pci_path: nic.into(),
        },
    ];
    let t = topo(&["0000:18:00.0"], 0);
    let plain = choose(&fake.sysfs(), &t, &nics, NetDevsPolicy::Auto);
    let located = Locator {
        sysfs: fake.sysfs(),
        file: None,
    };
    assert_eq!(choose(&located, &t, &nics, NetDevsPolicy::Auto), plain);
    assert_eq!(plain.devices, vec![1]);
    assert_eq!(nvlinks_of(None, "0000:18:00.0", 12), 12);
    assert_eq!(resolve_speed("near", 200000, &[], None), 200000);
    // A file that describes other devices leaves these as sysfs has them.
    let other = Locator {
        sysfs: fake.sysfs(),
        file: Some(Arc::new(dgx())),
    };
    assert_eq!(choose(&other, &t, &nics, NetDevsPolicy::Auto), plain);
}

#[test]
fn the_file_replaces_detected_nvlinks_of_the_gpus_it_lists() {
    let f = dgx();
    assert_eq!(nvlinks_of(Some(&f), "0000:18:00.0", 0), 18);
    assert_eq!(
        nvlinks_of(Some(&f), "0000:c1:00.0", 4),
        4,
        "not in the file"
    );
    let none = "<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:17:00.0\">\
                <gpu><nvlink target=\"0000:18:00.0\" count=\"0\" tclass=\"0x030200\"/></gpu>\
                </pci></cpu></system>";
    let f = NodeFile::parse(none, "none").unwrap();
    assert_eq!(
        nvlinks_of(Some(&f), "0000:17:00.0", 18),
        0,
        "count 0: no NVLink"
    );
}

/// The message of the error `text` gives, checked to be `ncclInvalidUsage` naming `t.xml`.
fn error_of(text: &str) -> String {
    let e = NodeFile::parse(text, "t.xml").unwrap_err();
    assert_eq!(e.code, ncclResult_t::ncclInvalidUsage, "{}", e.msg);
    assert!(e.msg.starts_with("NCCL_TOPO_FILE t.xml:"), "{}", e.msg);
    e.msg
}

#[test]
fn bad_files_are_invalid_usage_naming_file_and_line() {
    let m = error_of("<system version=\"1\">\n<cpu numaid=\"0\">\n<pci busid=\"0000:17:00.0\">\n</cpu>\n</system>");
    assert!(m.contains("t.xml:4: </cpu> closes <pci> (line 3)"), "{m}");
    let m = error_of("<system version=\"2\"/>");
    assert!(
        m.contains(":1: XML Topology has wrong version 2, 1 needed"),
        "{m}"
    );
    let m = error_of("<system/>");
    assert!(m.contains("<system> without attribute 'version'"), "{m}");
    let m = error_of("<system version=\"1\">\n  <cpu affinity=\"ff\"/>\n</system>");
    assert!(m.contains(":2: <cpu> without attribute 'numaid'"), "{m}");
    let m = error_of(
        "<system version=\"1\"><cpu numaid=\"0\">\n<pci class=\"0x0604\"/></cpu></system>",
    );
    assert!(m.contains(":2: <pci> without attribute 'busid'"), "{m}");
    let m =
        error_of("<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"17:00\"/></cpu></system>");
    assert!(m.contains("busid=\"17:00\" is not a PCI bus id"), "{m}");
    let m = error_of(
        "<system version=\"1\"><cpu numaid=\"0\"><nic>\n<net dev=\"0\"/></nic></cpu></system>",
    );
    assert!(m.contains(":2: <net> without attribute 'name'"), "{m}");
    let m = error_of(
        "<system version=\"1\"><cpu numaid=\"0\"><nic><net name=\"a\" speed=\"fast\"/></nic></cpu></system>",
    );
    assert!(m.contains("<net> speed=\"fast\" is not an integer"), "{m}");
    let m = error_of(
        "<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:17:00.0\"><gpu>\n\
         <nvlink target=\"x\"/></gpu></pci></cpu></system>",
    );
    assert!(m.contains(":2: <nvlink> without attribute 'count'"), "{m}");
    let m = error_of(
        "<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:17:00.0\" link_width=\"999\"/></cpu></system>",
    );
    assert!(m.contains("link_width=\"999\" is out of range"), "{m}");
    let m = error_of(
        "<system version=\"1\"><cpu numaid=\"0\">\n<pci busid=\"0000:17:00.0\"/>\n\
         <pci busid=\"0000:17:00.0\"/></cpu></system>",
    );
    assert!(
        m.contains(":3: bus id 0000:17:00.0 twice (first on line 2)"),
        "{m}"
    );
    let m = error_of(
        "<system version=\"1\"><cpu numaid=\"0\"><nic><net name=\"a\"/><net name=\"a\"/></nic></cpu></system>",
    );
    assert!(m.contains("network device a twice"), "{m}");
    let m = error_of("<topology version=\"1\"/>");
    assert!(m.contains("<topology> where <system> was expected"), "{m}");
    let m = error_of("<system version=\"1\">\n<cpu numaid=\"0\"/");
    assert!(m.contains(":2: expected '>' after '/' in <cpu>"), "{m}");
    // Elements it does not know are skipped, as NVIDIA's.
    let ok = "<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:17:00.0\">\
              <pcilink target=\"x\"/><gpu><c2c bw=\"1\" count=\"2\"/></gpu></pci></cpu>\
              <extra/></system>";
    assert_eq!(NodeFile::parse(ok, "ok").unwrap().gpu_bus_ids().len(), 1);
}

#[test]
fn files_load_from_disk_with_their_path_in_errors() {
    let dir = std::env::temp_dir().join(format!("oxccl-topo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.xml");
    std::fs::write(&good, ASYM).unwrap();
    assert_eq!(NodeFile::load(good.to_str().unwrap()).unwrap(), asym());
    let bad = dir.join("bad.xml");
    std::fs::write(&bad, "<system version=\"1\">\n<cpu>\n</system>\n").unwrap();
    let e = NodeFile::load(bad.to_str().unwrap()).unwrap_err();
    assert!(
        e.msg.contains(&format!(
            "{}:3: </system> closes <cpu> (line 2)",
            bad.display()
        )),
        "{}",
        e.msg
    );
    let missing = dir.join("missing.xml");
    let e = NodeFile::load(missing.to_str().unwrap()).unwrap_err();
    assert_eq!(e.code, ncclResult_t::ncclInvalidUsage);
    // A folder (or a pipe) is no file: an error, not a read that waits.
    let e = NodeFile::load(dir.to_str().unwrap()).unwrap_err();
    assert!(e.msg.contains("not a regular file"), "{}", e.msg);
    std::fs::remove_dir_all(&dir).unwrap();
}
