//! `oxccl-bench`: an nccl-tests-style benchmark and correctness checker for any
//! `libnccl.so.2`, loaded at run time by path. This file dispatches between the ways the
//! program runs: one process driving every GPU (`-g`), a parent with one child per rank
//! (`-p`), a rank child, and the `--vs` parent that runs each library in its own children.
//! See docs/bench-tool.md.

mod args;
mod check;
mod convert;
mod cuda;
mod nccl;
mod procs;
mod protocol;
mod report;
mod run;
mod trace;

use args::{Command, DeviceMap, Layout, Options};
use nccl::{Nccl, UniqueId};
use protocol::{AggResult, Event, InitSummary, Refusal};
use report::{Aggregator, RunInfo, Side};
use run::{Failure, Placement, EXIT_HANG};
use std::path::{Path, PathBuf};
use std::time::Duration;

const EXIT_WRONG: i32 = 1;
const EXIT_USAGE: i32 = 2;
const EXIT_ERROR: i32 = 3;

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let code = match args::parse(&argv) {
        Ok(Command::Help) => {
            print!("{}", args::HELP);
            0
        }
        Err(usage) => {
            eprintln!("oxccl-bench: {usage}\n(oxccl-bench --help lists every option)");
            EXIT_USAGE
        }
        Ok(Command::Run(opts)) => {
            let who = opts
                .child
                .as_ref()
                .map_or(String::new(), |c| format!("[rank {}] ", c.rank));
            match dispatch(&opts) {
                Ok(code) => code,
                Err(Failure::Error(message)) => {
                    eprintln!("oxccl-bench: {who}error: {message}");
                    EXIT_ERROR
                }
                Err(Failure::Hang(message)) => {
                    eprintln!("oxccl-bench: {who}HANG: {message}");
                    EXIT_HANG
                }
                Err(Failure::Refused(refusal)) => {
                    report_refusal(&opts, &refusal);
                    EXIT_ERROR
                }
            }
        }
    };
    std::process::exit(code);
}

/// A child process hands a refusal to its parent as an event line; the top-level process
/// prints the one human-readable line.
fn report_refusal(opts: &Options, refusal: &Refusal) {
    if opts.child.is_some() || opts.emit {
        println!(
            "{}",
            protocol::format_event(&Event::Refused(refusal.clone()))
        );
        let _ = std::io::Write::flush(&mut std::io::stdout());
    } else {
        eprintln!("oxccl-bench: REFUSED: {}", refusal.line());
    }
}

/// Run what the options ask for; returns the exit status.
fn dispatch(opts: &Options) -> Result<i32, Failure> {
    if let Some(role) = &opts.child {
        return run_rank_child(opts, role).map(|_| 0);
    }
    if let Some(vs) = &opts.vs {
        return run_versus(opts, vs);
    }
    let outcome = run_single(opts)?;
    let info = RunInfo {
        lib: &outcome.lib,
        layout: layout_name(opts.layout),
        graph: opts.graph,
        init: &outcome.init,
        refused: outcome.refused.as_ref(),
    };
    report::write_files(
        opts.json.as_deref(),
        opts.csv.as_deref(),
        &[(info, &outcome.results)],
    )?;
    if let Some(refusal) = outcome.refused {
        return Err(Failure::Refused(refusal));
    }
    Ok(if outcome.wrong > 0 { EXIT_WRONG } else { 0 })
}

fn layout_name(layout: Layout) -> &'static str {
    match layout {
        Layout::Threadless(_) => "g",
        Layout::Processes(_) => "p",
    }
}

fn library_path(opts: &Options) -> PathBuf {
    opts.lib.clone().unwrap_or_else(nccl::default_library)
}

fn version_text(version: i32) -> String {
    format!(
        "{}.{}.{}",
        version / 10000,
        version % 10000 / 100,
        version % 100
    )
}

/// `path (NCCL x.y.z)`: how a refusal names the library.
fn library_label(lib: &Path, version: i32) -> String {
    format!("{} (NCCL {})", lib.display(), version_text(version))
}

