//! `oxccl-bench --trace-interval` end to end on the bench's CPU stand-ins for libcuda and
//! libnccl (`src/bin/oxccl-bench/mock`, built with the C compiler by `run-mock.sh`): every
//! collective of the mock takes 5 ms (`MOCK_COLL_US`), so the trace must show one line per
//! interval with the busbw that gives, and count every timed iteration once.

use std::process::Command;

/// Fields of a `# trace t=.. busbw=.. iters=..` line.
fn trace_line(line: &str) -> Option<(f64, f64, usize)> {
    let rest = line.strip_prefix("# trace t=")?;
    let mut fields = rest.split(' ');
    let t = fields.next()?.parse().ok()?;
    let busbw = fields.next()?.strip_prefix("busbw=")?.parse().ok()?;
    let iters = fields.next()?.strip_prefix("iters=")?.parse().ok()?;
    Some((t, busbw, iters))
}

#[test]
fn the_bench_traces_busbw_per_interval_on_the_mock_libraries() {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("bench trace on the mock: skipped (no C compiler `cc` to build the mock)");
        return;
    }
    let iters = 40;
    let out = Command::new("bash")
        .arg("src/bin/oxccl-bench/mock/run-mock.sh")
        .arg(env!("CARGO_BIN_EXE_oxccl-bench"))
        .args([
            "-g",
            "2",
            "-c",
            "all_reduce",
            "-d",
            "float",
            "--sizes",
            "1M",
        ])
        .args(["--inplace", "0", "-w", "1", "-n", &iters.to_string()])
        .args(["--trace-interval", "20"])
        .env("MOCK_COLL_US", "5000")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the bench failed:\n{log}");
    assert!(
        stdout.contains("# trace start size=1048576 unix=") && stdout.contains("interval_ms=20"),
        "no trace start line:\n{log}"
    );
    let lines: Vec<(f64, f64, usize)> = stdout.lines().filter_map(trace_line).collect();
    // 40 iterations of at least 5 ms: at least 200 ms, 10 intervals of 20 ms.
    assert!(lines.len() >= 10, "{} trace lines:\n{log}", lines.len());
    // Times are printed to the millisecond: the last line (the run's end) may print the same
    // time as the interval that closed just before it; every other line is later.
    let n = lines.len();
    assert!(
        lines
            .windows(2)
            .enumerate()
            .all(|(i, w)| w[1].0 > w[0].0 || (i + 2 == n && w[1].0 == w[0].0)),
        "times do not increase:\n{log}"
    );
    assert_eq!(
        lines.iter().map(|l| l.2).sum::<usize>(),
        iters,
        "every iteration ends in one interval:\n{log}"
    );
    // 1 MiB per 5 ms, bus factor 1 (all_reduce of 2 ranks): about 0.2 GB/s; a loaded machine
    // sleeps longer, never shorter. The last interval is partial: its figure is left out.
    for &(t, busbw, _) in &lines[..lines.len() - 1] {
        assert!(
            busbw > 0.02 && busbw < 0.25,
            "busbw {busbw} GB/s in the interval ending at {t} s:\n{log}"
        );
    }
}
