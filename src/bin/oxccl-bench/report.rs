//! Turning measurements into output: the aggregation of per-rank results (max of the ranks'
//! median times, sum of wrong elements), the init and memory lines (memory per device, so
//! that ranks sharing a GPU are not counted twice), the nccl-tests-like table per collective,
//! the summaries, the side-by-side `--vs` comparison (time, algbw and busbw ratios; a refused
//! library shows as `refused: <reason>`), and the JSON-lines / CSV files.

use crate::args::{devices_shared, devices_text, Coll, Op};
use crate::check::{algbw_gbs, bus_factor};
use crate::protocol::{
    format_event, AggResult, Event, InitInfo, InitSummary, RankResult, Refusal, ResultKey,
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
    /// rank -> (device, bytes) of the first collective.
    first_coll: BTreeMap<usize, (usize, i64)>,
    pub init: InitSummary,
}

/// Per device, the largest of the figures its ranks reported (ranks sharing a device see the
/// same device-wide change, so the device is counted once).
fn per_device(figures: impl Iterator<Item = (usize, i64)>) -> BTreeMap<usize, i64> {
    let mut devices: BTreeMap<usize, i64> = BTreeMap::new();
    for (device, bytes) in figures {
        let entry = devices.entry(device).or_insert(bytes);
        *entry = (*entry).max(bytes);
    }
    devices
}

/// The ranks of `device` as `0,1,2`.
fn ranks_on(device: usize, devices: &[usize]) -> String {
    let ranks: Vec<usize> = (0..devices.len())
        .filter(|&r| devices[r] == device)
        .collect();
    devices_text(&ranks)
}

