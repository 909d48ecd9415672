//! Turning measurements into output: the aggregation of per-rank results (max of the ranks'
//! median times, sum of wrong elements), the nccl-tests-like table per collective, the
//! summaries, the side-by-side `--vs` comparison, and the JSON-lines / CSV files.

use crate::args::{Coll, Op};
use crate::check::{algbw_gbs, bus_factor};
use crate::protocol::{
    format_event, AggResult, Event, InitInfo, InitSummary, RankResult, ResultKey,
};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

/// The identity of a table row: one size of one (collective, type, op, root).
type RowKey = (Coll, crate::args::Dtype, Option<Op>, Option<usize>, u64);

fn row_key(key: &ResultKey) -> RowKey {
    (key.coll, key.dtype, key.op, key.root, key.size)
}

/// Collects per-rank events of one library's run and prints its table as rows complete.
pub struct Aggregator {
    nranks: usize,
    modes: Vec<bool>,
    emit: bool,
    pending: HashMap<ResultKey, Vec<RankResult>>,
    rows: HashMap<RowKey, Vec<AggResult>>,
    pub results: Vec<AggResult>,
    current_coll: Option<Coll>,
    inits: BTreeMap<usize, InitInfo>,
    first_coll: BTreeMap<usize, i64>,
    pub init: InitSummary,
}

impl Aggregator {
    pub fn new(nranks: usize, modes: Vec<bool>, version: i32, emit: bool) -> Aggregator {
        Aggregator {
            nranks,
            modes,
            emit,
            pending: HashMap::new(),
            rows: HashMap::new(),
            results: Vec::new(),
            current_coll: None,
            inits: BTreeMap::new(),
            first_coll: BTreeMap::new(),
            init: InitSummary {
                version,
                nranks,
                ..InitSummary::default()
            },
        }
    }

    fn modes_for(&self, coll: Coll) -> Vec<bool> {
        self.modes
            .iter()
            .copied()
            .filter(|ip| !*ip || coll.has_inplace())
            .collect()
    }

    pub fn handle(&mut self, event: Event) {
        match event {
            Event::Result(result) => self.add_result(result),
            Event::Init(info) => {
                self.inits.insert(info.rank, info);
                if self.inits.len() == self.nranks {
                    self.init.init_ms = self.inits.values().map(|i| i.init_ms).fold(0.0, f64::max);
                    self.init.init_bytes =
                        self.inits.values().map(|i| i.init_bytes).max().unwrap_or(0);
                    println!(
                        "# Communicator init: {:.1} ms (max over ranks); device memory taken by init: {} (max over ranks)",
                        self.init.init_ms,
                        mib(self.init.init_bytes)
                    );
                    for info in self.inits.values() {
                        println!(
                            "#   rank {:>3} device {:>2}: init {:>9.1} ms, memory {}",
                            info.rank,
                            info.device,
                            info.init_ms,
                            mib(info.init_bytes)
                        );
                    }
                }
            }
            Event::FirstCollMemory { rank, bytes } => {
                self.first_coll.insert(rank, bytes);
                if self.first_coll.len() == self.nranks {
                    self.init.first_coll_bytes =
                        self.first_coll.values().copied().max().unwrap_or(0);
                    println!(
                        "# Device memory taken by the first collective: {} (max over ranks)",
                        mib(self.init.first_coll_bytes)
                    );
                }
            }
            Event::Aggregated(_) | Event::AggregatedInit(_) => {}
        }
    }

    fn add_result(&mut self, result: RankResult) {
        let key = result.key;
        let entry = self.pending.entry(key).or_default();
        entry.push(result);
        if entry.len() < self.nranks {
            return;
        }
        let ranks = self.pending.remove(&key).unwrap_or_default();
        let time_us = ranks.iter().map(|r| r.time_us).fold(0.0, f64::max);
        let wrong = if ranks.iter().any(|r| r.wrong < 0) {
            -1
        } else {
            ranks.iter().map(|r| r.wrong).sum()
        };
        let algbw = algbw_gbs(key.bytes, time_us);
        let aggregated = AggResult {
            key,
            nranks: self.nranks,
            time_us,
            algbw,
            busbw: algbw * bus_factor(key.coll, self.nranks),
            wrong,
        };
        if self.emit {
            println!("{}", format_event(&Event::Aggregated(aggregated.clone())));
        }
        self.results.push(aggregated.clone());
        let row = self.rows.entry(row_key(&key)).or_default();
        row.push(aggregated);
        if row.len() == self.modes_for(key.coll).len() {
            let row = self.rows.remove(&row_key(&key)).unwrap_or_default();
            if self.current_coll != Some(key.coll) {
                self.current_coll = Some(key.coll);
                print_header(key.coll, self.nranks);
            }
            println!("{}", format_row(&row, &self.modes_for(key.coll)));
        }
    }

