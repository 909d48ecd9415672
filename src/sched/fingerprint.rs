//! Test-only safety net for refactors of the planner: plans a broad grid of task groups
//! (every collective kind, several dtypes and ops, in and out of place, 1 to 8 ranks, sizes
//! from 0 to 16 Mi elements, first and last root, forced protocols, with and without the
//! one-shot all-reduce, several channel counts and slot sizes, mixed groups and invalid
//! input) on every rank, hashes everything the planner returns (items, copies, connections
//! needed, grid, block, errors) and compares one hash per case with the committed table
//! `plan_fingerprints.txt`. A refactor that changes any plan fails here.
//!
//! Regenerate the table (only for a deliberate change of plans) with
//! `OXCCL_BLESS_PLANS=1 cargo test --lib plan_fingerprints`.

use super::cost::{self, Algorithms, Protocols};
use super::device::OxConn;
use super::plan::{conn_channels, connections_needed, is_direct_row, plan, Dir, Geometry};
use super::redop::{RedOp, Scalar};
use super::relocate;
use super::ring::RingOrder;
use super::{CollKind, Task};
use crate::abi::ncclDataType_t;
use std::fmt::Write as _;

const TABLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/sched/plan_fingerprints.txt"
);

/// A 64-bit FNV-1a style hash over words (stable across Rust releases, unlike `DefaultHasher`).
struct Fnv(u64);

impl Fnv {
    fn word(&mut self, w: u64) {
        self.0 = (self.0 ^ w).wrapping_mul(0x0000_0100_0000_01b3);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.word(b.len() as u64);
        for c in b.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.word(u64::from_le_bytes(w));
        }
    }
}

const COUNTS: [usize; 7] = [0, 1, 12, 1028, 65540, (1 << 20) + 4, (16 << 20) + 4];

fn dtype_ops() -> [(ncclDataType_t, RedOp); 6] {
    use ncclDataType_t::*;
    [
        (ncclInt8, RedOp::Sum),
        (ncclFloat16, RedOp::Max),
        (ncclFloat32, RedOp::Avg),
        (
            ncclFloat32,
            RedOp::PreMulSum(Scalar::Host(7u64.to_le_bytes())),
        ),
        (ncclFloat64, RedOp::PreMulSum(Scalar::Device(0xD00D_0000))),
        (ncclBfloat16, RedOp::Sum),
    ]
}

/// The buffers of `rank` for a task of `kind` with `bytes` per block, in place or not (NCCL's
/// in-place conventions: AllGather sends from its own block, ReduceScatter receives into it).
fn buffers(kind: CollKind, rank: i32, bytes: u64, in_place: bool) -> (u64, u64) {
    let send = 0x10_0000_0000u64 * (rank as u64 + 1);
    if !in_place {
        return (send, send + 0x8_0000_0000);
    }
    match kind {
        CollKind::AllGather => (send + rank as u64 * bytes, send),
        CollKind::ReduceScatter => (send, send + rank as u64 * bytes),
        _ => (send, send),
    }
}

/// A geometry with every connection present, at addresses that name (row, peer, direction).
fn geometry(rank: i32, nranks: i32, nchannels: u32, slot_bytes: u32, threads: u32) -> Geometry {
    let rows = conn_channels(nchannels);
    let table = |dir: u64| {
        (0..rows)
            .map(|ch| {
                (0..nranks)
                    .map(|peer| {
                        let base = 0x7000_0000_0000u64
                            + (((ch as u64) << 20) + ((peer as u64) << 8) + (dir << 4)) * 8;
                        let (slot_bytes, nslots) = if is_direct_row(nchannels, ch) {
                            (cost::DIRECT_SLOT_BYTES, cost::DIRECT_NSLOTS)
                        } else {
                            (slot_bytes, cost::NSLOTS)
                        };
                        Some(OxConn {
                            buf: base,
                            tail: base + 1,
                            head: base + 2,
                            step: base + 3,
                            slot_bytes,
                            nslots,
                        })
                    })
                    .collect()
            })
            .collect()
    };
    Geometry {
        rank,
        nranks,
        nchannels,
        send: table(1),
        recv: table(2),
        recv_gpu: Default::default(),
        send_gpu: Default::default(),
        abort_flag: 0xAB0,
        threads,
        net: None,
        ring: RingOrder::identity(nranks),
        ring_table: 0,
        park: Vec::new(),
        tuner: None,
    }
}

