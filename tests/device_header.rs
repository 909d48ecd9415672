//! Keeps `kernels/ox_abi.h` in step with the Rust device ABI: generates the header with
//! cbindgen (configured by `kernels/cbindgen.toml`) from `src/sched/device/kernel_abi.rs` and
//! fails when the committed file differs. Regenerate with
//! `OXCCL_BLESS=1 cargo test --test device_header`.

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The header exactly as cbindgen generates it from the sources today.
fn generate_header(root: &Path) -> String {
    let config = cbindgen::Config::from_file(root.join("kernels").join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("cannot read kernels/cbindgen.toml: {e}"));
    let source = root
        .join("src")
        .join("sched")
        .join("device")
        .join("kernel_abi.rs");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(source)
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen failed to generate ox_abi.h: {e}"));
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("cbindgen wrote non-UTF-8 output")
}

/// First line where two texts differ, with a little context, for the failure message.
fn first_difference(expected: &str, actual: &str) -> String {
    let (e, a): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    let line = (0..e.len().max(a.len()))
        .find(|&i| e.get(i) != a.get(i))
        .unwrap_or(0);
    let show = |v: &[&str]| -> String {
        let end = (line + 3).min(v.len());
        let start = line.saturating_sub(2).min(end);
        v[start..end]
            .iter()
            .enumerate()
            .map(|(k, l)| format!("  {:5} | {l}\n", start + k + 1))
            .collect()
    };
    format!(
        "first difference at line {}:\n committed kernels/ox_abi.h:\n{} generated:\n{}",
        line + 1,
        show(&a),
        show(&e)
    )
}

#[test]
fn committed_device_header_matches_generated() {
    let root = repo_root();
    let generated = generate_header(&root);
    let path = root.join("kernels").join("ox_abi.h");
    if std::env::var_os("OXCCL_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let generated_path = root.join("target").join("ox_abi.h.generated");
        let _ = std::fs::write(&generated_path, &generated);
        panic!(
            "kernels/ox_abi.h is out of date with src/sched/device/kernel_abi.rs.\n{}\n\
             Full generated header: {}\n\
             See the changes with: diff -u kernels/ox_abi.h {}\n\
             Regenerate it with:   OXCCL_BLESS=1 cargo test --test device_header",
            first_difference(&generated, &committed),
            generated_path.display(),
            generated_path.display()
        );
    }
}

#[test]
fn device_header_uses_the_kernels_names() {
    let header = generate_header(&repo_root());
    for needed in [
        "struct OxConn {",
        "struct OxWork {",
        "struct OxInline {",
        "enum OxKind",
        "OX_KIND_COPY = 0,",
        "OX_KIND_DIRECT_PEER = 9,",
        "#define OX_KIND_COUNT 10",
        "#define OX_FLAG_LL 4",
        "#define OX_LL_REGION_DIV 8",
        "#define OX_INLINE_ITEMS 22",
        "struct OxWork items[OX_INLINE_ITEMS];",
        "#define OX_MAX_THREADS 512",
        "#define OX_SUM 0",
        "#define OX_PREMULSUM 5",
        "#define OX_FLOAT 7",
        "#define OX_NTYPES 12",
        "static_assert(sizeof(OxWork) == OX_WORK_SIZE",
    ] {
        assert!(header.contains(needed), "ox_abi.h lacks `{needed}`");
    }
    // Rust-only names must not leak into the kernels' header.
    for rust_only in ["WorkKind", "OX_OxConn", "simple_step_bytes"] {
        assert!(
            !header.contains(rust_only),
            "{rust_only} leaked into ox_abi.h"
        );
    }
}
