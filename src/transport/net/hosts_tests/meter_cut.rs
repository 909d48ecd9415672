//! The adaptive channel weights between two "hosts" whose fast link is cut mid-run: two
//! namespaces joined by two links shaped to 400 and 100 Mbit/s (`tc`), and one connection per
//! link that the proxy keeps full, from stand-in kernels streaming Simple steps, with each
//! receiving side counting through the communicator's `NetMeter` (one launch that never
//! ends: the stand-in kernels stream for as long as the test runs). Both ranks run the weights'
//! exchange (`core::adaptive::Agent`) over their bootstrap. Rank 1 (the receiver) prints the rates the
//! meter gives every period and every switch the exchange agrees on; the parent watches
//! them, cuts the fast link to a quarter with `tc qdisc change`, and checks that the measured
//! rates and the agreed speeds follow: the fast link's rate falls to about the slow one's,
//! and the speeds move towards 1:1 in bounded steps; then it restores the link's rate and
//! checks that both come back towards 4:1. No tight timings: every figure is a median over
//! periods or a proportion with wide margins.

use super::super::api::{MemType, Net};
use super::super::meter::NetMeter;
use super::super::proxy::{bounce_bytes, Announced, HostBlock, NetSide, Proxy};
use super::super::socket::SocketNet;
use super::super::{block_bytes, host_block};
use super::{address, hosts_or_skip, pair_over_bootstrap, port, tbf, TwoHosts, V4, V4_SECOND};
use crate::bootstrap::Bootstrap;
use crate::core::adaptive::{Agent, AgentSetup, Schedule};
use crate::sched::adaptive::{shares_permille, MAX_STEP_FACTOR};
use crate::sched::Dir;
use parking_lot::Mutex;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The rank that receives, measures and reports.
const REPORTER: i32 = 1;

/// Set in the children of this test: the path of the file whose existence tells them to stop.
pub(super) const METER_ENV: &str = "OXCCL_TWO_HOSTS_METER";
/// Set in the children of the launches variant: each device's steps per launch ("8,2").
const QUOTAS_ENV: &str = "OXCCL_TWO_HOSTS_METER_QUOTAS";
/// The launches variant's steps per launch on the fast and the slow link: 4:1 as the nominal
/// speeds, 4 MiB and 1 MiB (well above the links' 256 KiB tbf burst, which an idle link
/// would otherwise pass at the speed of memory).
const QUOTAS: [u64; 2] = [32, 8];

/// Slots of a connection and their size: 8 × 128 KiB in flight keep a 400 Mbit/s link busy,
/// and a 100 Mbit/s one completes a few dozen steps per period.
const SLOT: u32 = 128 << 10;
const NSLOTS: u32 = 8;
/// How often the reporter gives the meter's rates, and the exchange's period.
const PERIOD: Duration = Duration::from_millis(200);
/// The links' rates, Mbit/s, and the fast link's after the cut (a quarter).
const FAST_MBPS: u32 = 400;
const SLOW_MBPS: u32 = 100;
const CUT_MBPS: u32 = FAST_MBPS / 4;
/// A child that is never told to stop stops by itself after this long.
const CHILD_LIMIT: Duration = Duration::from_secs(40);

/// One side's block of counters and slots in host memory, standing in for the memory the GPU
/// maps.
struct Block {
    _mem: Vec<u64>,
    host: HostBlock,
}

// SAFETY: the block's memory is owned by `_mem`, which outlives every thread that uses the
// pointers (they are joined before the block is dropped); the stand-in kernel and the proxy
// touch its words through volatile accesses only.
unsafe impl Send for Block {}
unsafe impl Sync for Block {}

impl Block {
    fn new(dir: Dir) -> Block {
        let mut mem = vec![0u64; block_bytes(dir, SLOT, NSLOTS, false).div_ceil(8)];
        let host = host_block(mem.as_mut_ptr() as *mut u8, SLOT, NSLOTS, None);
        Block { _mem: mem, host }
    }

    fn load(p: *const u64) -> u64 {
        // SAFETY: an aligned u64 of a live block, written by another thread.
        let v = unsafe { std::ptr::read_volatile(p) };
        std::sync::atomic::fence(Ordering::Acquire);
        v
    }

