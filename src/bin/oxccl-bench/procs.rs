//! Child processes: turning options back into a command line, spawning copies of this
//! executable (one per rank for `-p`, one per library for `--vs`), reading their event lines,
//! passing their other output through, and stopping all of them when one fails or stalls.

use crate::args::{Layout, Options};
use crate::protocol::{parse_event, Event};
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
    match opts.layout {
        Layout::Threadless(Some(n)) => args.extend(["-g".to_string(), n.to_string()]),
        Layout::Threadless(None) => {}
        Layout::Processes(n) => args.extend(["-p".to_string(), n.to_string()]),
    }
    args
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
    loop {
        match receiver.recv_timeout(Duration::from_millis(100)) {
            Ok(Message::Line(index, line)) => {
                last_activity = Instant::now();
                match parse_event(&line) {
                    Some(Ok(event)) => on_event(index, event),
                    Some(Err(message)) => {
                        kill_all(&mut children);
                        return Err(Failure::Error(message));
                    }
                    None => println!("[{}] {line}", children[index].0),
                }
            }
            Ok(Message::Closed) => open -= 1,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => open = 0,
        }
        // Look for children that ended.
        let mut failure = None;
        for (label, child, exited) in children.iter_mut() {
            if *exited {
                continue;
            }
            match child.try_wait() {
                Ok(Some(status)) => {
                    *exited = true;
                    if !status.success() {
                        let message = match status.code() {
                            Some(code) => {
                                format!("child process {label} exited with status {code}")
                            }
                            None => {
                                format!("child process {label} was killed by a signal ({status})")
                            }
                        };
                        failure = Some(if status.code() == Some(EXIT_HANG) {
                            Failure::Hang(message)
                        } else {
                            Failure::Error(message)
                        });
                        break;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    failure = Some(Failure::Error(format!(
                        "cannot wait for child {label}: {e}"
                    )));
                    break;
                }
            }
        }
        if let Some(failure) = failure {
            // Drain what the others already printed, then stop them.
            while let Ok(Message::Line(index, line)) =
                receiver.recv_timeout(Duration::from_millis(50))
            {
                if parse_event(&line).is_none() {
                    println!("[{}] {line}", children[index].0);
                }
            }
            kill_all(&mut children);
            return Err(failure);
        }
        if open == 0 && children.iter().all(|(_, _, exited)| *exited) {
            return Ok(());
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

    #[test]
    fn children_events_and_failures() {
        let mut sh = Command::new("sh");
        sh.args([
            "-c",
            "echo hello; echo '@@OXCCL mem rank=0 bytes=5'; exit 0",
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
            vec![(0, Event::FirstCollMemory { rank: 0, bytes: 5 })]
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
