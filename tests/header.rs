//! Keeps both generated headers in step with the Rust definitions: `include/nccl.h` (the C
//! ABI, configured by `cbindgen.toml`) and `kernels/ox_abi.h` (the device ABI the kernels
//! read, configured by `kernels/cbindgen.toml` from `src/sched/device/kernel_abi.rs`). Each is
//! generated with cbindgen and the test fails when the committed file differs. Regenerate
//! both with `OXCCL_BLESS=1 cargo test --test header`.
//!
//! The sources write each entry point once, as `ncclX`; its profiling alias `pncclX` is an
//! assembler symbol (`export!` in src/api/mod.rs) that cbindgen cannot see, so the generator
//! adds each alias's prototype right after its function's, as NVIDIA's header has them.

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The header exactly as cbindgen generates it from the sources today.
fn generate_header(root: &Path) -> String {
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("cannot read cbindgen.toml: {e}"));
    // Only the C ABI's sources: the type definitions and the entry points (src/api/mod.rs
    // pulls in every file of src/api/). Constants elsewhere in the crate stay out.
    let mut bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src").join("abi.rs"))
        .with_src(root.join("src").join("api").join("mod.rs"))
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen failed to generate nccl.h: {e}"));
    add_profiling_aliases(&mut bindings);
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("cbindgen wrote non-UTF-8 output")
}

/// `kernels/ox_abi.h` exactly as cbindgen generates it from the device ABI today.
fn generate_device_header(root: &Path) -> String {
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

/// Follow every function `ncclX` with its alias `pncclX`: the same prototype under the other
/// name, and a deprecation note (if any) that names the alias.
fn add_profiling_aliases(bindings: &mut cbindgen::Bindings) {
    for f in std::mem::take(&mut bindings.functions) {
        let name = f.path.name().to_string();
        assert!(
            name.starts_with("nccl"),
            "{name} in nccl.h is not an ncclX function"
        );
        let alias_name = format!("p{name}");
        let mut alias = f.clone();
        alias.path = cbindgen::bindgen::ir::Path::new(alias_name.clone());
        if let Some(note) = &mut alias.annotations.deprecated {
            *note = note.replacen(&name, &alias_name, 1);
        }
        bindings.functions.push(f);
        bindings.functions.push(alias);
    }
}

/// First line where two texts differ, with a little context, for the failure message.
fn first_difference(expected: &str, actual: &str, committed_name: &str) -> String {
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
        "first difference at line {}:\n committed {committed_name}:\n{} generated:\n{}",
        line + 1,
        show(&a),
        show(&e)
    )
}

/// Compare the committed file `rel` with `generated` (or write it, with OXCCL_BLESS=1).
fn check_committed(rel: &str, generated: &str, sources: &str) {
    let root = repo_root();
    let path = root.join(rel);
    if std::env::var_os("OXCCL_BLESS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, generated)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let file = path.file_name().unwrap().to_string_lossy();
        let generated_path = root.join("target").join(format!("{file}.generated"));
        let _ = std::fs::write(&generated_path, generated);
        panic!(
            "{rel} is out of date with {sources}.\n{}\n\
             Full generated header: {}\n\
             See the changes with: diff -u {rel} {}\n\
             Regenerate it with:   OXCCL_BLESS=1 cargo test --test header",
            first_difference(generated, &committed, rel),
            generated_path.display(),
            generated_path.display()
        );
    }
}

#[test]
fn committed_header_matches_generated() {
    let generated = generate_header(&repo_root());
    check_committed("include/nccl.h", &generated, "the Rust sources");
}

#[test]
fn committed_device_header_matches_generated() {
    let generated = generate_device_header(&repo_root());
    check_committed(
        "kernels/ox_abi.h",
        &generated,
        "src/sched/device/kernel_abi.rs",
    );
}

#[test]
fn header_keeps_nvidia_names() {
    let header = generate_header(&repo_root());
    // The Raw* wrappers must render as the enums' C names, never leak into the header.
    for raw in ["RawResult", "RawDataType", "RawRedOp", "RawScalarResidence"] {
        assert!(!header.contains(raw), "{raw} leaked into nccl.h");
    }
    // Device-API host functions belong to nccl_device/*.h, not nccl.h.
    for device_fn in [
        "ncclDevCommCreate",
        "ncclTeamWorld",
        "ncclLLA2ACalcSlots",
        "ncclCommQueryProperties",
        "ncclGetPeerDevicePointer",
    ] {
        assert!(!header.contains(device_fn), "{device_fn} is in nccl.h");
    }
    for needed in [
        "typedef struct ncclComm *ncclComm_t;",
        "typedef struct ncclConfig_v23100 ncclConfig_t;",
        "typedef struct ncclCollConfig_v23200 ncclCollConfig_t;",
        "typedef struct ncclSimInfo_v22200 ncclSimInfo_t;",
        "const char *ncclGetErrorString(ncclResult_t result);",
        "void  ncclResetDebugInit();",
        "extern \"C\"",
        "#include <cuda_runtime.h>",
    ] {
        assert!(header.contains(needed), "nccl.h lacks `{needed}`");
    }
}

/// Every C entry point of src/api/ starts with `export!(<its own name>`, so that each function
/// of nccl.h (which gets a `pncclX` prototype above) has the alias in the library too.
#[test]
fn every_entry_point_exports_its_alias() {
    // Exported by NVIDIA's library without a profiling alias; not in nccl.h.
    const WITHOUT_ALIAS: &[&str] = &["ncclResetDebugInitInternal"];
    let dir = repo_root().join("src").join("api");
    let mut seen = 0;
    for file in std::fs::read_dir(&dir).unwrap() {
        let path = file.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let mut rest = text.as_str();
        // Items start a line; the same words inside a comment do not.
        const ITEM: &str = "\npub extern \"C\" fn ";
        while let Some(at) = rest.find(ITEM) {
            rest = &rest[at + ITEM.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            seen += 1;
            if WITHOUT_ALIAS.contains(&name.as_str()) {
                continue;
            }
            let body = &rest[rest.find('{').unwrap() + 1..];
            let first = body.trim_start();
            assert!(
                first.starts_with(&format!("export!({name})"))
                    || first.starts_with(&format!("export!({name},")),
                "{}: {name} does not start with export!({name}...)",
                path.display()
            );
        }
    }
    assert!(
        seen > 50,
        "found only {seen} entry points under {}",
        dir.display()
    );
}

#[test]
fn device_header_uses_the_kernels_names() {
    let header = generate_device_header(&repo_root());
    for needed in [
        "struct OxConn {",
        "struct OxWork {",
        "struct OxInline {",
        "enum OxKind",
        "OX_KIND_COPY = 0,",
        "OX_KIND_PEER = 9,",
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
