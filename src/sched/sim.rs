//! Test-only simulator of `ox_kernel`: runs the plans of several ranks through a Rust mirror
//! of the step sequences in `kernels/collectives.cuh`, over connections modelled as the device
//! sees them (a staging buffer of `nslots` slots, each with a Simple and an LL region, and
//! `tail`/`head` counters), with CTAs that each run their items in order. Simple steps wait for
//! `tail`; LL steps write {4 bytes, epoch} words and the receiver waits until every word it
//! needs carries the step's epoch; both wait `head` for a free slot. Buffers and positions
//! persist over launches, so stale words of earlier uses are present as on the device. It
//! checks the data against references, that both ends agree on every step's byte count and
//! protocol, that both ends of every connection end at the same position, and that nothing
//! deadlocks.

use super::cost::Algorithms;
use super::device::{
    deserialize_all, ll_step_bytes, op, ring_table_bytes, simple_step_bytes, OxConn, OxWork,
    WorkKind, FLAG_LL, FLAG_OPS, FLAG_OWN_BLOCK, FLAG_RING_ORDER,
};
use super::plan::{conn_channels, connections_needed, plan, Dir, Geometry, NetView, Plan};
use super::redop::{RedOp, Scalar};
use super::ring::{self, RingOrder};
use super::{CollKind, Task, TaskOptions};
use crate::abi::ncclDataType_t;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

const S_SEND: u32 = 1;
const S_RECV: u32 = 2;
const S_IN: u32 = 4;
const S_OUT: u32 = 8;
const S_POST: u32 = 16;
/// One-shot all-reduce, first half of a step: wait for free slots towards every peer, then
/// write this rank's pre-transformed values to all of them.
const S_DSEND: u32 = 32;
/// Second half: wait for every peer's words, fold all ranks in rank order, write the output.
const S_DRECV: u32 = 64;

#[derive(Clone, Copy, Debug)]
struct Step {
    what: u32,
    inp: u64,
    out: u64,
    n: u64,
}

fn modn(a: i64, n: i64) -> u64 {
    a.rem_euclid(n) as u64
}