    /// Print the summary; returns the total of wrong elements.
    pub fn finish(&self) -> i64 {
        if self.emit {
            println!(
                "{}",
                format_event(&Event::AggregatedInit(self.init.clone()))
            );
        }
        print!("{}", summary(&self.results));
        self.results.iter().map(|r| r.wrong.max(0)).sum()
    }
}

fn mib(bytes: i64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn print_header(coll: Coll, nranks: usize) {
    println!("#");
    println!("# Collective: {coll}   ranks: {nranks}");
    println!(
        "# {:>12} {:>12} {:>9} {:>9} {:>5}   {:^36}   {:^36}",
        "", "", "", "", "", "out-of-place", "in-place"
    );
    println!(
        "# {:>12} {:>12} {:>9} {:>9} {:>5}   {:>10} {:>8} {:>8} {:>7}   {:>10} {:>8} {:>8} {:>7}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    println!(
        "# {:>12} {:>12} {:>9} {:>9} {:>5}   {:>10} {:>8} {:>8} {:>7}   {:>10} {:>8} {:>8} {:>7}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
}

fn wrong_text(wrong: i64) -> String {
    if wrong < 0 {
        "N/A".into()
    } else {
        wrong.to_string()
    }
}

fn format_row(row: &[AggResult], modes: &[bool]) -> String {
    let first = &row[0];
    let key = first.key;
    let mut line = format!(
        "  {:>12} {:>12} {:>9} {:>9} {:>5}",
        key.size,
        key.count,
        key.dtype.name(),
        key.op.map_or("none", |o| o.name()),
        key.root.map_or(-1, |r| r as i64)
    );
    for inplace in [false, true] {
        match row.iter().find(|r| r.key.inplace == inplace) {
            Some(r) => {
                let _ = write!(
                    line,
                    "   {:>10.2} {:>8.2} {:>8.2} {:>7}",
                    r.time_us,
                    r.algbw,
                    r.busbw,
                    wrong_text(r.wrong)
                );
            }
            None => {
                let why = if modes.contains(&inplace) { "?" } else { "-" };
                let _ = write!(line, "   {why:>10} {why:>8} {why:>8} {why:>7}");
            }
        }
    }
    line
}

/// Per (collective, type, op): rows, wrong elements, peak and average busbw.
pub fn summary(results: &[AggResult]) -> String {
    let mut groups: BTreeMap<(Coll, crate::args::Dtype, Option<Op>), Vec<&AggResult>> =
        BTreeMap::new();
    for r in results {
        groups
            .entry((r.key.coll, r.key.dtype, r.key.op))
            .or_default()
            .push(r);
    }
    let mut out = String::new();
    let _ = writeln!(out, "#\n# Summary");
    let _ = writeln!(
        out,
        "# {:>14} {:>9} {:>9} {:>6} {:>8} {:>12} {:>14} {:>12}",
        "collective", "type", "redop", "rows", "#wrong", "peak busbw", "(at size B)", "avg busbw"
    );
    let mut total_wrong = 0;
    let mut unchecked = false;
    for ((coll, dtype, op), rows) in &groups {
        let wrong: i64 = rows.iter().map(|r| r.wrong.max(0)).sum();
        unchecked |= rows.iter().any(|r| r.wrong < 0);
        total_wrong += wrong;
        let peak = rows
            .iter()
            .max_by(|a, b| a.busbw.total_cmp(&b.busbw))
            .map(|r| (r.busbw, r.key.size))
            .unwrap_or((0.0, 0));
        let average = rows.iter().map(|r| r.busbw).sum::<f64>() / rows.len().max(1) as f64;
        let _ = writeln!(
            out,
            "  {:>14} {:>9} {:>9} {:>6} {:>8} {:>12.2} {:>14} {:>12.2}",
            coll.name(),
            dtype.name(),
            op.map_or("none", |o| o.name()),
            rows.len(),
            wrong,
            peak.0,
            peak.1,
            average
        );
    }
    let verdict = if total_wrong > 0 {
        "FAILED"
    } else if unchecked {
        "not checked (--check 0)"
    } else {
        "OK"
    };
    let _ = writeln!(
        out,
        "# Wrong elements in total: {total_wrong}  => {verdict}"
    );
    out
}

/// Size bands of the `--vs` summary, smallest first.
const BANDS: [&str; 3] = ["<64K", "64K-16M", ">=16M"];

/// Index into `BANDS` of a size.
pub fn band(size: u64) -> usize {
    if size < 64 << 10 {
        0
    } else if size < 16 << 20 {
        1
    } else {
        2
    }
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (a > 0.0 && b > 0.0 && a.is_finite() && b.is_finite()).then(|| a / b)
}

fn ratio_text(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.3}"))
}

/// Sums over the sizes of one (collective, size band) in the `--vs` summary.
#[derive(Default)]
struct BandTotals {
    log_ratio_sum: f64,
    compared: usize,
    busbw_a: f64,
    busbw_b: f64,
    wrong_a: i64,
    wrong_b: i64,
}

/// The side-by-side table of library A (ours) against B (theirs) and its banded summary.
pub fn comparison(
    a: &[AggResult],
    b: &[AggResult],
    init_a: &InitSummary,
    init_b: &InitSummary,
) -> String {
    let theirs: HashMap<ResultKey, &AggResult> = b.iter().map(|r| (r.key, r)).collect();
    let mut out = String::new();
    let _ = writeln!(out, "#\n# Side by side: A = --lib, B = --vs; ratios are A/B (busbw > 1: A faster; time < 1: A faster)");
    let _ = writeln!(
        out,
        "# init: A {:.1} ms, {} + {} first collective;  B {:.1} ms, {} + {} first collective",
        init_a.init_ms,
        mib(init_a.init_bytes),
        mib(init_a.first_coll_bytes),
        init_b.init_ms,
        mib(init_b.init_bytes),
        mib(init_b.first_coll_bytes)
    );
    let mut current: Option<Coll> = None;
    let mut bands: BTreeMap<(Coll, usize), BandTotals> = BTreeMap::new();
    for ra in a {
        let Some(rb) = theirs.get(&ra.key) else {
            continue;
        };
        if current != Some(ra.key.coll) {
            current = Some(ra.key.coll);
            let _ = writeln!(out, "#\n# Collective: {}", ra.key.coll);
            let _ = writeln!(
                out,
                "# {:>12} {:>9} {:>9} {:>3}   {:>10} {:>10} {:>8}   {:>9} {:>9} {:>8}   {:>7} {:>7}",
                "size (B)", "type", "redop", "ip", "A time us", "B time us", "time A/B",
                "A busbw", "B busbw", "bw A/B", "A wrong", "B wrong"
            );
        }
        let bw_ratio = ratio(ra.busbw, rb.busbw);
        let _ = writeln!(
            out,
            "  {:>12} {:>9} {:>9} {:>3}   {:>10.2} {:>10.2} {:>8}   {:>9.2} {:>9.2} {:>8}   {:>7} {:>7}",
            ra.key.size,
            ra.key.dtype.name(),
            ra.key.op.map_or("none", |o| o.name()),
            u8::from(ra.key.inplace),
            ra.time_us,
            rb.time_us,
            ratio_text(ratio(ra.time_us, rb.time_us)),
            ra.busbw,
            rb.busbw,
            ratio_text(bw_ratio),
            wrong_text(ra.wrong),
            wrong_text(rb.wrong)
        );
        let entry = bands.entry((ra.key.coll, band(ra.key.size))).or_default();
        if let Some(r) = bw_ratio {
            entry.log_ratio_sum += r.ln();
            entry.compared += 1;
            entry.busbw_a += ra.busbw;
            entry.busbw_b += rb.busbw;
        }
        entry.wrong_a += ra.wrong.max(0);
        entry.wrong_b += rb.wrong.max(0);
    }
    let _ = writeln!(out, "#\n# Side-by-side summary (busbw: mean over the band's sizes; ratio: geometric mean of A/B)");
    let _ = writeln!(
        out,
        "# {:>14} {:>8} {:>10} {:>10} {:>8} {:>8} {:>8}",
        "collective", "band", "A busbw", "B busbw", "A/B", "A wrong", "B wrong"
    );
    for ((coll, band), totals) in &bands {
        let n = totals.compared as f64;
        let (a_mean, b_mean, geo) = if totals.compared > 0 {
            (
                totals.busbw_a / n,
                totals.busbw_b / n,
                Some((totals.log_ratio_sum / n).exp()),
            )
        } else {
            (0.0, 0.0, None)
        };
        let _ = writeln!(
            out,
            "  {:>14} {:>8} {:>10.2} {:>10.2} {:>8} {:>8} {:>8}",
            coll.name(),
            BANDS[*band],
            a_mean,
            b_mean,
            ratio_text(geo),
            totals.wrong_a,
            totals.wrong_b
        );
    }
    out
}

/// Where and how results were produced, for the machine-readable files.
pub struct RunInfo<'a> {
    pub lib: &'a str,
    pub layout: &'a str,
    pub graph: bool,
    pub init: &'a InitSummary,
}

