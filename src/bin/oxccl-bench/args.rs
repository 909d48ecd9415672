//! Command-line options of `oxccl-bench`: the option table, the `--help` text, size parsing
//! (`K`/`M`/`G` suffixes), the collective, data type and reduction operator names, and the
//! placement of ranks on GPUs (`--devices`, `--ranks-per-gpu`).

use std::fmt;
use std::path::PathBuf;

/// A collective the benchmark can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AlltoAll,
    Gather,
    Scatter,
    SendRecv,
}

impl Coll {
    pub const ALL: [Coll; 9] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AlltoAll,
        Coll::Gather,
        Coll::Scatter,
        Coll::SendRecv,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AlltoAll => "alltoall",
            Coll::Gather => "gather",
            Coll::Scatter => "scatter",
            Coll::SendRecv => "sendrecv",
        }
    }

    pub fn parse(text: &str) -> Option<Coll> {
        Coll::ALL.into_iter().find(|c| c.name() == text)
    }

    /// Whether the collective takes a reduction operator.
    pub fn has_op(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }

    /// Whether the collective takes a root rank.
    pub fn has_root(self) -> bool {
        matches!(
            self,
            Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter
        )
    }

    /// Whether an in-place variant is defined (NCCL gives none for alltoall and send/recv).
    pub fn has_inplace(self) -> bool {
        !matches!(self, Coll::AlltoAll | Coll::SendRecv)
    }
}

impl fmt::Display for Coll {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An NCCL data type; the discriminant is the `ncclDataType_t` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    Int8 = 0,
    Uint8 = 1,
    Int32 = 2,
    Uint32 = 3,
    Int64 = 4,
    Uint64 = 5,
    Half = 6,
    Float = 7,
    Double = 8,
    Bfloat16 = 9,
    Fp8E4M3 = 10,
    Fp8E5M2 = 11,
}

impl Dtype {
    pub const ALL: [Dtype; 12] = [
        Dtype::Int8,
        Dtype::Uint8,
        Dtype::Int32,
        Dtype::Uint32,
        Dtype::Int64,
        Dtype::Uint64,
        Dtype::Half,
        Dtype::Float,
        Dtype::Double,
        Dtype::Bfloat16,
        Dtype::Fp8E4M3,
        Dtype::Fp8E5M2,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Dtype::Int8 => "int8",
            Dtype::Uint8 => "uint8",
            Dtype::Int32 => "int32",
            Dtype::Uint32 => "uint32",
            Dtype::Int64 => "int64",
            Dtype::Uint64 => "uint64",
            Dtype::Half => "half",
            Dtype::Float => "float",
            Dtype::Double => "double",
            Dtype::Bfloat16 => "bfloat16",
            Dtype::Fp8E4M3 => "fp8e4m3",
            Dtype::Fp8E5M2 => "fp8e5m2",
        }
    }

    pub fn parse(text: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == text)
    }

    pub fn size(self) -> usize {
        match self {
            Dtype::Int8 | Dtype::Uint8 | Dtype::Fp8E4M3 | Dtype::Fp8E5M2 => 1,
            Dtype::Half | Dtype::Bfloat16 => 2,
            Dtype::Int32 | Dtype::Uint32 | Dtype::Float => 4,
            Dtype::Int64 | Dtype::Uint64 | Dtype::Double => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(
            self,
            Dtype::Half
                | Dtype::Float
                | Dtype::Double
                | Dtype::Bfloat16
                | Dtype::Fp8E4M3
                | Dtype::Fp8E5M2
        )
    }

    pub fn is_signed(self) -> bool {
        !matches!(self, Dtype::Uint8 | Dtype::Uint32 | Dtype::Uint64)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduction operator; `PreMulSum` is created per communicator with `ncclRedOpCreatePreMulSum`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
    PreMulSum,
}

impl Op {
    pub const ALL: [Op; 6] = [Op::Sum, Op::Prod, Op::Max, Op::Min, Op::Avg, Op::PreMulSum];

    pub fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Prod => "prod",
            Op::Max => "max",
            Op::Min => "min",
            Op::Avg => "avg",
            Op::PreMulSum => "premulsum",
        }
    }

    pub fn parse(text: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.name() == text)
    }

    /// The built-in `ncclRedOp_t` value (PreMulSum has none: it is created at run time).
    pub fn builtin_code(self) -> Option<i32> {
        match self {
            Op::Sum => Some(0),
            Op::Prod => Some(1),
            Op::Max => Some(2),
            Op::Min => Some(3),
            Op::Avg => Some(4),
            Op::PreMulSum => None,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How the ranks are laid out over processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One process drives this many GPUs (`None`: every visible GPU).
    Threadless(Option<usize>),
    /// This many processes, one GPU each.
    Processes(usize),
}

/// Which CUDA device each rank uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceMap {
    /// Rank r on GPU r (the default).
    OnePerGpu,
    /// `--devices`: rank r on `list[r]`.
    List(Vec<usize>),
    /// `--ranks-per-gpu K`: rank r on GPU r / K.
    RanksPerGpu(usize),
}

