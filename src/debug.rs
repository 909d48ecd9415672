//! Logging in NVIDIA's format: `NCCL_DEBUG` (VERSION, WARN, INFO, TRACE), `NCCL_DEBUG_SUBSYS`
//! (comma list, `^` to exclude, ALL), `NCCL_DEBUG_FILE` (`%h` host, `%p` pid) and the line
//! format `host:pid:tid [dev] NCCL INFO message`. The macros `warn!`, `info!` and `trace!`
//! are the only way the library logs; [`print_stdout`] prints the reports a caller asks for
//! (`ncclParamDumpAll`).

use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::cell::Cell;
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Verbosity, in NCCL's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    None = 0,
    Version = 1,
    Warn = 2,
    Info = 3,
    Abort = 4,
    Trace = 5,
}

/// Subsystem bits, as NCCL names them in `NCCL_DEBUG_SUBSYS`.
pub mod subsys {
    pub const INIT: u32 = 1 << 0;
    pub const COLL: u32 = 1 << 1;
    pub const P2P: u32 = 1 << 2;
    pub const SHM: u32 = 1 << 3;
    pub const NET: u32 = 1 << 4;
    pub const GRAPH: u32 = 1 << 5;
    pub const TUNING: u32 = 1 << 6;
    pub const ENV: u32 = 1 << 7;
    pub const ALLOC: u32 = 1 << 8;
    pub const CALL: u32 = 1 << 9;
    pub const PROXY: u32 = 1 << 10;
    pub const NVLS: u32 = 1 << 11;
    pub const BOOTSTRAP: u32 = 1 << 12;
    pub const REG: u32 = 1 << 13;
    pub const PROFILE: u32 = 1 << 14;
    pub const RAS: u32 = 1 << 15;
    pub const ALL: u32 = !0;
    pub const NAMES: &[(&str, u32)] = &[
        ("INIT", INIT),
        ("COLL", COLL),
        ("P2P", P2P),
        ("SHM", SHM),
        ("NET", NET),
        ("GRAPH", GRAPH),
        ("TUNING", TUNING),
        ("ENV", ENV),
        ("ALLOC", ALLOC),
        ("CALL", CALL),
        ("PROXY", PROXY),
        ("NVLS", NVLS),
        ("BOOTSTRAP", BOOTSTRAP),
        ("REG", REG),
        ("PROFILE", PROFILE),
        ("RAS", RAS),
        ("ALL", ALL),
    ];
}

/// Where log lines go; the level and subsystem mask live in atomics for a cheap check.
struct Config {
    file: Option<File>,
}

static CONFIG: Lazy<Mutex<Config>> = Lazy::new(|| Mutex::new(read_config()));
static LEVEL: AtomicU32 = AtomicU32::new(u32::MAX);
static MASK: AtomicU32 = AtomicU32::new(0);
static BANNER: AtomicBool = AtomicBool::new(false);

thread_local! {
    static CUDA_DEV: Cell<i32> = const { Cell::new(-1) };
}

/// Parse `NCCL_DEBUG`.
pub fn parse_level(v: Option<&str>) -> Level {
    match v.map(|s| s.to_ascii_uppercase()) {
        Some(s) if s == "VERSION" => Level::Version,
        Some(s) if s == "WARN" => Level::Warn,
        Some(s) if s == "INFO" => Level::Info,
        Some(s) if s == "ABORT" => Level::Abort,
        Some(s) if s == "TRACE" => Level::Trace,
        _ => Level::None,
    }
}

/// Parse `NCCL_DEBUG_SUBSYS`: a comma list; a leading `^` inverts the whole list.
pub fn parse_subsys(v: Option<&str>) -> u32 {
    let default = subsys::INIT | subsys::BOOTSTRAP | subsys::ENV;
    let Some(v) = v else { return default };
    let (invert, list) = match v.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let mut mask = 0u32;
    for name in list.split(',').map(|s| s.trim().to_ascii_uppercase()) {
        if let Some((_, bit)) = subsys::NAMES.iter().find(|(n, _)| *n == name) {
            mask |= bit;
        }
    }
    if invert {
        !mask
    } else {
        mask
    }
}

/// Expand `%h` (host name) and `%p` (pid) in `NCCL_DEBUG_FILE`.
pub fn expand_file_name(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '%' {
            match chars.peek() {
                Some('h') => {
                    out.push_str(host);
                    chars.next();
                }
                Some('p') => {
                    out.push_str(&pid.to_string());
                    chars.next();
                }
                Some('%') => {
                    out.push('%');
                    chars.next();
                }
                _ => out.push('%'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn read_config() -> Config {
    let level = parse_level(crate::env::registry::DEBUG.raw().as_deref());
    let mask = parse_subsys(crate::env::registry::DEBUG_SUBSYS.raw().as_deref());
    let file = crate::env::registry::DEBUG_FILE.raw().and_then(|pattern| {
        let name = expand_file_name(&pattern, &hostname(), std::process::id());
        File::create(name).ok()
    });
    LEVEL.store(level as u32, Ordering::Relaxed);
    MASK.store(mask, Ordering::Relaxed);
    Config { file }
}

/// Re-read the logging variables (`ncclResetDebugInit`).
pub fn reset() {
    crate::env::reload();
    *CONFIG.lock() = read_config();
    BANNER.store(false, Ordering::Relaxed);
}

fn level() -> Level {
    if LEVEL.load(Ordering::Relaxed) == u32::MAX {
        Lazy::force(&CONFIG);
    }
    match LEVEL.load(Ordering::Relaxed) {
        1 => Level::Version,
        2 => Level::Warn,
        3 => Level::Info,
        4 => Level::Abort,
        5 => Level::Trace,
        _ => Level::None,
    }
}

/// Whether a message at `lvl` for subsystem `sys` would be printed.
pub fn enabled(lvl: Level, sys: u32) -> bool {
    let l = level();
    if l < lvl {
        return false;
    }
    lvl <= Level::Warn || MASK.load(Ordering::Relaxed) & sys != 0
}

/// The CUDA device number this thread's log lines name.
pub fn set_thread_device(dev: i32) {
    CUDA_DEV.with(|d| d.set(dev));
}

/// The machine's host name.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its whole length; gethostname NUL-terminates within it
    // (or truncates, which we handle by stopping at the first NUL or the end).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let full = String::from_utf8_lossy(&buf[..end]).into_owned();
    // NCCL prints the host name up to the first dot.
    full.split('.').next().unwrap_or("").to_string()
}

fn thread_id() -> i64 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) }
}

