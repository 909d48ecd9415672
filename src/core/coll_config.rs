//! `ncclCollConfig_t`, the per-call configuration of the `ncclXConfig` collectives: read by
//! the caller's `size` (an append-only struct: a caller built against 2.31's header passes
//! 64 bytes, without `launchCompletionEvent`), checked as NVIDIA's library checks it, and
//! turned into the task's options (`sched::TaskOptions`) and the event to record once the
//! call's kernel has been launched.
//!
//! What each field does here:
//! - `minCTAs` / `maxCTAs`: the channels (CTAs) of this call, within 1..= the communicator's
//!   `maxCTAs`; the planner raises its choice to the first and never uses more than the second.
//!   As NVIDIA's, a bound outside that range is ignored and a minimum above the maximum
//!   becomes 1, each with an INFO line; neither is an error.
//! - `algSelection` / `forceAlgSelection`: `sched::options::select`; an unsatisfiable
//!   selection is `ncclInvalidArgument` when forced, else the automatic choice.
//! - `CTAPolicy`: checked (unset or 0..=3) and otherwise as the communicator's policy is
//!   here: no effect, since this library has neither zero-CTA (copy engine) collectives nor a
//!   separate CTA-saving mode.
//! - `cgaClusterSize`: checked (unset or 0..=8) and ignored, as the communicator's is: the
//!   kernels are launched without thread-block clusters.
//! - `nvlsCTAs`: ignored (there is no NVLS here); `userProfilerTag`: ignored (no effect on
//!   execution); `ext`: every vendor option ignored, as NVIDIA's library does, the list
//!   walked only to log it, at most `MAX_EXT_OPTIONS` entries (a cycle ends there).
//! - `launchCompletionEvent`: recorded on the call's stream right after the launch of its
//!   group on this communicator (`group`).

use super::CommConfig;
use crate::abi::{ncclCollConfig_t, ncclConfigExt_t, NCCL_API_MAGIC, NCCL_CONFIG_UNDEF_INT};
use crate::error::{Error, Result};
use crate::sched::options::{self, Selection};
use crate::sched::{CollKind, TaskOptions};
use std::ffi::CStr;

/// Bytes of the first released `ncclCollConfig_t` (2.31: everything up to
/// `userProfilerTag`); NVIDIA's library refuses a smaller one.
pub const MIN_SIZE: usize = 64;
/// Most vendor options walked in `ext` (a longer list, or a cycle, is cut there).
pub const MAX_EXT_OPTIONS: usize = 1024;

/// What a call's configuration asks of its launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallConfig {
    pub opts: TaskOptions,
    /// The caller's `cudaEvent_t` to record after the launch; 0: none.
    pub launch_event: usize,
}

/// Read a caller's `ncclCollConfig_t` (NULL: None) and check what needs no communicator:
/// its size, magic, `forceAlgSelection` and `CTAPolicy`, in NVIDIA's order. Fields past the
/// caller's size keep `NCCL_COLLCONFIG_INITIALIZER`'s values.
///
/// # Safety
/// `cfg` is NULL or points to at least `size` readable bytes, where `size` is its first field.
pub unsafe fn read(cfg: *const ncclCollConfig_t) -> Result<Option<ncclCollConfig_t>> {
    if cfg.is_null() {
        return Ok(None);
    }
    // SAFETY: cfg is non-NULL and the caller's config (the function's contract).
    let (header, out) = unsafe { crate::abi::read_versioned(cfg, ncclCollConfig_t::default()) };
    let (size, magic) = (header.size, header.magic);
    if !(MIN_SIZE..=1 << 16).contains(&size) {
        return Err(Error::invalid_argument(format!(
            "config size {size} is not a valid ncclCollConfig_t size (at least {MIN_SIZE}): \
             initialise the config with NCCL_COLLCONFIG_INITIALIZER"
        )));
    }
    if magic != NCCL_API_MAGIC {
        return Err(Error::invalid_argument(format!(
            "config magic {magic:#x} is not NCCL_API_MAGIC (0xcafebeef): initialise the config \
             with NCCL_COLLCONFIG_INITIALIZER"
        )));
    }
    if !(0..=1).contains(&out.forceAlgSelection) {
        return Err(Error::invalid_argument(format!(
            "config.forceAlgSelection = {} must be 0 or 1",
            out.forceAlgSelection
        )));
    }
    check_range("CTAPolicy", out.CTAPolicy, 0, 0x03)?;
    Ok(Some(out))
}

