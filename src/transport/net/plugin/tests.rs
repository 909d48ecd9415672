//! Tests of the plugin loader and adapter: the file names tried for a `NCCL_NET_PLUGIN` value,
//! the version order, libraries that are missing or unusable, and data moved between two
//! threads through `ffi-tests/net_plugin/oxtest_net.c` (compiled here with `cc`; skipped with
//! a note where there is none) for each ABI version.

use super::*;
use crate::error::Error;
use crate::transport::net::api::{Comm, Handle, MemHandle, MemType, Request, PTR_CUDA, PTR_HOST};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The file names tried for a `NCCL_NET_PLUGIN` entry.
fn candidates(entry: &str) -> Vec<Option<String>> {
    crate::plugin::candidates(Kind::Net, entry)
}

#[test]
fn the_default_and_none() {
    assert_eq!(entries(None), vec!["libnccl-net.so".to_string()]);
    assert_eq!(
        candidates("libnccl-net.so"),
        vec![Some("libnccl-net.so".into())]
    );
    assert!(entries(Some("none")).is_empty());
    assert!(entries(Some("NoNe")).is_empty());
}

#[test]
fn names_paths_and_library_names() {
    let both = |n: &str| vec![Some(n.to_string()), Some(format!("libnccl-net-{n}.so"))];
    assert_eq!(candidates("ofi"), both("ofi"));
    assert_eq!(candidates("aws-ofi"), both("aws-ofi"));
    // Not "lib*.so": the name is tried as given, then within NVIDIA's pattern.
    assert_eq!(candidates("ofi.so"), both("ofi.so"));
    assert_eq!(candidates("libofi"), both("libofi"));
    assert_eq!(candidates("libofi.so"), vec![Some("libofi.so".into())]);
    assert_eq!(
        candidates("/opt/x/libnccl-net.so"),
        vec![Some("/opt/x/libnccl-net.so".into())]
    );
    assert_eq!(candidates("./plugin.so"), vec![Some("./plugin.so".into())]);
}

#[test]
fn static_plugin_means_the_program() {
    assert_eq!(candidates("STATIC_PLUGIN")[0], None);
    // NVIDIA compares only the entry's length, case-insensitively.
    assert_eq!(candidates("static")[0], None);
    assert_eq!(candidates("staticx")[0], Some("staticx".into()));
}

#[test]
fn lists_in_order_within_nvidia_limits() {
    assert_eq!(
        entries(Some("a,,b,")),
        vec!["a".to_string(), "b".to_string()]
    );
    let many: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
    assert_eq!(entries(Some(&many.join(","))), many[..14].to_vec());
    let long = "x".repeat(255);
    assert_eq!(entries(Some(&format!("{long},ok"))), vec!["ok".to_string()]);
}

#[test]
fn newest_version_first() {
    assert_eq!(VERSIONS, [11, 10, 9, 8]);
    assert_eq!(OLD_VERSIONS, [7, 6]);
    assert_eq!(table_symbol(11).to_str().unwrap(), "ncclNetPlugin_v11");
}

#[test]
fn load_reads_the_environment_and_never_fails() {
    // Whatever NCCL_NET_PLUGIN says here (usually unset: libnccl-net.so, not installed).
    assert!(load().is_ok());
}

#[test]
fn a_missing_library_is_no_plugin() {
    assert!(load_from(Some("/nonexistent/oxccl/libnccl-net-x.so"), &VERSIONS).is_none());
    assert!(load_from(Some("oxccl-no-such-plugin,none-either"), &VERSIONS).is_none());
}

#[test]
fn a_library_without_a_table_is_no_plugin() {
    let Some(lib) = compile("empty", Source::Text("int oxtest_nothing_here = 1;\n"), &[]) else {
        return;
    };
    assert!(open_path(&lib).is_none());
}

#[test]
fn a_v7_only_plugin_is_too_old() {
    let Some(lib) = compile("v7", Source::Plugin, &["-DOXTEST_EXPORT_ONLY=7"]) else {
        return;
    };
    assert!(open_path(&lib).is_none());
}

