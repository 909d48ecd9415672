//! Tests of the socket network and of the proxy on host memory, no GPU: stand-in kernels (host
//! threads following the Simple and LL protocols on the same counters, step words and slot
//! regions as the CUDA kernels) at both ends of a network connection, in threads and across
//! processes, including a peer killed in the middle of a transfer.

use super::api::{Comm, Handle, MemHandle, MemType, Net, Request, HANDLE_BYTES};
use super::proxy::{bounce_bytes, Announced, HostBlock, NetSide, Proxy};
use super::socket::{Shape, SocketNet};
use super::{block_bytes, host_block};
use crate::bootstrap::socket::NetIf;
use crate::error::{Error, Result};
use crate::sched::device::{LL_REGION_DIV, STEP_LL};
use crate::sched::Dir;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) fn lo() -> NetIf {
    NetIf {
        name: "lo".into(),
        ip: "127.0.0.1".parse().unwrap(),
        scope_id: 0,
    }
}

/// Call `f` until it gives a value; panics after 20 s.
pub(super) fn until<T>(what: &str, mut f: impl FnMut() -> Result<Option<T>>) -> T {
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

/// A connected (send, recv) pair of comms on `net`.
/// Connect and accept progress together, for a network whose connect waits for the accept.
pub(super) fn connect_pair(net: &dyn Net) -> (Comm, Comm) {
    let (h, l) = net.listen(0).unwrap();
    let (mut s, mut r) = (None, None);
    let pair = until("connect and accept", || {
        if s.is_none() {
            s = net.connect(0, &h)?;
        }
        if r.is_none() {
            r = net.accept(l)?;
        }
        Ok(s.zip(r))
    });
    net.close_listen(l).unwrap();
    pair
}

pub(super) fn pattern(seed: usize, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 131 + seed * 7 + 1) as u8).collect()
}

#[test]
fn every_socket_device_listens_on_its_own_interface_and_moves_data() {
    // Two "interfaces": two loopback addresses (Linux routes all of 127/8 to lo).
    let second = NetIf {
        name: "lo-b".into(),
        ip: "127.0.0.2".parse().unwrap(),
        scope_id: 0,
    };
    let net = SocketNet::with_devices(vec![lo(), second], Shape::new(0, 1));
    assert_eq!(net.devices().unwrap(), 2);
    assert_eq!(net.properties(1).unwrap().name, "lo-b");
    assert!(net.properties(2).unwrap_err().msg.contains("no device 2"));
    for dev in 0..2 {
        let (h, l) = net.listen(dev).unwrap();
        let want = if dev == 0 { "127.0.0.1" } else { "127.0.0.2" };
        let addr = super::socket::handle_address(&h);
        assert_eq!(addr.ip().to_string(), want, "device {dev}");
        let s = until("connect", || net.connect(dev, &h));
        let r = until("accept", || net.accept(l));
        net.close_listen(l).unwrap();
        let mh = net
            .reg_mr(s, std::ptr::null_mut(), 0, MemType::Host)
            .unwrap();
        let data = pattern(dev as usize, 70_000);
        let mut got = vec![0u8; 70_000];
        let rr = net
            .irecv(r, got.as_mut_ptr(), got.len(), 0, mh)
            .unwrap()
            .unwrap();
        let mut send = data.clone();
        let sr = net
            .isend(s, send.as_mut_ptr(), send.len(), 0, mh)
            .unwrap()
            .unwrap();
        until("send", || net.test(sr));
        assert_eq!(until("recv", || net.test(rr)), data.len());
        assert_eq!(got, data, "device {dev}");
        net.close_send(s).unwrap();
        net.close_recv(r).unwrap();
    }
}

#[test]
fn runs_of_small_and_mixed_messages_go_round_the_sockets_and_arrive_in_order() {
    // Sizes that take 1, 2 and 4 chunks, so the sockets the chunks start on drift.
    let sizes: Vec<usize> = (0..48)
        .map(|i| match i % 4 {
            0 => 100 + i,
            1 => (64 << 10) + i,
            2 => (200 << 10) + i,
            _ => 8,
        })
        .collect();
    for (threads, per) in [(0, 4), (2, 2), (3, 1)] {
        let net = SocketNet::new(lo(), Shape::new(threads, per));
        let (sc, rc) = connect_pair(&net);
        let mh = net
            .reg_mr(sc, std::ptr::null_mut(), 0, MemType::Host)
            .unwrap();
        let mut sends: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| pattern(i, n))
            .collect();
        let mut recvs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
        let rreqs: Vec<_> = recvs
            .iter_mut()
            .map(|b| {
                net.irecv(rc, b.as_mut_ptr(), b.len(), 0, mh)
                    .unwrap()
                    .unwrap()
            })
            .collect();
        let sreqs: Vec<_> = sends
            .iter_mut()
            .map(|b| {
                net.isend(sc, b.as_mut_ptr(), b.len(), 0, mh)
                    .unwrap()
                    .unwrap()
            })
            .collect();
        // Test both sides in turn: without helper threads only `test` moves bytes.
        let (mut rs, mut ss): (Vec<_>, Vec<_>) = (
            rreqs.into_iter().map(Some).collect(),
            sreqs.into_iter().map(Some).collect(),
        );
        let start = Instant::now();
        while rs.iter().chain(&ss).any(Option::is_some) {
            for (i, r) in rs.iter_mut().enumerate() {
                if let Some(req) = *r {
                    if let Some(n) = net.test(req).unwrap() {
                        assert_eq!(n, sizes[i], "shape {threads}x{per} #{i}");
                        *r = None;
                    }
                }
            }
            for s in ss.iter_mut() {
                if let Some(req) = *s {
                    if net.test(req).unwrap().is_some() {
                        *s = None;
                    }
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "shape {threads}x{per}: stuck"
            );
        }
        for (i, (got, sent)) in recvs.iter().zip(&sends).enumerate() {
            assert_eq!(got, sent, "shape {threads}x{per}, message {i}");
        }
        net.close_send(sc).unwrap();
        net.close_recv(rc).unwrap();
    }
}

/// Test `r` until it is done (at most 20 s): the bytes it reports.
fn finish(net: &dyn Net, r: Request, what: &str) -> usize {
    let start = Instant::now();
    loop {
        if let Some(n) = net.test(r).unwrap() {
            return n;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{what} stuck");
    }
}

#[test]
fn streams_posted_while_helpers_move_bytes_arrive_whole_and_in_order() {
    // The sender and the receiver each post from a thread of their own, four requests in
    // flight, while helper threads move the bytes: posts race transfers on every socket.
    // Receives are larger than their messages; sizes from 0 to 300 KiB take 1 to 5 chunks.
    const COUNT: usize = 300;
    const INFLIGHT: usize = 4;
    let size_of = |i: usize| (i * 7919) % (300 << 10);
    for (threads, per) in [(1, 1), (2, 2), (3, 1), (1, 3)] {
        let net = Arc::new(SocketNet::new(lo(), Shape::new(threads, per)));
        let (sc, rc) = connect_pair(net.as_ref());
        let sender = {
            let net = net.clone();
            std::thread::spawn(move || {
                let mut pending = std::collections::VecDeque::new();
                for i in 0..COUNT {
                    if pending.len() == INFLIGHT {
                        let (_buf, r): (Vec<u8>, _) = pending.pop_front().unwrap();
                        finish(net.as_ref(), r, "a send");
                    }
                    let mut buf = pattern(i, size_of(i));
                    let r = net
                        .isend(sc, buf.as_mut_ptr(), buf.len(), 0, MemHandle(0))
                        .unwrap()
                        .unwrap();
                    pending.push_back((buf, r));
                }
                for (_buf, r) in pending {
                    finish(net.as_ref(), r, "a send");
                }
            })
        };
        let mut pending = std::collections::VecDeque::new();
        let check = |i: usize, buf: Vec<u8>, r| {
            let n = finish(net.as_ref(), r, "a receive");
            assert_eq!(n, size_of(i), "shape {threads}x{per}, message {i}");
            assert_eq!(
                buf[..n],
                pattern(i, n)[..],
                "shape {threads}x{per}, message {i}"
            );
        };
        for i in 0..COUNT {
            if pending.len() == INFLIGHT {
                let (j, buf, r) = pending.pop_front().unwrap();
                check(j, buf, r);
            }
            let mut buf = vec![0u8; size_of(i) + 64];
            let r = net
                .irecv(rc, buf.as_mut_ptr(), buf.len(), 0, MemHandle(0))
                .unwrap()
                .unwrap();
            pending.push_back((i, buf, r));
        }
        for (j, buf, r) in pending {
            check(j, buf, r);
        }
        sender.join().unwrap();
        net.close_send(sc).unwrap();
        net.close_recv(rc).unwrap();
    }
}

#[test]
fn socket_messages_arrive_whole_and_in_order_with_every_shape() {
    let sizes = [0usize, 1, 8, 65535, 65537, (4 << 20) + 3];
    for (threads, per) in [(0, 1), (1, 1), (2, 2), (0, 4), (4, 1)] {
        let net = SocketNet::new(lo(), Shape::new(threads, per));
        let (sc, rc) = connect_pair(&net);
        let mh = net
            .reg_mr(sc, std::ptr::null_mut(), 0, MemType::Host)
            .unwrap();
        let sends: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| pattern(i, n))
            .collect();
        let mut recvs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n + 16]).collect();
        let mut reqs = Vec::new();
        for (i, buf) in recvs.iter_mut().enumerate() {
            let r = net
                .irecv(rc, buf.as_mut_ptr(), buf.len(), 0, mh)
                .unwrap()
                .unwrap();
            let s = net
                .isend(sc, sends[i].as_ptr() as *mut u8, sends[i].len(), 0, mh)
                .unwrap()
                .unwrap();
            reqs.push((i, r, s));
        }
        for (i, r, s) in reqs {
            let mut got = None;
            let mut sent = None;
            let start = Instant::now();
            while got.is_none() || sent.is_none() {
                if got.is_none() {
                    got = net.test(r).unwrap();
                }
                if sent.is_none() {
                    sent = net.test(s).unwrap();
                }
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "message {i} stuck"
                );
            }
            assert_eq!(got, Some(sizes[i]), "shape {threads}x{per}, message {i}");
            assert_eq!(sent, Some(sizes[i]));
            assert_eq!(
                &recvs[i][..sizes[i]],
                &sends[i][..],
                "shape {threads}x{per}"
            );
            assert!(
                recvs[i][sizes[i]..].iter().all(|&b| b == 0),
                "wrote past the message"
            );
        }
        net.close_send(sc).unwrap();
        net.close_recv(rc).unwrap();
    }
}

