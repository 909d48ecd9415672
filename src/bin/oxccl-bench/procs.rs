//! Child processes: turning options back into a command line, spawning copies of this
//! executable (one per rank for `-p`, one per library for `--vs`), reading their event lines,
//! passing their other output through, and stopping all of them when one fails or stalls.
//! A child that reports a `refused` event makes the whole run a `Failure::Refused`, even when
//! other children fail as a consequence (they lose their peer) before it exits.

use crate::args::{devices_text, DeviceMap, Layout, Options};
use crate::protocol::{parse_event, Event, Refusal};
use crate::run::{Failure, EXIT_HANG};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The command-line arguments that reproduce `opts` in a child (sizes as an explicit list;
/// output files, `--vs`, `--emit` and the child role are left out).
pub fn child_args(opts: &Options) -> Vec<String> {
    let join = |names: Vec<&str>| names.join(",");
    let mut args = Vec::new();
    if let Some(lib) = &opts.lib {
        args.extend(["--lib".to_string(), lib.to_string_lossy().into_owned()]);
    }
    args.extend([
        "-c".to_string(),
        join(opts.colls.iter().map(|c| c.name()).collect()),
        "-d".to_string(),
        join(opts.dtypes.iter().map(|d| d.name()).collect()),
        "-o".to_string(),
        join(opts.ops.iter().map(|o| o.name()).collect()),
        "--sizes".to_string(),
        crate::args::sweep_sizes(opts)
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(","),
        "-r".to_string(),
        opts.root.to_string(),
        "--inplace".to_string(),
        match opts.inplace.as_slice() {
            [false] => "0",
            [true] => "1",
            _ => "both",
        }
        .to_string(),
        "-w".to_string(),
        opts.warmup.to_string(),
        "-n".to_string(),
        opts.iters.to_string(),
        "--check".to_string(),
        if opts.check { "1" } else { "0" }.to_string(),
        "--timeout".to_string(),
        opts.timeout_s.to_string(),
    ]);
    if opts.graph {
        args.push("--graph".into());
    }
    if let Some(interval) = opts.trace_interval {
        args.extend([
            "--trace-interval".to_string(),
            interval.as_millis().to_string(),
        ]);
    }
    match opts.layout {
        Layout::Threadless(Some(n)) => args.extend(["-g".to_string(), n.to_string()]),
        Layout::Threadless(None) => {}
        Layout::Processes(n) => args.extend(["-p".to_string(), n.to_string()]),
    }
    match &opts.devices {
        DeviceMap::OnePerGpu => {}
        DeviceMap::List(list) => args.extend(["--devices".to_string(), devices_text(list)]),
        DeviceMap::RanksPerGpu(k) => args.extend(["--ranks-per-gpu".to_string(), k.to_string()]),
    }
    if opts.hostid_per_rank {
        args.push("--hostid-per-rank".into());
    }
    if let Some(hosts) = opts.hosts {
        args.extend(["--hosts".to_string(), hosts.to_string()]);
    }
    args
}

/// The `NCCL_HOSTID` that `--hostid-per-rank` gives rank `rank`'s process.
pub fn host_id_for_rank(rank: usize) -> String {
    format!("oxccl-bench-host-{rank}")
}

/// The `NCCL_HOSTID` rank `rank`'s process gets, if any: its own with `--hostid-per-rank`,
/// host `rank % H`'s with `--hosts H`.
pub fn host_id(opts: &Options, rank: usize) -> Option<String> {
    match opts.hosts {
        Some(hosts) => Some(host_id_for_rank(rank % hosts)),
        None => opts.hostid_per_rank.then(|| host_id_for_rank(rank)),
    }
}

/// A copy of this executable with `args`.
pub fn self_command(args: &[String]) -> Result<Command, Failure> {
    let exe = std::env::current_exe().map_err(|e| {
        Failure::Error(format!(
            "cannot find this executable to start children: {e}"
        ))
    })?;
    let mut command = Command::new(exe);
    command.args(args);
    Ok(command)
}

enum Message {
    Line(usize, String),
    Closed,
}

/// How long the parent keeps listening after a child failed, so that a refusal reported by
/// another child (the root cause) is not lost to its peers' consequent failures.
const GRACE_AFTER_FAILURE: Duration = Duration::from_secs(2);

fn kill_all(children: &mut [(String, Child, bool)]) {
    for (_, child, exited) in children.iter_mut() {
        if !*exited {
            // Our own children, ended by their own process ids.
            let _ = child.kill();
            let _ = child.wait();
            *exited = true;
        }
    }
}

/// Spawn `commands` (label, command), feed their events to `on_event` and print their other
/// stdout lines prefixed with the label. Fails as soon as one child fails; a child that says
/// nothing for `stall` is treated as hung.
pub fn run_children(
    commands: Vec<(String, Command)>,
    stall: Duration,
    on_event: &mut dyn FnMut(usize, Event),
) -> Result<(), Failure> {
    let (sender, receiver) = mpsc::channel();
    let mut children: Vec<(String, Child, bool)> = Vec::new();
    for (index, (label, mut command)) in commands.into_iter().enumerate() {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                kill_all(&mut children);
                return Err(Failure::Error(format!(
                    "cannot start child process {label}: {e}"
                )));
            }
        };
        let stdout = child.stdout.take().expect("stdout is piped");
        let sender = sender.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                match line {
                    Ok(line) => {
                        if sender.send(Message::Line(index, line)).is_err() {
                            return;
                        }
                    }
                    Err(_) => break,
                }
            }
            let _ = sender.send(Message::Closed);
        });
        children.push((label, child, false));
    }
    drop(sender);
    let mut open = children.len();
    let mut last_activity = Instant::now();
    let mut refusal: Option<Refusal> = None;
    loop {
        match receiver.recv_timeout(Duration::from_millis(100)) {
            Ok(Message::Line(index, line)) => {
                last_activity = Instant::now();
                if let Err(message) = handle_line(index, &line, &children, &mut refusal, on_event) {
                    kill_all(&mut children);
                    return Err(Failure::Error(message));
                }
            }
            Ok(Message::Closed) => open -= 1,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => open = 0,
        }
        if let Some(failure) = ended_child_failure(&mut children) {
            // Keep listening a little: the others may still report the refusal that caused
            // this failure, and what they printed is worth passing through. Then stop them.
            let deadline = Instant::now() + GRACE_AFTER_FAILURE;
            while Instant::now() < deadline && open > 0 {
                match receiver.recv_timeout(Duration::from_millis(50)) {
                    Ok(Message::Line(index, line)) => {
                        let _ = handle_line(index, &line, &children, &mut refusal, on_event);
                    }
                    Ok(Message::Closed) => open -= 1,
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => open = 0,
                }
            }
            kill_all(&mut children);
            return Err(refusal.map_or(failure, Failure::Refused));
        }
        if open == 0 && children.iter().all(|(_, _, exited)| *exited) {
            // A child that reported a refusal also exits non-zero; this is a safety net.
            return refusal.map_or(Ok(()), |r| Err(Failure::Refused(r)));
        }
        if open == 0 {
            // Output closed: the children are exiting; wait for their statuses.
            std::thread::sleep(Duration::from_millis(20));
        }
        if last_activity.elapsed() > stall {
            kill_all(&mut children);
            return Err(Failure::Hang(format!(
                "no output from the child processes for {} s",
                stall.as_secs()
            )));
        }
    }
}

