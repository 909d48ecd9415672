//! Tests of the settings: lookup order, configuration files, the registry's completeness
//! and the typed reads. [`sources`] lets a test give its own environment and configuration
//! file, on its thread only, so that tests never change the process environment.

use super::registry::{self, ALL};
use super::*;
use std::sync::atomic::Ordering;

/// Per-thread stand-ins for the environment and the configuration files.
pub(crate) mod sources {
    use super::super::{lookup_in, Source};
    use std::cell::RefCell;
    use std::collections::HashMap;

    type Maps = (HashMap<String, String>, HashMap<String, String>);

    thread_local! {
        static SOURCES: RefCell<Option<Maps>> = const { RefCell::new(None) };
    }

    /// The lookup of `name` in this thread's stand-ins, `None` when it has none.
    pub(crate) fn lookup(name: &str) -> Option<Option<(String, Source)>> {
        SOURCES.with(|s| {
            let s = s.borrow();
            let (env, conf) = s.as_ref()?;
            Some(lookup_in(name, env.get(name).cloned(), conf))
        })
    }

    /// Run `f` with `env` as this thread's environment and `conf` as its configuration file.
    pub(crate) fn with<R>(env: &[(&str, &str)], conf: &[(&str, &str)], f: impl FnOnce() -> R) -> R {
        let map = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        SOURCES.with(|s| *s.borrow_mut() = Some((map(env), map(conf))));
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                SOURCES.with(|s| *s.borrow_mut() = None);
            }
        }
        let _reset = Reset;
        f()
    }
}

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