#[test]
fn a_message_larger_than_the_receive_fails_and_says_so() {
    let net = SocketNet::new(lo(), Shape::new(0, 1));
    let (sc, rc) = connect_pair(&net);
    let mh = net
        .reg_mr(sc, std::ptr::null_mut(), 0, MemType::Host)
        .unwrap();
    let data = [1u8; 100];
    let mut small = vec![0u8; 10];
    let r = net
        .irecv(rc, small.as_mut_ptr(), 10, 0, mh)
        .unwrap()
        .unwrap();
    let s = net
        .isend(sc, data.as_ptr() as *mut u8, 100, 0, mh)
        .unwrap()
        .unwrap();
    let start = Instant::now();
    let err = loop {
        let _ = net.test(s);
        match net.test(r) {
            Err(e) => break e,
            Ok(Some(_)) => panic!("an oversized message was accepted"),
            Ok(None) => assert!(start.elapsed() < Duration::from_secs(10)),
        }
    };
    assert!(
        err.msg.contains("larger than the posted receive"),
        "{}",
        err.msg
    );
}

#[test]
fn handles_that_are_not_socket_handles_are_refused() {
    let net = SocketNet::new(lo(), Shape::new(0, 1));
    let e = net.connect(0, &Handle([7; HANDLE_BYTES])).unwrap_err();
    assert!(e.msg.contains("malformed connection handle"), "{}", e.msg);
}

// ---- the proxy, with stand-in kernels ----

const SLOT: u32 = 64 << 10;
const NSLOTS: u32 = 4;

/// One side's block in ordinary memory (the GPU would map it), and its slots in ordinary
/// memory standing in for GPU memory where the side has them there; for a receiving side, the
/// steps its stand-in kernels will consume, which a test announces as a launch would.
struct Block {
    _mem: Vec<u64>,
    _gpu: Vec<u64>,
    host: HostBlock,
    announced: Announced,
}

impl Block {
    fn new(dir: Dir) -> Block {
        Block::with(dir, false)
    }

    fn with(dir: Dir, gpu_slots: bool) -> Block {
        let mut mem = vec![0u64; block_bytes(dir, SLOT, NSLOTS, gpu_slots).div_ceil(8)];
        let gpu_words = if gpu_slots {
            (SLOT * NSLOTS / 8) as usize
        } else {
            0
        };
        let mut gpu = vec![0u64; gpu_words];
        let gpu_ptr = gpu_slots.then_some(gpu.as_mut_ptr() as *mut u8);
        let host = host_block(mem.as_mut_ptr() as *mut u8, SLOT, NSLOTS, gpu_ptr);
        Block {
            _mem: mem,
            _gpu: gpu,
            host,
            announced: Announced::default(),
        }
    }
}

// SAFETY: the block's memory is owned by `_mem` and outlives every user in the tests.
unsafe impl Send for Block {}
unsafe impl Sync for Block {}

fn load(p: *const u64) -> u64 {
    // SAFETY: an aligned u64 of a live block, written by other threads.
    unsafe { std::ptr::read_volatile(p) }
}

fn store(p: *mut u64, v: u64) {
    std::sync::atomic::fence(Ordering::Release);
    // SAFETY: as in `load`.
    unsafe { std::ptr::write_volatile(p, v) };
}

fn slot(b: &HostBlock, k: usize) -> *mut u8 {
    // SAFETY: the staging buffer has NSLOTS slots.
    unsafe { b.buf.add(k % NSLOTS as usize * SLOT as usize) }
}

/// Step k's LL region: the end of its slot, or a sending side's host LL region when its
/// slots are in GPU memory.
fn ll_region(b: &HostBlock, k: usize) -> *mut u64 {
    // SAFETY: the block has NSLOTS LL regions of ll_stride bytes apart.
    unsafe { b.ll.add(k % NSLOTS as usize * b.ll_stride) as *mut u64 }
}

fn epoch(k: usize) -> u64 {
    (k as u64 + 1) & 0xffff_ffff
}

/// The steps both stand-in kernels run: (payload bytes, LL), Simple and LL interleaved over
/// several turns of the slots, every boundary size of both.
fn schedule() -> Vec<(usize, bool)> {
    let simple_max = (SLOT - SLOT / LL_REGION_DIV) as usize;
    let ll_max = (SLOT / (2 * LL_REGION_DIV)) as usize;
    let mut v = Vec::new();
    for turn in 0..3 {
        v.extend([
            (0, false),
            (1, true),
            (4, true),
            (5, true),
            (simple_max, false),
            (ll_max, true),
            (4096 + turn, false),
            (12, true),
            (1, false),
        ]);
    }
    v
}

/// Wait until `ready`, or fail when the stand-in abort flag rises or 20 s pass.
fn spin(
    what: &str,
    abort: &AtomicBool,
    mut ready: impl FnMut() -> bool,
) -> std::result::Result<(), String> {
    let start = Instant::now();
    while !ready() {
        if abort.load(Ordering::Acquire) {
            return Err(format!("{what}: aborted"));
        }
        if start.elapsed() > Duration::from_secs(20) {
            return Err(format!("{what}: timed out"));
        }
        std::hint::spin_loop();
    }
    Ok(())
}

/// The sending kernel's part of `steps`.
fn stand_in_sender(
    b: &HostBlock,
    steps: &[(usize, bool)],
    abort: &AtomicBool,
) -> std::result::Result<(), String> {
    stand_in_sender_with(b, steps, abort, false)
}

/// The sending kernel's part of `steps`; with `trailer` (`FLAG_SEND_GPU`) a Simple step also
/// writes its step word after its payload.
fn stand_in_sender_with(
    b: &HostBlock,
    steps: &[(usize, bool)],
    abort: &AtomicBool,
    trailer: bool,
) -> std::result::Result<(), String> {
    for (k, &(bytes, ll)) in steps.iter().enumerate() {
        send_step(b, k, bytes, ll, abort, trailer)?;
    }
    Ok(())
}

