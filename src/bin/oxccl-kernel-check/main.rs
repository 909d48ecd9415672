//! oxccl-kernel-check: a one-GPU check of the embedded kernels, through the library's own
//! module loading and launch wrapper.
//!
//! 1. `ox_check_reduce`: every data type × op functor applied elementwise to known inputs
//!    (vector path and scalar tail, host and device PreMulSum scalars), compared with a host
//!    reference.
//! 2. Loopback: several "ranks" simulated on one GPU, each with its own buffers and
//!    connections whose staging buffers are local device memory; the real planner's items of
//!    all ranks run in ONE launch of `ox_kernel` (each rank's CTAs offset), for every
//!    collective, in and out of place, twice (persistent positions), compared with a host
//!    reference; then the ring collectives on rings not in rank order (ranks of interleaved
//!    "hosts", `RingOrder::by_host`, with the ring table in device memory), every root. A
//!    watchdog turns a hang into a clear failure.
//!
//! Prints a table and `N passed, M failed`; exits non-zero on any failure.
//! Usage: oxccl-kernel-check [device] [--quick | --yielding-only]

use nccl::abi::ncclDataType_t::{self, *};
use nccl::core::redop::{RedOp, Scalar};
use nccl::cuda::{self, module};
use nccl::sched::device::{
    deserialize_all, ring_table_bytes, with_cta_table, yield_input, OxWork, FLAG_LL,
    FLAG_PARK_RECV, RESUME_DONE_ITEM, STATUS_PAGE_BYTES, YIELD_FRESH, YIELD_LAST, YIELD_RESUME,
};
use nccl::sched::plan::{conn_channels, connections_needed, plan, Dir, Geometry};
use nccl::sched::{cost, CollKind, OxConn, RingOrder, Task};
use std::collections::HashMap;
use std::time::{Duration, Instant};

type Res<T> = Result<T, String>;

fn err(e: nccl::Error) -> String {
    format!("{e:?}")
}

// ---------------------------------------------------------------- host number formats

/// Decode a small float format: `ebits` exponent bits, `mbits` mantissa bits, IEEE-like;
/// `e4m3` has no infinities and only S.1111.111 as NaN.
fn decode_small(bits: u32, ebits: u32, mbits: u32, e4m3: bool) -> f64 {
    let sign = if bits >> (ebits + mbits) & 1 == 1 {
        -1.0
    } else {
        1.0
    };
    let e = (bits >> mbits) & ((1 << ebits) - 1);
    let m = bits & ((1 << mbits) - 1);
    let bias = (1i32 << (ebits - 1)) - 1;
    let emax = (1 << ebits) - 1;
    if e == emax && !e4m3 {
        return if m == 0 {
            sign * f64::INFINITY
        } else {
            f64::NAN
        };
    }
    if e4m3 && e == emax && m == (1 << mbits) - 1 {
        return f64::NAN;
    }
    let frac = m as f64 / (1u64 << mbits) as f64;
    if e == 0 {
        sign * frac * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + frac) * 2f64.powi(e as i32 - bias)
    }
}

fn is_float(t: ncclDataType_t) -> bool {
    t.is_float()
}

/// Element bits -> value (ints as i128-exact f64 would lose u64 range, so ints separately).
fn decode(t: ncclDataType_t, b: &[u8]) -> f64 {
    match t {
        ncclFloat16 => decode_small(u16::from_le_bytes([b[0], b[1]]) as u32, 5, 10, false),
        ncclBfloat16 => decode_small(u16::from_le_bytes([b[0], b[1]]) as u32, 8, 7, false),
        ncclFloat8e4m3 => decode_small(b[0] as u32, 4, 3, true),
        ncclFloat8e5m2 => decode_small(b[0] as u32, 5, 2, false),
        ncclFloat32 => f32::from_le_bytes(b[..4].try_into().unwrap()) as f64,
        ncclFloat64 => f64::from_le_bytes(b[..8].try_into().unwrap()),
        _ => int_of(t, b) as f64,
    }
}

