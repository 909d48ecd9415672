//! Build script: gives the library NVIDIA's SONAME and compiles `kernels/*.cu` with nvcc into
//! one fatbin (SASS for sm_80, sm_90, sm_100 plus compute_100 PTX by default; env
//! `OXCCL_CUDA_ARCHS`, e.g. "90" or "80,90", restricts it) that `src/cuda/module.rs` embeds
//! from `$OUT_DIR/oxccl_kernels.fatbin`.
//!
//! nvcc comes from env `NVCC`, else `$CUDA_HOME/bin/nvcc`, else `nvcc` on PATH, else the
//! toolchain that `scripts/setup` installs under `.toolchain/py/nvidia/cu13/bin/nvcc`.
//!
//! The fatbin is cached, so that the kernels compile once per change of their inputs rather than
//! once per cargo profile (clippy, test and release builds each run this script in their own
//! OUT_DIR). The cache key is a 64-bit FNV-1a hash of everything that determines the fatbin:
//! the name and bytes of every file under `kernels/`, the generated translation unit, the nvcc
//! path (paths inside the checkout relative to it), `nvcc --version`, the host compiler's `--version`, nvcc's environment flags and the
//! exact nvcc arguments (architectures included). The cache directory is env
//! `OXCCL_KERNEL_CACHE`, else `oxccl-kernels/` in the directory that holds the profile
//! directories (`target/`, or `target/<triple>/`), found from OUT_DIR. An entry is
//! `<key>.fatbin` plus `<key>.log` (nvcc's warnings, re-emitted on every hit); a miss compiles
//! under `<key>.lock` into a temporary file and renames it into place, so concurrent builds
//! never see a partial fatbin. Only the newest few entries are kept.
//!
//! It also keeps the `pncclX` aliases exported (see `export!` in `src/api/mod.rs`).
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

/// Bump when the cache layout or the meaning of an entry changes.
const CACHE_FORMAT: &str = "oxccl-kernel-cache-1";
/// Cache entries kept after a miss adds one (the newest by use).
const CACHE_KEEP: usize = 4;
/// The name `src/cuda/module.rs` includes from OUT_DIR.
const FATBIN: &str = "oxccl_kernels.fatbin";
/// This script's environment variables.
const BUILD_ENV: [&str; 4] = [
    "NVCC",
    "CUDA_HOME",
    "OXCCL_CUDA_ARCHS",
    "OXCCL_KERNEL_CACHE",
];
/// nvcc's own environment variables: they change what it compiles.
const NVCC_ENV: [&str; 3] = ["NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN"];

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rerun-if-changed=build.rs");
    export_aliases();
    link_soname();
    println!("cargo:rerun-if-changed=kernels");
    for var in BUILD_ENV.iter().chain(&NVCC_ENV) {
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
    let kernels = root.join("kernels");
    let unit = translation_unit(&kernels);
    let all = out.join("oxccl_all.cu");
    fs::write(&all, &unit).expect("write oxccl_all.cu");
    let args = nvcc_args(&nvcc, &kernels);

    let key = cache_key(&root, &nvcc, &args, &kernels, &unit);
    let cache = cache_dir(&out);
    fs::create_dir_all(&cache)
        .unwrap_or_else(|e| panic!("create kernel cache {}: {e}", cache.display()));
    let entry = Entry::new(&cache, &key);
    let (log, cached) = match entry.load() {
        Some(log) => (log, true),
        None => entry.fill(|fatbin| compile(&nvcc, &args, &all, fatbin)),
    };
    entry.copy_to(&out.join(FATBIN));
    emit_warnings(&log, cached);
}

/// One translation unit that includes every kernels/*.cu, so one nvcc call yields one fatbin.
fn translation_unit(kernels: &Path) -> String {
    let mut units: Vec<PathBuf> = fs::read_dir(kernels)
        .expect("read kernels/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    units.sort();
    units
        .iter()
        .map(|p| format!("#include \"{}\"\n", p.display()))
        .collect()
}

/// nvcc's arguments, less the input and output files (which live in each OUT_DIR).
fn nvcc_args(nvcc: &Path, kernels: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = ["-fatbin", "-O3", "-std=c++17", "--threads", "2"]
        .into_iter()
        .chain(["-Xptxas", "-warn-spills"])
        .map(OsString::from)
        .collect();
    for inc in std::iter::once(kernels.to_path_buf()).chain(include_dirs(nvcc)) {
        args.extend([OsString::from("-I"), inc.into_os_string()]);
    }
    let archs = archs();
    let highest = archs.iter().max().copied().unwrap_or(100);
    for a in &archs {
        args.extend([
            "-gencode".into(),
            format!("arch=compute_{a},code=sm_{a}").into(),
        ]);
    }
    args.extend([
        "-gencode".into(),
        format!("arch=compute_{highest},code=compute_{highest}").into(),
    ]);
    args
}

/// Runs nvcc on `all` into `fatbin`; returns its (warning) output. Panics if it fails.
fn compile(nvcc: &Path, args: &[OsString], all: &Path, fatbin: &Path) -> String {
    let mut cmd = Command::new(nvcc);
    cmd.args(args).arg(all).arg("-o").arg(fatbin);
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", nvcc.display()));
    let text = String::from_utf8_lossy(&output.stderr).into_owned()
        + &String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let _ = fs::remove_file(fatbin);
        panic!("nvcc failed compiling kernels/ ({cmd:?}):\n{text}");
    }
    text
}

