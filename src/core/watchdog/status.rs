//! The on-demand status endpoint: what NVIDIA's RAS offers, where its users look for it. One
//! thread per process listens on `NCCL_RAS_ADDR` (default `localhost:28028`; `NCCL_RAS_ENABLE=0`
//! turns it off) and answers NVIDIA's `ncclras` client, or a plain `STATUS` line (`echo STATUS |
//! nc localhost 28028`), with the status of every communicator of this process: each rank's
//! last enqueued and completed collective and what it waits in, as every rank of the
//! communicator answers over the bootstrap (`status_report`), and the last hang report. The
//! first process of a host to bind the port serves; the others run without an endpoint. The
//! protocol is line based: `CLIENT PROTOCOL <n>` (answered `SERVER PROTOCOL 2`), `TIMEOUT <s>`
//! and `SET FORMAT text` (answered `OK`), then `[VERBOSE ]STATUS`, answered with the text, then
//! the connection closes. Every read is bounded.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// The protocol version of NVIDIA's `ncclras` client this endpoint speaks.
const PROTOCOL: u32 = 2;
/// How long a client may take for one line.
const LINE_LIMIT: Duration = Duration::from_secs(10);
/// How long the ranks of a communicator may take to answer (the default of `TIMEOUT`).
const ANSWER_LIMIT: Duration = Duration::from_secs(6);
/// Longest line a client may send.
const MAX_LINE: usize = 256;

/// Start the endpoint for this process, once (when the settings allow and the port is free).
pub fn serve_once() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        if !crate::env::registry::RAS_ENABLE.flag() {
            return;
        }
        let addr = crate::env::registry::RAS_ADDR.string();
        match TcpListener::bind(addr.as_str()) {
            Ok(listener) => {
                crate::info!(INIT, "status endpoint (ncclras) listening on {addr}");
                let _ = std::thread::Builder::new()
                    .name("oxccl-status".into())
                    .spawn(move || serve(listener));
            }
            Err(e) => crate::info!(
                INIT,
                "no status endpoint on {addr} ({e}): another process of this host serves it?"
            ),
        }
    });
}

/// Answer clients on `listener`, one at a time, for as long as the process lives.
pub fn serve(listener: TcpListener) {
    for stream in listener.incoming().flatten() {
        if let Err(e) = answer(stream) {
            crate::info!(INIT, "status endpoint: a client went away: {e}");
        }
    }
}

/// One client: the handshake lines, then the status.
fn answer(stream: TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(LINE_LIMIT))?;
    stream.set_write_timeout(Some(LINE_LIMIT))?;
    let mut out = stream.try_clone()?;
    let mut lines = BufReader::new(stream.take(64 * MAX_LINE as u64));
    let mut limit = ANSWER_LIMIT;
    loop {
        let mut line = String::new();
        if lines.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let upper: Vec<String> = words.iter().map(|w| w.to_ascii_uppercase()).collect();
        let upper: Vec<&str> = upper.iter().map(String::as_str).collect();
        match upper.as_slice() {
            ["CLIENT", "PROTOCOL", ..] => writeln!(out, "SERVER PROTOCOL {PROTOCOL}")?,
            ["TIMEOUT", secs] => {
                let secs: u64 = secs.parse().unwrap_or(ANSWER_LIMIT.as_secs());
                limit = Duration::from_secs(secs.clamp(1, 60));
                writeln!(out, "OK")?;
            }
            ["SET", "FORMAT", "TEXT"] => writeln!(out, "OK")?,
            ["SET", "FORMAT", other] => writeln!(
                out,
                "ERROR format {other} is not supported by oxccl (text only)"
            )?,
            ["STATUS"] | ["VERBOSE", "STATUS"] => {
                out.write_all(status_text(limit).as_bytes())?;
                return Ok(());
            }
            [] => {}
            _ => writeln!(out, "ERROR unknown command; send STATUS")?,
        }
    }
}

/// The whole answer: who answers, then every communicator's status.
pub fn status_text(limit: Duration) -> String {
    let comms = super::status_report(limit);
    format!(
        "NCCL {} status of process {} on {}\n{}",
        crate::debug::version_string(),
        std::process::id(),
        crate::debug::hostname(),
        if comms.is_empty() {
            "no communicator of more than one rank\n".to_string()
        } else {
            comms
        }
    )
}