fn int_of(t: ncclDataType_t, b: &[u8]) -> i128 {
    match t {
        ncclInt8 => b[0] as i8 as i128,
        ncclUint8 => b[0] as i128,
        ncclInt32 => i32::from_le_bytes(b[..4].try_into().unwrap()) as i128,
        ncclUint32 => u32::from_le_bytes(b[..4].try_into().unwrap()) as i128,
        ncclInt64 => i64::from_le_bytes(b[..8].try_into().unwrap()) as i128,
        ncclUint64 => u64::from_le_bytes(b[..8].try_into().unwrap()) as i128,
        _ => panic!("not an integer type"),
    }
}

/// Encode a value that the type represents exactly (the checks only use such values).
fn encode(t: ncclDataType_t, v: f64) -> Vec<u8> {
    let size = t.size();
    match t {
        ncclFloat32 => (v as f32).to_le_bytes().to_vec(),
        ncclFloat64 => v.to_le_bytes().to_vec(),
        ncclFloat16 | ncclBfloat16 | ncclFloat8e4m3 | ncclFloat8e5m2 => {
            let codes = 1u32 << (8 * size);
            let code = (0..codes)
                .find(|&c| decode(t, &c.to_le_bytes()[..size]) == v)
                .unwrap_or_else(|| panic!("{v} is not exact in {}", t.name()));
            code.to_le_bytes()[..size].to_vec()
        }
        _ => (v as i128).to_le_bytes()[..size].to_vec(),
    }
}

fn wrap_int(t: ncclDataType_t, v: i128) -> i128 {
    let b = v.to_le_bytes();
    int_of(t, &b[..t.size()])
}

// ---------------------------------------------------------------- device memory

struct DevBuf {
    ptr: u64,
    len: usize,
}

impl DevBuf {
    fn new(len: usize) -> Res<DevBuf> {
        let ptr = cuda::mem_alloc(len.max(1)).map_err(err)?;
        cuda::memset_zero(ptr, len.max(1)).map_err(err)?;
        Ok(DevBuf { ptr, len })
    }
    fn from(data: &[u8]) -> Res<DevBuf> {
        let b = DevBuf::new(data.len())?;
        cuda::copy_to_device(b.ptr, data).map_err(err)?;
        Ok(b)
    }
    fn read(&self) -> Res<Vec<u8>> {
        let mut v = vec![0u8; self.len];
        cuda::copy_from_device(&mut v, self.ptr).map_err(err)?;
        Ok(v)
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let _ = cuda::mem_free(self.ptr);
    }
}

/// Wait for the GPU with a deadline; a hang is reported and ends the program.
fn sync_or_die(what: &str, limit: Duration) -> Res<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let ctx = {
        let mut dev = 0;
        let _ = &mut dev;
        cuda::current_device().map_err(err)?
    };
    std::thread::spawn(move || {
        let r = cuda::use_device(ctx).and_then(|_| cuda::ctx_synchronize());
        let _ = tx.send(r);
    });
    match rx.recv_timeout(limit) {
        Ok(r) => r.map_err(err),
        Err(_) => {
            println!("FAIL  {what}: no completion after {limit:?} (deadlock or lost slot)");
            println!("0 passed, 1 failed (aborted on hang)");
            std::process::exit(3);
        }
    }
}

// ---------------------------------------------------------------- part 1: functors

const OPS: [(&str, u32); 6] = [
    ("sum", 0),
    ("prod", 1),
    ("max", 2),
    ("min", 3),
    ("avg", 4),
    ("premulsum", 5),
];