#[test]
fn an_older_table_is_found_when_newer_ones_are_missing() {
    let Some(lib) = compile("only_v9", Source::Plugin, &["-DOXTEST_EXPORT_ONLY=9"]) else {
        return;
    };
    let net = open_path(&lib).expect("a v9-only plugin loads");
    assert_eq!(net.properties(0).unwrap().name, "OxTest0");
}

#[test]
fn a_plugin_whose_init_fails_is_no_plugin() {
    let Some(lib) = compile("fail_init", Source::Plugin, &["-DOXTEST_FAIL_INIT"]) else {
        return;
    };
    for v in VERSIONS {
        assert!(open_entry(&lib, &[v]).is_none(), "v{v}");
    }
    assert!(crate::plugin::logger::tests::logged(
        "NET/OxTest : built with OXTEST_FAIL_INIT, failing init"
    ));
}

#[test]
fn the_newest_table_is_used_and_init_logs_through_oxccl() {
    let Some(lib) = plugin() else { return };
    let net = open_path(lib).expect("the test plugin loads");
    assert_eq!(net.name(), "OxTest");
    assert!(crate::plugin::logger::tests::logged(
        "NET/OxTest : using 127.0.0.1, 1 device(s), host memory only"
    ));
}

#[test]
fn a_v11_plugin_gets_a_context_per_communicator() {
    let Some(lib) = plugin() else { return };
    let shared: Arc<dyn Net> = open_entry(lib, &[11]).expect("v11 loads");
    let a = shared
        .for_comm(0xa11c0de, 7)
        .unwrap()
        .expect("a net of its own");
    let b = shared
        .for_comm(0xb0b, crate::abi::NCCL_CONFIG_UNDEF_INT)
        .unwrap()
        .expect("a net of its own");
    assert!(crate::plugin::logger::tests::logged(
        "NET/OxTest : context for comm 0xa11c0de, traffic class 7"
    ));
    // Unset is NCCL's NCCL_NET_TRAFFIC_CLASS_UNDEF (-1) for the plugin, as NVIDIA passes it.
    assert!(crate::plugin::logger::tests::logged(
        "NET/OxTest : context for comm 0xb0b, traffic class -1"
    ));
    // Each communicator's listen and connect carry its own context (the plugin checks it).
    exchange(&a, &messages()[..3], false);
    exchange(&b, &messages()[..3], false);
    drop(a);
    assert!(crate::plugin::logger::tests::logged(
        "NET/OxTest : finalized the context of comm 0xa11c0de"
    ));
    assert!(!crate::plugin::logger::tests::logged(
        "NET/OxTest : finalized the context of comm 0xb0b"
    ));
    drop(b);
    assert!(crate::plugin::logger::tests::logged(
        "NET/OxTest : finalized the context of comm 0xb0b"
    ));
    // The process's own context still works after the communicators' went.
    exchange(&shared, &messages()[..1], false);
}

#[test]
fn older_plugins_are_shared_by_communicators_without_a_new_init() {
    let Some(lib) = plugin() else { return };
    for v in [8, 9, 10] {
        let shared: Arc<dyn Net> = open_entry(lib, &[v]).unwrap();
        let own = shared
            .for_comm(0x51de, 3)
            .unwrap()
            .expect("a view of its own");
        exchange(&own, &messages()[..2], false);
    }
    assert!(!crate::plugin::logger::tests::logged(
        "NET/OxTest : context for comm 0x51de, traffic class 3"
    ));
}