/// The `S_*` bits of one step of the shared ring schedule.
fn ring_step_bits(st: &ring::RingStep) -> u32 {
    [
        (st.send, S_SEND),
        (st.recv, S_RECV),
        (st.input, S_IN),
        (st.output, S_OUT),
        (st.post, S_POST),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .fold(0, |bits, (_, bit)| bits | bit)
}

/// Append one ring step; its input and output addresses only where it reads or writes.
fn push_ring_step(v: &mut Vec<Step>, st: &ring::RingStep, inp: u64, out: u64, n: u64) {
    v.push(Step {
        what: ring_step_bits(st),
        inp: if st.input { inp } else { 0 },
        out: if st.output { out } else { 0 },
        n,
    });
}

/// The steps of one item, exactly as collectives.cuh sequences them (ring items after the
/// schedule of `ring`, which the planner shares); `mem` holds the ring table an item with
/// `FLAG_RING_ORDER` reads.
fn steps_of(w: &OxWork, mem: &Mem) -> Vec<Step> {
    let es = ncclDataType_t::ALL[w.dtype as usize].size() as u64;
    let n = w.nranks as i64;
    let mut v = Vec::new();
    let mut push = |what, inp, out, n| v.push(Step { what, inp, out, n });
    let kind = w.kind;
    let inb = w.src + w.offset * es;
    let outb = w.dst + w.offset * es;
    if kind == WorkKind::RingAllReduce as u32 {
        let schedule = ring::all_reduce_steps(w.rank, w.nranks);
        let mut base = 0;
        while base < w.count {
            let rem = (w.count - base).min(n as u64 * w.chunk);
            let piece = w
                .chunk
                .min(ring::part_len(rem, n as u64, ring::element_granularity(es)));
            let len = |p: u64| {
                let o = p * piece;
                if o >= rem {
                    0
                } else {
                    piece.min(rem - o)
                }
            };
            for st in &schedule {
                let at = (base + st.block * piece) * es;
                push_ring_step(&mut v, st, inb + at, outb + at, len(st.block));
            }
            base += n as u64 * w.chunk;
        }
    } else if kind == WorkKind::RingAllGather as u32 || kind == WorkKind::RingReduceScatter as u32 {
        let bs = w.block * es;
        // The rank whose block stands at a ring position: the table's entry on a ring not in
        // rank order (`offset` holds its address, `src`/`dst` point at the range), else the
        // position itself.
        let ordered = w.flags & FLAG_RING_ORDER != 0;
        let (inb, outb) = if ordered { (w.src, w.dst) } else { (inb, outb) };
        let block_rank = |pos: u64| {
            if ordered {
                let b = mem.slice(w.offset + 4 * pos, 4);
                i32::from_le_bytes(b.try_into().unwrap()) as u64
            } else {
                pos
            }
        };
        let schedule = if kind == WorkKind::RingAllGather as u32 {
            // The own block is the host's local copy unless the item carries it.
            ring::all_gather_steps(w.rank, w.nranks, w.flags & FLAG_OWN_BLOCK != 0)
        } else {
            ring::reduce_scatter_steps(w.rank, w.nranks)
        };
        let gather = kind == WorkKind::RingAllGather as u32;
        let mut base = 0;
        while base < w.count {
            let len = w.chunk.min(w.count - base);
            let o = base * es;
            for st in &schedule {
                // All-gather reads its input as is and writes blocks of the output;
                // reduce-scatter reads blocks of the input and writes its output as is.
                let block = block_rank(st.block);
                let (inp, out) = if gather {
                    (inb + o, outb + block * bs + o)
                } else {
                    (inb + block * bs + o, outb + o)
                };
                push_ring_step(&mut v, st, inp, out, len);
            }
            base += w.chunk;
        }
    } else if kind == WorkKind::RingBroadcast as u32 || kind == WorkKind::RingReduce as u32 {
        let coll = if kind == WorkKind::RingBroadcast as u32 {
            CollKind::Broadcast
        } else {
            CollKind::Reduce
        };
        let st = ring::chain_step(coll, w.rank, w.root, w.nranks);
        let what = ring_step_bits(&st);
        let mut base = 0;
        while base < w.count {
            let len = w.chunk.min(w.count - base);
            push(what, inb + base * es, outb + base * es, len);
            base += w.chunk;
        }
    } else if kind == WorkKind::DirectAllReduce as u32 {
        let chunk = ll_step_bytes(w.send.slot_bytes) as u64 / es;
        let mut base = 0;
        while base < w.count {
            let len = chunk.min(w.count - base);
            push(S_DSEND, inb + base * es, 0, len);
            push(S_DRECV, 0, outb + base * es, len);
            base += chunk;
        }
    } else if kind == WorkKind::Send as u32 || kind == WorkKind::Recv as u32 {
        let send = kind == WorkKind::Send as u32;
        let slot = if send {
            w.send.slot_bytes
        } else {
            w.recv.slot_bytes
        };
        let chunk = if w.flags & FLAG_LL != 0 {
            ll_step_bytes(slot)
        } else {
            simple_step_bytes(slot)
        } as u64;
        let mut base = 0;
        while base < w.count {
            let len = chunk.min(w.count - base);
            if send {
                push(S_SEND | S_IN, w.src + base, 0, len);
            } else {
                push(S_RECV | S_OUT, 0, w.dst + base, len);
            }
            base += chunk;
        }
    }
    v
}

/// Element arithmetic of the integer types the simulator supports.
#[derive(Clone, Copy)]
struct Arith {
    dtype: ncclDataType_t,
    op: u32,
    scalar: i64,
    nranks: i64,
}

impl Arith {
    fn read(&self, b: &[u8]) -> i64 {
        match self.dtype {
            ncclDataType_t::ncclInt8 => b[0] as i8 as i64,
            ncclDataType_t::ncclUint8 => b[0] as i64,
            ncclDataType_t::ncclInt32 => i32::from_le_bytes(b[..4].try_into().unwrap()) as i64,
            ncclDataType_t::ncclInt64 => i64::from_le_bytes(b[..8].try_into().unwrap()),
            t => panic!("simulator does not do {t:?}"),
        }
    }
    fn write(&self, b: &mut [u8], v: i64) {
        let es = self.dtype.size();
        b[..es].copy_from_slice(&v.to_le_bytes()[..es]);
    }
    fn wrap(&self, v: i64) -> i64 {
        let mut b = [0u8; 8];
        self.write(&mut b, v);
        self.read(&b)
    }
    fn combine(&self, a: i64, b: i64) -> i64 {
        self.wrap(match self.op {
            op::PROD => a.wrapping_mul(b),
            op::MAX => a.max(b),
            op::MIN => a.min(b),
            _ => a.wrapping_add(b),
        })
    }
    fn pre(&self, a: i64) -> i64 {
        if self.op == op::PREMULSUM {
            self.wrap(a.wrapping_mul(self.scalar))
        } else {
            a
        }
    }
    fn post(&self, a: i64) -> i64 {
        if self.op == op::AVG {
            self.wrap(a / self.nranks)
        } else {
            a
        }
    }
}

/// A flat memory: every address the test hands out lives in one arena.
struct Mem {
    bytes: Vec<u8>,
}
const BASE: u64 = 0x1_0000;

impl Mem {
    fn alloc(&mut self, len: u64, misalign: u64) -> u64 {
        let start = (self.bytes.len() as u64).div_ceil(256) * 256 + misalign;
        self.bytes.resize((start + len + 64) as usize, 0xEE);
        BASE + start
    }
    fn slice(&self, addr: u64, len: u64) -> &[u8] {
        &self.bytes[(addr - BASE) as usize..(addr - BASE + len) as usize]
    }
    fn slice_mut(&mut self, addr: u64, len: u64) -> &mut [u8] {
        &mut self.bytes[(addr - BASE) as usize..(addr - BASE + len) as usize]
    }
}

/// One connection as the device sees it: the staging buffer (Simple and LL regions of every
/// slot), the `tail`/`head` counters, and, to check that both ends agree, the byte count and
/// protocol of every step the sender has published and the receiver not yet consumed.
struct ConnSim {
    data: Vec<u8>,
    tail: u64,
    head: u64,
    pending: VecDeque<(u64, bool)>,
}

/// The shared state of the simulated machine. `positions` holds every `step` word (keyed by
/// its fake address); `conns` every connection (keyed by its buffer address); both persist
/// over launches, as on the device.
struct World {
    mem: Mem,
    conns: HashMap<u64, ConnSim>,
    positions: HashMap<u64, u64>,
}

impl World {
    fn new() -> World {
        World {
            mem: Mem { bytes: Vec::new() },
            conns: HashMap::new(),
            positions: HashMap::new(),
        }
    }

    fn conn(&mut self, c: &OxConn) -> &mut ConnSim {
        self.conns.entry(c.buf).or_insert_with(|| ConnSim {
            // The transports zero the buffers (DeviceBuffer::zeroed): no LL flag matches.
            data: vec![0; c.slot_bytes as usize * c.nslots as usize],
            tail: 0,
            head: 0,
            pending: VecDeque::new(),
        })
    }

    fn position(&self, step_addr: u64) -> u64 {
        self.positions.get(&step_addr).copied().unwrap_or(0)
    }

    /// The `nb` payload bytes of receive step k, or None while they are not there yet:
    /// Simple waits `tail > k`; LL waits until every word of the slot's LL region that the
    /// step needs carries the epoch (u32)(k + 1).
    fn try_receive(&mut self, c: &OxConn, k: u64, nb: u64, ll: bool) -> Option<Vec<u8>> {
        let base = (k % c.nslots as u64) * c.slot_bytes as u64;
        let conn = self.conn(c);
        if ll {
            assert!(
                nb <= ll_step_bytes(c.slot_bytes) as u64,
                "LL step of {nb} bytes"
            );
            let region = (base + simple_step_bytes(c.slot_bytes) as u64) as usize;
            let epoch = (k + 1) as u32;
            let mut out = Vec::with_capacity(nb as usize + 4);
            for i in 0..nb.div_ceil(4) as usize {
                let word = &conn.data[region + 8 * i..region + 8 * i + 8];
                if u32::from_le_bytes(word[4..].try_into().unwrap()) != epoch {
                    return None;
                }
                out.extend_from_slice(&word[..4]);
            }
            out.truncate(nb as usize);
            Some(out)
        } else {
            assert!(
                nb <= simple_step_bytes(c.slot_bytes) as u64,
                "Simple step of {nb} bytes"
            );
            if conn.tail <= k {
                return None;
            }
            Some(conn.data[base as usize..(base + nb) as usize].to_vec())
        }
    }

    /// Publish send step k: Simple writes the Simple region and `tail = k + 1`; LL writes
    /// {4 bytes, epoch} words into the LL region (the last word's bytes padded with zeros).
    fn publish(&mut self, c: &OxConn, k: u64, payload: &[u8], ll: bool) {
        let base = (k % c.nslots as u64) * c.slot_bytes as u64;
        let conn = self.conn(c);
        if ll {
            let region = (base + simple_step_bytes(c.slot_bytes) as u64) as usize;
            let epoch = ((k + 1) as u32).to_le_bytes();
            for (i, part) in payload.chunks(4).enumerate() {
                let word = &mut conn.data[region + 8 * i..region + 8 * i + 8];
                word[..4].fill(0);
                word[..part.len()].copy_from_slice(part);
                word[4..].copy_from_slice(&epoch);
            }
        } else {
            let b = base as usize;
            conn.data[b..b + payload.len()].copy_from_slice(payload);
            conn.tail = k + 1;
        }
        conn.pending.push_back((payload.len() as u64, ll));
    }
}

struct Cta {
    items: Vec<OxWork>,
    next_item: usize,
    steps: Vec<Step>,
    next_step: usize,
    active: Option<OxWork>,
    /// One-shot all-reduce: (send, recv) connection of every peer k, as the kernel gathers
    /// them from the item and its Peer items, and this rank's values of the step.
    direct: Vec<(OxConn, OxConn)>,
    direct_own: Vec<u8>,
}

impl World {
    /// Run one step (or open/close an item) of `cta`; false if it must wait or is done.
    fn advance(&mut self, cta: &mut Cta) -> bool {
        let Some(w) = cta.active else {
            if cta.next_item == cta.items.len() {
                return false;
            }
            let w = cta.items[cta.next_item];
            cta.next_item += 1;
            cta.active = Some(w);
            cta.steps = steps_of(&w, &self.mem);
            cta.next_step = 0;
            if w.kind == WorkKind::Copy as u32 {
                self.copy(&w);
                cta.active = None;
            }
            assert_ne!(
                w.kind,
                WorkKind::Peer as u32,
                "a Peer item without its DirectAllReduce item before it"
            );
            if w.kind == WorkKind::DirectAllReduce as u32 {
                let peers = (w.nranks - 1) as usize;
                let mut direct = vec![(w.send, w.recv)];
                for _ in 1..peers {
                    let p = cta.items[cta.next_item];
                    assert_eq!(p.kind, WorkKind::Peer as u32, "Peer item expected");
                    assert_eq!((p.offset, p.count), (w.offset, w.count));
                    direct.push((p.send, p.recv));
                    cta.next_item += 1;
                }
                cta.direct = direct;
            }
            return true;
        };
        if cta.next_step == cta.steps.len() {
            cta.active = None;
            return true;
        }
        let s = cta.steps[cta.next_step];
        if s.what & (S_DSEND | S_DRECV) != 0 {
            if !self.direct_step(&w, cta, s) {
                return false;
            }
            cta.next_step += 1;
            return true;
        }
        let send = s.what & S_SEND != 0;
        let recv = s.what & S_RECV != 0;
        let ll = w.flags & FLAG_LL != 0;
        let es = ncclDataType_t::ALL[w.dtype as usize].size() as u64;
        let nb = s.n * es;
        let send_k = self.position(w.send.step);
        let recv_k = self.position(w.recv.step);
        // Flow control, the same for both protocols: slot k is free once head > k - nslots.
        if send && self.conn(&w.send).head + w.send.nslots as u64 <= send_k {
            return false;
        }
        let slot_in = if recv {
            let Some(v) = self.try_receive(&w.recv, recv_k, nb, ll) else {
                return false;
            };
            let conn = self.conn(&w.recv);
            let (sent, sent_ll) = conn
                .pending
                .pop_front()
                .expect("receiver got data nobody sent");
            assert_eq!(
                (sent, sent_ll),
                (nb, ll),
                "rank {} item {:?}: step {recv_k} was sent as ({sent} bytes, LL {sent_ll}), \
                 received as ({nb} bytes, LL {ll})",
                w.rank,
                w.kind
            );
            conn.head = recv_k + 1;
            *self.positions.entry(w.recv.step).or_default() += 1;
            Some(v)
        } else {
            None
        };
        let ar = arith(&w);
        let ops = w.flags & FLAG_OPS != 0;
        let mut result = vec![0u8; nb as usize];
        for i in 0..s.n as usize {
            let e = i * es as usize..(i + 1) * es as usize;
            let mut v;
            if s.what & S_IN != 0 {
                v = ar.read(&self.mem.slice(s.inp, nb)[e.clone()]);
                if ops {
                    v = ar.pre(v);
                }
                if let Some(sl) = &slot_in {
                    v = ar.combine(v, ar.read(&sl[e.clone()]));
                }
            } else {
                v = ar.read(&slot_in.as_ref().unwrap()[e.clone()]);
            }
            if s.what & S_POST != 0 && ops {
                v = ar.post(v);
            }
            ar.write(&mut result[e], v);
        }
        if s.what & S_OUT != 0 {
            self.mem.slice_mut(s.out, nb).copy_from_slice(&result);
        }
        if send {
            self.publish(&w.send, send_k, &result, ll);
            *self.positions.entry(w.send.step).or_default() += 1;
        }
        cta.next_step += 1;
        true
    }

    /// One half-step of a one-shot all-reduce (see S_DSEND / S_DRECV); false if it must wait.
    fn direct_step(&mut self, w: &OxWork, cta: &mut Cta, s: Step) -> bool {
        let es = ncclDataType_t::ALL[w.dtype as usize].size();
        let nb = s.n as usize * es;
        let ar = arith(w);
        let ops = w.flags & FLAG_OPS != 0;
        let n = w.nranks as i64;
        if s.what & S_DSEND != 0 {
            for (sc, _) in &cta.direct {
                let k = self.position(sc.step);
                if self.conn(sc).head + sc.nslots as u64 <= k {
                    return false;
                }
            }
            let input = self.mem.slice(s.inp, nb as u64).to_vec();
            let mut own = vec![0u8; nb];
            for i in 0..s.n as usize {
                let e = i * es..(i + 1) * es;
                let mut v = ar.read(&input[e.clone()]);
                if ops {
                    v = ar.pre(v);
                }
                ar.write(&mut own[e], v);
            }
            for (sc, _) in cta.direct.clone() {
                let k = self.position(sc.step);
                self.publish(&sc, k, &own, true);
                *self.positions.entry(sc.step).or_default() += 1;
            }
            cta.direct_own = own;
            return true;
        }
        // S_DRECV: every peer's words must be there.
        let mut from: Vec<Option<Vec<u8>>> = vec![None; n as usize];
        for (k, (_, rc)) in cta.direct.iter().enumerate() {
            let pos = self.position(rc.step);
            let Some(v) = self.try_receive(rc, pos, nb as u64, true) else {
                return false;
            };
            from[modn(w.rank as i64 - 1 - k as i64, n) as usize] = Some(v);
        }
        for (_, rc) in cta.direct.clone() {
            let pos = self.position(rc.step);
            let conn = self.conn(&rc);
            let sent = conn
                .pending
                .pop_front()
                .expect("receiver got data nobody sent");
            assert_eq!(
                sent,
                (nb as u64, true),
                "one-shot step sent and received differently"
            );
            conn.head = pos + 1;
            *self.positions.entry(rc.step).or_default() += 1;
        }
        from[w.rank as usize] = Some(std::mem::take(&mut cta.direct_own));
        let mut out = vec![0u8; nb];
        for i in 0..s.n as usize {
            let e = i * es..(i + 1) * es;
            let mut acc = ar.read(&from[0].as_ref().expect("rank 0's values")[e.clone()]);
            for vals in from.iter().skip(1) {
                acc = ar.combine(
                    acc,
                    ar.read(&vals.as_ref().expect("every rank's values")[e.clone()]),
                );
            }
            if ops {
                acc = ar.post(acc);
            }
            ar.write(&mut out[e], acc);
        }
        self.mem.slice_mut(s.out, nb as u64).copy_from_slice(&out);
        true
    }

    fn copy(&mut self, w: &OxWork) {
        let es = ncclDataType_t::ALL[w.dtype as usize].size() as u64;
        let ar = arith(w);
        let data = self.mem.slice(w.src, w.count * es).to_vec();
        let out = self.mem.slice_mut(w.dst, w.count * es);
        for (i, e) in data.chunks(es as usize).enumerate() {
            let mut v = ar.read(e);
            if w.flags & FLAG_OPS != 0 {
                v = ar.post(ar.pre(v));
            }
            ar.write(&mut out[i * es as usize..(i + 1) * es as usize], v);
        }
    }

    /// A copy-engine copy of the plan (`Plan::copies`).
    fn local_copy(&mut self, c: &super::plan::LocalCopy) {
        let data = self.mem.slice(c.src, c.bytes).to_vec();
        self.mem.slice_mut(c.dst, c.bytes).copy_from_slice(&data);
    }
}

fn arith(w: &OxWork) -> Arith {
    let dtype = ncclDataType_t::ALL[w.dtype as usize];
    let mut b = [0u8; 8];
    b[..dtype.size()].copy_from_slice(&w.scalar.to_le_bytes()[..dtype.size()]);
    let a = Arith {
        dtype,
        op: w.op,
        scalar: 0,
        nranks: w.nranks as i64,
    };
    Arith {
        scalar: a.read(&b),
        ..a
    }
}

/// Geometries for `nranks` ranks: every connection any rank needs for `tasks_of`, with fake
/// addresses that agree between the two ends.
fn geometries(
    nranks: i32,
    nchannels: u32,
    slot_bytes: u32,
    nslots: u32,
    tasks: &[Vec<Task>],
) -> Vec<Geometry> {
    geometries_net(nranks, nchannels, slot_bytes, nslots, tasks, &|_| None)
}

/// `geometries` with each rank's view of the network, `net_of(rank)`.
fn geometries_net(
    nranks: i32,
    nchannels: u32,
    slot_bytes: u32,
    nslots: u32,
    tasks: &[Vec<Task>],
    net_of: &dyn Fn(i32) -> Option<NetView>,
) -> Vec<Geometry> {
    let ring = RingOrder::identity(nranks);
    let tables = vec![0; nranks as usize];
    geometries_on(nchannels, slot_bytes, nslots, tasks, net_of, &ring, &tables)
}

/// `geometries_net` on rings in `order`: unless it is rank order, every rank gets its own
/// ring table in `world`'s memory, as the runtime gives each rank one in its device's.
fn geometries_ring(
    world: &mut World,
    nchannels: u32,
    tasks: &[Vec<Task>],
    net_of: &dyn Fn(i32) -> Option<NetView>,
    order: &RingOrder,
) -> Vec<Geometry> {
    let table = ring_table_bytes(order.ranks());
    let tables: Vec<u64> = (0..order.nranks())
        .map(|_| {
            if order.is_identity() {
                return 0;
            }
            let at = world.mem.alloc(table.len() as u64, 0);
            world
                .mem
                .slice_mut(at, table.len() as u64)
                .copy_from_slice(&table);
            at
        })
        .collect();
    geometries_on(nchannels, 4096, 2, tasks, net_of, order, &tables)
}

/// The geometries of every rank of a ring in `ring` (rank r's table at `tables[r]`).
fn geometries_on(
    nchannels: u32,
    slot_bytes: u32,
    nslots: u32,
    tasks: &[Vec<Task>],
    net_of: &dyn Fn(i32) -> Option<NetView>,
    ring: &RingOrder,
    tables: &[u64],
) -> Vec<Geometry> {
    let nranks = ring.nranks();
    let rows = conn_channels(nchannels) as usize;
    let mut geoms: Vec<Geometry> = (0..nranks)
        .map(|rank| Geometry {
            rank,
            nranks,
            nchannels,
            send: vec![vec![None; nranks as usize]; rows],
            recv: vec![vec![None; nranks as usize]; rows],
            recv_gpu: Default::default(),
            send_gpu: Default::default(),
            abort_flag: 0xAB00,
            threads: 0,
            net: net_of(rank),
            ring: ring.clone(),
            ring_table: tables[rank as usize],
            park: Vec::new(),
            tuner: None,
        })
        .collect();
    connect_all(&mut geoms, tasks, slot_bytes, nslots);
    geoms
}

/// Give every geometry the connections its rank's `tasks` need (with its tuner, if any),
/// with fake addresses that agree between the two ends.
fn connect_all(geoms: &mut [Geometry], tasks: &[Vec<Task>], slot_bytes: u32, nslots: u32) {
    let Some(first) = geoms.first() else { return };
    let (nranks, nchannels, ring) = (first.nranks, first.nchannels, first.ring.clone());
    // Connection (ch, src -> dst): buf/tail/head ids shared, step ids per side.
    let id = |ch: u32, src: i32, dst: i32| {
        0x1000_0000_0000u64 + (((ch as u64) << 24) + ((src as u64) << 12) + dst as u64) * 8
    };
    for (rank, t) in tasks.iter().enumerate() {
        let net = geoms[rank].net.clone();
        let tuner = geoms[rank].tuner.clone();
        for (ch, peer, dir) in connections_needed(
            rank as i32,
            nranks,
            nchannels,
            net.as_ref(),
            &ring,
            tuner.as_deref(),
            t,
        ) {
            let (src, dst) = match dir {
                Dir::Send => (rank as i32, peer),
                Dir::Recv => (peer, rank as i32),
            };
            let base = id(ch, src, dst);
            // The one-shot all-reduce's rows have their own small buffers, as the runtime
            // connects them.
            let (slot_bytes, nslots) = if super::plan::is_direct_row(nchannels, ch) {
                (super::cost::DIRECT_SLOT_BYTES, super::cost::DIRECT_NSLOTS)
            } else {
                (slot_bytes, nslots)
            };
            let conn = OxConn {
                buf: base,
                tail: base + 1,
                head: base + 2,
                step: base + 3 + (dir == Dir::Recv) as u64,
                slot_bytes,
                nslots,
            };
            let g = &mut geoms[rank];
            match dir {
                Dir::Send => g.send[ch as usize][peer as usize] = Some(conn),
                Dir::Recv => g.recv[ch as usize][peer as usize] = Some(conn),
            }
        }
    }
}

/// Plan and run one group per rank (`tasks[rank]`) `launches` times; panics on deadlock or
/// any disagreement between the two ends of a connection.
fn run(world: &mut World, geoms: &[Geometry], tasks: &[Vec<Task>], launches: usize) {
    for _ in 0..launches {
        let mut ctas: Vec<Cta> = Vec::new();
        let mut copies = Vec::new();
        // What the network proxy is told each receive connection will consume (by the address
        // of the connection's position), and where each stood before the launch.
        let mut announced: HashMap<u64, u64> = HashMap::new();
        let before = world.positions.clone();
        for (rank, g) in geoms.iter().enumerate() {
            let p = plan(g, &tasks[rank]).expect("plan");
            assert_eq!(p.items.len(), p.nitems as usize * super::device::WORK_SIZE);
            let items = deserialize_all(&p.items);
            for (conn, steps) in super::steps::recv_steps_per_connection(&items) {
                *announced.entry(conn.step).or_default() += steps;
            }
            assert!(p.grid <= super::cost::MAX_CTAS && p.grid <= g.nchannels);
            copies.extend(p.copies.iter().copied());
            for c in 0..p.grid {
                let mine: Vec<OxWork> = items.iter().filter(|w| w.cta == c).copied().collect();
                assert!(
                    !mine.is_empty(),
                    "rank {rank}: CTA {c} of {} has no items",
                    p.grid
                );
                for w in &mine {
                    assert_eq!(w.abort_flag, 0xAB00);
                }
                ctas.push(Cta {
                    items: mine,
                    next_item: 0,
                    steps: Vec::new(),
                    next_step: 0,
                    active: None,
                    direct: Vec::new(),
                    direct_own: Vec::new(),
                });
            }
        }
        // Round-robin, one step per CTA per sweep, until nothing can move.
        loop {
            let mut moved = false;
            for c in ctas.iter_mut() {
                moved |= world.advance(c);
            }
            if !moved {
                break;
            }
        }
        for (i, c) in ctas.iter().enumerate() {
            assert!(
                c.active.is_none() && c.next_item == c.items.len(),
                "deadlock: CTA {i} stuck at item {} step {} of {:?}",
                c.next_item,
                c.next_step,
                c.active.map(|w| w.kind)
            );
        }
        for (buf, c) in &world.conns {
            assert!(
                c.pending.is_empty(),
                "connection {buf:#x} has {} unread slots",
                c.pending.len()
            );
        }
        // Every receive connection consumed exactly the steps announced for it.
        for g in geoms {
            for conn in g.recv.iter().flatten().flatten() {
                let at = |m: &HashMap<u64, u64>| m.get(&conn.step).copied().unwrap_or(0);
                assert_eq!(
                    at(&world.positions) - at(&before),
                    at(&announced),
                    "a receive connection consumed other than the steps counted for it"
                );
            }
        }
        // The copy engine's copies run beside the kernel on memory it does not touch: done
        // after it here, so a kernel that needed their result would be caught reading poison.
        for c in &copies {
            world.local_copy(c);
        }
    }
    // Both ends of every connection end at the same position.
    for g in geoms {
        for row in &g.send {
            for conn in row.iter().flatten() {
                let mine = world.positions.get(&conn.step).copied().unwrap_or(0);
                let theirs = world.positions.get(&(conn.step + 1)).copied().unwrap_or(0);
                assert_eq!(mine, theirs, "sender and receiver positions differ");
            }
        }
    }
}

fn value(rank: usize, i: usize, salt: usize) -> i64 {
    ((rank * 131 + i * 7 + salt * 13) % 23) as i64 - 9
}

struct Case {
    kind: CollKind,
    nranks: i32,
    nchannels: u32,
    count: usize,
    dtype: ncclDataType_t,
    op: RedOp,
    root: i32,
    in_place: bool,
    misalign: u64,
}

/// Run one collective on all ranks in the simulator (twice) and compare with the reference.
fn check(c: &Case) {
    let mut world = World::new();
    let prepared = prepare(&mut world, c);
    let geoms = geometries(c.nranks, c.nchannels, 4096, 2, &prepared.tasks);
    run(&mut world, &geoms, &prepared.tasks, 2);
    verify(&world, c, &prepared);
}

/// A case's buffers, inputs and per-rank tasks, set up in a world.
struct Prepared {
    tasks: Vec<Vec<Task>>,
    bufs: Vec<(u64, u64)>,
    inputs: Vec<Vec<i64>>,
}

fn arith_of(c: &Case) -> Arith {
    let scalar = match c.op {
        RedOp::PreMulSum(Scalar::Host(b)) => i64::from_le_bytes(b),
        _ => 0,
    };
    Arith {
        dtype: c.dtype,
        op: c.op.code(),
        scalar,
        nranks: c.nranks as i64,
    }
}

fn lengths(c: &Case) -> (u64, u64) {
    let n = c.nranks as u64;
    let count = c.count as u64;
    match c.kind {
        CollKind::AllGather | CollKind::Gather => (count, count * n),
        CollKind::ReduceScatter | CollKind::Scatter => (count * n, count),
        CollKind::AlltoAll => (count * n, count * n),
        _ => (count, count),
    }
}

/// Allocate and fill the buffers of case `c` in `world`; the tasks of every rank.
fn prepare(world: &mut World, c: &Case) -> Prepared {
    let n = c.nranks as usize;
    let es = c.dtype.size() as u64;
    let count = c.count as u64;
    let (in_len, out_len) = lengths(c);
    let ar = arith_of(c);
    let mut tasks = Vec::new();
    let mut bufs = Vec::new();
    let mut inputs = Vec::new();
    for r in 0..n {
        let input: Vec<i64> = (0..in_len as usize)
            .map(|i| ar.wrap(value(r, i, 1)))
            .collect();
        let (send, recv) = if c.in_place {
            let recv = world.mem.alloc(out_len.max(in_len) * es, c.misalign);
            let send = match c.kind {
                CollKind::AllGather => recv + r as u64 * count * es,
                CollKind::ReduceScatter => recv,
                _ => recv,
            };
            let recv = match c.kind {
                CollKind::ReduceScatter => send + r as u64 * count * es,
                _ => recv,
            };
            (send, recv)
        } else {
            (
                world.mem.alloc(in_len * es, c.misalign),
                world.mem.alloc(out_len * es, c.misalign),
            )
        };
        for (i, v) in input.iter().enumerate() {
            let mut b = [0u8; 8];
            ar.write(&mut b, *v);
            world
                .mem
                .slice_mut(send + i as u64 * es, es)
                .copy_from_slice(&b[..es as usize]);
        }
        inputs.push(input);
        bufs.push((send, recv));
        let mut t = vec![];
        let task = Task {
            kind: c.kind,
            dtype: c.dtype,
            op: c.op,
            count: c.count,
            sendbuff: send,
            recvbuff: recv,
            root: c.root,
            opts: Default::default(),
            weights_epoch: 0,
        };
        if c.kind == CollKind::Send {
            // Ring exchange: send to r+1 and receive from r-1 in one group.
            t.push(Task {
                root: ((r + 1) % n) as i32,
                ..task
            });
            t.push(Task {
                kind: CollKind::Recv,
                root: ((r + n - 1) % n) as i32,
                ..task
            });
        } else {
            t.push(task);
        }
        tasks.push(t);
    }
    Prepared {
        tasks,
        bufs,
        inputs,
    }
}

/// Compare the outputs of case `c` in `world` with the reference.
fn verify(world: &World, c: &Case, prepared: &Prepared) {
    let n = c.nranks as usize;
    let es = c.dtype.size() as u64;
    let (_, out_len) = lengths(c);
    let ar = arith_of(c);
    let (bufs, inputs) = (&prepared.bufs, &prepared.inputs);
    // Reference (two launches of a deterministic collective give the same result, except
    // in-place reductions, which the tests run once; see below).
    let red = |vals: &mut dyn Iterator<Item = i64>| {
        let v = vals
            .map(|x| ar.pre(x))
            .reduce(|a, b| ar.combine(a, b))
            .unwrap();
        ar.post(v)
    };
    for r in 0..n {
        let (_, recv) = bufs[r];
        let got: Vec<i64> = (0..out_len)
            .map(|i| ar.read(world.mem.slice(recv + i * es, es)))
            .collect();
        let want: Vec<Option<i64>> = (0..out_len as usize)
            .map(|i| match c.kind {
                CollKind::AllReduce => Some(red(&mut (0..n).map(|q| inputs[q][i]))),
                CollKind::Reduce => {
                    (r as i32 == c.root).then(|| red(&mut (0..n).map(|q| inputs[q][i])))
                }
                CollKind::Broadcast => Some(inputs[c.root as usize][i]),
                CollKind::AllGather => Some(inputs[i / c.count][i % c.count]),
                CollKind::ReduceScatter => {
                    Some(red(&mut (0..n).map(|q| inputs[q][r * c.count + i])))
                }
                CollKind::AlltoAll => Some(inputs[i / c.count][r * c.count + i % c.count]),
                CollKind::Gather => (r as i32 == c.root).then(|| inputs[i / c.count][i % c.count]),
                CollKind::Scatter => Some(inputs[c.root as usize][r * c.count + i]),
                CollKind::Send => Some(inputs[(r + n - 1) % n][i]),
                CollKind::Recv => None,
            })
            .collect();
        for i in 0..out_len as usize {
            if let Some(w) = want[i] {
                assert_eq!(
                    got[i], w,
                    "{:?} n={} ch={} count={} {:?} {:?} in_place={}: rank {r} element {i}",
                    c.kind, c.nranks, c.nchannels, c.count, c.dtype, c.op, c.in_place
                );
            }
        }
    }
}

const KINDS: [CollKind; 9] = [
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

fn is_idempotent(kind: CollKind, op: RedOp) -> bool {
    // Running twice in place changes the input of the second run for these.
    let reduction = matches!(
        kind,
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
    );
    !reduction || matches!(op, RedOp::Max | RedOp::Min)
}

#[test]
fn every_collective_every_shape() {
    use ncclDataType_t::*;
    for kind in KINDS {
        for nranks in [1, 2, 3, 4] {
            for nchannels in [1, 3, 8] {
                for count in [0usize, 1, 5, 1000, 5000] {
                    for dtype in [ncclInt32, ncclInt8] {
                        check(&Case {
                            kind,
                            nranks,
                            nchannels,
                            count,
                            dtype,
                            op: RedOp::Sum,
                            root: nranks - 1,
                            in_place: false,
                            misalign: 0,
                        });
                    }
                }
            }
        }
    }
}

#[test]
fn big_counts_many_rounds() {
    // 300k int32 over 4 KiB slots: hundreds of rounds per channel.
    for kind in KINDS {
        check(&Case {
            kind,
            nranks: 4,
            nchannels: 4,
            count: 300_001,
            dtype: ncclDataType_t::ncclInt32,
            op: RedOp::Sum,
            root: 1,
            in_place: false,
            misalign: 0,
        });
    }
}

/// Every reduction, PreMulSum with a host scalar of 3.
const EVERY_OP: [RedOp; 6] = [
    RedOp::Sum,
    RedOp::Prod,
    RedOp::Max,
    RedOp::Min,
    RedOp::Avg,
    RedOp::PreMulSum(Scalar::Host([3, 0, 0, 0, 0, 0, 0, 0])),
];

#[test]
fn ops_and_in_place() {
    use ncclDataType_t::*;
    let ops = EVERY_OP;
    for kind in [
        CollKind::AllReduce,
        CollKind::Reduce,
        CollKind::ReduceScatter,
        CollKind::AllGather,
        CollKind::Broadcast,
    ] {
        for op in ops {
            for nranks in [1, 2, 3, 4] {
                for dtype in [ncclInt8, ncclUint8, ncclInt32, ncclInt64] {
                    for in_place in [false, true] {
                        if in_place && !is_idempotent(kind, op) {
                            // Checked in a single launch below.
                            continue;
                        }
                        check(&Case {
                            kind,
                            nranks,
                            nchannels: 2,
                            count: 777,
                            dtype,
                            op,
                            root: 0,
                            in_place,
                            misalign: 3 * dtype.size() as u64,
                        });
                    }
                }
            }
        }
    }
}

#[test]
fn in_place_reductions_single_launch() {
    use ncclDataType_t::*;
    for kind in [
        CollKind::AllReduce,
        CollKind::Reduce,
        CollKind::ReduceScatter,
    ] {
        for nranks in [1, 2, 4] {
            let n = nranks as usize;
            let count = 1003usize;
            let es = 4u64;
            let mut world = World::new();
            let ar = Arith {
                dtype: ncclInt32,
                op: 0,
                scalar: 0,
                nranks: nranks as i64,
            };
            let in_len = if kind == CollKind::ReduceScatter {
                count * n
            } else {
                count
            };
            let mut tasks = Vec::new();
            let mut bufs = Vec::new();
            for r in 0..n {
                let buf = world.mem.alloc(in_len as u64 * es, 0);
                for i in 0..in_len {
                    let mut b = [0u8; 8];
                    ar.write(&mut b, value(r, i, 2));
                    world
                        .mem
                        .slice_mut(buf + i as u64 * es, es)
                        .copy_from_slice(&b[..4]);
                }
                let recv = if kind == CollKind::ReduceScatter {
                    buf + (r * count) as u64 * es
                } else {
                    buf
                };
                bufs.push(recv);
                tasks.push(vec![Task {
                    kind,
                    dtype: ncclInt32,
                    op: RedOp::Sum,
                    count,
                    sendbuff: buf,
                    recvbuff: recv,
                    root: 0,
                    opts: Default::default(),
                    weights_epoch: 0,
                }]);
            }
            let geoms = geometries(nranks, 3, 4096, 2, &tasks);
            run(&mut world, &geoms, &tasks, 1);
            for (r, &buf) in bufs.iter().enumerate() {
                if kind == CollKind::Reduce && r != 0 {
                    continue;
                }
                for i in 0..count {
                    let src_i = if kind == CollKind::ReduceScatter {
                        r * count + i
                    } else {
                        i
                    };
                    let want: i64 = (0..n).map(|q| value(q, src_i, 2)).sum();
                    let got = ar.read(world.mem.slice(buf + i as u64 * es, es));
                    assert_eq!(got, want, "{kind:?} n={nranks} rank {r} elem {i}");
                }
            }
        }
    }
}

#[test]
fn mixed_group_and_unbalanced_p2p_do_not_deadlock() {
    // Rank r: an AllReduce, an AlltoAll, two sends to r+1 and one to r+2, in different
    // orders on different ranks (receives listed before sends on odd ranks).
    use ncclDataType_t::*;
    let n = 4usize;
    let mut world = World::new();
    let count = 20_000usize;
    let mut tasks = Vec::new();
    let mut expect = Vec::new();
    for r in 0..n {
        let a = world.mem.alloc((count * n * 4) as u64, 0);
        let b = world.mem.alloc((count * n * 4) as u64, 0);
        let t = |kind, root, s, d| Task {
            kind,
            dtype: ncclInt32,
            op: RedOp::Sum,
            count,
            sendbuff: s,
            recvbuff: d,
            root,
            opts: Default::default(),
            weights_epoch: 0,
        };
        let mut sends = vec![
            t(CollKind::Send, ((r + 1) % n) as i32, a, 0),
            t(CollKind::Send, ((r + 1) % n) as i32, a + 4000, 0),
            t(CollKind::Send, ((r + 2) % n) as i32, a + 8000, 0),
        ];
        let recvs_base = world.mem.alloc((count * 3 * 4) as u64, 0);
        let mut recvs = vec![
            t(CollKind::Recv, ((r + n - 1) % n) as i32, 0, recvs_base),
            t(
                CollKind::Recv,
                ((r + n - 1) % n) as i32,
                0,
                recvs_base + (count * 4) as u64,
            ),
            t(
                CollKind::Recv,
                ((r + n - 2) % n) as i32,
                0,
                recvs_base + (count * 8) as u64,
            ),
        ];
        let mut group = vec![t(CollKind::AllReduce, 0, a, b)];
        if r % 2 == 1 {
            group.append(&mut recvs);
            group.push(t(CollKind::AlltoAll, 0, a, b));
            group.append(&mut sends);
        } else {
            group.append(&mut sends);
            group.push(t(CollKind::AlltoAll, 0, a, b));
            group.append(&mut recvs);
        }
        expect.push(recvs_base);
        tasks.push(group);
    }
    let geoms = geometries(n as i32, 4, 4096, 2, &tasks);
    run(&mut world, &geoms, &tasks, 1);
}

/// Runs `f` with the protocol choice forced on this test thread, then restores it.
fn with_protocols(spec: &str, f: impl FnOnce()) {
    let p = super::cost::parse_protocols(spec);
    super::cost::TEST_PROTOCOLS.with(|t| t.set(Some(p)));
    f();
    super::cost::TEST_PROTOCOLS.with(|t| t.set(None));
}

/// The flags of rank 0's items that move data over connections (local copies excluded).
fn plan_flags(c: &Case) -> Vec<u32> {
    let mut world = World::new();
    let prepared = prepare(&mut world, c);
    let geoms = geometries(c.nranks, c.nchannels, 4096, 2, &prepared.tasks);
    let p = plan(&geoms[0], &prepared.tasks[0]).expect("plan");
    deserialize_all(&p.items)
        .iter()
        .filter(|w| w.kind != WorkKind::Copy as u32)
        .map(|w| w.flags)
        .collect()
}

#[test]
fn every_collective_forced_ll_and_forced_simple() {
    use ncclDataType_t::*;
    for spec in ["LL", "Simple"] {
        with_protocols(spec, || {
            for kind in KINDS {
                for nranks in [2, 3, 4] {
                    for (count, dtype) in [
                        (1, ncclInt8),
                        (7, ncclInt8),
                        (5, ncclInt32),
                        (300, ncclInt64),
                        (3001, ncclInt8),
                    ] {
                        let c = Case {
                            kind,
                            nranks,
                            nchannels: 2,
                            count,
                            dtype,
                            op: RedOp::Sum,
                            root: 1,
                            in_place: false,
                            misalign: 1,
                        };
                        let want_ll = spec == "LL";
                        for f in plan_flags(&c) {
                            assert_eq!(f & FLAG_LL != 0, want_ll, "{kind:?} {spec}");
                        }
                        check(&c);
                    }
                }
            }
        });
    }
}

#[test]
fn ll_every_op_odd_counts_in_and_out_of_place() {
    use ncclDataType_t::*;
    let ops = [
        RedOp::Sum,
        RedOp::Prod,
        RedOp::Max,
        RedOp::Min,
        RedOp::Avg,
        RedOp::PreMulSum(Scalar::Host([5, 0, 0, 0, 0, 0, 0, 0])),
    ];
    with_protocols("LL", || {
        for kind in [
            CollKind::AllReduce,
            CollKind::Reduce,
            CollKind::ReduceScatter,
            CollKind::AllGather,
            CollKind::Broadcast,
        ] {
            for op in ops {
                for dtype in [ncclInt8, ncclUint8, ncclInt32, ncclInt64] {
                    for count in [1usize, 3, 13, 131] {
                        for in_place in [false, true] {
                            if in_place && !is_idempotent(kind, op) {
                                continue;
                            }
                            check(&Case {
                                kind,
                                nranks: 3,
                                nchannels: 2,
                                count,
                                dtype,
                                op,
                                root: 2,
                                in_place,
                                misalign: dtype.size() as u64,
                            });
                        }
                    }
                }
            }
        }
    });
}

#[test]
fn default_choice_is_ll_when_small_simple_when_large() {
    use ncclDataType_t::*;
    with_protocols("", || {
        for kind in KINDS {
            let small = Case {
                kind,
                nranks: 4,
                nchannels: 4,
                count: 2,
                dtype: ncclInt32,
                op: RedOp::Sum,
                root: 0,
                in_place: false,
                misalign: 0,
            };
            assert!(
                plan_flags(&small).iter().all(|f| f & FLAG_LL != 0),
                "{kind:?}"
            );
            let large = Case {
                count: 1 << 20,
                ..small
            };
            assert!(
                plan_flags(&large).iter().all(|f| f & FLAG_LL == 0),
                "{kind:?}"
            );
        }
    });
}

#[test]
fn ll_and_simple_mixed_on_the_same_connections_over_launches() {
    // One world and one set of connections; launches alternate sizes and forced protocols so
    // that every connection sees LL steps after Simple ones and the reverse, with epochs and
    // positions carried over launches; every launch's results are checked.
    use ncclDataType_t::*;
    let nranks = 3;
    let mut world = World::new();
    let mut cases = Vec::new();
    let specs = ["", "LL", "Simple", "", "LL", "", "Simple", "LL"];
    let mut i = 0usize;
    for round in 0..3 {
        for kind in KINDS {
            for count in [3usize, 20_000, 333] {
                let c = Case {
                    kind,
                    nranks,
                    nchannels: 2,
                    count: count + round,
                    dtype: if i.is_multiple_of(2) {
                        ncclInt32
                    } else {
                        ncclInt8
                    },
                    op: if i.is_multiple_of(3) {
                        RedOp::Max
                    } else {
                        RedOp::Sum
                    },
                    root: (i % nranks as usize) as i32,
                    in_place: false,
                    misalign: (i % 4) as u64,
                };
                let prepared = prepare(&mut world, &c);
                cases.push((specs[i % specs.len()], c, prepared));
                i += 1;
            }
        }
    }
    let all: Vec<Vec<Task>> = (0..nranks as usize)
        .map(|r| {
            cases
                .iter()
                .flat_map(|(_, _, p)| p.tasks[r].iter().copied())
                .collect()
        })
        .collect();
    // Connections for every protocol choice (they do not depend on it, but be safe).
    let geoms = geometries(nranks, 2, 4096, 2, &all);
    for (spec, c, prepared) in &cases {
        with_protocols(spec, || run(&mut world, &geoms, &prepared.tasks, 1));
        verify(&world, c, prepared);
    }
    // Several connections really saw both protocols.
    assert!(world.conns.values().any(|c| c.tail > 0));
    assert!(world.conns.values().any(|c| c.head > c.tail && c.tail > 0));
}

/// Planning a tiny all-reduce (the per-call path) is repeatable: the same connections and
/// the same plan on every call, all with the one peer. Prints the host cost per call; for
/// meaningful numbers run `cargo test --release --lib planning_cost -- --nocapture`.
#[test]
fn planning_cost() {
    use crate::abi::ncclDataType_t::ncclFloat32;
    let task = Task {
        kind: CollKind::AllReduce,
        dtype: ncclFloat32,
        op: RedOp::Sum,
        count: 2,
        sendbuff: 0x1000,
        recvbuff: 0x2000,
        root: 0,
        opts: Default::default(),
        weights_epoch: 0,
    };
    let tasks = vec![vec![task]; 2];
    let geoms = geometries(
        2,
        64,
        crate::sched::SLOT_BYTES,
        crate::sched::NSLOTS,
        &tasks,
    );
    let ring = RingOrder::identity(2);
    let needed = connections_needed(0, 2, 64, None, &ring, None, &tasks[0]);
    assert!(
        !needed.is_empty(),
        "a two-rank all-reduce needs connections"
    );
    assert!(needed.iter().all(|&(_, peer, _)| peer == 1), "{needed:?}");
    let first = plan(&geoms[0], &tasks[0]).unwrap();
    assert!(first.nitems >= 1 && first.copies.is_empty(), "{first:?}");
    let n = 2000;
    let start = std::time::Instant::now();
    for _ in 0..n {
        assert_eq!(
            connections_needed(0, 2, 64, None, &ring, None, &tasks[0]),
            needed
        );
    }
    let t_needed = start.elapsed().as_secs_f64() * 1e6 / n as f64;
    let start = std::time::Instant::now();
    for _ in 0..n {
        assert_eq!(plan(&geoms[0], &tasks[0]).unwrap(), first);
    }
    let t_plan = start.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!("connections_needed {t_needed:.2} us, plan {t_plan:.2} us per call");
}

/// Kinds of the items rank 0 would run for `c`.
fn plan_kinds(c: &Case) -> Vec<u32> {
    let mut world = World::new();
    let prepared = prepare(&mut world, c);
    let geoms = geometries(c.nranks, c.nchannels, 4096, 2, &prepared.tasks);
    let p = plan(&geoms[0], &prepared.tasks[0]).expect("plan");
    deserialize_all(&p.items).iter().map(|w| w.kind).collect()
}

#[test]
fn one_shot_allreduce_every_rank_count_and_op() {
    use ncclDataType_t::*;
    let ops = EVERY_OP;
    for nranks in [2, 3, 4, 5, 8] {
        // 40000 int32 = 160 KB: several LL steps of the direct rows' 16 KiB per channel.
        for count in [1usize, 5, 1000, 40000] {
            for op in ops {
                for nchannels in [1, 64] {
                    let case = Case {
                        kind: CollKind::AllReduce,
                        nranks,
                        nchannels,
                        count,
                        dtype: if count > 1000 { ncclInt32 } else { ncclInt8 },
                        op,
                        root: 0,
                        in_place: false,
                        misalign: 0,
                    };
                    // Large counts take the one-shot path when LL is forced (then every
                    // channel moves several LL steps).
                    let spec = if count > 1000 { "LL" } else { "" };
                    let mut kinds = Vec::new();
                    with_protocols(spec, || kinds = plan_kinds(&case));
                    // Beyond 2 ranks the model sends large messages around the ring.
                    if count <= 1000 || nranks == 2 {
                        assert_eq!(
                            kinds[0],
                            WorkKind::DirectAllReduce as u32,
                            "n={nranks} count={count}: the one-shot path was not chosen"
                        );
                    }
                    let peers = kinds
                        .iter()
                        .filter(|&&k| k == WorkKind::Peer as u32)
                        .count();
                    let leaders = kinds
                        .iter()
                        .filter(|&&k| k == WorkKind::DirectAllReduce as u32)
                        .count();
                    assert_eq!(peers, leaders * (nranks as usize - 2));
                    with_protocols(spec, || check(&case));
                }
            }
        }
    }
    // In place: in_place_reductions_single_launch (its all-reduces take this path).
}

/// A float task of `count` elements on the given buffers.
fn float_task(kind: CollKind, count: usize, send: u64, recv: u64, op: RedOp) -> Task {
    Task {
        kind,
        dtype: ncclDataType_t::ncclFloat32,
        op,
        count,
        sendbuff: send,
        recvbuff: recv,
        root: 0,
        opts: Default::default(),
        weights_epoch: 0,
    }
}

#[test]
fn one_rank_collectives_are_copies_or_nothing() {
    use super::plan::{CopyBy, LocalCopy};
    let g = &geometries(1, 8, 4096, 2, &[vec![]])[0];
    let self_pair = [
        float_task(CollKind::Send, 1000, 0x1000, 0, RedOp::Sum),
        float_task(CollKind::Recv, 1000, 0, 0x9000, RedOp::Sum),
    ];
    let p = plan(g, &self_pair).unwrap();
    let ctas = super::cost::copy_kernel_ctas(4000).expect("a small copy is the kernel's");
    let threads = super::cost::copy_kernel_threads();
    let copy = |dst, bytes, by| LocalCopy {
        dst,
        src: 0x1000,
        bytes,
        by,
    };
    assert_eq!(p.nitems, 0, "a send to self launches no plan kernel");
    assert_eq!(
        p.copies,
        vec![copy(0x9000, 4000, CopyBy::Kernel { ctas, threads })],
        "a small send to self is a copy-kernel launch"
    );
    for kind in KINDS
        .into_iter()
        .filter(|k| !matches!(k, CollKind::Send | CollKind::Recv))
    {
        // Small: one copy-kernel launch of the whole buffer, no plan kernel.
        let small = plan(g, &[float_task(kind, 1000, 0x1000, 0x9000, RedOp::Sum)]).unwrap();
        assert_eq!(small.nitems, 0, "{kind:?}: no plan kernel");
        assert_eq!(
            small.copies,
            vec![copy(0x9000, 4000, CopyBy::Kernel { ctas, threads })],
            "{kind:?}: one copy-kernel launch"
        );
        // From copy_kernel_max(): one copy-engine copy.
        let max = super::cost::copy_kernel_max();
        let large = plan(
            g,
            &[float_task(
                kind,
                (max / 4) as usize,
                0x1000,
                0x900_0000,
                RedOp::Sum,
            )],
        )
        .unwrap();
        assert_eq!(large.nitems, 0, "{kind:?}: no kernel");
        assert_eq!(
            large.copies,
            vec![copy(0x900_0000, max, CopyBy::Engine)],
            "{kind:?}: one copy-engine copy"
        );
        let in_place = plan(g, &[float_task(kind, 1000, 0x1000, 0x1000, RedOp::Avg)]).unwrap();
        assert_eq!((in_place.nitems, in_place.copies.len()), (0, 0), "{kind:?}");
    }
    // A group of several: the small copies are kernel items of one launch, a large one runs
    // on the copy engine beside it.
    let big = super::cost::COPY_ENGINE_MIN_BYTES;
    let group = [
        float_task(CollKind::AllReduce, 1000, 0x1000, 0x9000, RedOp::Sum),
        float_task(CollKind::Broadcast, 1000, 0x2000, 0xa000, RedOp::Sum),
        float_task(
            CollKind::AllGather,
            (big / 4) as usize,
            0x100_0000,
            0x900_0000,
            RedOp::Sum,
        ),
    ];
    let p = plan(g, &group).unwrap();
    let items = super::device::deserialize_all(&p.items);
    assert_eq!(items.len(), 2, "one kernel copy item per small copy");
    assert!(items.iter().all(|w| w.kind == WorkKind::Copy as u32));
    let large = LocalCopy {
        src: 0x100_0000,
        ..copy(0x900_0000, big, CopyBy::Engine)
    };
    assert_eq!(p.copies, vec![large]);
    // A group whose second copy reads what the first writes: both whole copies, in order.
    let chain = [
        float_task(CollKind::AllReduce, 1000, 0x1000, 0x9000, RedOp::Sum),
        float_task(CollKind::AllReduce, 1000, 0x9000, 0x20000, RedOp::Sum),
    ];
    let p = plan(g, &chain).unwrap();
    assert_eq!(p.nitems, 0, "dependent copies launch no work items");
    let chained = LocalCopy {
        src: 0x9000,
        ..copy(0x20000, 4000, CopyBy::Kernel { ctas, threads })
    };
    assert_eq!(
        p.copies,
        vec![
            copy(0x9000, 4000, CopyBy::Kernel { ctas, threads }),
            chained
        ]
    );
    // The same copy twice writes the same bytes: one launch of work items.
    let twice = [chain[0], chain[0]];
    let p = plan(g, &twice).unwrap();
    assert_eq!((p.nitems, p.copies.len()), (2, 0));
    let mut two = [0u8; 8];
    two[..4].copy_from_slice(&2.0f32.to_le_bytes());
    let scale = RedOp::PreMulSum(Scalar::Host(two));
    for (send, recv) in [(0x1000, 0x9000), (0x1000, 0x1000)] {
        let p = plan(
            g,
            &[float_task(CollKind::AllReduce, 1 << 22, send, recv, scale)],
        )
        .unwrap();
        assert!(
            p.nitems > 1 && p.copies.is_empty(),
            "PreMulSum scales in the kernel"
        );
        assert!(p.grid <= g.nchannels);
    }
}

#[test]
fn own_blocks_are_copy_engine_copies_beside_the_kernel() {
    use super::plan::LocalCopy;
    let n = 4;
    let count = (super::cost::COPY_ENGINE_MIN_BYTES / 4) as usize;
    let bytes = 4 * count as u64;
    let gather = |send, recv| {
        vec![float_task(
            CollKind::AllGather,
            count,
            send,
            recv,
            RedOp::Sum,
        )]
    };
    let alltoall = |send, recv| {
        vec![float_task(
            CollKind::AlltoAll,
            count,
            send,
            recv,
            RedOp::Sum,
        )]
    };
    let tasks: Vec<Vec<Task>> = (0..n).map(|_| gather(0x1000, 0x1000_0000)).collect();
    let geoms = geometries(n, 4, 4096, 2, &tasks);
    let p = plan(&geoms[2], &tasks[2]).unwrap();
    assert_eq!(
        p.copies,
        vec![LocalCopy::new(0x1000_0000 + 2 * bytes, 0x1000, bytes)]
    );
    let in_place = gather(0x1000_0000 + 2 * bytes, 0x1000_0000);
    assert!(plan(&geoms[2], &in_place).unwrap().copies.is_empty());
    // A small own block is written by the ring's first step instead.
    let small = vec![float_task(
        CollKind::AllGather,
        100,
        0x1000,
        0x1000_0000,
        RedOp::Sum,
    )];
    let p = plan(&geoms[2], &small).unwrap();
    assert!(p.copies.is_empty());
    assert!(deserialize_all(&p.items)
        .iter()
        .all(|w| w.flags & FLAG_OWN_BLOCK != 0));
    let tasks: Vec<Vec<Task>> = (0..n).map(|_| alltoall(0x1000, 0x1000_0000)).collect();
    let geoms = geometries(n, 4, 4096, 2, &tasks);
    let p = plan(&geoms[1], &tasks[1]).unwrap();
    assert_eq!(
        p.copies,
        vec![LocalCopy::new(0x1000_0000 + bytes, 0x1000 + bytes, bytes)]
    );
}

#[test]
fn capped_channels_bound_the_grid() {
    // Eight ranks on one GPU get few channels each: every launch must stay within them.
    for nchannels in [1, 2, 16] {
        let tasks: Vec<Vec<Task>> = (0..8)
            .map(|_| {
                vec![float_task(
                    CollKind::AlltoAll,
                    1 << 20,
                    0x1000,
                    0x1000_0000,
                    RedOp::Sum,
                )]
            })
            .collect();
        let geoms = geometries(8, nchannels, 4096, 2, &tasks);
        for (g, t) in geoms.iter().zip(&tasks) {
            let p = plan(g, t).unwrap();
            assert!(p.grid <= nchannels, "grid {} > {nchannels}", p.grid);
        }
    }
}

/// Each rank's view of a network between hosts of two ranks each (ranks 0 and 1 on one host,
/// 2 and 3 on the next, ...) with the link `link`.
fn two_per_host(nranks: i32, link: super::cost::NetLink) -> impl Fn(i32) -> Option<NetView> {
    move |rank| {
        Some(NetView {
            link,
            remote: (0..nranks).map(|peer| peer / 2 != rank / 2).collect(),
            routes: super::Routes::even(),
        })
    }
}

#[test]
fn over_the_network_every_collective_is_correct() {
    // Rings planned for the network's link, P2P operations between hosts for it too (those
    // within a host as before): results right, both ends of every connection agreeing.
    use ncclDataType_t::*;
    let links = [
        super::cost::NetLink::from_properties(10_000, 0.0),
        super::cost::NetLink::from_properties(400_000, 2.0),
    ];
    for link in links {
        for kind in KINDS {
            for nranks in [2, 3, 4] {
                for (count, dtype) in [
                    (1, ncclInt8),
                    (5, ncclInt32),
                    (1000, ncclInt32),
                    (20_000, ncclInt8),
                ] {
                    let c = Case {
                        kind,
                        nranks,
                        nchannels: 8,
                        count,
                        dtype,
                        op: RedOp::Sum,
                        root: nranks - 1,
                        in_place: false,
                        misalign: 0,
                    };
                    let mut world = World::new();
                    let prepared = prepare(&mut world, &c);
                    let net = two_per_host(nranks, link);
                    let geoms = geometries_net(nranks, 8, 4096, 2, &prepared.tasks, &net);
                    run(&mut world, &geoms, &prepared.tasks, 2);
                    verify(&world, &c, &prepared);
                }
            }
        }
    }
}

#[test]
fn over_a_slow_network_plans_differ_from_nvlink() {
    use ncclDataType_t::*;
    let slow = super::cost::NetLink::from_properties(10_000, 0.0);
    let items = |kind, count, net: bool| {
        let c = Case {
            kind,
            nranks: 4,
            nchannels: 16,
            count,
            dtype: ncclInt32,
            op: RedOp::Sum,
            root: 0,
            in_place: false,
            misalign: 0,
        };
        let mut world = World::new();
        let prepared = prepare(&mut world, &c);
        let net_of = two_per_host(4, slow);
        let none = |_: i32| None;
        let geoms = geometries_net(
            4,
            16,
            4096,
            2,
            &prepared.tasks,
            if net { &net_of } else { &none },
        );
        let p = plan(&geoms[0], &prepared.tasks[0]).expect("plan");
        (p.grid, deserialize_all(&p.items))
    };
    // A small all-reduce: one-shot without the network, the ring over it.
    let (_, nv) = items(CollKind::AllReduce, 2, false);
    let (_, net) = items(CollKind::AllReduce, 2, true);
    assert!(nv
        .iter()
        .any(|w| w.kind == WorkKind::DirectAllReduce as u32));
    assert!(net.iter().all(|w| w.kind == WorkKind::RingAllReduce as u32));
    // A large one: never fewer CTAs (channels) over the network than without it.
    let (nv_grid, _) = items(CollKind::AllReduce, 4 << 20, false);
    let (net_grid, _) = items(CollKind::AllReduce, 4 << 20, true);
    assert!(
        net_grid >= nv_grid && nv_grid > 1,
        "{net_grid} CTAs over the network, {nv_grid} without"
    );
    // A large send to the next host (rank 0 -> 1 stays on the host, 3 -> 0 crosses): rank 0's
    // receive from rank 3 is split in at least as many parts as its send to rank 1.
    let (_, sends) = items(CollKind::Send, 4 << 20, true);
    let parts = |k: WorkKind| sends.iter().filter(|w| w.kind == k as u32).count();
    assert!(
        parts(WorkKind::Recv) >= parts(WorkKind::Send) && parts(WorkKind::Send) > 1,
        "{} receive parts, {} send parts",
        parts(WorkKind::Recv),
        parts(WorkKind::Send)
    );
}

#[test]
fn items_on_parking_peers_are_flagged_and_make_a_yielding_plan() {
    // Ranks 0,1 on one host and 2,3 on the next (all on one GPU): only waits on peers of the
    // other host may park, so only the ring items that cross the host boundary are flagged.
    use super::device::{FLAG_PARK_RECV, FLAG_PARK_SEND};
    let link = super::cost::NetLink::from_properties(10_000, 0.0);
    let nranks = 4;
    let tasks: Vec<Vec<Task>> = (0..nranks)
        .map(|_| {
            vec![Task {
                kind: CollKind::AllReduce,
                dtype: ncclDataType_t::ncclFloat32,
                op: RedOp::Sum,
                count: 1 << 16,
                sendbuff: 0x1000,
                recvbuff: 0x1000_0000,
                root: 0,
                opts: Default::default(),
                weights_epoch: 0,
            }]
        })
        .collect();
    let mut geoms = geometries_net(nranks, 4, 1 << 16, 4, &tasks, &two_per_host(nranks, link));
    let unflagged: Vec<Plan> = geoms
        .iter()
        .zip(&tasks)
        .map(|(g, t)| plan(g, t).unwrap())
        .collect();
    for (g, p) in geoms.iter_mut().zip(&unflagged) {
        assert!(!p.yields);
        g.park = (0..nranks).map(|peer| peer / 2 != g.rank / 2).collect();
    }
    for ((g, t), before) in geoms.iter().zip(&tasks).zip(&unflagged) {
        let p = plan(g, t).unwrap();
        assert!(p.yields, "rank {}", g.rank);
        let (next, prev) = ((g.rank + 1) % nranks, (g.rank + nranks - 1) % nranks);
        for (w, b) in deserialize_all(&p.items)
            .iter()
            .zip(deserialize_all(&before.items))
        {
            let park_send = g.park[next as usize];
            let park_recv = g.park[prev as usize];
            assert_eq!(
                w.flags & FLAG_PARK_SEND != 0,
                park_send,
                "rank {} item {w:?}",
                g.rank
            );
            assert_eq!(
                w.flags & FLAG_PARK_RECV != 0,
                park_recv,
                "rank {} item {w:?}",
                g.rank
            );
            // Nothing else changes.
            let mut w = *w;
            w.flags &= !(FLAG_PARK_SEND | FLAG_PARK_RECV);
            assert_eq!(w, b);
        }
    }
}

/// Hosts whose ranks interleave (rank r on `hosts[r]`): 4 ranks on 2 hosts, 6 on 2 and on 3,
/// and 5 on 3 hosts of unequal size. Their ring orders group each host's ranks.
fn interleaved_hosts() -> Vec<Vec<u64>> {
    vec![
        vec![0, 1, 0, 1],
        vec![0, 1, 0, 1, 0, 1],
        vec![0, 1, 2, 0, 1, 2],
        vec![5, 7, 7, 5, 2],
    ]
}

/// Each rank's view of a network between the hosts `hosts` (rank r on `hosts[r]`).
fn net_between(hosts: Vec<u64>) -> impl Fn(i32) -> Option<NetView> {
    let link = super::cost::NetLink::from_properties(100_000, 1.0);
    move |rank| {
        Some(NetView {
            link,
            remote: hosts.iter().map(|&h| h != hosts[rank as usize]).collect(),
            routes: super::Routes::even(),
        })
    }
}

/// Run case `c` `launches` times on the ring order of `hosts` (over the network between them
/// when `net`, else as if every path were in-node) and check the results.
fn check_on_hosts(c: &Case, hosts: &[u64], net: bool, launches: usize) {
    let order = RingOrder::by_host(hosts);
    assert_eq!(order.nranks(), c.nranks);
    let mut world = World::new();
    let prepared = prepare(&mut world, c);
    let over_net = net_between(hosts.to_vec());
    let none = |_: i32| None;
    let net_of: &dyn Fn(i32) -> Option<NetView> = if net { &over_net } else { &none };
    let geoms = geometries_ring(&mut world, c.nchannels, &prepared.tasks, net_of, &order);
    run(&mut world, &geoms, &prepared.tasks, launches);
    verify(&world, c, &prepared);
}

#[test]
fn permuted_rings_every_ring_collective_every_root() {
    use ncclDataType_t::*;
    for hosts in interleaved_hosts() {
        let nranks = hosts.len() as i32;
        assert!(!RingOrder::by_host(&hosts).is_identity(), "{hosts:?}");
        for kind in CollKind::RINGS {
            let roots = if kind.has_root() { 0..nranks } else { 0..1 };
            for root in roots {
                for nchannels in [1, 3] {
                    for (count, dtype) in [
                        (1, ncclInt8),
                        (5, ncclInt32),
                        (1000, ncclInt32),
                        (5000, ncclInt8),
                    ] {
                        for net in [false, true] {
                            let c = Case {
                                kind,
                                nranks,
                                nchannels,
                                count,
                                dtype,
                                op: RedOp::Sum,
                                root,
                                in_place: false,
                                misalign: 0,
                            };
                            check_on_hosts(&c, &hosts, net, 2);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn permuted_rings_ops_in_place_and_many_rounds() {
    use ncclDataType_t::*;
    let ops = EVERY_OP;
    for hosts in [vec![0u64, 1, 0, 1], vec![0, 1, 2, 0, 1, 2]] {
        let nranks = hosts.len() as i32;
        for kind in CollKind::RINGS {
            for op in ops {
                for dtype in [ncclInt8, ncclInt64] {
                    for in_place in [false, true] {
                        let c = Case {
                            kind,
                            nranks,
                            nchannels: 2,
                            count: 777,
                            dtype,
                            op,
                            root: 1,
                            in_place,
                            misalign: 3 * dtype.size() as u64,
                        };
                        // An in-place reduction changes its own input: run it once.
                        let launches = if in_place && !is_idempotent(kind, op) {
                            1
                        } else {
                            2
                        };
                        check_on_hosts(&c, &hosts, true, launches);
                    }
                }
            }
            // Hundreds of rounds per channel over 4 KiB slots.
            let c = Case {
                kind,
                nranks,
                nchannels: 3,
                count: 100_003,
                dtype: ncclInt32,
                op: RedOp::Sum,
                root: nranks - 1,
                in_place: false,
                misalign: 0,
            };
            check_on_hosts(&c, &hosts, true, 2);
        }
    }
}

#[test]
fn permuted_ring_items_follow_the_order() {
    // Rank r's ring items send to the next rank of the order and receive from the previous
    // one, on every ring channel, and carry positions; only all-gather and reduce-scatter
    // carry the table, and in rank order nothing changes.
    use ncclDataType_t::*;
    for hosts in interleaved_hosts() {
        let order = RingOrder::by_host(&hosts);
        let n = order.nranks();
        for kind in CollKind::RINGS {
            let c = Case {
                kind,
                nranks: n,
                nchannels: 4,
                count: 100_000,
                dtype: ncclInt32,
                op: RedOp::Sum,
                root: n - 1,
                in_place: false,
                misalign: 0,
            };
            let mut world = World::new();
            let prepared = prepare(&mut world, &c);
            let net = net_between(hosts.clone());
            let geoms = geometries_ring(&mut world, 4, &prepared.tasks, &net, &order);
            let plain = geometries_net(n, 4, 4096, 2, &prepared.tasks, &net);
            for rank in 0..n {
                let g = &geoms[rank as usize];
                let tasks = &prepared.tasks[rank as usize];
                for (ch, peer, dir) in
                    connections_needed(rank, n, 4, g.net.as_ref(), &order, None, tasks)
                {
                    assert!(ch < 4, "{kind:?}: a ring task needs ring rows only");
                    let want = match dir {
                        Dir::Send => order.next_of(rank),
                        Dir::Recv => order.prev_of(rank),
                    };
                    assert_eq!(peer, want, "{kind:?} rank {rank} {dir:?} on {hosts:?}");
                }
                let items = deserialize_all(&plan(g, tasks).unwrap().items);
                let in_rank_order =
                    deserialize_all(&plan(&plain[rank as usize], tasks).unwrap().items);
                assert_eq!(items.len(), in_rank_order.len());
                assert!(!items.is_empty());
                let pos = order.position_of(rank);
                for (w, v) in items.iter().zip(&in_rank_order) {
                    assert_eq!((w.rank, v.rank), (pos, rank));
                    assert_eq!(v.flags & FLAG_RING_ORDER, 0);
                    if kind.has_root() {
                        assert_eq!((w.root, v.root), (order.position_of(c.root), c.root));
                    }
                    let es = c.dtype.size() as u64;
                    if matches!(kind, CollKind::AllGather | CollKind::ReduceScatter) {
                        assert_ne!(w.flags & FLAG_RING_ORDER, 0);
                        assert_eq!(w.offset, g.ring_table);
                        assert_eq!(w.src, v.src + v.offset * es);
                        assert_eq!(w.dst, v.dst + v.offset * es);
                        assert_eq!(w.flags & !FLAG_RING_ORDER, v.flags);
                    } else {
                        assert_eq!((w.flags, w.offset, w.src), (v.flags, v.offset, v.src));
                    }
                    assert_eq!((w.count, w.block, w.chunk), (v.count, v.block, v.chunk));
                }
            }
        }
    }
    // Contiguous hosts: rank order, and the plans of the two agree to the byte.
    let hosts = [3u64, 3, 8, 8];
    let order = RingOrder::by_host(&hosts);
    assert!(order.is_identity());
    for kind in CollKind::RINGS {
        let c = Case {
            kind,
            nranks: 4,
            nchannels: 4,
            count: 5000,
            dtype: ncclInt8,
            op: RedOp::Sum,
            root: 2,
            in_place: false,
            misalign: 0,
        };
        let mut world = World::new();
        let prepared = prepare(&mut world, &c);
        let net = net_between(hosts.to_vec());
        let geoms = geometries_ring(&mut world, 4, &prepared.tasks, &net, &order);
        let plain = geometries_net(4, 4, 4096, 2, &prepared.tasks, &net);
        for rank in 0..4 {
            assert_eq!(geoms[rank].ring_table, 0);
            let tasks = &prepared.tasks[rank];
            assert_eq!(
                plan(&geoms[rank], tasks).unwrap(),
                plan(&plain[rank], tasks).unwrap()
            );
        }
    }
}

#[test]
fn a_permuted_ring_without_its_table_is_refused() {
    let order = RingOrder::by_host(&[0, 1, 0, 1]);
    let tasks = vec![
        vec![float_task(
            CollKind::AllGather,
            100,
            0x1000,
            0x9000,
            RedOp::Sum
        )];
        4
    ];
    let mut g = geometries_on(4, 4096, 2, &tasks, &|_| None, &order, &[0; 4]).remove(0);
    let e = plan(&g, &tasks[0]).unwrap_err();
    assert!(e.msg.contains("table"), "{}", e.msg);
    g.ring = RingOrder::identity(5);
    let e = plan(&g, &tasks[0]).unwrap_err();
    assert!(e.msg.contains("ring order"), "{}", e.msg);
}

/// `check` with the options `opts` on every task (as every rank passes the same config):
/// every rank's plan stays within `opts.max_ctas` CTAs, and the data are right.
fn check_with(c: &Case, opts: TaskOptions) {
    let mut world = World::new();
    let mut prepared = prepare(&mut world, c);
    for t in prepared.tasks.iter_mut().flatten() {
        t.opts = opts;
    }
    let geoms = geometries(c.nranks, c.nchannels, 4096, 2, &prepared.tasks);
    if opts.max_ctas > 0 {
        for (g, t) in geoms.iter().zip(&prepared.tasks) {
            let p = plan(g, t).expect("plan");
            assert!(
                p.grid <= opts.max_ctas,
                "{:?} n={} count={}: grid {} > maxCTAs {}",
                c.kind,
                c.nranks,
                c.count,
                p.grid,
                opts.max_ctas
            );
        }
    }
    run(&mut world, &geoms, &prepared.tasks, 2);
    verify(&world, c, &prepared);
}

#[test]
fn per_call_options_every_collective_is_correct_within_its_ctas() {
    let ring_only = Algorithms { one_shot: false };
    let options = [
        (1, 1, Algorithms { one_shot: true }),
        (0, 2, Algorithms { one_shot: true }),
        (4, 4, Algorithms { one_shot: true }),
        (3, 3, ring_only),
        (5, 0, ring_only),
    ];
    for kind in KINDS {
        for nranks in [2, 3, 4] {
            for count in [5usize, 1000, 70000] {
                for (min_ctas, max_ctas, algorithms) in options {
                    let case = Case {
                        kind,
                        nranks,
                        nchannels: 8,
                        count,
                        dtype: ncclDataType_t::ncclInt32,
                        op: RedOp::Sum,
                        root: nranks - 1,
                        in_place: false,
                        misalign: 0,
                    };
                    let opts = TaskOptions {
                        min_ctas,
                        max_ctas,
                        algorithms,
                    };
                    check_with(&case, opts);
                }
            }
        }
    }
}

/// The plan of rank 0 of `nranks` on `nchannels` channels for `tasks_of(rank)`.
fn plan0(nranks: i32, nchannels: u32, tasks_of: &dyn Fn(i32) -> Vec<Task>) -> Plan {
    let tasks: Vec<Vec<Task>> = (0..nranks).map(tasks_of).collect();
    let geoms = geometries(nranks, nchannels, 4096, 2, &tasks);
    plan(&geoms[0], &tasks[0]).expect("plan")
}

/// A float task of `kind` with `count` elements and the options `opts`, on rank `rank`'s
/// buffers.
fn opt_task(kind: CollKind, count: usize, rank: i32, opts: TaskOptions) -> Task {
    let base = 0x10_0000_0000u64 * (rank as u64 + 1);
    Task {
        opts,
        ..float_task(kind, count, base, base + 0x8_0000_0000, RedOp::Sum)
    }
}

#[test]
fn per_call_options_bound_channels_and_filter_algorithms() {
    let plain = TaskOptions::default();
    let caps = |min_ctas, max_ctas| TaskOptions {
        min_ctas,
        max_ctas,
        ..plain
    };
    let grid = |kind, count, opts| plan0(4, 16, &|r| vec![opt_task(kind, count, r, opts)]).grid;
    // A large all-reduce spreads over many channels, unless capped.
    assert!(grid(CollKind::AllReduce, 4 << 20, plain) > 4);
    assert_eq!(grid(CollKind::AllReduce, 4 << 20, caps(0, 4)), 4);
    assert_eq!(grid(CollKind::AllReduce, 4 << 20, caps(0, 1)), 1);
    // A small one uses one channel, unless raised.
    assert_eq!(grid(CollKind::AllGather, 16, plain), 1);
    assert_eq!(grid(CollKind::AllGather, 16, caps(1, 0)), 1);
    assert_eq!(grid(CollKind::AllGather, 1 << 12, caps(6, 6)), 6);
    // The floor never passes the communicator's channels.
    assert_eq!(
        plan0(4, 2, &|r| vec![opt_task(
            CollKind::Reduce,
            1 << 16,
            r,
            caps(8, 0)
        )])
        .grid,
        2
    );
    // P2P collectives fold onto the cap too, whatever their peers.
    for kind in [CollKind::AlltoAll, CollKind::Gather, CollKind::Scatter] {
        assert!(grid(kind, 1 << 20, plain) > 1, "{kind:?}");
        assert_eq!(grid(kind, 1 << 20, caps(0, 1)), 1, "{kind:?}");
        assert!(grid(kind, 1 << 20, caps(0, 3)) <= 3, "{kind:?}");
    }
    // The selection turns the one-shot all-reduce off.
    let kinds = |opts| {
        let p = plan0(4, 16, &|r| vec![opt_task(CollKind::AllReduce, 64, r, opts)]);
        deserialize_all(&p.items)
            .iter()
            .map(|w| w.kind)
            .collect::<Vec<u32>>()
    };
    assert!(kinds(plain).contains(&(WorkKind::DirectAllReduce as u32)));
    let ring = TaskOptions {
        algorithms: Algorithms { one_shot: false },
        ..plain
    };
    assert!(kinds(ring)
        .iter()
        .all(|&k| k == WorkKind::RingAllReduce as u32));
    // In one group, a capped task keeps to its CTAs while a plain one spreads.
    let p = plan0(4, 16, &|r| {
        vec![
            opt_task(CollKind::AlltoAll, 1 << 20, r, caps(0, 1)),
            opt_task(CollKind::AllReduce, 4 << 20, r, plain),
        ]
    });
    let items = deserialize_all(&p.items);
    assert!(p.grid > 4);
    assert!(items
        .iter()
        .filter(|w| w.kind == WorkKind::Send as u32 || w.kind == WorkKind::Recv as u32)
        .all(|w| w.cta == 0));
}

#[test]
fn equal_options_plan_as_the_plain_call() {
    // Options that restrict nothing: the communicator's channels, no floor above its own.
    let same = |nchannels| TaskOptions {
        min_ctas: 1,
        max_ctas: nchannels,
        ..TaskOptions::default()
    };
    for nchannels in [1, 3, 16] {
        for nranks in [1, 2, 4] {
            for kind in KINDS {
                for count in [0usize, 7, 5000, 1 << 20] {
                    let tasks_of = |opts| {
                        move |r: i32| {
                            let mut t = vec![opt_task(kind, count, r, opts)];
                            if kind == CollKind::Send {
                                let n = nranks;
                                t[0].root = (r + 1) % n;
                                t.push(Task {
                                    kind: CollKind::Recv,
                                    root: (r + n - 1) % n,
                                    ..t[0]
                                });
                            }
                            t
                        }
                    };
                    assert_eq!(
                        plan0(nranks, nchannels, &tasks_of(TaskOptions::default())),
                        plan0(nranks, nchannels, &tasks_of(same(nchannels))),
                        "{kind:?} n={nranks} ch={nchannels} count={count}"
                    );
                }
            }
        }
    }
}

/// Each rank's view of a network between hosts of two ranks each (as `two_per_host`) whose
/// two devices run at 4000 and 1000 Mbit/s, with the routes every rank agrees on.
fn two_unequal_devices(nranks: i32, nchannels: u32) -> impl Fn(i32) -> Option<NetView> {
    let claim = super::weights::RouteClaim {
        speeds_mbps: vec![4000, 1000],
        weighted: true,
        hop_mbps: 0,
        adaptive: false,
    };
    let claims = vec![claim; nranks as usize];
    let (routes, _) = super::Routes::agree(nchannels, &claims);
    assert!(routes.is_weighted());
    let link = super::cost::NetLink::from_properties(5000, 0.0);
    move |rank| {
        Some(NetView {
            link,
            remote: (0..nranks).map(|peer| peer / 2 != rank / 2).collect(),
            routes: routes.clone(),
        })
    }
}

#[test]
fn weighted_channels_every_collective_is_correct() {
    // Channels split in proportion to their devices' speeds: every collective (ring ones by
    // weight, P2P ones with peers over the network by weight) still gives the exact results.
    use ncclDataType_t::*;
    for kind in KINDS {
        for nranks in [2, 4] {
            for (count, dtype) in [(5, ncclInt32), (1000, ncclInt32), (200_000, ncclInt8)] {
                let c = Case {
                    kind,
                    nranks,
                    nchannels: 8,
                    count,
                    dtype,
                    op: RedOp::Sum,
                    root: nranks - 1,
                    in_place: false,
                    misalign: 0,
                };
                let mut world = World::new();
                let prepared = prepare(&mut world, &c);
                let net = two_unequal_devices(nranks, 8);
                let geoms = geometries_net(nranks, 8, 4096, 2, &prepared.tasks, &net);
                run(&mut world, &geoms, &prepared.tasks, 2);
                verify(&world, &c, &prepared);
            }
        }
    }
}

/// A float sum all-reduce of `count` elements out of place, planned with weights `epoch`.
fn float_all_reduce(count: usize, epoch: u32) -> Task {
    Task {
        kind: CollKind::AllReduce,
        dtype: ncclDataType_t::ncclFloat32,
        op: RedOp::Sum,
        count,
        sendbuff: 0x1000,
        recvbuff: 0x1_0000_0000,
        root: 0,
        opts: Default::default(),
        weights_epoch: epoch,
    }
}

#[test]
fn weighted_channels_give_the_fast_device_its_share_of_the_bytes() {
    // A 64 MiB float all-reduce of 2 ranks on hosts of their own over a 4000 and a 1000
    // Mbit/s device: the channels on the fast device carry 4/5 of the elements; with even
    // routes (weighting off) the channels of each device carry the same per channel.
    let nranks = 2;
    let count = 16 << 20;
    let tasks: Vec<Vec<Task>> = (0..nranks)
        .map(|_| vec![float_all_reduce(count, 0)])
        .collect();
    let weighted = |rank: i32| {
        let mut v = two_unequal_devices(2, 64)(rank).unwrap();
        v.remote = vec![rank != 0, rank != 1];
        Some(v)
    };
    let geoms = geometries_net(nranks, 64, 1 << 16, 4, &tasks, &weighted);
    let routes = geoms[0].net.as_ref().unwrap().routes.clone();
    let per_device = |g: &Geometry| {
        let p = plan(g, &tasks[g.rank as usize]).unwrap();
        let mut elems = [0u64; 2];
        for w in deserialize_all(&p.items) {
            elems[routes.device_of_row(w.cta, 64, 2) as usize] += w.count;
        }
        elems
    };
    for g in &geoms {
        let [fast, slow] = per_device(g);
        assert_eq!(fast + slow, count as u64);
        let share = fast as f64 / count as f64;
        assert!(
            (share - 0.8).abs() < 0.01,
            "rank {}: {fast} / {slow}",
            g.rank
        );
    }
    // The same plans as without routes once the routes are even.
    let mut even = geoms.clone();
    for g in &mut even {
        g.net.as_mut().unwrap().routes = super::Routes::even();
    }
    let plain = |rank: i32| {
        let mut v = two_per_host(2, super::cost::NetLink::from_properties(5000, 0.0))(rank)?;
        v.remote = vec![rank != 0, rank != 1];
        Some(v)
    };
    let plain = geometries_net(nranks, 64, 1 << 16, 4, &tasks, &plain);
    for (e, p) in even.iter().zip(&plain) {
        assert_eq!(
            plan(e, &tasks[0]).unwrap(),
            plan(p, &tasks[0]).unwrap(),
            "rank {}",
            e.rank
        );
    }
}

#[test]
fn a_later_weights_epoch_moves_the_bytes_to_its_speeds() {
    // The same all-reduce as above planned with epoch 1, whose speeds say both devices now
    // carry 1000 Mbit/s: each device's channels carry half of the elements, while epoch 0
    // keeps 4/5 on the fast one.
    let nranks = 2;
    let count = 16 << 20;
    let task = |epoch: u32| float_all_reduce(count, epoch);
    // Connections for both epochs' plans (the slower epoch may use fewer channels).
    let tasks: Vec<Vec<Task>> = (0..nranks).map(|_| vec![task(0), task(1)]).collect();
    let weighted = |rank: i32| {
        let mut v = two_unequal_devices(2, 64)(rank).unwrap();
        v.remote = vec![rank != 0, rank != 1];
        v.routes.add_epoch(1, vec![1000, 1000]);
        Some(v)
    };
    let geoms = geometries_net(nranks, 64, 1 << 16, 4, &tasks, &weighted);
    let routes = geoms[0].net.as_ref().unwrap().routes.clone();
    for g in &geoms {
        for (epoch, want) in [(0, 0.8), (1, 0.5)] {
            let p = plan(g, &[task(epoch)]).unwrap();
            let mut elems = [0u64; 2];
            for w in deserialize_all(&p.items) {
                elems[routes.device_of_row(w.cta, 64, 2) as usize] += w.count;
            }
            let share = elems[0] as f64 / count as f64;
            assert!(
                (share - want).abs() < 0.01,
                "rank {} epoch {epoch}: {:?}",
                g.rank,
                elems
            );
        }
    }
}

/// Run `c` with `tuner` on every rank: exact results (as `check`), and rank 0's plan's
/// (LL?, channels) for the collective.
fn check_tuned(c: &Case, tuner: Arc<dyn crate::sched::Tuner>) -> (bool, u32) {
    let mut world = World::new();
    let prepared = prepare(&mut world, c);
    let mut geoms = geometries(c.nranks, c.nchannels, 4096, 2, &prepared.tasks);
    for g in &mut geoms {
        g.tuner = Some(tuner.clone());
    }
    connect_all(&mut geoms, &prepared.tasks, 4096, 2);
    let p = plan(&geoms[0], &prepared.tasks[0]).expect("plan");
    let items: Vec<OxWork> = deserialize_all(&p.items)
        .into_iter()
        .filter(|w| w.kind != WorkKind::Copy as u32)
        .collect();
    let ll = items.iter().all(|w| w.flags & FLAG_LL != 0);
    let channels: std::collections::BTreeSet<u32> = items.iter().map(|w| w.cta).collect();
    run(&mut world, &geoms, &prepared.tasks, 2);
    verify(&world, c, &prepared);
    (ll, channels.len() as u32)
}

#[test]
fn a_tuners_protocol_and_channels_are_planned_and_exact() {
    use crate::sched::tune::tests::Scripted;
    use crate::sched::tune::{ALGO_RING, PROTO_LL, PROTO_SIMPLE};
    use ncclDataType_t::*;
    with_protocols("", || {
        for kind in CollKind::RINGS {
            for (pick, channels, count) in [
                ((ALGO_RING, PROTO_SIMPLE), 3, 100_003),
                ((ALGO_RING, PROTO_LL), 5, 300_001),
                ((ALGO_RING, PROTO_SIMPLE), 0, 2),
            ] {
                let c = Case {
                    kind,
                    nranks: 4,
                    nchannels: 8,
                    count,
                    dtype: ncclInt32,
                    op: RedOp::Sum,
                    root: 1,
                    in_place: false,
                    misalign: 0,
                };
                let tuner = Arc::new(Scripted {
                    pick: Some(pick),
                    channels,
                    ..Default::default()
                });
                let (ll, nch) = check_tuned(&c, tuner.clone());
                assert_eq!(ll, pick.1 == PROTO_LL, "{kind:?} {pick:?}");
                if channels > 0 {
                    assert_eq!(nch, channels, "{kind:?} {pick:?}");
                }
                let seen = tuner.seen.lock();
                assert!(!seen.is_empty(), "{kind:?}: the tuner was asked");
                let (q, _) = seen[0];
                assert_eq!(q.func, crate::sched::tune::func_of(kind));
                let block = count as u64 * 4;
                assert_eq!(q.bytes, crate::sched::tune::nccl_bytes(kind, block, 4));
            }
        }
    });
}
