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

use args::{Command, Layout, Options};
use nccl::{Nccl, UniqueId};
use protocol::{AggResult, Event, InitSummary};
use report::{Aggregator, RunInfo};
use run::{Failure, Placement, EXIT_HANG};
use std::path::PathBuf;
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
                Ok(0) => 0,
                Ok(_) => EXIT_WRONG,
                Err(Failure::Error(message)) => {
                    eprintln!("oxccl-bench: {who}error: {message}");
                    EXIT_ERROR
                }
                Err(Failure::Hang(message)) => {
                    eprintln!("oxccl-bench: {who}HANG: {message}");
                    EXIT_HANG
                }
            }
        }
    };
    std::process::exit(code);
}

/// Run what the options ask for; returns the number of wrong elements.
fn dispatch(opts: &Options) -> Result<i64, Failure> {
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
    };
    report::write_files(
        opts.json.as_deref(),
        opts.csv.as_deref(),
        &[(info, &outcome.results)],
    )?;
    Ok(outcome.wrong)
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

struct SingleOutcome {
    lib: String,
    results: Vec<AggResult>,
    init: InitSummary,
    wrong: i64,
}

fn modes(opts: &Options) -> Vec<bool> {
    opts.inplace.clone()
}

/// One library, all ranks: in this process (`-g`) or in one child per rank (`-p`).
fn run_single(opts: &Options) -> Result<SingleOutcome, Failure> {
    let lib = library_path(opts);
    let nccl = Nccl::load(&lib)?;
    let version = nccl.version();
    let sizes = args::sweep_sizes(opts);
    let describe = |nranks: usize, how: &str| {
        println!(
            "# oxccl-bench  lib: {} (NCCL {})",
            lib.display(),
            version_text(version)
        );
        println!(
            "# ranks: {nranks} ({how})  sizes: {} to {} B ({} sizes)  warmup: {}  iters: {}  check: {}  graph: {}  timeout: {} s",
            sizes.first().copied().unwrap_or(0),
            sizes.last().copied().unwrap_or(0),
            sizes.len(),
            opts.warmup,
            opts.iters,
            u8::from(opts.check),
            u8::from(opts.graph),
            opts.timeout_s
        );
        println!(
            "# time: max over ranks of each rank's median {} (CUDA events); algbw = bytes/time; busbw = algbw x factor",
            if opts.graph { "graph replay / iters" } else { "per-iteration time" }
        );
    };
    let mut aggregator;
    match opts.layout {
        Layout::Threadless(asked) => {
            let visible = cuda::init()?;
            if visible == 0 {
                return Err(Failure::Error("the NVIDIA driver sees no GPU".into()));
            }
            let nranks = asked.unwrap_or(visible);
            if nranks > visible {
                return Err(Failure::Error(format!(
                    "-g {nranks} asks for {nranks} GPUs but only {visible} are visible"
                )));
            }
            if opts.root >= nranks {
                return Err(Failure::Error(format!(
                    "root {} is out of range for {nranks} ranks",
                    opts.root
                )));
            }
            describe(
                nranks,
                &format!("one process, -g, {}", cuda::device_name(0)),
            );
            aggregator = Aggregator::new(nranks, modes(opts), version, opts.emit);
            let placement = Placement {
                nranks,
                local: (0..nranks).map(|r| (r, r)).collect(),
                unique_id: None,
            };
            run::run(&nccl, opts, &placement, &mut |event| {
                aggregator.handle(event)
            })?;
        }
        Layout::Processes(nranks) => {
            // The parent never touches CUDA: it only makes the unique id, which needs no GPU,
            // and keeps the library (and its bootstrap root) alive while the children run.
            let unique_id = nccl.unique_id()?;
            describe(nranks, "one process per rank, -p");
            aggregator = Aggregator::new(nranks, modes(opts), version, opts.emit);
            let mut child_opts = opts.clone();
            child_opts.lib = Some(lib.clone());
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
                commands.push((format!("rank {rank}"), procs::self_command(&argv)?));
            }
            let stall = Duration::from_secs_f64(opts.timeout_s * 3.0 + 120.0);
            procs::run_children(commands, stall, &mut |_, event| aggregator.handle(event))?;
        }
    }
    let wrong = aggregator.finish();
    Ok(SingleOutcome {
        lib: lib.to_string_lossy().into_owned(),
        results: std::mem::take(&mut aggregator.results),
        init: aggregator.init.clone(),
        wrong,
    })
}

/// One rank of a `-p` run: GPU `rank`, events on stdout.
fn run_rank_child(opts: &Options, role: &args::ChildRole) -> Result<(), Failure> {
    let nccl = Nccl::load(&library_path(opts))?;
    let unique_id = UniqueId::from_hex(&role.unique_id_hex)?;
    let placement = Placement {
        nranks: role.nranks,
        local: vec![(role.rank, role.rank)],
        unique_id: Some(unique_id),
    };
    run::run(&nccl, opts, &placement, &mut |event| {
        println!("{}", protocol::format_event(&event));
    })
}

/// Library A (`--lib`) then library B (`--vs`), each in its own child process(es), then the
/// side-by-side table.
fn run_versus(opts: &Options, vs: &std::path::Path) -> Result<i64, Failure> {
    let libs = [("A", library_path(opts)), ("B", vs.to_path_buf())];
    let mut outcomes: Vec<(String, Vec<AggResult>, InitSummary)> = Vec::new();
    for (label, lib) in &libs {
        if lib.to_string_lossy().contains('/') && !lib.exists() {
            return Err(Failure::Error(format!(
                "library {label} ({}) does not exist",
                lib.display()
            )));
        }
        println!("# ===== library {label}: {} =====", lib.display());
        let mut child_opts = opts.clone();
        child_opts.lib = Some(lib.clone());
        let mut argv = procs::child_args(&child_opts);
        argv.push("--emit".into());
        let command = procs::self_command(&argv)?;
        let mut results = Vec::new();
        let mut init = InitSummary::default();
        // A whole sweep may legitimately print nothing for a while only within one step.
        let stall = Duration::from_secs_f64(opts.timeout_s * 3.0 + 180.0);
        procs::run_children(
            vec![(label.to_string(), command)],
            stall,
            &mut |_, event| match event {
                Event::Aggregated(result) => results.push(result),
                Event::AggregatedInit(summary) => init = summary,
                _ => {}
            },
        )
        .map_err(|failure| match failure {
            Failure::Error(m) => {
                Failure::Error(format!("library {label} ({}): {m}", lib.display()))
            }
            Failure::Hang(m) => Failure::Hang(format!("library {label} ({}): {m}", lib.display())),
        })?;
        outcomes.push((lib.to_string_lossy().into_owned(), results, init));
    }
    let (a, b) = (&outcomes[0], &outcomes[1]);
    print!("{}", report::comparison(&a.1, &b.1, &a.2, &b.2));
    let runs: Vec<(RunInfo, &[AggResult])> = outcomes
        .iter()
        .map(|(lib, results, init)| {
            (
                RunInfo {
                    lib,
                    layout: layout_name(opts.layout),
                    graph: opts.graph,
                    init,
                },
                results.as_slice(),
            )
        })
        .collect();
    report::write_files(opts.json.as_deref(), opts.csv.as_deref(), &runs)?;
    Ok(outcomes
        .iter()
        .flat_map(|(_, results, _)| results.iter().map(|r| r.wrong.max(0)))
        .sum())
}