#[test]
fn a_plugin_taking_cuda_memory_says_so_and_fails_a_registration_that_is_not() {
    let Some(lib) = plugin_taking_cuda() else {
        return;
    };
    for v in VERSIONS {
        let net = open_entry(lib, &[v]).unwrap_or_else(|| panic!("v{v} loads"));
        assert_eq!(net.properties(0).unwrap().ptr_support, PTR_HOST | PTR_CUDA);
    }
    // Host memory registered as CUDA memory: an error (no libcuda here, or not a device
    // pointer where there is one), never a crash.
    let net: Arc<dyn Net> = open_entry(lib, &[11]).unwrap();
    let (send, recv, listen) = connect_pair(&net);
    let mut buf = vec![0u8; 64];
    assert!(net
        .reg_mr(send, buf.as_mut_ptr(), buf.len(), MemType::Cuda)
        .is_err());
    let mh = net
        .reg_mr(send, buf.as_mut_ptr(), buf.len(), MemType::Host)
        .unwrap();
    net.dereg_mr(send, mh).unwrap();
    close_pair(&net, send, recv, listen);
}

#[test]
fn properties_of_every_version() {
    let Some(lib) = plugin() else { return };
    for v in VERSIONS {
        let net = open_entry(lib, &[v]).unwrap_or_else(|| panic!("v{v} loads"));
        assert_eq!(net.devices().unwrap(), 1);
        let p = net.properties(0).unwrap();
        assert_eq!(p.name, "OxTest0", "v{v}");
        assert_eq!(p.pci_path, "");
        assert_eq!(p.ptr_support, PTR_HOST);
        assert_eq!((p.speed_mbps, p.max_recvs, p.max_comms), (10000, 1, 65536));
        assert!(!p.reg_is_global);
        assert_eq!(p.max_p2p_bytes, 1 << 30);
        let e = net.properties(1).unwrap_err();
        assert!(
            e.msg.contains("OxTest") && e.msg.contains("getProperties(1)"),
            "{e}"
        );
    }
}

#[test]
fn data_moves_one_message_at_a_time_with_every_version() {
    let Some(lib) = plugin() else { return };
    for v in VERSIONS {
        let net: Arc<dyn Net> = open_entry(lib, &[v]).unwrap_or_else(|| panic!("v{v} loads"));
        exchange(&net, &messages(), false);
    }
}

#[test]
fn data_moves_with_many_requests_outstanding() {
    let Some(lib) = plugin() else { return };
    for v in [11, 8] {
        let net: Arc<dyn Net> = open_entry(lib, &[v]).unwrap();
        let mut many = messages();
        many.extend((0..20).map(|i| (i * 977, i * 977 + 5)));
        exchange(&net, &many, true);
    }
}

#[test]
fn a_message_longer_than_the_receive_fails_it() {
    let Some(lib) = plugin() else { return };
    let net: Arc<dyn Net> = open_path(lib).unwrap();
    let (send, recv, listen) = connect_pair(&net);
    let mut out = vec![7u8; 100];
    let mut into = vec![0u8; 10];
    let smh = host_mr(&net, send, &mut out);
    let rmh = host_mr(&net, recv, &mut into);
    let sreq = post(|| net.isend(send, out.as_mut_ptr(), out.len(), 1, smh));
    // The failure shows in a test (an irecv that met it would fail too).
    let deadline = Instant::now() + Duration::from_secs(20);
    let err = loop {
        let _ = net.test(sreq);
        match net.irecv(recv, into.as_mut_ptr(), into.len(), 1, rmh) {
            Err(e) => break e,
            Ok(None) => assert!(Instant::now() < deadline, "irecv never taken"),
            Ok(Some(rreq)) => break test_until_failure(&net, sreq, rreq),
        }
    };
    assert!(err.msg.starts_with("net plugin OxTest: "), "{err}");
    assert!(
        err.msg.contains("irecv failed") || err.msg.contains("test failed"),
        "{err}"
    );
    assert!(crate::plugin::logger::tests::logged(
        "NET/OxTest : message truncated: received 100 bytes into a buffer of 10"
    ));
    close_pair(&net, send, recv, listen);
}