/// The sending kernel's step k of `bytes` (LL or Simple; with `trailer` a Simple step also
/// writes its step word after the payload).
fn send_step(
    b: &HostBlock,
    k: usize,
    bytes: usize,
    ll: bool,
    abort: &AtomicBool,
    trailer: bool,
) -> std::result::Result<(), String> {
    spin(&format!("sender step {k}"), abort, || {
        load(b.head) + NSLOTS as u64 > k as u64
    })?;
    let data = pattern(k, bytes);
    if ll {
        let words = ll_region(b, k);
        for (u, unit) in data.chunks(8).enumerate() {
            let mut v = [0u8; 8];
            v[..unit.len()].copy_from_slice(unit);
            let v = u64::from_le_bytes(v);
            // SAFETY: unit u's two words are within the LL region.
            unsafe {
                std::ptr::write_volatile(words.add(2 * u), (v & 0xffff_ffff) | epoch(k) << 32);
                if unit.len() > 4 {
                    std::ptr::write_volatile(words.add(2 * u + 1), (v >> 32) | epoch(k) << 32);
                }
            }
        }
    } else {
        // SAFETY: a Simple payload fits the slot.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), slot(b, k), bytes) };
    }
    let word = epoch(k) << 32 | bytes as u64 | if ll { STEP_LL as u64 } else { 0 };
    if trailer && !ll {
        // SAFETY: payload + 8 bytes fit the slot.
        unsafe { std::ptr::write_unaligned(slot(b, k).add(bytes) as *mut u64, word) };
    }
    // SAFETY: the step words have NSLOTS entries.
    store(
        unsafe { (b.words as *mut u64).add(k % NSLOTS as usize) },
        word,
    );
    if !ll {
        store(b.tail, k as u64 + 1);
    }
    Ok(())
}

/// The receiving kernel's part of `steps`: checks every byte.
fn stand_in_receiver(
    b: &HostBlock,
    steps: &[(usize, bool)],
    abort: &AtomicBool,
) -> std::result::Result<(), String> {
    for (k, &(bytes, ll)) in steps.iter().enumerate() {
        let mut got = vec![0u8; bytes];
        if ll {
            let words = ll_region(b, k);
            for (u, out) in got.chunks_mut(8).enumerate() {
                let two = out.len() > 4;
                // SAFETY: within the LL region.
                let w = |i: usize| load(unsafe { words.add(2 * u + i) });
                spin(&format!("receiver LL step {k}"), abort, || {
                    w(0) >> 32 == epoch(k) && (!two || w(1) >> 32 == epoch(k))
                })?;
                let v = (w(0) & 0xffff_ffff) | if two { w(1) << 32 } else { 0 };
                out.copy_from_slice(&v.to_le_bytes()[..out.len()]);
            }
        } else {
            spin(&format!("receiver step {k}"), abort, || {
                load(b.tail) > k as u64
            })?;
            // SAFETY: the slot holds the step's payload.
            unsafe { std::ptr::copy_nonoverlapping(slot(b, k), got.as_mut_ptr(), bytes) };
        }
        if got != pattern(k, bytes) {
            return Err(format!("step {k} ({bytes} bytes, ll {ll}): wrong data"));
        }
        store(b.head, k as u64 + 1);
    }
    Ok(())
}

/// A stand-in receiving kernel on a side whose slots are in GPU memory (`FLAG_RECV_GPU`):
/// every step waits for `tail`, and an LL step's words are at the slot's start.
fn stand_in_gpu_receiver(
    b: &HostBlock,
    steps: &[(usize, bool)],
    abort: &AtomicBool,
) -> std::result::Result<(), String> {
    for (k, &(bytes, ll)) in steps.iter().enumerate() {
        gpu_recv_step(b, k, bytes, ll, abort)?;
    }
    Ok(())
}

/// The receiving kernel's step k of `bytes` on a side whose slots are in GPU memory: it waits
/// for `tail`, and an LL step's words are at the slot's start.
fn gpu_recv_step(
    b: &HostBlock,
    k: usize,
    bytes: usize,
    ll: bool,
    abort: &AtomicBool,
) -> std::result::Result<(), String> {
    spin(&format!("receiver step {k}"), abort, || {
        load(b.tail) > k as u64
    })?;
    let mut got = vec![0u8; bytes];
    if ll {
        let words = slot(b, k) as *const u64;
        for (u, out) in got.chunks_mut(8).enumerate() {
            let two = out.len() > 4;
            // SAFETY: within the slot.
            let w = |i: usize| load(unsafe { words.add(2 * u + i) });
            if w(0) >> 32 != epoch(k) || (two && w(1) >> 32 != epoch(k)) {
                return Err(format!("step {k}: an LL word without its flag after tail"));
            }
            let v = (w(0) & 0xffff_ffff) | if two { w(1) << 32 } else { 0 };
            out.copy_from_slice(&v.to_le_bytes()[..out.len()]);
        }
    } else {
        // SAFETY: the slot holds the step's payload.
        unsafe { std::ptr::copy_nonoverlapping(slot(b, k), got.as_mut_ptr(), bytes) };
    }
    if got != pattern(k, bytes) {
        return Err(format!("step {k} ({bytes} bytes, ll {ll}): wrong data"));
    }
    store(b.head, k as u64 + 1);
    Ok(())
}

/// A proxy whose errors land in `errors` (the stand-in kernels have their own abort flag).
fn proxy(rank: i32, errors: &Arc<Mutex<Vec<Error>>>) -> Proxy {
    let e = errors.clone();
    Proxy::start(
        rank,
        None,
        Arc::new(AtomicBool::new(false)),
        0,
        Arc::new(move |_peer: i32, err: Error| e.lock().push(err)),
    )
    .unwrap()
}

fn side(net: &Arc<dyn Net>, comm: Comm, dir: Dir, peer: i32, block: &Block) -> NetSide {
    let b = block.host;
    let mh = net
        .reg_mr(comm, b.buf, (SLOT * NSLOTS) as usize, MemType::Host)
        .unwrap();
    // Only a sender's block has a bounce area (`block_bytes`); a receiver's would start at
    // the end of its block.
    let bounce_mh = match dir {
        Dir::Send => net
            .reg_mr(
                comm,
                b.bounce,
                NSLOTS as usize * bounce_bytes(SLOT),
                MemType::Host,
            )
            .unwrap(),
        Dir::Recv => mh,
    };
    NetSide {
        net: net.clone(),
        comm,
        mh,
        bounce_mh,
        dir,
        peer,
        channel: 0,
        block: b,
        dev_head: 0,
        dev_tail: 0,
        nslots: NSLOTS,
        slot_bytes: SLOT,
        gpu_slots: false,
        announced: block.announced.clone(),
        meter: None,
    }
}

/// Two ranks in threads, each with its proxy, move the whole schedule over `net`; the
/// sender's slots are all released at the end.
pub(super) fn move_schedule_between_two_proxies(net: &Arc<dyn Net>) {
    let (sc, rc) = connect_pair(net.as_ref());
    let (sb, rb) = (Block::new(Dir::Send), Block::new(Dir::Recv));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let flag = AtomicBool::new(false);
    let p0 = proxy(0, &errors);
    let p1 = proxy(1, &errors);
    p0.add(side(net, sc, Dir::Send, 1, &sb));
    p1.add(side(net, rc, Dir::Recv, 0, &rb));
    let steps = schedule();
    rb.announced.add(steps.len() as u64);
    std::thread::scope(|s| {
        let (sb, rb, steps, flag) = (&sb, &rb, &steps, &flag);
        let send = s.spawn(move || stand_in_sender(&sb.host, steps, flag));
        let recv = s.spawn(move || stand_in_receiver(&rb.host, steps, flag));
        send.join().unwrap().unwrap();
        recv.join().unwrap().unwrap();
    });
    assert!(errors.lock().is_empty(), "{:?}", errors.lock());
    let start = Instant::now();
    while load(sb.host.head) != steps.len() as u64 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "head not advanced"
        );
    }
    drop((p0, p1));
}

/// Wait (at most 10 s, else fail naming `what`) until `done`.
fn wait_for(what: &str, done: &dyn Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Lets a held `FlushingNet` go when dropped: declared after its proxy, it frees the proxy
/// thread before the proxy's drop joins it, also when the test fails (no hang).
struct LetGo<'a>(&'a AtomicBool);

impl Drop for LetGo<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The `Net` methods a test wrapper around `self.inner` passes on unchanged: devices, their
/// properties, connection setup and memory registration (wrappers differ only in the data path
/// and teardown).
macro_rules! forward_setup_to_inner {
    () => {
        fn devices(&self) -> Result<i32> {
            self.inner.devices()
        }
        fn properties(&self, dev: i32) -> Result<super::api::Properties> {
            self.inner.properties(dev)
        }
        fn listen(&self, dev: i32) -> Result<(Handle, Comm)> {
            self.inner.listen(dev)
        }
        fn connect(&self, dev: i32, handle: &Handle) -> Result<Option<Comm>> {
            self.inner.connect(dev, handle)
        }
        fn accept(&self, listen: Comm) -> Result<Option<Comm>> {
            self.inner.accept(listen)
        }
        fn reg_mr(
            &self,
            comm: Comm,
            data: *mut u8,
            size: usize,
            mem: MemType,
        ) -> Result<MemHandle> {
            self.inner.reg_mr(comm, data, size, mem)
        }
        fn dereg_mr(&self, comm: Comm, mh: MemHandle) -> Result<()> {
            self.inner.dereg_mr(comm, mh)
        }
    };
}

