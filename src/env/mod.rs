//! Every `NCCL_*` (and `OXCCL_*`) setting, declared once in [`registry`] and read only
//! through its [`Param`]: the process environment first, then the configuration file
//! (`NCCL_CONF_FILE`, else `~/.nccl.conf`), then `/etc/nccl.conf`, as NVIDIA's library does.
//! The files are read once and cached; `reload` re-reads them (used by `ncclResetDebugInit`)
//! and starts a new [`generation`], so that a value derived from the settings and cached
//! elsewhere is recomputed at its next use. Typed reads log a set value under
//! `NCCL_DEBUG_SUBSYS=ENV`.

pub mod not_built;
mod param;
pub mod registry;

pub use param::{mask_of, Choice, Default, Kind, Param, Value};

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
    // The file is named by the environment only (a configuration file cannot name another).
    if let Ok(p) = std::env::var(registry::CONF_FILE.name) {
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

/// Where a setting's current value comes from (the dump's `set_by`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Default,
    EnvVar,
    ConfigFile,
}

impl Source {
    /// The name NVIDIA's dump gives it.
    pub fn name(self) -> &'static str {
        match self {
            Source::Default => "Default",
            Source::EnvVar => "EnvVar",
            Source::ConfigFile => "ConfigFile",
        }
    }
}

/// The raw value of a variable and where it was found: environment first, then the
/// configuration files. Only [`Param`] reads through this (and [`lookup_raw`], which reports
/// NVIDIA's settings that oxccl ignores), so every setting read is a registered one.
fn lookup(name: &str) -> Option<(String, Source)> {
    #[cfg(test)]
    if let Some(found) = tests::sources::lookup(name) {
        return found;
    }
    lookup_in(name, std::env::var(name).ok(), &CONF.read())
}

/// The value a not-built setting ([`not_built::NOT_BUILT`]) is set to, to report it ignored.
fn lookup_raw(name: &str) -> Option<String> {
    debug_assert!(not_built::NOT_BUILT.contains(&name));
    lookup(name).map(|(v, _)| v)
}

/// [`lookup`] over a given environment value and configuration map. An empty value counts
/// as unset, as in NVIDIA's library.
fn lookup_in(
    name: &str,
    env: Option<String>,
    conf: &HashMap<String, String>,
) -> Option<(String, Source)> {
    match env {
        Some(v) if !v.is_empty() => Some((v, Source::EnvVar)),
        _ => conf
            .get(name)
            .filter(|v| !v.is_empty())
            .map(|v| (v.clone(), Source::ConfigFile)),
    }
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
pub(crate) mod tests;
