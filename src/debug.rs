//! Logging in NVIDIA's format: `NCCL_DEBUG` (VERSION, WARN, INFO, TRACE), `NCCL_DEBUG_SUBSYS`
//! (comma list, `^` to exclude, ALL), `NCCL_DEBUG_FILE` (`%h` host, `%p` pid),
//! `NCCL_DEBUG_TIMESTAMP_LEVELS` / `NCCL_DEBUG_TIMESTAMP_FORMAT` (WARN lines start with
//! `[%F %T] ` by default), `NCCL_WARN_ENABLE_DEBUG_INFO`, and NVIDIA's line formats
//! (`host:pid:tid [dev] NCCL INFO message`, `host:pid:tid [dev] file:line (func) NCCL WARN
//! message` after an empty line). The macros `warn!`, `info!` and `trace!` are the only way
//! the library logs; [`show_version`] prints the version line when a communicator is made;
//! [`print_stdout`] prints the reports a caller asks for (`ncclParamDumpAll`).

use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::cell::Cell;
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

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
    pub const DESTROY: u32 = 1 << 16;
    pub const ALLOC_HOST: u32 = 1 << 17;
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
        ("DESTROY", DESTROY),
        ("ALLOC_HOST", ALLOC_HOST),
        ("ALL", ALL),
    ];
}

/// Where log lines go and how they look; the level and subsystem mask live in atomics for a
/// cheap check.
struct Config {
    file: Option<File>,
    /// Bit `1 << level` for each level whose lines start with a timestamp
    /// (`NCCL_DEBUG_TIMESTAMP_LEVELS`).
    timestamp_levels: u32,
    /// `NCCL_DEBUG_TIMESTAMP_FORMAT`, prepared.
    timestamp: TimestampFormat,
    /// `NCCL_WARN_ENABLE_DEBUG_INFO`: the first WARN raises the level to INFO.
    warn_enables_info: bool,
    /// When the settings were read: TRACE lines give milliseconds since then.
    epoch: Instant,
}

static CONFIG: Lazy<Mutex<Config>> = Lazy::new(|| Mutex::new(read_config()));
static LEVEL: AtomicU32 = AtomicU32::new(u32::MAX);
static MASK: AtomicU32 = AtomicU32::new(0);

thread_local! {
    static CUDA_DEV: Cell<i32> = const { Cell::new(-1) };
}

/// Where a line was logged from: a WARN names the file, line and function, a TRACE the
/// function and line, as NVIDIA's lines do. [`here!`](crate::here) gives the caller's.
#[derive(Clone, Copy, Debug)]
pub struct Site<'a> {
    /// The source path below `src/` (NVIDIA's `__FILE__` is relative to its `src/` too).
    pub file: &'a str,
    pub line: u32,
    /// The function's own name; empty where unknown (a plugin's line).
    pub func: &'a str,
}

impl Site<'static> {
    /// Where an error was made ([`crate::error::Error::origin`]): file and line, no function.
    pub fn at(origin: &'static std::panic::Location<'static>) -> Site<'static> {
        let file = origin.file();
        Site {
            file: file.strip_prefix("src/").unwrap_or(file),
            line: origin.line(),
            func: "",
        }
    }

    /// A site in oxccl's sources: `file!()`, `line!()` and the type name of a function
    /// item declared in the calling function (see [`here!`](crate::here)).
    pub fn of(file: &'static str, line: u32, marker: &'static str) -> Site<'static> {
        Site {
            file: file.strip_prefix("src/").unwrap_or(file),
            line,
            func: function_name(marker),
        }
    }
}