/// One library's run: its results, init figures and, when the library refused the
/// configuration, the refusal (the results are then those before it).
struct SingleOutcome {
    lib: String,
    results: Vec<AggResult>,
    init: InitSummary,
    wrong: i64,
    refused: Option<Refusal>,
}

fn modes(opts: &Options) -> Vec<bool> {
    opts.inplace.clone()
}

/// The header lines of one library's run.
fn print_header(opts: &Options, lib: &Path, version: i32, devices: &[usize], how: &str) {
    let sizes = args::sweep_sizes(opts);
    println!(
        "# oxccl-bench  lib: {} (NCCL {})",
        lib.display(),
        version_text(version)
    );
    println!(
        "# ranks: {} ({how})  sizes: {} to {} B ({} sizes)  warmup: {}  iters: {}  check: {}  graph: {}  timeout: {} s",
        devices.len(),
        sizes.first().copied().unwrap_or(0),
        sizes.last().copied().unwrap_or(0),
        sizes.len(),
        opts.warmup,
        opts.iters,
        u8::from(opts.check),
        u8::from(opts.graph),
        opts.timeout_s
    );
    if opts.devices != DeviceMap::OnePerGpu || opts.hostid_per_rank || opts.hosts.is_some() {
        let hostids = match opts.hosts {
            Some(h) => format!("  (NCCL_HOSTID=oxccl-bench-host-<rank % {h}> per rank process)"),
            None if opts.hostid_per_rank => {
                "  (NCCL_HOSTID=oxccl-bench-host-<rank> per rank process)".to_string()
            }
            None => String::new(),
        };
        println!(
            "# devices of ranks 0..{}: {}{hostids}",
            devices.len().saturating_sub(1),
            args::devices_text(devices),
        );
    }
    println!(
        "# time: max over ranks of each rank's median {} (CUDA events); algbw = bytes/time; busbw = algbw x factor",
        if opts.graph { "graph replay / iters" } else { "per-iteration time" }
    );
}

/// One library, all ranks: in this process (`-g`) or in one child per rank (`-p`).
fn run_single(opts: &Options) -> Result<SingleOutcome, Failure> {
    let lib = library_path(opts);
    let nccl = Nccl::load(&lib)?;
    let version = nccl.version();
    let label = library_label(&lib, version);
    let (mut aggregator, ended) = match opts.layout {
        Layout::Threadless(asked) => run_threadless(opts, &nccl, &lib, version, asked),
        Layout::Processes(nranks) => run_processes(opts, &nccl, &lib, version, nranks),
    }
    .map_err(|f| f.with_library(&label))?;
    let refused = match ended.map_err(|f| f.with_library(&label)) {
        Ok(()) => None,
        Err(Failure::Refused(refusal)) => Some(refusal),
        Err(other) => return Err(other),
    };
    let wrong = aggregator.finish(refused.as_ref());
    Ok(SingleOutcome {
        lib: lib.to_string_lossy().into_owned(),
        results: std::mem::take(&mut aggregator.results),
        init: aggregator.init.clone(),
        wrong,
        refused,
    })
}

/// Make sure every rank's device is visible.
fn check_devices_visible(opts: &Options, devices: &[usize], visible: usize) -> Result<(), Failure> {
    let Some((rank, device)) = devices
        .iter()
        .copied()
        .enumerate()
        .find(|&(_, d)| d >= visible)
    else {
        return Ok(());
    };
    let n = devices.len();
    Err(Failure::Error(match opts.devices {
        DeviceMap::OnePerGpu => {
            format!("-g {n} asks for {n} GPUs but only {visible} are visible")
        }
        _ => format!(
            "rank {rank} is placed on GPU {device} (--devices/--ranks-per-gpu) but only {visible} GPU(s) are visible (GPUs 0..{})",
            visible - 1
        ),
    }))
}

