//! Tests of the IB network over the software verbs device (`ffi-tests/ibverbs/soft_verbs.c`,
//! built here with gcc into a temporary directory as a stand-in libibverbs.so.1): the C
//! structs against rdma-core's header, data of every size over 1 and 4 QPs with and without
//! striping and adaptive routing, many messages in flight, and each fault ending in an error
//! that names the peer and the status, within bounds. Both ends in one process (the stand-in
//! connects a process to itself), and across two processes (the test binary re-runs itself as
//! the peer, `child`). Skipped, saying why, where gcc or `<infiniband/verbs.h>` is missing.
//!
//! Merged devices (`NCCL_IB_MERGE_NICS`) use a second build of the stand-in with two devices,
//! soft_0 and soft_1 (`-DSV_DEFAULT_DEVICES=2`, loaded beside the first as a library of its
//! own), and a fake sysfs directory whose `<dev>/device` links give them PCI functions of one
//! NIC or of two.
//!
//! RoCE runs in children whose stand-in has Ethernet ports (`SOFT_VERBS_LINK_LAYER=eth`, read
//! once per process): the GID chosen, the `Using` line, and data between two processes,
//! which the stand-in only lets through QPs addressed by the peer's GID.

use super::fifo::SLOTS;
use super::{verbs, IbNet, Settings};
use crate::error::Result;
use crate::transport::net::api::{Comm, Handle, MemHandle, MemType, Net, Request, HANDLE_BYTES};
use crate::transport::net::tests::lo;
use once_cell::sync::OnceCell;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const VERBS_H: &str = "/usr/include/infiniband/verbs.h";
const CHILD_ENV: &str = "OX_IB_TEST_CHILD";
const STAND_IN_ENV: &str = "OX_IB_TEST_STAND_IN";
/// A `port_down` child with this set (ms) watches its receive that long and says it is still
/// pending.
const PORT_DOWN_WAIT_ENV: &str = "OX_IB_TEST_PORT_DOWN_WAIT_MS";
/// What a `recv` child sets in the environment of the sender it starts.
const SENDER_ENV: &str = "OX_IB_TEST_SENDER_ENV";
/// The fake sysfs directory a child uses.
const SYSFS_ENV: &str = "OX_IB_TEST_SYSFS";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The stand-in libibverbs.so.1, built once per process (a child is given its parent's), or
/// None with the reason printed.
fn stand_in() -> Option<PathBuf> {
    static BUILT: OnceCell<Option<PathBuf>> = OnceCell::new();
    BUILT
        .get_or_init(|| {
            if let Ok(p) = std::env::var(STAND_IN_ENV) {
                return Some(PathBuf::from(p));
            }
            build_stand_in("single", 1)
        })
        .clone()
}

/// The stand-in with two devices, soft_0 and soft_1, built once per process.
fn dual_stand_in() -> Option<PathBuf> {
    static BUILT: OnceCell<Option<PathBuf>> = OnceCell::new();
    BUILT.get_or_init(|| build_stand_in("dual", 2)).clone()
}

/// Build the stand-in with `devices` devices by default into a directory named `variant`.
fn build_stand_in(variant: &str, devices: usize) -> Option<PathBuf> {
    if !Path::new(VERBS_H).exists() {
        println!("skipped: {VERBS_H} is missing (rdma-core's headers, libibverbs-dev)");
        return None;
    }
    let dir = std::env::temp_dir()
        .join(format!("oxccl-ib-test-{}", std::process::id()))
        .join(variant);
    std::fs::create_dir_all(&dir).ok()?;
    let lib = dir.join("libibverbs.so.1");
    let src = repo().join("ffi-tests/ibverbs");
    let out = Command::new("gcc")
        .args(["-shared", "-fPIC", "-O2", "-fvisibility=hidden"])
        .arg(format!("-DSV_DEFAULT_DEVICES={devices}"))
        .arg("-Wl,-soname,libibverbs.so.1")
        .arg(format!(
            "-Wl,--version-script={}",
            src.join("libibverbs.map").display()
        ))
        .arg("-o")
        .arg(&lib)
        .arg(src.join("soft_verbs.c"))
        .arg("-lpthread")
        .output();
    match out {
        Err(e) => {
            println!("skipped: gcc cannot run ({e})");
            None
        }
        Ok(o) if !o.status.success() => panic!(
            "the software verbs device does not build:\n{}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Ok(_) => {
            // NVIDIA's library, and ours, open libibverbs.so before libibverbs.so.1.
            let _ = std::fs::remove_file(dir.join("libibverbs.so"));
            std::os::unix::fs::symlink("libibverbs.so.1", dir.join("libibverbs.so")).ok()?;
            Some(lib)
        }
    }
}

fn settings(qps: usize, split: bool, ar: i64) -> Settings {
    let mut s = Settings::from_env();
    s.qps_per_connection = qps;
    s.split_data = split;
    s.adaptive_routing = ar;
    s.ar_threshold = 8192;
    if let Ok(dir) = std::env::var(SYSFS_ENV) {
        s.sysfs = PathBuf::from(dir);
    }
    s
}

fn open(lib: &Path, s: Settings) -> IbNet {
    IbNet::open(lib.to_str().unwrap(), s, lo())
        .expect("the stand-in opens")
        .expect("the stand-in has an active port")
}

// The socket network's test helpers serve any `Net`: polling until a value comes, a
// connected pair, a byte pattern.
use super::super::tests::{connect_pair as pair, pattern, until};

/// Post (retrying while None) until the request is there.
fn post(what: &str, mut f: impl FnMut() -> Result<Option<Request>>) -> Request {
    until(what, &mut f)
}

fn wait(net: &dyn Net, r: Request, what: &str) -> usize {
    until(what, || net.test(r))
}

/// Send `sizes` from `s` to `r` on one net, `inflight` messages at a time, and check every
/// byte and size.
fn exchange(net: &dyn Net, s: Comm, r: Comm, sizes: &[usize], inflight: usize) {
    exchange_between(net, s, net, r, sizes, inflight)
}

/// `exchange` from `s` of `snet` to `r` of `rnet`.
fn exchange_between(
    snet: &dyn Net,
    s: Comm,
    rnet: &dyn Net,
    r: Comm,
    sizes: &[usize],
    inflight: usize,
) {
    let max = *sizes.iter().max().unwrap();
    let mut sbufs: Vec<Vec<u8>> = (0..inflight).map(|_| vec![0; max.max(1)]).collect();
    let mut rbufs: Vec<Vec<u8>> = (0..inflight).map(|_| vec![0; max.max(1)]).collect();
    let smh: Vec<MemHandle> = sbufs
        .iter_mut()
        .map(|b| {
            snet.reg_mr(s, b.as_mut_ptr(), b.len(), MemType::Host)
                .unwrap()
        })
        .collect();
    let rmh: Vec<MemHandle> = rbufs
        .iter_mut()
        .map(|b| {
            rnet.reg_mr(r, b.as_mut_ptr(), b.len(), MemType::Host)
                .unwrap()
        })
        .collect();
    for batch in sizes.chunks(inflight) {
        let mut reqs = Vec::new();
        for (k, &n) in batch.iter().enumerate() {
            sbufs[k][..n].copy_from_slice(&pattern(n + k, n));
            rbufs[k].fill(0xee);
            let (rp, rl) = (rbufs[k].as_mut_ptr(), rbufs[k].len());
            let rr = post("irecv", || rnet.irecv(r, rp, rl, k as i32, rmh[k]));
            reqs.push((k, n, rr));
        }
        let mut sends = Vec::new();
        for &(k, n, _) in &reqs {
            let sp = sbufs[k].as_mut_ptr();
            sends.push(post("isend", || snet.isend(s, sp, n, k as i32, smh[k])));
        }
        for (&(k, n, rr), sr) in reqs.iter().zip(sends) {
            assert_eq!(wait(snet, sr, "send"), n);
            assert_eq!(wait(rnet, rr, "receive"), n, "message {k} of {n} bytes");
            assert!(
                rbufs[k][..n] == pattern(n + k, n)[..],
                "message of {n} bytes: wrong data"
            );
            assert!(
                rbufs[k][n..].iter().all(|&b| b == 0xee),
                "written past {n} bytes"
            );
        }
    }
    for m in smh {
        snet.dereg_mr(s, m).unwrap();
    }
    for m in rmh {
        rnet.dereg_mr(r, m).unwrap();
    }
}

const SIZES: &[usize] = &[0, 1, 7, 4096, 8192, 8193, 65536 + 3, 1 << 20, 64 << 20];

#[test]
fn every_size_arrives_exactly_over_one_and_four_qps_striped_or_not() {
    let Some(lib) = stand_in() else { return };
    for (qps, split, ar) in [
        (1, false, 0),
        (1, false, 1),
        (4, false, 1),
        (4, true, 0),
        (4, true, 1),
    ] {
        let net = open(&lib, settings(qps, split, ar));
        let (s, r) = pair(&net);
        // 64 MiB once striped and once not (it takes seconds in a debug build).
        let sizes = match (qps, ar) {
            (1, 0) | (4, 1) => SIZES,
            _ => &SIZES[..SIZES.len() - 1],
        };
        exchange(&net, s, r, sizes, 1);
        net.close_send(s).unwrap();
        net.close_recv(r).unwrap();
    }
}

#[test]
fn many_messages_in_flight_with_tags_in_both_directions() {
    let Some(lib) = stand_in() else { return };
    let net = open(&lib, settings(2, false, -2));
    let (s1, r1) = pair(&net);
    let (s2, r2) = pair(&net);
    let sizes: Vec<usize> = (0..64).map(|i| (i * 4099) % 70000).collect();
    std::thread::scope(|t| {
        let net = &net;
        let a = t.spawn(|| exchange(net, s1, r1, &sizes, 8));
        let b = t.spawn(|| exchange(net, s2, r2, &sizes, 8));
        a.join().unwrap();
        b.join().unwrap();
    });
    // More receives than the FIFO holds wait (None) instead of overrunning it.
    let mut buf = vec![0u8; 64];
    let mh = net.reg_mr(r1, buf.as_mut_ptr(), 64, MemType::Host).unwrap();
    for i in 0..SLOTS {
        assert!(net
            .irecv(r1, buf.as_mut_ptr(), 64, i as i32, mh)
            .unwrap()
            .is_some());
    }
    assert!(net
        .irecv(r1, buf.as_mut_ptr(), 64, 0, mh)
        .unwrap()
        .is_none());
}

#[test]
fn a_message_larger_than_its_receive_or_of_another_tag_is_an_error() {
    let Some(lib) = stand_in() else { return };
    let net = open(&lib, settings(1, false, 0));
    let (s, r) = pair(&net);
    let mut buf = vec![0u8; 4096];
    let p = buf.as_mut_ptr();
    let smh = net.reg_mr(s, p, 4096, MemType::Host).unwrap();
    let rmh = net.reg_mr(r, p, 4096, MemType::Host).unwrap();
    net.irecv(r, p, 100, 3, rmh).unwrap().unwrap();
    let e = until("the CTS", || match net.isend(s, p, 200, 3, smh) {
        Ok(None) => Ok(None),
        other => Ok(Some(other)),
    })
    .unwrap_err();
    assert!(
        e.msg.contains("200 bytes") && e.msg.contains("receive of 100"),
        "{}",
        e.msg
    );
    let e = net.isend(s, p, 50, 4, smh).unwrap_err();
    assert!(
        e.msg.contains("tag 4") && e.msg.contains("tag 3"),
        "{}",
        e.msg
    );
}

#[test]
fn a_bad_remote_key_fails_both_sides_naming_the_peer_and_the_status() {
    let Some(lib) = stand_in() else { return };
    let net = open(&lib, settings(1, false, 0));
    let (s, r) = pair(&net);
    let mut buf = vec![0u8; 4096];
    let p = buf.as_mut_ptr();
    let smh = net.reg_mr(s, p, 4096, MemType::Host).unwrap();
    let rmh = net.reg_mr(r, p, 4096, MemType::Host).unwrap();
    let rr = net.irecv(r, p, 4096, 0, rmh).unwrap().unwrap();
    // The CTS arrives; then its key is spoiled, as a receiver with a wrong key would send.
    let conn = net.comm(s).unwrap().1;
    until("the CTS", || {
        let c = conn.lock();
        // SAFETY: a read of the FIFO entry the peer writes (the test's view of it).
        let idx = unsafe { std::ptr::read_volatile(&c.fifo[0].idx) };
        Ok((idx == 1).then_some(()))
    });
    conn.lock().fifo[0].rkeys[0] ^= 0x5a5a;
    let sr = net.isend(s, p, 4096, 0, smh).unwrap().unwrap();
    let e = until("the send's failure", || match net.test(sr) {
        Ok(None) => Ok(None),
        Ok(Some(n)) => panic!("a send with a bad key completed ({n} bytes)"),
        Err(e) => Ok(Some(e)),
    });
    assert!(e.msg.contains("remote access error"), "{}", e.msg);
    assert!(
        e.msg.contains("peer 127.0.0.1:") && e.msg.contains("soft_0:1"),
        "{}",
        e.msg
    );
    let e = until("the receive's failure", || match net.test(rr) {
        Ok(None) => Ok(None),
        Ok(Some(_)) => panic!("the receive completed"),
        Err(e) => Ok(Some(e)),
    });
    assert!(e.msg.contains("peer 127.0.0.1:"), "{}", e.msg);
    net.close_send(s).unwrap();
    net.close_recv(r).unwrap();
}

#[test]
fn properties_are_the_ports() {
    let Some(lib) = stand_in() else { return };
    let net = open(&lib, settings(1, false, 0));
    assert_eq!(net.name(), "IB");
    assert_eq!(net.devices().unwrap(), 1);
    let p = net.properties(0).unwrap();
    assert_eq!(p.name, "soft_0");
    assert_eq!(p.port, 1);
    assert_eq!(p.speed_mbps, 100_000, "the stand-in's 100 Gb/s as 4x EDR");
    assert_eq!(p.pci_path, "", "soft_0 has no sysfs device");
    // The adapter's GUID as the library gives it (big-endian), not the device's index.
    assert_eq!(p.guid, 0x0002_c903_00a1_b2c0u64.to_be());
    assert!(p.reg_is_global, "registrations are the device's");
    assert_eq!(p.ptr_support & crate::transport::net::api::PTR_DMABUF, 0);
    assert!(net.properties(1).is_err());
    // Host memory needs no flush.
    let (s, r) = pair(&net);
    let mut b = vec![0u8; 64];
    let mh = net.reg_mr(r, b.as_mut_ptr(), 64, MemType::Host).unwrap();
    assert!(net.iflush(r, b.as_mut_ptr(), 64, mh).unwrap().is_none());
    net.close_send(s).unwrap();
    net.close_recv(r).unwrap();
}

#[test]
fn buffers_register_with_relaxed_ordering_unless_it_is_off() {
    let Some(lib) = stand_in() else { return };
    for (mode, relaxed) in [(2, true), (1, true), (0, false)] {
        let mut s = settings(1, false, 0);
        s.relaxed_ordering = mode;
        let net = open(&lib, s);
        assert_eq!(
            net.relaxed_ordering(),
            relaxed,
            "NCCL_IB_PCI_RELAXED_ORDERING={mode}"
        );
        // Registered either way (the stand-in refuses access bits it does not know), and
        // data moves over them.
        let (s, r) = pair(&net);
        exchange(&net, s, r, &[0, 1, 4096, 1 << 20], 2);
        net.close_send(s).unwrap();
        net.close_recv(r).unwrap();
    }
}

#[test]
fn a_flush_reads_back_on_the_loopback_qp_when_the_hca_writes_gpu_memory() {
    let Some(lib) = stand_in() else { return };
    // As with nvidia-peermem loaded: the stand-in's "GPU memory" is host memory.
    let mut s = settings(1, false, 0);
    s.peer_memory = true;
    let net = open(&lib, s);
    let (s, r) = pair(&net);
    assert!(net.comm(r).unwrap().1.lock().flush_qp.is_some());
    let mut b = vec![0u8; 64];
    let mh = net.reg_mr(r, b.as_mut_ptr(), 64, MemType::Cuda).unwrap();
    let f = net
        .iflush(r, b.as_mut_ptr(), 64, mh)
        .unwrap()
        .expect("a flush");
    assert_eq!(wait(&net, f, "flush"), 0);
    net.close_send(s).unwrap();
    net.close_recv(r).unwrap();
}

#[test]
fn c_structs_match_rdma_cores_header() {
    let Some(_) = stand_in() else { return };
    use super::verbs::*;
    use std::mem::{offset_of, size_of};
    let checks: Vec<(&str, usize)> = vec![
        (
            "offsetof(struct ibv_context, ops.poll_cq)",
            offset_of!(ContextHead, ops) + 8 * OP_POLL_CQ,
        ),
        (
            "offsetof(struct ibv_context, ops.post_send)",
            offset_of!(ContextHead, ops) + 8 * OP_POST_SEND,
        ),
        (
            "offsetof(struct ibv_context, ops.post_recv)",
            offset_of!(ContextHead, ops) + 8 * OP_POST_RECV,
        ),
        (
            "offsetof(struct ibv_context, async_fd)",
            offset_of!(ContextHead, async_fd),
        ),
        (
            "offsetof(struct ibv_qp, qp_num)",
            offset_of!(QpHead, qp_num),
        ),
        ("offsetof(struct ibv_mr, lkey)", offset_of!(MrHead, lkey)),
        ("offsetof(struct ibv_mr, rkey)", offset_of!(MrHead, rkey)),
        (
            "offsetof(struct ibv_port_attr, lid)",
            offset_of!(PortAttr, lid),
        ),
        (
            "offsetof(struct ibv_port_attr, active_width)",
            offset_of!(PortAttr, active_width),
        ),
        (
            "offsetof(struct ibv_port_attr, link_layer)",
            offset_of!(PortAttr, link_layer),
        ),
        ("sizeof(struct ibv_qp_init_attr)", size_of::<QpInitAttr>()),
        (
            "offsetof(struct ibv_qp_init_attr, qp_type)",
            offset_of!(QpInitAttr, qp_type),
        ),
        ("sizeof(struct ibv_ah_attr)", size_of::<AhAttr>()),
        (
            "offsetof(struct ibv_ah_attr, dlid)",
            offset_of!(AhAttr, dlid),
        ),
        (
            "offsetof(struct ibv_ah_attr, is_global)",
            offset_of!(AhAttr, is_global),
        ),
        ("sizeof(struct ibv_qp_attr)", size_of::<QpAttr>()),
        (
            "offsetof(struct ibv_qp_attr, ah_attr)",
            offset_of!(QpAttr, ah_attr),
        ),
        (
            "offsetof(struct ibv_qp_attr, pkey_index)",
            offset_of!(QpAttr, pkey_index),
        ),
        (
            "offsetof(struct ibv_qp_attr, timeout)",
            offset_of!(QpAttr, timeout),
        ),
        (
            "offsetof(struct ibv_qp_attr, rnr_retry)",
            offset_of!(QpAttr, rnr_retry),
        ),
        (
            "offsetof(struct ibv_qp_attr, rate_limit)",
            offset_of!(QpAttr, rate_limit),
        ),
        ("sizeof(struct ibv_send_wr)", size_of::<SendWr>()),
        (
            "offsetof(struct ibv_send_wr, imm_data)",
            offset_of!(SendWr, imm_data),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)",
            offset_of!(SendWr, remote_addr),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.rkey)",
            offset_of!(SendWr, rkey),
        ),
        ("sizeof(struct ibv_recv_wr)", size_of::<RecvWr>()),
        ("sizeof(struct ibv_wc)", size_of::<Wc>()),
        (
            "offsetof(struct ibv_wc, imm_data)",
            offset_of!(Wc, imm_data),
        ),
        (
            "offsetof(struct ibv_wc, wc_flags)",
            offset_of!(Wc, wc_flags),
        ),
        ("sizeof(struct ibv_async_event)", size_of::<AsyncEvent>()),
        (
            "offsetof(struct ibv_device_attr, node_guid)",
            offset_of!(DeviceAttr, node_guid),
        ),
        (
            "offsetof(struct ibv_device_attr, sys_image_guid)",
            offset_of!(DeviceAttr, sys_image_guid),
        ),
        ("sizeof(struct ibv_device_attr) <= 320", 1),
        (
            "IBV_ACCESS_RELAXED_ORDERING",
            ACCESS_RELAXED_ORDERING as usize,
        ),
        ("sizeof(struct ibv_gid_entry)", size_of::<GidEntry>()),
        ("sizeof(struct ibv_ece)", size_of::<Ece>()),
        (
            "offsetof(struct ibv_ece, options)",
            offset_of!(Ece, options),
        ),
        ("IBV_SEND_INLINE", SEND_INLINE as usize),
        ("IBV_WC_RECV_RDMA_WITH_IMM", 129),
        ("IBV_WC_WR_FLUSH_ERR", 5),
        ("IBV_EVENT_PORT_ERR", EVENT_PORT_ERR as usize),
        ("IBV_QP_DEST_QPN", QP_DEST_QPN as usize),
        ("IBV_QP_MAX_DEST_RD_ATOMIC", QP_MAX_DEST_RD_ATOMIC as usize),
        (
            "IBV_WR_RDMA_WRITE_WITH_IMM",
            WR_RDMA_WRITE_WITH_IMM as usize,
        ),
        ("IBV_WR_RDMA_READ", WR_RDMA_READ as usize),
        ("IBV_QPS_RTS", QPS_RTS as usize),
        ("IBV_PORT_ACTIVE", PORT_ACTIVE as usize),
    ];
    let dir = std::env::temp_dir().join(format!("oxccl-ib-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = String::from("#include <infiniband/verbs.h>\n#include <stdio.h>\n#include <stddef.h>\nint main(void) {\n");
    for (expr, _) in &checks {
        c.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    c.push_str("  return 0;\n}\n");
    std::fs::write(dir.join("layout.c"), c).unwrap();
    let out = Command::new("gcc")
        .arg("-o")
        .arg(dir.join("layout"))
        .arg(dir.join("layout.c"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(dir.join("layout")).output().unwrap();
    let values: Vec<usize> = String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    for ((expr, ours), theirs) in checks.iter().zip(values) {
        assert_eq!(*ours, theirs, "{expr}");
    }
    assert!(size_of::<PortAttr>() >= 52);
    assert_eq!(size_of::<DeviceAttr>(), 320);
}

// ---- across processes ----

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn from_hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Run this test binary as the peer: `mode` and the receiver's handle, with `env` set.
fn spawn_child(mode: &str, handle: Option<&Handle>, env: &[(&str, &str)]) -> std::process::Child {
    let lib = stand_in().unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "transport::net::ib::tests::child",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(
        CHILD_ENV,
        format!("{mode},{}", handle.map_or(String::new(), |h| to_hex(&h.0))),
    )
    .env(STAND_IN_ENV, &lib)
    .env("LD_LIBRARY_PATH", lib.parent().unwrap())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// Wait at most `limit` for `child`; its (success, stdout + stderr).
fn finish_child(mut child: std::process::Child, limit: Duration) -> (bool, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return (status.success(), text);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "the child did not finish within {limit:?}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The peer process: `send` connects to the handle and sends `SIZES`; `fail` does the same
/// on a QP failing after its third work request; `port_down` (both ends here) waits for a
/// message while the port goes down; `select` reports which network the process picks; `gid`
/// reports the first port's link layer, LID and GID; `recv` receives from a `send` child of
/// its own; `pair` connects to itself and moves one message.
#[test]
fn child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (mode, hex) = spec.split_once(',').unwrap();
    let lib = stand_in().unwrap();
    match mode {
        "send" | "fail" => {
            let handle = Handle(from_hex(hex).try_into().unwrap());
            // The receiver does not stripe: it follows the sender, which does here.
            let net = open(&lib, settings(2, mode == "send", 1));
            let s = until("connect", || net.connect(0, &handle));
            let mut buf: Vec<u8> = vec![0; 64 << 20];
            let mh = net
                .reg_mr(s, buf.as_mut_ptr(), buf.len(), MemType::Host)
                .unwrap();
            for (k, &n) in SIZES.iter().enumerate() {
                buf[..n].copy_from_slice(&pattern(n + k, n));
                let p = buf.as_mut_ptr();
                let r = post("isend", || net.isend(s, p, n, k as i32, mh));
                match until("send", || match net.test(r) {
                    Ok(None) => Ok(None),
                    other => Ok(Some(other)),
                }) {
                    Ok(_) => {}
                    Err(e) => {
                        println!("CHILD_ERROR {}", e.msg);
                        std::process::exit(3);
                    }
                }
            }
            net.close_send(s).unwrap();
            println!("CHILD_OK");
        }
        "pair" => {
            // Both ends here: connect and accept, then one message each way.
            let net = open(&lib, settings(1, false, 0));
            let (s, r) = pair(&net);
            let mut b = vec![0u8; 64];
            let mh = net.reg_mr(r, b.as_mut_ptr(), 64, MemType::Host).unwrap();
            let mut out = pattern(7, 64);
            let ms = net.reg_mr(s, out.as_mut_ptr(), 64, MemType::Host).unwrap();
            let rr = post("irecv", || net.irecv(r, b.as_mut_ptr(), 64, 0, mh));
            let sr = post("isend", || net.isend(s, out.as_mut_ptr(), 64, 0, ms));
            until("send", || net.test(sr));
            until("receive", || net.test(rr));
            assert_eq!(b, pattern(7, 64));
            println!("CHILD_OK");
        }
        "port_down" => {
            let net = open(&lib, settings(1, false, 0));
            let (s, r) = pair(&net);
            let mut b = vec![0u8; 64];
            let mh = net.reg_mr(r, b.as_mut_ptr(), 64, MemType::Host).unwrap();
            let rr = net.irecv(r, b.as_mut_ptr(), 64, 0, mh).unwrap().unwrap();
            if let Ok(ms) = std::env::var(PORT_DOWN_WAIT_ENV) {
                // Only watch the receive for that long: it must neither fail nor complete.
                let end = Instant::now() + Duration::from_millis(ms.parse().unwrap());
                while Instant::now() < end {
                    assert!(net.test(rr).unwrap().is_none(), "nobody sent");
                    std::thread::sleep(Duration::from_millis(10));
                }
                println!("CHILD_PENDING");
                std::process::exit(0);
            }
            let e = until("the port's failure", || match net.test(rr) {
                Ok(None) => Ok(None),
                Ok(Some(_)) => panic!("a receive nobody sent completed"),
                Err(e) => Ok(Some(e)),
            });
            println!("CHILD_ERROR {}", e.msg);
            net.close_send(s).unwrap();
            net.close_recv(r).unwrap();
        }
        "gid" => {
            let net = open(&lib, settings(1, false, 0));
            let p = &net.hw.ports[0];
            println!(
                "CHILD_PORT {} lid {} gid {} {}",
                p.label(),
                p.attr.lid,
                p.gid_index,
                to_hex(&p.gid)
            );
        }
        "recv" => {
            // OX_IB_TEST_SENDER_ENV: "K=V;K=V" for the sending child only.
            let sender = std::env::var(SENDER_ENV).unwrap_or_default();
            let env: Vec<(&str, &str)> = sender
                .split(';')
                .filter_map(|kv| kv.split_once('='))
                .collect();
            let (ok, out, error, _) = receive_from_child(&env);
            println!("CHILD_RECV {ok} {error:?}\n{out}");
            assert!(ok && out.contains("CHILD_OK") && error.is_none());
            println!("CHILD_OK");
        }
        "select" => {
            match crate::transport::net::network(None) {
                Ok(n) => println!("CHILD_NET {}", n.name()),
                Err(e) => println!("CHILD_NET_ERROR {}", e.msg),
            }
            match crate::transport::net::network(Some("IB")) {
                Ok(n) => {
                    let p = n.properties(0).unwrap();
                    println!("CHILD_IB {} {}", p.name, p.speed_mbps);
                }
                Err(e) => println!("CHILD_IB_ERROR {}", e.msg),
            }
        }
        "marks" => print_marks(&lib),
        "comm_marks" => print_comm_marks(&lib),
        other => panic!("unknown child mode {other}"),
    }
}

/// Receive `SIZES` from a child sender with `env`; the child's output, and the first error
/// of the receives (checking the data of those that complete).
fn receive_from_child(env: &[(&str, &str)]) -> (bool, String, Option<String>, Duration) {
    receive_from_child_on(&stand_in().unwrap(), None, env)
}

/// `receive_from_child` with both processes on the stand-in `lib` with the fake sysfs
/// `sysfs` (else the real one).
fn receive_from_child_on(
    lib: &Path,
    sysfs: Option<&Path>,
    env: &[(&str, &str)],
) -> (bool, String, Option<String>, Duration) {
    let mut s = settings(2, false, 1);
    let mut env: Vec<(&str, &str)> = env.to_vec();
    let mode = if env.is_empty() { "send" } else { "fail" };
    let (lib_s, dir_s);
    if let Some(dir) = sysfs {
        s.sysfs = dir.to_path_buf();
        (lib_s, dir_s) = (lib.to_str().unwrap(), dir.to_str().unwrap());
        env.extend([(STAND_IN_ENV, lib_s), (SYSFS_ENV, dir_s)]);
    }
    let net = open(lib, s);
    let (h, l) = net.listen(0).unwrap();
    let child = spawn_child(mode, Some(&h), &env);
    let r = until("accept", || net.accept(l));
    let mut buf: Vec<u8> = vec![0; 64 << 20];
    let mh = net
        .reg_mr(r, buf.as_mut_ptr(), buf.len(), MemType::Host)
        .unwrap();
    let start = Instant::now();
    let mut error = None;
    for (k, &n) in SIZES.iter().enumerate() {
        let p = buf.as_mut_ptr();
        let rr = net.irecv(r, p, buf.len(), k as i32, mh).unwrap().unwrap();
        match until("receive", || match net.test(rr) {
            Ok(None) => Ok(None),
            other => Ok(Some(other)),
        }) {
            Ok(got) => {
                assert_eq!(got, Some(n));
                assert!(buf[..n] == pattern(n + k, n)[..], "{n} bytes: wrong data");
            }
            Err(e) => {
                error = Some(e.msg);
                break;
            }
        }
    }
    let elapsed = start.elapsed();
    let (ok, out) = finish_child(child, Duration::from_secs(30));
    net.close_recv(r).unwrap();
    net.close_listen(l).unwrap();
    (ok, out, error, elapsed)
}

#[test]
fn every_size_arrives_exactly_from_another_process() {
    if stand_in().is_none() {
        return;
    }
    let (ok, out, error, _) = receive_from_child(&[]);
    assert!(ok && out.contains("CHILD_OK"), "the child failed:\n{out}");
    assert_eq!(error, None);
}

#[test]
fn a_qp_failing_in_the_peer_process_is_an_error_on_both_sides_naming_peer_and_status() {
    if stand_in().is_none() {
        return;
    }
    let (ok, out, error, elapsed) = receive_from_child(&[("SOFT_VERBS_FAIL_AFTER", "3")]);
    assert!(!ok, "the child's sends cannot all succeed:\n{out}");
    assert!(
        out.contains("CHILD_ERROR NET/IB : Got completion from peer 127.0.0.1:")
            && out.contains("transport retry counter exceeded"),
        "{out}"
    );
    let error = error.expect("the receiver fails too");
    assert!(
        error.contains("peer 127.0.0.1:") && error.contains("soft_0:1"),
        "{error}"
    );
    assert!(elapsed < Duration::from_secs(20));
}

#[test]
fn a_port_going_down_fails_the_requests_in_flight() {
    if stand_in().is_none() {
        return;
    }
    let child = spawn_child(
        "port_down",
        None,
        &[
            ("SOFT_VERBS_PORT_DOWN_AFTER_MS", "300"),
            ("NCCL_DEBUG", "WARN"),
        ],
    );
    let (ok, out) = finish_child(child, Duration::from_secs(20));
    assert!(ok, "{out}");
    assert!(
        out.contains("NET/IB : Got async event : port error"),
        "{out}"
    );
    assert!(
        out.contains("CHILD_ERROR NET/IB : port soft_0:1 is down"),
        "{out}"
    );
    assert!(out.contains("peer 127.0.0.1:"), "{out}");
}

#[test]
fn ib_is_chosen_before_sockets_unless_excluded_or_disabled() {
    if stand_in().is_none() {
        return;
    }
    let run = |env: &[(&str, &str)]| {
        let mut all = vec![
            ("NCCL_SOCKET_IFNAME", "lo"),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
        ];
        all.extend_from_slice(env);
        let (ok, out) = finish_child(spawn_child("select", None, &all), Duration::from_secs(20));
        assert!(ok, "{out}");
        out
    };
    let out = run(&[]);
    assert!(out.contains("CHILD_NET IB"), "{out}");
    // The stand-in has ibv_reg_mr_iova2: relaxed ordering by default, as NVIDIA's.
    assert!(
        out.contains("NET/IB : Using [0]soft_0:1/IB [RO]; OOB lo:127.0.0.1<0>"),
        "{out}"
    );
    let out = run(&[("NCCL_IB_PCI_RELAXED_ORDERING", "0")]);
    assert!(
        out.contains("NET/IB : Using [0]soft_0:1/IB ; OOB lo:127.0.0.1<0>"),
        "{out}"
    );
    assert!(out.contains("CHILD_IB soft_0 100000"), "{out}");
    let out = run(&[("NCCL_IB_HCA", "^soft")]);
    assert!(
        out.contains("NET/IB : No device found.") && out.contains("CHILD_NET Socket"),
        "{out}"
    );
    let out = run(&[("NCCL_IB_HCA", "soft_0:2")]);
    assert!(out.contains("CHILD_NET Socket"), "{out}");
    // NCCL_NET=IB without the IB network: an error saying why.
    let out = run(&[("NCCL_IB_DISABLE", "1")]);
    assert!(out.contains("CHILD_NET Socket"), "{out}");
    assert!(
        out.contains(
            "CHILD_IB_ERROR NCCL_NET / netName IB: no such network (available: Socket); \
                      IB: disabled by NCCL_IB_DISABLE"
        ),
        "{out}"
    );
    let out = run(&[
        ("LD_LIBRARY_PATH", "/nonexistent"),
        (STAND_IN_ENV, "/nonexistent"),
    ]);
    let real = Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so.1").exists();
    assert!(out.contains("CHILD_NET Socket"), "{out}");
    assert!(
        out.contains(if real {
            "NET/IB : No device found."
        } else {
            "Failed to open libibverbs.so"
        }),
        "{out}"
    );
    // NCCL_IBVERBS_LIB names the library to open before the usual names.
    let lib = stand_in().unwrap();
    let out = run(&[
        ("LD_LIBRARY_PATH", "/nonexistent"),
        (STAND_IN_ENV, "/nonexistent"),
        ("NCCL_DEBUG_SUBSYS", "INIT,NET,ENV"),
        ("NCCL_IBVERBS_LIB", lib.to_str().unwrap()),
    ]);
    assert!(out.contains("CHILD_NET IB"), "{out}");
    assert!(
        out.contains(&format!(
            "NCCL_IBVERBS_LIB set by environment to {}",
            lib.display()
        )),
        "{out}"
    );
}

const _: () = assert!(HANDLE_BYTES >= 36);

#[test]
fn the_proxy_moves_simple_and_ll_steps_over_ib() {
    let Some(lib) = stand_in() else { return };
    for (qps, split) in [(1, false), (4, true)] {
        let net: std::sync::Arc<dyn Net> =
            std::sync::Arc::new(open(&lib, settings(qps, split, -2)));
        crate::transport::net::tests::move_schedule_between_two_proxies(&net);
    }
}

// ---- merged devices (NCCL_IB_MERGE_NICS) ----

/// A fake sysfs directory in which each `(device, PCI function)` of `links` has its
/// `<device>/device` link to a directory of that PCI path (under a fake bus).
fn fake_sysfs(tag: &str, links: &[(&str, &str)]) -> PathBuf {
    let root = std::env::temp_dir()
        .join(format!("oxccl-ib-test-{}", std::process::id()))
        .join(format!("sysfs-{tag}"));
    let _ = std::fs::remove_dir_all(&root);
    for (dev, function) in links {
        let pci = root.join("devices/pci0000:16/0000:16:02.0").join(function);
        std::fs::create_dir_all(&pci).unwrap();
        let d = root.join(dev);
        std::fs::create_dir_all(&d).unwrap();
        std::os::unix::fs::symlink(&pci, d.join("device")).unwrap();
    }
    root
}

/// soft_0 and soft_1 as the two functions of one NIC.
fn one_nic(tag: &str) -> PathBuf {
    fake_sysfs(
        tag,
        &[("soft_0", "0000:17:00.0"), ("soft_1", "0000:17:00.1")],
    )
}

fn merged_settings(sysfs: &Path, merge: bool, qps: usize, split: bool) -> Settings {
    let mut s = settings(qps, split, 1);
    s.sysfs = sysfs.to_path_buf();
    s.merge_nics = merge;
    s
}

/// Payload bytes the dual stand-in delivered to soft_0 and soft_1 so far.
fn member_rx_bytes(lib: &Path) -> [u64; 2] {
    let l = super::verbs::Lib::open(lib.to_str().unwrap()).unwrap();
    let bytes = |d| l.stand_in_rx_bytes(d).expect("the stand-in counts bytes");
    [bytes("soft_0"), bytes("soft_1")]
}

#[test]
fn two_ports_of_one_nic_make_one_device_and_ports_of_two_nics_do_not() {
    let Some(lib) = dual_stand_in() else { return };
    let nic = one_nic("discovery");
    let net = open(&lib, merged_settings(&nic, true, 1, false));
    assert_eq!(net.devices().unwrap(), 1);
    let p = net.properties(0).unwrap();
    assert_eq!(p.name, "soft_0+soft_1");
    assert_eq!(p.speed_mbps, 200_000, "the members' speeds summed");
    assert!(
        p.pci_path.ends_with("/0000:16:02.0/0000:17:00.0"),
        "{}",
        p.pci_path
    );
    assert_eq!(
        p.guid,
        0x0002_c903_00a1_b2c0u64.to_be(),
        "the first member's"
    );
    assert_eq!(p.port, 1);
    assert!(net.properties(1).is_err());
    // NCCL_IB_MERGE_NICS=0: one device per port.
    let apart = open(&lib, merged_settings(&nic, false, 1, false));
    assert_eq!(apart.devices().unwrap(), 2);
    assert_eq!(apart.properties(1).unwrap().name, "soft_1");
    assert_eq!(apart.properties(1).unwrap().speed_mbps, 100_000);
    // Functions of two NICs, or no PCI path at all: never merged.
    let two = fake_sysfs(
        "two-nics",
        &[("soft_0", "0000:17:00.0"), ("soft_1", "0000:18:00.0")],
    );
    let net = open(&lib, merged_settings(&two, true, 1, false));
    assert_eq!(net.devices().unwrap(), 2);
    assert_eq!(net.properties(0).unwrap().name, "soft_0");
    let none = fake_sysfs("no-paths", &[]);
    let net = open(&lib, merged_settings(&none, true, 1, false));
    assert_eq!(net.devices().unwrap(), 2);
}

#[test]
fn every_size_arrives_exactly_over_a_merged_device_with_bytes_on_both_members() {
    let Some(lib) = dual_stand_in() else { return };
    let nic = one_nic("exchange");
    for (qps, split) in [(1, false), (2, true)] {
        let net = open(&lib, merged_settings(&nic, true, qps, split));
        let (s, r) = pair(&net);
        assert_eq!(net.comm(s).unwrap().1.lock().qps.len(), 2 * qps);
        let before = member_rx_bytes(&lib);
        exchange(&net, s, r, SIZES, 1);
        let after = member_rx_bytes(&lib);
        // Round robin: the 64 MiB message on soft_0, the 1 MiB one on soft_1; striped:
        // half of every message on each.
        let least = if split { 32 << 20 } else { 1 << 20 };
        for m in 0..2 {
            assert!(
                after[m] - before[m] >= least,
                "soft_{m} received {} bytes (split {split})",
                after[m] - before[m]
            );
        }
        net.close_send(s).unwrap();
        net.close_recv(r).unwrap();
    }
}

/// A connection from `snet`'s device `sdev` to `rnet`'s device `rdev`.
fn pair_between(snet: &IbNet, sdev: i32, rnet: &IbNet, rdev: i32) -> (Comm, Comm) {
    let (h, l) = rnet.listen(rdev).unwrap();
    let (mut s, mut r) = (None, None);
    until("connect and accept", || {
        if s.is_none() {
            s = snet.connect(sdev, &h)?;
        }
        if r.is_none() {
            r = rnet.accept(l)?;
        }
        Ok(s.zip(r))
    })
}

#[test]
fn a_merged_device_and_a_single_port_connect_over_qps_for_the_larger() {
    let Some(lib) = dual_stand_in() else { return };
    let nic = one_nic("shapes");
    let merged = open(&lib, merged_settings(&nic, true, 1, true));
    let single = open(&lib, merged_settings(&nic, false, 1, true));
    for (from_merged, single_dev) in [(true, 0), (false, 1)] {
        let (snet, sdev, rnet, rdev) = if from_merged {
            (&merged, 0, &single, single_dev)
        } else {
            (&single, single_dev, &merged, 0)
        };
        let (s, r) = pair_between(snet, sdev, rnet, rdev);
        assert_eq!(snet.comm(s).unwrap().1.lock().qps.len(), 2);
        assert_eq!(rnet.comm(r).unwrap().1.lock().qps.len(), 2);
        exchange_between(snet, s, rnet, r, &[0, 1, 4097, 1 << 20], 2);
        snet.close_send(s).unwrap();
        rnet.close_recv(r).unwrap();
    }
}

#[test]
fn every_size_arrives_exactly_from_another_process_over_a_merged_device() {
    let Some(lib) = dual_stand_in() else { return };
    let nic = one_nic("two-processes");
    let before = member_rx_bytes(&lib);
    let (ok, out, error, _) = receive_from_child_on(&lib, Some(&nic), &[]);
    assert!(ok && out.contains("CHILD_OK"), "the child failed:\n{out}");
    assert_eq!(error, None);
    let after = member_rx_bytes(&lib);
    // The child stripes over 2 QPs per member: about half of the 64 MiB on each.
    for m in 0..2 {
        assert!(
            after[m] - before[m] >= 30 << 20,
            "soft_{m} received {} bytes",
            after[m] - before[m]
        );
    }
}

#[test]
fn a_member_port_failing_is_an_error_naming_the_peer_and_the_member() {
    let Some(lib) = dual_stand_in() else { return };
    let nic = one_nic("member-fails");
    let env = [
        // The second work request on a QP of soft_1: message 5, on QP 1 (soft_1).
        ("SOFT_VERBS_FAIL_AFTER", "1"),
        ("SOFT_VERBS_FAIL_DEVICE", "soft_1"),
    ];
    let (ok, out, error, elapsed) = receive_from_child_on(&lib, Some(&nic), &env);
    assert!(!ok, "the child's sends cannot all succeed:\n{out}");
    assert!(
        out.contains("CHILD_ERROR NET/IB : Got completion from peer 127.0.0.1:")
            && out.contains("transport retry counter exceeded")
            && out.contains("on device soft_1:1"),
        "{out}"
    );
    let error = error.expect("the receiver fails too");
    assert!(
        error.contains("peer 127.0.0.1:") && error.contains("soft_1:1"),
        "{error}"
    );
    assert!(elapsed < Duration::from_secs(20));
}

/// Run `mode` in a child on the stand-in's RoCE ports (`SOFT_VERBS_LINK_LAYER=eth`) with
/// `env`; its output.
fn on_roce(mode: &str, env: &[(&str, &str)], limit: Duration) -> String {
    let mut all = vec![("SOFT_VERBS_LINK_LAYER", "eth")];
    all.extend_from_slice(env);
    let (ok, out) = finish_child(spawn_child(mode, None, &all), limit);
    assert!(ok, "{out}");
    out
}

/// The GID index (and the GID's hex) a child picks on RoCE with `env`.
fn roce_gid(env: &[(&str, &str)]) -> (i32, String) {
    let out = on_roce("gid", env, Duration::from_secs(20));
    let line = out
        .lines()
        .find_map(|l| l.split_once("CHILD_PORT ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("{out}"));
    let w: Vec<&str> = line.split(' ').collect();
    assert_eq!(w[..3], ["soft_0:1/RoCE", "lid", "0"], "{out}");
    (w[4].parse().unwrap(), w[5].to_string())
}

#[test]
fn roce_ports_get_the_gid_nvidia_chooses() {
    if stand_in().is_none() {
        return;
    }
    let ipv4 = |g: &str| g.starts_with("00000000000000000000ffff0a");
    let (index, gid) = roce_gid(&[]);
    assert_eq!(index, 3, "RoCE v2, IPv4 by default");
    assert!(ipv4(&gid), "{gid}");
    let (index, gid) = roce_gid(&[("NCCL_IB_ROCE_VERSION_NUM", "1")]);
    assert_eq!(index, 2, "RoCE v1, IPv4");
    assert!(ipv4(&gid), "{gid}");
    let (index, gid) = roce_gid(&[("NCCL_IB_ADDR_FAMILY", "AF_INET6")]);
    assert_eq!(
        index, 0,
        "IPv6: only link-local GIDs, so the first entry, as NVIDIA's"
    );
    assert!(gid.starts_with("fe80"), "{gid}");
    let (index, gid) = roce_gid(&[("NCCL_IB_GID_INDEX", "1")]);
    assert_eq!(index, 1, "the index set");
    assert!(gid.starts_with("fe80"), "{gid}");
    let (index, _) = roce_gid(&[("NCCL_IB_ADDR_RANGE", "10.0.0.0/8")]);
    assert_eq!(index, 3, "the IPv4 address is in 10.0.0.0/8");
    let (index, gid) = roce_gid(&[("NCCL_IB_ADDR_RANGE", "192.168.0.0/16")]);
    assert_eq!(
        index, 0,
        "no address in range: the first entry, as NVIDIA's"
    );
    assert!(gid.starts_with("fe80"), "{gid}");
}

#[test]
fn roce_ports_show_their_link_layer_in_the_using_line() {
    if stand_in().is_none() {
        return;
    }
    let out = on_roce(
        "select",
        &[
            ("NCCL_SOCKET_IFNAME", "lo"),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
        ],
        Duration::from_secs(20),
    );
    assert!(out.contains("CHILD_NET IB"), "{out}");
    assert!(
        out.contains("NET/IB : Using [0]soft_0:1/RoCE [RO]; OOB lo:127.0.0.1<0>"),
        "{out}"
    );
}

/// Both processes on RoCE ports, where the stand-in refuses a QP whose address is not the
/// peer's GID: data moving at all shows the connection is addressed by GID.
#[test]
fn every_size_arrives_exactly_between_two_processes_over_roce_v2() {
    if stand_in().is_none() {
        return;
    }
    let out = on_roce("recv", &[], Duration::from_secs(60));
    assert!(out.contains("CHILD_OK"), "{out}");
}

/// The stand-in's facts about every data QP of `c` on `net`.
fn facts(lib: &Path, net: &IbNet, c: Comm) -> Vec<super::verbs::QpFacts> {
    let l = super::verbs::Lib::open(lib.to_str().unwrap()).unwrap();
    net.qp_nums(c)
        .into_iter()
        .map(|q| {
            l.stand_in_qp_facts(q)
                .unwrap_or_else(|| panic!("the stand-in knows QP {q:#x}"))
        })
        .collect()
}

/// A sender with traffic class 106 and service level 3 connects to a receiver with 0 and 5
/// (both otherwise as the environment says); data moves exactly, and every QP's facts are
/// printed: `CHILD_MARKS send|recv tc sl ece inline`.
fn print_marks(lib: &Path) {
    let mut ss = settings(2, false, 0);
    (ss.qp.traffic_class, ss.qp.service_level) = (106, 3);
    let mut rs = settings(2, false, 0);
    (rs.qp.traffic_class, rs.qp.service_level) = (0, 5);
    let (snet, rnet) = (open(lib, ss), open(lib, rs));
    let (s, r) = pair_between(&snet, 0, &rnet, 0);
    exchange_between(&snet, s, &rnet, r, &[0, 8, 65536 + 3, 1 << 20], 4);
    for (side, net, c) in [("send", &snet, s), ("recv", &rnet, r)] {
        for f in facts(lib, net, c) {
            println!(
                "CHILD_MARKS {side} {} {} {:#x} {}",
                f.traffic_class, f.service_level, f.ece_options, f.max_inline
            );
        }
    }
    snet.close_send(s).unwrap();
    rnet.close_recv(r).unwrap();
}

/// A communicator with `ncclConfig_t.trafficClass` OX_IB_TEST_COMM_TC connects to itself over
/// its network (`for_comm`'s own one where the class changes anything); its QPs' facts are
/// printed as `print_marks` does.
fn print_comm_marks(lib: &Path) {
    let class: i32 = std::env::var("OX_IB_TEST_COMM_TC")
        .unwrap()
        .parse()
        .unwrap();
    let shared = open(lib, settings(2, false, 0));
    let own = shared.with_traffic_class(class);
    println!("CHILD_OWN_NET {}", own.is_some());
    let net = own.as_ref().unwrap_or(&shared);
    let (s, r) = pair(net);
    exchange(net, s, r, &[0, 8, 65536 + 3], 4);
    for (side, c) in [("send", s), ("recv", r)] {
        for f in facts(lib, net, c) {
            println!(
                "CHILD_MARKS {side} {} {} {:#x} {}",
                f.traffic_class, f.service_level, f.ece_options, f.max_inline
            );
        }
    }
    net.close_send(s).unwrap();
    net.close_recv(r).unwrap();
}

/// The distinct `CHILD_MARKS` lines of a side in `out`: (tc, sl, ece, inline).
fn marks(out: &str, side: &str) -> Vec<String> {
    let mut v: Vec<String> = out
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("CHILD_MARKS {side} ")))
        .map(str::to_string)
        .collect();
    assert!(!v.is_empty(), "{out}");
    v.sort();
    v.dedup();
    v
}

#[test]
fn the_receiver_marks_its_packets_as_the_sender_or_with_the_fifo_traffic_class() {
    if stand_in().is_none() {
        return;
    }
    // InfiniBand: no GRH, so no traffic class; the receiver's QPs take the sender's level.
    let (ok, out) = finish_child(spawn_child("marks", None, &[]), Duration::from_secs(30));
    assert!(ok, "{out}");
    assert_eq!(marks(&out, "send"), ["0 3 0x0 0"], "{out}");
    assert_eq!(marks(&out, "recv"), ["0 3 0x0 0"], "{out}");
    let out = on_roce("marks", &[], Duration::from_secs(30));
    assert_eq!(marks(&out, "send"), ["106 3 0x0 0"], "{out}");
    assert_eq!(marks(&out, "recv"), ["106 3 0x0 0"], "{out}");
    let out = on_roce(
        "marks",
        &[("NCCL_IB_FIFO_TC", "34")],
        Duration::from_secs(30),
    );
    assert_eq!(marks(&out, "send"), ["106 3 0x0 0"], "{out}");
    assert_eq!(marks(&out, "recv"), ["34 3 0x0 0"], "{out}");
}

#[test]
fn cts_entries_go_inline_where_asked() {
    if stand_in().is_none() {
        return;
    }
    // The stand-in refuses an inline post longer than the QP's room, so data moving at all
    // shows the room was asked for; the facts show it was.
    let cts = std::mem::size_of::<super::fifo::Cts>();
    let (ok, out) = finish_child(
        spawn_child("marks", None, &[("NCCL_IB_USE_INLINE", "1")]),
        Duration::from_secs(30),
    );
    assert!(ok, "{out}");
    assert_eq!(marks(&out, "send"), [format!("0 3 0x0 {cts}")], "{out}");
    assert_eq!(marks(&out, "recv"), [format!("0 3 0x0 {cts}")], "{out}");
}

#[test]
fn ece_options_are_negotiated_as_nvidias() {
    if stand_in().is_none() {
        return;
    }
    // One process (one mask): every QP of both ends agrees on the device's options.
    let ece = [("SOFT_VERBS_ECE", "0x7")];
    let (ok, out) = finish_child(spawn_child("marks", None, &ece), Duration::from_secs(30));
    assert!(ok, "{out}");
    assert_eq!(marks(&out, "send"), ["0 3 0x7 0"], "{out}");
    assert_eq!(marks(&out, "recv"), ["0 3 0x7 0"], "{out}");
    let off = [("SOFT_VERBS_ECE", "0x7"), ("NCCL_IB_ECE_ENABLE", "0")];
    let (ok, out) = finish_child(spawn_child("marks", None, &off), Duration::from_secs(30));
    assert!(ok, "{out}");
    assert_eq!(marks(&out, "send"), ["0 3 0x0 0"], "{out}");
    assert_eq!(marks(&out, "recv"), ["0 3 0x0 0"], "{out}");
    // Two processes offering different options: the stand-in refuses a connection whose ends
    // disagree, so data moving shows the sender took the receiver's reduced options.
    let env = [
        ("SOFT_VERBS_ECE", "0x5"),
        (
            SENDER_ENV,
            "SOFT_VERBS_ECE=0x7;NCCL_DEBUG=INFO;NCCL_DEBUG_SUBSYS=NET",
        ),
    ];
    let (ok, out) = finish_child(spawn_child("recv", None, &env), Duration::from_secs(60));
    assert!(ok && out.contains("CHILD_OK"), "{out}");
    assert!(
        out.contains("set ECE vendor_id 0x15b3 options 0x5 comp_mask 0x0"),
        "{out}"
    );
}

#[test]
fn async_events_only_log_with_return_async_events_off() {
    if stand_in().is_none() {
        return;
    }
    let (ok, out) = finish_child(
        spawn_child(
            "port_down",
            None,
            &[
                ("SOFT_VERBS_PORT_DOWN_AFTER_MS", "300"),
                ("NCCL_IB_RETURN_ASYNC_EVENTS", "0"),
                ("NCCL_DEBUG", "WARN"),
                (PORT_DOWN_WAIT_ENV, "1500"),
            ],
        ),
        Duration::from_secs(30),
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("NET/IB : Got async event : port error"),
        "{out}"
    );
    assert!(out.contains("CHILD_PENDING"), "{out}");
}

#[test]
fn a_communicators_traffic_class_marks_its_packets_unless_nccl_ib_tc_or_sl_are_set() {
    if stand_in().is_none() {
        return;
    }
    let run = |class: &str, env: &[(&str, &str)]| {
        let mut all = vec![("OX_IB_TEST_COMM_TC", class)];
        all.extend_from_slice(env);
        on_roce("comm_marks", &all, Duration::from_secs(30))
    };
    // Unset (NCCL_CONFIG_UNDEF_INT): the shared network, nothing marked.
    let out = run(&i32::MIN.to_string(), &[]);
    assert!(out.contains("CHILD_OWN_NET false"), "{out}");
    assert_eq!(marks(&out, "send"), ["0 0 0x0 0"], "{out}");
    // A class: the traffic class, and the service level where it is one.
    let out = run("106", &[]);
    assert!(out.contains("CHILD_OWN_NET true"), "{out}");
    assert_eq!(marks(&out, "send"), ["106 0 0x0 0"], "{out}");
    assert_eq!(marks(&out, "recv"), ["106 0 0x0 0"], "{out}");
    let out = run("5", &[]);
    assert_eq!(marks(&out, "send"), ["5 5 0x0 0"], "{out}");
    assert_eq!(marks(&out, "recv"), ["5 5 0x0 0"], "{out}");
    // NCCL_IB_TC and NCCL_IB_SL win over the communicator's class.
    let out = run("5", &[("NCCL_IB_TC", "34"), ("NCCL_IB_SL", "2")]);
    assert!(out.contains("CHILD_OWN_NET false"), "{out}");
    assert_eq!(marks(&out, "send"), ["34 2 0x0 0"], "{out}");
    let out = run("5", &[("NCCL_IB_TC", "34")]);
    assert_eq!(marks(&out, "send"), ["34 5 0x0 0"], "{out}");
}

#[test]
fn a_qp_transition_timing_out_is_retried_as_nvidias() {
    let r = verbs::ModifyRetry {
        any_error: false,
        attempts: 3,
        sleep_ms: 100,
    };
    assert_eq!(
        r.after(libc::ETIMEDOUT, 1),
        Some(Duration::from_millis(100))
    );
    assert_eq!(
        r.after(-libc::ETIMEDOUT, 2),
        Some(Duration::from_millis(200))
    );
    assert_eq!(r.after(libc::ETIMEDOUT, 3), None, "three calls in all");
    assert_eq!(r.after(libc::EINVAL, 1), None, "only ETIMEDOUT");
    let all = verbs::ModifyRetry {
        any_error: true,
        ..r
    };
    assert_eq!(all.after(libc::EINVAL, 1), Some(Duration::from_millis(100)));
    assert_eq!(all.after(0, 1), None);
    let defaults = verbs::ModifyRetry::from_env();
    assert_eq!((defaults.attempts, defaults.sleep_ms), (35, 100));
}

#[test]
fn busy_qp_transitions_are_retried_until_the_count_runs_out() {
    if stand_in().is_none() {
        return;
    }
    let run = |busy: &str, retries: &str| {
        let child = spawn_child(
            "pair",
            None,
            &[
                ("SOFT_VERBS_MODIFY_QP_BUSY", busy),
                ("NCCL_IB_MQP_RETRY_CNT", retries),
                ("NCCL_IB_MQP_RETRY_SLEEP_MSEC", "1"),
                ("NCCL_DEBUG", "INFO"),
                ("NCCL_DEBUG_SUBSYS", "NET"),
            ],
        );
        finish_child(child, Duration::from_secs(20))
    };
    let (ok, out) = run("3", "34");
    assert!(ok && out.contains("CHILD_OK"), "{out}");
    for made in 1..=3 {
        assert!(
            out.contains(&format!("retrying {made}/35 after {made} msec of sleep")),
            "{out}"
        );
    }
    assert!(!out.contains("retrying 4/35"), "{out}");
    let (ok, out) = run("5", "2");
    assert!(!ok && !out.contains("CHILD_OK"), "{out}");
    assert!(
        out.contains("retrying 2/3")
            && out.contains("ibv_modify_qp(qpn ")
            && out.contains("timed out"),
        "{out}"
    );
}

#[test]
fn ranks_in_two_ib_subnets_reach_each_other_at_their_flids() {
    if stand_in().is_none() {
        return;
    }
    // The receiver on subnet 1, the sender on subnet 2: each port's GID 1 carries its FLID,
    // so the ranks address each other globally, at the FLID, and every size arrives.
    let env = [
        ("SOFT_VERBS_IB_SUBNET", "1"),
        (SENDER_ENV, "SOFT_VERBS_IB_SUBNET=2"),
    ];
    let (ok, out) = finish_child(spawn_child("recv", None, &env), Duration::from_secs(60));
    assert!(ok && out.contains("CHILD_OK"), "{out}");
    let (ok, out) = finish_child(
        spawn_child("gid", None, &[("SOFT_VERBS_IB_SUBNET", "1")]),
        Duration::from_secs(30),
    );
    assert!(ok, "{out}");
    let line = out
        .lines()
        .find_map(|l| l.find("CHILD_PORT ").map(|at| &l[at..]))
        .unwrap_or_else(|| panic!("{out}"));
    // "CHILD_PORT soft_0:1/IB lid L gid 1 fe800000<flid><subnet 0001><guid>"
    let words: Vec<&str> = line.split(' ').collect();
    assert_eq!(words[4..6], ["gid", "1"], "{line}");
    assert!(
        words[6].starts_with("fe800000") && &words[6][12..16] == "0001",
        "{line}"
    );
    // Without the routable GID both ends use GID 0, route by LID across the subnets, and
    // the stand-in's routers refuse: the sends fail naming the status.
    let env = [
        ("SOFT_VERBS_IB_SUBNET", "1"),
        ("NCCL_IB_ROUTABLE_FLID_GID_INDEX", "0"),
        (
            SENDER_ENV,
            "SOFT_VERBS_IB_SUBNET=2;NCCL_IB_ROUTABLE_FLID_GID_INDEX=0",
        ),
    ];
    let (ok, out) = finish_child(spawn_child("recv", None, &env), Duration::from_secs(90));
    assert!(!ok, "LID routing across subnets cannot succeed:\n{out}");
    assert!(out.contains("transport retry counter exceeded"), "{out}");
}