/// The calling function's name from the type name of a marker function declared inside it
/// (`oxccl::transport::net::ib::conn::post::{{closure}}::marker` gives `post`).
pub fn function_name(marker: &'static str) -> &'static str {
    let mut path = marker.rsplit_once("::").map_or("", |(outer, _)| outer);
    while let Some(outer) = path.strip_suffix("::{{closure}}") {
        path = outer;
    }
    path.rsplit("::").next().unwrap_or(path)
}

/// The calling code's [`Site`].
#[macro_export]
macro_rules! here {
    () => {{
        fn marker() {}
        $crate::debug::Site::of(file!(), line!(), ::std::any::type_name_of_val(&marker))
    }};
}

/// `NCCL_DEBUG_TIMESTAMP_FORMAT` as NVIDIA prepares it: a `strftime` format whose first
/// `%Nf` (N from 1 to 9, not after an escaped `%%`) stands for N digits of the second's
/// fraction, and whose underscores are spaces. Empty: no timestamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimestampFormat {
    /// The format with the `%Nf` taken out.
    text: String,
    /// Where the subseconds go in `text`, and how many digits.
    subseconds: Option<(usize, u32)>,
}

/// The longest format NVIDIA keeps (its buffer is 256 bytes); a longer one falls back to
/// the default.
const TIMESTAMP_FORMAT_MAX: usize = 255;
const DEFAULT_TIMESTAMP_FORMAT: &str = "[%F %T] ";

impl TimestampFormat {
    pub fn parse(format: &str) -> TimestampFormat {
        let bytes = format.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' && bytes.get(i + 1) == Some(&b'%') {
                i += 2;
                continue;
            }
            if bytes[i] == b'%'
                && matches!(bytes.get(i + 1), Some(b'1'..=b'9'))
                && bytes.get(i + 2) == Some(&b'f')
            {
                let digits = u32::from(bytes[i + 1] - b'0');
                if format.len() - 3 + digits as usize > TIMESTAMP_FORMAT_MAX {
                    break;
                }
                let text = format!("{}{}", &format[..i], &format[i + 3..]);
                return TimestampFormat {
                    text: text.replace('_', " "),
                    subseconds: Some((i, digits)),
                };
            }
            i += 1;
        }
        let text = if format.len() <= TIMESTAMP_FORMAT_MAX {
            format
        } else {
            DEFAULT_TIMESTAMP_FORMAT
        };
        TimestampFormat {
            text: text.replace('_', " "),
            subseconds: None,
        }
    }

    /// The format with the subseconds of `nanos` in place: what `strftime` gets.
    fn with_subseconds(&self, nanos: u32) -> String {
        match self.subseconds {
            None => self.text.clone(),
            Some((at, digits)) => {
                let fraction = u64::from(nanos) / 10u64.pow(9 - digits);
                let mut text = self.text.clone();
                text.insert_str(at, &format!("{fraction:0width$}", width = digits as usize));
                text
            }
        }
    }

    /// The timestamp of `secs.nanos` (seconds since the epoch) in local time; empty for an
    /// empty format.
    pub fn render(&self, secs: i64, nanos: u32) -> String {
        if self.text.is_empty() {
            return String::new();
        }
        let format = self.with_subseconds(nanos);
        strftime_local(&format, secs)
            .or_else(|| strftime_local(DEFAULT_TIMESTAMP_FORMAT, secs))
            .unwrap_or_default()
    }
}

