//! The watchdog among ranks on threads and processes of one host (bootstrap over loopback,
//! no GPU: the tests number operations and say what completed themselves): hang reports
//! naming the rank that skipped a collective, called another one or another count, a send
//! without its receive; the hang error; dead and departed ranks; a transport's report.

use super::report::{CommName, Ident};
use super::wire::Departure;
use super::*;
use crate::abi::ncclDataType_t;
use crate::bootstrap::{get_unique_id_with, Bootstrap, BootstrapConfig};
use crate::core::CommConfig;
use crate::error::Result;
use crate::sched::device::GpuWait;
use crate::sched::redop::RedOp;
use crate::sched::{CollKind, Task};

/// Counts nothing: the tests say what completed (`Progress::set_completed`).
struct Manual;

impl Completion for Manual {
    fn poll(&mut self, _: &Comm) {}
}

struct Rank {
    comm: Arc<Comm>,
    boot: Option<Bootstrap>,
    kernels_stopped: Arc<AtomicBool>,
}

fn ident(r: i32) -> Ident {
    Ident {
        host: format!("node{r}"),
        pid: 1000 + r as u32,
        cuda_dev: r,
        bus_id: format!("0000:{:02x}:00.0", 0x10 + r),
    }
}

fn settings(report_s: u64, hang_error: bool) -> Settings {
    Settings {
        report_after: Some(Duration::from_secs(report_s)),
        hang_error,
    }
}