#[test]
fn a_message_received_before_its_peer_closed_completes_and_the_next_receive_fails() {
    // A receiver pre-posts receives (the proxy keeps a slot's worth ahead); a peer that sent
    // its last message and closed in order must see that message delivered, and only the
    // receive after it fail. The plugin once failed the delivered one too, when one test
    // moved both (the GPU suite's "connection closed by the peer" that lost a last step).
    let Some(lib) = plugin() else { return };
    let net: Arc<dyn Net> = open_path(lib).unwrap();
    let (send, recv, listen) = connect_pair(&net);
    let mut out = pattern(1, 4096);
    let mut into = vec![0u8; 2 * 4096];
    let smh = host_mr(&net, send, &mut out);
    let rmh = host_mr(&net, recv, &mut into);
    let sreq = post(|| net.isend(send, out.as_mut_ptr(), out.len(), 1, smh));
    assert_eq!(wait(&net, sreq), 4096);
    net.dereg_mr(send, smh).unwrap();
    net.close_send(send).unwrap();
    // Both receives posted after the message and the close are on the wire: the first test
    // reads the message and then the end of the stream.
    std::thread::sleep(Duration::from_millis(50));
    let base = into.as_mut_ptr();
    let first = post(|| net.irecv(recv, base, 4096, 1, rmh));
    // SAFETY: the second receive's buffer is the second half of `into`.
    let second = post(|| net.irecv(recv, unsafe { base.add(4096) }, 4096, 1, rmh));
    assert_eq!(wait(&net, first), 4096, "the message sent before the close");
    assert_eq!(&into[..4096], &pattern(1, 4096)[..]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let err = loop {
        match net.test(second) {
            Err(e) => break e,
            Ok(Some(n)) => panic!("a receive after the peer closed completed with {n} bytes"),
            Ok(None) => assert!(Instant::now() < deadline, "no failure reported"),
        }
    };
    assert!(err.msg.contains("test failed"), "{err}");
    net.dereg_mr(recv, rmh).unwrap();
    net.close_recv(recv).unwrap();
    net.close_listen(listen).unwrap();
}

/// Test a receive (and the send) until the receive fails.
fn test_until_failure(net: &Arc<dyn Net>, sreq: Request, rreq: Request) -> Error {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let _ = net.test(sreq);
        match net.test(rreq) {
            Err(e) => return e,
            Ok(Some(n)) => panic!("a truncated receive completed with {n} bytes"),
            Ok(None) => assert!(Instant::now() < deadline, "no failure reported"),
        }
    }
}

#[test]
fn a_v8_plugin_refuses_sizes_past_int() {
    let Some(lib) = plugin() else { return };
    let net: Arc<dyn Net> = open_entry(lib, &[8]).unwrap();
    let (send, recv, listen) = connect_pair(&net);
    let mut b = [0u8; 1];
    let mh = net.reg_mr(send, b.as_mut_ptr(), 1, MemType::Host).unwrap();
    // The size is checked before the plugin sees the (too short) buffer.
    let e = net
        .isend(send, b.as_mut_ptr(), (1 << 30) + 1, 0, mh)
        .unwrap_err();
    assert!(e.msg.contains("v8"), "{e}");
    // Host memory: nothing to flush.
    assert_eq!(net.iflush(recv, b.as_mut_ptr(), 1, mh).unwrap(), None);
    net.dereg_mr(send, mh).unwrap();
    close_pair(&net, send, recv, listen);
}

// ---- helpers ----

/// (bytes sent, bytes the receive posts): empty, one byte, 4 KiB, 4 MiB + 3, and a
/// receive larger than its message.
fn messages() -> Vec<(usize, usize)> {
    vec![
        (0, 0),
        (1, 1),
        (4096, 4096),
        ((4 << 20) + 3, (4 << 20) + 3),
        (1000, 8192),
        (0, 64),
    ]
}

/// Byte `i` of message `m`.
fn pattern(m: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + m * 7 + 1) as u8).collect()
}