impl DeviceMap {
    /// The device of `rank`.
    pub fn device_of(&self, rank: usize) -> usize {
        match self {
            DeviceMap::OnePerGpu => rank,
            DeviceMap::List(list) => list.get(rank).copied().unwrap_or(rank),
            DeviceMap::RanksPerGpu(k) => rank / (*k).max(1),
        }
    }

    /// The device of every rank of an `nranks`-rank run, in rank order.
    pub fn devices(&self, nranks: usize) -> Vec<usize> {
        (0..nranks).map(|rank| self.device_of(rank)).collect()
    }

    /// How many ranks a one-process run without `-g` has when `visible` GPUs are visible.
    pub fn default_nranks(&self, visible: usize) -> usize {
        match self {
            DeviceMap::OnePerGpu => visible,
            DeviceMap::List(list) => list.len(),
            DeviceMap::RanksPerGpu(k) => visible.saturating_mul(*k),
        }
    }
}

/// Whether any two ranks of `devices` share a device.
pub fn devices_shared(devices: &[usize]) -> bool {
    let mut seen = std::collections::BTreeSet::new();
    devices.iter().any(|d| !seen.insert(*d))
}

/// A device list as text: `0,0,1,1`.
pub fn devices_text(devices: &[usize]) -> String {
    devices
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Options that only the benchmark's own child processes receive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildRole {
    pub rank: usize,
    pub nranks: usize,
    pub unique_id_hex: String,
}

/// Every option of one invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub lib: Option<PathBuf>,
    pub vs: Option<PathBuf>,
    /// With `--vs`: variables set for library A's (`--env-a`) and B's (`--env-b`) processes
    /// only, e.g. the same library with and without a setting.
    pub env_a: Vec<(String, String)>,
    pub env_b: Vec<(String, String)>,
    pub colls: Vec<Coll>,
    pub dtypes: Vec<Dtype>,
    pub ops: Vec<Op>,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub factor: u64,
    pub sizes: Option<Vec<u64>>,
    pub root: usize,
    pub inplace: Vec<bool>,
    pub warmup: usize,
    pub iters: usize,
    pub check: bool,
    pub graph: bool,
    pub layout: Layout,
    /// Which device each rank uses (`--devices`, `--ranks-per-gpu`).
    pub devices: DeviceMap,
    /// `--hostid-per-rank` (only with `-p`): rank r's process gets
    /// `NCCL_HOSTID=oxccl-bench-host-<r>`.
    pub hostid_per_rank: bool,
    /// `--hosts H` (only with `-p`, not with `--hostid-per-rank`): rank r's process gets
    /// `NCCL_HOSTID=oxccl-bench-host-<r % H>`, H hosts whose ranks interleave.
    pub hosts: Option<usize>,
    pub timeout_s: f64,
    /// `--trace-interval MS`: while a size's timed iterations run, one busbw line per
    /// interval (`trace.rs`).
    pub trace_interval: Option<std::time::Duration>,
    pub json: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    /// Hidden: print aggregated result lines for a parent `--vs` process.
    pub emit: bool,
    /// Hidden: this process is rank `rank` of a `-p` run.
    pub child: Option<ChildRole>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            lib: None,
            vs: None,
            env_a: Vec::new(),
            env_b: Vec::new(),
            colls: vec![Coll::AllReduce],
            dtypes: vec![Dtype::Float],
            ops: vec![Op::Sum],
            min_bytes: 8,
            max_bytes: 32 << 20,
            factor: 4,
            sizes: None,
            root: 0,
            inplace: vec![false, true],
            warmup: 5,
            iters: 20,
            check: true,
            graph: false,
            layout: Layout::Threadless(None),
            devices: DeviceMap::OnePerGpu,
            hostid_per_rank: false,
            hosts: None,
            timeout_s: 60.0,
            trace_interval: None,
            json: None,
            csv: None,
            emit: false,
            child: None,
        }
    }
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Help,
    Run(Box<Options>),
}

pub const HELP: &str = "\
oxccl-bench: an nccl-tests-style benchmark and correctness checker for any libnccl.so.2.
The NCCL library is loaded at run time by path, so NVIDIA's library and oxccl's are measured
the same way.

USAGE: oxccl-bench [OPTIONS]