/// `strftime` of `secs` in local time, or `None` where it does not fit NVIDIA's 1 KiB line.
fn strftime_local(format: &str, secs: i64) -> Option<String> {
    let format = std::ffi::CString::new(format).ok()?;
    let time: libc::time_t = secs;
    // SAFETY: tm is plain data that localtime_r fills; both pointers are valid for the call.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: time and tm are valid for the call.
    if unsafe { libc::localtime_r(&time, &mut tm) }.is_null() {
        return None;
    }
    let mut buf = [0u8; 1024];
    // SAFETY: buf is writable for its length, format is NUL-terminated and tm filled above.
    let n = unsafe { libc::strftime(buf.as_mut_ptr().cast(), buf.len(), format.as_ptr(), &tm) };
    (n > 0).then(|| String::from_utf8_lossy(&buf[..n]).into_owned())
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
    use crate::env::registry as reg;
    let level = parse_level(reg::DEBUG.raw().as_deref());
    let mask = parse_subsys(reg::DEBUG_SUBSYS.raw().as_deref());
    let file = reg::DEBUG_FILE.raw().and_then(|pattern| {
        let name = expand_file_name(&pattern, &hostname(), std::process::id());
        File::create(name).ok()
    });
    LEVEL.store(level as u32, Ordering::Relaxed);
    MASK.store(mask, Ordering::Relaxed);
    Config {
        file,
        timestamp_levels: parse_timestamp_levels(reg::DEBUG_TIMESTAMP_LEVELS.raw().as_deref()),
        timestamp: TimestampFormat::parse(
            reg::DEBUG_TIMESTAMP_FORMAT
                .raw()
                .as_deref()
                .unwrap_or(DEFAULT_TIMESTAMP_FORMAT),
        ),
        warn_enables_info: matches!(
            reg::WARN_ENABLE_DEBUG_INFO.raw().as_deref().map(str::trim),
            Some(v) if v.parse::<i64>().is_ok_and(|n| n != 0)
        ),
        epoch: Instant::now(),
    }
}

/// Parse `NCCL_DEBUG_TIMESTAMP_LEVELS` (default WARN): level names, `ALL`, `^` to exclude.
pub fn parse_timestamp_levels(v: Option<&str>) -> u32 {
    let Some(v) = v else {
        return 1 << Level::Warn as u32;
    };
    let crate::env::Kind::ListOf(choices) = crate::env::registry::DEBUG_TIMESTAMP_LEVELS.kind
    else {
        unreachable!("NCCL_DEBUG_TIMESTAMP_LEVELS is a list")
    };
    crate::env::mask_of(choices, v) as u32
}

/// Re-read the logging variables (`ncclResetDebugInit`).
pub fn reset() {
    crate::env::reload();
    *CONFIG.lock() = read_config();
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
    // NCCL prints the host name up to the first dot, with '%' and '/' made dashes.
    let short = full.split('.').next().unwrap_or("");
    short.replace(['%', '/'], "-")
}

fn thread_id() -> i64 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) }
}

/// Print one line at `lvl` from `site` (called through the macros).
pub fn log(lvl: Level, sys: u32, site: Site<'_>, args: std::fmt::Arguments<'_>) {
    if !enabled(lvl, sys) {
        return;
    }
    emit(lvl, sys, site, args);
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

/// The version line, once per process, when a communicator is created: as NVIDIA's library,
/// on every rank from `NCCL_DEBUG=INFO` on, and on rank 0 alone (as a bare line) at VERSION
/// or WARN.
pub fn show_version(rank: i32) {
    static SHOWN: std::sync::Once = std::sync::Once::new();
    let l = level();
    if !(l > Level::Warn || (l != Level::None && rank == 0)) {
        return;
    }
    SHOWN.call_once(|| {
        let text = format!(
            "NCCL version {} (oxccl {})",
            version_string(),
            env!("CARGO_PKG_VERSION")
        );
        if l <= Level::Warn {
            emit(
                Level::Version,
                subsys::ALL,
                crate::here!(),
                format_args!("{text}"),
            );
        } else {
            crate::info!(ALL, "{text}");
        }
    });
}

/// The fields a line is made of, apart from the settings.
struct Line<'a> {
    lvl: Level,
    sys: u32,
    site: Site<'a>,
    host: &'a str,
    pid: u32,
    tid: i64,
    dev: i32,
    /// Milliseconds since the settings were read (TRACE lines).
    elapsed_ms: f64,
}