/// Every rank in this process; returns the aggregator and how the run ended (errors before
/// the run starts are returned as errors).
fn run_threadless(
    opts: &Options,
    nccl: &Nccl,
    lib: &Path,
    version: i32,
    asked: Option<usize>,
) -> Result<(Aggregator, Result<(), Failure>), Failure> {
    let visible = cuda::init()?;
    if visible == 0 {
        return Err(Failure::Error("the NVIDIA driver sees no GPU".into()));
    }
    let nranks = asked.unwrap_or_else(|| opts.devices.default_nranks(visible));
    let devices = opts.devices.devices(nranks);
    check_devices_visible(opts, &devices, visible)?;
    if opts.root >= nranks {
        return Err(Failure::Error(format!(
            "root {} is out of range for {nranks} ranks",
            opts.root
        )));
    }
    let how = format!("one process, -g, {}", cuda::device_name(devices[0]));
    print_header(opts, lib, version, &devices, &how);
    let mut aggregator = Aggregator::new(nranks, devices.clone(), modes(opts), version, opts.emit);
    let placement = Placement {
        nranks,
        local: devices.into_iter().enumerate().collect(),
        unique_id: None,
    };
    let ended = run::run(nccl, opts, &placement, &mut |event| {
        aggregator.handle(event)
    });
    Ok((aggregator, ended))
}

/// One child process per rank. The parent never touches CUDA: it only makes the unique id,
/// which needs no GPU, and keeps the library (and its bootstrap root) alive while the
/// children run.
fn run_processes(
    opts: &Options,
    nccl: &Nccl,
    lib: &Path,
    version: i32,
    nranks: usize,
) -> Result<(Aggregator, Result<(), Failure>), Failure> {
    let unique_id = nccl.unique_id()?;
    let devices = opts.devices.devices(nranks);
    print_header(opts, lib, version, &devices, "one process per rank, -p");
    let mut aggregator = Aggregator::new(nranks, devices, modes(opts), version, opts.emit);
    let mut child_opts = opts.clone();
    child_opts.lib = Some(lib.to_path_buf());
    let base = procs::child_args(&child_opts);
    let mut commands = Vec::new();
    for rank in 0..nranks {
        let mut argv = base.clone();
        argv.extend([
            "--child-rank".to_string(),
            rank.to_string(),
            "--child-nranks".to_string(),
            nranks.to_string(),
            "--child-id".to_string(),
            unique_id.hex(),
        ]);
        let mut command = procs::self_command(&argv)?;
        if let Some(id) = procs::host_id(opts, rank) {
            command.env("NCCL_HOSTID", id);
        }
        commands.push((format!("rank {rank}"), command));
    }
    let stall = Duration::from_secs_f64(opts.timeout_s * 3.0 + 120.0);
    let ended = procs::run_children(commands, stall, &mut |_, event| aggregator.handle(event));
    Ok((aggregator, ended))
}

/// One rank of a `-p` run: its device from the device map, events on stdout.
fn run_rank_child(opts: &Options, role: &args::ChildRole) -> Result<(), Failure> {
    let lib = library_path(opts);
    let nccl = Nccl::load(&lib)?;
    let label = library_label(&lib, nccl.version());
    let unique_id = UniqueId::from_hex(&role.unique_id_hex)?;
    let placement = Placement {
        nranks: role.nranks,
        local: vec![(role.rank, opts.devices.device_of(role.rank))],
        unique_id: Some(unique_id),
    };
    run::run(&nccl, opts, &placement, &mut |event| {
        println!("{}", protocol::format_event(&event));
    })
    .map_err(|f| f.with_library(&label))
}

/// Library A's or B's run in its own child process(es), as seen by the `--vs` parent.
struct LibraryOutcome {
    lib: String,
    results: Vec<AggResult>,
    init: InitSummary,
    refused: Option<Refusal>,
}