/// The knobs of one case besides its tasks, and the geometry of every rank.
struct Setup {
    geoms: Vec<Geometry>,
    nranks: i32,
    nchannels: u32,
    slot_bytes: u32,
    protocols: Protocols,
    algorithms: Algorithms,
}

/// Hash everything the planner says for every rank of `setup` with `tasks_of(rank)`.
fn hash_case(h: &mut Fnv, s: &Setup, tasks_of: &dyn Fn(i32) -> Vec<Task>) {
    cost::TEST_PROTOCOLS.with(|t| t.set(Some(s.protocols)));
    cost::TEST_ALGORITHMS.with(|t| t.set(Some(s.algorithms)));
    for rank in 0..s.nranks {
        let tasks = tasks_of(rank);
        let ring = RingOrder::identity(s.nranks);
        for (ch, peer, dir) in
            connections_needed(rank, s.nranks, s.nchannels, None, &ring, None, &tasks)
        {
            h.word(((ch as u64) << 40) | ((peer as u64) << 8) | (dir == Dir::Recv) as u64);
        }
        let planned = plan(&s.geoms[rank as usize], &tasks);
        if let Ok(p) = &planned {
            check_relocation(&s.geoms[rank as usize], s.nranks, &tasks, p);
        }
        match planned {
            Ok(p) => {
                h.bytes(p.kernel.as_bytes());
                h.word(((p.grid as u64) << 32) | p.block as u64);
                h.word(((p.smem as u64) << 32) | p.nitems as u64);
                h.bytes(&p.items);
                for c in &p.copies {
                    h.word(c.dst);
                    h.word(c.src);
                    h.word(c.bytes);
                }
                h.word(p.copies.len() as u64);
            }
            Err(e) => {
                h.word(0xE7707 ^ e.code as u64);
                h.bytes(e.msg.as_bytes());
            }
        }
    }
    cost::TEST_PROTOCOLS.with(|t| t.set(None));
    cost::TEST_ALGORITHMS.with(|t| t.set(None));
}

/// The plan cache's promise (`relocate`): the same tasks with their buffer segments moved
/// elsewhere (each by its own distance) have the same key, and their plan is `planned` moved.
fn check_relocation(geom: &Geometry, nranks: i32, tasks: &[Task], planned: &super::plan::Plan) {
    let (key, segments) = relocate::layout(tasks, nranks).expect("encodable layout");
    let moved_to = |addr: u64| {
        let i = segments
            .iter()
            .position(|s| s.base <= addr && addr <= s.end)
            .expect("every buffer lies in a segment");
        addr + ((i as u64 + 1) << 44) + 0x40 * i as u64
    };
    let moved: Vec<Task> = tasks
        .iter()
        .map(|t| Task {
            sendbuff: moved_to(t.sendbuff),
            recvbuff: moved_to(t.recvbuff),
            ..*t
        })
        .collect();
    let (moved_key, moved_segments) = relocate::layout(&moved, nranks).expect("encodable");
    assert_eq!(
        key, moved_key,
        "moving the buffers changed the key of {tasks:?}"
    );
    let to = relocate::bases(&moved_segments);
    let mv = relocate::Move {
        from: &segments,
        to: &to,
    };
    let relocated = relocate::relocate(planned, &mv)
        .unwrap_or_else(|| panic!("a plan with an address from no buffer: {tasks:?}"));
    let fresh = plan(geom, &moved).expect("the moved tasks plan as the tasks did");
    assert_eq!(
        relocated, fresh,
        "moved plan differs from a fresh one for {tasks:?}"
    );
}

fn task(kind: CollKind, dtype: ncclDataType_t, op: RedOp, count: usize, bufs: (u64, u64)) -> Task {
    Task {
        kind,
        dtype,
        op,
        count,
        sendbuff: bufs.0,
        recvbuff: bufs.1,
        root: 0,
        opts: Default::default(),
        weights_epoch: 0,
    }
}

/// Every single-task variation of `kind` (dtype/op, count, place, root) on `nranks`.
fn single_task_hash(h: &mut Fnv, kind: CollKind, s: &Setup) {
    let rooted = kind.has_root();
    let roots = if s.nranks > 1 && rooted {
        vec![0, s.nranks - 1]
    } else {
        vec![0]
    };
    let reduction = matches!(
        kind,
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
    );
    let combos = dtype_ops();
    for &(dtype, op) in &combos[..if reduction { 6 } else { 3 }] {
        for count in COUNTS {
            for in_place in [false, true] {
                for &root in &roots {
                    hash_case(h, s, &|rank| {
                        let bytes = (count * dtype.size()) as u64;
                        let bufs = buffers(kind, rank, bytes, in_place);
                        let mut t = task(kind, dtype, op, count, bufs);
                        t.root = root;
                        vec![t]
                    });
                }
            }
        }
    }
}