fn bootstraps(n: i32) -> Vec<Bootstrap> {
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(20),
    };
    let id = get_unique_id_with(&cfg).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let cfg = &cfg;
                s.spawn(move || {
                    let abort = Arc::new(AtomicBool::new(false));
                    Bootstrap::init_with(&[id], r, n, abort, cfg).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// `n` ranks, each with a watchdog unless its rank is in `without`.
fn ranks_with(n: i32, s: Settings, without: &[i32]) -> Vec<Rank> {
    ranks_named(n, s, without, 0xfeed)
}

/// `ranks_with` for a communicator of this hash.
fn ranks_named(n: i32, s: Settings, without: &[i32], hash: u64) -> Vec<Rank> {
    ranks_each(n, |_| s, without, hash)
}

/// What a rank's GPU waits for, as its watchdog reads it.
type GpuWaitsFn = Box<dyn Fn() -> Vec<GpuWait> + Send>;

/// `n` ranks, rank r's watchdog with `settings(r)` (none for the ranks in `without`).
fn ranks_each(n: i32, settings: impl Fn(i32) -> Settings, without: &[i32], hash: u64) -> Vec<Rank> {
    ranks_waiting(n, settings, |_| Box::new(Vec::new), without, hash)
}

/// `ranks_each` with rank r's GPU waits from `waits(r)`.
fn ranks_waiting(
    n: i32,
    settings: impl Fn(i32) -> Settings,
    waits: impl Fn(i32) -> GpuWaitsFn,
    without: &[i32],
    hash: u64,
) -> Vec<Rank> {
    bootstraps(n)
        .into_iter()
        .enumerate()
        .map(|(r, boot)| {
            let r = r as i32;
            let comm = Arc::new(Comm::new(r, n, r, CommConfig::default()));
            let stopped = Arc::new(AtomicBool::new(false));
            if !without.contains(&r) {
                let flag = stopped.clone();
                let parts = Parts {
                    link: boot.link(),
                    idents: (0..n).map(ident).collect(),
                    name: CommName {
                        handle: 0x1000 + r as usize,
                        hash,
                    },
                    completion: Box::new(|| Box::new(Manual)),
                    stop_kernels: Box::new(move || flag.store(true, Ordering::Release)),
                    gpu_waits: waits(r),
                    settings: settings(r),
                };
                spawn(&comm, parts);
            }
            Rank {
                comm,
                boot: Some(boot),
                kernels_stopped: stopped,
            }
        })
        .collect()
}

fn ranks(n: i32, s: Settings) -> Vec<Rank> {
    ranks_with(n, s, &[])
}

fn task(kind: CollKind, count: usize, root: i32) -> Task {
    Task {
        kind,
        dtype: ncclDataType_t::ncclFloat32,
        op: RedOp::Sum,
        count,
        sendbuff: 0,
        recvbuff: 0,
        root,
        opts: Default::default(),
        weights_epoch: 0,
    }
}

/// Enqueue and launch one operation (not completed).
fn launch(r: &Rank, kind: CollKind, count: usize, root: i32) {
    r.comm.progress.record(&task(kind, count, root), 0);
    r.comm.progress.mark_launched();
}

/// Everything launched so far completed.
fn complete(r: &Rank) {
    r.comm.progress.set_completed(r.comm.progress.launched());
}

/// `n` all-reduces of 4096 floats on every rank, completed.
fn warm_up(all: &[Rank], n: usize) {
    for r in all {
        for _ in 0..n {
            launch(r, CollKind::AllReduce, 4096, 0);
        }
        complete(r);
    }
}

/// Wait up to `limit` for `cond`; whether it came true.
fn eventually(limit: Duration, cond: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

fn report_of(r: &Rank) -> String {
    r.comm.watch.last_report().unwrap_or_default()
}

fn error_of(r: &Rank) -> String {
    r.comm.last_error.text().unwrap_or_default()
}

fn stop_all(all: &mut [Rank]) {
    for r in all.iter() {
        stop(&r.comm, Departure::Destroyed);
    }
    for r in all.iter_mut() {
        r.boot.take();
    }
}

#[test]
fn a_rank_that_skips_a_collective_is_named_by_every_waiting_rank() {
    let mut all = ranks(3, settings(1, false));
    warm_up(&all, 3);
    launch(&all[0], CollKind::AllReduce, 4096, 0);
    launch(&all[2], CollKind::AllReduce, 4096, 0);
    let limit = Duration::from_secs(15);
    assert!(eventually(limit, || !report_of(&all[0]).is_empty()
        && !report_of(&all[2]).is_empty()
        && !report_of(&all[1]).is_empty()));
    let lagging = "not called by 1 rank: rank 1 (host node1, pid 1001, cudaDev 1, busId \
                   0000:11:00.0) (last enqueued ncclAllReduce #3 (4096 × float), last completed \
                   ncclAllReduce #3)";
    for r in [0, 2] {
        let line = report_of(&all[r]);
        let head = format!(
            "comm {:#x} commHash 0x000000000000feed rank {r} (host node{r}, pid 100{r}, cudaDev \
             {r}, busId 0000:1{r}:00.0): ncclAllReduce #4 (4096 × float) has made no progress for",
            0x1000 + r
        );
        assert!(line.starts_with(&head), "{line}");
        assert!(line.contains(lagging), "{line}");
        assert!(
            !line.contains("rank 2 (") || r == 2,
            "only the laggard is named: {line}"
        );
    }
    let behind = report_of(&all[1]);
    assert!(
        behind.contains("has waited")
            && behind.contains(
                "in ncclAllReduce #4 (4096 × float), which rank 1 has not called \
                 (last enqueued ncclAllReduce #3 (4096 × float), last completed ncclAllReduce #3)"
            ),
        "{behind}"
    );
    for r in &all {
        assert_eq!(
            r.comm.async_error(),
            ncclResult_t::ncclSuccess,
            "reports only"
        );
        assert!(!r.kernels_stopped.load(Ordering::Acquire));
    }
    stop_all(&mut all);
}

#[test]
fn the_other_ranks_answers_place_a_rank_that_saw_no_completion_in_the_right_collective() {
    let mut all = ranks(2, settings(1, false));
    // Rank 0's four launches came between two looks of its watchdog: none is known complete.
    for _ in 0..4 {
        launch(&all[0], CollKind::AllReduce, 4096, 0);
    }
    for _ in 0..3 {
        launch(&all[1], CollKind::AllReduce, 4096, 0);
    }
    complete(&all[1]);
    assert!(eventually(Duration::from_secs(15), || !report_of(&all[0])
        .is_empty()
        && !report_of(&all[1]).is_empty()));
    let line = report_of(&all[0]);
    assert!(
        line.contains("ncclAllReduce #4 (4096 × float) has made no progress")
            && line.contains("not called by 1 rank: rank 1 (host node1"),
        "{line}"
    );
    let behind = report_of(&all[1]);
    assert!(
        behind.contains("in ncclAllReduce #4 (4096 × float), which rank 1 has not called"),
        "{behind}"
    );
    stop_all(&mut all);
}

#[test]
fn a_rank_that_calls_another_collective_is_named_with_both_calls() {
    let mut all = ranks(3, settings(1, false));
    warm_up(&all, 56);
    launch(&all[0], CollKind::AllReduce, 4096, 0);
    launch(&all[1], CollKind::AllGather, 1024, 0);
    launch(&all[2], CollKind::AllReduce, 4096, 0);
    assert!(eventually(Duration::from_secs(15), || all
        .iter()
        .all(|r| !report_of(r).is_empty())));
    let mismatch = "rank 1 called ncclAllGather #57 (1024 × float) where ranks 0,2 called \
                    ncclAllReduce #57 (4096 × float)";
    for r in &all {
        let line = report_of(r);
        assert!(line.contains(mismatch), "{line}");
        assert!(!line.contains("not called by"), "{line}");
    }
    stop_all(&mut all);
}

#[test]
fn another_count_under_hang_error_fails_every_rank_naming_it() {
    let mut all = ranks(2, settings(1, true));
    warm_up(&all, 3);
    launch(&all[0], CollKind::AllReduce, 4096, 0);
    launch(&all[1], CollKind::AllReduce, 2048, 0);
    let failed = |r: &Rank| r.comm.async_error() == ncclResult_t::ncclRemoteError;
    assert!(eventually(Duration::from_secs(15), || all
        .iter()
        .all(failed)));
    let mismatch = "rank 1 called ncclAllReduce #4 (2048 × float) where rank 0 called \
                    ncclAllReduce #4 (4096 × float)";
    for r in &all {
        assert!(error_of(r).contains(mismatch), "{}", error_of(r));
        assert!(
            r.kernels_stopped.load(Ordering::Acquire),
            "kernels released"
        );
    }
    stop_all(&mut all);
}

#[test]
fn a_culprit_with_pending_work_of_its_own_says_at_once_that_it_called_otherwise() {
    // Rank 1 is in a different collective that has not completed either (as one waiting on
    // the host for new connections), and its own report is not due before the others fail
    // and go (here: never): it must fail from their query alone, naming the mismatch.
    let each = |r: i32| Settings {
        report_after: (r == 0).then_some(Duration::from_secs(1)),
        hang_error: true,
    };
    let mut all = ranks_each(2, each, &[], 0xfeed);
    warm_up(&all, 3);
    launch(&all[1], CollKind::AllGather, 1024, 0);
    launch(&all[0], CollKind::AllReduce, 4096, 0);
    let failed = |r: &Rank| r.comm.async_error() == ncclResult_t::ncclRemoteError;
    assert!(eventually(Duration::from_secs(15), || all
        .iter()
        .all(failed)));
    let mismatch = "rank 1 called ncclAllGather #4 (1024 × float) where rank 0 called \
                    ncclAllReduce #4 (4096 × float)";
    for r in &all {
        assert!(error_of(r).contains(mismatch), "{}", error_of(r));
    }
    stop_all(&mut all);
}

/// A wait entry: CTA `cta` waits for LL data from rank `peer` at `step`.
fn ll_wait(cta: u32, peer: i32, step: u32) -> GpuWait {
    use crate::sched::device::{decode_wait, WAIT_LL_DATA, WAIT_WHAT_SHIFT};
    GpuWait {
        cta,
        wait: decode_wait(((WAIT_LL_DATA as u64) << WAIT_WHAT_SHIFT) | step as u64).unwrap(),
        peer: Some(peer),
    }
}

#[test]
fn a_gpu_that_waits_outside_any_pending_operation_is_reported_with_what_it_waits_for() {
    // Rank 0's GPU waits on rank 1 in work its counters do not show (a graph replay); rank
    // 1's GPU moves on (its step changes at every look), so only rank 0 reports.
    let ticks = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let waits = move |r: i32| -> GpuWaitsFn {
        let ticks = ticks.clone();
        if r == 0 {
            Box::new(|| vec![ll_wait(0, 1, 3), ll_wait(1, 1, 3)])
        } else {
            Box::new(move || vec![ll_wait(0, 0, ticks.fetch_add(1, Ordering::Relaxed))])
        }
    };
    let mut all = ranks_waiting(2, |_| settings(1, true), waits, &[], 0xfeed);
    warm_up(&all, 2);
    assert!(eventually(Duration::from_secs(10), || !report_of(&all[0]).is_empty()));
    let line = report_of(&all[0]);
    assert!(
        line.contains("rank 0 (host node0")
            && line
                .contains("the GPU has waited 1 s in work that no operation this rank has pending")
            && line.ends_with("this rank's GPU: CTAs 0-1 wait for LL data from rank 1 (step 3)"),
        "{line}"
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        report_of(&all[1]),
        "",
        "a GPU that moves on is not reported"
    );
    assert_eq!(
        all[0].comm.async_error(),
        ncclResult_t::ncclSuccess,
        "a report, not an error, even under OXCCL_HANG_ERROR"
    );
    stop_all(&mut all);
}

#[test]
fn a_send_without_its_receive_names_the_peer() {
    let mut all = ranks(2, settings(1, false));
    warm_up(&all, 1);
    launch(&all[0], CollKind::Send, 100, 1);
    assert!(eventually(Duration::from_secs(15), || !report_of(&all[0]).is_empty()));
    let line = report_of(&all[0]);
    assert!(
        line.contains("ncclSend #1 to rank 1 (100 × float) has made no progress")
            && line.contains(
                "rank 1 (host node1, pid 1001, cudaDev 1, busId 0000:11:00.0) has not called the \
                 matching ncclRecv #1 from rank 0 (its receives from rank 0: 0 enqueued, 0 \
                 completed)"
            ),
        "{line}"
    );
    let behind = report_of(&all[1]);
    assert!(
        behind.contains("rank 0 has waited")
            && behind.contains("but rank 1 has not called the matching ncclRecv #1 from rank 0"),
        "{behind}"
    );
    stop_all(&mut all);
}

#[test]
fn a_stall_every_rank_reached_blames_nobody() {
    let mut all = ranks(2, settings(1, true));
    for r in &all {
        launch(r, CollKind::Broadcast, 10, 1);
    }
    let failed = |r: &Rank| r.comm.async_error() == ncclResult_t::ncclInternalError;
    assert!(eventually(Duration::from_secs(15), || all
        .iter()
        .all(failed)));
    let line = error_of(&all[0]);
    assert!(
        line.contains("ncclBroadcast #1 (10 × float, root 1) has made no progress")
            && line.contains("every rank has called it"),
        "{line}"
    );
    stop_all(&mut all);
}

#[test]
fn a_rank_whose_bootstrap_closes_without_a_goodbye_fails_every_other_rank() {
    let mut all = ranks_with(3, settings(60, false), &[1]);
    warm_up(&all, 2);
    // Ranks 0 and 2 wait in a collective that needs rank 1: their kernels must be released.
    launch(&all[0], CollKind::AllReduce, 4096, 0);
    launch(&all[2], CollKind::AllReduce, 4096, 0);
    let started = Instant::now();
    // Rank 1 vanishes: its connections close with no farewell, as when a process is killed.
    all[1].boot.take();
    let failed = |r: &Rank| r.comm.async_error() == ncclResult_t::ncclRemoteError;
    assert!(eventually(Duration::from_secs(10), || failed(&all[0])
        && failed(&all[2])));
    assert!(started.elapsed() < Duration::from_secs(10));
    let named = "rank 1 (host node1, pid 1001, cudaDev 1, busId 0000:11:00.0) is gone: its \
                 bootstrap connection to rank 2 closed without a goodbye";
    assert!(error_of(&all[2]).contains(named), "{}", error_of(&all[2]));
    // Rank 0 has no connection from rank 1 (the ring runs 1 -> 2): rank 2 told it.
    assert!(
        error_of(&all[0]).contains(named) && error_of(&all[0]).contains("(noticed by rank 2)"),
        "{}",
        error_of(&all[0])
    );
    let released = || {
        [0, 2]
            .iter()
            .all(|&r| all[r].kernels_stopped.load(Ordering::Acquire))
    };
    assert!(eventually(Duration::from_secs(5), released));
    assert!(started.elapsed() < Duration::from_secs(10));
    stop_all(&mut all);
}

#[test]
fn kernels_that_no_longer_need_a_lost_rank_may_finish() {
    let mut all = ranks_with(2, settings(60, false), &[1]);
    warm_up(&all, 2);
    // Rank 0's last collective is still finishing when rank 1 vanishes, and then completes.
    launch(&all[0], CollKind::AllReduce, 4096, 0);
    all[1].boot.take();
    let gone = || all[0].comm.async_error() == ncclResult_t::ncclRemoteError;
    assert!(eventually(Duration::from_secs(5), gone));
    complete(&all[0]);
    std::thread::sleep(LOST_GRACE + Duration::from_millis(500));
    assert!(!all[0].kernels_stopped.load(Ordering::Acquire));
    stop_all(&mut all);
}

#[test]
fn an_orderly_destroy_is_no_error_until_work_is_stranded() {
    let mut all = ranks(2, settings(60, false));
    warm_up(&all, 2);
    stop(&all[1].comm, Departure::Destroyed);
    all[1].boot.take();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        all[0].comm.async_error(),
        ncclResult_t::ncclSuccess,
        "{}",
        error_of(&all[0])
    );
    // A collective rank 1 will never call.
    launch(&all[0], CollKind::AllReduce, 4096, 0);
    let failed = || all[0].comm.async_error() == ncclResult_t::ncclRemoteError;
    assert!(eventually(Duration::from_secs(8), failed));
    let msg = error_of(&all[0]);
    assert!(
        msg.contains(
            "rank 1 (host node1, pid 1001, cudaDev 1, busId 0000:11:00.0) left \
             (ncclCommDestroy) after completing 2 collective(s), but rank 0 has enqueued \
             ncclAllReduce #3 (4096 × float), which can never complete"
        ),
        "{msg}"
    );
    stop_all(&mut all);
}

#[test]
fn an_abort_after_completed_work_is_no_error_for_ranks_that_completed_it_too() {
    let mut all = ranks(2, settings(60, false));
    warm_up(&all, 3);
    stop(&all[0].comm, Departure::Aborted);
    all[0].boot.take();
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        all[1].comm.async_error(),
        ncclResult_t::ncclSuccess,
        "{}",
        error_of(&all[1])
    );
    stop_all(&mut all);
}

#[test]
fn a_transport_report_after_the_peer_left_in_order_is_no_error() {
    let mut all = ranks(2, settings(60, false));
    warm_up(&all, 3);
    stop(&all[1].comm, Departure::Destroyed);
    all[1].boot.take();
    // A net plugin fails the receive the proxy posted ahead once the departed peer closes.
    report_peer_failure(
        &all[0].comm,
        1,
        true,
        "net plugin: connection closed by the peer",
    );
    std::thread::sleep(REPORT_GRACE + Duration::from_millis(1500));
    assert_eq!(
        all[0].comm.async_error(),
        ncclResult_t::ncclSuccess,
        "{}",
        error_of(&all[0])
    );
    stop_all(&mut all);
}

#[test]
fn a_transport_report_names_the_peer_here_and_reaches_every_rank() {
    let mut all = ranks(3, settings(60, false));
    report_peer_failure(&all[0].comm, 2, true, "net: connection reset by peer");
    // Not at once: the watchdog first gives the peer's farewell time to arrive.
    assert_eq!(all[0].comm.async_error(), ncclResult_t::ncclSuccess);
    let failed = || all[0].comm.async_error() == ncclResult_t::ncclRemoteError;
    assert!(eventually(Duration::from_secs(5), failed));
    assert!(
        error_of(&all[0]).contains("rank 2 (host node2, pid 1002, cudaDev 2, busId 0000:12:00.0) is gone: net: connection reset by peer (reported by rank 0's transport)"),
        "{}",
        error_of(&all[0])
    );
    let reached = || all[1].comm.async_error() == ncclResult_t::ncclRemoteError;
    assert!(eventually(Duration::from_secs(5), reached));
    assert!(
        error_of(&all[1]).contains(
            "net: connection reset by peer (reported by rank 0's transport) (noticed by rank 0)"
        ),
        "{}",
        error_of(&all[1])
    );
    stop_all(&mut all);
}

#[test]
fn the_status_endpoint_answers_with_every_rank_of_every_communicator() {
    use std::io::{Read, Write};
    let mut all = ranks_named(2, settings(60, false), &[], 0xbeef1);
    warm_up(&all, 3);
    launch(&all[0], CollKind::AllReduce, 4096, 0);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || status::serve(listener));
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"CLIENT PROTOCOL 2\nTIMEOUT 5\nSTATUS\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(
        text.starts_with("SERVER PROTOCOL 2\nOK\nNCCL 2.32.3+oxccl status of process "),
        "{text}"
    );
    let block = |r: usize| {
        let head = format!(
            "comm {:#x} commHash 0x00000000000beef1: 2 ranks, as rank {r} sees them\n",
            0x1000 + r
        );
        let at = text
            .find(&head)
            .unwrap_or_else(|| panic!("no block for rank {r}: {text}"));
        text[at..].lines().take(3).collect::<Vec<_>>().join("\n")
    };
    for r in 0..2 {
        let b = block(r);
        assert!(
            b.contains("  rank 0 (host node0, pid 1000, cudaDev 0, busId 0000:10:00.0): last enqueued \
                 ncclAllReduce #4 (4096 × float), last completed ncclAllReduce #3 (4096 × float), 4 \
                 operation(s) enqueued, 3 completed; ")
                && (b.contains("3 completed; running ncclAllReduce #4 (4096 × float)\n")
                    || b.contains("3 completed; waiting in ncclAllReduce #4 (4096 × float) for"))
                && b.contains("  rank 1 (host node1, pid 1001, cudaDev 1, busId 0000:11:00.0): last enqueued \
                 ncclAllReduce #3 (4096 × float), last completed ncclAllReduce #3 (4096 × float), 3 \
                 operation(s) enqueued, 3 completed; idle"),
            "{b}"
        );
    }
    stop_all(&mut all);
}