/// `v` unless unset, checked to lie in `lo..=hi`.
fn check_range(name: &str, v: i32, lo: i32, hi: i32) -> Result<Option<i32>> {
    if v == NCCL_CONFIG_UNDEF_INT {
        return Ok(None);
    }
    if v < lo || v > hi {
        return Err(Error::invalid_argument(format!(
            "config.{name} = {v} is out of range (valid: {lo}..={hi})"
        )));
    }
    Ok(Some(v))
}

/// A call's CTA bound `v` unless unset or outside `1..=max` (the communicator's bound): as
/// NVIDIA's, such a bound is ignored with a line saying so, not refused.
fn within_bounds(name: &str, v: i32, max: i32) -> Option<i32> {
    if v == NCCL_CONFIG_UNDEF_INT {
        return None;
    }
    if !(1..=max).contains(&v) {
        crate::info!(
            TUNING,
            "Config {name}={v} is ignored because value out of bound min/max=[1, {max}]"
        );
        return None;
    }
    Some(v)
}

/// The options of a call of `kind` with the configuration `u` on a communicator configured
/// as `comm`: its CTA bounds checked against the communicator's, its selection read.
pub fn resolve(u: &ncclCollConfig_t, comm: &CommConfig, kind: CollKind) -> Result<CallConfig> {
    let max = comm.max_ctas;
    let max_ctas = within_bounds("maxCTAs", u.maxCTAs, max);
    let mut min_ctas = within_bounds("minCTAs", u.minCTAs, max);
    if let (Some(lo), Some(hi)) = (min_ctas, max_ctas) {
        if lo > hi {
            crate::info!(
                TUNING,
                "Task minCTAs({lo}) is larger than maxCTAs({hi}), reset task minCTAs to 1"
            );
            min_ctas = Some(1);
        }
    }
    check_range("cgaClusterSize", u.cgaClusterSize, 0, 8)?;
    log_ext_options(u.ext);
    let selection = selection_of(u, kind)?;
    Ok(CallConfig {
        opts: TaskOptions {
            min_ctas: min_ctas.unwrap_or(0) as u32,
            max_ctas: max_ctas.unwrap_or(0) as u32,
            algorithms: options::algorithms_of(&selection),
        },
        launch_event: u.launchCompletionEvent as usize,
    })
}

/// What `algSelection` means for a `kind` call: an unsatisfiable selection is an error when
/// `forceAlgSelection` is set, else the automatic choice.
fn selection_of(u: &ncclCollConfig_t, kind: CollKind) -> Result<Selection> {
    if u.algSelection.is_null() {
        return Ok(Selection::Automatic);
    }
    // SAFETY: a non-NULL algSelection is a NUL-terminated string (NCCL's contract).
    let spec = unsafe { CStr::from_ptr(u.algSelection) }.to_string_lossy();
    match options::select(&spec, kind) {
        Selection::Unsatisfiable(why) => {
            let can = options::algo_name(options::algorithm_of(kind));
            let msg = format!(
                "algSelection \"{spec}\" names no algorithm this library can run for {} ({why}); \
                 {} can use: {can}",
                kind.name(),
                kind.name()
            );
            if u.forceAlgSelection != 0 {
                return Err(Error::invalid_argument(msg));
            }
            crate::info!(TUNING, "{msg}; forceAlgSelection is 0: automatic selection");
            Ok(Selection::Automatic)
        }
        chosen => Ok(chosen),
    }
}