    fn store(p: *mut u64, v: u64) {
        std::sync::atomic::fence(Ordering::Release);
        // SAFETY: as in `load`.
        unsafe { std::ptr::write_volatile(p, v) };
    }

    fn slot(&self, k: u64) -> *mut u64 {
        let at = (k % NSLOTS as u64) as usize * SLOT as usize;
        self.host.buf.wrapping_add(at) as *mut u64
    }
}

/// The payload of every step: a Simple step as large as a slot allows.
fn step_bytes() -> usize {
    (SLOT - SLOT / crate::sched::device::LL_REGION_DIV) as usize
}

/// The step word of Simple step k (its epoch, `k + 1`, in the high half; its bytes below).
fn step_word(k: u64) -> u64 {
    ((k + 1) & 0xffff_ffff) << 32 | step_bytes() as u64
}

/// Sleep briefly until `ready`; false when `stop` rose first.
fn wait_until(stop: &AtomicBool, mut ready: impl FnMut() -> bool) -> bool {
    while !ready() {
        if stop.load(Ordering::Acquire) {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    true
}

/// The sending kernel: fills every slot the proxy has freed with the next step (its number
/// at the slot's start), until `stop`.
fn stream_sends(b: &Block, stop: &AtomicBool) {
    for k in 0.. {
        if !send_step(b, k, stop) {
            return;
        }
    }
}

/// Send step k once its slot is free; false when `stop` rose first.
fn send_step(b: &Block, k: u64, stop: &AtomicBool) -> bool {
    if !wait_until(stop, || Block::load(b.host.head) + NSLOTS as u64 > k) {
        return false;
    }
    // SAFETY: the slot is free (head) and holds at least 8 bytes.
    unsafe { std::ptr::write_volatile(b.slot(k), k) };
    let words = b.host.words as *mut u64;
    Block::store(
        words.wrapping_add((k % NSLOTS as u64) as usize),
        step_word(k),
    );
    Block::store(b.host.tail, k + 1);
    true
}

/// The sending kernel of device `dev` in launches, as a collective's channels: each launch
/// sends `quotas[dev]` steps, and the next starts only when the receiver has consumed the
/// whole launch on every device (`blocks`), until `stop`. So a device that carries less
/// than its share waits for the others between launches.
fn launch_sends(blocks: &[Arc<Block>], dev: usize, quotas: &[u64], stop: &AtomicBool) {
    for launch in 1u64.. {
        for k in (launch - 1) * quotas[dev]..launch * quotas[dev] {
            if !send_step(&blocks[dev], k, stop) {
                return;
            }
        }
        let consumed = || {
            blocks
                .iter()
                .zip(quotas)
                .all(|(b, &q)| Block::load(b.host.head) >= launch * q)
        };
        if !wait_until(stop, consumed) {
            return;
        }
    }
}

/// The receiving kernel of a side in launches of `quota` steps: announces each launch one
/// launch ahead (kernels are launched before the previous ones end), then consumes it; the
/// first wrong step, if any.
fn launch_recvs(b: &Block, announced: &Announced, quota: u64, stop: &AtomicBool) -> Option<String> {
    announced.add(quota);
    for launch in 1u64.. {
        announced.add(quota);
        for k in (launch - 1) * quota..launch * quota {
            match consume_step(b, k, stop) {
                Ok(true) => {}
                Ok(false) => return None,
                Err(wrong) => return Some(wrong),
            }
        }
    }
    None
}

/// The receiving kernel: consumes every step the proxy lands, checking its number, until
/// `stop`. The first wrong step, if any.
fn stream_recvs(b: &Block, stop: &AtomicBool) -> Option<String> {
    for k in 0.. {
        match consume_step(b, k, stop) {
            Ok(true) => {}
            Ok(false) => return None,
            Err(wrong) => return Some(wrong),
        }
    }
    None
}

/// Consume step k once the proxy has landed it: false when `stop` rose first, an error when
/// the step carried another's data.
fn consume_step(b: &Block, k: u64, stop: &AtomicBool) -> Result<bool, String> {
    if !wait_until(stop, || Block::load(b.host.tail) > k) {
        return Ok(false);
    }
    // SAFETY: the proxy landed step k in its slot (tail).
    let got = unsafe { std::ptr::read_volatile(b.slot(k)) };
    if got != k {
        return Err(format!("step {k} carried step {got}'s data"));
    }
    Block::store(b.host.head, k + 1);
    Ok(true)
}

/// One connection per device between the two ranks (rank 0 sends), as `NetSide`s for the
/// proxy, with their blocks; the receiving sides count through `meter`.
fn connect_devices(
    b: &Bootstrap,
    net: &Arc<dyn Net>,
    meter: &Arc<NetMeter>,
    launches: bool,
) -> Vec<(NetSide, Arc<Block>)> {
    let rank = b.rank();
    let dir = if rank == 0 { Dir::Send } else { Dir::Recv };
    let mut sides = Vec::new();
    for dev in 0..net.devices().unwrap() {
        let (comm, _) = pair_over_bootstrap(b, net.as_ref(), dev, 300 + dev as u64);
        let block = Arc::new(Block::new(dir));
        let h = block.host;
        let staging = (SLOT * NSLOTS) as usize;
        let mh = net.reg_mr(comm, h.buf, staging, MemType::Host).unwrap();
        let bounce_mh = match dir {
            Dir::Send => {
                let len = NSLOTS as usize * bounce_bytes(SLOT);
                net.reg_mr(comm, h.bounce, len, MemType::Host).unwrap()
            }
            Dir::Recv => mh,
        };
        // Streaming: the stand-in receiver consumes for as long as the test runs, one launch
        // that never ends. In launches it announces each as it goes (`launch_recvs`).
        let announced = match launches {
            true => Announced::tracking_launches(),
            false => {
                let a = Announced::default();
                a.add(1 << 48);
                a
            }
        };
        let side = NetSide {
            net: net.clone(),
            comm,
            mh,
            bounce_mh,
            dir,
            peer: 1 - rank,
            channel: dev as u32,
            block: h,
            dev_head: 0,
            dev_tail: 0,
            nslots: NSLOTS,
            slot_bytes: SLOT,
            gpu_slots: false,
            announced,
            meter: (dir == Dir::Recv).then(|| meter.device(dev)),
        };
        sides.push((side, block));
    }
    sides
}

/// "-" or the rate a period's sample gives, Mbit/s.
fn rate_text(rate: Option<u64>) -> String {
    rate.map_or("-".into(), |r| r.to_string())
}

/// In a child (its namespace's one rank): stream over every device until `stop_file`
/// exists, with the weights' exchange running. The reporter prints `DEVICES name...`, then
/// `STREAMING`, then every period `RATES ms rate...` (the meter's, Mbit/s or `-`) and
/// `SPEEDS epoch speed...` for each switch the exchange agreed on.
pub(super) fn stream_and_measure(b: &Bootstrap, stop_file: &Path) {
    let rank = b.rank();
    let net: Arc<dyn Net> = Arc::new(SocketNet::from_env().unwrap());
    let speeds = crate::transport::net::device_speeds(net.as_ref()).unwrap();
    let names: Vec<String> = speeds.iter().map(|s| s.0.clone()).collect();
    let nominal: Vec<u32> = speeds.iter().map(|s| s.1).collect();
    assert_eq!(nominal.len(), 2, "rank {rank}: devices {speeds:?}");
    let meter = NetMeter::new(nominal.len());
    // In launches, the fast link's device carries the larger quota.
    let quotas: Option<Vec<u64>> = std::env::var(QUOTAS_ENV).ok().map(|_| {
        let fast = names.iter().position(|n| V4.ends.contains(&n.as_str()));
        let mut q = vec![QUOTAS[1]; names.len()];
        q[fast.expect("the fast link's end is a device")] = QUOTAS[0];
        q
    });
    let sides = connect_devices(b, &net, &meter, quotas.is_some());
    let announced: Vec<Announced> = sides.iter().map(|(s, _)| s.announced.clone()).collect();
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink_errors = errors.clone();
    let proxy_abort = Arc::new(AtomicBool::new(false));
    let proxy = Proxy::start(
        rank,
        None,
        proxy_abort.clone(),
        0,
        Arc::new(move |peer: i32, e: crate::error::Error| {
            sink_errors.lock().push(format!("peer {peer}: {e}"))
        }),
    )
    .unwrap();
    let blocks: Vec<Arc<Block>> = sides.iter().map(|(_, block)| block.clone()).collect();
    for (side, _) in sides {
        proxy.add(side);
    }
    let schedule = Schedule::default();
    let setup = AgentSetup {
        rank,
        nominal: nominal.clone(),
        names: names.clone(),
        period: PERIOD,
        comm_abort: Arc::new(AtomicBool::new(false)),
    };
    let agent = Agent::start(setup, b, meter.clone(), schedule.clone()).unwrap();
    b.barrier().unwrap();
    let stop = AtomicBool::new(false);
    let wrong = std::thread::scope(|s| {
        let kernels: Vec<_> = blocks
            .iter()
            .enumerate()
            .map(|(dev, block)| {
                let (stop, blocks, quotas, announced) = (&stop, &blocks, &quotas, &announced);
                s.spawn(move || match (rank, quotas) {
                    (0, None) => {
                        stream_sends(block, stop);
                        None
                    }
                    (0, Some(q)) => {
                        launch_sends(blocks, dev, q, stop);
                        None
                    }
                    (_, None) => stream_recvs(block, stop),
                    (_, Some(q)) => launch_recvs(block, &announced[dev], q[dev], stop),
                })
            })
            .collect();
        if rank == REPORTER {
            println!("DEVICES {}", names.join(" "));
            println!("STREAMING");
        }
        report_until_stopped(rank, &meter, &schedule, stop_file);
        stop.store(true, Ordering::Release);
        kernels
            .into_iter()
            .filter_map(|k| k.join().unwrap())
            .collect::<Vec<String>>()
    });
    assert!(wrong.is_empty(), "rank {rank}: {wrong:?}");
    assert!(errors.lock().is_empty(), "rank {rank}: {:?}", errors.lock());
    drop(agent);
    b.barrier().unwrap();
    // Receives are still posted and sends may be held by the peer's full socket: close at once.
    proxy_abort.store(true, Ordering::Release);
    drop(proxy);
    println!("TWO_HOSTS_OK rank {rank}");
}

/// Every period until `stop_file` exists (at most `CHILD_LIMIT`): the reporter prints the meter's
/// rates over the period and the speeds of every new switch.
fn report_until_stopped(rank: i32, meter: &NetMeter, schedule: &Schedule, stop_file: &Path) {
    let start = Instant::now();
    let mut last = meter.totals();
    let mut next_epoch = 1;
    while !stop_file.exists() && start.elapsed() < CHILD_LIMIT {
        std::thread::sleep(PERIOD);
        if rank != REPORTER {
            continue;
        }
        let now = meter.totals();
        let rates: Vec<String> = now
            .iter()
            .zip(&last)
            .map(|(n, l)| rate_text(n.since(l).rate_mbps()))
            .collect();
        last = now;
        println!("RATES {} {}", start.elapsed().as_millis(), rates.join(" "));
        while let Some(speeds) = schedule.speeds_of(next_epoch) {
            let text: Vec<String> = speeds.iter().map(|s| s.to_string()).collect();
            println!("SPEEDS {next_epoch} {}", text.join(" "));
            next_epoch += 1;
        }
    }
}

/// What the reporter said, in order.
#[derive(Debug, Default)]
struct Seen {
    /// Device index of the fast link's and the slow link's end.
    fast: usize,
    slow: usize,
    /// Per period, each device's rate (None: too little traffic).
    rates: Vec<Vec<Option<u64>>>,
    /// Each switch's speeds, with the number of periods reported before it was seen.
    speeds: Vec<(usize, Vec<u64>)>,
    lines: Vec<String>,
}

impl Seen {
    fn take(&mut self, line: String) {
        let mut words = line.split(' ');
        match words.next() {
            Some("DEVICES") => {
                let names: Vec<&str> = words.collect();
                let at = |n: &str| names.iter().position(|&x| x == n);
                let end = REPORTER as usize;
                self.fast = at(V4.ends[end]).expect("the fast link's end is a device");
                self.slow = at(V4_SECOND.ends[end]).expect("the slow link's end is a device");
            }
            Some("RATES") => self
                .rates
                .push(words.skip(1).map(|w| w.parse().ok()).collect()),
            Some("SPEEDS") => {
                let speeds = words.skip(1).map(|w| w.parse().unwrap()).collect();
                self.speeds.push((self.rates.len(), speeds));
            }
            _ => {}
        }
        self.lines.push(line);
    }

    /// The fast device's share of the speeds in use after `periods` periods, permille (the
    /// nominal 4:1 before any switch).
    fn fast_share_at(&self, periods: usize) -> u64 {
        let speeds = self
            .speeds
            .iter()
            .rfind(|(at, _)| *at <= periods)
            .map(|(_, s)| s.clone());
        shares_permille(&speeds.unwrap_or_else(|| self.nominal()))[self.fast]
    }

    /// The speeds agreed at init, by device.
    fn nominal(&self) -> Vec<u64> {
        let mut nominal = vec![0; 2];
        nominal[self.fast] = FAST_MBPS as u64;
        nominal[self.slow] = SLOW_MBPS as u64;
        nominal
    }

    /// Each device's median rate over the periods `from..to` that have a rate on both.
    fn median_rates(&self, from: usize, to: usize) -> Option<(u64, u64)> {
        let both: Vec<(u64, u64)> = self.rates[from.min(to)..to]
            .iter()
            .filter_map(|r| Some((r[self.fast]?, r[self.slow]?)))
            .collect();
        if both.is_empty() {
            return None;
        }
        let median = |mut v: Vec<u64>| {
            v.sort_unstable();
            v[v.len() / 2]
        };
        Some((
            median(both.iter().map(|b| b.0).collect()),
            median(both.iter().map(|b| b.1).collect()),
        ))
    }
}

/// The reporter's stdout lines, as they come; the rest of both ranks' output, kept.
struct Watch {
    lines: Receiver<String>,
    rest: Arc<Mutex<String>>,
    children: Vec<std::process::Child>,
}

impl Watch {
    fn start(hosts: &TwoHosts, env: &[(&str, &str)]) -> Watch {
        let mut children: Vec<_> = (0..2).map(|rank| hosts.spawn(rank, env)).collect();
        let (tx, lines) = channel();
        let rest = Arc::new(Mutex::new(String::new()));
        for (rank, child) in children.iter_mut().enumerate() {
            let out: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
            let err: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
            for (stream, to_channel) in [(out, rank == REPORTER as usize), (err, false)] {
                let (tx, rest) = (tx.clone(), rest.clone());
                std::thread::spawn(move || {
                    for line in BufReader::new(stream).lines().map_while(|l| l.ok()) {
                        if to_channel {
                            let _ = tx.send(line);
                        } else {
                            rest.lock().push_str(&format!("[rank {rank}] {line}\n"));
                        }
                    }
                });
            }
        }
        Watch {
            lines,
            rest,
            children,
        }
    }

    /// Take the reporter's lines into `seen` until `enough` says so; fails after `limit`.
    fn until(&self, seen: &mut Seen, limit: Duration, enough: impl Fn(&Seen) -> bool) {
        let deadline = Instant::now() + limit;
        while !enough(seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => seen.take(line),
                Err(_) => panic!(
                    "rank {REPORTER} did not report enough within {} s:\n{}\n{}",
                    limit.as_secs(),
                    seen.lines.join("\n"),
                    self.rest.lock()
                ),
            }
        }
    }

    /// Shape the fast link to `mbps` and take the reporter's periods until `enough(seen, at)`
    /// holds, or 10 s; `at` (returned) is the number of periods reported before the change
    /// (those reported while `tc` ran, slow on a busy machine, count before it). A failed
    /// `tc` stops the children and fails the test.
    fn change_fast_link(
        &self,
        hosts: &TwoHosts,
        stop: &StopFile,
        seen: &mut Seen,
        mbps: u32,
        enough: impl Fn(&Seen, usize) -> bool,
    ) -> usize {
        if let Err(why) = tbf(hosts, &V4, "change", mbps) {
            std::fs::write(&stop.0, b"").unwrap();
            panic!("tc qdisc change to {mbps} Mbit/s: {why}");
        }
        while let Ok(line) = self.lines.try_recv() {
            seen.take(line);
        }
        let at = seen.rates.len();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !enough(seen, at) && Instant::now() < deadline {
            if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(500)) {
                seen.take(line);
            }
        }
        at
    }

    /// Wait (at most 20 s, then kill) for both children; whether both ended well.
    fn finish(mut self, seen: &mut Seen) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut ok = true;
        for child in &mut self.children {
            let status = loop {
                if let Some(status) = child.try_wait().unwrap() {
                    break Some(status);
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            ok &= status.is_some_and(|s| s.success());
        }
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
            seen.take(line);
        }
        ok
    }
}