Library:
  --lib PATH          NCCL library to test (default: libnccl.so.2 in the executable's own
                      directory, else whatever dlopen(\"libnccl.so.2\") finds)
  --vs PATH           also run the same sweep against this second library (each library in
                      its own child processes) and print both side by side with ratios A/B
  --env-a NAME=VALUE, --env-b NAME=VALUE
                      with --vs: set a variable for library A's or B's processes only
                      (repeatable); with --vs naming the same library, this compares a
                      setting, e.g. --env-b OXCCL_CHECK_COLLECTIVES=1

Collectives and data:
  -c, --coll NAME     all_reduce all_gather reduce_scatter broadcast reduce alltoall gather
                      scatter sendrecv, a comma list of them, or all (default all_reduce)
  -d, --dtype NAME    int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 fp8e4m3
                      fp8e5m2, a comma list, or all (default float)
  -o, --op NAME       sum prod max min avg premulsum, a comma list, or all (default sum);
                      used by all_reduce, reduce_scatter and reduce only
  -r, --root N        root rank of broadcast, reduce, gather and scatter (default 0)
  --inplace MODE      0 (out-of-place only), 1 (in-place only) or both (default both)

Sizes (bytes; suffixes K M G are powers of 1024, e.g. 64K, 1G):
  -b, --minbytes S    smallest size (default 8)
  -e, --maxbytes S    largest size (default 32M)
  -f, --stepfactor F  multiply the size by F each step (default 4)
  --sizes LIST        explicit comma list of sizes instead of -b/-e/-f (e.g. 0,12,1M,1G)
                      The size is the total buffer: all_gather/alltoall/gather receive and
                      reduce_scatter/scatter send `size` bytes, size/nranks per rank.

Ranks:
  -g, --ngpus N       one process drives N ranks (default: one per visible GPU)
  -p, --nprocs N      N processes with one rank each; no MPI needed
  By default rank r uses GPU r. Ranks may share a GPU (each keeps its own stream and buffers):
  --devices LIST      CUDA device of each rank, e.g. 0,0,0,0 (4 ranks on GPU 0); alone it
                      means one process with that many ranks (like -g); with -g N or -p N
                      the list must have N entries
  --ranks-per-gpu K   rank r uses GPU r / K (e.g. -g 8 --ranks-per-gpu 8: 8 ranks on GPU 0);
                      without -g/-p: K ranks on every visible GPU. Not with --devices
  --hostid-per-rank   with -p: rank r's process gets NCCL_HOSTID=oxccl-bench-host-<r>, so
                      the library treats every rank as a separate host (network transport)
  --hosts H           with -p: rank r's process gets NCCL_HOSTID=oxccl-bench-host-<r % H>:
                      H hosts whose ranks interleave (rank order crosses hosts at every hop;
                      the library's rings should cross each host boundary once)

Timing and checking:
  -w, --warmup N      warm-up iterations per size (default 5)
  -n, --iters N       timed iterations per size (default 20)
  --check 0|1         check every result against the exact expected value (default 1)
  --graph             capture the timed iterations into one CUDA graph per rank and time its
                      replays instead of direct launches
  --timeout S         seconds any single NCCL step may take before it is reported as a hang,
                      the communicators are aborted and the run exits (default 60)
  --trace-interval MS while each size's timed iterations run, print one line per MS
                      milliseconds: `# trace t=<s> busbw=<GB/s> iters=<n>` (t from the first
                      timed iteration's start, by its CUDA events; after a `# trace start
                      size=<bytes> unix=<wall-clock s>` line), to see busbw change mid-run.
                      Give enough iterations (-n) to span the time of interest. Not with --graph

Output:
  --json PATH         write one JSON object per line per (lib, coll, dtype, op, inplace, size)
  --csv PATH          the same records as CSV
  -h, --help          this text

Exit status: 0 all good; 1 some results were wrong; 2 bad command line; 3 an error (no GPU,
missing library or symbol, CUDA or NCCL error) or the library refused the configuration (a
REFUSED line; with --vs a refusal of the --vs library B alone keeps status 0 when A passed);
4 a collective or init hung past --timeout.
";

/// A command-line mistake, reported with exit status 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parse a byte size: a non-negative integer with an optional K, M or G suffix (powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, UsageError> {
    let bad = || {
        UsageError(format!(
            "bad size '{text}': expected e.g. 1024, 64K, 8M or 1G"
        ))
    };
    let trimmed = text.trim();
    let (digits, shift) = match trimmed.chars().last() {
        Some('K' | 'k') => (&trimmed[..trimmed.len() - 1], 10),
        Some('M' | 'm') => (&trimmed[..trimmed.len() - 1], 20),
        Some('G' | 'g') => (&trimmed[..trimmed.len() - 1], 30),
        _ => (trimmed, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let value: u64 = digits.parse().map_err(|_| bad())?;
    value.checked_mul(1u64 << shift).ok_or_else(bad)
}

fn parse_list<T: Copy>(
    text: &str,
    what: &str,
    all: &[T],
    parse_one: impl Fn(&str) -> Option<T>,
    names: &str,
) -> Result<Vec<T>, UsageError> {
    if text == "all" {
        return Ok(all.to_vec());
    }
    text.split(',')
        .map(|item| {
            parse_one(item.trim()).ok_or_else(|| {
                UsageError(format!("unknown {what} '{item}': expected {names} or all"))
            })
        })
        .collect()
}

fn parse_count(text: &str, option: &str) -> Result<usize, UsageError> {
    text.trim().parse::<usize>().map_err(|_| {
        UsageError(format!(
            "{option} needs a non-negative integer, got '{text}'"
        ))
    })
}

/// Parse `--devices`: a comma list of CUDA device ordinals, one per rank.
pub fn parse_device_list(text: &str) -> Result<Vec<usize>, UsageError> {
    text.split(',')
        .map(|item| {
            let item = item.trim();
            if item.is_empty() || !item.bytes().all(|b| b.is_ascii_digit()) {
                return Err(UsageError(format!(
                    "--devices needs a comma list of CUDA device numbers (e.g. 0,0,1,1), got '{text}'"
                )));
            }
            item.parse::<usize>().map_err(|_| {
                UsageError(format!("--devices: device number '{item}' is too large"))
            })
        })
        .collect()
}

/// Parse `--trace-interval`: a positive number of milliseconds.
fn parse_trace_interval(text: &str) -> Result<std::time::Duration, UsageError> {
    match parse_count(text, "--trace-interval")? {
        0 => Err(UsageError(
            "--trace-interval needs at least 1 millisecond, got '0'".into(),
        )),
        ms => Ok(std::time::Duration::from_millis(ms as u64)),
    }
}

/// Parse `--ranks-per-gpu`: a positive number of ranks per device.
fn parse_ranks_per_gpu(text: &str) -> Result<usize, UsageError> {
    match parse_count(text, "--ranks-per-gpu")? {
        0 => Err(UsageError("--ranks-per-gpu needs at least 1".into())),
        k => Ok(k),
    }
}

/// Combine `-g`, `-p`, `--devices` and `--ranks-per-gpu` into the layout and device map,
/// rejecting combinations that contradict each other.
fn resolve_placement(
    ngpus: Option<usize>,
    nprocs: Option<usize>,
    device_list: Option<Vec<usize>>,
    ranks_per_gpu: Option<usize>,
) -> Result<(Layout, DeviceMap), UsageError> {
    let layout = match (ngpus, nprocs) {
        (Some(_), Some(_)) => {
            return Err(UsageError(
                "give either -g (ranks in one process) or -p (processes), not both".into(),
            ))
        }
        (Some(0), None) | (None, Some(0)) => {
            return Err(UsageError("-g and -p need at least 1".into()))
        }
        (Some(n), None) => Layout::Threadless(Some(n)),
        (None, Some(n)) => Layout::Processes(n),
        (None, None) => Layout::Threadless(None),
    };
    let map = match (device_list, ranks_per_gpu) {
        (Some(_), Some(_)) => {
            return Err(UsageError(
                "give either --devices or --ranks-per-gpu, not both".into(),
            ))
        }
        (Some(list), None) => {
            check_device_list_length(&list, layout)?;
            DeviceMap::List(list)
        }
        (None, Some(k)) => DeviceMap::RanksPerGpu(k),
        (None, None) => DeviceMap::OnePerGpu,
    };
    // --devices alone fixes the rank count of a one-process run.
    let layout = match (&map, layout) {
        (DeviceMap::List(list), Layout::Threadless(None)) => Layout::Threadless(Some(list.len())),
        (_, layout) => layout,
    };
    Ok((layout, map))
}

fn check_device_list_length(list: &[usize], layout: Layout) -> Result<(), UsageError> {
    let (flag, n) = match layout {
        Layout::Threadless(Some(n)) => ("-g", n),
        Layout::Processes(n) => ("-p", n),
        Layout::Threadless(None) => return Ok(()),
    };
    if list.len() == n {
        Ok(())
    } else {
        Err(UsageError(format!(
            "--devices lists {} device(s) but {flag} {n} asks for {n} rank(s); give one device per rank",
            list.len()
        )))
    }
}

/// `NAME=VALUE` of `--env-a` / `--env-b`: a variable name of letters, digits and `_` (not
/// starting with a digit), and any value.
fn parse_env(text: &str) -> Result<(String, String), UsageError> {
    let bad = || UsageError(format!("--env-a/--env-b take NAME=VALUE, got '{text}'"));
    let (name, value) = text.split_once('=').ok_or_else(bad)?;
    let valid = name
        .bytes()
        .enumerate()
        .all(|(i, b)| b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()));
    if name.is_empty() || !valid {
        return Err(bad());
    }
    Ok((name.to_string(), value.to_string()))
}

/// `A=1 B=2`: how a library's variables are shown.
pub fn env_text(env: &[(String, String)]) -> String {
    env.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The list of sizes one run sweeps, in order.
pub fn sweep_sizes(opts: &Options) -> Vec<u64> {
    if let Some(list) = &opts.sizes {
        return list.clone();
    }
    let mut sizes = Vec::new();
    let mut size = opts.min_bytes;
    if size == 0 {
        sizes.push(0);
        size = 1;
    }
    while size <= opts.max_bytes {
        sizes.push(size);
        if opts.factor <= 1 {
            break;
        }
        match size.checked_mul(opts.factor) {
            Some(next) => size = next,
            None => break,
        }
    }
    sizes
}

/// Parse the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Command, UsageError> {
    let mut opts = Options::default();
    let mut ngpus: Option<usize> = None;
    let mut nprocs: Option<usize> = None;
    let mut child_rank: Option<usize> = None;
    let mut child_nranks: Option<usize> = None;
    let mut child_id: Option<String> = None;
    let mut device_list: Option<Vec<usize>> = None;
    let mut ranks_per_gpu: Option<usize> = None;
    let mut index = 0;
    while index < args.len() {
        let arg = args[index].as_str();
        // Accept both "--opt value" and "--opt=value".
        let (name, inline_value) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg, None),
        };
        let takes_value = !matches!(
            name,
            "-h" | "--help" | "--graph" | "--emit" | "--hostid-per-rank"
        );
        let value = if takes_value {
            match inline_value {
                Some(v) => v,
                None => {
                    index += 1;
                    args.get(index)
                        .cloned()
                        .ok_or_else(|| UsageError(format!("option {name} needs a value")))?
                }
            }
        } else {
            String::new()
        };
        match name {
            "-h" | "--help" => return Ok(Command::Help),
            "--graph" => opts.graph = true,
            "--emit" => opts.emit = true,
            "--hostid-per-rank" => opts.hostid_per_rank = true,
            "--hosts" => match parse_count(&value, "--hosts")? {
                0 => {
                    return Err(UsageError(
                        "--hosts needs a number of hosts of at least 1, got '0'".into(),
                    ))
                }
                h => opts.hosts = Some(h),
            },
            "--devices" => device_list = Some(parse_device_list(&value)?),
            "--ranks-per-gpu" => ranks_per_gpu = Some(parse_ranks_per_gpu(&value)?),
            "--lib" => opts.lib = Some(PathBuf::from(value)),
            "--vs" => opts.vs = Some(PathBuf::from(value)),
            "--env-a" => opts.env_a.push(parse_env(&value)?),
            "--env-b" => opts.env_b.push(parse_env(&value)?),
            "-c" | "--coll" => {
                opts.colls = parse_list(&value, "collective", &Coll::ALL, Coll::parse, "all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall, gather, scatter, sendrecv")?
            }
            "-d" | "--dtype" => {
                opts.dtypes = parse_list(&value, "data type", &Dtype::ALL, Dtype::parse, "int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16, fp8e4m3, fp8e5m2")?
            }
            "-o" | "--op" => {
                opts.ops = parse_list(&value, "reduction op", &Op::ALL, Op::parse, "sum, prod, max, min, avg, premulsum")?
            }
            "-b" | "--minbytes" => opts.min_bytes = parse_size(&value)?,
            "-e" | "--maxbytes" => opts.max_bytes = parse_size(&value)?,
            "-f" | "--stepfactor" => {
                opts.factor = value.trim().parse().map_err(|_| {
                    UsageError(format!("-f needs an integer factor of at least 2, got '{value}'"))
                })?
            }
            "--sizes" => {
                opts.sizes = Some(value.split(',').map(parse_size).collect::<Result<_, _>>()?)
            }
            "-r" | "--root" => opts.root = parse_count(&value, "-r")?,
            "--inplace" => {
                opts.inplace = match value.as_str() {
                    "0" => vec![false],
                    "1" => vec![true],
                    "both" => vec![false, true],
                    _ => {
                        return Err(UsageError(format!(
                            "--inplace takes 0, 1 or both, got '{value}'"
                        )))
                    }
                }
            }
            "-w" | "--warmup" => opts.warmup = parse_count(&value, "-w")?,
            "-n" | "--iters" => opts.iters = parse_count(&value, "-n")?,
            "--check" => {
                opts.check = match value.as_str() {
                    "0" => false,
                    "1" => true,
                    _ => return Err(UsageError(format!("--check takes 0 or 1, got '{value}'"))),
                }
            }
            "-g" | "--ngpus" => ngpus = Some(parse_count(&value, "-g")?),
            "-p" | "--nprocs" => nprocs = Some(parse_count(&value, "-p")?),
            "--timeout" => {
                opts.timeout_s = value
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|t| t.is_finite() && *t > 0.0)
                    .ok_or_else(|| {
                        UsageError(format!("--timeout needs a positive number of seconds, got '{value}'"))
                    })?
            }
            "--trace-interval" => opts.trace_interval = Some(parse_trace_interval(&value)?),
            "--json" => opts.json = Some(PathBuf::from(value)),
            "--csv" => opts.csv = Some(PathBuf::from(value)),
            "--child-rank" => child_rank = Some(parse_count(&value, "--child-rank")?),
            "--child-nranks" => child_nranks = Some(parse_count(&value, "--child-nranks")?),
            "--child-id" => child_id = Some(value),
            _ => {
                return Err(UsageError(format!(
                    "unknown option '{arg}' (see --help)"
                )))
            }
        }
        index += 1;
    }

    (opts.layout, opts.devices) = resolve_placement(ngpus, nprocs, device_list, ranks_per_gpu)?;
    if opts.hostid_per_rank && !matches!(opts.layout, Layout::Processes(_)) {
        return Err(UsageError(
            "--hostid-per-rank needs -p (one process per rank)".into(),
        ));
    }
    if opts.hosts.is_some() && !matches!(opts.layout, Layout::Processes(_)) {
        return Err(UsageError("--hosts needs -p (one process per rank)".into()));
    }
    if opts.hosts.is_some() && opts.hostid_per_rank {
        return Err(UsageError(
            "--hosts and --hostid-per-rank both set NCCL_HOSTID: give one, not both".into(),
        ));
    }
    if opts.sizes.is_none() {
        if opts.min_bytes > opts.max_bytes {
            return Err(UsageError(format!(
                "-b ({}) is larger than -e ({})",
                opts.min_bytes, opts.max_bytes
            )));
        }
        if opts.factor < 2 && opts.min_bytes != opts.max_bytes {
            return Err(UsageError(
                "-f must be at least 2 unless -b equals -e".into(),
            ));
        }
    }
    if opts.iters == 0 {
        return Err(UsageError("-n must be at least 1".into()));
    }
    if opts.graph && opts.trace_interval.is_some() {
        return Err(UsageError(
            "--trace-interval times direct launches: a graph's replays have no per-iteration \
             times (leave out --graph)"
                .into(),
        ));
    }
    if let Layout::Processes(n) | Layout::Threadless(Some(n)) = opts.layout {
        if opts.root >= n {
            return Err(UsageError(format!(
                "root {} is out of range for {n} ranks",
                opts.root
            )));
        }
    }
    if opts.vs.is_none() && !(opts.env_a.is_empty() && opts.env_b.is_empty()) {
        return Err(UsageError(
            "--env-a and --env-b need --vs (they set a variable for one library's run)".into(),
        ));
    }
    if opts.vs.is_some() && opts.child.is_some() {
        return Err(UsageError("--vs cannot be used in a child process".into()));
    }
    match (child_rank, child_nranks, child_id) {
        (None, None, None) => {}
        (Some(rank), Some(nranks), Some(unique_id_hex)) => {
            if rank >= nranks {
                return Err(UsageError(format!("child rank {rank} >= nranks {nranks}")));
            }
            opts.child = Some(ChildRole {
                rank,
                nranks,
                unique_id_hex,
            })
        }
        _ => {
            return Err(UsageError(
                "--child-rank, --child-nranks and --child-id go together".into(),
            ))
        }
    }
    Ok(Command::Run(Box::new(opts)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Options, UsageError> {
        let owned: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match parse(&owned)? {
            Command::Run(opts) => Ok(*opts),
            Command::Help => panic!("unexpected help"),
        }
    }

    #[test]
    fn sizes_with_suffixes() {
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("17").unwrap(), 17);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("8m").unwrap(), 8 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        for bad in ["", "K", "1.5M", "-4", "12X", "1KB", "99999999999999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn per_library_variables_need_vs_and_a_name() {
        let opts = run(&[
            "--lib",
            "/o/libnccl.so.2",
            "--vs",
            "/o/libnccl.so.2",
            "--env-b",
            "OXCCL_CHECK_COLLECTIVES=1",
            "--env-b=NCCL_DEBUG=WARN",
            "--env-a",
            "X_1=",
        ])
        .unwrap();
        assert_eq!(
            opts.env_b,
            vec![
                ("OXCCL_CHECK_COLLECTIVES".into(), "1".into()),
                ("NCCL_DEBUG".into(), "WARN".into())
            ]
        );
        assert_eq!(opts.env_a, vec![("X_1".into(), String::new())]);
        assert_eq!(
            env_text(&opts.env_b),
            "OXCCL_CHECK_COLLECTIVES=1 NCCL_DEBUG=WARN"
        );
        assert!(run(&["--env-b", "A=1"]).is_err(), "needs --vs");
        for bad in ["NOVALUE", "=1", "1A=2", "A-B=1", "A B=1"] {
            assert!(run(&["--vs", "x", "--env-a", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn sweep_follows_factor_and_zero() {
        let opts = run(&["-b", "0", "-e", "64", "-f", "4"]).unwrap();
        assert_eq!(sweep_sizes(&opts), vec![0, 1, 4, 16, 64]);
        let opts = run(&["-b", "8", "-e", "100", "-f", "2"]).unwrap();
        assert_eq!(sweep_sizes(&opts), vec![8, 16, 32, 64]);
        let opts = run(&["--sizes", "0,12,1K"]).unwrap();
        assert_eq!(sweep_sizes(&opts), vec![0, 12, 1024]);
    }

    #[test]
    fn lists_and_all() {
        let opts = run(&["-c", "all", "-d", "half,fp8e4m3", "-o", "all"]).unwrap();
        assert_eq!(opts.colls.len(), 9);
        assert_eq!(opts.dtypes, vec![Dtype::Half, Dtype::Fp8E4M3]);
        assert_eq!(opts.ops.len(), 6);
        let opts = run(&["--coll=sendrecv", "--inplace", "1", "--graph"]).unwrap();
        assert_eq!(opts.colls, vec![Coll::SendRecv]);
        assert_eq!(opts.inplace, vec![true]);
        assert!(opts.graph);
    }

    #[test]
    fn layouts() {
        assert_eq!(
            run(&["-g", "2"]).unwrap().layout,
            Layout::Threadless(Some(2))
        );
        assert_eq!(run(&["-p", "4"]).unwrap().layout, Layout::Processes(4));
        assert_eq!(run(&[]).unwrap().layout, Layout::Threadless(None));
    }

    #[test]
    fn errors_are_reported() {
        let cases: &[&[&str]] = &[
            &["-c", "allreduce"],
            &["-d", "float16"],
            &["-o", "mean"],
            &["-b"],
            &["-b", "1M", "-e", "1K"],
            &["-f", "1"],
            &["--inplace", "2"],
            &["--check", "yes"],
            &["-g", "2", "-p", "2"],
            &["-g", "0"],
            &["-p", "2", "-r", "2"],
            &["-n", "0"],
            &["--timeout", "-1"],
            &["--frobnicate"],
            &["--child-rank", "0"],
        ];
        for case in cases {
            assert!(run(case).is_err(), "{case:?} should be rejected");
        }
        let message = run(&["-c", "allreduce"]).unwrap_err().0;
        assert!(message.contains("allreduce"), "{message}");
    }

    #[test]
    fn help_is_recognised() {
        assert_eq!(parse(&["--help".to_string()]).unwrap(), Command::Help);
        for option in [
            "--lib",
            "--vs",
            "--coll",
            "--dtype",
            "--op",
            "--root",
            "--inplace",
            "-b",
            "-e",
            "-f",
            "--sizes",
            "-g",
            "-p",
            "-w",
            "-n",
            "--check",
            "--graph",
            "--timeout",
            "--json",
            "--csv",
            "--devices",
            "--ranks-per-gpu",
            "--hostid-per-rank",
            "--hosts",
            "--trace-interval",
        ] {
            assert!(HELP.contains(option), "help lacks {option}");
        }
    }

    #[test]
    fn devices_list_sets_or_matches_the_rank_count() {
        let opts = run(&["--devices", "0,0,0,0"]).unwrap();
        assert_eq!(opts.layout, Layout::Threadless(Some(4)));
        assert_eq!(opts.devices, DeviceMap::List(vec![0, 0, 0, 0]));
        assert_eq!(opts.devices.devices(4), vec![0, 0, 0, 0]);
        let opts = run(&["-g", "3", "--devices", "1, 0,1"]).unwrap();
        assert_eq!(opts.layout, Layout::Threadless(Some(3)));
        assert_eq!(opts.devices.devices(3), vec![1, 0, 1]);
        let opts = run(&["--devices=0,1", "-p", "2"]).unwrap();
        assert_eq!(opts.layout, Layout::Processes(2));
        assert_eq!(opts.devices.device_of(1), 1);
        for bad in [
            &["-g", "4", "--devices", "0,0"][..],
            &["-p", "1", "--devices", "0,0"][..],
            &["--devices", ""][..],
            &["--devices", "0,,1"][..],
            &["--devices", "0,-1"][..],
            &["--devices", "a"][..],
            &["--devices", "99999999999999999999999"][..],
            &["--devices"][..],
        ] {
            assert!(run(bad).is_err(), "{bad:?} should be rejected");
        }
        let message = run(&["-g", "4", "--devices", "0,0"]).unwrap_err().0;
        assert!(
            message.contains("2 device(s)") && message.contains("-g 4"),
            "{message}"
        );
    }

    #[test]
    fn ranks_per_gpu_divides_ranks_over_devices() {
        let opts = run(&["-g", "8", "--ranks-per-gpu", "8"]).unwrap();
        assert_eq!(opts.devices.devices(8), vec![0; 8]);
        let opts = run(&["-p", "6", "--ranks-per-gpu", "4"]).unwrap();
        assert_eq!(opts.devices.devices(6), vec![0, 0, 0, 0, 1, 1]);
        let opts = run(&["--ranks-per-gpu", "2"]).unwrap();
        assert_eq!(opts.layout, Layout::Threadless(None));
        assert_eq!(opts.devices.default_nranks(3), 6);
        assert_eq!(DeviceMap::OnePerGpu.default_nranks(3), 3);
        assert_eq!(DeviceMap::OnePerGpu.devices(3), vec![0, 1, 2]);
        for bad in [
            &["--ranks-per-gpu", "0"][..],
            &["--ranks-per-gpu", "x"][..],
            &["--ranks-per-gpu", "2", "--devices", "0,0"][..],
        ] {
            assert!(run(bad).is_err(), "{bad:?} should be rejected");
        }
        let message = run(&["--ranks-per-gpu", "2", "--devices", "0,0"])
            .unwrap_err()
            .0;
        assert!(message.contains("not both"), "{message}");
    }

    #[test]
    fn placement_keeps_the_default_and_checks_the_root() {
        let opts = run(&["-g", "2"]).unwrap();
        assert_eq!(opts.devices, DeviceMap::OnePerGpu);
        assert!(!opts.hostid_per_rank);
        assert!(run(&["--devices", "0,0", "-r", "2"]).is_err());
        assert!(run(&["--devices", "0,0", "-r", "1"]).is_ok());
        assert!(devices_shared(&[0, 1, 0]));
        assert!(!devices_shared(&[0, 1, 2]));
        assert_eq!(devices_text(&[0, 0, 1]), "0,0,1");
    }

    #[test]
    fn hostid_per_rank_needs_processes() {
        let opts = run(&["-p", "2", "--hostid-per-rank"]).unwrap();
        assert!(opts.hostid_per_rank);
        let opts = run(&["--hostid-per-rank", "-p", "2", "--devices", "0,0"]).unwrap();
        assert!(opts.hostid_per_rank);
        for bad in [
            &["--hostid-per-rank"][..],
            &["-g", "2", "--hostid-per-rank"][..],
            &["--devices", "0,0", "--hostid-per-rank"][..],
        ] {
            let message = run(bad).unwrap_err().0;
            assert!(message.contains("needs -p"), "{bad:?}: {message}");
        }
    }

    #[test]
    fn hosts_interleave_ranks_over_processes() {
        let opts = run(&["-p", "4", "--ranks-per-gpu", "4", "--hosts", "2"]).unwrap();
        assert_eq!(opts.hosts, Some(2));
        assert_eq!(opts.layout, Layout::Processes(4));
        assert!(!opts.hostid_per_rank);
        assert_eq!(run(&["--hosts=3", "-p", "6"]).unwrap().hosts, Some(3));
        assert_eq!(run(&["-p", "2"]).unwrap().hosts, None);
        for (bad, says) in [
            (&["--hosts", "2"][..], "needs -p"),
            (&["-g", "4", "--hosts", "2"][..], "needs -p"),
            (&["--devices", "0,0", "--hosts", "2"][..], "needs -p"),
            (&["-p", "4", "--hosts", "0"][..], "at least 1"),
            (&["-p", "4", "--hosts", "x"][..], "--hosts"),
            (&["-p", "4", "--hosts"][..], "needs a value"),
            (
                &["-p", "4", "--hosts", "2", "--hostid-per-rank"][..],
                "not both",
            ),
        ] {
            let message = run(bad).unwrap_err().0;
            assert!(message.contains(says), "{bad:?}: {message}");
        }
    }

    #[test]
    fn trace_interval_is_milliseconds_and_not_with_graph() {
        assert_eq!(run(&[]).unwrap().trace_interval, None);
        let opts = run(&["--trace-interval", "100", "-n", "500"]).unwrap();
        assert_eq!(
            opts.trace_interval,
            Some(std::time::Duration::from_millis(100))
        );
        let opts = run(&["--trace-interval=1"]).unwrap();
        assert_eq!(
            opts.trace_interval,
            Some(std::time::Duration::from_millis(1))
        );
        for (bad, says) in [
            (&["--trace-interval", "0"][..], "at least 1"),
            (&["--trace-interval", "0.5"][..], "--trace-interval"),
            (&["--trace-interval", "-3"][..], "--trace-interval"),
            (&["--trace-interval"][..], "needs a value"),
            (&["--trace-interval", "100", "--graph"][..], "--graph"),
        ] {
            let message = run(bad).unwrap_err().0;
            assert!(message.contains(says), "{bad:?}: {message}");
        }
    }

    #[test]
    fn child_role() {
        let opts = run(&[
            "-p",
            "2",
            "--child-rank",
            "1",
            "--child-nranks",
            "2",
            "--child-id",
            "00ff",
        ])
        .unwrap();
        assert_eq!(
            opts.child,
            Some(ChildRole {
                rank: 1,
                nranks: 2,
                unique_id_hex: "00ff".into()
            })
        );
    }
}