// ---- One process per rank: a rank killed with SIGKILL, or leaving in order. ----

const CHILD_ENV: &str = "OXCCL_WATCHDOG_TEST_CHILD";

/// In a child process (the variable names its rank, the id and what rank 1 does): join, then
/// rank 1 kills itself or destroys in order, and rank 0 prints what its communicator says.
#[test]
fn child_entry() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let parts: Vec<&str> = spec.split(',').collect();
    let (rank, mode) = (parts[0].parse::<i32>().unwrap(), parts[2]);
    let id = crate::bootstrap::id::id_from_hex(parts[1]).unwrap();
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(20),
    };
    let abort = Arc::new(AtomicBool::new(false));
    let boot = Bootstrap::init_with(&[id], rank, 2, abort, &cfg).unwrap();
    let mine = format!("{},{}", crate::debug::hostname(), std::process::id());
    let idents: Vec<Ident> = boot
        .allgather(mine.as_bytes())
        .unwrap()
        .iter()
        .map(|b| {
            let text = String::from_utf8_lossy(b).into_owned();
            let (host, pid) = text.split_once(',').unwrap();
            Ident {
                host: host.into(),
                pid: pid.parse().unwrap(),
                cuda_dev: 0,
                bus_id: "0000:18:00.0".into(),
            }
        })
        .collect();
    let comm = Arc::new(Comm::new(rank, 2, 0, CommConfig::default()));
    let parts = Parts {
        link: boot.link(),
        idents,
        name: CommName {
            handle: 0x1000,
            hash: 0xfeed,
        },
        completion: Box::new(|| Box::new(Manual)),
        stop_kernels: Box::new(|| println!("KERNELS STOPPED")),
        gpu_waits: Box::new(Vec::new),
        settings: settings(60, false),
    };
    spawn(&comm, parts);
    boot.barrier().unwrap();
    if rank == 1 {
        if mode == "kill" {
            // SAFETY: sends a signal to this process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        if mode == "exit" {
            // The communicator stays live (as in the registry) until the process exits.
            std::mem::forget((comm, boot));
            println!("CHILD_DONE");
            return;
        }
        stop(&comm, Departure::Destroyed);
        drop(boot);
        println!("CHILD_DONE");
        return;
    }
    if mode == "kill" {
        // Rank 0 waits in a collective rank 1 never calls: its kernels must be released.
        comm.progress.record(&task(CollKind::AllReduce, 8, 0), 0);
        comm.progress.mark_launched();
    }
    let started = Instant::now();
    let limit = Duration::from_secs(if mode == "kill" { 12 } else { 3 });
    while started.elapsed() < limit && comm.async_error() == ncclResult_t::ncclSuccess {
        std::thread::sleep(Duration::from_millis(20));
    }
    // The kernels are released after the grace.
    std::thread::sleep(LOST_GRACE + Duration::from_millis(500));
    println!(
        "RESULT {:?} after {:.1} s: {}",
        comm.async_error(),
        started.elapsed().as_secs_f64(),
        comm.last_error.text().unwrap_or_default()
    );
    stop(&comm, Departure::Destroyed);
    println!("CHILD_DONE");
}