/// Print one line at `lvl` (called through the macros).
pub fn log(lvl: Level, sys: u32, args: std::fmt::Arguments<'_>) {
    if !enabled(lvl, sys) {
        return;
    }
    if !BANNER.swap(true, Ordering::Relaxed) && level() >= Level::Version {
        emit(
            Level::Info,
            format_args!(
                "NCCL version {} (oxccl {})",
                version_string(),
                env!("CARGO_PKG_VERSION")
            ),
        );
    }
    emit(lvl, args);
}

/// `2.32.3+oxccl`: the NCCL release whose ABI the library implements (from
/// `abi::NCCL_VERSION_CODE`), as the version line printed once at the first message says it.
pub fn version_string() -> String {
    let code = crate::abi::NCCL_VERSION_CODE;
    format!(
        "{}.{}.{}+oxccl",
        code / 10000,
        code % 10000 / 100,
        code % 100
    )
}

fn emit(lvl: Level, args: std::fmt::Arguments<'_>) {
    let tag = match lvl {
        Level::Warn => "WARN",
        Level::Trace => "TRACE",
        _ => "INFO",
    };
    let dev = CUDA_DEV.with(|d| d.get());
    let line = format!(
        "{}:{}:{} [{}] NCCL {} {}\n",
        hostname(),
        std::process::id(),
        thread_id(),
        dev.max(0),
        tag,
        args
    );
    let mut cfg = CONFIG.lock();
    match cfg.file.as_mut() {
        Some(f) => {
            let _ = f.write_all(line.as_bytes());
        }
        None => {
            let _ = std::io::stdout().lock().write_all(line.as_bytes());
        }
    }
}

/// Print `text` as it is to stdout, whatever `NCCL_DEBUG` and `NCCL_DEBUG_FILE` say: for a
/// report the caller asked for, which NVIDIA's library also prints there.
pub fn print_stdout(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

/// Log a warning (printed whenever `NCCL_DEBUG` is WARN or more verbose).
#[macro_export]
macro_rules! warn {
    ($($t:tt)*) => {
        $crate::debug::log($crate::debug::Level::Warn, $crate::debug::subsys::ALL, format_args!($($t)*))
    };
}

/// Log an INFO line for a subsystem: `info!(INIT, "...")`, or for any of several, as NVIDIA's
/// `INFO(NCCL_INIT|NCCL_NET, ...)`: `info!(INIT | NET, "...")`.
#[macro_export]
macro_rules! info {
    ($($sys:ident)|+, $($t:tt)*) => {
        if $crate::debug::enabled($crate::debug::Level::Info, 0 $(| $crate::debug::subsys::$sys)+) {
            $crate::debug::log($crate::debug::Level::Info, 0 $(| $crate::debug::subsys::$sys)+, format_args!($($t)*))
        }
    };
}

/// Log a TRACE line for a subsystem: `trace!(COLL, "...")`.
#[macro_export]
macro_rules! trace {
    ($sys:ident, $($t:tt)*) => {
        if $crate::debug::enabled($crate::debug::Level::Trace, $crate::debug::subsys::$sys) {
            $crate::debug::log($crate::debug::Level::Trace, $crate::debug::subsys::$sys, format_args!($($t)*))
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels() {
        assert_eq!(parse_level(Some("info")), Level::Info);
        assert_eq!(parse_level(Some("WARN")), Level::Warn);
        assert_eq!(parse_level(None), Level::None);
        assert_eq!(parse_level(Some("bogus")), Level::None);
    }

    #[test]
    fn subsystems() {
        assert_eq!(parse_subsys(Some("INIT,COLL")), subsys::INIT | subsys::COLL);
        assert_eq!(parse_subsys(Some("^COLL")), !subsys::COLL);
        assert_eq!(parse_subsys(Some("ALL")), subsys::ALL);
        assert_eq!(
            parse_subsys(None),
            subsys::INIT | subsys::BOOTSTRAP | subsys::ENV
        );
    }

    #[test]
    fn file_names() {
        assert_eq!(
            expand_file_name("/tmp/nccl.%h.%p.log", "node1", 42),
            "/tmp/nccl.node1.42.log"
        );
        assert_eq!(expand_file_name("a%%b%x", "h", 1), "a%b%x");
    }
}