#[test]
fn conf_parsing() {
    let kv = parse_conf("# comment\nNCCL_DEBUG=INFO\n\n  NCCL_BUFFSIZE = 3 \nbad line\n=nokey\n");
    assert_eq!(
        kv,
        vec![
            ("NCCL_DEBUG".to_string(), "INFO".to_string()),
            ("NCCL_BUFFSIZE".to_string(), "3".to_string())
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

#[test]
fn the_environment_comes_before_the_configuration_file() {
    let env = &[("NCCL_BUFFSIZE", "1048576")];
    let conf = &[("NCCL_BUFFSIZE", "2097152"), ("NCCL_NTHREADS", "256")];
    sources::with(env, conf, || {
        assert_eq!(registry::BUFFSIZE.int(), 1 << 20);
        assert_eq!(registry::BUFFSIZE.source(), Source::EnvVar);
        assert_eq!(registry::NTHREADS.int(), 256);
        assert_eq!(registry::NTHREADS.source(), Source::ConfigFile);
        assert_eq!(registry::CGA_CLUSTER_SIZE.int(), 0);
        assert_eq!(registry::CGA_CLUSTER_SIZE.source(), Source::Default);
    });
}

#[test]
fn an_empty_value_counts_as_unset() {
    sources::with(
        &[("NCCL_BUFFSIZE", "")],
        &[("NCCL_BUFFSIZE", "65536")],
        || {
            assert_eq!(registry::BUFFSIZE.int(), 65536, "the file's value");
        },
    );
    sources::with(&[("NCCL_NET", "")], &[], || {
        assert_eq!(registry::NET.get(), None);
        assert_eq!(registry::NET.text_value(), param::UNSET);
    });
}

#[test]
fn integers_read_decimal_and_hex_and_fall_back_when_malformed() {
    sources::with(
        &[("NCCL_BUFFSIZE", "0x10000"), ("NCCL_NTHREADS", "many")],
        &[],
        || {
            assert_eq!(registry::BUFFSIZE.int(), 0x10000);
            assert_eq!(registry::NTHREADS.int(), 0, "the default");
            assert_eq!(registry::NTHREADS.int_or(7), 7, "the caller's default");
            assert_eq!(registry::NET_GDR_READ.int(), -2);
            assert_eq!(registry::NET_GDR_READ.value(), Value::Int(-2));
        },
    );
}

#[test]
fn booleans_are_integers_and_words_only_where_declared() {
    let env = &[
        ("NCCL_P2P_DISABLE", "1"),
        ("NCCL_SHM_DISABLE", "TRUE"),
        ("NCCL_COMM_BLOCKING", "0"),
        ("NCCL_PARAM_DUMP_ALL", "true"),
    ];
    sources::with(env, &[], || {
        assert!(registry::P2P_DISABLE.flag());
        assert!(
            !registry::SHM_DISABLE.flag(),
            "not an integer: the default, as before"
        );
        assert!(!registry::COMM_BLOCKING.flag());
        assert!(registry::DMABUF_ENABLE.flag(), "default true");
        assert!(registry::PARAM_DUMP_ALL.flag(), "takes NVIDIA's words");
        assert_eq!(registry::P2P_DISABLE.value(), Value::Bool(true));
        assert_eq!(registry::P2P_DISABLE.text_value(), "TRUE");
        assert_eq!(registry::COMM_BLOCKING.text_value(), "FALSE");
    });
}

#[test]
fn strings_have_their_default_or_none() {
    sources::with(&[("NCCL_SOCKET_IFNAME", "=lo")], &[], || {
        assert_eq!(registry::SOCKET_IFNAME.get().as_deref(), Some("=lo"));
        assert_eq!(registry::RAS_ADDR.string(), "localhost:28028");
        assert_eq!(registry::RAS_ADDR.source(), Source::Default);
        assert_eq!(registry::PROTO.string(), "");
        assert_eq!(registry::PROTO.value(), Value::Text(None));
    });
}

#[test]
fn an_enum_reads_as_its_choice() {
    sources::with(&[], &[], || {
        assert_eq!(registry::DEBUG.value(), Value::Choice(0));
        assert_eq!(registry::DEBUG.text_value(), param::UNSET);
    });
    sources::with(&[("NCCL_DEBUG", "info")], &[], || {
        assert_eq!(registry::DEBUG.value(), Value::Choice(3));
        assert_eq!(registry::DEBUG.text_value(), "INFO");
    });
    sources::with(&[("NCCL_DEBUG", "LOUD")], &[], || {
        assert_eq!(registry::DEBUG.value(), Value::Choice(0));
        assert_eq!(registry::DEBUG.text_value(), param::UNKNOWN);
    });
}

#[test]
fn a_list_reads_as_the_mask_the_logger_uses() {
    for list in ["INIT,ENV,BOOTSTRAP", "COLL,NET", "^INIT", "net,tuning"] {
        sources::with(&[("NCCL_DEBUG_SUBSYS", list)], &[], || {
            let Value::Mask(mask) = registry::DEBUG_SUBSYS.value() else {
                panic!("a list reads as a mask")
            };
            let logger = crate::debug::parse_subsys(Some(list));
            assert_eq!(mask as u32, logger, "{list}");
        });
    }
    sources::with(&[], &[], || {
        assert_eq!(registry::DEBUG_SUBSYS.text_value(), "INIT,ENV,BOOTSTRAP");
        let default = crate::debug::parse_subsys(None) as u64;
        assert_eq!(registry::DEBUG_SUBSYS.value(), Value::Mask(default));
    });
}

#[test]
fn the_registry_names_each_setting_once_with_a_description() {
    let mut names: Vec<&str> = ALL.iter().map(|p| p.name).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before, "a name registered twice");
    for p in ALL {
        assert!(
            p.name.starts_with("NCCL_") || p.name.starts_with("OXCCL_"),
            "{}",
            p.name
        );
        assert!(!p.description.is_empty(), "{} has no description", p.name);
        assert!(
            !(p.name.starts_with("OXCCL_") && p.documented),
            "{}: not NVIDIA's",
            p.name
        );
        assert!(registry::is_registered(p));
        assert!(std::ptr::eq(registry::find(p.name).unwrap(), *p));
    }
    assert!(registry::find("DEBUG").is_none(), "keys are full names");
}

#[test]
fn the_subsystem_choices_are_the_loggers() {
    let Kind::ListOf(choices) = registry::DEBUG_SUBSYS.kind else {
        panic!("NCCL_DEBUG_SUBSYS is a list")
    };
    let ours: Vec<&str> = choices.iter().map(|c| c.name).collect();
    let logger: Vec<&str> = crate::debug::subsys::NAMES
        .iter()
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(ours, logger);
}

/// Names of the form `NCCL_*`/`OXCCL_*` that appear in the sources but are not settings of
/// the library: markers between a test and the child process it starts, tools' knobs, and
/// the unknown key the parameter API's tests ask for.
const NOT_SETTINGS: &[&str] = &[
    "NCCL_NOPE",
    "OXCCL_BLESS_PLANS",
    "OXCCL_BOOTSTRAP_TEST_CHILD",
    "OXCCL_FUZZ_SEED",
    "OXCCL_NETBENCH_CHILD",
    "OXCCL_NET_TEST_CHILD",
    "OXCCL_TWO_HOSTS_CHILD",
    "OXCCL_TWO_HOSTS_CUT",
    "OXCCL_TWO_HOSTS_METER",
    "OXCCL_TWO_HOSTS_METER_QUOTAS",
    "OXCCL_TWO_HOSTS_WEIGHTS",
    "OXCCL_WATCHDOG_TEST_CHILD",
];

/// Every string literal in `text` that is exactly a setting-shaped name.
fn setting_literals(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (i, _) in text.match_indices('"') {
        let rest = &text[i + 1..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        let closed = rest[name.len()..].starts_with('"');
        let prefixed = ["NCCL_", "OXCCL_"]
            .iter()
            .any(|p| name.len() > p.len() && name.starts_with(p));
        if closed && prefixed {
            found.push(name);
        }
    }
    found
}

fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A setting read in code must be in the registry: the typed reads take only registry
/// entries (checked when read), and no name of a setting appears in the sources, as a whole
/// string literal, unless it is registered (or listed as NVIDIA's and not built).
#[test]
fn every_setting_named_in_the_sources_is_registered() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut missing = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for name in setting_literals(&text) {
            if registry::find(&name).is_none()
                && !NOT_SETTINGS.contains(&name.as_str())
                && !super::not_built::NOT_BUILT.contains(&name.as_str())
            {
                missing.push(format!("{}: {name}", file.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "settings not in src/env/registry.rs: {missing:#?}"
    );
    assert_eq!(
        setting_literals(&r#"x('NCCL_FOO', 1); 'NCCL_BAR is' 'OXCCL_Y'"#.replace('\'', "\""))
            .join(" "),
        "NCCL_FOO OXCCL_Y"
    );
}

// The check is a debug assertion: release builds read without it.
#[test]
#[cfg(debug_assertions)]
fn a_param_made_outside_the_registry_is_not_read() {
    static STRAY: Param = Param::integer(concat!("OXCCL", "_STRAY"), 1, "not registered");
    assert!(!registry::is_registered(&STRAY));
    let read = std::panic::catch_unwind(|| STRAY.int());
    assert!(
        read.is_err(),
        "reading an unregistered setting fails in debug builds"
    );
}

#[test]
fn defaults_match_the_constants_they_stand_for() {
    let sizes = crate::transport::sizes::SLOT_BYTES as i64 * crate::transport::sizes::NSLOTS as i64;
    assert_eq!(registry::BUFFSIZE.default, Default::Int(sizes));
    assert_eq!(registry::BUFFSIZE.default, Default::Int(4 << 20));
    assert_eq!(
        registry::MAX_NCHANNELS.default,
        Default::Int(crate::core::config::CommConfig::default().max_ctas as i64)
    );
    assert_eq!(
        registry::MIN_NCHANNELS.default,
        Default::Int(crate::core::config::CommConfig::default().min_ctas as i64)
    );
    // The registry is a leaf module: its defaults are literals, kept equal to the constants
    // of the modules that use them here.
    let channels = Default::Int(crate::core::config::MAX_CHANNELS as i64);
    assert_eq!(registry::MAX_NCHANNELS.default, channels);
    assert_eq!(registry::MAX_CTAS.default, channels);
    assert_eq!(
        registry::MAX_P2P_NCHANNELS.default,
        Default::Int(crate::sched::cost::P2P_MAX_CHANNELS as i64)
    );
    assert_eq!(
        registry::HANG_REPORT_S.default,
        Default::Int(crate::core::watchdog::DEFAULT_REPORT_S)
    );
    assert_eq!(
        registry::YIELD_SPIN_US.default,
        Default::Int(crate::core::yielding::DEFAULT_SPIN_US)
    );
}