/// Run the two ranks as processes; rank 0's output, and rank 1's pid.
fn two_processes(mode: &str) -> (String, u32) {
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(20),
    };
    let id = get_unique_id_with(&cfg).unwrap();
    let hex = crate::bootstrap::id::id_to_hex(&id);
    let spawn_rank = |rank: i32| {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "core::watchdog::tests::child_entry",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, format!("{rank},{hex},{mode}"))
            .env("NCCL_DEBUG", "WARN")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (r0, r1) = (spawn_rank(0), spawn_rank(1));
    let pid1 = r1.id();
    let out1 = r1.wait_with_output().unwrap();
    let out0 = r0.wait_with_output().unwrap();
    let text0 = format!(
        "{}{}",
        String::from_utf8_lossy(&out0.stdout),
        String::from_utf8_lossy(&out0.stderr)
    );
    assert!(
        out0.status.success() && text0.contains("CHILD_DONE"),
        "{text0}"
    );
    if mode == "kill" {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out1.status.signal(), Some(libc::SIGKILL));
    } else {
        assert!(
            out1.status.success(),
            "{}",
            String::from_utf8_lossy(&out1.stderr)
        );
    }
    (text0, pid1)
}

#[test]
fn a_killed_process_is_named_by_its_peer_within_10_s() {
    let (out, pid1) = two_processes("kill");
    let line = out
        .lines()
        .find(|l| l.starts_with("RESULT"))
        .unwrap_or_default();
    assert!(line.starts_with("RESULT ncclRemoteError after "), "{out}");
    let secs: f64 = line["RESULT ncclRemoteError after ".len()..]
        .split(' ')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert!(secs < 10.0, "{line}");
    let named = format!("rank 1 (host {}, pid {pid1}, ", crate::debug::hostname());
    assert!(
        line.contains(&named) && line.contains("closed without a goodbye"),
        "{line}"
    );
    assert!(out.contains("KERNELS STOPPED"), "{out}");
}

