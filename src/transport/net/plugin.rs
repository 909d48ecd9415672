//! NCCL net plugins: finding, opening and initialising the plugin `NCCL_NET_PLUGIN` names, as
//! NVIDIA's 2.28.9 does, behind the [`Net`] trait through [`adapter::PluginNet`], for the
//! plugin ABI versions 8 to 11 (`ncclNetPlugin_v11` .. `_v8`).
//!
//! Which library: `NCCL_NET_PLUGIN` unset tries `libnccl-net.so`; `none` loads nothing;
//! otherwise it is a comma list, each entry tried in turn until one loads and initialises:
//! the entry as given (a file name `dlopen` searches for, or a path), then, for a bare name,
//! `libnccl-net-<name>.so`. A library that cannot be opened, has no table oxccl supports,
//! fails its `init`, has no device or offloads to the device is passed over with NVIDIA's INFO
//! lines, and the caller falls back to the internal network, as NVIDIA's does.
//!
//! oxccl opens and initialises a plugin once per process (as NVIDIA's compatibility layer does
//! for v8-v10 plugins; a v11 plugin's first `init` gets communicator id 0 and the default
//! comm config, and that context serves the loader's checks). Each communicator then asks
//! for its own ([`Net::for_comm`]): a v11 plugin gets another `init` with the communicator's
//! hash and traffic class, finalized when the communicator's last user of it goes, as
//! NVIDIA's 2.28.9 calls it per communicator. Selecting a network by name (`NCCL_NET`,
//! `ncclConfig_t.netName`, against [`Net::name`]) is the caller's.
//!
//! Submodules: [`abi`] the C types, [`adapter`] the `Net` implementation; the loader calls,
//! the library names tried and the log function a plugin gets are `crate::plugin`'s.

mod abi;
mod adapter;
#[cfg(test)]
pub(crate) mod tests;

use crate::error::Result;
use crate::plugin::{dl, Kind};
use crate::transport::net::api::Net;
use adapter::PluginNet;
use std::ffi::CString;
use std::os::raw::{c_char, c_void};
use std::sync::Arc;

/// The plugin ABI versions oxccl supports, in the order they are looked for.
const VERSIONS: [u32; 4] = [11, 10, 9, 8];
/// Versions NVIDIA 2.28.9 still loads and oxccl does not.
const OLD_VERSIONS: [u32; 2] = [7, 6];
/// NVIDIA's limit on one `NCCL_NET_PLUGIN` entry (its `MAX_STR_LEN`, less the NUL).
const MAX_ENTRY_CHARS: usize = 254;
/// NVIDIA's limit on the entries of the list (16 networks, less its two internal ones).
const MAX_ENTRIES: usize = 14;

/// The net plugin the environment names, opened and initialised; None when none is
/// configured (`NCCL_NET_PLUGIN=none`), found or usable, and the caller uses the internal
/// network. Failures are logged as NVIDIA logs them and are not errors (NVIDIA falls back
/// too); `Err` is for the caller's sake, should a plugin it was told to use become required.
pub fn load() -> Result<Option<Arc<dyn Net>>> {
    let setting = crate::env::registry::NET_PLUGIN.get();
    if let Some(v) = &setting {
        crate::info!(ENV | NET, "NCCL_NET_PLUGIN set by environment to {v}");
    }
    Ok(load_from(setting.as_deref(), &VERSIONS).map(|p| p as Arc<dyn Net>))
}

/// The plugin in the library at `path` (a path, or a name `dlopen` searches for), as one
/// `NCCL_NET_PLUGIN` entry; for tests and tools that name the library themselves.
pub fn open_path(path: &str) -> Option<Arc<dyn Net>> {
    open_entry(path, &VERSIONS).map(|p| p as Arc<dyn Net>)
}

/// The first library of a `NCCL_NET_PLUGIN` value that loads and initialises, looking for
/// the table `versions` in order.
fn load_from(setting: Option<&str>, versions: &[u32]) -> Option<Arc<PluginNet>> {
    entries(setting)
        .iter()
        .find_map(|entry| open_entry(entry, versions))
}

/// The libraries a `NCCL_NET_PLUGIN` value lists, in order, each standing for the file
/// names of `crate::plugin::candidates`. NVIDIA's limits apply (14 entries of 254 characters).
fn entries(setting: Option<&str>) -> Vec<String> {
    let Some(value) = setting else {
        return vec![Kind::Net.default_library()];
    };
    if value.eq_ignore_ascii_case("none") {
        return Vec::new();
    }
    let mut out = Vec::new();
    for entry in value.split(',').filter(|e| !e.is_empty()) {
        if out.len() == MAX_ENTRIES {
            crate::info!(
                NET | ENV,
                "NCCL_NET_PLUGIN list contains more than {} plugins, ignoring the rest",
                MAX_ENTRIES - 1
            );
            break;
        }
        if entry.len() > MAX_ENTRY_CHARS {
            crate::info!(
                NET | ENV,
                "NCCL_NET_PLUGIN list contains a plugin name {entry} longer than {} \
                 characters, ignoring it.",
                MAX_ENTRY_CHARS + 1
            );
            continue;
        }
        out.push(entry.to_string());
    }
    out
}

/// Open the library of one entry, find its table and initialise the plugin.
fn open_entry(entry: &str, versions: &[u32]) -> Option<Arc<PluginNet>> {
    let (lib, name) = crate::plugin::open_library(Kind::Net, entry)?;
    let (table, version) = find_table(&lib, &name, versions)?;
    let path = dl::file_of(table as usize).unwrap_or(name);
    crate::info!(
        INIT | NET,
        "Successfully loaded external network plugin {path}"
    );
    crate::plugin::note_net_library(&path);
    // SAFETY: `table` is the `ncclNetPlugin_v<version>` symbol of `lib`, which the plugin
    // ABI says is an `ncclNet_v<version>_t`.
    unsafe { PluginNet::open(lib, table, version) }.map(Arc::new)
}

/// The first of `versions` whose `ncclNetPlugin_v<N>` table the library exports, with N.
/// A library with only an older table, or none, is named in an INFO line.
fn find_table(lib: &dl::Library, name: &str, versions: &[u32]) -> Option<(*const c_void, u32)> {
    for &v in versions {
        if let Some(table) = lib.symbol(&table_symbol(v)) {
            let plugin = table_name(table);
            crate::info!(INIT | NET, "NET/Plugin: Loaded net plugin {plugin} (v{v})");
            return Some((table, v));
        }
    }
    let old = OLD_VERSIONS
        .iter()
        .find_map(|&v| Some((lib.symbol(&table_symbol(v))?, v)));
    match old {
        Some((table, v)) => crate::info!(
            INIT | NET,
            "External network plugin {} ({}) implements ncclNetPlugin_v{v} only, too old for \
             oxccl (v8 to v11); not using it",
            dl::file_of(table as usize).unwrap_or_else(|| name.to_string()),
            table_name(table)
        ),
        None => crate::info!(INIT | NET, "External network plugin {name} is unsupported"),
    }
    None
}

/// `ncclNetPlugin_v<version>`.
fn table_symbol(version: u32) -> CString {
    CString::new(format!("ncclNetPlugin_v{version}")).expect("a symbol name has no NUL")
}

/// The `name` every table version starts with.
fn table_name(table: *const c_void) -> String {
    // SAFETY: every ncclNet_vN_t begins with `const char* name`, and table points at one.
    let name = unsafe { *(table as *const *const c_char) };
    adapter::c_string(name)
}
