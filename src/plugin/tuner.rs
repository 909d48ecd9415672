//! NVIDIA's tuner plugins: the library `NCCL_TUNER_PLUGIN` names (unset: `libnccl-tuner.so`;
//! `none`: no tuner; a library that is not found: the net plugin's, which may carry one),
//! its newest table of `ncclTunerPlugin_v6` .. `_v2`, one context per communicator (`init`
//! with the communicator's hash, ranks and nodes; `finalize`/`destroy` when it goes), and
//! each context asked about ring collectives through `sched::tune::Tuner`.
//!
//! The library is opened once per process and stays loaded. Differences from NVIDIA's: the
//! v5/v6 tuning constants a plugin gets are zeros and what it writes there is not read (oxccl's
//! cost model is its own), v6's `getChunkSize` is never called, and a plan is asked once per
//! shape of call (plans are cached), where NVIDIA asks on every call.

use super::logger::{self, ncclDebugLogger_t};
use super::{dl, info, Kind};
use crate::abi::ncclResult_t;
use crate::error::{Error, Result};
use crate::sched::tune::{CostTable, Query, Tuner, NUM_ALGORITHMS, NUM_PROTOCOLS};
use parking_lot::Mutex;
use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::{Arc, OnceLock};

/// The table versions looked for, newest first.
const VERSIONS: [u32; 5] = [6, 5, 4, 3, 2];

type InitV2 = unsafe extern "C" fn(usize, usize, ncclDebugLogger_t, *mut *mut c_void) -> c_int;
type InitV5 = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    usize,
    usize,
    ncclDebugLogger_t,
    *mut NvlDomainInfo,
    *mut Constants,
) -> c_int;
type CollInfoV2 = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    usize,
    c_int,
    c_int,
    c_int,
    *mut c_int,
    *mut c_int,
    *mut c_int,
) -> c_int;
type CollInfoV3 = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    usize,
    c_int,
    *mut *mut f32,
    c_int,
    c_int,
    *mut c_int,
) -> c_int;
type CollInfoV4 = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    usize,
    c_int,
    *mut *mut f32,
    c_int,
    c_int,
    c_int,
    *mut c_int,
) -> c_int;
type Finalize = unsafe extern "C" fn(*mut c_void) -> c_int;
/// A member not called through this view of the table (pointer-sized, as every member).
type Unused = unsafe extern "C" fn();

/// The leading members every version's table shares the shape of: `name`, `init`,
/// `getCollInfo`, `destroy`/`finalize` (v6 adds `getChunkSize` after them, unused here).
#[repr(C)]
struct Table<I, C> {
    name: *const c_char,
    init: Option<I>,
    get_coll_info: Option<C>,
    finalize: Option<Finalize>,
}

/// `ncclNvlDomainInfo_v5_t`.
#[repr(C)]
#[derive(Default)]
struct NvlDomainInfo {
    n_nvl_domains: c_int,
    min_ranks_per_nvl_domain: c_int,
    max_ranks_per_nvl_domain: c_int,
}

/// `ncclTunerConstants_v5_t` (7 algorithms, 3 protocols, 3 link kinds, 4 compute
/// capabilities, 3 tuning scales).
#[repr(C)]
struct Constants {
    base_latencies: [[f64; 3]; 7],
    hw_latencies: [[[f64; 3]; 7]; 3],
    ll_max_bws: [[f64; 3]; 4],
    per_ch_max_ring_ll128_bws: [[f64; 3]; 4],
    per_ch_max_tree_ll128_bws: [[f64; 3]; 4],
    per_ch_max_tree_bws: [[f64; 3]; 4],
    per_ch_max_nvls_tree_bws: [[f64; 3]; 4],
}

/// A tuner library, opened once per process.
pub struct TunerPlugin {
    _lib: dl::Library,
    /// The `ncclTunerPlugin_v<version>` table, static data of the library.
    table: usize,
    version: u32,
    pub name: String,
}

// SAFETY: the table is read-only data of a library that stays loaded while this lives; the
// plugin's functions are called with a context under its own lock (`TunerContext`).
unsafe impl Send for TunerPlugin {}
// SAFETY: as above.
unsafe impl Sync for TunerPlugin {}