fn check_reduce(t: ncclDataType_t, op: u32, device_scalar: bool) -> Res<(usize, usize)> {
    let n = 1003usize; // 16-byte vectors plus a scalar tail
    let size = t.size();
    let unsigned = matches!(t, ncclUint8 | ncclUint32 | ncclUint64);
    let shift = if unsigned { 2.0 } else { 0.0 };
    let av: Vec<f64> = (0..n).map(|i| (i % 5) as f64 - 2.0 + shift).collect();
    let bv: Vec<f64> = (0..n)
        .map(|i| ((i * 3 + 1) % 5) as f64 - 2.0 + shift)
        .collect();
    let nranks = 2i32;
    let scalar_v = 2.0;
    let a: Vec<u8> = av.iter().flat_map(|&v| encode(t, v)).collect();
    let b: Vec<u8> = bv.iter().flat_map(|&v| encode(t, v)).collect();
    let da = DevBuf::from(&a)?;
    let db = DevBuf::from(&b)?;
    let dout = DevBuf::new(n * size)?;
    let sbytes = encode(t, scalar_v);
    let mut word = [0u8; 8];
    word[..size].copy_from_slice(&sbytes);
    let dscalar = DevBuf::from(&word)?;
    let (flags, scalar) = if device_scalar {
        (1u32, dscalar.ptr)
    } else {
        (0u32, u64::from_le_bytes(word))
    };
    use module::KernelArg::*;
    module::launch_args(
        module::kernel("ox_check_reduce").map_err(err)?,
        1,
        256,
        0,
        std::ptr::null_mut(),
        &[
            U64(da.ptr),
            U64(db.ptr),
            U64(dout.ptr),
            U64(n as u64),
            U32(t as u32),
            U32(op),
            U32(flags),
            U64(scalar),
            I32(nranks),
        ],
    )
    .map_err(err)?;
    sync_or_die("ox_check_reduce", Duration::from_secs(20))?;
    let out = dout.read()?;
    let mut bad = 0;
    for i in 0..n {
        let got_b = &out[i * size..(i + 1) * size];
        let ok = if is_float(t) {
            let (x, y) = match op {
                4 => (av[i] / nranks as f64, bv[i] / nranks as f64),
                5 => (av[i] * scalar_v, bv[i] * scalar_v),
                _ => (av[i], bv[i]),
            };
            let want = match op {
                1 => x * y,
                2 => x.max(y),
                3 => x.min(y),
                _ => x + y,
            };
            decode(t, got_b) == want
        } else {
            let (x, y) = (av[i] as i128, bv[i] as i128);
            let (x, y) = if op == 5 {
                (wrap_int(t, x * 2), wrap_int(t, y * 2))
            } else {
                (x, y)
            };
            let want = match op {
                1 => wrap_int(t, x * y),
                2 => x.max(y),
                3 => x.min(y),
                4 => wrap_int(t, x + y) / nranks as i128,
                _ => wrap_int(t, x + y),
            };
            int_of(t, got_b) == want
        };
        if !ok {
            if bad < 3 {
                println!(
                    "      {} {} element {i}: a={} b={} got {}",
                    t.name(),
                    OPS[op as usize].0,
                    av[i],
                    bv[i],
                    decode(t, got_b)
                );
            }
            bad += 1;
        }
    }
    Ok((n - bad, bad))
}

// ---------------------------------------------------------------- part 2: loopback ring

/// Connections of `nranks` simulated ranks, all in this GPU's memory.
struct Loopback {
    nranks: i32,
    nchannels: u32,
    conns: HashMap<(u32, i32, i32), (OxConn, OxConn)>, // (ch, src, dst) -> (sender's, receiver's)
    _mem: Vec<DevBuf>,
    abort: DevBuf,
    slot_bytes: u32,
    nslots: u32,
    /// The ring order, and its table when it is not rank order (one for all ranks).
    ring: RingOrder,
    ring_table: Option<DevBuf>,
    /// Run plans as yielding launches (`ox_kernel_yield`) whose every wait parks almost at
    /// once, relaunched until every CTA is done: the park and resume path on every step.
    yielding: bool,
}