impl Aggregator {
    /// `devices`: the device of every rank, in rank order.
    pub fn new(
        nranks: usize,
        devices: Vec<usize>,
        modes: Vec<bool>,
        version: i32,
        emit: bool,
    ) -> Aggregator {
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
                devices,
                ..InitSummary::default()
            },
        }
    }

    fn shared(&self) -> bool {
        devices_shared(&self.init.devices)
    }

    /// Print the init lines once every rank reported: per rank as before when every rank has
    /// its own device, else init time per rank and memory per device.
    fn report_init(&mut self) {
        self.init.init_ms = self.inits.values().map(|i| i.init_ms).fold(0.0, f64::max);
        let memory = per_device(self.inits.values().map(|i| (i.device, i.init_bytes)));
        self.init.init_bytes = memory.values().copied().max().unwrap_or(0);
        if !self.shared() {
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
            return;
        }
        println!(
            "# Communicator init: {:.1} ms (max over ranks); device memory taken by init: {} (max over {} device(s); ranks sharing a device counted once), {} in total",
            self.init.init_ms,
            mib(self.init.init_bytes),
            memory.len(),
            mib(memory.values().sum())
        );
        for info in self.inits.values() {
            println!(
                "#   rank {:>3} device {:>2}: init {:>9.1} ms",
                info.rank, info.device, info.init_ms
            );
        }
        for (device, bytes) in &memory {
            println!(
                "#   device {:>2} (ranks {}): memory {}",
                device,
                ranks_on(*device, &self.init.devices),
                mib(*bytes)
            );
        }
    }

    /// Print the first-collective memory line once every rank reported.
    fn report_first_collective(&mut self) {
        let memory = per_device(self.first_coll.values().copied());
        self.init.first_coll_bytes = memory.values().copied().max().unwrap_or(0);
        if !self.shared() {
            println!(
                "# Device memory taken by the first collective: {} (max over ranks)",
                mib(self.init.first_coll_bytes)
            );
            return;
        }
        let per: Vec<String> = memory
            .iter()
            .map(|(device, bytes)| format!("device {device}: {}", mib(*bytes)))
            .collect();
        println!(
            "# Device memory taken by the first collective: {} (max over devices; {})",
            mib(self.init.first_coll_bytes),
            per.join(", ")
        );
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
                    self.report_init();
                }
            }
            Event::FirstCollMemory {
                rank,
                device,
                bytes,
            } => {
                self.first_coll.insert(rank, (device, bytes));
                if self.first_coll.len() == self.nranks {
                    self.report_first_collective();
                }
            }
            Event::Aggregated(_) | Event::AggregatedInit(_) | Event::Refused(_) => {}
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

    /// Print the summary (`refused`: the run ended with the library's refusal); returns the
    /// total of wrong elements.
    pub fn finish(&self, refused: Option<&Refusal>) -> i64 {
        if self.emit {
            println!(
                "{}",
                format_event(&Event::AggregatedInit(self.init.clone()))
            );
        }
        print!("{}", summary(&self.results, refused));
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

/// Per (collective, type, op): rows, wrong elements, peak and average busbw, peak algbw (the
/// figure that still means something at one rank, where busbw is 0 for most collectives).
pub fn summary(results: &[AggResult], refused: Option<&Refusal>) -> String {
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
        "# {:>14} {:>9} {:>9} {:>6} {:>8} {:>12} {:>14} {:>12} {:>12}",
        "collective",
        "type",
        "redop",
        "rows",
        "#wrong",
        "peak busbw",
        "(at size B)",
        "avg busbw",
        "peak algbw"
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
        let peak_algbw = rows.iter().map(|r| r.algbw).fold(0.0, f64::max);
        let _ = writeln!(
            out,
            "  {:>14} {:>9} {:>9} {:>6} {:>8} {:>12.2} {:>14} {:>12.2} {:>12.2}",
            coll.name(),
            dtype.name(),
            op.map_or("none", |o| o.name()),
            rows.len(),
            wrong,
            peak.0,
            peak.1,
            average,
            peak_algbw
        );
    }
    if let Some(refusal) = refused {
        let _ = writeln!(
            out,
            "# The run ended early: refused: {}",
            refusal.short_reason()
        );
    }
    let verdict = if total_wrong > 0 {
        "FAILED"
    } else if refused.is_some() {
        "REFUSED by the library"
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

/// One library's side of a `--vs` comparison.
pub struct Side<'a> {
    pub results: &'a [AggResult],
    pub init: &'a InitSummary,
    /// Set when the library refused the configuration (its results may be partial or none).
    pub refused: Option<&'a Refusal>,
}

/// Geometric mean of the defined ratios, with how many there were.
fn geometric_mean(ratios: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let (sum, n) = ratios
        .flatten()
        .fold((0.0, 0usize), |(sum, n), r| (sum + r.ln(), n + 1));
    (n > 0).then(|| (sum / n as f64).exp())
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(sum, n), v| (sum + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// Whether busbw carries no information for this result (factor 0: one rank of all_reduce,
/// all_gather, reduce_scatter or alltoall).
fn busbw_undefined(r: &AggResult) -> bool {
    bus_factor(r.key.coll, r.nranks) == 0.0
}

/// The figures of one (collective, size band) of the `--vs` summary, from the band's pairs of
/// results (a side is `None` where it has no result for that size).
#[derive(Debug, Clone, PartialEq)]
pub struct BandFigures {
    pub sizes: usize,
    /// Geometric mean over sizes of B time / A time (> 1: A faster).
    pub time_ratio: Option<f64>,
    pub algbw_a: Option<f64>,
    pub algbw_b: Option<f64>,
    /// Geometric mean over sizes of A algbw / B algbw (> 1: A faster).
    pub algbw_ratio: Option<f64>,
    pub busbw_a: Option<f64>,
    pub busbw_b: Option<f64>,
    /// Geometric mean over sizes of A busbw / B busbw (> 1: A faster).
    pub busbw_ratio: Option<f64>,
    /// Every result of the band has busbw factor 0 (one rank): busbw says nothing.
    pub busbw_undefined: bool,
    pub wrong_a: i64,
    pub wrong_b: i64,
}

type Pair<'a> = (Option<&'a AggResult>, Option<&'a AggResult>);

/// Means and ratios of one band. With both sides present the means are over the sizes where
/// the ratio of that figure is defined (both non-zero, as before); with one side only, over
/// its sizes.
pub fn band_figures(pairs: &[Pair]) -> BandFigures {
    let both: Vec<(&AggResult, &AggResult)> = pairs
        .iter()
        .filter_map(|(a, b)| Some(((*a)?, (*b)?)))
        .collect();
    let (algbw_a, algbw_b, busbw_a, busbw_b) = if both.is_empty() {
        let only_a = || pairs.iter().filter_map(|p| p.0);
        let only_b = || pairs.iter().filter_map(|p| p.1);
        (
            mean(only_a().map(|r| r.algbw)),
            mean(only_b().map(|r| r.algbw)),
            mean(only_a().map(|r| r.busbw)),
            mean(only_b().map(|r| r.busbw)),
        )
    } else {
        // Means over the sizes where the ratio is defined (size 0 moves no bytes).
        let defined = |value: fn(&AggResult) -> f64| -> Vec<(f64, f64)> {
            both.iter()
                .map(|(a, b)| (value(a), value(b)))
                .filter(|(x, y)| ratio(*x, *y).is_some())
                .collect()
        };
        let (alg, bus) = (defined(|r| r.algbw), defined(|r| r.busbw));
        (
            mean(alg.iter().map(|p| p.0)).or(Some(0.0)),
            mean(alg.iter().map(|p| p.1)).or(Some(0.0)),
            mean(bus.iter().map(|p| p.0)).or(Some(0.0)),
            mean(bus.iter().map(|p| p.1)).or(Some(0.0)),
        )
    };
    let present = || pairs.iter().filter_map(|(a, b)| a.or(*b));
    BandFigures {
        sizes: pairs.len(),
        time_ratio: geometric_mean(both.iter().map(|(a, b)| ratio(b.time_us, a.time_us))),
        algbw_a,
        algbw_b,
        algbw_ratio: geometric_mean(both.iter().map(|(a, b)| ratio(a.algbw, b.algbw))),
        busbw_a,
        busbw_b,
        busbw_ratio: geometric_mean(both.iter().map(|(a, b)| ratio(a.busbw, b.busbw))),
        busbw_undefined: present().count() > 0 && present().all(busbw_undefined),
        wrong_a: pairs
            .iter()
            .filter_map(|p| p.0)
            .map(|r| r.wrong.max(0))
            .sum(),
        wrong_b: pairs
            .iter()
            .filter_map(|p| p.1)
            .map(|r| r.wrong.max(0))
            .sum(),
    }
}

/// A number cell, or `refused` where the side was refused, `n/a` where the figure is
/// undefined, `-` where there is nothing to show.
fn cell(value: Option<f64>, refused: bool, undefined: bool) -> String {
    match value {
        _ if undefined => "n/a".into(),
        Some(v) => format!("{v:.2}"),
        None if refused => "refused".into(),
        None => "-".into(),
    }
}

fn wrong_cell(present: bool, wrong: i64, refused: bool) -> String {
    if present {
        wrong.to_string()
    } else if refused {
        "refused".into()
    } else {
        "-".into()
    }
}

fn init_text(side: &Side) -> String {
    if side.refused.is_some() && side.results.is_empty() {
        return "refused".into();
    }
    format!(
        "{:.1} ms, {} + {} first collective",
        side.init.init_ms,
        mib(side.init.init_bytes),
        mib(side.init.first_coll_bytes)
    )
}

/// Every key of A in order, then B's keys that A lacks.
fn union_keys(a: &[AggResult], b: &[AggResult]) -> Vec<ResultKey> {
    let mut seen = std::collections::HashSet::new();
    a.iter()
        .chain(b)
        .map(|r| r.key)
        .filter(|k| seen.insert(*k))
        .collect()
}

/// One size of the side-by-side table; a side without a result shows `refused` (or `-`).
fn comparison_row(
    key: &ResultKey,
    ra: Option<&AggResult>,
    rb: Option<&AggResult>,
    a: &Side,
    b: &Side,
) -> String {
    let time = |r: Option<&AggResult>, side: &Side| {
        cell(r.map(|r| r.time_us), side.refused.is_some(), false)
    };
    let busbw = |r: Option<&AggResult>, side: &Side| {
        cell(
            r.map(|r| r.busbw),
            side.refused.is_some(),
            r.is_some_and(busbw_undefined),
        )
    };
    let pair = ra.zip(rb);
    format!(
        "  {:>12} {:>9} {:>9} {:>3}   {:>10} {:>10} {:>8}   {:>9} {:>9} {:>8}   {:>7} {:>7}",
        key.size,
        key.dtype.name(),
        key.op.map_or("none", |o| o.name()),
        u8::from(key.inplace),
        time(ra, a),
        time(rb, b),
        ratio_text(pair.and_then(|(x, y)| ratio(x.time_us, y.time_us))),
        busbw(ra, a),
        busbw(rb, b),
        if ra.or(rb).is_some_and(busbw_undefined) {
            "n/a".to_string()
        } else {
            ratio_text(pair.and_then(|(x, y)| ratio(x.busbw, y.busbw)))
        },
        ra.map_or_else(
            || wrong_cell(false, 0, a.refused.is_some()),
            |r| wrong_text(r.wrong)
        ),
        rb.map_or_else(
            || wrong_cell(false, 0, b.refused.is_some()),
            |r| wrong_text(r.wrong)
        ),
    )
}

fn summary_row(
    coll: Coll,
    band: usize,
    f: &BandFigures,
    a: &Side,
    b: &Side,
    pairs: &[Pair],
) -> String {
    let a_missing = pairs.iter().all(|p| p.0.is_none());
    let b_missing = pairs.iter().all(|p| p.1.is_none());
    let (ra, rb) = (a.refused.is_some(), b.refused.is_some());
    let mut line = format!(
        "  {:>14} {:>8} {:>10} {:>10} {:>8} {:>8} {:>8} {:>6} {:>9} {:>10} {:>10} {:>10}",
        coll.name(),
        BANDS[band],
        cell(f.busbw_a, ra, f.busbw_undefined),
        cell(f.busbw_b, rb, f.busbw_undefined),
        if f.busbw_undefined {
            "n/a".into()
        } else {
            ratio_text(f.busbw_ratio)
        },
        wrong_cell(!a_missing, f.wrong_a, ra),
        wrong_cell(!b_missing, f.wrong_b, rb),
        f.sizes,
        ratio_text(f.time_ratio),
        cell(f.algbw_a, ra, false),
        cell(f.algbw_b, rb, false),
        ratio_text(f.algbw_ratio)
    );
    for (label, missing, side) in [("A", a_missing, a), ("B", b_missing, b)] {
        if let (true, Some(refusal)) = (missing, side.refused) {
            let _ = write!(line, "  {label}: refused: {}", refusal.short_reason());
        }
    }
    line
}

/// The side-by-side table of library A (ours) against B (theirs) and its banded summary.
pub fn comparison(a: &Side, b: &Side) -> String {
    let ours: HashMap<ResultKey, &AggResult> = a.results.iter().map(|r| (r.key, r)).collect();
    let theirs: HashMap<ResultKey, &AggResult> = b.results.iter().map(|r| (r.key, r)).collect();
    let mut out = String::new();
    let _ = writeln!(out, "#\n# Side by side: A = --lib, B = --vs; ratios are A/B (busbw > 1: A faster; time < 1: A faster)");
    for (label, side) in [("A", a), ("B", b)] {
        if let Some(refusal) = side.refused {
            let _ = writeln!(out, "# {label} refused: {}", refusal.line());
        }
    }
    let _ = writeln!(out, "# init: A {};  B {}", init_text(a), init_text(b));
    let mut current: Option<Coll> = None;
    let mut bands: BTreeMap<(Coll, usize), Vec<Pair>> = BTreeMap::new();
    for key in union_keys(a.results, b.results) {
        let (ra, rb) = (ours.get(&key).copied(), theirs.get(&key).copied());
        // A size only one side has is shown when the other side was refused, else skipped.
        let shown = match (ra, rb) {
            (Some(_), Some(_)) => true,
            (Some(_), None) => b.refused.is_some(),
            (None, Some(_)) => a.refused.is_some(),
            (None, None) => false,
        };
        if !shown {
            continue;
        }
        if current != Some(key.coll) {
            current = Some(key.coll);
            let _ = writeln!(out, "#\n# Collective: {}", key.coll);
            let _ = writeln!(
                out,
                "# {:>12} {:>9} {:>9} {:>3}   {:>10} {:>10} {:>8}   {:>9} {:>9} {:>8}   {:>7} {:>7}",
                "size (B)", "type", "redop", "ip", "A time us", "B time us", "time A/B",
                "A busbw", "B busbw", "bw A/B", "A wrong", "B wrong"
            );
        }
        let _ = writeln!(out, "{}", comparison_row(&key, ra, rb, a, b));
        bands
            .entry((key.coll, band(key.size)))
            .or_default()
            .push((ra, rb));
    }
    let _ = writeln!(out, "#\n# Side-by-side summary (busbw, algbw: mean over the band's sizes; ratios: geometric mean over the sizes of A/B busbw, B/A time, A/B algbw; every ratio > 1: A faster)");
    if bands
        .values()
        .flatten()
        .any(|(x, y)| x.or(*y).is_some_and(busbw_undefined))
    {
        let _ = writeln!(out, "# n/a: at 1 rank busbw is 0 by definition (factor (n-1)/n) for all_reduce, all_gather, reduce_scatter, alltoall: compare time B/A and algbw");
    }
    let _ = writeln!(
        out,
        "# {:>14} {:>8} {:>10} {:>10} {:>8} {:>8} {:>8} {:>6} {:>9} {:>10} {:>10} {:>10}",
        "collective",
        "band",
        "A busbw",
        "B busbw",
        "A/B",
        "A wrong",
        "B wrong",
        "sizes",
        "time B/A",
        "A algbw",
        "B algbw",
        "algbw A/B"
    );
    if bands.is_empty() {
        let _ = writeln!(out, "  (no sizes to compare)");
    }
    for ((coll, band), pairs) in &bands {
        let figures = band_figures(pairs);
        let _ = writeln!(out, "{}", summary_row(*coll, *band, &figures, a, b, pairs));
    }
    out
}

/// Where and how results were produced, for the machine-readable files.
pub struct RunInfo<'a> {
    pub lib: &'a str,
    pub layout: &'a str,
    pub graph: bool,
    /// Init figures, the rank count and every rank's device.
    pub init: &'a InitSummary,
    /// The library's refusal, written as one extra `refused` record.
    pub refused: Option<&'a Refusal>,
}

fn json_devices(devices: &[usize]) -> String {
    format!("[{}]", devices_text(devices))
}

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
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
        "{{\"lib\":{},\"lib_version\":{},\"coll\":\"{}\",\"dtype\":\"{}\",\"op\":\"{}\",\"root\":{},\"inplace\":{},\"size\":{},\"count\":{},\"bytes\":{},\"nranks\":{},\"devices\":{},\"layout\":\"{}\",\"graph\":{},\"time_us\":{},\"algbw_gbs\":{},\"busbw_gbs\":{},\"wrong\":{},\"init_ms\":{},\"init_bytes\":{},\"first_coll_bytes\":{}}}",
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
        json_devices(&info.init.devices),
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

/// The `refused` record of a library that declined the configuration (JSON).
pub fn json_refused_line(info: &RunInfo, refusal: &Refusal) -> String {
    format!(
        "{{\"lib\":{},\"lib_version\":{},\"refused\":true,\"call\":{},\"result\":{},\"result_name\":\"{}\",\"error_string\":{},\"last_error\":{},\"reason\":{},\"nranks\":{},\"devices\":{},\"layout\":\"{}\",\"graph\":{}}}",
        json_string(info.lib),
        info.init.version,
        json_string(&refusal.call),
        refusal.result,
        crate::nccl::result_name(refusal.result),
        json_string(&refusal.text),
        json_string(&refusal.last_error),
        json_string(&refusal.short_reason()),
        info.init.nranks,
        json_devices(&info.init.devices),
        info.layout,
        info.graph
    )
}

pub const CSV_HEADER: &str = "lib,lib_version,coll,dtype,op,root,inplace,size,count,bytes,nranks,layout,graph,time_us,algbw_gbs,busbw_gbs,wrong,init_ms,init_bytes,first_coll_bytes,devices,refused";

/// The `refused` record as a CSV row: the measurement columns are empty.
pub fn csv_refused_line(info: &RunInfo, refusal: &Refusal) -> String {
    format!(
        "{},{},,,,,,,,,{},{},{},,,,,,,,{},{}",
        csv_field(info.lib),
        info.init.version,
        info.init.nranks,
        info.layout,
        u8::from(info.graph),
        csv_field(&devices_text(&info.init.devices)),
        csv_field(&refusal.line())
    )
}

pub fn csv_line(info: &RunInfo, r: &AggResult) -> String {
    let lib = csv_field(info.lib);
    format!(
        "{lib},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},",
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
        info.init.first_coll_bytes,
        csv_field(&devices_text(&info.init.devices))
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
            if let Some(refusal) = info.refused {
                text.push_str(&json_refused_line(info, refusal));
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
            if let Some(refusal) = info.refused {
                text.push_str(&csv_refused_line(info, refusal));
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
        let mut agg = Aggregator::new(2, vec![0, 1], vec![false, true], 22809, false);
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
        assert_eq!(agg.finish(None), 3);
    }

    #[test]
    fn unchecked_results_stay_unchecked() {
        let mut agg = Aggregator::new(2, vec![0, 1], vec![false], 0, false);
        for (rank, wrong) in [(0, -1), (1, -1)] {
            agg.handle(Event::Result(RankResult {
                key: key(64, false),
                rank,
                time_us: 1.0,
                wrong,
            }));
        }
        assert_eq!(agg.results[0].wrong, -1);
        assert_eq!(agg.finish(None), 0);
        assert!(summary(&agg.results, None).contains("not checked"));
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
        let init = InitSummary::default();
        let text = comparison(&side(&a, &init, None), &side(&b, &init, None));
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
            devices: vec![0, 0],
        };
        let info = RunInfo {
            lib: "/x/\"lib\".so",
            layout: "g",
            graph: false,
            init: &init,
            refused: None,
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
        assert!(json.contains("\"devices\":[0,0]"), "{json}");
        let csv = csv_line(&info, &r);
        assert_eq!(csv_columns(&csv), CSV_HEADER.split(',').count(), "{csv}");
        assert!(csv.contains(",\"0,0\","), "{csv}");
        let refusal = refusal();
        let info = RunInfo {
            refused: Some(&refusal),
            ..info
        };
        let json = json_refused_line(&info, &refusal);
        for part in [
            "\"refused\":true",
            "\"result\":5",
            "\"result_name\":\"ncclInvalidUsage\"",
            "\"last_error\":\"Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 0\"",
            "\"nranks\":2",
            "\"devices\":[0,0]",
        ] {
            assert!(json.contains(part), "{json} lacks {part}");
        }
        let csv = csv_refused_line(&info, &refusal);
        assert_eq!(csv_columns(&csv), CSV_HEADER.split(',').count(), "{csv}");
        assert!(csv.contains("refused the configuration"), "{csv}");
    }

    /// Columns of a CSV line, honouring quotes.
    fn csv_columns(line: &str) -> usize {
        let mut quoted = false;
        1 + line
            .chars()
            .filter(|&c| {
                if c == '"' {
                    quoted = !quoted;
                }
                c == ',' && !quoted
            })
            .count()
    }

    fn refusal() -> Refusal {
        Refusal {
            library: "B = /nv/libnccl.so.2 (NCCL 2.28.9)".into(),
            call: "ncclGroupEnd after ncclCommInitRank (rank(s) 0,1 on device(s) 0,0)".into(),
            result: 5,
            text: "invalid usage".into(),
            last_error: "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 0".into(),
        }
    }

    fn side<'a>(
        results: &'a [AggResult],
        init: &'a InitSummary,
        refused: Option<&'a Refusal>,
    ) -> Side<'a> {
        Side {
            results,
            init,
            refused,
        }
    }

    fn result(coll: Coll, nranks: usize, size: u64, time_us: f64) -> AggResult {
        let algbw = algbw_gbs(size, time_us);
        AggResult {
            key: ResultKey {
                coll,
                ..key(size, false)
            },
            nranks,
            time_us,
            algbw,
            busbw: algbw * bus_factor(coll, nranks),
            wrong: 0,
        }
    }

    #[test]
    fn one_rank_bands_compare_time_and_algbw() {
        // One rank: busbw is 0 for all_reduce, so only time and algbw can be compared.
        let a = [
            result(Coll::AllReduce, 1, 1024, 2.0),
            result(Coll::AllReduce, 1, 4096, 4.0),
        ];
        let b = [
            result(Coll::AllReduce, 1, 1024, 4.0),
            result(Coll::AllReduce, 1, 4096, 16.0),
        ];
        let pairs: Vec<Pair> = a.iter().zip(&b).map(|(x, y)| (Some(x), Some(y))).collect();
        let f = band_figures(&pairs);
        assert_eq!(f.sizes, 2);
        assert!(f.busbw_undefined);
        assert_eq!(f.busbw_ratio, None);
        // B/A time per size: 2 and 4, geometric mean sqrt(8).
        assert!((f.time_ratio.unwrap() - 8f64.sqrt()).abs() < 1e-9, "{f:?}");
        assert!((f.algbw_ratio.unwrap() - 8f64.sqrt()).abs() < 1e-9, "{f:?}");
        let init = InitSummary::default();
        let text = comparison(&side(&a, &init, None), &side(&b, &init, None));
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("all_reduce"))
            .expect("a summary row");
        assert!(row.contains("n/a"), "{row}");
        assert!(row.contains("2.828"), "{row}");
        assert!(text.contains("at 1 rank busbw is 0"), "{text}");
    }

    #[test]
    fn multi_rank_bands_keep_busbw_and_add_time() {
        let a = [result(Coll::AllGather, 4, 1 << 20, 10.0)];
        let b = [result(Coll::AllGather, 4, 1 << 20, 20.0)];
        let pairs: Vec<Pair> = vec![(Some(&a[0]), Some(&b[0]))];
        let f = band_figures(&pairs);
        assert!(!f.busbw_undefined);
        assert!((f.busbw_ratio.unwrap() - 2.0).abs() < 1e-9);
        assert!((f.time_ratio.unwrap() - 2.0).abs() < 1e-9);
        assert!((f.busbw_a.unwrap() - a[0].busbw).abs() < 1e-9);
        // Broadcast keeps factor 1 even at one rank.
        let one = [result(Coll::Broadcast, 1, 1 << 20, 10.0)];
        let f = band_figures(&[(Some(&one[0]), Some(&one[0]))]);
        assert!(!f.busbw_undefined && f.busbw_ratio == Some(1.0));
        // Size 0 has a time ratio but no bandwidth ratio.
        let zero_a = result(Coll::AllReduce, 2, 0, 5.0);
        let zero_b = result(Coll::AllReduce, 2, 0, 10.0);
        let f = band_figures(&[(Some(&zero_a), Some(&zero_b))]);
        assert_eq!(f.time_ratio, Some(2.0));
        assert_eq!((f.algbw_ratio, f.busbw_ratio), (None, None));
    }

    #[test]
    fn refused_library_shows_as_refused() {
        let a = [
            result(Coll::AllReduce, 2, 1024, 2.0),
            result(Coll::AllReduce, 2, 1 << 30, 9.0),
        ];
        let init = InitSummary::default();
        let refusal = refusal();
        let text = comparison(&side(&a, &init, None), &side(&[], &init, Some(&refusal)));
        assert!(
            text.contains("# B refused: library B = /nv/libnccl.so.2"),
            "{text}"
        );
        assert!(
            text.contains("B refused") && text.contains("init: A"),
            "{text}"
        );
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| l.trim_start().starts_with("all_reduce"))
            .collect();
        assert_eq!(rows.len(), 2, "{text}");
        for row in rows {
            assert!(
                row.contains("B: refused: ncclInvalidUsage (Duplicate GPU detected"),
                "{row}"
            );
        }
        let table_rows = text.lines().filter(|l| l.contains(" refused ")).count();
        assert!(table_rows >= 2, "{text}");
        // Without a refusal, sizes only one side has are still skipped.
        let text = comparison(&side(&a, &init, None), &side(&[], &init, None));
        assert!(
            !text
                .lines()
                .any(|l| l.trim_start().starts_with("all_reduce")),
            "{text}"
        );
    }

    #[test]
    fn memory_is_counted_once_per_device() {
        let devices = per_device([(0, 100), (0, 100), (1, 40), (0, 90)].into_iter());
        assert_eq!(
            devices.into_iter().collect::<Vec<_>>(),
            vec![(0, 100), (1, 40)]
        );
        let mut agg = Aggregator::new(3, vec![0, 0, 1], vec![false], 0, false);
        for (rank, device, bytes) in [(0, 0, 300), (1, 0, 300), (2, 1, 100)] {
            agg.handle(Event::Init(InitInfo {
                rank,
                device,
                init_ms: 1.0,
                init_bytes: bytes,
            }));
            agg.handle(Event::FirstCollMemory {
                rank,
                device,
                bytes: bytes / 10,
            });
        }
        assert_eq!(agg.init.init_bytes, 300);
        assert_eq!(agg.init.first_coll_bytes, 30);
        assert_eq!(ranks_on(0, &agg.init.devices), "0,1");
    }

    #[test]
    fn refused_summary_is_not_ok() {
        let text = summary(&[], Some(&refusal()));
        assert!(text.contains("REFUSED by the library"), "{text}");
        assert!(text.contains("refused: ncclInvalidUsage"), "{text}");
    }
}