fn json_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_number(value: f64) -> String {
    if value.is_finite() {
        format!("{value}")
    } else {
        "null".into()
    }
}

pub fn json_line(info: &RunInfo, r: &AggResult) -> String {
    format!(
        "{{\"lib\":{},\"lib_version\":{},\"coll\":\"{}\",\"dtype\":\"{}\",\"op\":\"{}\",\"root\":{},\"inplace\":{},\"size\":{},\"count\":{},\"bytes\":{},\"nranks\":{},\"layout\":\"{}\",\"graph\":{},\"time_us\":{},\"algbw_gbs\":{},\"busbw_gbs\":{},\"wrong\":{},\"init_ms\":{},\"init_bytes\":{},\"first_coll_bytes\":{}}}",
        json_string(info.lib),
        info.init.version,
        r.key.coll,
        r.key.dtype,
        r.key.op.map_or("none", |o| o.name()),
        r.key.root.map_or(-1, |x| x as i64),
        r.key.inplace,
        r.key.size,
        r.key.count,
        r.key.bytes,
        r.nranks,
        info.layout,
        info.graph,
        json_number(r.time_us),
        json_number(r.algbw),
        json_number(r.busbw),
        r.wrong,
        json_number(info.init.init_ms),
        info.init.init_bytes,
        info.init.first_coll_bytes
    )
}