#[test]
fn a_process_that_destroys_in_order_raises_no_error() {
    let (out, _) = two_processes("destroy");
    assert!(out.contains("RESULT ncclSuccess after"), "{out}");
    assert!(!out.contains("KERNELS STOPPED"), "{out}");
}

#[test]
fn a_process_that_exits_without_destroying_raises_no_error() {
    let (out, _) = two_processes("exit");
    assert!(out.contains("RESULT ncclSuccess after"), "{out}");
    assert!(!out.contains("KERNELS STOPPED"), "{out}");
}

// ---- The collective check (OXCCL_CHECK_COLLECTIVES=1), ranks on threads. ----

/// Number `ops` on `r` and note them for its check, as enqueue does with the check on.
fn note_ops(r: &Rank, ops: &[(CollKind, usize, i32)]) {
    for &(kind, count, root) in ops {
        let t = task(kind, count, root);
        let seq = r.comm.progress.record(&t, 0);
        check::note(
            &r.comm,
            wire::OpDesc {
                kind,
                seq,
                count: count as u64,
                dtype: t.dtype,
                op: crate::sched::device::op_code(t.op),
                root,
            },
        );
    }
}

/// Run the check of `comms` on a thread of its own (as one thread driving them in a group);
/// the results, or None if it did not end within `limit`.
fn check_on_thread(comms: Vec<Arc<Comm>>, limit: Duration) -> Option<Vec<Result<()>>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(check::run(&comms));
    });
    rx.recv_timeout(limit).ok()
}