/// Run one library's whole sweep in a child; a refusal is an outcome, other failures are
/// errors naming the library.
fn run_library_child(
    opts: &Options,
    label: &str,
    lib: &Path,
    env: &[(String, String)],
) -> Result<LibraryOutcome, Failure> {
    let mut child_opts = opts.clone();
    child_opts.lib = Some(lib.to_path_buf());
    let mut argv = procs::child_args(&child_opts);
    argv.push("--emit".into());
    let mut command = procs::self_command(&argv)?;
    // Its rank children (with -p) inherit them.
    command.envs(env.iter().map(|(k, v)| (k, v)));
    let mut results = Vec::new();
    let mut init = InitSummary::default();
    // A whole sweep may legitimately print nothing for a while only within one step.
    let stall = Duration::from_secs_f64(opts.timeout_s * 3.0 + 180.0);
    let ended = procs::run_children(
        vec![(label.to_string(), command)],
        stall,
        &mut |_, event| match event {
            Event::Aggregated(result) => results.push(result),
            Event::AggregatedInit(summary) => init = summary,
            _ => {}
        },
    );
    let refused = match ended {
        Ok(()) => None,
        Err(Failure::Refused(mut refusal)) => {
            let named = if refusal.library.is_empty() {
                lib.display().to_string()
            } else {
                refusal.library.clone()
            };
            refusal.library = format!("{label} = {named}");
            Some(refusal)
        }
        Err(Failure::Error(m)) => {
            return Err(Failure::Error(format!(
                "library {label} ({}): {m}",
                lib.display()
            )))
        }
        Err(Failure::Hang(m)) => {
            return Err(Failure::Hang(format!(
                "library {label} ({}): {m}",
                lib.display()
            )))
        }
    };
    let mut name = lib.to_string_lossy().into_owned();
    if !env.is_empty() {
        // The records of two runs of one library with different settings stay apart.
        name = format!("{name} [{}]", args::env_text(env));
    }
    Ok(LibraryOutcome {
        lib: name,
        results,
        init,
        refused,
    })
}

/// The exit status of a `--vs` run: a refusal of A is a failure; a refusal of B alone is
/// not, so that A's clean results still pass; wrong elements of either library fail.
fn versus_status(a: &LibraryOutcome, b: &LibraryOutcome) -> i32 {
    let wrong: i64 = a
        .results
        .iter()
        .chain(&b.results)
        .map(|r| r.wrong.max(0))
        .sum();
    if a.refused.is_some() {
        EXIT_ERROR
    } else if wrong > 0 {
        EXIT_WRONG
    } else {
        0
    }
}

/// Library A (`--lib`) then library B (`--vs`), each in its own child process(es), then the
/// side-by-side table. A library that refuses the configuration does not stop the other.
fn run_versus(opts: &Options, vs: &Path) -> Result<i32, Failure> {
    let libs = [
        ("A", library_path(opts), &opts.env_a),
        ("B", vs.to_path_buf(), &opts.env_b),
    ];
    let mut outcomes: Vec<LibraryOutcome> = Vec::new();
    for (label, lib, env) in &libs {
        if lib.to_string_lossy().contains('/') && !lib.exists() {
            return Err(Failure::Error(format!(
                "library {label} ({}) does not exist",
                lib.display()
            )));
        }
        let with = if env.is_empty() {
            String::new()
        } else {
            format!(" with {}", args::env_text(env))
        };
        println!("# ===== library {label}: {}{with} =====", lib.display());
        let outcome = run_library_child(opts, label, lib, env)?;
        if let Some(refusal) = &outcome.refused {
            println!(
                "# ===== library {label} refused: {} =====",
                refusal.short_reason()
            );
            eprintln!("oxccl-bench: REFUSED: {}", refusal.line());
        }
        outcomes.push(outcome);
    }
    fn side(o: &LibraryOutcome) -> Side<'_> {
        Side {
            results: &o.results,
            init: &o.init,
            refused: o.refused.as_ref(),
        }
    }
    print!(
        "{}",
        report::comparison(&side(&outcomes[0]), &side(&outcomes[1]))
    );
    let runs: Vec<(RunInfo, &[AggResult])> = outcomes
        .iter()
        .map(|o| {
            (
                RunInfo {
                    lib: &o.lib,
                    layout: layout_name(opts.layout),
                    graph: opts.graph,
                    init: &o.init,
                    refused: o.refused.as_ref(),
                },
                o.results.as_slice(),
            )
        })
        .collect();
    report::write_files(opts.json.as_deref(), opts.csv.as_deref(), &runs)?;
    Ok(versus_status(&outcomes[0], &outcomes[1]))
}