impl Loopback {
    fn new(nranks: i32, nchannels: u32, slot_bytes: u32, nslots: u32) -> Res<Loopback> {
        Ok(Loopback {
            nranks,
            nchannels,
            conns: HashMap::new(),
            _mem: Vec::new(),
            // The whole status page: a parking CTA stores the bell at BELL_OFFSET.
            abort: DevBuf::new(STATUS_PAGE_BYTES as usize)?,
            slot_bytes,
            nslots,
            ring: RingOrder::identity(nranks),
            ring_table: None,
            yielding: false,
        })
    }

    /// Ranks on `hosts` (rank r on `hosts[r]`): rings in their order (`RingOrder::by_host`).
    fn on_hosts(hosts: &[u64], nchannels: u32, slot_bytes: u32, nslots: u32) -> Res<Loopback> {
        let mut lb = Loopback::new(hosts.len() as i32, nchannels, slot_bytes, nslots)?;
        lb.ring = RingOrder::by_host(hosts);
        if !lb.ring.is_identity() {
            lb.ring_table = Some(DevBuf::from(&ring_table_bytes(lb.ring.ranks()))?);
        }
        Ok(lb)
    }

    fn connect(&mut self, ch: u32, src: i32, dst: i32) -> Res<()> {
        if self.conns.contains_key(&(ch, src, dst)) {
            return Ok(());
        }
        let buf = DevBuf::new(self.slot_bytes as usize * self.nslots as usize)?;
        let counters = DevBuf::new(32)?; // tail, head, sender step, receiver step
        let c = counters.ptr;
        let half = |step| OxConn {
            buf: buf.ptr,
            tail: c,
            head: c + 8,
            step,
            slot_bytes: self.slot_bytes,
            nslots: self.nslots,
        };
        self.conns
            .insert((ch, src, dst), (half(c + 16), half(c + 24)));
        self._mem.push(buf);
        self._mem.push(counters);
        Ok(())
    }

    fn geometry(&mut self, rank: i32, tasks: &[Task]) -> Res<Geometry> {
        let rows = conn_channels(self.nchannels) as usize;
        let n = self.nranks as usize;
        let mut g = Geometry {
            rank,
            nranks: self.nranks,
            nchannels: self.nchannels,
            send: vec![vec![None; n]; rows],
            recv: vec![vec![None; n]; rows],
            recv_gpu: Default::default(),
            send_gpu: Default::default(),
            abort_flag: self.abort.ptr,
            threads: 0,
            net: None,
            ring: self.ring.clone(),
            ring_table: self.ring_table.as_ref().map_or(0, |t| t.ptr),
            park: vec![self.yielding; self.nranks as usize],
            tuner: None,
        };
        let needed = connections_needed(
            rank,
            self.nranks,
            self.nchannels,
            None,
            &self.ring,
            None,
            tasks,
        );
        for (ch, peer, dir) in needed {
            let (src, dst) = match dir {
                Dir::Send => (rank, peer),
                Dir::Recv => (peer, rank),
            };
            self.connect(ch, src, dst)?;
            let (s, r) = self.conns[&(ch, src, dst)];
            match dir {
                Dir::Send => g.send[ch as usize][peer as usize] = Some(s),
                Dir::Recv => g.recv[ch as usize][peer as usize] = Some(r),
            }
        }
        Ok(g)
    }

    /// Plan every rank's group, run all of them in ONE launch; returns the seconds it took.
    fn run(&mut self, groups: &[Vec<Task>], what: &str) -> Res<f64> {
        let mut all = Vec::new();
        let mut offset = 0u32;
        let mut block = cost::BLOCK_THREADS;
        for (rank, tasks) in groups.iter().enumerate() {
            let g = self.geometry(rank as i32, tasks)?;
            let p = plan(&g, tasks).map_err(err)?;
            block = p.block;
            // The copy-engine copies beside the kernel (an all-gather's own block), done
            // first: they touch no connection.
            for c in &p.copies {
                cuda::memcpy_dtod_async(c.dst, c.src, c.bytes as usize, std::ptr::null_mut())
                    .map_err(err)?;
            }
            for mut w in deserialize_all(&p.items) {
                w.cta += offset;
                all.push(w);
            }
            offset += p.grid;
        }
        let mut bytes = Vec::new();
        for w in &all {
            w.serialize_into(&mut bytes);
        }
        // ox_kernel reads each CTA's range from the table after the items.
        if self.yielding {
            return self.run_yielding(&all, offset, block, what);
        }
        let items = DevBuf::from(&with_cta_table(&bytes, offset))?;
        let start = Instant::now();
        module::launch(
            module::kernel(module::MAIN_KERNEL).map_err(err)?,
            offset,
            block,
            0,
            std::ptr::null_mut(),
            items.ptr,
            all.len() as u32,
        )
        .map_err(err)?;
        sync_or_die(what, Duration::from_secs(30))?;
        Ok(start.elapsed().as_secs_f64())
    }
}