/// Every rank checks `ops(rank)` on its own thread; each rank's result.
fn check_all(all: &[Rank], ops: impl Fn(usize) -> Vec<(CollKind, usize, i32)>) -> Vec<Result<()>> {
    for (i, r) in all.iter().enumerate() {
        note_ops(r, &ops(i));
    }
    let pending: Vec<_> = all
        .iter()
        .map(|r| {
            let comm = r.comm.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(check::run(&[comm]).remove(0));
            });
            rx
        })
        .collect();
    pending
        .into_iter()
        .enumerate()
        .map(|(i, rx)| {
            rx.recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("rank {i}'s check did not end within 20 s"))
        })
        .collect()
}

fn usage_error(r: &Result<()>) -> String {
    match r {
        Err(e) if e.code == ncclResult_t::ncclInvalidUsage => e.msg.clone(),
        other => panic!("expected ncclInvalidUsage, got {other:?}"),
    }
}

#[test]
fn matching_operations_pass_the_check_and_leave_nothing_behind() {
    let mut all = ranks(3, settings(60, false));
    let results = check_all(&all, |r| {
        vec![
            (CollKind::AllReduce, 4096, 0),
            (CollKind::Broadcast, 10, 2),
            (CollKind::Send, 7, ((r + 1) % 3) as i32),
            (CollKind::Recv, 7, ((r + 2) % 3) as i32),
            (CollKind::AllGather, 0, 0),
        ]
    });
    for (r, res) in all.iter().zip(&results) {
        assert!(res.is_ok(), "{res:?}");
        assert_eq!(check::kept(&r.comm), 0, "every counterpart used");
        assert_eq!(r.comm.async_error(), ncclResult_t::ncclSuccess);
        assert!(!r.comm.progress.in_check());
    }
    // And again: the next group's numbers meet as well.
    let again = check_all(&all, |_| vec![(CollKind::ReduceScatter, 64, 0)]);
    assert!(again.iter().all(|r| r.is_ok()), "{again:?}");
    stop_all(&mut all);
}

#[test]
fn another_collective_fails_every_rank_with_the_hang_reports_words() {
    let mut all = ranks(3, settings(60, false));
    warm_up(&all, 3);
    let results = check_all(&all, |r| {
        if r == 1 {
            vec![(CollKind::AllGather, 1024, 0)]
        } else {
            vec![(CollKind::AllReduce, 4096, 0)]
        }
    });
    let words = "rank 1 called ncclAllGather #4 (1024 × float) where ranks 0,2 called \
                 ncclAllReduce #4 (4096 × float)";
    for (i, (r, res)) in all.iter().zip(&results).enumerate() {
        let msg = usage_error(res);
        assert!(msg.contains(words), "{msg}");
        // Its own finding, or (when another rank's notice came first) that rank's.
        assert!(
            msg.contains(&format!("rank {i} (host node{i}, pid 100{i}"))
                && msg.contains("OXCCL_CHECK_COLLECTIVES=1")
                && (msg.contains("nothing of this group was launched")
                    || msg.contains("the communicator is failed")),
            "{msg}"
        );
        assert_eq!(r.comm.async_error(), ncclResult_t::ncclInvalidUsage);
        assert!(error_of(r).contains(words), "{}", error_of(r));
    }
    stop_all(&mut all);
}

#[test]
fn another_count_type_or_root_is_named() {
    let mut all = ranks(2, settings(60, false));
    let results = check_all(&all, |r| {
        if r == 0 {
            vec![(CollKind::AllReduce, 4096, 0), (CollKind::Broadcast, 10, 0)]
        } else {
            vec![(CollKind::AllReduce, 2048, 0), (CollKind::Broadcast, 10, 1)]
        }
    });
    for res in &results {
        let msg = usage_error(res);
        assert!(
            msg.contains(
                "rank 1 called ncclAllReduce #1 (2048 × float) where rank 0 called \
                 ncclAllReduce #1 (4096 × float)"
            ) && msg.contains(
                "rank 1 called ncclBroadcast #2 (10 × float, root 1) where rank 0 called \
                 ncclBroadcast #2 (10 × float, root 0)"
            ),
            "{msg}"
        );
    }
    stop_all(&mut all);
}

#[test]
fn a_zero_count_no_op_is_checked_too() {
    let mut all = ranks(2, settings(60, false));
    let results = check_all(&all, |r| {
        vec![(CollKind::AllReduce, if r == 0 { 0 } else { 8 }, 0)]
    });
    for res in &results {
        assert!(
            usage_error(res).contains("rank 1 called ncclAllReduce #1 (8 × float) where rank 0"),
            "{res:?}"
        );
    }
    stop_all(&mut all);
}