/// A mixed group per rank: collectives, a ring of sends and receives, a self send/recv pair,
/// an all-to-all, so that keys, CTA folding and self-copy pairing all take part.
fn mixed_group(rank: i32, nranks: i32, count: usize) -> Vec<Task> {
    use ncclDataType_t::*;
    let bufs = |i: u64| buffers(CollKind::AllReduce, rank, 0, false).0 + i * 0x1_0000_0000;
    let pair = |i: u64| (bufs(i), bufs(i) + 0x8000_0000);
    let mut v = vec![
        task(CollKind::AllReduce, ncclFloat32, RedOp::Sum, count, pair(0)),
        task(CollKind::AllGather, ncclInt8, RedOp::Sum, count, pair(1)),
    ];
    let mut send = task(CollKind::Send, ncclFloat32, RedOp::Sum, count, pair(2));
    send.root = (rank + 1) % nranks;
    let mut recv = task(CollKind::Recv, ncclFloat32, RedOp::Sum, count, pair(3));
    recv.root = (rank + nranks - 1) % nranks;
    let mut self_send = task(CollKind::Send, ncclInt32, RedOp::Sum, count, pair(4));
    self_send.root = rank;
    let mut self_recv = task(CollKind::Recv, ncclInt32, RedOp::Sum, count, pair(5));
    self_recv.root = rank;
    v.extend([send, recv, self_send, self_recv]);
    v.push(task(
        CollKind::AlltoAll,
        ncclFloat64,
        RedOp::Sum,
        count / 3,
        pair(6),
    ));
    v.push(task(
        CollKind::ReduceScatter,
        ncclInt8,
        RedOp::Max,
        count,
        pair(7),
    ));
    v
}

/// Groups the planner must refuse, and geometry it must refuse.
fn invalid_hash(h: &mut Fnv, s: &Setup) {
    use ncclDataType_t::*;
    let n = s.nranks;
    let bad_root = |kind: CollKind| {
        move |rank| {
            let mut t = task(
                kind,
                ncclFloat32,
                RedOp::Sum,
                100,
                buffers(kind, rank, 400, false),
            );
            t.root = n;
            vec![t]
        }
    };
    for kind in CollKind::ALL {
        hash_case(h, s, &bad_root(kind));
    }
    // A send to self without its receive, and one with a receive of another size.
    hash_case(h, s, &|rank| {
        let mut t = task(CollKind::Send, ncclInt8, RedOp::Sum, 10, (1, 2));
        t.root = rank;
        vec![t]
    });
    hash_case(h, s, &|rank| {
        let mut a = task(CollKind::Send, ncclInt8, RedOp::Sum, 10, (1, 2));
        a.root = rank;
        let mut b = task(CollKind::Recv, ncclInt8, RedOp::Sum, 11, (3, 4));
        b.root = rank;
        vec![a, b]
    });
    for (rank, nranks, nchannels) in [(n, n, 4), (-1, n, 4), (0, 0, 4), (0, n, 0), (0, n, 65)] {
        let t = task(CollKind::AllReduce, ncclFloat32, RedOp::Sum, 8, (1, 2));
        cost::TEST_PROTOCOLS.with(|p| p.set(Some(s.protocols)));
        let geom = geometry(
            rank.max(0),
            nranks.max(1),
            nchannels.max(1),
            s.slot_bytes,
            0,
        );
        let geom = Geometry {
            rank,
            nranks,
            nchannels,
            ..geom
        };
        let ring = RingOrder::identity(nranks);
        h.word(connections_needed(rank, nranks, nchannels, None, &ring, None, &[t]).len() as u64);
        match plan(&geom, &[t]) {
            Ok(p) => h.bytes(&p.items),
            Err(e) => h.bytes(e.msg.as_bytes()),
        }
        cost::TEST_PROTOCOLS.with(|p| p.set(None));
    }
}