impl Loopback {
    /// Run `all` (every rank's items, CTAs offset) as one yielding launch of `grid` CTAs:
    /// the first kernel, then resumes until every CTA's record says done (the last allowed
    /// one never parks). Only the LL receive waits do not park: they wait for the receive
    /// `tail`, which only a network proxy advances for LL steps.
    fn run_yielding(&mut self, all: &[OxWork], grid: u32, block: u32, what: &str) -> Res<f64> {
        const MAX_KERNELS: u32 = 20_000;
        let mut bytes = Vec::new();
        for w in all {
            let mut w = *w;
            if w.flags & FLAG_LL != 0 {
                w.flags &= !FLAG_PARK_RECV;
            }
            w.serialize_into(&mut bytes);
        }
        let input = yield_input(&bytes, grid);
        let records_at = input.len() - 8 * grid as usize;
        let items = DevBuf::from(&input)?;
        let start = Instant::now();
        let mut parks = 0u64;
        for k in 0..MAX_KERNELS {
            let mode = match k {
                0 => YIELD_FRESH,
                k if k + 1 == MAX_KERNELS => YIELD_LAST,
                _ => YIELD_RESUME,
            };
            module::launch_args(
                module::kernel(module::YIELD_KERNEL).map_err(err)?,
                grid,
                block,
                0,
                std::ptr::null_mut(),
                &[
                    module::KernelArg::U64(items.ptr),
                    module::KernelArg::U32(all.len() as u32),
                    module::KernelArg::U32(mode),
                    module::KernelArg::U32(1),
                ],
            )
            .map_err(err)?;
            sync_or_die(what, Duration::from_secs(30))?;
            let records = items.read()?;
            let parked = records[records_at..]
                .chunks_exact(8)
                .filter(|r| u32::from_le_bytes(r[..4].try_into().unwrap()) != RESUME_DONE_ITEM)
                .count();
            if parked == 0 {
                PARKS.with(|p| p.set(p.get() + parks));
                return Ok(start.elapsed().as_secs_f64());
            }
            parks += parked as u64;
        }
        Err(format!(
            "{what}: CTAs still parked after {MAX_KERNELS} kernels"
        ))
    }
}