/// One stdout line of child `index`: an event goes to `on_event` (a refusal is kept, the
/// first one wins), any other line is printed with the child's label. Malformed event lines
/// are errors.
fn handle_line(
    index: usize,
    line: &str,
    children: &[(String, Child, bool)],
    refusal: &mut Option<Refusal>,
    on_event: &mut dyn FnMut(usize, Event),
) -> Result<(), String> {
    match parse_event(line) {
        Some(Ok(Event::Refused(r))) => {
            refusal.get_or_insert(r);
            Ok(())
        }
        Some(Ok(event)) => {
            on_event(index, event);
            Ok(())
        }
        Some(Err(message)) => Err(message),
        None => {
            println!("[{}] {line}", children[index].0);
            Ok(())
        }
    }
}

/// The failure of the first child found to have ended unsuccessfully, if any; marks every
/// ended child as exited.
fn ended_child_failure(children: &mut [(String, Child, bool)]) -> Option<Failure> {
    for (label, child, exited) in children.iter_mut() {
        if *exited {
            continue;
        }
        match child.try_wait() {
            Ok(Some(status)) => {
                *exited = true;
                if status.success() {
                    continue;
                }
                let message = match status.code() {
                    Some(code) => format!("child process {label} exited with status {code}"),
                    None => format!("child process {label} was killed by a signal ({status})"),
                };
                return Some(if status.code() == Some(EXIT_HANG) {
                    Failure::Hang(message)
                } else {
                    Failure::Error(message)
                });
            }
            Ok(None) => {}
            Err(e) => {
                return Some(Failure::Error(format!(
                    "cannot wait for child {label}: {e}"
                )))
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{parse, sweep_sizes, Coll, Command as Cli, Dtype, Op};

    #[test]
    fn child_args_reproduce_the_options() {
        let original: Vec<String> = [
            "--lib",
            "/a/libnccl.so.2",
            "-c",
            "all_gather,sendrecv",
            "-d",
            "half,int8",
            "-o",
            "prod,premulsum",
            "-b",
            "0",
            "-e",
            "1M",
            "-f",
            "8",
            "-r",
            "1",
            "--inplace",
            "1",
            "-w",
            "2",
            "-n",
            "7",
            "--check",
            "0",
            "--graph",
            "-p",
            "3",
            "--timeout",
            "2.5",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let Cli::Run(opts) = parse(&original).unwrap() else {
            panic!()
        };
        let Cli::Run(again) = parse(&child_args(&opts)).unwrap() else {
            panic!()
        };
        assert_eq!(again.lib, opts.lib);
        assert_eq!(again.colls, vec![Coll::AllGather, Coll::SendRecv]);
        assert_eq!(again.dtypes, vec![Dtype::Half, Dtype::Int8]);
        assert_eq!(again.ops, vec![Op::Prod, Op::PreMulSum]);
        assert_eq!(sweep_sizes(&again), sweep_sizes(&opts));
        assert_eq!(
            (
                again.root,
                &again.inplace,
                again.warmup,
                again.iters,
                again.check,
                again.graph
            ),
            (1, &vec![true], 2, 7, false, true)
        );
        assert_eq!(again.layout, Layout::Processes(3));
        assert_eq!(again.timeout_s, 2.5);
    }

    fn parsed(args: &[&str]) -> Options {
        let owned: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let Cli::Run(opts) = parse(&owned).unwrap() else {
            panic!("not a run")
        };
        *opts
    }

    #[test]
    fn child_args_carry_the_placement() {
        for args in [
            &["-p", "4", "--devices", "0,0,1,1", "--hostid-per-rank"][..],
            &["-p", "4", "--ranks-per-gpu", "4", "--hosts", "2"][..],
            &["-g", "8", "--ranks-per-gpu", "8"][..],
            &["--devices", "2,2"][..],
            &["-p", "2"][..],
            &["-p", "2", "--trace-interval", "250"][..],
        ] {
            let opts = parsed(args);
            let again = parsed(
                &child_args(&opts)
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>(),
            );
            assert_eq!(again.devices, opts.devices, "{args:?}");
            assert_eq!(again.layout, opts.layout, "{args:?}");
            assert_eq!(again.hostid_per_rank, opts.hostid_per_rank, "{args:?}");
            assert_eq!(again.hosts, opts.hosts, "{args:?}");
            assert_eq!(again.trace_interval, opts.trace_interval, "{args:?}");
        }
        assert_eq!(host_id_for_rank(3), "oxccl-bench-host-3");
        let ids = |args: &[&str]| -> Vec<Option<String>> {
            let opts = parsed(args);
            (0..4).map(|r| host_id(&opts, r)).collect()
        };
        let host = |h: usize| Some(host_id_for_rank(h));
        assert_eq!(
            ids(&["-p", "4", "--hosts", "2"]),
            vec![host(0), host(1), host(0), host(1)]
        );
        assert_eq!(
            ids(&["-p", "4", "--hostid-per-rank"]),
            vec![host(0), host(1), host(2), host(3)]
        );
        assert_eq!(ids(&["-p", "4"]), vec![None, None, None, None]);
    }

    fn refusing_child() -> Command {
        let refusal = Event::Refused(Refusal {
            library: "/l/libnccl.so.2 (NCCL 2.28.9)".into(),
            call: "ncclCommInitRank (rank 1 of 2, device 0)".into(),
            result: 5,
            text: "invalid usage".into(),
            last_error: "Duplicate GPU detected".into(),
        });
        let mut sh = Command::new("sh");
        sh.args([
            "-c",
            &format!(
                "sleep 0.3; echo '{}'; exit 3",
                crate::protocol::format_event(&refusal)
            ),
        ]);
        sh
    }

    #[test]
    fn a_refusal_wins_over_its_peers_failures() {
        // The peer fails first (it lost its partner), the refusing child reports after it.
        let mut peer = Command::new("sh");
        peer.args(["-c", "exit 3"]);
        let result = run_children(
            vec![("rank 0".into(), peer), ("rank 1".into(), refusing_child())],
            Duration::from_secs(60),
            &mut |_, _| {},
        );
        match result {
            Err(Failure::Refused(r)) => {
                assert_eq!(r.result, 5);
                assert_eq!(r.last_error, "Duplicate GPU detected");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        // A peer blocked forever is stopped after the refusal.
        let mut blocked = Command::new("sleep");
        blocked.arg("30");
        let started = Instant::now();
        let result = run_children(
            vec![
                ("rank 0".into(), blocked),
                ("rank 1".into(), refusing_child()),
            ],
            Duration::from_secs(60),
            &mut |_, _| {},
        );
        assert!(matches!(result, Err(Failure::Refused(_))), "{result:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn children_events_and_failures() {
        let mut sh = Command::new("sh");
        sh.args([
            "-c",
            "echo hello; echo '@@OXCCL mem rank=0 device=0 bytes=5'; exit 0",
        ]);
        let mut seen = Vec::new();
        run_children(
            vec![("x".into(), sh)],
            Duration::from_secs(10),
            &mut |i, e| seen.push((i, e)),
        )
        .unwrap();
        assert_eq!(
            seen,
            vec![(
                0,
                Event::FirstCollMemory {
                    rank: 0,
                    device: 0,
                    bytes: 5
                }
            )]
        );

        let mut failing = Command::new("sh");
        failing.args(["-c", "exit 4"]);
        let mut sleeper = Command::new("sleep");
        sleeper.arg("30");
        let started = Instant::now();
        let result = run_children(
            vec![("a".into(), failing), ("b".into(), sleeper)],
            Duration::from_secs(60),
            &mut |_, _| {},
        );
        assert!(matches!(result, Err(Failure::Hang(_))), "{result:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the sleeper must be killed"
        );

        let mut silent = Command::new("sleep");
        silent.arg("30");
        let result = run_children(
            vec![("s".into(), silent)],
            Duration::from_millis(300),
            &mut |_, _| {},
        );
        assert!(matches!(result, Err(Failure::Hang(m)) if m.contains("no output")));
    }
}