#[test]
fn a_send_whose_receive_differs_fails_both_and_the_notice_reaches_a_third_rank() {
    let mut all = ranks(3, settings(60, false));
    // Rank 0 sends to 1 (who expects another count) and to 2 (who agrees).
    let results = check_all(&all, |r| match r {
        0 => vec![(CollKind::Send, 100, 1), (CollKind::Send, 5, 2)],
        1 => vec![(CollKind::Recv, 200, 0)],
        _ => vec![(CollKind::Recv, 5, 0)],
    });
    let words = "rank 1 called ncclRecv #1 from rank 0 (200 × float) where rank 0 called \
                 ncclSend #1 to rank 1 (100 × float)";
    for res in &results[..2] {
        assert!(usage_error(res).contains(words), "{res:?}");
    }
    // Rank 2's own check passes, and it launches its receive: rank 0's watchdog tells it.
    // (Rarely the notice lands before rank 2 has looked at what it received: then its check
    // fails with the notice.)
    match &results[2] {
        Ok(()) => all[2].comm.progress.mark_launched(),
        Err(e) => assert!(
            e.code == ncclResult_t::ncclInvalidUsage && e.msg.contains(words),
            "{e:?}"
        ),
    }
    let failed = || all[2].comm.async_error() == ncclResult_t::ncclInvalidUsage;
    assert!(eventually(Duration::from_secs(10), failed));
    let msg = error_of(&all[2]);
    assert!(
        msg.contains("rank 2 (host node2")
            && msg.contains("the collective check")
            && msg.contains(words),
        "{msg}"
    );
    // Its receive can never complete: its kernels are released after the grace.
    if results[2].is_ok() {
        assert!(eventually(LOST_GRACE + Duration::from_secs(3), || all[2]
            .kernels_stopped
            .load(Ordering::Acquire)));
    }
    stop_all(&mut all);
}

#[test]
fn ranks_that_group_their_calls_differently_still_meet() {
    let mut all = ranks(2, settings(60, false));
    note_ops(
        &all[0],
        &[(CollKind::AllReduce, 8, 0), (CollKind::AllReduce, 16, 0)],
    );
    let comm = all[0].comm.clone();
    let (tx, both) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(check::run(&[comm]).remove(0));
    });
    note_ops(&all[1], &[(CollKind::AllReduce, 8, 0)]);
    let first = check_on_thread(vec![all[1].comm.clone()], Duration::from_secs(20));
    assert!(first.expect("ended")[0].is_ok());
    assert!(
        both.recv_timeout(Duration::from_millis(300)).is_err(),
        "rank 0 waits for rank 1's #2"
    );
    note_ops(&all[1], &[(CollKind::AllReduce, 16, 0)]);
    let second = check_on_thread(vec![all[1].comm.clone()], Duration::from_secs(20));
    assert!(second.expect("ended")[0].is_ok());
    let both = both.recv_timeout(Duration::from_secs(20)).expect("ended");
    assert!(both.is_ok(), "{both:?}");
    stop_all(&mut all);
}

#[test]
fn one_thread_checks_every_rank_of_a_group_without_waiting_on_itself() {
    let mut all = ranks(3, settings(60, false));
    for r in &all {
        note_ops(r, &[(CollKind::AllReduce, 4096, 0)]);
    }
    let comms: Vec<Arc<Comm>> = all.iter().map(|r| r.comm.clone()).collect();
    let res = check_on_thread(comms.clone(), Duration::from_secs(20)).expect("no deadlock");
    assert!(res.iter().all(|r| r.is_ok()), "{res:?}");
    // A mismatch in one thread's group: every rank's result says so.
    for (i, r) in all.iter().enumerate() {
        note_ops(r, &[(CollKind::Reduce, 4096, if i == 2 { 1 } else { 0 })]);
    }
    let res = check_on_thread(comms, Duration::from_secs(20)).expect("no deadlock");
    for r in &res {
        assert!(
            usage_error(r).contains(
                "rank 2 called ncclReduce #2 (4096 × float, root 1) where ranks 0,1 called \
                 ncclReduce #2 (4096 × float, root 0)"
            ),
            "{r:?}"
        );
    }
    stop_all(&mut all);
}

#[test]
fn a_rank_that_never_comes_is_named_by_the_hang_report_and_abort_ends_the_wait() {
    let mut all = ranks(2, settings(1, false));
    warm_up(&all, 3);
    note_ops(&all[0], &[(CollKind::AllReduce, 4096, 0)]);
    let comm = all[0].comm.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(check::run(&[comm]).remove(0));
    });
    assert!(eventually(Duration::from_secs(15), || !report_of(&all[0]).is_empty()));
    let line = report_of(&all[0]);
    assert!(
        line.contains(
            "ncclAllReduce #4 (4096 × float) has made no progress for 1 s (waiting in the \
             collective check, OXCCL_CHECK_COLLECTIVES=1); not called by 1 rank: rank 1 (host \
             node1"
        ),
        "{line}"
    );
    assert!(
        report_of(&all[1]).contains("which rank 1 has not called"),
        "{}",
        report_of(&all[1])
    );
    assert!(rx.try_recv().is_err(), "still waiting: NCCL's semantics");
    all[0].comm.abort.store(true, Ordering::Release);
    let res = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the abort ends the wait");
    assert!(
        usage_error(&res).contains("aborted while this rank waited"),
        "{res:?}"
    );
    stop_all(&mut all);
}

#[test]
fn under_hang_error_a_rank_that_never_comes_fails_the_check() {
    let mut all = ranks(2, settings(1, true));
    note_ops(&all[1], &[(CollKind::AllReduce, 8, 0)]);
    let res = check_on_thread(vec![all[1].comm.clone()], Duration::from_secs(20))
        .expect("bounded by the hang error");
    match &res[0] {
        Err(e) => assert!(
            e.code == ncclResult_t::ncclRemoteError
                && e.msg.contains("not called by 1 rank: rank 0 (host node0"),
            "{e:?}"
        ),
        ok => panic!("{ok:?}"),
    }
    stop_all(&mut all);
}