thread_local! {
    /// CTAs parked in yielding loopback runs (how much the resume path was exercised).
    static PARKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// One loopback collective, checked against a host reference (float values are small
/// integers, so every order of summation is exact).
fn check_collective(
    lb: &mut Loopback,
    kind: CollKind,
    t: ncclDataType_t,
    op: RedOp,
    count: usize,
    in_place: bool,
    root: i32,
) -> Res<bool> {
    let n = lb.nranks as usize;
    let size = t.size();
    let (in_len, out_len) = match kind {
        CollKind::AllGather | CollKind::Gather => (count, count * n),
        CollKind::ReduceScatter | CollKind::Scatter => (count * n, count),
        CollKind::AlltoAll => (count * n, count * n),
        _ => (count, count),
    };
    let value = |r: usize, i: usize| ((r * 7 + i * 3) % 9) as f64 - 4.0;
    let mut bufs = Vec::new();
    let mut groups = Vec::new();
    for r in 0..n {
        let input: Vec<u8> = (0..in_len).flat_map(|i| encode(t, value(r, i))).collect();
        let recv = DevBuf::new(out_len.max(in_len) * size + 64)?;
        let (send_ptr, recv_ptr, send) = if in_place {
            let off = match kind {
                CollKind::AllGather => r * count * size,
                _ => 0,
            };
            cuda::copy_to_device(recv.ptr + off as u64, &input).map_err(err)?;
            let recv_ptr = match kind {
                CollKind::ReduceScatter => recv.ptr + (r * count * size) as u64,
                _ => recv.ptr,
            };
            (recv.ptr + off as u64, recv_ptr, None)
        } else {
            let s = DevBuf::from(&input)?;
            (s.ptr, recv.ptr, Some(s))
        };
        let task = Task {
            kind,
            dtype: t,
            op,
            count,
            sendbuff: send_ptr,
            recvbuff: recv_ptr,
            root,
            opts: Default::default(),
            weights_epoch: 0,
        };
        groups.push(if kind == CollKind::Send {
            vec![
                Task {
                    root: ((r + 1) % n) as i32,
                    ..task
                },
                Task {
                    kind: CollKind::Recv,
                    root: ((r + n - 1) % n) as i32,
                    ..task
                },
            ]
        } else {
            vec![task]
        });
        bufs.push((recv, recv_ptr, send));
    }
    lb.run(&groups, &format!("{kind:?} {}", t.name()))?;
    let reduce = |i: &dyn Fn(usize) -> f64| -> f64 {
        let vals: Vec<f64> = (0..n).map(i).collect();
        match op {
            RedOp::Max => vals.iter().cloned().fold(f64::MIN, f64::max),
            RedOp::Min => vals.iter().cloned().fold(f64::MAX, f64::min),
            RedOp::Prod => vals.iter().product(),
            _ => vals.iter().sum(),
        }
    };
    let mut ok = true;
    for (r, (recv, recv_ptr, _)) in bufs.iter().enumerate() {
        let all = recv.read()?;
        let base = (recv_ptr - recv.ptr) as usize;
        for i in 0..out_len {
            let want = match kind {
                CollKind::AllReduce => Some(reduce(&|q| value(q, i))),
                CollKind::Reduce => (r as i32 == root).then(|| reduce(&|q| value(q, i))),
                CollKind::Broadcast => Some(value(root as usize, i)),
                CollKind::AllGather => Some(value(i / count, i % count)),
                CollKind::ReduceScatter => Some(reduce(&|q| value(q, r * count + i))),
                CollKind::AlltoAll => Some(value(i / count, r * count + i % count)),
                CollKind::Gather => (r as i32 == root).then(|| value(i / count, i % count)),
                CollKind::Scatter => Some(value(root as usize, r * count + i)),
                CollKind::Send => Some(value((r + n - 1) % n, i)),
                CollKind::Recv => None,
            };
            let got = decode(t, &all[base + i * size..base + (i + 1) * size]);
            if let Some(w) = want {
                if got != w {
                    if ok {
                        println!("      rank {r} element {i}: got {got}, want {w}");
                    }
                    ok = false;
                }
            }
        }
    }
    Ok(ok)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let yielding_only = args.iter().any(|a| a == "--yielding-only");
    let dev: i32 = args.iter().find_map(|a| a.parse().ok()).unwrap_or(0);
    let result = if yielding_only {
        yielding_only_run(dev)
    } else {
        run_all(dev, quick)
    };
    match result {
        Ok((pass, fail)) => {
            println!("{pass} passed, {fail} failed");
            std::process::exit(if fail == 0 { 0 } else { 1 });
        }
        Err(e) => {
            println!("error: {e}");
            std::process::exit(2);
        }
    }
}

/// The yielding loopback: every collective's steps park and resume (`Loopback::yielding`);
/// (name, ok, note) per case.
fn check_yielding() -> Res<Vec<(String, bool, String)>> {
    let mut out = Vec::new();
    println!("-- loopback, yielding: every wait parks at once, resumed until every CTA is done");
    for nranks in [2, 3] {
        let mut lb = Loopback::new(nranks, 2, cost::SLOT_BYTES, 4)?;
        lb.yielding = true;
        for kind in CollKind::RINGS {
            for count in [1usize, 1001, 1 << 18] {
                for in_place in [false, true] {
                    let before = PARKS.with(|p| p.get());
                    let root = nranks - 1;
                    let ok = check_collective(
                        &mut lb,
                        kind,
                        ncclFloat32,
                        RedOp::Sum,
                        count,
                        in_place,
                        root,
                    )?;
                    let parks = PARKS.with(|p| p.get()) - before;
                    out.push((
                        format!(
                            "{kind:?} n={nranks} float Sum count={count}{} yielding",
                            if in_place { " in-place" } else { "" }
                        ),
                        ok,
                        format!("{parks} parks"),
                    ));
                }
            }
        }
    }
    Ok(out)
}

/// `--yielding-only`: the yielding loopback alone.
fn yielding_only_run(dev: i32) -> Res<(usize, usize)> {
    cuda::use_device(dev).map_err(err)?;
    module::module().map_err(err)?;
    let (mut pass, mut fail) = (0usize, 0usize);
    for (name, ok, note) in check_yielding()? {
        println!("{}  {name:<44} {note}", if ok { "ok  " } else { "FAIL" });
        if ok {
            pass += 1
        } else {
            fail += 1
        }
    }
    Ok((pass, fail))
}

fn run_all(dev: i32, quick: bool) -> Res<(usize, usize)> {
    cuda::use_device(dev).map_err(err)?;
    module::module().map_err(err)?;
    println!(
        "device {dev}: fatbin {} bytes loaded; kernels ox_kernel, ox_check_reduce",
        module::FATBIN.len()
    );
    let (mut pass, mut fail) = (0usize, 0usize);
    let mut tally = |name: String, ok: bool, note: String| {
        println!("{}  {name:<44} {note}", if ok { "ok  " } else { "FAIL" });
        if ok {
            pass += 1
        } else {
            fail += 1
        }
    };

    println!("-- reduction functors (ox_check_reduce, 1003 elements: vector path + tail)");
    for t in ncclDataType_t::ALL {
        for (name, op) in OPS {
            for device_scalar in [false, true] {
                if device_scalar && op != 5 {
                    continue;
                }
                let label = format!(
                    "{} {name}{}",
                    t.name(),
                    if device_scalar {
                        " (device scalar)"
                    } else {
                        ""
                    }
                );
                let (good, bad) = check_reduce(t, op, device_scalar)?;
                tally(label, bad == 0, format!("{good}/{} elements", good + bad));
            }
        }
    }

    println!("-- loopback: simulated ranks on one GPU, one launch of ox_kernel per group");
    let kinds = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AlltoAll,
        CollKind::Gather,
        CollKind::Scatter,
        CollKind::Send,
    ];
    let rank_counts: &[i32] = if quick { &[2] } else { &[1, 2, 3, 4] };
    for &nranks in rank_counts {
        let mut lb = Loopback::new(nranks, 4, cost::SLOT_BYTES, 4)?;
        for kind in kinds {
            for (t, op) in [
                (ncclFloat32, RedOp::Sum),
                (ncclInt32, RedOp::Max),
                (ncclFloat16, RedOp::Sum),
                (ncclInt8, RedOp::Min),
            ] {
                for count in [1usize, 1001, 1 << 20] {
                    for in_place in [false, true] {
                        if in_place
                            && matches!(
                                kind,
                                CollKind::AlltoAll
                                    | CollKind::Gather
                                    | CollKind::Scatter
                                    | CollKind::Send
                            )
                        {
                            continue;
                        }
                        let root = nranks - 1;
                        let ok = check_collective(&mut lb, kind, t, op, count, in_place, root)?;
                        tally(
                            format!(
                                "{kind:?} n={nranks} {} {op:?} count={count}{}",
                                t.name(),
                                if in_place { " in-place" } else { "" }
                            ),
                            ok,
                            String::new(),
                        );
                    }
                }
            }
        }
    }
    // Avg and PreMulSum through the ring (exact: values are multiples of 1/nranks).
    let mut lb = Loopback::new(2, 4, cost::SLOT_BYTES, 4)?;
    let two = Scalar::Host(encode_word(ncclFloat32, 1.0));
    for op in [RedOp::Avg, RedOp::PreMulSum(two)] {
        let ok = check_collective(
            &mut lb,
            CollKind::AllReduce,
            ncclFloat32,
            op,
            4097,
            false,
            1,
        )?;
        tally(format!("AllReduce n=2 float {op:?}"), ok, String::new());
    }

    for (name, ok, note) in check_yielding()? {
        tally(name, ok, note);
    }

    println!("-- loopback on rings not in rank order (interleaved hosts, the ring table)");
    let host_sets: &[&[u64]] = if quick {
        &[&[0, 1, 0, 1]]
    } else {
        &[&[0, 1, 0, 1], &[0, 1, 2, 0, 1, 2], &[5, 7, 7, 5, 2]]
    };
    for &hosts in host_sets {
        let mut lb = Loopback::on_hosts(hosts, 4, cost::SLOT_BYTES, 4)?;
        let n = hosts.len() as i32;
        let order = format!("{:?}", lb.ring.ranks());
        for kind in CollKind::RINGS {
            let roots = if kind.has_root() { 0..n } else { 0..1 };
            for root in roots {
                let mut types = vec![(ncclFloat32, RedOp::Sum), (ncclInt8, RedOp::Min)];
                if kind == CollKind::ReduceScatter {
                    // The ring table's item field is not the PreMulSum scalar's.
                    types.push((ncclFloat32, RedOp::PreMulSum(two)));
                }
                for (t, op) in types {
                    for count in [1usize, 1001, 1 << 18] {
                        for in_place in [false, true] {
                            let ok = check_collective(&mut lb, kind, t, op, count, in_place, root)?;
                            tally(
                                format!(
                                    "{kind:?} ring {order}{} {} {op:?} count={count}{}",
                                    if kind.has_root() {
                                        format!(" root={root}")
                                    } else {
                                        String::new()
                                    },
                                    t.name(),
                                    if in_place { " in-place" } else { "" }
                                ),
                                ok,
                                String::new(),
                            );
                        }
                    }
                }
            }
        }
    }

    println!("-- loopback bandwidth (informational: 2 ranks share ONE GPU's HBM and SMs)");
    for nranks in [2, 4] {
        let mut lb = Loopback::new(nranks, 8, cost::SLOT_BYTES, cost::NSLOTS)?;
        let count = 64usize << 20; // 256 MiB of float
        let mut bufs = Vec::new();
        let mut groups = Vec::new();
        for _ in 0..nranks {
            let b = DevBuf::new(count * 4)?;
            groups.push(vec![Task {
                kind: CollKind::AllReduce,
                dtype: ncclFloat32,
                op: RedOp::Sum,
                count,
                sendbuff: b.ptr,
                recvbuff: b.ptr,
                root: 0,
                opts: Default::default(),
                weights_epoch: 0,
            }]);
            bufs.push(b);
        }
        lb.run(&groups, "bandwidth warm-up")?;
        let secs = lb.run(&groups, "bandwidth")?;
        let algbw = (count * 4) as f64 / secs / 1e9;
        println!(
            "      AllReduce 256 MiB, {nranks} ranks on one GPU, 8 channels: {:.0} us, algbw {algbw:.1} GB/s, busbw {:.1} GB/s",
            secs * 1e6,
            algbw * 2.0 * (nranks - 1) as f64 / nranks as f64
        );
    }
    Ok((pass, fail))
}

fn encode_word(t: ncclDataType_t, v: f64) -> [u8; 8] {
    let mut w = [0u8; 8];
    let b = encode(t, v);
    w[..b.len()].copy_from_slice(&b);
    w
}
