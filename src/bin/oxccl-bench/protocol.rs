//! The line protocol between the benchmark's processes. A child writes one event per line on
//! its stdout as `@@OXCCL <kind> key=value ...`; every other line (e.g. NCCL's own log) is
//! passed through by the parent. Per-rank events come from rank children (`-p`), aggregated
//! ones from the per-library children of a `--vs` run. A library's refusal of the
//! configuration travels as a `refused` event whose free-text fields are percent-encoded.

use crate::args::{Coll, Dtype, Op};
use crate::nccl::{result_name, NcclError};
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

/// Init figures over all ranks (time: max over ranks; memory: max over devices, each
/// device's figure counted once however many ranks share it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InitSummary {
    pub version: i32,
    pub nranks: usize,
    pub init_ms: f64,
    pub init_bytes: i64,
    /// Device memory the library took during the first collective.
    pub first_coll_bytes: i64,
    /// The CUDA device of every rank, in rank order (empty when unknown).
    pub devices: Vec<usize>,
}

/// A library's refusal of the configuration: a call answered `ncclInvalidUsage` or
/// `ncclInvalidArgument`. It ends that library's run cleanly and is reported as a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The library, as `path (NCCL x.y.z)`; empty until the process that knows it fills it in.
    pub library: String,
    /// The call that failed, with its context (rank, step).
    pub call: String,
    pub result: i32,
    /// `ncclGetErrorString(result)`.
    pub text: String,
    /// `ncclGetLastError()`, possibly empty.
    pub last_error: String,
}

impl Refusal {
    pub fn from_error(error: &NcclError) -> Refusal {
        Refusal {
            library: String::new(),
            call: error.what.clone(),
            result: error.result,
            text: error.text.clone(),
            last_error: error.last.clone(),
        }
    }

    /// A few words for a table cell: the result name and the start of the last error.
    pub fn short_reason(&self) -> String {
        const MAX: usize = 70;
        let detail = if self.last_error.is_empty() {
            format!("in {}", self.call)
        } else {
            self.last_error.clone()
        };
        let detail: String = if detail.chars().count() > MAX {
            let cut: String = detail.chars().take(MAX - 3).collect();
            format!("{cut}...")
        } else {
            detail
        };
        format!("{} ({detail})", result_name(self.result))
    }

    /// The whole story in one line: library, call, result name and number, last error.
    pub fn line(&self) -> String {
        let library = if self.library.is_empty() {
            "the library".to_string()
        } else {
            format!("library {}", self.library)
        };
        let last = if self.last_error.is_empty() {
            "(empty)".to_string()
        } else {
            self.last_error.clone()
        };
        format!(
            "{library} refused the configuration: {} returned {} ({}, \"{}\"); last error (ncclGetLastError): {last}",
            self.call,
            result_name(self.result),
            self.result,
            self.text
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Result(RankResult),
    Init(InitInfo),
    /// Device memory the library took during the first collective, seen from `rank` on
    /// `device` (ranks sharing a device report the same device-wide figure).
    FirstCollMemory {
        rank: usize,
        device: usize,
        bytes: i64,
    },
    Aggregated(AggResult),
    AggregatedInit(InitSummary),
    Refused(Refusal),
}

/// Percent-encode a free-text field so that it is one word without `=`.
pub fn escape_field(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte <= b' ' || byte >= 0x7f || byte == b'%' || byte == b'=' {
            out.push_str(&format!("%{byte:02X}"));
        } else {
            out.push(byte as char);
        }
    }
    out
}

/// Undo `escape_field`; malformed escapes are kept as they are.
pub fn unescape_field(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = (bytes[i] == b'%')
            .then(|| text.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match decoded {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_devices(text: &str) -> Result<Vec<usize>, String> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|d| d.parse().map_err(|_| format!("bad device list '{text}'")))
        .collect()
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
        Event::FirstCollMemory {
            rank,
            device,
            bytes,
        } => format!("mem rank={rank} device={device} bytes={bytes}"),
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
            "agginit version={} nranks={} init_ms={} init_bytes={} first_coll_bytes={} devices={}",
            s.version,
            s.nranks,
            s.init_ms,
            s.init_bytes,
            s.first_coll_bytes,
            crate::args::devices_text(&s.devices)
        ),
        Event::Refused(r) => format!(
            "refused result={} library={} call={} text={} last={}",
            r.result,
            escape_field(&r.library),
            escape_field(&r.call),
            escape_field(&r.text),
            escape_field(&r.last_error)
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
                device: fields.num("device")?,
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
                devices: parse_devices(fields.get("devices")?)?,
            }),
            "refused" => Event::Refused(Refusal {
                library: unescape_field(fields.get("library")?),
                call: unescape_field(fields.get("call")?),
                result: fields.num("result")?,
                text: unescape_field(fields.get("text")?),
                last_error: unescape_field(fields.get("last")?),
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
                device: 3,
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
                devices: vec![0, 0, 1],
            }),
            Event::AggregatedInit(InitSummary::default()),
            Event::Refused(Refusal {
                library: "/x y/libnccl.so.2 (NCCL 2.28.9)".into(),
                call: "ncclGroupEnd after ncclCommInitRank (ranks 0,1 on devices 0,0)".into(),
                result: 5,
                text: "invalid usage (run with NCCL_DEBUG=WARN for details)".into(),
                last_error:
                    "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000 100% = ü"
                        .into(),
            }),
        ];
        for event in events {
            let line = format_event(&event);
            assert_eq!(parse_event(&line).unwrap().unwrap(), event, "{line}");
        }
    }

    #[test]
    fn escaping_round_trips_and_tolerates_bad_escapes() {
        for text in ["", "plain", "a b=c%d\te\nü", "%", "%4", "%zz"] {
            let escaped = escape_field(text);
            assert!(!escaped.contains([' ', '=']), "{escaped}");
            assert_eq!(unescape_field(&escaped), text);
        }
        assert_eq!(unescape_field("%zz%4"), "%zz%4");
    }

    #[test]
    fn refusal_texts() {
        let refusal = Refusal {
            library: "/l/libnccl.so.2 (NCCL 2.28.9)".into(),
            call: "ncclGroupEnd after ncclCommInitRank".into(),
            result: 5,
            text: "invalid usage".into(),
            last_error: "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000 and a long tail of text".into(),
        };
        let short = refusal.short_reason();
        assert!(
            short.starts_with("ncclInvalidUsage (Duplicate GPU detected"),
            "{short}"
        );
        assert!(short.ends_with("...)") && short.len() < 100, "{short}");
        let line = refusal.line();
        for part in [
            "/l/libnccl.so.2",
            "ncclGroupEnd after ncclCommInitRank",
            "ncclInvalidUsage (5",
            "last error (ncclGetLastError): Duplicate GPU",
        ] {
            assert!(line.contains(part), "{line} lacks {part}");
        }
        let quiet = Refusal {
            last_error: String::new(),
            ..refusal
        };
        assert_eq!(
            quiet.short_reason(),
            "ncclInvalidUsage (in ncclGroupEnd after ncclCommInitRank)"
        );
    }

    #[test]
    fn other_lines_pass_through_and_bad_lines_fail() {
        assert!(parse_event("host:123:456 [0] NCCL INFO Bootstrap").is_none());
        assert!(parse_event("@@OXCCL res coll=all_reduce").unwrap().is_err());
        assert!(parse_event("@@OXCCL bogus a=b").unwrap().is_err());
    }
}