#[test]
fn a_rank_that_dies_during_the_check_is_named() {
    let mut all = ranks_with(3, settings(60, false), &[1]);
    for r in [0, 2] {
        note_ops(&all[r], &[(CollKind::AllReduce, 8, 0)]);
    }
    let waiting: Vec<_> = [0, 2]
        .iter()
        .map(|&r| {
            let comm = all[r].comm.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(check::run(&[comm]).remove(0));
            });
            rx
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    all[1].boot.take();
    for rx in waiting {
        let res = rx.recv_timeout(Duration::from_secs(10)).expect("bounded");
        match res {
            Err(e) => assert!(
                e.code == ncclResult_t::ncclRemoteError
                    && e.msg.contains("rank 1 (host node1, pid 1001")
                    && e.msg.contains("is gone"),
                "{e:?}"
            ),
            ok => panic!("{ok:?}"),
        }
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    stop_all(&mut all);
}

#[test]
fn a_malformed_check_message_fails_the_check_naming_the_sender() {
    let mut all = ranks(2, settings(60, false));
    note_ops(&all[0], &[(CollKind::AllReduce, 8, 0)]);
    let link = all[1].boot.as_ref().unwrap().link();
    let never = AtomicBool::new(false);
    link.send_check(0, b"\x01garbage", Duration::from_secs(2), &never)
        .unwrap();
    let res = check_on_thread(vec![all[0].comm.clone()], Duration::from_secs(20)).expect("ends");
    match &res[0] {
        Err(e) => assert!(
            e.code == ncclResult_t::ncclInternalError
                && e.msg
                    .contains("malformed collective-check message from rank 1"),
            "{e:?}"
        ),
        ok => panic!("{ok:?}"),
    }
    stop_all(&mut all);
}

/// Through enqueue and the group's end, as the API calls them (no runtime here: a call whose
/// check passes then fails at its launch, "not initialised"; one whose check fails never gets
/// there).
#[test]
fn enqueue_and_group_end_run_the_check_before_any_launch() {
    check::FORCED.store(true, Ordering::Release);
    let mut all = ranks(2, settings(60, false));
    let call = |r: usize, kind: CollKind, count: usize| {
        let comm = all[r].comm.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            crate::core::group::start();
            let queued =
                crate::core::enqueue::enqueue(&comm, task(kind, count, 0), std::ptr::null_mut(), 0);
            // A zero-count no-op of the same group is checked with it.
            let noop = crate::core::enqueue::enqueue(
                &comm,
                task(CollKind::AllReduce, 0, 0),
                std::ptr::null_mut(),
                0,
            );
            let _ = tx.send((queued, noop, crate::core::group::end()));
        });
        rx
    };
    let agree: Vec<_> = (0..2).map(|r| call(r, CollKind::AllReduce, 64)).collect();
    for rx in agree {
        let (queued, noop, end) = rx.recv_timeout(Duration::from_secs(20)).expect("ends");
        assert!(queued.is_ok() && noop.is_ok(), "collected in the group");
        let e = end.unwrap_err();
        assert!(e.msg.contains("not initialised"), "past the check: {e:?}");
    }
    let differ: Vec<_> = (0..2)
        .map(|r| call(r, CollKind::AllReduce, if r == 0 { 64 } else { 32 }))
        .collect();
    for rx in differ {
        let (_, _, end) = rx.recv_timeout(Duration::from_secs(20)).expect("ends");
        let e = end.unwrap_err();
        assert!(
            e.code == ncclResult_t::ncclInvalidUsage
                && e.msg.contains(
                    "rank 1 called ncclAllReduce #3 (32 × float) where rank 0 called \
                     ncclAllReduce #3 (64 × float)"
                ),
            "{e:?}"
        );
    }
    check::FORCED.store(false, Ordering::Release);
    stop_all(&mut all);
}

/// The check's host cost: `rounds` checks of one all-reduce on every rank (each rank on its
/// own thread, as one process per rank would), the median wall time of one check on rank 0.
/// Ignored by default (timing); `cargo test --lib check_cost -- --ignored --nocapture`.
#[test]
#[ignore]
fn check_cost() {
    for n in [2, 4, 8] {
        let mut all = ranks(n, settings(60, false));
        let rounds = 2000;
        let barrier = Arc::new(std::sync::Barrier::new(n as usize));
        let threads: Vec<_> = all
            .iter()
            .map(|r| {
                let comm = r.comm.clone();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    let mut times = Vec::with_capacity(rounds);
                    barrier.wait();
                    for _ in 0..rounds {
                        let t = task(CollKind::AllReduce, 8, 0);
                        let seq = comm.progress.record(&t, 0);
                        check::note(
                            &comm,
                            wire::OpDesc {
                                kind: t.kind,
                                seq,
                                count: 8,
                                dtype: t.dtype,
                                op: crate::sched::device::op_code(t.op),
                                root: 0,
                            },
                        );
                        let t0 = Instant::now();
                        check::run(std::slice::from_ref(&comm)).remove(0).unwrap();
                        times.push(t0.elapsed());
                    }
                    times
                })
            })
            .collect();
        let mut times: Vec<Vec<Duration>> =
            threads.into_iter().map(|t| t.join().unwrap()).collect();
        let mine = &mut times[0];
        mine.sort();
        let (median, p90) = (mine[rounds / 2], mine[rounds * 9 / 10]);
        println!(
            "collective check, {n} ranks on threads over loopback: median {:.1} us, p90 {:.1} us \
             per all-reduce ({rounds} rounds)",
            median.as_secs_f64() * 1e6,
            p90.as_secs_f64() * 1e6
        );
        assert!(median < Duration::from_millis(5), "{median:?}");
        stop_all(&mut all);
    }
}