/// Listen, then connect and accept from this one thread in turn (as NVIDIA's proxy may):
/// (send comm, receive comm, listening comm).
fn connect_pair(net: &Arc<dyn Net>) -> (Comm, Comm, Comm) {
    let (handle, listen): (Handle, Comm) = net.listen(0).unwrap();
    let (mut send, mut recv) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    while send.is_none() || recv.is_none() {
        assert!(Instant::now() < deadline, "connect/accept did not finish");
        if send.is_none() {
            send = net.connect(0, &handle).unwrap();
        }
        if recv.is_none() {
            recv = net.accept(listen).unwrap();
        }
    }
    (send.unwrap(), recv.unwrap(), listen)
}

fn close_pair(net: &Arc<dyn Net>, send: Comm, recv: Comm, listen: Comm) {
    net.close_send(send).unwrap();
    net.close_recv(recv).unwrap();
    net.close_listen(listen).unwrap();
}

/// Register `buf` (host memory) with `comm`.
fn host_mr(net: &Arc<dyn Net>, comm: Comm, buf: &mut [u8]) -> MemHandle {
    net.reg_mr(comm, buf.as_mut_ptr(), buf.len(), MemType::Host)
        .unwrap()
}

/// Post until the plugin takes the request.
fn post(mut f: impl FnMut() -> Result<Option<Request>>) -> Request {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(r) = f().unwrap() {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "the plugin never took the request"
        );
        std::thread::yield_now();
    }
}

/// Test until done; the bytes it reports.
fn wait(net: &Arc<dyn Net>, req: Request) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(n) = net.test(req).unwrap() {
            return n;
        }
        assert!(Instant::now() < deadline, "request never completed");
        std::thread::yield_now();
    }
}

/// Send `msgs` from one thread and receive them in another, checking bytes and sizes; with
/// `batched`, every request is posted before any is tested (the sends tested newest first).
fn exchange(net: &Arc<dyn Net>, msgs: &[(usize, usize)], batched: bool) {
    let (send, recv, listen) = connect_pair(net);
    let sender = {
        let (net, msgs) = (net.clone(), msgs.to_vec());
        std::thread::spawn(move || send_all(&net, send, &msgs, batched))
    };
    let got = receive_all(net, recv, msgs, batched);
    sender.join().unwrap();
    for (m, ((sent, _), (size, bytes))) in msgs.iter().zip(got).enumerate() {
        assert_eq!(size, *sent, "message {m}: size reported");
        assert!(bytes[..size] == pattern(m, *sent)[..], "message {m}: bytes");
        assert!(
            bytes[size..].iter().all(|&b| b == 0),
            "message {m}: past its end"
        );
    }
    close_pair(net, send, recv, listen);
}

fn send_all(net: &Arc<dyn Net>, comm: Comm, msgs: &[(usize, usize)], batched: bool) {
    let mut bufs: Vec<Vec<u8>> = (0..msgs.len()).map(|m| pattern(m, msgs[m].0)).collect();
    let mut pending = Vec::new();
    for (m, buf) in bufs.iter_mut().enumerate() {
        let mh = net
            .reg_mr(comm, buf.as_mut_ptr(), buf.len(), MemType::Host)
            .unwrap();
        let req = post(|| net.isend(comm, buf.as_mut_ptr(), buf.len(), m as i32, mh));
        pending.push((req, mh, buf.len()));
        if !batched {
            let (req, mh, len) = pending.pop().unwrap();
            assert_eq!(wait(net, req), len);
            net.dereg_mr(comm, mh).unwrap();
        }
    }
    for (req, mh, len) in pending.into_iter().rev() {
        assert_eq!(wait(net, req), len);
        net.dereg_mr(comm, mh).unwrap();
    }
}