/// One line in NVIDIA's format (`debug.cc`): a WARN starts with an empty line; a timestamp
/// where `NCCL_DEBUG_TIMESTAMP_LEVELS` asks; `host:pid:tid ` except at VERSION; then
/// `[dev] file:line (func) NCCL WARN`, `[dev] NCCL INFO`, `[dev] ms func:line NCCL TRACE`
/// or `NCCL CALL`.
fn format_line(line: &Line<'_>, timestamp: &str, args: std::fmt::Arguments<'_>) -> String {
    let mut out = String::with_capacity(160);
    if line.lvl == Level::Warn {
        out.push('\n');
    }
    out.push_str(timestamp);
    if line.lvl != Level::Version {
        out.push_str(&format!("{}:{}:{} ", line.host, line.pid, line.tid));
    }
    let dev = line.dev.max(0);
    let site = &line.site;
    let prefix = match line.lvl {
        Level::Warn if site.func.is_empty() => {
            format!("[{dev}] {}:{} NCCL WARN ", site.file, site.line)
        }
        Level::Warn => format!(
            "[{dev}] {}:{} ({}) NCCL WARN ",
            site.file, site.line, site.func
        ),
        Level::Trace if line.sys == subsys::CALL => "NCCL CALL ".to_string(),
        Level::Trace => format!(
            "[{dev}] {:.6} {}:{} NCCL TRACE ",
            line.elapsed_ms, site.func, site.line
        ),
        Level::Version => String::new(),
        _ => format!("[{dev}] NCCL INFO "),
    };
    out.push_str(&prefix);
    out.push_str(&args.to_string());
    out.push('\n');
    out
}

fn emit(lvl: Level, sys: u32, site: Site<'_>, args: std::fmt::Arguments<'_>) {
    let mut cfg = CONFIG.lock();
    let timestamp = if cfg.timestamp_levels & (1 << lvl as u32) != 0 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        cfg.timestamp
            .render(now.as_secs() as i64, now.subsec_nanos())
    } else {
        String::new()
    };
    let line = Line {
        lvl,
        sys,
        site,
        host: &hostname(),
        pid: std::process::id(),
        tid: thread_id(),
        dev: CUDA_DEV.with(|d| d.get()),
        elapsed_ms: cfg.epoch.elapsed().as_secs_f64() * 1000.0,
    };
    let text = format_line(&line, &timestamp, args);
    match cfg.file.as_mut() {
        Some(f) => {
            let _ = f.write_all(text.as_bytes());
        }
        None => {
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
        }
    }
    if lvl == Level::Warn && cfg.warn_enables_info && level() < Level::Info {
        LEVEL.store(Level::Info as u32, Ordering::Relaxed);
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
        $crate::debug::log($crate::debug::Level::Warn, $crate::debug::subsys::ALL, $crate::here!(), format_args!($($t)*))
    };
}

/// Log an INFO line for a subsystem: `info!(INIT, "...")`, or for any of several, as NVIDIA's
/// `INFO(NCCL_INIT|NCCL_NET, ...)`: `info!(INIT | NET, "...")`.
#[macro_export]
macro_rules! info {
    ($($sys:ident)|+, $($t:tt)*) => {
        if $crate::debug::enabled($crate::debug::Level::Info, 0 $(| $crate::debug::subsys::$sys)+) {
            $crate::debug::log($crate::debug::Level::Info, 0 $(| $crate::debug::subsys::$sys)+, $crate::here!(), format_args!($($t)*))
        }
    };
}