/// Removes the stop file when the test ends, whichever way.
struct StopFile(PathBuf);

impl Drop for StopFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Periods reported before the first that counts (connections ramping up), and the periods
/// a median is taken over.
const RAMP_PERIODS: usize = 2;
const MEDIAN_PERIODS: usize = 6;
/// After the cut, periods skipped before the rates count (the fast link's socket buffers
/// drain at the new rate first).
const SETTLE_PERIODS: usize = 3;
/// The fast device's share of the speeds (permille) that counts as "moved towards 1:1": from
/// 800 at 4:1, 500 at 1:1.
const MOVED_SHARE: u64 = 600;
/// The fast device's share (permille) that counts as "back towards 4:1" once the link is
/// restored.
const RECOVERED_SHARE: u64 = 700;

#[test]
fn measured_rates_and_agreed_weights_follow_a_link_cut_mid_run() {
    follow_a_cut("mc", false);
}

/// The same with the sender in launches of 4:1 (`launch_sends`): after the cut the slow link
/// carries its quota and then waits for the fast one in every launch, with the next launch's
/// receives posted; its rate must still be what it carries while data arrives.
#[test]
fn measured_rates_and_agreed_weights_follow_a_link_cut_in_launches() {
    follow_a_cut("ml", true);
}

fn follow_a_cut(tag: &str, launches: bool) {
    let Some(hosts) = hosts_or_skip(tag, &[&V4, &V4_SECOND]) else {
        return;
    };
    for (link, rate) in [(&V4, FAST_MBPS), (&V4_SECOND, SLOW_MBPS)] {
        if let Err(why) = tbf(&hosts, link, "add", rate) {
            eprintln!("rates following a link cut: skipped ({why})");
            return;
        }
    }
    // One per test: the variants run at once in one process.
    let stop =
        StopFile(std::env::temp_dir().join(format!("oxccl-meter-{}-{tag}", std::process::id())));
    let _ = std::fs::remove_file(&stop.0);
    let comm_id = format!("{}:{}", address(V4.addrs[0]), port());
    let speeds = format!("oxv0={FAST_MBPS},oxv1={FAST_MBPS},oxw0={SLOW_MBPS},oxw1={SLOW_MBPS}");
    let stop_path = stop.0.to_string_lossy().into_owned();
    let mut env = vec![
        ("NCCL_COMM_ID", comm_id.as_str()),
        ("NCCL_SOCKET_IFNAME", "ox"),
        ("OXCCL_NET_SPEEDS", speeds.as_str()),
        (METER_ENV, stop_path.as_str()),
    ];
    if launches {
        env.push((QUOTAS_ENV, "1"));
    }
    let watch = Watch::start(&hosts, &env);
    let mut seen = Seen::default();
    let before_end = RAMP_PERIODS + MEDIAN_PERIODS;
    watch.until(&mut seen, Duration::from_secs(20), |s| {
        s.rates.len() >= before_end
    });
    let share_at_cut = seen.fast_share_at(seen.rates.len());
    let before = seen.median_rates(RAMP_PERIODS, seen.rates.len());
    // Enough periods after the cut, and the speeds moved (or 10 s: the checks below say what
    // is missing).
    let cut_at = watch.change_fast_link(&hosts, &stop, &mut seen, CUT_MBPS, |s, at| {
        s.rates.len() >= at + SETTLE_PERIODS + MEDIAN_PERIODS
            && s.fast_share_at(s.rates.len()) <= MOVED_SHARE
    });
    let after_from = cut_at + SETTLE_PERIODS;
    let after_end = after_from + MEDIAN_PERIODS;
    let cut_end = seen.rates.len();

    // Then the fast link recovers: its rate and its share come back.
    let restored_at = watch.change_fast_link(&hosts, &stop, &mut seen, FAST_MBPS, |s, at| {
        s.rates.len() >= at + SETTLE_PERIODS + MEDIAN_PERIODS
            && s.fast_share_at(s.rates.len()) >= RECOVERED_SHARE
    });
    let back_from = restored_at + SETTLE_PERIODS;
    let back_end = back_from + MEDIAN_PERIODS;
    std::fs::write(&stop.0, b"").unwrap();
    let rest = watch.rest.clone();
    let ended_well = watch.finish(&mut seen);
    let log = format!("{}\n{}", seen.lines.join("\n"), rest.lock());
    assert!(ended_well, "a rank failed:\n{log}");

    // Before the cut: the meter sees about 4:1, and the weights stay near the nominal 4:1.
    let (fast, slow) = before.unwrap_or_else(|| panic!("no rates before the cut:\n{log}"));
    eprintln!("before the cut: fast {fast} Mbit/s, slow {slow} Mbit/s");
    assert!(
        fast * 10 >= slow * 25,
        "the fast link measured less than 2.5× the slow one: {fast} vs {slow}\n{log}"
    );
    assert!(
        share_at_cut >= 700,
        "weights moved before the cut ({share_at_cut}‰)\n{log}"
    );

    // After it: the fast link measures about the slow one's rate.
    let after = seen.median_rates(after_from, seen.rates.len().min(after_end));
    let (fast_after, slow_after) =
        after.unwrap_or_else(|| panic!("no rates after the cut:\n{log}"));
    eprintln!("after the cut: fast {fast_after} Mbit/s, slow {slow_after} Mbit/s");
    // The slow link still carries its rate: a device that finished its share and waits for
    // the other's is not charged for the wait.
    assert!(
        slow_after * 10 >= SLOW_MBPS as u64 * 6,
        "the slow link measured {slow_after} Mbit/s after the cut, well below its \
         {SLOW_MBPS}\n{log}"
    );
    assert!(
        fast_after * 10 <= slow_after * 16 && fast_after * 2 <= fast,
        "the fast link's rate did not follow the cut: {fast_after} vs {slow_after} (before \
         {fast})\n{log}"
    );

    // The agreed speeds moved towards 1:1, each switch by at most MAX_STEP_FACTOR per device.
    let switches: Vec<&Vec<u64>> = seen
        .speeds
        .iter()
        .filter(|(at, _)| *at >= cut_at)
        .map(|(_, s)| s)
        .collect();
    let final_share = seen.fast_share_at(cut_end);
    eprintln!(
        "speeds after the cut and the restore: {switches:?} (fast share {final_share}‰ after {} \
         periods of the cut)",
        cut_end - cut_at
    );
    assert!(
        final_share <= MOVED_SHARE,
        "the weights did not follow the cut\n{log}"
    );
    assert!(
        switches.len() >= 2,
        "a single switch went from 4:1 to below {MOVED_SHARE}‰: steps are not bounded\n{log}"
    );
    let mut previous: Vec<u64> = seen
        .speeds
        .iter()
        .rfind(|(at, _)| *at < cut_at)
        .map_or_else(|| seen.nominal(), |(_, s)| s.clone());
    for next in switches {
        for (p, n) in previous.iter().zip(next) {
            assert!(
                *n <= p * MAX_STEP_FACTOR + 1 && n * MAX_STEP_FACTOR + 1 >= *p,
                "a step beyond a factor {MAX_STEP_FACTOR}: {previous:?} -> {next:?}\n{log}"
            );
        }
        previous = next.clone();
    }

    // Restored: the fast link measures its rate again, and its share comes back.
    let restored = seen.median_rates(back_from, seen.rates.len().min(back_end));
    let (fast_back, slow_back) =
        restored.unwrap_or_else(|| panic!("no rates after the restore:\n{log}"));
    let back_share = seen.fast_share_at(seen.rates.len());
    eprintln!(
        "after the restore: fast {fast_back} Mbit/s, slow {slow_back} Mbit/s, fast share \
         {back_share}‰ after {} periods",
        seen.rates.len() - restored_at
    );
    assert!(
        fast_back * 10 >= slow_back * 25,
        "the fast link's rate did not come back: {fast_back} vs {slow_back}\n{log}"
    );
    assert!(
        back_share >= RECOVERED_SHARE,
        "the weights did not follow the restore ({back_share}‰)\n{log}"
    );
}