/// Log the vendor options of `ext` (all ignored), walking at most `MAX_EXT_OPTIONS`.
fn log_ext_options(ext: *mut ncclConfigExt_t) {
    let n = count_ext(ext);
    if n > 0 {
        crate::info!(
            TUNING,
            "ignoring {n}{} vendor option(s) of the collective config",
            if n >= MAX_EXT_OPTIONS { " or more" } else { "" }
        );
    }
}

/// Entries of the `ext` list, counting at most `MAX_EXT_OPTIONS` (so a cycle ends).
fn count_ext(mut p: *mut ncclConfigExt_t) -> usize {
    let mut n = 0;
    while !p.is_null() && n < MAX_EXT_OPTIONS {
        n += 1;
        // SAFETY: a non-NULL entry of the list is a live ncclConfigExt_t (NCCL's contract).
        p = unsafe { std::ptr::addr_of!((*p).next).read_unaligned() };
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{ncclConfigExtKey, ncclConfigExtVal, ncclResult_t};
    use std::ffi::CString;

    fn comm(max_ctas: i32) -> CommConfig {
        CommConfig {
            max_ctas,
            ..CommConfig::default()
        }
    }

    fn read_copy(cfg: &ncclCollConfig_t) -> Result<Option<ncclCollConfig_t>> {
        // SAFETY: `cfg` is a full-size live struct; a smaller declared size reads less.
        unsafe { read(cfg) }
    }

    fn is_invalid<T: std::fmt::Debug>(r: Result<T>) -> bool {
        matches!(r, Err(e) if e.code == ncclResult_t::ncclInvalidArgument)
    }

    #[test]
    fn null_is_the_plain_call() {
        // SAFETY: NULL is allowed.
        assert!(unsafe { read(std::ptr::null()) }.unwrap().is_none());
        let u = ncclCollConfig_t::default();
        let c = resolve(&u, &comm(64), CollKind::AllReduce).unwrap();
        assert_eq!(c, CallConfig::default());
    }

    #[test]
    fn an_older_callers_short_struct_is_read_by_size() {
        let event = 0x1234usize as crate::abi::cudaEvent_t;
        let cfg = ncclCollConfig_t {
            size: MIN_SIZE,
            maxCTAs: 2,
            launchCompletionEvent: event,
            ..Default::default()
        };
        let read = read_copy(&cfg).unwrap().unwrap();
        assert_eq!(read.maxCTAs, 2);
        // Past the caller's 64 bytes: the initializer's NULL, not what follows in memory.
        assert!(read.launchCompletionEvent.is_null());
        let full = read_copy(&ncclCollConfig_t {
            launchCompletionEvent: event,
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        let c = resolve(&full, &comm(64), CollKind::Broadcast).unwrap();
        assert_eq!(c.launch_event, 0x1234);
    }

    #[test]
    fn size_magic_and_flags_are_checked() {
        let bad = |cfg: ncclCollConfig_t| is_invalid(read_copy(&cfg));
        let d = ncclCollConfig_t::default;
        assert!(bad(ncclCollConfig_t { magic: 0, ..d() }));
        assert!(bad(ncclCollConfig_t { size: 8, ..d() }));
        assert!(bad(ncclCollConfig_t { size: 56, ..d() }));
        assert!(bad(ncclCollConfig_t {
            forceAlgSelection: 2,
            ..d()
        }));
        assert!(bad(ncclCollConfig_t {
            CTAPolicy: 4,
            ..d()
        }));
        assert!(bad(ncclCollConfig_t {
            CTAPolicy: -1,
            ..d()
        }));
        let e = read_copy(&ncclCollConfig_t { magic: 7, ..d() }).unwrap_err();
        assert!(e.msg.contains("_COLLCONFIG_INITIALIZER"), "{}", e.msg);
        assert!(!bad(ncclCollConfig_t {
            CTAPolicy: crate::abi::NCCL_CTA_POLICY_ZERO,
            forceAlgSelection: 0,
            size: 1024,
            ..d()
        }));
    }

    #[test]
    fn cta_bounds_are_checked_against_the_communicator() {
        let d = ncclCollConfig_t::default;
        let at = |u: ncclCollConfig_t, max| resolve(&u, &comm(max), CollKind::AllGather);
        let bounds = |u: ncclCollConfig_t, max| {
            let c = at(u, max).unwrap();
            (c.opts.min_ctas, c.opts.max_ctas)
        };
        // Out of 1..=the communicator's maximum: ignored (0 = no bound), as NVIDIA's.
        assert_eq!(bounds(ncclCollConfig_t { maxCTAs: 0, ..d() }, 64), (0, 0));
        assert_eq!(bounds(ncclCollConfig_t { minCTAs: 0, ..d() }, 64), (0, 0));
        assert_eq!(
            bounds(
                ncclCollConfig_t {
                    maxCTAs: 1000,
                    ..d()
                },
                64
            ),
            (0, 0)
        );
        assert_eq!(bounds(ncclCollConfig_t { maxCTAs: 9, ..d() }, 8), (0, 0));
        // A minimum above the maximum falls back to 1.
        let crossed = ncclCollConfig_t {
            minCTAs: 5,
            maxCTAs: 4,
            ..d()
        };
        assert_eq!(bounds(crossed, 64), (1, 4));
        assert!(is_invalid(at(
            ncclCollConfig_t {
                cgaClusterSize: 9,
                ..d()
            },
            64
        )));
        let c = at(
            ncclCollConfig_t {
                minCTAs: 4,
                maxCTAs: 4,
                nvlsCTAs: 1000,
                cgaClusterSize: 2,
                userProfilerTag: 99,
                ..d()
            },
            8,
        )
        .unwrap();
        assert_eq!((c.opts.min_ctas, c.opts.max_ctas), (4, 4));
        assert!(c.opts.algorithms.one_shot);
    }

    #[test]
    fn selections_forced_or_not() {
        let ring = CString::new("ring").unwrap();
        let tree = CString::new("tree").unwrap();
        let with = |s: &CString, force| ncclCollConfig_t {
            algSelection: s.as_ptr(),
            forceAlgSelection: force,
            ..Default::default()
        };
        let c = resolve(&with(&ring, 1), &comm(64), CollKind::AllReduce).unwrap();
        assert!(!c.opts.algorithms.one_shot);
        let e = resolve(&with(&tree, 1), &comm(64), CollKind::AllReduce).unwrap_err();
        assert_eq!(e.code, ncclResult_t::ncclInvalidArgument);
        assert!(
            e.msg.contains("\"tree\"") && e.msg.contains("ring"),
            "{}",
            e.msg
        );
        let c = resolve(&with(&tree, 0), &comm(64), CollKind::AllReduce).unwrap();
        assert_eq!(c.opts, TaskOptions::default());
        assert!(resolve(&with(&ring, 1), &comm(64), CollKind::AlltoAll).is_err());
    }

    #[test]
    fn ext_lists_are_walked_boundedly() {
        let node = |next| ncclConfigExt_t {
            next,
            key: ncclConfigExtKey {
                vendorId: 1,
                optionId: 2,
            },
            val: ncclConfigExtVal { i: 3 },
        };
        assert_eq!(count_ext(std::ptr::null_mut()), 0);
        let mut last = node(std::ptr::null_mut());
        let mut first = node(&mut last);
        assert_eq!(count_ext(&mut first), 2);
        // A cycle: cut at the bound, and the call still resolves.
        let mut a = node(std::ptr::null_mut());
        let mut b = node(&mut a);
        a.next = &mut b;
        assert_eq!(count_ext(&mut a), MAX_EXT_OPTIONS);
        let u = ncclCollConfig_t {
            ext: &mut a,
            ..Default::default()
        };
        assert!(resolve(&u, &comm(64), CollKind::Reduce).is_ok());
    }
}