/// Log a TRACE line for a subsystem: `trace!(COLL, "...")`.
#[macro_export]
macro_rules! trace {
    ($sys:ident, $($t:tt)*) => {
        if $crate::debug::enabled($crate::debug::Level::Trace, $crate::debug::subsys::$sys) {
            $crate::debug::log($crate::debug::Level::Trace, $crate::debug::subsys::$sys, $crate::here!(), format_args!($($t)*))
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

    fn line<'a>(lvl: Level, sys: u32, site: Site<'a>) -> Line<'a> {
        Line {
            lvl,
            sys,
            site,
            host: "node1",
            pid: 42,
            tid: 43,
            dev: 1,
            elapsed_ms: 12.5,
        }
    }

    const SITE: Site<'static> = Site {
        file: "transport/net/ib/conn.rs",
        line: 77,
        func: "post",
    };

    #[test]
    fn lines_are_nvidias() {
        let fmt = |l: &Line<'_>, ts: &str| format_line(l, ts, format_args!("x {}", 1));
        assert_eq!(
            fmt(&line(Level::Warn, subsys::ALL, SITE), "[ts] "),
            "\n[ts] node1:42:43 [1] transport/net/ib/conn.rs:77 (post) NCCL WARN x 1\n"
        );
        let plugin_warn = Site {
            file: "nccl_ofi_net.c",
            line: 9,
            func: "",
        };
        assert_eq!(
            fmt(&line(Level::Warn, subsys::NET, plugin_warn), ""),
            "\nnode1:42:43 [1] nccl_ofi_net.c:9 NCCL WARN x 1\n"
        );
        assert_eq!(
            fmt(&line(Level::Info, subsys::INIT, SITE), ""),
            "node1:42:43 [1] NCCL INFO x 1\n"
        );
        assert_eq!(
            fmt(&line(Level::Trace, subsys::COLL, SITE), ""),
            "node1:42:43 [1] 12.500000 post:77 NCCL TRACE x 1\n"
        );
        assert_eq!(
            fmt(&line(Level::Trace, subsys::CALL, SITE), ""),
            "node1:42:43 NCCL CALL x 1\n"
        );
        assert_eq!(
            fmt(&line(Level::Version, subsys::ALL, SITE), "[ts] "),
            "[ts] x 1\n"
        );
    }

    #[test]
    fn a_site_names_the_calling_function() {
        fn caller() -> Site<'static> {
            crate::here!()
        }
        let site = caller();
        assert_eq!(site.func, "caller");
        assert_eq!(site.file, "debug.rs");
        let make = || crate::here!();
        let in_closure = make();
        assert_eq!(in_closure.func, "a_site_names_the_calling_function");
        assert_eq!(function_name("oxccl::a::b::marker"), "b");
        assert_eq!(
            function_name("oxccl::a::{{closure}}::{{closure}}::marker"),
            "a"
        );
    }

    #[test]
    fn timestamp_levels_as_nvidia_parses_them() {
        let bit = |l: Level| 1u32 << l as u32;
        assert_eq!(parse_timestamp_levels(None), bit(Level::Warn));
        assert_eq!(
            parse_timestamp_levels(Some("info,trace")),
            bit(Level::Info) | bit(Level::Trace)
        );
        assert_eq!(parse_timestamp_levels(Some("bogus")), 0);
        let all = parse_timestamp_levels(Some("ALL"));
        for l in [Level::Version, Level::Warn, Level::Info, Level::Trace] {
            assert_ne!(all & bit(l), 0);
        }
        assert_eq!(parse_timestamp_levels(Some("^WARN")) & bit(Level::Warn), 0);
        assert_ne!(parse_timestamp_levels(Some("^WARN")) & bit(Level::Info), 0);
    }

    #[test]
    fn timestamp_formats_as_nvidia_prepares_them() {
        let f = TimestampFormat::parse("<%3f>_%%5f_%6f");
        assert_eq!(f.with_subseconds(123_456_789), "<123> %%5f %6f");
        let f = TimestampFormat::parse("%%3f|%2f");
        assert_eq!(f.with_subseconds(50_000_000), "%%3f|05");
        assert_eq!(TimestampFormat::parse("").render(0, 0), "");
        assert_eq!(TimestampFormat::parse("%%").render(0, 0), "%");
        let long = "x".repeat(300);
        assert_eq!(TimestampFormat::parse(&long).text, "[%F %T] ");
        // A date in the default format: "[YYYY-MM-DD hh:mm:ss] ".
        let d = TimestampFormat::parse(DEFAULT_TIMESTAMP_FORMAT).render(1_700_000_000, 0);
        assert_eq!(d.len(), 22, "{d}");
        assert!(d.starts_with("[20") && d.ends_with("] "), "{d}");
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
