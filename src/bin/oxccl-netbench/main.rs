//! oxccl-netbench: the built-in socket network beside a plain pair of TCP sockets, between two
//! processes of this machine over loopback, with host buffers, in one run. The parent sends,
//! a child process (this program again) receives; each message size is timed both ways, from
//! the parent's first send until the child says on its stdout that it has received the last
//! byte (the same end for both, before either side tears anything down), `--reps` times each,
//! alternating, and the median reported. Both cycle through `--inflight` buffers per side,
//! each side's made (and touched) before the clock starts.
//!
//! Usage: oxccl-netbench [--sizes 64K,1M,4M,16M] [--total 1G] [--inflight 4] [--reps 3]
//! The socket network's shape comes from NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD.

use nccl::bootstrap::socket::NetIf;
use nccl::transport::net::api::{Comm, Handle, MemType, Net, Request, HANDLE_BYTES};
use nccl::transport::net::socket::{Shape, SocketNet};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD: &str = "OXCCL_NETBENCH_CHILD";

fn lo() -> NetIf {
    NetIf {
        name: "lo".into(),
        ip: "127.0.0.1".parse().unwrap(),
        scope_id: 0,
    }
}

const USAGE: &str =
    "usage: oxccl-netbench [--sizes 64K,1M,4M,16M] [--total 1G] [--inflight 4] [--reps 3]
  (the socket network's shape comes from NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD)";

/// A size like 64K, 1M or 1G.
fn parse_size(s: &str) -> Result<usize, String> {
    let (num, mul) = match s.chars().last() {
        Some('K') => (&s[..s.len() - 1], 1 << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("'{s}' is not a size like 64K, 1M or 1G"))
}

struct Opts {
    sizes: Vec<usize>,
    total: usize,
    inflight: usize,
    reps: usize,
}

fn opts() -> Opts {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match parse_opts(&args) {
        Ok(o) => o,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("oxccl-netbench: {msg}");
            }
            eprintln!("{USAGE}");
            std::process::exit(if msg.is_empty() { 0 } else { 2 });
        }
    }
}

/// The options in `args`; an empty error asks for the usage (`-h`, `--help`).
fn parse_opts(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        sizes: vec![64 << 10, 1 << 20, 4 << 20, 16 << 20],
        total: 1 << 30,
        inflight: 4,
        reps: 3,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--sizes" => o.sizes = v.split(',').map(parse_size).collect::<Result<_, _>>()?,
            "--total" => o.total = parse_size(v)?,
            "--inflight" => o.inflight = positive(flag, v)?,
            "--reps" => o.reps = positive(flag, v)?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(o)
}

/// The positive count `v` of option `flag`.
fn positive(flag: &str, v: &str) -> Result<usize, String> {
    v.parse()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{flag} needs a positive count, not '{v}'"))
}

/// Wait for a request, calling `test` until it is done.
fn wait(net: &dyn Net, r: Request) -> usize {
    let start = Instant::now();
    loop {
        if let Some(n) = net.test(r).expect("test") {
            return n;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "a request hung");
    }
}

/// The `inflight` buffers of `size` bytes a side cycles through (both paths alike, so both
/// touch the same amount of memory).
fn buffers(size: usize, inflight: usize) -> Vec<Vec<u8>> {
    (0..inflight).map(|_| vec![1u8; size]).collect()
}

/// Move `count` messages of `size` bytes over `comm`, `bufs.len()` at a time, message i in
/// `bufs[i % bufs.len()]`.
fn stream(net: &dyn Net, comm: Comm, bufs: &mut [Vec<u8>], count: usize, send: bool) {
    let (size, inflight) = (bufs[0].len(), bufs.len());
    let mh = net
        .reg_mr(comm, bufs[0].as_mut_ptr(), size, MemType::Host)
        .expect("reg_mr");
    let mut pending: VecDeque<(usize, Request)> = VecDeque::new();
    for i in 0..count {
        let b = i % inflight;
        if pending.len() == inflight {
            let (_, r) = pending.pop_front().unwrap();
            wait(net, r);
        }
        let p = bufs[b].as_mut_ptr();
        let r = if send {
            net.isend(comm, p, size, 0, mh)
        } else {
            net.irecv(comm, p, size, 0, mh)
        };
        pending.push_back((b, r.expect("post").expect("a request")));
    }
    for (_, r) in pending {
        wait(net, r);
    }
}

