//! The line protocol between the benchmark's processes. A child writes one event per line on
//! its stdout as `@@OXCCL <kind> key=value ...`; every other line (e.g. NCCL's own log) is
//! passed through by the parent. Per-rank events come from rank children (`-p`), aggregated
//! ones from the per-library children of a `--vs` run.

use crate::args::{Coll, Dtype, Op};
use std::collections::HashMap;

pub const PREFIX: &str = "@@OXCCL ";

/// One rank's measurement of one (collective, type, op, in-place, size).
#[derive(Debug, Clone, PartialEq)]
pub struct RankResult {
    pub key: ResultKey,
    pub rank: usize,
    pub time_us: f64,
    /// Wrong elements on this rank; -1 when not checked.
    pub wrong: i64,
}

/// What one row of results is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResultKey {
    pub coll: Coll,
    pub dtype: Dtype,
    pub op: Option<Op>,
    pub root: Option<usize>,
    pub size: u64,
    pub inplace: bool,
    pub count: usize,
    pub bytes: u64,
}

/// A measurement aggregated over all ranks: max over ranks of each rank's median time,
/// sum of wrong elements.
#[derive(Debug, Clone, PartialEq)]
pub struct AggResult {
    pub key: ResultKey,
    pub nranks: usize,
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    pub wrong: i64,
}

/// Communicator set-up figures of one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct InitInfo {
    pub rank: usize,
    pub device: usize,
    pub init_ms: f64,
    /// Device memory the library took during init (free before − free after).
    pub init_bytes: i64,
}

/// Init figures over all ranks (max of each).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InitSummary {
    pub version: i32,
    pub nranks: usize,
    pub init_ms: f64,
    pub init_bytes: i64,
    /// Device memory the library took during the first collective.
    pub first_coll_bytes: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Result(RankResult),
    Init(InitInfo),
    FirstCollMemory { rank: usize, bytes: i64 },
    Aggregated(AggResult),
    AggregatedInit(InitSummary),
}

fn key_fields(key: &ResultKey) -> String {
    format!(
        "coll={} dtype={} op={} root={} size={} inplace={} count={} bytes={}",
        key.coll,
        key.dtype,
        key.op.map_or("none", |o| o.name()),
        key.root.map_or(-1, |r| r as i64),
        key.size,
        u8::from(key.inplace),
        key.count,
        key.bytes
    )
}

/// The line for an event (without newline).
pub fn format_event(event: &Event) -> String {
    let body = match event {
        Event::Result(r) => format!(
            "res {} rank={} time_us={} wrong={}",
            key_fields(&r.key),
            r.rank,
            r.time_us,
            r.wrong
        ),
        Event::Init(i) => format!(
            "init rank={} device={} init_ms={} init_bytes={}",
            i.rank, i.device, i.init_ms, i.init_bytes
        ),
        Event::FirstCollMemory { rank, bytes } => format!("mem rank={rank} bytes={bytes}"),
        Event::Aggregated(a) => format!(
            "agg {} nranks={} time_us={} algbw={} busbw={} wrong={}",
            key_fields(&a.key),
            a.nranks,
            a.time_us,
            a.algbw,
            a.busbw,
            a.wrong
        ),
        Event::AggregatedInit(s) => format!(
            "agginit version={} nranks={} init_ms={} init_bytes={} first_coll_bytes={}",
            s.version, s.nranks, s.init_ms, s.init_bytes, s.first_coll_bytes
        ),
    };
    format!("{PREFIX}{body}")
}

struct Fields<'a>(HashMap<&'a str, &'a str>);

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Result<&'a str, String> {
        self.0
            .get(name)
            .copied()
            .ok_or_else(|| format!("missing field {name}"))
    }

    fn num<T: std::str::FromStr>(&self, name: &str) -> Result<T, String> {
        let text = self.get(name)?;
        text.parse()
            .map_err(|_| format!("bad value '{text}' for {name}"))
    }

    fn key(&self) -> Result<ResultKey, String> {
        let coll = self.get("coll")?;
        let dtype = self.get("dtype")?;
        let op = self.get("op")?;
        let root: i64 = self.num("root")?;
        Ok(ResultKey {
            coll: Coll::parse(coll).ok_or_else(|| format!("bad collective {coll}"))?,
            dtype: Dtype::parse(dtype).ok_or_else(|| format!("bad dtype {dtype}"))?,
            op: if op == "none" {
                None
            } else {
                Some(Op::parse(op).ok_or_else(|| format!("bad op {op}"))?)
            },
            root: usize::try_from(root).ok(),
            size: self.num("size")?,
            inplace: self.get("inplace")? == "1",
            count: self.num("count")?,
            bytes: self.num("bytes")?,
        })
    }
}