/// The socket network with an `iflush` that takes two tests to finish, counting flushes, a
/// `test` that does not return while `hold` is set, and a count of closed comms.
struct FlushingNet {
    inner: SocketNet,
    /// Flush requests handed out, with the tests each has had.
    flushes: Mutex<std::collections::HashMap<usize, u32>>,
    done: std::sync::atomic::AtomicUsize,
    hold: AtomicBool,
    closes: std::sync::atomic::AtomicUsize,
}

impl FlushingNet {
    fn new(hold: bool) -> FlushingNet {
        FlushingNet {
            inner: SocketNet::new(lo(), Shape::new(0, 1)),
            flushes: Mutex::new(Default::default()),
            done: Default::default(),
            hold: AtomicBool::new(hold),
            closes: Default::default(),
        }
    }
}

const FLUSH_IDS: usize = 1 << 40;

impl Net for FlushingNet {
    fn name(&self) -> &str {
        "Flushing"
    }
    forward_setup_to_inner!();
    fn isend(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        tag: i32,
        mh: MemHandle,
    ) -> Result<Option<Request>> {
        self.inner.isend(comm, data, size, tag, mh)
    }
    fn irecv(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        tag: i32,
        mh: MemHandle,
    ) -> Result<Option<Request>> {
        self.inner.irecv(comm, data, size, tag, mh)
    }
    fn iflush(
        &self,
        _comm: Comm,
        _data: *mut u8,
        _size: usize,
        _mh: MemHandle,
    ) -> Result<Option<Request>> {
        let mut f = self.flushes.lock();
        let id = FLUSH_IDS + f.len();
        f.insert(id, 0);
        Ok(Some(Request(id)))
    }
    fn test(&self, req: Request) -> Result<Option<usize>> {
        while self.hold.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if req.0 < FLUSH_IDS {
            return self.inner.test(req);
        }
        let mut f = self.flushes.lock();
        let tests = f.get_mut(&req.0).expect("a flush handed out");
        *tests += 1;
        if *tests < 2 {
            return Ok(None);
        }
        self.done.fetch_add(1, Ordering::AcqRel);
        Ok(Some(0))
    }
    fn close_send(&self, comm: Comm) -> Result<()> {
        self.closes.fetch_add(1, Ordering::AcqRel);
        self.inner.close_send(comm)
    }
    fn close_recv(&self, comm: Comm) -> Result<()> {
        self.closes.fetch_add(1, Ordering::AcqRel);
        self.inner.close_recv(comm)
    }
    fn close_listen(&self, comm: Comm) -> Result<()> {
        self.inner.close_listen(comm)
    }
}

#[test]
fn a_receiving_side_in_gpu_memory_gets_every_message_at_its_slot_start_and_no_landing() {
    // Host memory stands in for the GPU slots: the proxy must leave each message where it
    // landed (no LL copy into the LL region, no trailer check) and advance tail only once the
    // step's flush is done.
    let flushing = Arc::new(FlushingNet::new(false));
    let net: Arc<dyn Net> = flushing.clone();
    let (sc, rc) = connect_pair(net.as_ref());
    let (sb, rb) = (Block::new(Dir::Send), Block::new(Dir::Recv));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let flag = AtomicBool::new(false);
    let p0 = proxy(0, &errors);
    let p1 = proxy(1, &errors);
    p0.add(side(&net, sc, Dir::Send, 1, &sb));
    p1.add(NetSide {
        gpu_slots: true,
        ..side(&net, rc, Dir::Recv, 0, &rb)
    });
    let steps = schedule();
    rb.announced.add(steps.len() as u64);
    std::thread::scope(|s| {
        let (sb, rb, steps, flag) = (&sb, &rb, &steps, &flag);
        let send = s.spawn(move || stand_in_sender(&sb.host, steps, flag));
        let recv = s.spawn(move || stand_in_gpu_receiver(&rb.host, steps, flag));
        send.join().unwrap().unwrap();
        recv.join().unwrap().unwrap();
    });
    assert!(errors.lock().is_empty(), "{:?}", errors.lock());
    // No LL step was copied into an LL region (its first word may hold the trailer of a
    // Simple step that fills the Simple region; an LL step of 5 bytes or more has a second).
    for k in 0..NSLOTS as usize {
        let region = ll_region(&rb.host, k) as *const u64;
        // SAFETY: within the block.
        let second = load(unsafe { region.add(1) });
        assert_eq!(second, 0, "slot {k}: an LL step landed in the LL region");
    }
    drop((p0, p1));
    // Every step's tail waited for its flush (the receiver saw every step's tail).
    assert_eq!(flushing.done.load(Ordering::Acquire), steps.len());
}

/// Rank 0's proxy sending from a side whose slots are in (stand-in) GPU memory to rank 1's
/// proxy, whose side receives into GPU memory with `gpu_receiver`, over the socket network.
/// The proxies come first: fields drop in order, and the proxies must stop before the blocks
/// they read are freed.
struct GpuSenderPair {
    _proxies: (Proxy, Proxy),
    sb: Block,
    rb: Block,
    errors: Arc<Mutex<Vec<Error>>>,
}

fn gpu_sender_pair(gpu_receiver: bool) -> GpuSenderPair {
    let net: Arc<dyn Net> = Arc::new(SocketNet::new(lo(), Shape::new(0, 1)));
    let (sc, rc) = connect_pair(net.as_ref());
    let sb = Block::with(Dir::Send, true);
    let rb = Block::with(Dir::Recv, gpu_receiver);
    rb.announced.add(schedule().len() as u64);
    let errors = Arc::new(Mutex::new(Vec::new()));
    let p0 = proxy(0, &errors);
    let p1 = proxy(1, &errors);
    p0.add(NetSide {
        gpu_slots: true,
        ..side(&net, sc, Dir::Send, 1, &sb)
    });
    p1.add(NetSide {
        gpu_slots: gpu_receiver,
        ..side(&net, rc, Dir::Recv, 0, &rb)
    });
    GpuSenderPair {
        _proxies: (p0, p1),
        sb,
        rb,
        errors,
    }
}

#[test]
fn a_sending_side_in_gpu_memory_sends_simple_steps_with_the_kernels_trailer() {
    // Host memory stands in for the GPU slots of the sender (the proxy never writes there):
    // Simple steps go out of the slots with the trailer the stand-in kernel wrote after the
    // payload, LL steps from the host LL regions; to a host receiver (which checks every
    // trailer) and to a receiver in GPU memory too.
    for gpu_receiver in [false, true] {
        let pair = gpu_sender_pair(gpu_receiver);
        let flag = AtomicBool::new(false);
        let steps = schedule();
        std::thread::scope(|s| {
            let (sb, rb, steps, flag) = (&pair.sb, &pair.rb, &steps, &flag);
            let send = s.spawn(move || stand_in_sender_with(&sb.host, steps, flag, true));
            let recv = s.spawn(move || match gpu_receiver {
                true => stand_in_gpu_receiver(&rb.host, steps, flag),
                false => stand_in_receiver(&rb.host, steps, flag),
            });
            send.join().unwrap().unwrap();
            recv.join().unwrap().unwrap();
        });
        assert!(pair.errors.lock().is_empty(), "{:?}", pair.errors.lock());
    }
}

#[test]
fn without_the_kernels_trailer_a_sending_side_in_gpu_memory_fails_the_receiver() {
    // The proxy does not write into a sending side's GPU slots: when the kernel leaves the
    // trailer out, the receiving proxy finds no valid one and says so (no wrong data, no
    // hang).
    let pair = gpu_sender_pair(false);
    let flag = AtomicBool::new(false);
    let steps = schedule();
    std::thread::scope(|s| {
        let (sb, steps, flag) = (&pair.sb, &steps, &flag);
        let send = s.spawn(move || stand_in_sender_with(&sb.host, steps, flag, false));
        let start = Instant::now();
        while pair.errors.lock().is_empty() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        flag.store(true, Ordering::Release);
        let _ = send.join().unwrap();
    });
    let errors = pair.errors.lock();
    assert!(
        errors
            .iter()
            .any(|e| e.msg.contains("receiving from rank 0") && e.msg.contains("disagree")),
        "{errors:?}"
    );
    assert_eq!(load(pair.rb.host.tail), 0, "no step was delivered");
}