pub const CSV_HEADER: &str = "lib,lib_version,coll,dtype,op,root,inplace,size,count,bytes,nranks,layout,graph,time_us,algbw_gbs,busbw_gbs,wrong,init_ms,init_bytes,first_coll_bytes";

pub fn csv_line(info: &RunInfo, r: &AggResult) -> String {
    let lib = if info.lib.contains([',', '"']) {
        format!("\"{}\"", info.lib.replace('"', "\"\""))
    } else {
        info.lib.to_string()
    };
    format!(
        "{lib},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
        info.init.version,
        r.key.coll,
        r.key.dtype,
        r.key.op.map_or("none", |o| o.name()),
        r.key.root.map_or(-1, |x| x as i64),
        u8::from(r.key.inplace),
        r.key.size,
        r.key.count,
        r.key.bytes,
        r.nranks,
        info.layout,
        u8::from(info.graph),
        r.time_us,
        r.algbw,
        r.busbw,
        r.wrong,
        info.init.init_ms,
        info.init.init_bytes,
        info.init.first_coll_bytes
    )
}

/// Write every result of every library to the JSON-lines and/or CSV file.
pub fn write_files(
    json: Option<&Path>,
    csv: Option<&Path>,
    runs: &[(RunInfo, &[AggResult])],
) -> Result<(), String> {
    let write = |path: &Path, text: String| {
        std::fs::File::create(path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    if let Some(path) = json {
        let mut text = String::new();
        for (info, results) in runs {
            for r in *results {
                text.push_str(&json_line(info, r));
                text.push('\n');
            }
        }
        write(path, text)?;
    }
    if let Some(path) = csv {
        let mut text = format!("{CSV_HEADER}\n");
        for (info, results) in runs {
            for r in *results {
                text.push_str(&csv_line(info, r));
                text.push('\n');
            }
        }
        write(path, text)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::Dtype;

    fn key(size: u64, inplace: bool) -> ResultKey {
        ResultKey {
            coll: Coll::AllReduce,
            dtype: Dtype::Float,
            op: Some(Op::Sum),
            root: None,
            size,
            inplace,
            count: (size / 4) as usize,
            bytes: size,
        }
    }

    #[test]
    fn aggregation_takes_max_time_and_sums_wrong() {
        let mut agg = Aggregator::new(2, vec![false, true], 22809, false);
        for (rank, time, wrong) in [(0, 10.0, 0), (1, 20.0, 3)] {
            agg.handle(Event::Result(RankResult {
                key: key(1 << 20, false),
                rank,
                time_us: time,
                wrong,
            }));
        }
        assert_eq!(agg.results.len(), 1);
        let r = &agg.results[0];
        assert_eq!(r.time_us, 20.0);
        assert_eq!(r.wrong, 3);
        assert!((r.algbw - (1u64 << 20) as f64 / 1e3 / 20.0).abs() < 1e-9);
        assert!((r.busbw - r.algbw).abs() < 1e-9); // 2(n-1)/n = 1 for n = 2
        assert_eq!(agg.finish(), 3);
    }

    #[test]
    fn unchecked_results_stay_unchecked() {
        let mut agg = Aggregator::new(2, vec![false], 0, false);
        for (rank, wrong) in [(0, -1), (1, -1)] {
            agg.handle(Event::Result(RankResult {
                key: key(64, false),
                rank,
                time_us: 1.0,
                wrong,
            }));
        }
        assert_eq!(agg.results[0].wrong, -1);
        assert_eq!(agg.finish(), 0);
        assert!(summary(&agg.results).contains("not checked"));
    }

    #[test]
    fn comparison_ratios_and_bands() {
        let make = |size, busbw| AggResult {
            key: key(size, false),
            nranks: 2,
            time_us: 1.0 / busbw,
            algbw: busbw,
            busbw,
            wrong: 0,
        };
        let a = vec![make(1024, 2.0), make(1 << 30, 100.0)];
        let b = vec![make(1024, 4.0), make(1 << 30, 50.0)];
        let text = comparison(&a, &b, &InitSummary::default(), &InitSummary::default());
        assert!(text.contains("0.500"), "{text}");
        assert!(text.contains("2.000"), "{text}");
        assert!(text.contains("<64K") && text.contains(">=16M"), "{text}");
        assert_eq!(BANDS[band(0)], "<64K");
        assert_eq!(BANDS[band(1 << 20)], "64K-16M");
        assert_eq!(BANDS[band(1 << 30)], ">=16M");
        assert!(text.find("<64K").unwrap() < text.find(">=16M").unwrap());
    }

    #[test]
    fn machine_readable_lines() {
        let init = InitSummary {
            version: 22809,
            nranks: 2,
            init_ms: 5.0,
            init_bytes: 1,
            first_coll_bytes: 2,
        };
        let info = RunInfo {
            lib: "/x/\"lib\".so",
            layout: "g",
            graph: false,
            init: &init,
        };
        let r = AggResult {
            key: key(8, true),
            nranks: 2,
            time_us: 1.5,
            algbw: 0.0,
            busbw: 0.0,
            wrong: 0,
        };
        let json = json_line(&info, &r);
        assert!(json.starts_with("{\"lib\":\"/x/\\\"lib\\\".so\""), "{json}");
        assert!(
            json.contains("\"inplace\":true") && json.contains("\"time_us\":1.5"),
            "{json}"
        );
        let csv = csv_line(&info, &r);
        assert_eq!(csv.split(',').count(), CSV_HEADER.split(',').count());
    }
}