/// Every case of the grid, as (name, hash).
fn fingerprints() -> Vec<(String, u64)> {
    let protocols = [
        ("both", cost::parse_protocols("")),
        ("simple", cost::parse_protocols("Simple")),
        ("ll", cost::parse_protocols("LL")),
    ];
    let mut out = Vec::new();
    for nranks in [1, 2, 3, 4, 8] {
        for nchannels in [1, 3, 64] {
            for (slot_name, slot_bytes) in [("512k", cost::SLOT_BYTES), ("64k", 64 << 10)] {
                if (nchannels == 3) != (slot_bytes != cost::SLOT_BYTES) {
                    continue;
                }
                for (pname, p) in protocols {
                    for one_shot in [true, false] {
                        let threads = if one_shot { 0 } else { 256 };
                        let s = Setup {
                            geoms: (0..nranks)
                                .map(|r| geometry(r, nranks, nchannels, slot_bytes, threads))
                                .collect(),
                            nranks,
                            nchannels,
                            slot_bytes,
                            protocols: p,
                            algorithms: Algorithms { one_shot },
                        };
                        let name = |what: &str| {
                            format!(
                                "n{nranks} ch{nchannels} slot{slot_name} {pname} \
                                 oneshot{} {what}",
                                one_shot as u8
                            )
                        };
                        for kind in CollKind::ALL {
                            // The one-shot switch only matters to all-reduce.
                            if !one_shot && kind != CollKind::AllReduce {
                                continue;
                            }
                            let mut h = Fnv(0xcbf2_9ce4_8422_2325);
                            single_task_hash(&mut h, kind, &s);
                            out.push((name(kind.name()), h.0));
                        }
                        let mut h = Fnv(0xcbf2_9ce4_8422_2325);
                        for count in COUNTS {
                            hash_case(&mut h, &s, &|rank| mixed_group(rank, nranks, count));
                        }
                        out.push((name("mixed"), h.0));
                        let mut h = Fnv(0xcbf2_9ce4_8422_2325);
                        invalid_hash(&mut h, &s);
                        out.push((name("invalid"), h.0));
                    }
                }
            }
        }
    }
    out
}

#[test]
fn plan_fingerprints() {
    let got = fingerprints();
    let mut text = String::new();
    for (name, hash) in &got {
        writeln!(text, "{name}: {hash:016x}").unwrap();
    }
    if std::env::var_os("OXCCL_BLESS_PLANS").is_some() {
        std::fs::write(TABLE, &text).expect("write the plan fingerprint table");
        return;
    }
    let want = std::fs::read_to_string(TABLE).expect("plan_fingerprints.txt (bless it first)");
    let mut bad = Vec::new();
    let want_lines: Vec<&str> = want.lines().collect();
    let got_lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        want_lines.len(),
        got_lines.len(),
        "number of fingerprinted cases changed"
    );
    for (w, g) in want_lines.iter().zip(&got_lines) {
        if w != g {
            bad.push(format!("want {w}\n got {g}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} plan fingerprints changed:\n{}",
        bad.len(),
        got.len(),
        bad[..bad.len().min(20)].join("\n")
    );
}

/// The items of a 1 MiB float sum of `kind` planned on `geom`.
fn items_of(geom: &Geometry, kind: CollKind) -> Vec<super::device::OxWork> {
    use super::device::{OxWork, WORK_SIZE};
    let t = task(
        kind,
        ncclDataType_t::ncclFloat32,
        RedOp::Sum,
        1 << 20,
        (0x1000_0000, 0x2000_0000),
    );
    let p = plan(geom, &[t]).unwrap();
    p.items.chunks(WORK_SIZE).map(OxWork::deserialize).collect()
}

#[test]
fn only_items_of_connections_in_gpu_memory_carry_the_gpu_flags() {
    use super::device::{FLAG_RECV_GPU, FLAG_SEND_GPU};
    // A receive connection on channel 0, a send connection on channel 1.
    let mut geom = geometry(0, 2, 2, 1 << 17, 512);
    let recv_buf = geom.recv[0][1].unwrap().buf;
    let send_buf = geom.send[1][1].unwrap().buf;
    geom.recv_gpu.insert((0, 1));
    geom.send_gpu.insert((1, 1));
    for kind in [CollKind::AllReduce, CollKind::AllGather] {
        let items = items_of(&geom, kind);
        assert!(items.iter().any(|w| w.recv.buf == recv_buf), "{kind:?}");
        assert!(items.iter().any(|w| w.send.buf == send_buf), "{kind:?}");
        for w in &items {
            let (recv_gpu, send_gpu) = (w.flags & FLAG_RECV_GPU != 0, w.flags & FLAG_SEND_GPU != 0);
            assert_eq!(
                recv_gpu,
                w.recv.buf == recv_buf,
                "{kind:?}: receiving {:#x}",
                w.recv.buf
            );
            assert_eq!(
                send_gpu,
                w.send.buf == send_buf,
                "{kind:?}: sending {:#x}",
                w.send.buf
            );
        }
    }
}