/// nvcc's output lines as cargo warnings (`cached` says they come from an earlier compile).
fn emit_warnings(log: &str, cached: bool) {
    let tag = if cached { "nvcc (cached)" } else { "nvcc" };
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        println!("cargo:warning={tag}: {line}");
    }
}

/// The `pncclX` aliases are assembler symbols that rustc does not know about, so its version
/// script (`local: *`) would hide them; a second version script keeps every `pnccl*` global.
/// GNU ld merges the two.
/// Leave `libnccl.so.2 -> libnccl.so` in the profile directory (`target/release/`), beside the
/// library cargo writes there: programs linked with `-lnccl` and `LD_PRELOAD` users look for
/// the SONAME. The link is relative, so it points at each new build of the library.
fn link_soname() {
    let Some(out) = std::env::var_os("OUT_DIR") else {
        return;
    };
    // OUT_DIR is <profile dir>/build/<package>-<hash>/out.
    let Some(profile_dir) = Path::new(&out).ancestors().nth(3) else {
        return;
    };
    let link = profile_dir.join("libnccl.so.2");
    if fs::read_link(&link).is_ok_and(|target| target == Path::new("libnccl.so")) {
        return;
    }
    let _ = fs::remove_file(&link);
    if let Err(e) = std::os::unix::fs::symlink("libnccl.so", &link) {
        println!(
            "cargo:warning=cannot link {} to libnccl.so: {e}",
            link.display()
        );
    }
}

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

/// 64-bit FNV-1a; each field is length-prefixed so that no two field lists hash alike by
/// concatenation.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(&mut self, data: &[u8]) {
        for &b in data {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn field(&mut self, data: &[u8]) {
        self.bytes(&(data.len() as u64).to_le_bytes());
        self.bytes(data);
    }
}

/// The cache key: a hash of every input that determines the fatbin, as 16 hex digits. Paths
/// inside the checkout `root` count relative to it, so that two checkouts of the same sources
/// (git worktrees sharing `OXCCL_KERNEL_CACHE`) find each other's entries.
fn cache_key(root: &Path, nvcc: &Path, args: &[OsString], kernels: &Path, unit: &str) -> String {
    let here = root.as_os_str().as_encoded_bytes();
    let portable = |bytes: &[u8]| -> Vec<u8> { replace_all(bytes, here, b"<checkout>") };
    let mut h = Fnv::new();
    h.field(CACHE_FORMAT.as_bytes());
    h.field(&portable(nvcc.as_os_str().as_encoded_bytes()));
    h.field(&tool_version(nvcc.as_os_str()));
    let ccbin = std::env::var_os("NVCC_CCBIN").unwrap_or_else(|| "gcc".into());
    h.field(&tool_version(&ccbin));
    for var in NVCC_ENV {
        h.field(var.as_bytes());
        h.field(std::env::var_os(var).unwrap_or_default().as_encoded_bytes());
    }
    for arg in args {
        h.field(&portable(arg.as_encoded_bytes()));
    }
    h.field(&portable(unit.as_bytes()));
    for file in files_under(kernels) {
        let rel = file.strip_prefix(kernels).unwrap_or(&file);
        h.field(rel.as_os_str().as_encoded_bytes());
        h.field(&fs::read(&file).unwrap_or_else(|e| panic!("read {}: {e}", file.display())));
    }
    format!("{:016x}", h.0)
}