/// Parse a protocol line: `None` for lines that are not events, an error for malformed ones.
pub fn parse_event(line: &str) -> Option<Result<Event, String>> {
    let body = line.trim_end().strip_prefix(PREFIX)?;
    let mut words = body.split_whitespace();
    let kind = words.next().unwrap_or("");
    let fields = Fields(words.filter_map(|w| w.split_once('=')).collect());
    let parsed = (|| -> Result<Event, String> {
        Ok(match kind {
            "res" => Event::Result(RankResult {
                key: fields.key()?,
                rank: fields.num("rank")?,
                time_us: fields.num("time_us")?,
                wrong: fields.num("wrong")?,
            }),
            "init" => Event::Init(InitInfo {
                rank: fields.num("rank")?,
                device: fields.num("device")?,
                init_ms: fields.num("init_ms")?,
                init_bytes: fields.num("init_bytes")?,
            }),
            "mem" => Event::FirstCollMemory {
                rank: fields.num("rank")?,
                bytes: fields.num("bytes")?,
            },
            "agg" => Event::Aggregated(AggResult {
                key: fields.key()?,
                nranks: fields.num("nranks")?,
                time_us: fields.num("time_us")?,
                algbw: fields.num("algbw")?,
                busbw: fields.num("busbw")?,
                wrong: fields.num("wrong")?,
            }),
            "agginit" => Event::AggregatedInit(InitSummary {
                version: fields.num("version")?,
                nranks: fields.num("nranks")?,
                init_ms: fields.num("init_ms")?,
                init_bytes: fields.num("init_bytes")?,
                first_coll_bytes: fields.num("first_coll_bytes")?,
            }),
            other => return Err(format!("unknown event kind '{other}'")),
        })
    })();
    Some(parsed.map_err(|e| format!("malformed line from a child process ({e}): {line}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ResultKey {
        ResultKey {
            coll: Coll::ReduceScatter,
            dtype: Dtype::Bfloat16,
            op: Some(Op::PreMulSum),
            root: None,
            size: 1 << 20,
            inplace: true,
            count: 262_144,
            bytes: 1 << 20,
        }
    }

    #[test]
    fn events_round_trip() {
        let events = [
            Event::Result(RankResult {
                key: key(),
                rank: 3,
                time_us: 12.375,
                wrong: -1,
            }),
            Event::Init(InitInfo {
                rank: 1,
                device: 1,
                init_ms: 812.5,
                init_bytes: 1 << 29,
            }),
            Event::FirstCollMemory {
                rank: 0,
                bytes: -4096,
            },
            Event::Aggregated(AggResult {
                key: ResultKey {
                    op: None,
                    root: Some(1),
                    coll: Coll::Gather,
                    ..key()
                },
                nranks: 4,
                time_us: 1.5,
                algbw: 100.25,
                busbw: 75.0,
                wrong: 7,
            }),
            Event::AggregatedInit(InitSummary {
                version: 22809,
                nranks: 2,
                init_ms: 100.0,
                init_bytes: 10,
                first_coll_bytes: 20,
            }),
        ];
        for event in events {
            let line = format_event(&event);
            assert_eq!(parse_event(&line).unwrap().unwrap(), event, "{line}");
        }
    }

    #[test]
    fn other_lines_pass_through_and_bad_lines_fail() {
        assert!(parse_event("host:123:456 [0] NCCL INFO Bootstrap").is_none());
        assert!(parse_event("@@OXCCL res coll=all_reduce").unwrap().is_err());
        assert!(parse_event("@@OXCCL bogus a=b").unwrap().is_err());
    }
}