/// The process's tuner plugin, loaded at the first call; None when none is configured,
/// found or usable (NVIDIA's INFO lines say why; no error, as NVIDIA's goes on without one).
pub fn load() -> Option<Arc<TunerPlugin>> {
    static PLUGIN: OnceLock<Option<Arc<TunerPlugin>>> = OnceLock::new();
    PLUGIN
        .get_or_init(|| open(crate::env::registry::TUNER_PLUGIN.get().as_deref()))
        .clone()
}

/// The tuner of a `NCCL_TUNER_PLUGIN` value.
fn open(setting: Option<&str>) -> Option<Arc<TunerPlugin>> {
    if let Some(v) = setting {
        info(
            Kind::Tuner,
            format_args!("NCCL_TUNER_PLUGIN set by environment to {v}"),
        );
        if v.eq_ignore_ascii_case("none") {
            return None;
        }
    }
    let entry = setting.map_or_else(|| Kind::Tuner.default_library(), str::to_string);
    let (lib, named) = match super::open_library(Kind::Tuner, &entry) {
        Some((lib, name)) => (lib, Some(name)),
        None => (dl::Library::open(Some(&super::net_library()?)).ok()?, None),
    };
    let Some((table, version)) = find_table(&lib) else {
        if let Some(name) = &named {
            info(
                Kind::Tuner,
                format_args!("External tuner plugin {name} is unsupported"),
            );
        }
        return None;
    };
    if let Some(name) = named {
        let path = dl::file_of(table).unwrap_or(name);
        info(
            Kind::Tuner,
            format_args!("Successfully loaded external tuner plugin {path}"),
        );
    }
    // SAFETY: every table version starts with `const char* name`.
    let name = unsafe { c_text(*(table as *const *const c_char)) };
    Some(Arc::new(TunerPlugin {
        _lib: lib,
        table,
        version,
        name,
    }))
}

/// The newest tuner table `lib` exports, and its version, with NVIDIA's INFO line.
fn find_table(lib: &dl::Library) -> Option<(usize, u32)> {
    VERSIONS.iter().find_map(|&v| {
        let symbol = CString::new(format!("ncclTunerPlugin_v{v}")).expect("no NUL");
        let table = lib.symbol(&symbol)? as usize;
        // SAFETY: every table version starts with `const char* name`.
        let name = unsafe { c_text(*(table as *const *const c_char)) };
        info(
            Kind::Tuner,
            format_args!("TUNER/Plugin: Using {name} (v{v})"),
        );
        Some((table, v))
    })
}

/// A C string of the plugin's, or "" for NULL.
///
/// # Safety
/// `p` is NULL or NUL-terminated and valid for the call.
unsafe fn c_text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the caller's promise.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// The error of a plugin call that returned `rc`.
fn failed(plugin: &TunerPlugin, call: &str, rc: c_int) -> Error {
    let code = ncclResult_t::from_raw(rc)
        .filter(|&c| c != ncclResult_t::ncclSuccess)
        .unwrap_or(ncclResult_t::ncclInternalError);
    Error::new(
        code,
        format!("TUNER/Plugin: {} {call} returned {rc}", plugin.name),
    )
}

impl TunerPlugin {
    /// A context of this tuner for a communicator (`init`).
    pub fn init(
        self: &Arc<Self>,
        comm_id: u64,
        nranks: usize,
        nnodes: usize,
    ) -> Result<TunerContext> {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        let log = logger::logger();
        let rc = if self.version >= 5 {
            let table = self.table as *const Table<InitV5, CollInfoV4>;
            // SAFETY: a v5/v6 table (found under that symbol); the out-pointers live for the
            // call, as do the zeroed domain info and constants.
            unsafe {
                let Some(init) = (*table).init else {
                    return Err(Error::internal(format!(
                        "TUNER/Plugin: {} has no init",
                        self.name
                    )));
                };
                let mut domains = NvlDomainInfo::default();
                let mut constants: Box<Constants> = Box::new(std::mem::zeroed());
                init(
                    &mut ctx,
                    comm_id,
                    nranks,
                    nnodes,
                    log,
                    &mut domains,
                    &mut *constants,
                )
            }
        } else {
            let table = self.table as *const Table<InitV2, Unused>;
            // SAFETY: a v2..v4 table, whose `init` has the v2 shape; ctx outlives the call.
            unsafe {
                let Some(init) = (*table).init else {
                    return Err(Error::internal(format!(
                        "TUNER/Plugin: {} has no init",
                        self.name
                    )));
                };
                init(nranks, nnodes, log, &mut ctx)
            }
        };
        if rc != 0 {
            return Err(failed(self, "init", rc));
        }
        Ok(TunerContext {
            plugin: self.clone(),
            ctx: Mutex::new(ctx as usize),
        })
    }
}