/// `bytes` with every occurrence of `from` replaced by `to` (`from` empty: unchanged).
fn replace_all(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    if from.is_empty() {
        return bytes.to_vec();
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

/// `<tool> --version` (stdout and stderr), or a marker when it cannot run.
fn tool_version(tool: &std::ffi::OsStr) -> Vec<u8> {
    match Command::new(tool).arg("--version").output() {
        Ok(o) => [o.stdout, o.stderr].concat(),
        Err(_) => b"(does not run)".to_vec(),
    }
}

/// Every file under `dir`, recursively, sorted by path.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let entries = fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display()));
        for e in entries {
            let p = e.expect("read kernels/ entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// The kernel cache directory: OXCCL_KERNEL_CACHE, else `oxccl-kernels/` beside the profile
/// directories. OUT_DIR is `<dir>/<profile>/build/<pkg>-<hash>/out`; if it is not shaped like
/// that, the cache is OUT_DIR's own (correct, merely not shared).
fn cache_dir(out: &Path) -> PathBuf {
    if let Some(dir) = std::env::var_os("OXCCL_KERNEL_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let shaped = out.file_name().is_some_and(|n| n == "out")
        && out
            .ancestors()
            .nth(2)
            .and_then(Path::file_name)
            .is_some_and(|n| n == "build");
    match out.ancestors().nth(4) {
        Some(base) if shaped => base.join("oxccl-kernels"),
        _ => out.join("oxccl-kernels"),
    }
}

/// One cache entry: `<key>.fatbin`, `<key>.log` (nvcc's output) and `<key>.lock`.
struct Entry {
    dir: PathBuf,
    key: String,
}

impl Entry {
    fn new(dir: &Path, key: &str) -> Self {
        Entry {
            dir: dir.to_path_buf(),
            key: key.to_string(),
        }
    }

    fn path(&self, ext: &str) -> PathBuf {
        self.dir.join(format!("{}.{ext}", self.key))
    }

    /// A file name of this process only, renamed into place by `store`.
    fn temp_fatbin(&self) -> PathBuf {
        self.path(&format!("{}.tmp", std::process::id()))
    }

    /// nvcc's output of the cached compile, or None on a miss. The fatbin is renamed in last,
    /// so its presence means the entry is complete.
    fn load(&self) -> Option<String> {
        self.path("fatbin")
            .is_file()
            .then(|| fs::read_to_string(self.path("log")).unwrap_or_default())
    }

    /// Copies the fatbin to `dest` and marks the entry as just used (for `prune`).
    fn copy_to(&self, dest: &Path) {
        let fatbin = self.path("fatbin");
        fs::copy(&fatbin, dest)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", fatbin.display(), dest.display()));
        if let Ok(f) = fs::File::open(&fatbin) {
            let _ = f.set_modified(SystemTime::now());
        }
    }

    /// Under the entry's lock: the stored entry if another build stored it meanwhile (true),
    /// else `compile`'s output into a temporary file, stored and returned (false).
    fn fill(&self, compile: impl FnOnce(&Path) -> String) -> (String, bool) {
        let _lock = self.lock();
        if let Some(log) = self.load() {
            return (log, true);
        }
        let log = compile(&self.temp_fatbin());
        self.store(&log);
        prune(&self.dir);
        (log, false)
    }

    /// Moves a fresh compile into place: the log first, then the fatbin.
    fn store(&self, log: &str) {
        let tmp_log = self.path(&format!("{}.logtmp", std::process::id()));
        fs::write(&tmp_log, log).expect("write kernel cache log");
        fs::rename(&tmp_log, self.path("log")).expect("store kernel cache log");
        fs::rename(self.temp_fatbin(), self.path("fatbin")).expect("store kernel cache fatbin");
    }

    /// An exclusive lock on `<key>.lock`, held until the returned file drops; none when the
    /// file system cannot lock (the rename still keeps the entry whole).
    fn lock(&self) -> Option<fs::File> {
        let file = fs::File::create(self.path("lock")).ok()?;
        file.lock().ok()?;
        Some(file)
    }
}

/// Keeps the CACHE_KEEP most recently used entries; also removes temporary files a killed
/// compile left more than a day ago.
fn prune(cache: &Path) {
    let Ok(read) = fs::read_dir(cache) else {
        return;
    };
    let mut fatbins = Vec::new();
    for path in read.filter_map(|e| e.ok().map(|e| e.path())) {
        let modified = fs::metadata(&path).and_then(|m| m.modified()).ok();
        let age = modified.and_then(|m| m.elapsed().ok());
        match path.extension().and_then(|x| x.to_str()) {
            Some("fatbin") => fatbins.push((modified.unwrap_or(SystemTime::UNIX_EPOCH), path)),
            Some("tmp" | "logtmp") if age.is_some_and(|a| a > Duration::from_secs(86400)) => {
                let _ = fs::remove_file(&path);
            }
            _ => {}
        }
    }
    fatbins.sort_by_key(|f| std::cmp::Reverse(f.0));
    for (_, fatbin) in fatbins.into_iter().skip(CACHE_KEEP) {
        for ext in ["fatbin", "log", "lock"] {
            let _ = fs::remove_file(fatbin.with_extension(ext));
        }
    }
}
