//! Two "hosts" on this machine: two network namespaces joined by a veth pair, one process in
//! each, as two machines on one link would be. Each process finds its interface without
//! `NCCL_SOCKET_IFNAME` (the veth end, not loopback), bootstraps through `NCCL_COMM_ID` at
//! rank 0's address, and moves data over the built-in socket network between the namespaces.
//! Needs root and `ip` (iproute2); skipped, saying so, where namespaces cannot be made.

use super::api::{Comm, Handle, MemType, Net, Request, HANDLE_BYTES};
use super::socket::SocketNet;
use crate::bootstrap::{get_unique_id_with, Bootstrap, BootstrapConfig};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The addresses of the veth ends (a private /30 that exists only inside the namespaces).
const ADDRS: [&str; 2] = ["10.213.77.1", "10.213.77.2"];
/// The veth ends' names inside their namespaces.
const LINKS: [&str; 2] = ["oxv0", "oxv1"];
const CHILD_ENV: &str = "OXCCL_TWO_HOSTS_CHILD";
/// Bytes rank 0 sends rank 1 over the socket network.
const MESSAGE: usize = 3 << 20;

/// Two namespaces joined by a veth pair, each end addressed and up, loopback up too; removed
/// (with the pair) on drop.
struct TwoHosts {
    names: [String; 2],
}

fn ip(args: &[&str]) -> std::io::Result<Output> {
    Command::new("ip").args(args).stdin(Stdio::null()).output()
}

impl TwoHosts {
    /// The namespaces, or why they cannot be made here.
    fn create() -> Result<TwoHosts, String> {
        let pid = std::process::id();
        let hosts = TwoHosts {
            names: [format!("oxccl-{pid}-a"), format!("oxccl-{pid}-b")],
        };
        let [a, b] = [hosts.names[0].as_str(), hosts.names[1].as_str()];
        let a_addr = format!("{}/30", ADDRS[0]);
        let b_addr = format!("{}/30", ADDRS[1]);
        let steps: [&[&str]; 9] = [
            &["netns", "add", a],
            &["netns", "add", b],
            &[
                "link", "add", LINKS[0], "netns", a, "type", "veth", "peer", "name", LINKS[1],
                "netns", b,
            ],
            &["-n", a, "addr", "add", &a_addr, "dev", LINKS[0]],
            &["-n", b, "addr", "add", &b_addr, "dev", LINKS[1]],
            &["-n", a, "link", "set", LINKS[0], "up"],
            &["-n", b, "link", "set", LINKS[1], "up"],
            &["-n", a, "link", "set", "lo", "up"],
            &["-n", b, "link", "set", "lo", "up"],
        ];
        for step in steps {
            let out = ip(step).map_err(|e| format!("cannot run ip: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "ip {}: {}",
                    step.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        Ok(hosts)
    }

    /// This test binary's `two_hosts_child` as rank `rank` of 2 in namespace `rank`, with
    /// `env` and no interface settings.
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

/// `f` until it gives a value, at most 20 s.
fn until<T>(what: &str, mut f: impl FnMut() -> crate::error::Result<Option<T>>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f().unwrap_or_else(|e| panic!("{what}: {e}")) {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{what}: timed out"
        );
        std::thread::yield_now();
    }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 131 + 7) as u8).collect()
}

/// Wait for `req` to finish; the bytes it moved.
fn finish(net: &dyn Net, req: Request) -> usize {
    until("test", || net.test(req))
}

/// In a child process (its namespace's one rank): bootstrap with the other namespace through
/// `NCCL_COMM_ID`, then rank 0 sends `MESSAGE` bytes to rank 1 over the socket network, whose
/// listening handle goes through the bootstrap; rank 1 checks them and says so. In the normal
/// test run (no variable) it does nothing.
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
    let net = SocketNet::from_env().unwrap();
    assert_eq!(net.devices().unwrap(), 1, "one interface besides loopback");
    let mut data = if rank == 0 {
        pattern(MESSAGE)
    } else {
        vec![0u8; MESSAGE]
    };
    let comm: Comm;
    if rank == 1 {
        let (handle, listen) = net.listen(0).unwrap();
        b.send(0, 1, &handle.0).unwrap();
        comm = until("accept", || net.accept(listen));
        net.close_listen(listen).unwrap();
    } else {
        let bytes = b.recv(1, 1).unwrap();
        let mut handle = Handle([0u8; HANDLE_BYTES]);
        handle.0.copy_from_slice(&bytes);
        comm = until("connect", || net.connect(0, &handle));
    }
    let mh = net
        .reg_mr(comm, data.as_mut_ptr(), MESSAGE, MemType::Host)
        .unwrap();
    let moved = if rank == 0 {
        let req = until("isend", || {
            net.isend(comm, data.as_mut_ptr(), MESSAGE, 7, mh)
        });
        finish(&net, req)
    } else {
        let req = until("irecv", || {
            net.irecv(comm, data.as_mut_ptr(), MESSAGE, 7, mh)
        });
        finish(&net, req)
    };
    assert_eq!(moved, MESSAGE, "rank {rank}: bytes moved");
    if rank == 1 {
        assert!(data == pattern(MESSAGE), "rank 1 received other bytes");
    }
    b.barrier().unwrap();
    net.dereg_mr(comm, mh).unwrap();
    if rank == 0 {
        net.close_send(comm).unwrap();
    } else {
        net.close_recv(comm).unwrap();
    }
    println!("TWO_HOSTS_OK rank {rank}");
}

#[test]
fn two_namespaces_bootstrap_and_move_data_over_their_veth_link() {
    let hosts = match TwoHosts::create() {
        Ok(hosts) => hosts,
        Err(why) => {
            eprintln!("two hosts in network namespaces: skipped ({why})");
            return;
        }
    };
    // Nothing else listens inside a fresh namespace: any port is free there.
    let comm_id = format!("{}:{}", ADDRS[0], 20000 + std::process::id() % 20000);
    let env = [("NCCL_COMM_ID", comm_id.as_str())];
    let children: Vec<_> = (0..2).map(|rank| hosts.spawn(rank, &env)).collect();
    for (rank, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let all = format!("{stdout}{stderr}");
        assert!(
            out.status.success() && stdout.contains(&format!("TWO_HOSTS_OK rank {rank}")),
            "rank {rank} failed: {}\n{all}",
            out.status
        );
        let (link, addr) = (LINKS[rank], ADDRS[rank]);
        assert!(
            all.contains(&format!("Bootstrap: Using {link}:{addr}<0>")),
            "rank {rank} bootstrapped elsewhere:\n{all}"
        );
        assert!(
            all.contains(&format!("NET/Socket : Using [0]{link}:{addr}<0>")),
            "rank {rank}'s socket network is elsewhere:\n{all}"
        );
    }
}
