//! The watchdog's messages on the bootstrap: progress queries and their answers, lost-rank
//! and failed-check notices (`KIND_WATCH`, told apart by tag), the farewell of an orderly
//! close (`KIND_BYE`) and the signatures of the collective check (`KIND_CHECK`, `check.rs`). Little-endian with a version byte first; decoding checks every length and
//! value and never panics, since a peer may be buggy or of another version (it gives None).

use crate::abi::ncclDataType_t;
use crate::core::progress::OpRecord;
use crate::sched::device::op_code;
use crate::sched::CollKind;

pub const TAG_QUERY: u64 = 1;
pub const TAG_REPLY: u64 = 2;
pub const TAG_LOST: u64 = 3;
/// A rank's collective check found a mismatch: its communicator is failed everywhere.
pub const TAG_CHECK_FAILED: u64 = 4;
const VERSION: u8 = 1;
/// Longest text a message carries (a lost-rank reason).
const MAX_TEXT: usize = 4096;
/// Most signatures in one message of the collective check (a message stays well under the
/// bootstrap's 64 KiB limit for its kind; a larger group sends several).
pub const MAX_SIGNATURES: usize = 1024;

/// What an operation was, as reports print and compare it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpDesc {
    pub kind: CollKind,
    /// Collective number, or the number with the peer for send/recv.
    pub seq: u64,
    pub count: u64,
    pub dtype: ncclDataType_t,
    /// The kernels' op code (`sched::device::op`).
    pub op: u32,
    /// Root of a rooted collective, peer of a send or receive.
    pub root: i32,
}

impl From<&OpRecord> for OpDesc {
    fn from(r: &OpRecord) -> OpDesc {
        OpDesc {
            kind: r.kind,
            seq: r.seq,
            count: r.count as u64,
            dtype: r.dtype,
            op: op_code(r.op),
            root: r.root,
        }
    }
}

/// Sends and receives between a rank and the one that asked it: enqueued and completed
/// (`u64::MAX`: not known, older than the kept history).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pCounts {
    pub sends: u64,
    pub sends_done: u64,
    pub recvs: u64,
    pub recvs_done: u64,
}

/// One rank's progress, as it answers a query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankState {
    pub rank: i32,
    /// Ordinals of the last operation enqueued, launched and known completed.
    pub enqueued: u64,
    pub launched: u64,
    pub completed: u64,
    /// Collectives enqueued and completed (`u64::MAX`: not known).
    pub collectives: u64,
    pub collectives_done: u64,
    pub last_collective: Option<OpDesc>,
    pub last_collective_done: Option<OpDesc>,
    /// The first operation not completed, while some are pending.
    pub waiting: Option<OpDesc>,
    /// Seconds without progress while work is pending (0 otherwise).
    pub stalled_s: u32,
    /// Its operation with the number the query asked about, if it has one (kept).
    pub asked: Option<OpDesc>,
    pub p2p: P2pCounts,
}

/// A rank asking the others where they are: stuck (`waiting` in an operation for
/// `stalled_s`), or for an on-demand status (`status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    pub round: u64,
    pub waiting: Option<OpDesc>,
    pub stalled_s: u32,
    pub status: bool,
}

/// Why a rank left in order, as its farewell says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Departure {
    Destroyed,
    Aborted,
    /// The process exited (normally, running its exit handlers) with the communicator live.
    Exited,
}

impl Departure {
    /// How the rank left, as messages say it.
    pub fn call(self) -> &'static str {
        match self {
            Departure::Destroyed => "ncclCommDestroy",
            Departure::Aborted => "ncclCommAbort",
            Departure::Exited => "its process exited without ncclCommDestroy",
        }
    }
}

/// The last word of a rank that leaves in order: how far it got with the receiving rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Farewell {
    pub reason: Departure,
    /// Collectives it completed, and sends to / receives from the receiving rank completed.
    pub collectives_done: u64,
    pub sends_done: u64,
    pub recvs_done: u64,
}

/// Another rank found `rank` gone; `why` says how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lost {
    pub rank: i32,
    pub why: String,
}

