//! Two "hosts" on this machine: two network namespaces joined by veth pairs, one process in
//! each, as two machines on one or two links would be. Each process finds its interfaces
//! without `NCCL_SOCKET_IFNAME` (the veth ends, not loopback), bootstraps through
//! `NCCL_COMM_ID` at rank 0's address, and moves data over the built-in socket network
//! between the namespaces, on every device it found (each interface a device, as NVIDIA's).
//! One more cuts the link after the bootstrap: the silent peer's connection must end within
//! `OXCCL_DEAD_PEER_S`. Another shapes two links with `tc` to unequal rates and moves one
//! transfer over channels routed as the planner routes them (`sched::weights`), counting the
//! bytes each link carried; `meter_cut` cuts the faster of two such links mid-run and watches
//! the adaptive weights' meter and exchange follow. Needs root and `ip` (iproute2), and `tc`
//! for the shaped links; skipped, saying so, where namespaces cannot be made.

use super::api::{Comm, Handle, MemType, Net, Request, HANDLE_BYTES};
use super::socket::{handle_address, SocketNet};
use super::tests::until;
use crate::bootstrap::{get_unique_id_with, Bootstrap, BootstrapConfig};
use std::collections::HashMap;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "OXCCL_TWO_HOSTS_CHILD";
/// Set in the children of the cut-off test (`wait_to_be_cut_off`).
const CUT_ENV: &str = "OXCCL_TWO_HOSTS_CUT";
/// Set in the children of the weighted-routes test (`move_over_routes`).
const WEIGHTS_ENV: &str = "OXCCL_TWO_HOSTS_WEIGHTS";
/// Bytes rank 0 sends rank 1 on each device.
const MESSAGE: usize = 3 << 20;

mod meter_cut;

