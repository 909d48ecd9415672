//! Every `NCCL_*` setting, read in one place: the process environment first, then the
//! configuration file (`NCCL_CONF_FILE`, else `~/.nccl.conf`), then `/etc/nccl.conf`, as
//! NVIDIA's library does. The files are read once and cached; `reload` re-reads them (used by
//! `ncclResetDebugInit`) and starts a new [`generation`], so that a value derived from the
//! settings and cached elsewhere is recomputed at its next use. Typed getters log the value
//! under `NCCL_DEBUG_SUBSYS=ENV`.

use once_cell::sync::Lazy;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static CONF: Lazy<RwLock<HashMap<String, String>>> = Lazy::new(|| RwLock::new(load_conf_files()));
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Parse one `NAME=value` file (comments start with `#`; blank lines ignored).
pub fn parse_conf(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                return None;
            }
            let (k, v) = line.split_once('=')?;
            let k = k.trim();
            if k.is_empty() {
                return None;
            }
            Some((k.to_string(), v.trim().to_string()))
        })
        .collect()
}

fn conf_paths() -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if let Ok(p) = std::env::var("NCCL_CONF_FILE") {
        paths.push(PathBuf::from(p));
    } else if let Some(home) = std::env::var_os("HOME") {
        paths.push(Path::new(&home).join(".nccl.conf"));
    }
    paths.push(PathBuf::from("/etc/nccl.conf"));
    paths
}

fn load_conf_files() -> HashMap<String, String> {
    let mut map = HashMap::new();
    for path in conf_paths() {
        if let Ok(text) = std::fs::read_to_string(&path) {
            for (k, v) in parse_conf(&text) {
                // The first file that names a variable wins, like NVIDIA's setenv(..., 0).
                map.entry(k).or_insert(v);
            }
        }
    }
    map
}

/// Re-read the configuration files (the environment is always read live).
pub fn reload() {
    *CONF.write() = load_conf_files();
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// How many times the settings were reloaded: a cache of a value computed from them keeps
/// the generation it was computed in and recomputes when this has moved on.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// A value computed from settings, kept until the settings are reloaded ([`reload`]), then
/// computed again on next use: for settings read on every plan, where a lookup each time
/// would cost, and which `ncclResetDebugInit` must still be able to refresh.
pub struct Cached<T: Copy> {
    compute: fn() -> T,
    value: RwLock<Option<(u64, T)>>,
}

impl<T: Copy> Cached<T> {
    pub const fn new(compute: fn() -> T) -> Cached<T> {
        Cached {
            compute,
            value: RwLock::new(None),
        }
    }

    /// The value for the current settings.
    pub fn get(&self) -> T {
        let now = generation();
        if let Some((g, v)) = *self.value.read() {
            if g == now {
                return v;
            }
        }
        let v = (self.compute)();
        *self.value.write() = Some((now, v));
        v
    }
}

/// The raw value of a variable: environment first, then the configuration files.
/// An empty value counts as unset, as in NVIDIA's library.
pub fn get(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => CONF.read().get(name).filter(|v| !v.is_empty()).cloned(),
    }
}

/// An integer variable (decimal or 0x hex); a malformed value falls back to `default`
/// with a warning.
pub fn int(name: &str, default: i64) -> i64 {
    match get(name) {
        None => default,
        Some(v) => match parse_int(&v) {
            Some(n) => {
                crate::info!(ENV, "{name} set by environment to {n}");
                n
            }
            None => {
                crate::warn!("Invalid value {v:?} for {name}, using default {default}");
                default
            }
        },
    }
}

/// A boolean variable: any non-zero integer is true.
pub fn flag(name: &str, default: bool) -> bool {
    int(name, default as i64) != 0
}

/// A string variable, or `default`.
pub fn string(name: &str, default: &str) -> String {
    get(name).unwrap_or_else(|| default.to_string())
}

/// Parse a decimal, `0x` hexadecimal or negative integer.
pub fn parse_int(v: &str) -> Option<i64> {
    let v = v.trim();
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        i64::from_str_radix(h, 16).ok()
    } else {
        v.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cached_value_is_computed_again_after_a_reload() {
        use std::sync::atomic::AtomicU32;
        static CALLS: AtomicU32 = AtomicU32::new(0);
        static V: Cached<u32> = Cached::new(|| CALLS.fetch_add(1, Ordering::Relaxed) + 1);
        let first = V.get();
        assert_eq!(V.get(), first, "kept while the settings stay");
        reload();
        assert!(V.get() > first, "computed again after a reload");
    }

    use super::*;

    #[test]
    fn conf_parsing() {
        let kv = parse_conf("# comment\nNCCL_DEBUG=INFO\n\n  NCCL_X = 3 \nbad line\n=nokey\n");
        assert_eq!(
            kv,
            vec![
                ("NCCL_DEBUG".to_string(), "INFO".to_string()),
                ("NCCL_X".to_string(), "3".to_string())
            ]
        );
    }

    #[test]
    fn reload_starts_a_generation() {
        let before = generation();
        reload();
        assert!(generation() > before);
    }

    #[test]
    fn ints() {
        assert_eq!(parse_int("12"), Some(12));
        assert_eq!(parse_int("0x10"), Some(16));
        assert_eq!(parse_int("-1"), Some(-1));
        assert_eq!(parse_int("abc"), None);
    }
}