/// One communicator's context of the tuner; finalized when dropped.
pub struct TunerContext {
    plugin: Arc<TunerPlugin>,
    /// The plugin's context pointer; the lock keeps calls on it one at a time.
    ctx: Mutex<usize>,
}

impl std::fmt::Debug for TunerContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TunerContext({} v{})",
            self.plugin.name, self.plugin.version
        )
    }
}

impl Tuner for TunerContext {
    fn tune(&self, query: &Query, table: &mut CostTable) -> Result<u32> {
        let ctx = self.ctx.lock();
        let ctx = *ctx as *mut c_void;
        let plugin = &*self.plugin;
        let func = query.func as c_int;
        let bytes = query.bytes as usize;
        let rows = table.0.as_mut_ptr() as *mut *mut f32;
        let (algos, protos) = (NUM_ALGORITHMS as c_int, NUM_PROTOCOLS as c_int);
        let mut nch: c_int = 0;
        let rc = match plugin.version {
            2 => {
                let t = plugin.table as *const Table<Unused, CollInfoV2>;
                let (mut algo, mut proto): (c_int, c_int) = (-1, -1);
                // SAFETY: a v2 table; the out-pointers live for the call.
                let rc = unsafe {
                    match (*t).get_coll_info {
                        Some(f) => f(ctx, func, bytes, 0, 0, 1, &mut algo, &mut proto, &mut nch),
                        None => 0,
                    }
                };
                let cell = usize::try_from(algo)
                    .ok()
                    .zip(usize::try_from(proto).ok())
                    .filter(|&(a, p)| a < NUM_ALGORITHMS && p < NUM_PROTOCOLS);
                if let Some((a, p)) = cell {
                    if table.0[a][p] >= 0.0 {
                        table.0[a][p] = 0.0;
                    }
                }
                rc
            }
            3 => {
                let t = plugin.table as *const Table<Unused, CollInfoV3>;
                // SAFETY: a v3 table; the table is NUM_ALGORITHMS x NUM_PROTOCOLS floats, as
                // the call says, and lives for the call, as does nch.
                unsafe {
                    match (*t).get_coll_info {
                        Some(f) => f(ctx, func, bytes, 1, rows, algos, protos, &mut nch),
                        None => 0,
                    }
                }
            }
            _ => {
                let t = plugin.table as *const Table<Unused, CollInfoV4>;
                // SAFETY: a v4..v6 table (the same getCollInfo); as for v3, with regBuff 0.
                unsafe {
                    match (*t).get_coll_info {
                        Some(f) => f(ctx, func, bytes, 1, rows, algos, protos, 0, &mut nch),
                        None => 0,
                    }
                }
            }
        };
        if rc != 0 {
            return Err(failed(plugin, "getCollInfo", rc));
        }
        Ok(u32::try_from(nch).unwrap_or(0))
    }
}

impl Drop for TunerContext {
    fn drop(&mut self) {
        let ctx = *self.ctx.get_mut() as *mut c_void;
        let t = self.plugin.table as *const Table<Unused, Unused>;
        // SAFETY: every version's fourth member is `destroy`/`finalize(void*)`; ctx is the
        // context `init` gave, finalized once, here.
        let rc = unsafe { (*t).finalize.map_or(0, |f| f(ctx)) };
        if rc != 0 {
            crate::warn!("TUNER/Plugin: {} finalize returned {rc}", self.plugin.name);
        }
    }
}