/// One veth pair: its ends' names (in namespace a, b) and their addresses with prefix.
/// Ends in different subnets get a host route to each other (`routed`), as hosts reached
/// through a router are.
struct Link {
    ends: [&'static str; 2],
    addrs: [&'static str; 2],
    routed: bool,
}

/// Private addresses that exist only inside the namespaces.
const V4: Link = Link {
    ends: ["oxv0", "oxv1"],
    addrs: ["10.213.77.1/30", "10.213.77.2/30"],
    routed: false,
};
const V4_SECOND: Link = Link {
    ends: ["oxw0", "oxw1"],
    addrs: ["10.213.78.1/30", "10.213.78.2/30"],
    routed: false,
};
const V6: Link = Link {
    ends: ["oxv0", "oxv1"],
    addrs: ["fd00:213:77::1/64", "fd00:213:77::2/64"],
    routed: false,
};
/// Rank 1 in another subnet than rank 0 (and NCCL_COMM_ID), reached by a route.
const ROUTED: Link = Link {
    ends: ["oxv0", "oxv1"],
    addrs: ["10.213.77.1/30", "10.213.80.2/30"],
    routed: true,
};

fn address(with_prefix: &str) -> &str {
    with_prefix.split('/').next().unwrap()
}

impl Link {
    /// Each end's host route to the other end: `[b's address, a's address]`.
    fn hosts(&self) -> [&'static str; 2] {
        [address(self.addrs[1]), address(self.addrs[0])]
    }
}

/// Two namespaces joined by `links`, each end addressed and up, loopback up too; removed
/// (with the pairs) on drop.
struct TwoHosts {
    names: [String; 2],
}

fn ip(args: &[&str]) -> std::io::Result<Output> {
    Command::new("ip").args(args).stdin(Stdio::null()).output()
}

impl TwoHosts {
    /// The namespaces (`tag` tells apart those of tests running at once), or why they cannot
    /// be made here.
    fn create(tag: &str, links: &[&Link]) -> Result<TwoHosts, String> {
        let pid = std::process::id();
        let hosts = TwoHosts {
            names: [
                format!("oxccl-{pid}-{tag}-a"),
                format!("oxccl-{pid}-{tag}-b"),
            ],
        };
        let ns = [hosts.names[0].as_str(), hosts.names[1].as_str()];
        let mut steps: Vec<Vec<&str>> =
            vec![vec!["netns", "add", ns[0]], vec!["netns", "add", ns[1]]];
        for link in links {
            steps.push(vec![
                "link",
                "add",
                link.ends[0],
                "netns",
                ns[0],
                "type",
                "veth",
                "peer",
                "name",
                link.ends[1],
                "netns",
                ns[1],
            ]);
            for ((side, end), addr) in ns.iter().zip(link.ends).zip(link.addrs) {
                // nodad: an IPv6 address is usable at once, without duplicate detection.
                steps.push(vec!["-n", side, "addr", "add", addr, "dev", end, "nodad"]);
                steps.push(vec!["-n", side, "link", "set", end, "up"]);
            }
            if link.routed {
                for (side, (end, peer)) in ns.iter().zip(link.ends.iter().zip(link.hosts())) {
                    steps.push(vec!["-n", side, "route", "add", peer, "dev", end]);
                }
            }
        }
        for side in ns {
            steps.push(vec!["-n", side, "link", "set", "lo", "up"]);
        }
        for step in &steps {
            let out = ip(step).map_err(|e| format!("cannot run ip: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "ip {}: {}",
                    step.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        for link in links {
            for (side, end) in ns.iter().zip(link.ends) {
                hosts.wait_running(side, end)?;
            }
        }
        // `ip netns exec` also remounts /sys, which a confined container may refuse.
        let exec = ip(&["netns", "exec", ns[0], "true"]).map_err(|e| e.to_string())?;
        if !exec.status.success() {
            return Err(format!(
                "ip netns exec: {}",
                String::from_utf8_lossy(&exec.stderr).trim()
            ));
        }
        Ok(hosts)
    }

    /// Wait (at most 10 s) until `end` in namespace `ns` is running: the kernel raises a
    /// link's carrier, which the libraries require (`IFF_RUNNING`), a moment after it is up.
    fn wait_running(&self, ns: &str, end: &str) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let out = ip(&["-n", ns, "-o", "link", "show", "dev", end])
                .map_err(|e| format!("cannot run ip: {e}"))?;
            let flags = String::from_utf8_lossy(&out.stdout).into_owned();
            if flags.contains(",LOWER_UP") || flags.contains("<LOWER_UP") {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(10) {
                return Err(format!("{end} in {ns} is not running after 10 s: {flags}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Both ranks (rank r in namespace r) of this test binary's `two_hosts_child`, with `env`
    /// and no interface settings; each one's output (stdout then stderr), once both passed.
    fn run(&self, env: &[(&str, &str)]) -> [String; 2] {
        let children: Vec<_> = (0..2).map(|rank| self.spawn(rank, env)).collect();
        let mut outputs = [String::new(), String::new()];
        for (rank, child) in children.into_iter().enumerate() {
            let out = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            outputs[rank] = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
            assert!(
                out.status.success() && stdout.contains(&format!("TWO_HOSTS_OK rank {rank}")),
                "rank {rank} failed: {}\n{}",
                out.status,
                outputs[rank]
            );
        }
        outputs
    }

    fn spawn(&self, rank: usize, env: &[(&str, &str)]) -> std::process::Child {
        let exe = std::env::current_exe().unwrap();
        Command::new("ip")
            .args(["netns", "exec", &self.names[rank]])
            .arg(exe)
            .args([
                "--exact",
                "transport::net::hosts_tests::two_hosts_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, rank.to_string())
            .env_remove("NCCL_SOCKET_IFNAME")
            .env_remove("NCCL_SOCKET_FAMILY")
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "BOOTSTRAP,NET")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = ip(&["netns", "delete", name]);
        }
    }
}

fn pattern(dev: i32, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 131 + 7 + dev as usize) as u8).collect()
}

/// Rank 0 sends `MESSAGE` bytes to rank 1 on device `dev` of `net`, whose listening handle
/// (rank 1's) goes through the bootstrap; rank 1 checks them. The address rank 1 listened on.
/// A connection on device `dev` between the two ranks, its handle sent over the bootstrap
/// with `tag`: rank 1 listens and accepts, rank 0 connects. The comm, and the listen handle.
fn pair_over_bootstrap(b: &Bootstrap, net: &dyn Net, dev: i32, tag: u64) -> (Comm, Handle) {
    if b.rank() == 1 {
        let (handle, listen) = net.listen(dev).unwrap();
        b.send(0, tag, &handle.0).unwrap();
        let comm = until("accept", || net.accept(listen));
        net.close_listen(listen).unwrap();
        (comm, handle)
    } else {
        let mut handle = Handle([0u8; HANDLE_BYTES]);
        handle.0.copy_from_slice(&b.recv(1, tag).unwrap());
        (until("connect", || net.connect(dev, &handle)), handle)
    }
}

fn move_on_device(b: &Bootstrap, net: &SocketNet, dev: i32) -> String {
    let rank = b.rank();
    let (comm, listened) = pair_over_bootstrap(b, net, dev, 100 + dev as u64);
    let mut data = if rank == 0 {
        pattern(dev, MESSAGE)
    } else {
        vec![0u8; MESSAGE]
    };
    let mh = net
        .reg_mr(comm, data.as_mut_ptr(), MESSAGE, MemType::Host)
        .unwrap();
    let req: Request = if rank == 0 {
        until("isend", || {
            net.isend(comm, data.as_mut_ptr(), MESSAGE, 7, mh)
        })
    } else {
        until("irecv", || {
            net.irecv(comm, data.as_mut_ptr(), MESSAGE, 7, mh)
        })
    };
    let moved = until("test", || net.test(req));
    assert_eq!(moved, MESSAGE, "rank {rank}, device {dev}: bytes moved");
    if rank == 1 {
        assert!(data == pattern(dev, MESSAGE), "device {dev}: other bytes");
    }
    b.barrier().unwrap();
    net.dereg_mr(comm, mh).unwrap();
    if rank == 0 {
        net.close_send(comm).unwrap();
    } else {
        net.close_recv(comm).unwrap();
    }
    handle_address(&listened).ip().to_string()
}

/// In a child process (its namespace's one rank): bootstrap with the other namespace through
/// `NCCL_COMM_ID`, then move data on every device of the socket network, printing `DEVICE i
/// NAME ADDRESS` (rank 1's listening address) for each. In the normal test run (no variable)
/// it does nothing.
#[test]
fn two_hosts_child() {
    let Ok(rank) = std::env::var(CHILD_ENV) else {
        return;
    };
    let rank: i32 = rank.parse().unwrap();
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(20),
    };
    let id = get_unique_id_with(&cfg).unwrap();
    let b = Bootstrap::init_with(&[id], rank, 2, Arc::new(AtomicBool::new(false)), &cfg)
        .unwrap_or_else(|e| panic!("rank {rank}: bootstrap: {e}"));
    if std::env::var(CUT_ENV).is_ok() {
        return wait_to_be_cut_off(&b);
    }
    if std::env::var(WEIGHTS_ENV).is_ok() {
        return move_over_routes(&b);
    }
    if let Ok(stop_file) = std::env::var(meter_cut::METER_ENV) {
        return meter_cut::stream_and_measure(&b, std::path::Path::new(&stop_file));
    }
    let net = SocketNet::from_env().unwrap();
    for dev in 0..net.devices().unwrap() {
        let listened = move_on_device(&b, &net, dev);
        let name = net.properties(dev).unwrap().name;
        println!("DEVICE {dev} {name} {listened}");
    }
    println!("TWO_HOSTS_OK rank {rank}");
}

/// Whether `out` (a rank's output) has NVIDIA's INFO lines for bootstrap and socket network
/// on `dev0` (the first device) at `addr`.
fn chose(out: &str, dev0: &str, addr: &str) -> bool {
    out.contains(&format!("Bootstrap: Using {dev0}:{addr}<0>"))
        && out.contains(&format!("NET/Socket : Using [0]{dev0}:{addr}<0>"))
}

/// A port for rank 0's root: nothing else listens inside a fresh namespace.
fn port() -> u32 {
    20000 + std::process::id() % 20000
}

/// The namespaces joined by `links`, or `None` after saying why they cannot be made here.
fn hosts_or_skip(tag: &str, links: &[&Link]) -> Option<TwoHosts> {
    TwoHosts::create(tag, links)
        .inspect_err(|why| eprintln!("two hosts ({tag}) in network namespaces: skipped ({why})"))
        .ok()
}

/// Both ranks over `link` alone, rank 0's root at `comm_id`, with `env`: each chose its end
/// for the bootstrap and the socket network, whose one device (no loopback) moved the data.
fn over_one_link(tag: &str, link: &Link, comm_id: &str, env: &[(&str, &str)]) {
    let Some(hosts) = hosts_or_skip(tag, &[link]) else {
        return;
    };
    let mut env = env.to_vec();
    env.push(("NCCL_COMM_ID", comm_id));
    for (rank, out) in hosts.run(&env).iter().enumerate() {
        let addr = address(link.addrs[rank]);
        assert!(
            chose(out, link.ends[rank], addr),
            "rank {rank} chose elsewhere:\n{out}"
        );
        let theirs = address(link.addrs[1]);
        assert!(
            out.contains(&format!("DEVICE 0 {} {theirs}\n", link.ends[rank])),
            "rank {rank}: no device on the link moved data:\n{out}"
        );
        assert!(
            !out.contains("DEVICE 1"),
            "rank {rank}: loopback taken too:\n{out}"
        );
    }
}

#[test]
fn two_namespaces_bootstrap_and_move_data_over_their_veth_link() {
    let comm_id = format!("{}:{}", address(V4.addrs[0]), port());
    over_one_link("v4", &V4, &comm_id, &[]);
}

#[test]
fn two_namespaces_over_ipv6_with_socket_family_inet6() {
    let comm_id = format!("[{}]:{}", address(V6.addrs[0]), port());
    over_one_link("v6", &V6, &comm_id, &[("NCCL_SOCKET_FAMILY", "AF_INET6")]);
}

/// The `(device name, rank 1's address)` lines of a rank's output, in device order.
fn devices(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter_map(|l| l.strip_prefix("DEVICE "))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[1].to_string(), f[2].to_string())
        })
        .collect()
}

/// Both ranks over `links`, rank 0's root at `comm_id`'s address (the first address of
/// `links[root]`), with `env`: each rank bootstrapped on its end of `links[root]`, and its
/// socket network's devices are its ends of `links[i]` for i in `nics`, in that order, each of
/// which moved data.
fn over_links(tag: &str, links: &[&Link], root: usize, nics: &[usize], env: &[(&str, &str)]) {
    let Some(hosts) = hosts_or_skip(tag, links) else {
        return;
    };
    let comm_id = format!("{}:{}", address(links[root].addrs[0]), port());
    let mut env = env.to_vec();
    env.push(("NCCL_COMM_ID", &comm_id));
    for (rank, out) in hosts.run(&env).iter().enumerate() {
        let boot = links[root];
        let wanted = format!(
            "Bootstrap: Using {}:{}<0>",
            boot.ends[rank],
            address(boot.addrs[rank])
        );
        assert!(out.contains(&wanted), "rank {rank}: not {wanted}:\n{out}");
        let want: Vec<(String, String)> = nics
            .iter()
            .map(|&i| {
                let l = links[i];
                (l.ends[rank].to_string(), address(l.addrs[1]).to_string())
            })
            .collect();
        assert_eq!(devices(out), want, "rank {rank}:\n{out}");
    }
}

/// A link whose ends are named as IPoIB interfaces are (NVIDIA's first choice).
const IPOIB: Link = Link {
    ends: ["ibx0", "ibx1"],
    addrs: ["10.213.79.1/30", "10.213.79.2/30"],
    routed: false,
};

#[test]
fn two_links_with_socket_ifname_are_two_devices_and_the_bootstrap_follows_the_comm_id() {
    // NCCL_SOCKET_IFNAME=ox takes both links for the network; the bootstrap uses the link in
    // NCCL_COMM_ID's subnet, whatever NCCL_SOCKET_IFNAME says (as NVIDIA's).
    let links = [&V4, &V4_SECOND];
    over_links("2l", &links, 1, &[0, 1], &[("NCCL_SOCKET_IFNAME", "ox")]);
}

#[test]
fn without_socket_ifname_the_network_takes_the_comm_id_link_alone() {
    // As NVIDIA's: no IPoIB interface, so the one interface in NCCL_COMM_ID's subnet.
    over_links("ci", &[&V4, &V4_SECOND], 1, &[1], &[]);
}

#[test]
fn without_socket_ifname_an_ipoib_link_comes_first() {
    // As NVIDIA's: IPoIB interfaces (ib*) before the NCCL_COMM_ID subnet; the bootstrap
    // still follows NCCL_COMM_ID.
    over_links("ib", &[&V4, &IPOIB], 0, &[1], &[]);
}

#[test]
fn a_rank_in_no_subnet_of_the_comm_id_chooses_as_without_it() {
    // NVIDIA's bootstrap fails there ("No usable listening interface found"); ours takes the
    // interface it would take without NCCL_COMM_ID and reaches rank 0 through the route.
    let Some(hosts) = hosts_or_skip("rt", &[&ROUTED]) else {
        return;
    };
    let comm_id = format!("{}:{}", address(ROUTED.addrs[0]), port());
    for (rank, out) in hosts.run(&[("NCCL_COMM_ID", &comm_id)]).iter().enumerate() {
        let addr = address(ROUTED.addrs[rank]);
        assert!(
            chose(out, ROUTED.ends[rank], addr),
            "rank {rank} chose elsewhere:\n{out}"
        );
        let want = vec![(ROUTED.ends[rank].into(), address(ROUTED.addrs[1]).into())];
        assert_eq!(devices(out), want, "rank {rank}:\n{out}");
    }
}

/// The cut-off test's child: once bootstrapped, say READY; then rank 1 waits to be killed,
/// and rank 0 waits (at most 30 s) until its bootstrap connection from rank 1 has ended
/// without a farewell, as the watchdog sees a dead rank, and says how long that took.
fn wait_to_be_cut_off(b: &Bootstrap) {
    b.barrier().unwrap();
    println!("READY rank {}", b.rank());
    if b.rank() == 1 {
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    let start = Instant::now();
    let link = b.link();
    while matches!(link.state(1), crate::bootstrap::peers::LinkState::Open) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "rank 1's connection still open 30 s after READY"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        matches!(
            link.state(1),
            crate::bootstrap::peers::LinkState::Closed { farewell: None }
        ),
        "rank 1 left in order?"
    );
    println!("LOST rank 1 after {:.1} s", start.elapsed().as_secs_f64());
}

#[test]
fn a_peer_host_cut_off_ends_its_bootstrap_connection_within_the_dead_peer_bound() {
    // A host that dies or is cut off sends no close: without OXCCL_DEAD_PEER_S its peers
    // would wait on its connections for good (NVIDIA's too). The link goes down after both
    // ranks bootstrapped; rank 0 must see rank 1's connection end in seconds.
    let Some(hosts) = hosts_or_skip("cut", &[&V4]) else {
        return;
    };
    let comm_id = format!("{}:{}", address(V4.addrs[0]), port());
    let env = [
        ("NCCL_COMM_ID", comm_id.as_str()),
        ("OXCCL_DEAD_PEER_S", "3"),
        (CUT_ENV, "1"),
    ];
    let mut children: Vec<_> = (0..2).map(|rank| hosts.spawn(rank, &env)).collect();
    let (tx, rx) = std::sync::mpsc::channel::<(usize, String)>();
    for (rank, child) in children.iter_mut().enumerate() {
        let out = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines().map_while(|l| l.ok()) {
                let _ = tx.send((rank, line));
            }
        });
    }
    let mut ready = [false; 2];
    let mut seen = Vec::new();
    while !(ready[0] && ready[1]) {
        let (rank, line) = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no READY from both ranks: {seen:?}"));
        ready[rank] |= line.starts_with("READY");
        seen.push(line);
    }
    let down = ip(&["-n", &hosts.names[1], "link", "set", V4.ends[1], "down"]).unwrap();
    assert!(down.status.success(), "cutting the link failed");
    let lost = loop {
        match rx.recv_timeout(Duration::from_secs(40)) {
            Ok((0, line)) if line.starts_with("LOST") => break line,
            Ok((_, line)) => seen.push(line),
            Err(_) => break String::new(),
        }
    };
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(!lost.is_empty(), "rank 0 never lost rank 1: {seen:?}");
    let secs: f64 = lost.split(' ').nth(4).unwrap().parse().unwrap();
    assert!(secs < 20.0, "{lost}");
}

/// Channels of the weighted-routes test, and the bytes it moves over all of them.
const ROUTE_CHANNELS: u32 = 8;
const ROUTED_BYTES: usize = 16 << 20;

/// Bytes interface `ifname` of this namespace has sent.
fn tx_bytes(ifname: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/statistics/tx_bytes"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("no tx_bytes for {ifname}"))
}

/// The weighted-routes test's child: both ranks agree on the routes of `ROUTE_CHANNELS`
/// channels from their devices' claims (as communicator init does), cut `ROUTED_BYTES` over
/// the channels as the planner cuts a collective (`NetView::split_over`), and rank 0 sends
/// each channel's range to rank 1 on the channel's device, all channels at once. Rank 0 prints
/// `LINK name bytes` (what each interface sent meanwhile) and the time it took.
fn move_over_routes(b: &Bootstrap) {
    use crate::sched::weights::RouteClaim;
    let rank = b.rank();
    let net = SocketNet::from_env().unwrap();
    let speeds = super::device_speeds(&net).unwrap();
    let claim = RouteClaim {
        speeds_mbps: speeds.iter().map(|s| s.1).collect(),
        weighted: crate::env::registry::WEIGHTED_CHANNELS.flag(),
        hop_mbps: 0,
        adaptive: false,
    };
    let claims: Vec<RouteClaim> = b
        .allgather(&claim.to_bytes())
        .unwrap()
        .iter()
        .map(|c| RouteClaim::from_bytes(c).unwrap())
        .collect();
    let (routes, verdict) = crate::sched::Routes::agree(ROUTE_CHANNELS, &claims);
    println!("ROUTES {verdict:?}");
    let view = crate::sched::NetView {
        link: crate::sched::NetLink::from_properties(0, 0.0),
        remote: vec![true; 2],
        routes: routes.clone(),
    };
    let ranges = view.split_over(ROUTED_BYTES as u64, ROUTE_CHANNELS, 512);
    let ndev = net.devices().unwrap();
    let dev_of = |c: u32| routes.device_of_row(c, ROUTE_CHANNELS, ndev);
    let mut comms = Vec::new();
    for c in 0..ROUTE_CHANNELS {
        comms.push(pair_over_bootstrap(b, &net, dev_of(c), 200 + c as u64).0);
    }
    let mut data = if rank == 0 {
        pattern(0, ROUTED_BYTES)
    } else {
        vec![0u8; ROUTED_BYTES]
    };
    let names: Vec<String> = speeds.iter().map(|s| s.0.clone()).collect();
    let before: Vec<u64> = names.iter().map(|n| tx_bytes(n)).collect();
    b.barrier().unwrap();
    let start = Instant::now();
    let mut pending = Vec::new();
    for (&comm, &(at, len)) in comms.iter().zip(&ranges) {
        let ptr = data[at as usize..].as_mut_ptr();
        let len = len as usize;
        let mh = net.reg_mr(comm, ptr, len, MemType::Host).unwrap();
        let req = if rank == 0 {
            until("isend", || net.isend(comm, ptr, len, 7, mh))
        } else {
            until("irecv", || net.irecv(comm, ptr, len, 7, mh))
        };
        pending.push((comm, mh, req, len));
    }
    for &(_, _, req, len) in &pending {
        assert_eq!(until("test", || net.test(req)), len);
    }
    let secs = start.elapsed().as_secs_f64();
    b.barrier().unwrap();
    if rank == 1 {
        assert!(data == pattern(0, ROUTED_BYTES), "other bytes arrived");
    }
    for (comm, mh, _, _) in pending {
        net.dereg_mr(comm, mh).unwrap();
        match rank {
            0 => net.close_send(comm).unwrap(),
            _ => net.close_recv(comm).unwrap(),
        }
    }
    if rank == 0 {
        for (name, was) in names.iter().zip(before) {
            println!("LINK {name} {}", tx_bytes(name) - was);
        }
        println!("MOVED in {secs:.3} s");
    }
    println!("TWO_HOSTS_OK rank {rank}");
}

/// Shape the egress of both ends of `link` to `mbps` Mbit/s with a token bucket: `verb` is
/// `add` for a new shaper, `change` to reshape one while traffic runs.
fn tbf(hosts: &TwoHosts, link: &Link, verb: &str, mbps: u32) -> Result<(), String> {
    let rate = format!("{mbps}mbit");
    for (ns, end) in hosts.names.iter().zip(link.ends) {
        let args = [
            "netns", "exec", ns, "tc", "qdisc", verb, "dev", end, "root", "tbf", "rate", &rate,
            "burst", "256kb", "latency", "100ms",
        ];
        let out = ip(&args).map_err(|e| format!("cannot run ip: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "tc qdisc {verb} on {end}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    Ok(())
}

/// Bytes each link's rank-0 end sent (`LINK name bytes` lines), by name.
fn link_bytes(out: &str) -> HashMap<String, u64> {
    out.lines()
        .filter_map(|l| l.strip_prefix("LINK "))
        .map(|l| {
            let (name, bytes) = l.split_once(' ').unwrap();
            (name.to_string(), bytes.parse().unwrap())
        })
        .collect()
}

#[test]
fn weighted_routes_move_more_bytes_over_the_faster_of_two_shaped_links() {
    // Two links shaped to 400 and 100 Mbit/s (their veths report 10000: OXCCL_NET_SPEEDS says
    // what they carry). Routed by weight, the fast link carries about 4/5 of the bytes;
    // with OXCCL_WEIGHTED_CHANNELS=0 both carry the same (NVIDIA's even split).
    let Some(hosts) = hosts_or_skip("wt", &[&V4, &V4_SECOND]) else {
        return;
    };
    for (link, mbps) in [(&V4, 400), (&V4_SECOND, 100)] {
        if let Err(why) = tbf(&hosts, link, "add", mbps) {
            eprintln!("weighted routes over shaped links: skipped ({why})");
            return;
        }
    }
    let comm_id = format!("{}:{}", address(V4.addrs[0]), port());
    let speeds = "oxv0=400,oxv1=400,oxw0=100,oxw1=100";
    let mut ratios = Vec::new();
    for weighted in ["1", "0"] {
        let env = [
            ("NCCL_COMM_ID", comm_id.as_str()),
            ("NCCL_SOCKET_IFNAME", "ox"),
            ("OXCCL_NET_SPEEDS", speeds),
            ("OXCCL_WEIGHTED_CHANNELS", weighted),
            (WEIGHTS_ENV, "1"),
        ];
        let out = &hosts.run(&env)[0];
        let bytes = link_bytes(out);
        let (fast, slow) = (bytes["oxv0"], bytes["oxw0"]);
        assert!(
            fast + slow >= ROUTED_BYTES as u64,
            "weighted={weighted}: {fast} + {slow} bytes sent\n{out}"
        );
        let moved = out.lines().find(|l| l.starts_with("MOVED")).unwrap_or("");
        eprintln!("OXCCL_WEIGHTED_CHANNELS={weighted}: fast {fast} B, slow {slow} B, {moved}");
        ratios.push(fast as f64 / slow as f64);
    }
    assert!(ratios[0] > 3.0 && ratios[0] < 5.0, "weighted: {ratios:?}");
    assert!(ratios[1] > 0.7 && ratios[1] < 1.4, "even: {ratios:?}");
}