fn child(spec: &str) {
    let mut parts = spec.split(',');
    let kind = parts.next().unwrap();
    let size: usize = parts.next().unwrap().parse().unwrap();
    let count: usize = parts.next().unwrap().parse().unwrap();
    let inflight: usize = parts.next().unwrap().parse().unwrap();
    let mut out = std::io::stdout();
    // Before the address is out: the sender's clock may start once it is.
    let mut bufs = buffers(size, inflight);
    if kind == "tcp" {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        writeln!(out, "{}", l.local_addr().unwrap().port()).unwrap();
        out.flush().unwrap();
        let (mut s, _) = l.accept().unwrap();
        for i in 0..count {
            s.read_exact(&mut bufs[i % inflight]).unwrap();
        }
        say_done(&mut out);
        return;
    }
    let net = SocketNet::new(lo(), Shape::from_env());
    let (h, l) = net.listen(0).unwrap();
    let hex: String = h.0.iter().map(|b| format!("{b:02x}")).collect();
    writeln!(out, "{hex}").unwrap();
    out.flush().unwrap();
    let comm = loop {
        if let Some(c) = net.accept(l).unwrap() {
            break c;
        }
    };
    stream(&net, comm, &mut bufs, count, false);
    say_done(&mut out);
    net.close_recv(comm).unwrap();
}

/// The child's end of a measurement: every byte received (one line on its stdout).
fn say_done(out: &mut std::io::Stdout) {
    writeln!(out, "done").unwrap();
    out.flush().unwrap();
}

/// A spawned receiver: the process and its stdout, where it says its address, then "done".
struct Receiver {
    child: std::process::Child,
    lines: BufReader<std::process::ChildStdout>,
}

impl Receiver {
    fn line(&mut self) -> String {
        let mut line = String::new();
        self.lines.read_line(&mut line).unwrap();
        line.trim().to_string()
    }

    /// Wait for the receiver (after its "done") to exit.
    fn finish_exit(mut self) {
        self.child.wait().unwrap();
    }
}

/// Start a receiver of `kind` and read the address it listens on.
fn spawn(kind: &str, size: usize, count: usize, inflight: usize) -> (Receiver, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(CHILD, format!("{kind},{size},{count},{inflight}"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap());
    let mut r = Receiver { child, lines };
    let addr = r.line();
    (r, addr)
}

/// Seconds to move `count` messages of `size` over a plain TCP pair (until the receiver has
/// read them all).
fn plain_tcp(size: usize, count: usize, inflight: usize) -> f64 {
    let (mut rx, port) = spawn("tcp", size, count, inflight);
    let mut s = TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap())).unwrap();
    s.set_nodelay(true).unwrap();
    let bufs = buffers(size, inflight);
    let start = Instant::now();
    for i in 0..count {
        s.write_all(&bufs[i % inflight]).unwrap();
    }
    assert_eq!(rx.line(), "done", "the receiver ended early");
    let t = start.elapsed().as_secs_f64();
    rx.child.wait().unwrap();
    t
}

/// Seconds to move the same over the socket network (until the receiver has them all).
fn socket_net(size: usize, count: usize, inflight: usize) -> f64 {
    let (mut rx, hex) = spawn("net", size, count, inflight);
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let handle = Handle(<[u8; HANDLE_BYTES]>::try_from(bytes).unwrap());
    let net = SocketNet::new(lo(), Shape::from_env());
    let comm = net.connect(0, &handle).unwrap().unwrap();
    let mut bufs = buffers(size, inflight);
    let start = Instant::now();
    stream(&net, comm, &mut bufs, count, true);
    assert_eq!(rx.line(), "done", "the receiver ended early");
    let t = start.elapsed().as_secs_f64();
    // Close in order (the goodbye) while the receiver still runs, then let it exit.
    net.close_send(comm).unwrap();
    rx.finish_exit();
    t
}

/// The median of `xs` (not empty).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD) {
        child(&spec);
        return;
    }
    let o = opts();
    let shape = Shape::from_env();
    println!(
        "# oxccl-netbench: loopback, two processes, {} MiB per size; socket network: {} thread(s), {} socket(s), {} in flight; median of {}",
        o.total >> 20,
        shape.nthreads,
        shape.nsocks,
        o.inflight,
        o.reps
    );
    println!(
        "{:>12} {:>14} {:>14} {:>8}",
        "size", "plain GB/s", "oxccl GB/s", "ratio"
    );
    for &size in &o.sizes {
        let count = (o.total / size).max(8);
        let gb = (size * count) as f64 / 1e9;
        let (mut plain, mut ours) = (Vec::new(), Vec::new());
        for _ in 0..o.reps {
            plain.push(gb / plain_tcp(size, count, o.inflight));
            ours.push(gb / socket_net(size, count, o.inflight));
        }
        let (plain, ours) = (median(plain), median(ours));
        println!(
            "{size:>12} {plain:>14.2} {ours:>14.2} {:>8.2}",
            ours / plain
        );
    }
}