#[test]
fn two_ranks_in_a_ring_over_channels_with_host_sends_and_gpu_receives_finish() {
    // The configuration of NCCL_NET_GDR_READ=0 (sends staged in host memory, receives in
    // (stand-in) GPU memory, each flushed in two tests), two ranks each sending to and
    // receiving from the other on several channels, every stand-in kernel alternating a send
    // and a receive step as a ring does, over several rounds of the schedule: every step
    // arrives, and both ranks finish.
    const CHANNELS: u32 = 4;
    let flushing = Arc::new(FlushingNet::new(false));
    let net: Arc<dyn Net> = flushing.clone();
    // blocks[r][c] = (rank r's send block, rank r's receive block) on channel c; declared
    // before the proxies, which stop first.
    let blocks: Vec<Vec<(Block, Block)>> = (0..2)
        .map(|_| {
            (0..CHANNELS)
                .map(|_| (Block::new(Dir::Send), Block::with(Dir::Recv, true)))
                .collect()
        })
        .collect();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let proxies = [proxy(0, &errors), proxy(1, &errors)];
    for ch in 0..CHANNELS {
        for from in 0..2usize {
            let to = 1 - from;
            let (sc, rc) = connect_pair(net.as_ref());
            let send = &blocks[from][ch as usize].0;
            let recv = &blocks[to][ch as usize].1;
            proxies[from].add(NetSide {
                channel: ch,
                ..side(&net, sc, Dir::Send, to as i32, send)
            });
            proxies[to].add(NetSide {
                channel: ch,
                gpu_slots: true,
                ..side(&net, rc, Dir::Recv, from as i32, recv)
            });
        }
    }
    let steps: Vec<(usize, bool)> = (0..4).flat_map(|_| schedule()).collect();
    for (_, recv) in blocks.iter().flatten() {
        recv.announced.add(steps.len() as u64);
    }
    let flag = AtomicBool::new(false);
    std::thread::scope(|s| {
        let kernels: Vec<_> = blocks
            .iter()
            .flatten()
            .map(|(send, recv)| {
                let (steps, flag) = (&steps, &flag);
                s.spawn(move || -> std::result::Result<(), String> {
                    for (k, &(bytes, ll)) in steps.iter().enumerate() {
                        send_step(&send.host, k, bytes, ll, flag, false)?;
                        gpu_recv_step(&recv.host, k, bytes, ll, flag)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for k in kernels {
            if let Err(e) = k.join().unwrap() {
                flag.store(true, Ordering::Release);
                panic!("{e}; proxy errors: {:?}", errors.lock());
            }
        }
    });
    assert!(errors.lock().is_empty(), "{:?}", errors.lock());
}

#[test]
fn a_proxy_stuck_in_a_network_call_is_named_by_the_side_it_is_at() {
    // The proxy thread cannot report a network call that does not return; `stuck_in` (what
    // the monitor logs) names the side it is at once the pass outlasts the report delay, and
    // nothing once the call returns.
    let flushing = Arc::new(FlushingNet::new(true));
    let net: Arc<dyn Net> = flushing.clone();
    let (_sc, rc) = connect_pair(net.as_ref());
    let rb = Block::new(Dir::Recv);
    rb.announced.add(1); // a receive to post, whose test holds
    let errors = Arc::new(Mutex::new(Vec::new()));
    let p = proxy(3, &errors);
    p.set_stuck_after(Duration::from_millis(50));
    let let_go = LetGo(&flushing.hold);
    p.add(NetSide {
        channel: 5,
        ..side(&net, rc, Dir::Recv, 2, &rb)
    });
    wait_for("a stuck pass", &|| p.stuck_in().is_some());
    let (side, took) = p.stuck_in().expect("still stuck: the test holds");
    assert_eq!(side, "receiving from rank 2 (channel 5)");
    assert!(took >= Duration::from_millis(50), "{took:?}");
    drop(let_go);
    wait_for("the pass to end", &|| p.stuck_in().is_none());
    assert!(errors.lock().is_empty(), "{:?}", errors.lock());
}

/// The bed of the held-proxy tests: a status page, a `FlushingNet` whose `test` holds, and a
/// connected pair whose receiving end a proxy drives.
struct HeldBed {
    page: Vec<u64>,
    flushing: Arc<FlushingNet>,
    net: Arc<dyn Net>,
    _sc: Comm,
    rc: Comm,
    rb: Block,
    errors: Arc<Mutex<Vec<Error>>>,
}

impl HeldBed {
    /// With CTA 0 parked on a counter at device address `park_on` (0: no CTA parked).
    fn new(park_on: u64) -> HeldBed {
        use crate::sched::device::{BELL_OFFSET, PARK_ENTRY_BYTES, PARK_OFFSET, PROGRESS_CTAS};
        let page_bytes = (PARK_OFFSET + PARK_ENTRY_BYTES * PROGRESS_CTAS).max(BELL_OFFSET + 4);
        let mut page = vec![0u64; (page_bytes as usize).div_ceil(8)];
        page[PARK_OFFSET as usize / 8] = park_on; // waiting for a value >= 0: met
        let flushing = Arc::new(FlushingNet::new(true));
        let net: Arc<dyn Net> = flushing.clone();
        let (sc, rc) = connect_pair(net.as_ref());
        let rb = Block::new(Dir::Recv);
        rb.announced.add(1); // a receive to post, whose test holds
        HeldBed {
            page,
            flushing,
            net,
            _sc: sc,
            rc,
            rb,
            errors: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// A proxy over the page driving the receiving end (its tail at device address
    /// `dev_tail`), which holds at its first test; declare a `LetGo` after it.
    fn proxy(&self, dev_tail: u64) -> Proxy {
        let e = self.errors.clone();
        let p = Proxy::start(
            4,
            None,
            Arc::new(AtomicBool::new(false)),
            self.page.as_ptr() as usize,
            Arc::new(move |_peer: i32, err: Error| e.lock().push(err)),
        )
        .unwrap();
        p.set_stuck_after(Duration::from_millis(20));
        let mut held = side(&self.net, self.rc, Dir::Recv, 1, &self.rb);
        held.dev_tail = dev_tail;
        p.add(held);
        p
    }

    fn bell(&self) -> *mut u32 {
        (self.page.as_ptr() as usize + crate::sched::device::BELL_OFFSET as usize) as *mut u32
    }

    fn read_bell(&self) -> u32 {
        // SAFETY: an aligned u32 inside the page, which outlives every proxy of the bed; the
        // proxy and the monitor write it concurrently, hence volatile.
        unsafe { std::ptr::read_volatile(self.bell()) }
    }

    fn silence(&self) {
        // SAFETY: as read_bell.
        unsafe { std::ptr::write_volatile(self.bell(), 0) }
    }
}

#[test]
fn the_monitor_rings_the_bell_of_a_proxy_held_in_a_network_call() {
    // A yielding launch's stream waits for the bell, which the proxy rings after each pass; a
    // plugin's CUDA copy queued behind that wait (same hardware queue) would hold the proxy in
    // its call for good. While the thread is held, the monitor rings a silent bell in its
    // place, again each time a parking kernel silences it.
    let bed = HeldBed::new(0);
    let p = bed.proxy(0);
    let let_go = LetGo(&bed.flushing.hold);
    wait_for("the thread held in its pass", &|| p.stuck_in().is_some());
    for round in 0..3 {
        bed.silence();
        wait_for(
            &format!("the bell rung while held (round {round})"),
            &|| bed.read_bell() == 1,
        );
    }
    drop(let_go);
    wait_for("the pass to end", &|| p.stuck_in().is_none());
    drop(p);
    assert!(bed.errors.lock().is_empty(), "{:?}", bed.errors.lock());
}

#[test]
fn a_proxy_held_in_a_network_call_is_left_behind_by_stop_and_rings_no_gone_page() {
    // A plugin call that never returns must not hang destroy or abort: stop gives up after
    // its limit and declares the status page gone. When the call returns at last, the thread
    // ends its pass without touching the page (a parked CTA's met wait would have it ring the
    // bell at once) and closes its connection.
    const TAIL_AT: u64 = 0x1000;
    let bed = HeldBed::new(TAIL_AT);
    let p = bed.proxy(TAIL_AT);
    let let_go = LetGo(&bed.flushing.hold);
    wait_for("the thread held in its pass", &|| p.stuck_in().is_some());
    let start = Instant::now();
    assert!(
        !p.stop(Duration::from_millis(100)),
        "a held thread cannot have stopped"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "stop waited {:?}",
        start.elapsed()
    );
    bed.silence(); // the bed stays: the caller of a failed stop frees nothing
    drop(let_go);
    wait_for("the left-behind thread to close its connection", &|| {
        bed.flushing.closes.load(Ordering::Acquire) == 1
    });
    assert_eq!(
        bed.read_bell(),
        0,
        "the thread rang the bell of a page declared gone"
    );
    assert!(bed.errors.lock().is_empty(), "{:?}", bed.errors.lock());
}

#[test]
fn the_proxy_moves_simple_and_ll_steps_between_two_ranks() {
    for shape in [Shape::new(0, 1), Shape::new(2, 2)] {
        move_schedule_between_two_proxies(&(Arc::new(SocketNet::new(lo(), shape)) as Arc<dyn Net>));
    }
}

#[test]
fn the_proxy_moves_simple_and_ll_steps_over_a_net_plugin() {
    let Some(lib) = super::plugin::tests::plugin() else {
        return;
    };
    let net = super::plugin::open_path(lib).expect("the test plugin loads");
    move_schedule_between_two_proxies(&net);
}

#[test]
fn the_proxy_moves_steps_over_a_plugin_that_also_takes_cuda_memory() {
    // A GPUDirect RDMA plugin (NCCL_PTR_HOST | NCCL_PTR_CUDA): oxccl stages in host memory,
    // which such a plugin takes too.
    let Some(lib) = super::plugin::tests::plugin_taking_cuda() else {
        return;
    };
    let net = super::plugin::open_path(lib).expect("the test plugin loads");
    assert_ne!(
        net.properties(0).unwrap().ptr_support & super::api::PTR_CUDA,
        0
    );
    move_schedule_between_two_proxies(&net);
}

// ---- across processes: the test binary runs itself as the sending rank ----

const CHILD_ENV: &str = "OXCCL_NET_TEST_CHILD";

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn from_hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// In a child process: connect to the handle in the environment and send the schedule's
/// first `n` steps (then, if told to, wait to be killed). Nothing in a normal test run.
#[test]
fn child_sender() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (hex, rest) = spec.split_once(',').unwrap();
    let (n, hang) = rest.split_once(',').unwrap();
    let n: usize = n.parse().unwrap();
    let handle = Handle(from_hex(hex).try_into().unwrap());
    let net: Arc<dyn Net> = Arc::new(SocketNet::new(lo(), Shape::new(0, 1)));
    let sc = until("connect", || net.connect(0, &handle));
    let block = Block::new(Dir::Send);
    let errors = Arc::new(Mutex::new(Vec::new()));
    let flag = Arc::new(AtomicBool::new(false));
    let p = proxy(1, &errors);
    p.add(side(&net, sc, Dir::Send, 0, &block));
    let steps = schedule();
    stand_in_sender(&block.host, &steps[..n], &flag).unwrap();
    println!("CHILD_SENT {n}");
    if hang == "hang" {
        std::thread::sleep(Duration::from_secs(60));
    }
    let start = Instant::now();
    while load(block.host.head) != n as u64 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "child: head not advanced"
        );
    }
    assert!(errors.lock().is_empty(), "{:?}", errors.lock());
    println!("CHILD_OK");
}

fn spawn_sender(handle: &Handle, n: usize, hang: bool) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "transport::net::tests::child_sender",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            CHILD_ENV,
            format!(
                "{},{n},{}",
                to_hex(&handle.0),
                if hang { "hang" } else { "done" }
            ),
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// This process receives; returns the proxy's errors and the stand-in receiver's result.
fn receive_from_child(
    n_recv: usize,
    kill_after: Option<usize>,
) -> (Vec<Error>, std::result::Result<(), String>, Duration) {
    let net: Arc<dyn Net> = Arc::new(SocketNet::new(lo(), Shape::new(0, 1)));
    let (h, l) = net.listen(0).unwrap();
    let mut child = spawn_sender(&h, kill_after.unwrap_or(n_recv), kill_after.is_some());
    let rc = until("accept", || net.accept(l));
    let block = Block::new(Dir::Recv);
    let errors = Arc::new(Mutex::new(Vec::new()));
    let flag = Arc::new(AtomicBool::new(false));
    let p = proxy(0, &errors);
    p.add(side(&net, rc, Dir::Recv, 1, &block));
    let steps = schedule();
    // The receiving kernel waits for one step more than a killed peer sends.
    block
        .announced
        .add(kill_after.map_or(n_recv, |k| k + 1) as u64);
    let mut since_kill = Duration::ZERO;
    if let Some(k) = kill_after {
        stand_in_receiver(&block.host, &steps[..k], &flag).unwrap();
        child.kill().unwrap();
        let killed = Instant::now();
        // The stand-in kernel's abort flag is raised once the proxy reports the failure.
        let watcher = {
            let (errors, flag) = (errors.clone(), flag.clone());
            std::thread::spawn(move || {
                while errors.lock().is_empty() && killed.elapsed() < Duration::from_secs(15) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                flag.store(true, Ordering::Release);
            })
        };
        let r = stand_in_receiver(&block.host, &steps[..k + 1], &flag);
        since_kill = killed.elapsed();
        watcher.join().unwrap();
        let _ = child.wait();
        // A teardown's drain ends at once: the failed receive leaves nothing unsent (it waited
        // out its limit once).
        let t = Instant::now();
        let drained = p.drain(Duration::from_secs(30));
        assert!(
            drained.is_ok() && t.elapsed() < Duration::from_secs(5),
            "the drain after a failed receive: {drained:?} after {:?}",
            t.elapsed()
        );
        return (
            std::mem::take(&mut *errors.lock()),
            r.map(|_| ()),
            since_kill,
        );
    }
    let r = stand_in_receiver(&block.host, &steps[..n_recv], &flag);
    let out = child.wait_with_output().unwrap();
    if let Err(e) = &r {
        panic!(
            "{e}; the child: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("CHILD_OK"),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(p);
    let errors = std::mem::take(&mut *errors.lock());
    (errors, r, since_kill)
}

#[test]
fn the_proxy_moves_steps_between_processes() {
    let n = schedule().len();
    let (errors, r, _) = receive_from_child(n, None);
    r.unwrap();
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn a_peer_killed_mid_transfer_is_an_error_naming_it_not_a_hang() {
    let (errors, r, after) = receive_from_child(0, Some(5));
    assert!(
        r.is_err(),
        "the receiver cannot complete a step the dead peer never sent"
    );
    assert!(
        after < Duration::from_secs(10),
        "the failure took {after:?}"
    );
    let e = errors.first().expect("the proxy reported the failure");
    assert!(
        e.msg.contains("receiving from rank 1") && e.msg.contains("closed the connection"),
        "{}",
        e.msg
    );
    assert_eq!(e.code, crate::abi::ncclResult_t::ncclRemoteError);
}

/// Two ranks' proxies moving data both ways over one network: rank a (proxy `pa`) drives
/// a->b's send and b->a's receive, rank b (`pb`) the other two. `comms` and `blocks` are, in
/// order, a->b's send and receive, then b->a's send and receive.
struct TwoWay {
    comms: [Comm; 4],
    blocks: [Block; 4],
    errors: Arc<Mutex<Vec<Error>>>,
    pa: Proxy,
    pb: Proxy,
}

impl TwoWay {
    fn connect(net: &Arc<dyn Net>) -> TwoWay {
        let (ab_s, ab_r) = connect_pair(net.as_ref());
        let (ba_s, ba_r) = connect_pair(net.as_ref());
        let blocks = [
            Block::new(Dir::Send),
            Block::new(Dir::Recv),
            Block::new(Dir::Send),
            Block::new(Dir::Recv),
        ];
        let errors = Arc::new(Mutex::new(Vec::new()));
        let pa = proxy(0, &errors);
        let pb = proxy(1, &errors);
        pa.add(side(net, ab_s, Dir::Send, 1, &blocks[0]));
        pb.add(side(net, ab_r, Dir::Recv, 0, &blocks[1]));
        pb.add(side(net, ba_s, Dir::Send, 0, &blocks[2]));
        pa.add(side(net, ba_r, Dir::Recv, 1, &blocks[3]));
        TwoWay {
            comms: [ab_s, ab_r, ba_s, ba_r],
            blocks,
            errors,
            pa,
            pb,
        }
    }

    /// Announce `steps` to both receiving sides, as a launch does, and run the four stand-in
    /// kernels through them; every one must finish.
    fn run(&self, steps: &[(usize, bool)]) {
        self.blocks[1].announced.add(steps.len() as u64);
        self.blocks[3].announced.add(steps.len() as u64);
        let flag = AtomicBool::new(false);
        std::thread::scope(|s| {
            let flag = &flag;
            let kernels: Vec<_> = self
                .blocks
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    s.spawn(move || match i % 2 {
                        0 => stand_in_sender(&b.host, steps, flag),
                        _ => stand_in_receiver(&b.host, steps, flag),
                    })
                })
                .collect();
            for k in kernels {
                k.join().unwrap().unwrap();
            }
        });
    }
}

#[test]
fn both_directions_at_once_with_full_slots_do_not_stall() {
    let net: Arc<dyn Net> = Arc::new(SocketNet::new(lo(), Shape::new(0, 1)));
    let two = TwoWay::connect(&net);
    let simple_max = (SLOT - SLOT / LL_REGION_DIV) as usize;
    let steps: Vec<(usize, bool)> = (0..300)
        .map(|i| (simple_max - (i % 3) * 8, false))
        .collect();
    two.run(&steps);
    assert!(two.errors.lock().is_empty(), "{:?}", two.errors.lock());
}

#[test]
fn an_orderly_teardown_first_sends_what_the_kernels_left() {
    let net: Arc<dyn Net> = Arc::new(SocketNet::new(lo(), Shape::new(0, 1)));
    let (sc, rc) = connect_pair(net.as_ref());
    let (sb, rb) = (Block::new(Dir::Send), Block::new(Dir::Recv));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let flag = AtomicBool::new(false);
    let receiver_proxy = proxy(1, &errors);
    receiver_proxy.add(side(&net, rc, Dir::Recv, 0, &rb));
    let simple_max = (SLOT - SLOT / LL_REGION_DIV) as usize;
    let steps: Vec<(usize, bool)> = (0..40).map(|_| (simple_max, false)).collect();
    rb.announced.add(steps.len() as u64);
    std::thread::scope(|s| {
        let (rb, steps, flag) = (&rb, &steps, &flag);
        // The receiving kernel is late: the last slots are still in the sender's staging
        // when its kernel is done and its communicator goes away.
        let recv = s.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            stand_in_receiver(&rb.host, steps, flag)
        });
        let sender_proxy = proxy(0, &errors);
        sender_proxy.add(side(&net, sc, Dir::Send, 1, &sb));
        stand_in_sender(&sb.host, steps, flag).unwrap();
        assert_eq!(sender_proxy.drain(Duration::from_secs(10)), Ok(()));
        // Every filled slot went out before the drain returned (the receiver has not even
        // started), so the proxy may stop now.
        assert_eq!(
            load(sb.host.head),
            steps.len() as u64,
            "the drain left slots unsent"
        );
        drop(sender_proxy);
        recv.join().unwrap().unwrap();
    });
    assert!(errors.lock().is_empty(), "{:?}", errors.lock());
}

// ---- teardown: no connection closed with requests in flight ----

/// The socket network counting each comm's requests in flight (posted, not yet reported done
/// by `test`) and its receives posted, and recording how many requests each comm still had
/// in flight when it was closed (what aws-ofi-nccl warns about).
struct CountingNet {
    inner: SocketNet,
    /// Requests in flight, with their comm.
    open: Mutex<std::collections::HashMap<Request, Comm>>,
    /// Receives posted, per comm.
    recvs: Mutex<std::collections::HashMap<Comm, usize>>,
    /// (comm, sending, requests in flight) of every close, in order.
    closed: Mutex<Vec<(Comm, bool, usize)>>,
}

impl CountingNet {
    fn new() -> CountingNet {
        CountingNet {
            inner: SocketNet::new(lo(), Shape::new(0, 1)),
            open: Mutex::new(Default::default()),
            recvs: Mutex::new(Default::default()),
            closed: Mutex::new(Vec::new()),
        }
    }

    fn track(&self, comm: Comm, r: Result<Option<Request>>) -> Result<Option<Request>> {
        if let Ok(Some(req)) = r {
            self.open.lock().insert(req, comm);
        }
        r
    }

    fn closing(&self, comm: Comm, sending: bool) {
        let mut open = self.open.lock();
        let before = open.len();
        open.retain(|_, c| *c != comm);
        self.closed
            .lock()
            .push((comm, sending, before - open.len()));
    }

    fn recvs_posted(&self, comm: Comm) -> usize {
        self.recvs.lock().get(&comm).copied().unwrap_or(0)
    }

    fn closed(&self) -> Vec<(Comm, bool, usize)> {
        self.closed.lock().clone()
    }
}

impl Net for CountingNet {
    fn name(&self) -> &str {
        "Counting"
    }
    forward_setup_to_inner!();
    fn isend(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        tag: i32,
        mh: MemHandle,
    ) -> Result<Option<Request>> {
        self.track(comm, self.inner.isend(comm, data, size, tag, mh))
    }
    fn irecv(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        tag: i32,
        mh: MemHandle,
    ) -> Result<Option<Request>> {
        let r = self.track(comm, self.inner.irecv(comm, data, size, tag, mh));
        if let Ok(Some(_)) = r {
            *self.recvs.lock().entry(comm).or_default() += 1;
        }
        r
    }
    fn iflush(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        mh: MemHandle,
    ) -> Result<Option<Request>> {
        self.track(comm, self.inner.iflush(comm, data, size, mh))
    }
    fn test(&self, req: Request) -> Result<Option<usize>> {
        let r = self.inner.test(req);
        if let Ok(Some(_)) = r {
            self.open.lock().remove(&req);
        }
        r
    }
    fn close_send(&self, comm: Comm) -> Result<()> {
        self.closing(comm, true);
        self.inner.close_send(comm)
    }
    fn close_recv(&self, comm: Comm) -> Result<()> {
        self.closing(comm, false);
        self.inner.close_recv(comm)
    }
    fn close_listen(&self, comm: Comm) -> Result<()> {
        self.inner.close_listen(comm)
    }
}

#[test]
fn an_orderly_teardown_closes_no_connection_with_requests_in_flight() {
    // Two ranks, each sending to and receiving from the other, move the whole schedule
    // (Simple and LL steps, several turns of the slots); then each tears down as
    // ncclCommDestroy does (drain, stop). Every receive was posted for a step a kernel
    // consumed and every send was tested done: all four comms close with nothing in flight.
    let counting = Arc::new(CountingNet::new());
    let net: Arc<dyn Net> = counting.clone();
    let two = TwoWay::connect(&net);
    let steps = schedule();
    two.run(&steps);
    let TwoWay {
        comms,
        errors,
        pa,
        pb,
        ..
    } = two;
    let [_, ab_r, _, ba_r] = comms;
    assert_eq!(pa.drain(Duration::from_secs(10)), Ok(()));
    assert_eq!(pb.drain(Duration::from_secs(10)), Ok(()));
    assert!(pa.stop(Duration::from_secs(5)) && pb.stop(Duration::from_secs(5)));
    assert!(errors.lock().is_empty(), "{:?}", errors.lock());
    let closed = counting.closed();
    assert_eq!(closed.len(), 4, "{closed:?}");
    for (comm, sending, inflight) in closed {
        assert_eq!(
            inflight, 0,
            "{comm:?} (sending: {sending}) was closed with requests in flight"
        );
    }
    for comm in [ab_r, ba_r] {
        assert_eq!(counting.recvs_posted(comm), steps.len(), "{comm:?}");
    }
}

#[test]
fn receives_are_posted_only_for_steps_announced_and_slots_free() {
    let counting = Arc::new(CountingNet::new());
    let net: Arc<dyn Net> = counting.clone();
    let (sc, rc) = connect_pair(net.as_ref());
    let (sb, rb) = (Block::new(Dir::Send), Block::new(Dir::Recv));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let flag = AtomicBool::new(false);
    let receiver = proxy(1, &errors);
    receiver.add(side(&net, rc, Dir::Recv, 0, &rb));
    // Nothing announced: nothing posted, although every slot is free.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(counting.recvs_posted(rc), 0);
    // Three steps (fewer than the slots): three receives, and no more.
    rb.announced.add(3);
    wait_for("three receives posted", &|| counting.recvs_posted(rc) == 3);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(counting.recvs_posted(rc), 3);
    // More steps than slots: one receive per free slot until the kernel consumes.
    let steps: Vec<(usize, bool)> = schedule().into_iter().take(NSLOTS as usize + 3).collect();
    rb.announced.add(steps.len() as u64 - 3);
    wait_for("a receive per slot", &|| {
        counting.recvs_posted(rc) == NSLOTS as usize
    });
    let sender = proxy(0, &errors);
    sender.add(side(&net, sc, Dir::Send, 1, &sb));
    std::thread::scope(|s| {
        let (sb, rb, steps, flag) = (&sb, &rb, &steps, &flag);
        let send = s.spawn(move || stand_in_sender(&sb.host, steps, flag));
        let recv = s.spawn(move || stand_in_receiver(&rb.host, steps, flag));
        send.join().unwrap().unwrap();
        recv.join().unwrap().unwrap();
    });
    assert_eq!(sender.drain(Duration::from_secs(10)), Ok(()));
    drop((sender, receiver));
    assert_eq!(counting.recvs_posted(rc), steps.len());
    let closed = counting.closed();
    assert!(closed.iter().all(|c| c.2 == 0), "{closed:?}");
    assert!(errors.lock().is_empty(), "{:?}", errors.lock());
}

#[test]
fn stop_and_abort_close_at_once_with_receives_no_data_will_come_for() {
    // Steps announced that no sender fills (a launch whose peer never came): the posted
    // receives would never complete. Neither a stop nor an abort waits for them: both close
    // promptly, saying how many were in flight.
    for abort in [false, true] {
        let counting = Arc::new(CountingNet::new());
        let net: Arc<dyn Net> = counting.clone();
        let (_sc, rc) = connect_pair(net.as_ref());
        let rb = Block::new(Dir::Recv);
        rb.announced.add(100);
        let flag = Arc::new(AtomicBool::new(false));
        let p = Proxy::start(
            1,
            None,
            flag.clone(),
            0,
            Arc::new(|_peer: i32, _err: Error| {}),
        )
        .unwrap();
        p.add(side(&net, rc, Dir::Recv, 0, &rb));
        wait_for("every slot's receive posted", &|| {
            counting.recvs_posted(rc) == NSLOTS as usize
        });
        flag.store(abort, Ordering::Release);
        let start = Instant::now();
        assert!(p.stop(Duration::from_secs(5)), "abort {abort}");
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "abort {abort}: the stop took {:?}",
            start.elapsed()
        );
        assert_eq!(counting.closed(), vec![(rc, false, NSLOTS as usize)]);
    }
}

#[test]
fn an_abort_does_not_wait_for_sends_in_flight() {
    // A sender whose peer never receives: its sends stay in flight (the socket buffers fill).
    // A stop lets them settle for at most SETTLE; an abort closes at once.
    let counting = Arc::new(CountingNet::new());
    let net: Arc<dyn Net> = counting.clone();
    let (sc, _rc) = connect_pair(net.as_ref());
    let sb = Block::new(Dir::Send);
    let flag = Arc::new(AtomicBool::new(false));
    let p = Proxy::start(
        0,
        None,
        flag.clone(),
        0,
        Arc::new(|_peer: i32, _err: Error| {}),
    )
    .unwrap();
    p.add(side(&net, sc, Dir::Send, 1, &sb));
    let simple_max = (SLOT - SLOT / LL_REGION_DIV) as usize;
    let kernel_abort = AtomicBool::new(false);
    // Fill every slot many times over the socket buffers' size: the kernel stops once the
    // slots stay full (the proxy cannot send more), which the stand-in's own limit ends.
    std::thread::scope(|s| {
        let (sb, kernel_abort) = (&sb, &kernel_abort);
        let kernel = s.spawn(move || {
            let steps: Vec<(usize, bool)> = (0..10_000).map(|_| (simple_max, false)).collect();
            stand_in_sender(&sb.host, &steps, kernel_abort)
        });
        wait_for("sends stuck in flight", &|| {
            counting.open.lock().len() == NSLOTS as usize
                && load(sb.host.head) + NSLOTS as u64 == load(sb.host.tail)
        });
        std::thread::sleep(Duration::from_millis(50));
        kernel_abort.store(true, Ordering::Release);
        assert!(kernel.join().unwrap().is_err(), "the peer never receives");
    });
    // The sends were stuck (above); under load the peer's socket buffers may yet take some
    // of them before the abort comes, so what is in flight at the close is not assumed: the
    // abort must close the comm at once whatever it is.
    flag.store(true, Ordering::Release);
    let start = Instant::now();
    assert!(p.stop(Duration::from_secs(5)));
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "the abort waited {:?}",
        start.elapsed()
    );
    let closed = counting.closed();
    assert_eq!(closed.len(), 1, "one comm closed: {closed:?}");
    assert_eq!((closed[0].0, closed[0].1), (sc, true));
    assert!(
        closed[0].2 <= NSLOTS as usize,
        "closed with {} sends in flight, more than the slots",
        closed[0].2
    );
}

#[test]
fn over_the_test_plugin_no_comm_is_closed_with_requests_in_flight() {
    // The test plugin counts (and warns about) requests in flight at closeSend/closeRecv, as
    // aws-ofi-nccl does; a library of its own keeps the count this test's.
    let Some(lib) = super::plugin::tests::plugin_of_its_own("teardown") else {
        return;
    };
    let net = super::plugin::open_path(&lib).expect("the test plugin loads");
    move_schedule_between_two_proxies(&net);
    assert_eq!(super::plugin::tests::requests_in_flight_at_close(&lib), 0);
    // The count is real: a comm closed with a receive posted adds one.
    let (sc, rc) = connect_pair(net.as_ref());
    let mut buf = vec![0u8; 64];
    let mh = net
        .reg_mr(rc, buf.as_mut_ptr(), buf.len(), MemType::Host)
        .unwrap();
    until("a receive posted", || {
        net.irecv(rc, buf.as_mut_ptr(), buf.len(), 0, mh)
    });
    net.dereg_mr(rc, mh).unwrap();
    net.close_recv(rc).unwrap();
    net.close_send(sc).unwrap();
    assert_eq!(super::plugin::tests::requests_in_flight_at_close(&lib), 1);
}

// ---- the meter: a device waiting for the next launch is not busy ----

#[test]
fn a_device_waiting_for_the_next_launch_is_not_charged_for_the_wait() {
    // One device, two connections, both receiving sides metered, in launches announced one
    // launch ahead: connection A carries NSLOTS steps per launch, B three times as many. A
    // finishes each launch first and its next launch's receives are posted at once; the
    // senders start launch 2 only GAP after both sides consumed launch 1 (the fast link
    // finishing). That wait is not the device's busy time.
    const GAP: Duration = Duration::from_millis(300);
    let net: Arc<dyn Net> = Arc::new(SocketNet::new(lo(), Shape::new(0, 1)));
    let meter = super::meter::NetMeter::new(1);
    let errors = Arc::new(Mutex::new(Vec::new()));
    let flag = AtomicBool::new(false);
    let quotas = [NSLOTS as usize, 3 * NSLOTS as usize];
    // Before the proxies: they stop (dropped first) before the blocks they use go.
    let blocks: Vec<(Block, Block)> = quotas
        .iter()
        .map(|_| (Block::new(Dir::Send), Block::new(Dir::Recv)))
        .collect();
    let (sender, receiver) = (proxy(0, &errors), proxy(1, &errors));
    for ((sb, rb), &quota) in blocks.iter().zip(&quotas) {
        let (sc, rc) = connect_pair(net.as_ref());
        sender.add(side(&net, sc, Dir::Send, 1, sb));
        let mut recv = side(&net, rc, Dir::Recv, 0, rb);
        recv.announced = Announced::tracking_launches();
        recv.meter = Some(meter.device(0));
        // Both launches are queued from the start, as a host launches kernels ahead.
        recv.announced.add(quota as u64);
        recv.announced.add(quota as u64);
        receiver.add(recv);
    }
    std::thread::scope(|s| {
        for (i, (sb, rb)) in blocks.iter().enumerate() {
            let steps: Vec<(usize, bool)> = vec![(4096, false); 2 * quotas[i]];
            let (flag, blocks, quotas) = (&flag, &blocks, &quotas);
            let received = steps.clone();
            s.spawn(move || {
                for (k, &(bytes, _)) in steps.iter().enumerate() {
                    if k == quotas[i] {
                        // Launch 2 starts once every side consumed launch 1, and GAP later.
                        wait_for("launch 1 consumed", &|| {
                            blocks
                                .iter()
                                .zip(quotas)
                                .all(|((_, rb), &q)| load(rb.host.head) >= q as u64)
                        });
                        std::thread::sleep(GAP);
                    }
                    send_step(&sb.host, k, bytes, false, flag, false).unwrap();
                }
            });
            // The receiving kernel frees each slot a little after the step landed (a GPU's
            // kernel lags the proxy), so a side often receives its launch's last step before
            // the slots for the next launch's receives are free.
            s.spawn(move || {
                for k in 0..received.len() as u64 {
                    wait_for("a step landed", &|| load(rb.host.tail) > k);
                    std::thread::sleep(Duration::from_millis(1));
                    store(rb.host.head, k + 1);
                }
            });
        }
    });
    assert!(errors.lock().is_empty(), "{:?}", errors.lock());
    let busy = Duration::from_nanos(meter.totals()[0].busy_ns);
    assert!(
        busy < GAP / 2,
        "the device was busy {busy:?} for two launches of a few 4 KiB steps over loopback: the \
         {GAP:?} between them was counted"
    );
    drop((sender, receiver));
}
