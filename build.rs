//! Build script: gives the library NVIDIA's SONAME and compiles `kernels/*.cu` with nvcc into
//! one fatbin (SASS for sm_80, sm_90, sm_100 plus compute_100 PTX by default; env
//! `OXCCL_CUDA_ARCHS`, e.g. "90" or "80,90", restricts it) that `src/cuda/module.rs` embeds.
//! nvcc comes from env `NVCC`, else `$CUDA_HOME/bin/nvcc`, else `nvcc` on PATH, else the
//! toolchain that `scripts/setup` installs under `.toolchain/py/nvidia/cu13/bin/nvcc`.
//! It also keeps the `pncclX` aliases exported (see `export!` in `src/api/mod.rs`).
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rerun-if-changed=build.rs");
    export_aliases();
    println!("cargo:rerun-if-changed=kernels");
    for var in ["NVCC", "CUDA_HOME", "OXCCL_CUDA_ARCHS"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let nvcc = find_nvcc(&root).unwrap_or_else(|| {
        panic!(
            "oxccl needs nvcc (CUDA 12.8+) to compile kernels/: set NVCC or CUDA_HOME, put nvcc on \
             PATH, or run `scripts/setup` to install the toolchain under .toolchain/"
        )
    });

    // One translation unit that includes every kernels/*.cu, so one nvcc call yields one fatbin.
    let kernels = root.join("kernels");
    let mut units: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .expect("read kernels/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    units.sort();
    let all = out.join("oxccl_all.cu");
    let body: String = units
        .iter()
        .map(|p| format!("#include \"{}\"\n", p.display()))
        .collect();
    std::fs::write(&all, body).expect("write oxccl_all.cu");

    let archs = archs();
    let mut cmd = Command::new(&nvcc);
    cmd.arg("-fatbin")
        .arg("-O3")
        .arg("-std=c++17")
        .arg("--threads")
        .arg("2")
        .arg("-Xptxas")
        .arg("-warn-spills")
        .arg("-I")
        .arg(&kernels);
    for inc in include_dirs(&nvcc) {
        cmd.arg("-I").arg(inc);
    }
    let highest = archs.iter().max().copied().unwrap_or(100);
    for a in &archs {
        cmd.arg("-gencode")
            .arg(format!("arch=compute_{a},code=sm_{a}"));
    }
    cmd.arg("-gencode")
        .arg(format!("arch=compute_{highest},code=compute_{highest}"));
    let fatbin = out.join("oxccl_kernels.fatbin");
    cmd.arg(&all).arg("-o").arg(&fatbin);
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", nvcc.display()));
    let text = String::from_utf8_lossy(&output.stderr).into_owned()
        + &String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        panic!("nvcc failed compiling kernels/ ({:?}):\n{text}", cmd);
    }
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        println!("cargo:warning=nvcc: {line}");
    }
}

/// The `pncclX` aliases are assembler symbols that rustc does not know about, so its version
/// script (`local: *`) would hide them; a second version script keeps every `pnccl*` global.
/// GNU ld merges the two.
fn export_aliases() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let script = out.join("pnccl_aliases.map");
    std::fs::write(&script, "{ global: pnccl*; };\n").expect("write pnccl_aliases.map");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        script.display()
    );
}

/// The SASS architectures to build: OXCCL_CUDA_ARCHS ("90", "80,90", "sm_90") or all three.
fn archs() -> Vec<u32> {
    match std::env::var("OXCCL_CUDA_ARCHS") {
        Ok(s) if !s.trim().is_empty() => s
            .split([',', ';', ' '])
            .filter(|x| !x.is_empty())
            .map(|x| {
                x.trim_start_matches("sm_")
                    .trim_start_matches("compute_")
                    .parse()
                    .unwrap_or_else(|_| panic!("OXCCL_CUDA_ARCHS: bad architecture {x:?}"))
            })
            .collect(),
        _ => vec![80, 90, 100],
    }
}

fn find_nvcc(root: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NVCC") {
        return Some(PathBuf::from(p));
    }
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        let p = PathBuf::from(home).join("bin/nvcc");
        if p.is_file() {
            return Some(p);
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("nvcc");
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let p = root.join(".toolchain/py/nvidia/cu13/bin/nvcc");
    p.is_file().then_some(p)
}

/// Header directories next to nvcc (the pip layout does not add them by itself).
fn include_dirs(nvcc: &Path) -> Vec<PathBuf> {
    let Some(prefix) = nvcc.parent().and_then(Path::parent) else {
        return Vec::new();
    };
    [prefix.join("include"), prefix.join("include/cccl")]
        .into_iter()
        .filter(|p| p.is_dir())
        .collect()
}