#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn new() -> Writer {
        Writer(vec![VERSION])
    }
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn i32(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn op(&mut self, op: &Option<OpDesc>) -> &mut Self {
        match op {
            None => self.u8(0),
            Some(d) => {
                let kind = CollKind::ALL.iter().position(|&k| k == d.kind).unwrap_or(0);
                self.u8(1).u8(kind as u8).u64(d.seq).u64(d.count);
                self.u8(d.dtype as u8).u32(d.op).i32(d.root)
            }
        }
    }
    fn text(&mut self, t: &str) -> &mut Self {
        let b = &t.as_bytes()[..t.len().min(MAX_TEXT)];
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    /// A reader past the version byte, if it is ours.
    fn new(b: &[u8]) -> Option<Reader<'_>> {
        match b.split_first() {
            Some((&VERSION, rest)) => Some(Reader(rest)),
            _ => None,
        }
    }
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_at_checked(N)?;
        self.0 = rest;
        head.try_into().ok()
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn i32(&mut self) -> Option<i32> {
        self.take().map(i32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
    fn op(&mut self) -> Option<Option<OpDesc>> {
        if self.u8()? == 0 {
            return Some(None);
        }
        let kind = *CollKind::ALL.get(self.u8()? as usize)?;
        let (seq, count) = (self.u64()?, self.u64()?);
        let dtype = ncclDataType_t::from_raw(crate::abi::RawDataType(self.u8()? as i32))?;
        let (op, root) = (self.u32()?, self.i32()?);
        Some(Some(OpDesc {
            kind,
            seq,
            count,
            dtype,
            op,
            root,
        }))
    }
    fn text(&mut self) -> Option<String> {
        let len = self.u32()? as usize;
        if len > MAX_TEXT {
            return None;
        }
        let (head, rest) = self.0.split_at_checked(len)?;
        self.0 = rest;
        Some(crate::bootstrap::socket::printable(head))
    }
    /// The value, if nothing is left over.
    fn done<T>(&self, v: T) -> Option<T> {
        self.0.is_empty().then_some(v)
    }
}

pub fn encode_query(q: &Query) -> Vec<u8> {
    let mut w = Writer::new();
    w.u64(q.round)
        .op(&q.waiting)
        .u32(q.stalled_s)
        .u8(q.status as u8);
    w.0
}

pub fn decode_query(b: &[u8]) -> Option<Query> {
    let mut r = Reader::new(b)?;
    let round = r.u64()?;
    let waiting = r.op()?;
    let stalled_s = r.u32()?;
    let status = match r.u8()? {
        0 => false,
        1 => true,
        _ => return None,
    };
    r.done(Query {
        round,
        waiting,
        stalled_s,
        status,
    })
}

pub fn encode_reply(round: u64, s: &RankState) -> Vec<u8> {
    let mut w = Writer::new();
    w.u64(round).i32(s.rank);
    w.u64(s.enqueued).u64(s.launched).u64(s.completed);
    w.u64(s.collectives).u64(s.collectives_done);
    w.op(&s.last_collective)
        .op(&s.last_collective_done)
        .op(&s.waiting);
    w.u32(s.stalled_s).op(&s.asked);
    let p = &s.p2p;
    w.u64(p.sends)
        .u64(p.sends_done)
        .u64(p.recvs)
        .u64(p.recvs_done);
    w.0
}

pub fn decode_reply(b: &[u8]) -> Option<(u64, RankState)> {
    let mut r = Reader::new(b)?;
    let round = r.u64()?;
    let state = RankState {
        rank: r.i32()?,
        enqueued: r.u64()?,
        launched: r.u64()?,
        completed: r.u64()?,
        collectives: r.u64()?,
        collectives_done: r.u64()?,
        last_collective: r.op()?,
        last_collective_done: r.op()?,
        waiting: r.op()?,
        stalled_s: r.u32()?,
        asked: r.op()?,
        p2p: P2pCounts {
            sends: r.u64()?,
            sends_done: r.u64()?,
            recvs: r.u64()?,
            recvs_done: r.u64()?,
        },
    };
    r.done((round, state))
}

pub fn encode_lost(l: &Lost) -> Vec<u8> {
    let mut w = Writer::new();
    w.i32(l.rank).text(&l.why);
    w.0
}

pub fn decode_lost(b: &[u8]) -> Option<Lost> {
    let mut r = Reader::new(b)?;
    let rank = r.i32()?;
    let why = r.text()?;
    r.done(Lost { rank, why })
}

/// The signatures of the operations a rank is about to run, for the collective check: its
/// collectives for every other rank, its sends to and receives from one peer for that peer
/// (at most [`MAX_SIGNATURES`]).
pub fn encode_signatures(ops: &[OpDesc]) -> Vec<u8> {
    let ops = &ops[..ops.len().min(MAX_SIGNATURES)];
    let mut w = Writer::new();
    w.u32(ops.len() as u32);
    for op in ops {
        w.op(&Some(*op));
    }
    w.0
}

pub fn decode_signatures(b: &[u8]) -> Option<Vec<OpDesc>> {
    let mut r = Reader::new(b)?;
    let n = r.u32()? as usize;
    if n > MAX_SIGNATURES {
        return None;
    }
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        ops.push(r.op()??);
    }
    r.done(ops)
}

/// The notice of a failed collective check: what the rank that found it saw.
pub fn encode_check_failed(text: &str) -> Vec<u8> {
    let mut w = Writer::new();
    w.text(text);
    w.0
}

pub fn decode_check_failed(b: &[u8]) -> Option<String> {
    let mut r = Reader::new(b)?;
    let text = r.text()?;
    r.done(text)
}

pub fn encode_farewell(f: &Farewell) -> Vec<u8> {
    let mut w = Writer::new();
    w.u8(f.reason as u8);
    w.u64(f.collectives_done)
        .u64(f.sends_done)
        .u64(f.recvs_done);
    w.0
}

pub fn decode_farewell(b: &[u8]) -> Option<Farewell> {
    let mut r = Reader::new(b)?;
    let reason = match r.u8()? {
        0 => Departure::Destroyed,
        1 => Departure::Aborted,
        2 => Departure::Exited,
        _ => return None,
    };
    let f = Farewell {
        reason,
        collectives_done: r.u64()?,
        sends_done: r.u64()?,
        recvs_done: r.u64()?,
    };
    r.done(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::fuzz::{self, Rng};

    fn op(kind: CollKind, seq: u64, count: u64) -> OpDesc {
        OpDesc {
            kind,
            seq,
            count,
            dtype: ncclDataType_t::ncclBfloat16,
            op: 4,
            root: 3,
        }
    }

    fn state() -> RankState {
        RankState {
            rank: 2,
            enqueued: 9,
            launched: 8,
            completed: 7,
            collectives: 5,
            collectives_done: u64::MAX,
            last_collective: Some(op(CollKind::AllGather, 5, 1024)),
            last_collective_done: None,
            waiting: Some(op(CollKind::Send, 2, 7)),
            stalled_s: 61,
            asked: Some(op(CollKind::Recv, 2, 7)),
            p2p: P2pCounts {
                sends: 1,
                sends_done: 2,
                recvs: 3,
                recvs_done: 4,
            },
        }
    }

    #[test]
    fn every_message_decodes_to_what_was_encoded() {
        let q = Query {
            round: 7,
            waiting: Some(op(CollKind::AllReduce, 57, 4096)),
            stalled_s: 3,
            status: true,
        };
        assert_eq!(decode_query(&encode_query(&q)), Some(q));
        assert_eq!(
            decode_reply(&encode_reply(11, &state())),
            Some((11, state()))
        );
        let l = Lost {
            rank: 3,
            why: "gone".into(),
        };
        assert_eq!(decode_lost(&encode_lost(&l)), Some(l));
        let f = Farewell {
            reason: Departure::Aborted,
            collectives_done: 5,
            sends_done: 1,
            recvs_done: 0,
        };
        assert_eq!(decode_farewell(&encode_farewell(&f)), Some(f));
        let sigs = vec![op(CollKind::AllReduce, 4, 4096), op(CollKind::Send, 1, 7)];
        assert_eq!(decode_signatures(&encode_signatures(&sigs)), Some(sigs));
        assert_eq!(decode_signatures(&encode_signatures(&[])), Some(vec![]));
        let text = "rank 1 called ncclAllGather #4 (1024 × float)";
        assert_eq!(
            decode_check_failed(&encode_check_failed(text)).as_deref(),
            Some(text)
        );
    }

    #[test]
    fn a_signature_batch_is_cut_at_its_limit_and_a_longer_count_refused() {
        let many = vec![op(CollKind::AllReduce, 1, 1); MAX_SIGNATURES + 5];
        let b = encode_signatures(&many);
        assert_eq!(decode_signatures(&b).map(|v| v.len()), Some(MAX_SIGNATURES));
        assert!(b.len() < 64 << 10, "{} bytes", b.len());
        let mut forged = b.clone();
        forged[1..5].copy_from_slice(&(MAX_SIGNATURES as u32 + 1).to_le_bytes());
        assert_eq!(decode_signatures(&forged), None);
        let mut absent = encode_signatures(&many[..1]);
        absent[5] = 0; // "no operation" where a signature must be
        assert_eq!(decode_signatures(&absent), None);
    }

    #[test]
    fn truncated_extended_or_skewed_messages_are_refused() {
        let reply = encode_reply(1, &state());
        for cut in 0..reply.len() {
            assert_eq!(decode_reply(&reply[..cut]), None, "cut at {cut}");
        }
        let mut longer = reply.clone();
        longer.push(0);
        assert_eq!(decode_reply(&longer), None);
        let mut other_version = reply;
        other_version[0] = VERSION + 1;
        assert_eq!(decode_reply(&other_version), None);
    }

    /// Random bytes and damaged messages never panic a decoder.
    #[test]
    fn fuzzed_messages_never_panic() {
        let good = [
            encode_reply(1, &state()),
            encode_query(&Query {
                round: 1,
                waiting: Some(op(CollKind::Reduce, 1, 1)),
                stalled_s: 0,
                status: false,
            }),
            encode_lost(&Lost {
                rank: 1,
                why: "x".repeat(100),
            }),
            encode_signatures(&[op(CollKind::Gather, 9, 3), op(CollKind::Recv, 2, 5)]),
            encode_check_failed("mismatch"),
        ];
        fuzz::run(
            "watchdog messages",
            0x3a7c_11d0,
            2000,
            std::time::Duration::from_secs(2),
            |rng: &mut Rng| {
                let mut b = if rng.one_in(3) {
                    let n = rng.below(200) as usize;
                    rng.bytes(n)
                } else {
                    good[rng.below(good.len() as u64) as usize].clone()
                };
                for _ in 0..rng.below(4) {
                    if !b.is_empty() {
                        let i = rng.below(b.len() as u64) as usize;
                        b[i] ^= 1 << rng.below(8);
                    }
                }
                let _ = (
                    decode_reply(&b),
                    decode_query(&b),
                    decode_lost(&b),
                    decode_farewell(&b),
                    decode_signatures(&b),
                    decode_check_failed(&b),
                );
            },
        );
    }
}