/// (size reported, buffer) of each message.
fn receive_all(
    net: &Arc<dyn Net>,
    comm: Comm,
    msgs: &[(usize, usize)],
    batched: bool,
) -> Vec<(usize, Vec<u8>)> {
    let mut bufs: Vec<Vec<u8>> = msgs.iter().map(|&(_, cap)| vec![0u8; cap]).collect();
    let mut posted = Vec::new();
    let mut sizes = Vec::new();
    for (m, buf) in bufs.iter_mut().enumerate() {
        let mh = net
            .reg_mr(comm, buf.as_mut_ptr(), buf.len(), MemType::Host)
            .unwrap();
        let req = post(|| net.irecv(comm, buf.as_mut_ptr(), buf.len(), m as i32, mh));
        posted.push((req, mh));
        if !batched {
            let (req, mh) = posted.pop().unwrap();
            sizes.push(wait(net, req));
            net.dereg_mr(comm, mh).unwrap();
        }
    }
    for (req, mh) in posted {
        sizes.push(wait(net, req));
        net.dereg_mr(comm, mh).unwrap();
    }
    sizes.into_iter().zip(bufs).collect()
}

enum Source {
    /// ffi-tests/net_plugin/oxtest_net.c.
    Plugin,
    /// A C file of this text.
    Text(&'static str),
}

/// The test plugin as it is built by ffi-tests/run.sh, compiled once per test run.
pub(crate) fn plugin() -> Option<&'static str> {
    static LIB: OnceLock<Option<String>> = OnceLock::new();
    LIB.get_or_init(|| compile("default", Source::Plugin, &[]))
        .as_deref()
}

/// The test plugin taking CUDA memory too, as a GPUDirect RDMA plugin (`-DOXTEST_PTR_CUDA`),
/// compiled once per test run.
pub(crate) fn plugin_taking_cuda() -> Option<&'static str> {
    static LIB: OnceLock<Option<String>> = OnceLock::new();
    LIB.get_or_init(|| compile("ptr_cuda", Source::Plugin, &["-DOXTEST_PTR_CUDA"]))
        .as_deref()
}

/// The test plugin built as a library of its own named by `variant`, so that its
/// process-wide counts belong to the one test that loads it; compiled once per test run.
pub(crate) fn plugin_of_its_own(variant: &'static str) -> Option<String> {
    compile(variant, Source::Plugin, &[])
}

/// The requests the test plugin at `lib` (loaded) found still in flight when its caller closed
/// a comm, over the process's life (`oxtest_requests_in_flight_at_close`).
pub(crate) fn requests_in_flight_at_close(lib: &str) -> i64 {
    let lib = dl::Library::open(Some(lib)).expect("the test plugin opens");
    let f = lib
        .symbol(c"oxtest_requests_in_flight_at_close")
        .expect("the test plugin counts requests in flight at close");
    // SAFETY: the symbol is oxtest_net.c's `long oxtest_requests_in_flight_at_close(void)`,
    // and `lib` keeps the library loaded during the call.
    let count: extern "C" fn() -> std::os::raw::c_long = unsafe { std::mem::transmute(f) };
    count() as i64
}

/// Compile `src` with `defines` into a shared library under the target directory; None (and
/// a note) when there is no C compiler.
fn compile(variant: &str, src: Source, defines: &[&str]) -> Option<String> {
    let dir = out_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let input = match src {
        Source::Plugin => {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("ffi-tests/net_plugin/oxtest_net.c")
        }
        Source::Text(text) => {
            let p = dir.join(format!("{variant}-{}.c", std::process::id()));
            std::fs::write(&p, text).unwrap();
            p
        }
    };
    let lib = dir.join(format!("liboxtest_net_{variant}.so"));
    // Built under a name of this process's, then renamed: a library another test run has
    // open is never rewritten in place.
    let tmp = dir.join(format!(
        ".liboxtest_net_{variant}.{}.so",
        std::process::id()
    ));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror"])
        .args(defines)
        .arg("-o")
        .arg(&tmp)
        .arg(&input)
        .status();
    match status {
        Err(e) => {
            eprintln!("note: skipping a net plugin test: cannot run {cc}: {e}");
            return None;
        }
        Ok(s) => assert!(s.success(), "{cc} failed on {}", input.display()),
    }
    std::fs::rename(&tmp, &lib).unwrap();
    Some(lib.to_str().unwrap().to_string())
}

/// `target/<profile>/oxtest-net`, next to the test binary's `deps/`.
fn out_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("."));
    profile.join("oxtest-net")
}
