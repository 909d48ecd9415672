//! The registry: every setting the library reads, declared once with its name, type,
//! default, one-line description and whether NVIDIA documents it. Code reads a setting only
//! through its static here (`registry::BUFFSIZE.int()`); the C parameter API
//! (`src/api/param.rs`) binds, lists and dumps the same entries through [`ALL`].

use super::{Choice, Param};
use crate::debug::subsys;

/// Declare each setting as a `pub static` and list them all, in order, in [`ALL`].
macro_rules! registry {
    ($($(#[$doc:meta])* $id:ident = $param:expr;)*) => {
        $($(#[$doc])* pub static $id: Param = $param;)*
        /// Every registered setting, in declaration order.
        pub static ALL: &[&Param] = &[$(&$id),*];
    };
}

const fn choice(name: &'static str, value: u64, description: &'static str) -> Choice {
    Choice {
        name,
        value,
        description,
    }
}

/// `NCCL_DEBUG`'s levels, with `ncclDebugLogLevel`'s values.
const DEBUG_LEVELS: &[Choice] = &[
    choice("VERSION", 1, "Prints the NCCL version only."),
    choice("WARN", 2, "Prints error messages."),
    choice("INFO", 3, "Prints debug information."),
    choice("ABORT", 4, ""),
    choice(
        "TRACE",
        5,
        "Prints replayable trace information on every call.",
    ),
];

/// `NCCL_DEBUG_TIMESTAMP_LEVELS`' levels: bit `1 << level` for each of `NCCL_DEBUG`'s levels.
const TIMESTAMP_LEVELS: &[Choice] = &[
    choice("VERSION", 1 << 1, "on NCCL version info message"),
    choice("WARN", 1 << 2, "on Explicit error message"),
    choice("INFO", 1 << 3, "on Debug message"),
    choice("ABORT", 1 << 4, ""),
    choice("TRACE", 1 << 5, "on Replayable trace message"),
    choice("ALL", 0b11_1110, "on All messages"),
];

/// `NCCL_DEBUG_SUBSYS`'s subsystems, with the bits of `crate::debug::subsys`.
const DEBUG_SUBSYSTEMS: &[Choice] = &[
    choice(
        "INIT",
        subsys::INIT as u64,
        "Initialization (included in default)",
    ),
    choice("COLL", subsys::COLL as u64, "Collective operations"),
    choice("P2P", subsys::P2P as u64, "Peer-to-peer transport"),
    choice("SHM", subsys::SHM as u64, "Shared memory transport"),
    choice("NET", subsys::NET as u64, "Network transport"),
    choice("GRAPH", subsys::GRAPH as u64, "Topology and graph search"),
    choice(
        "TUNING",
        subsys::TUNING as u64,
        "Algorithm and protocol tuning",
    ),
    choice(
        "ENV",
        subsys::ENV as u64,
        "Settings read from the environment or a configuration file (included in default)",
    ),
    choice("ALLOC", subsys::ALLOC as u64, "Memory allocation"),
    choice("CALL", subsys::CALL as u64, "API calls"),
    choice("PROXY", subsys::PROXY as u64, "Proxy operations"),
    choice("NVLS", subsys::NVLS as u64, "NVLink SHARP"),
    choice(
        "BOOTSTRAP",
        subsys::BOOTSTRAP as u64,
        "Bootstrap network (included in default)",
    ),
    choice("REG", subsys::REG as u64, "Buffer registration"),
    choice("PROFILE", subsys::PROFILE as u64, "Profiling"),
    choice(
        "RAS",
        subsys::RAS as u64,
        "Reliability, availability and serviceability",
    ),
    choice(
        "DESTROY",
        subsys::DESTROY as u64,
        "Communicator destroy, abort, revoke, and plugin unload/close operations",
    ),
    choice(
        "ALLOC_HOST",
        subsys::ALLOC_HOST as u64,
        "Host memory allocation",
    ),
    choice("ALL", u64::MAX, "Every subsystem"),
];

registry! {
    // ---- configuration and logging ----
    CONF_FILE = Param::text("NCCL_CONF_FILE", None,
        "Path of a configuration file of NAME=value lines read instead of ~/.nccl.conf");
    DEBUG = Param::one_of("NCCL_DEBUG", "ncclDebugLogLevel", DEBUG_LEVELS,
        "Debug output level; each level includes the less verbose ones");
    DEBUG_SUBSYS = Param::list_of("NCCL_DEBUG_SUBSYS", DEBUG_SUBSYSTEMS, "INIT,ENV,BOOTSTRAP",
        "Subsystems whose INFO output is shown (comma-separated, ^ to exclude)");
    DEBUG_FILE = Param::text("NCCL_DEBUG_FILE", None,
        "File for the debug output instead of stdout; %h is replaced by the host name, %p by the pid");
    DEBUG_TIMESTAMP_LEVELS = Param::list_of("NCCL_DEBUG_TIMESTAMP_LEVELS", TIMESTAMP_LEVELS, "WARN",
        "Set which log lines get a timestamp depending upon the level of the log");
    DEBUG_TIMESTAMP_FORMAT = Param::text("NCCL_DEBUG_TIMESTAMP_FORMAT", Some("[%F %T] "),
        "strftime format of the timestamp of a log line; %Nf adds N digits of subseconds, _ stands for a space");
    WARN_ENABLE_DEBUG_INFO = Param::boolean("NCCL_WARN_ENABLE_DEBUG_INFO", false,
        "If enabled, the debug level will be set to INFO after a WARN level debug message is logged");
    PARAM_DUMP_ALL = Param::boolean("NCCL_PARAM_DUMP_ALL", false,
        "Include undocumented parameters in ncclParamDumpAll").with_words().undocumented();

    // ---- host identity and bootstrap ----
    HOSTID = Param::text("NCCL_HOSTID", None,
        "Host identifier used instead of the host name and boot id to tell hosts apart");
    COMM_ID = Param::text("NCCL_COMM_ID", None,
        "Address (<host>:<port>) of the bootstrap root, in place of the unique id's");
    BOOTSTRAP_TIMEOUT = Param::integer("NCCL_BOOTSTRAP_TIMEOUT", 300,
        "Seconds the bootstrap waits for its peers before failing").undocumented();
    SOCKET_IFNAME = Param::text("NCCL_SOCKET_IFNAME", None,
        "IP interfaces to use: prefixes, comma-separated; ^ excludes, = matches exactly");
    SOCKET_FAMILY = Param::text("NCCL_SOCKET_FAMILY", None,
        "Address family of the interfaces to use: AF_INET or AF_INET6");
    DEAD_PEER_S = Param::integer("OXCCL_DEAD_PEER_S", 60,
        "Seconds of silence after which a bootstrap peer is taken as dead (0: never)").undocumented();

    // ---- transports ----
    P2P_DISABLE = Param::boolean("NCCL_P2P_DISABLE", false,
        "Disable the peer-to-peer transport (direct GPU-to-GPU over NVLink or PCI)");
    P2P_LEVEL = Param::text("NCCL_P2P_LEVEL", None,
        "Farthest path between GPUs that still uses peer-to-peer: LOC, NVL, PIX, PXB, PHB, SYS or a number");
    SHM_DISABLE = Param::boolean("NCCL_SHM_DISABLE", false,
        "Disable the shared memory transport");
    MULTI_RANK_GPU_ENABLE = Param::boolean("NCCL_MULTI_RANK_GPU_ENABLE", false,
        "Allow several ranks of a communicator on the same GPU").undocumented();
    BUFFSIZE = Param::integer("NCCL_BUFFSIZE", 4 << 20,
        "Size in bytes of the buffer used between each pair of ranks");
    NET = Param::text("NCCL_NET", None,
        "Network to use, by name (e.g. IB or Socket, or a plugin's)");
    IGNORE_CPU_AFFINITY = Param::boolean("NCCL_IGNORE_CPU_AFFINITY", false,
        "Use the CPUs of the GPU's NUMA node for the library's threads even outside the process's CPU affinity");
    RUNTIME_CONNECT = Param::boolean("NCCL_RUNTIME_CONNECT", true,
        "Dynamically connect peers during runtime (e.g., calling ncclAllreduce()) instead of init stage");
    TUNER_PLUGIN = Param::text("NCCL_TUNER_PLUGIN", None,
        "Tuner plugin library: a name x tries x then libnccl-tuner-x.so, a path is used as is, none loads nothing; unset tries libnccl-tuner.so, then the net plugin's library");
    NET_PLUGIN = Param::text("NCCL_NET_PLUGIN", None,
        "Network plugin library to load (a name, a suffix of libnccl-net-<name>.so, or a path)");
    NET_GDR_LEVEL = Param::text("NCCL_NET_GDR_LEVEL", None,
        "Farthest path between NIC and GPU that still uses GPU Direct RDMA: LOC, PIX, PXB, PHB, SYS");
    NET_GDR_READ = Param::integer("NCCL_NET_GDR_READ", -2,
        "Use GPU Direct RDMA for sends as well (1) or not (0); -2: automatic");
    DMABUF_ENABLE = Param::boolean("NCCL_DMABUF_ENABLE", true,
        "Register GPU memory with the network through DMA-BUF where supported");
    SOCKET_SNDBUF = Param::integer("NCCL_SOCKET_SNDBUF", -1,
        "Kernel send buffer bytes (SO_SNDBUF) of the socket network's sockets; -1: the system's");
    SOCKET_RCVBUF = Param::integer("NCCL_SOCKET_RCVBUF", -1,
        "Kernel receive buffer bytes (SO_RCVBUF) of the socket network's sockets; -1: the system's");
    SOCKET_NTHREADS = Param::integer("NCCL_SOCKET_NTHREADS", -2,
        "Threads per connection of the socket transport (-2: automatic)");
    NSOCKS_PERTHREAD = Param::integer("NCCL_NSOCKS_PERTHREAD", -2,
        "Sockets per thread of the socket transport (-2: automatic)");

    // ---- the InfiniBand / RoCE network (NET/IB) ----
    IB_DISABLE = Param::boolean("NCCL_IB_DISABLE", false,
        "Disable the InfiniBand/RoCE network (IB verbs); the socket network is used instead");
    IB_HCA = Param::text("NCCL_IB_HCA", None,
        "HCA ports to use: name[:port] prefixes, comma-separated; ^ excludes, = matches exactly");
    IB_GID_INDEX = Param::integer("NCCL_IB_GID_INDEX", -1,
        "RoCE GID index to use (-1: the first of NCCL_IB_ROCE_VERSION_NUM in NCCL_IB_ADDR_FAMILY)");
    IB_ROCE_VERSION_NUM = Param::integer("NCCL_IB_ROCE_VERSION_NUM", 2,
        "RoCE version of the GID chosen automatically (1 or 2)");
    IB_ADDR_FAMILY = Param::text("NCCL_IB_ADDR_FAMILY", Some("AF_INET"),
        "Address family of the RoCE GID chosen automatically: AF_INET or AF_INET6");
    IB_TC = Param::integer("NCCL_IB_TC", -1,
        "InfiniBand traffic class (RoCE: the GRH traffic class) of the queue pairs (-1: the communicator's ncclConfig_t.trafficClass if set, else 0)");
    IB_SL = Param::integer("NCCL_IB_SL", -1,
        "InfiniBand service level of the queue pairs (-1: the communicator's ncclConfig_t.trafficClass if set and below 16, else 0)");
    IB_TIMEOUT = Param::integer("NCCL_IB_TIMEOUT", 20,
        "InfiniBand local ACK timeout exponent (4.096 us * 2^timeout), 1..31");
    IB_RETRY_CNT = Param::integer("NCCL_IB_RETRY_CNT", 7,
        "InfiniBand transport retry count, 0..7");
    IB_ROUTABLE_FLID_GID_INDEX = Param::integer("NCCL_IB_ROUTABLE_FLID_GID_INDEX", 1,
        "GID index of an InfiniBand port used when it holds a routable FLID (routing to other subnets)");
    IB_DEVICE_PCI_ORDER = Param::boolean("NCCL_IB_DEVICE_PCI_ORDER", true,
        "Number the IB devices in the order of their PCI bus ids");
    IB_MQP_RETRY_ALL = Param::boolean("NCCL_IB_MQP_RETRY_ALL", false,
        "Retry ibv_modify_qp after any error, not only after ETIMEDOUT");
    IB_MQP_RETRY_CNT = Param::integer("NCCL_IB_MQP_RETRY_CNT", 34,
        "Number of times a failed ibv_modify_qp is retried");
    IB_MQP_RETRY_SLEEP_MSEC = Param::integer("NCCL_IB_MQP_RETRY_SLEEP_MSEC", 100,
        "Milliseconds slept before the n-th retry of ibv_modify_qp, times n");
    IB_PKEY = Param::integer("NCCL_IB_PKEY", 0,
        "InfiniBand partition key index of the queue pairs");
    IB_QPS_PER_CONNECTION = Param::integer("NCCL_IB_QPS_PER_CONNECTION", 1,
        "Queue pairs per connection (1..16)");
    IB_SPLIT_DATA_ON_QPS = Param::integer("NCCL_IB_SPLIT_DATA_ON_QPS", 0,
        "Stripe each message over the connection's queue pairs (1) or send whole messages round them (0)");
    IB_ADAPTIVE_ROUTING = Param::integer("NCCL_IB_ADAPTIVE_ROUTING", -2,
        "Adaptive-routing-safe transfers: data as plain writes, then a write with immediate (-2: on for InfiniBand, off for RoCE)");
    IB_AR_THRESHOLD = Param::integer("NCCL_IB_AR_THRESHOLD", 8192,
        "Bytes above which a message uses the adaptive-routing path");
    GDR_FLUSH_DISABLE = Param::boolean("NCCL_GDR_FLUSH_DISABLE", false,
        "Do not flush GPU memory received by GPU Direct RDMA with an RDMA read");
    IBVERBS_LIB = Param::text("NCCL_IBVERBS_LIB", None,
        "The verbs library to open first (then libibverbs.so, libibverbs.so.1)");
    IB_ADDR_RANGE = Param::text("NCCL_IB_ADDR_RANGE", None,
        "Subnet (address/prefix length, of NCCL_IB_ADDR_FAMILY) the RoCE GID chosen automatically must be in");
    IB_FIFO_TC = Param::integer("NCCL_IB_FIFO_TC", -1,
        "RoCE traffic class of the receiver's queue pairs, which carry the clear-to-send writes (-1: the sender's NCCL_IB_TC)");
    IB_USE_INLINE = Param::boolean("NCCL_IB_USE_INLINE", false,
        "Post the clear-to-send writes as inline data");
    IB_ECE_ENABLE = Param::boolean("NCCL_IB_ECE_ENABLE", true,
        "Negotiate Enhanced Connection Establishment options between the queue pairs where the device supports it");
    IB_RETURN_ASYNC_EVENTS = Param::boolean("NCCL_IB_RETURN_ASYNC_EVENTS", true,
        "A fatal async event of a device (port error, device fatal) fails its connections' requests (0: only logged)");

    // ---- channels, threads, algorithms ----
    NTHREADS = Param::integer("NCCL_NTHREADS", 0,
        "CUDA threads per block: 64, 128, 256 or 512 (0: the default)");
    MIN_NCHANNELS = Param::integer("NCCL_MIN_NCHANNELS", 1,
        "Fewest channels (CTAs) to use; older name of NCCL_MIN_CTAS");
    MAX_NCHANNELS = Param::integer("NCCL_MAX_NCHANNELS", 64,
        "Most channels (CTAs) to use; older name of NCCL_MAX_CTAS");
    MIN_NRINGS = Param::integer("NCCL_MIN_NRINGS", 1,
        "Legacy name of NCCL_MIN_NCHANNELS (which wins when both are set)").undocumented();
    MAX_NRINGS = Param::integer("NCCL_MAX_NRINGS", 64,
        "Legacy name of NCCL_MAX_NCHANNELS (which wins when both are set)").undocumented();
    MIN_CTAS = Param::integer("NCCL_MIN_CTAS", 1,
        "Fewest CTAs to use (default: NCCL_MIN_NCHANNELS)");
    MAX_CTAS = Param::integer("NCCL_MAX_CTAS", 64,
        "Most CTAs to use (default: NCCL_MAX_NCHANNELS)");
    MIN_P2P_NCHANNELS = Param::integer("NCCL_MIN_P2P_NCHANNELS", 1,
        "Fewest channels one point-to-point operation is split over").undocumented();
    MAX_P2P_NCHANNELS = Param::integer("NCCL_MAX_P2P_NCHANNELS", 32,
        "Most channels one point-to-point operation is split over").undocumented();
    ALGO = Param::text("NCCL_ALGO", None,
        "Algorithms to use: a comma-separated list, ^ to exclude, per collective with <coll>:<list>");
    PROTO = Param::text("NCCL_PROTO", None,
        "Protocols to use (LL, LL128, Simple): a comma-separated list, ^ to exclude");
    CGA_CLUSTER_SIZE = Param::integer("NCCL_CGA_CLUSTER_SIZE", 0,
        "CUDA thread block cluster size of the kernels (0..8; 0: none)");

    // ---- communicators ----
    COMM_BLOCKING = Param::boolean("NCCL_COMM_BLOCKING", true,
        "Whether calls block (1) or return ncclInProgress (0) by default");
    COMM_SPLIT_SHARE_RESOURCES = Param::boolean("NCCL_COMM_SPLIT_SHARE_RESOURCES", false,
        "Whether communicators made by ncclCommSplit share their parent's resources by default");
    COMM_SHRINK_SHARE_RESOURCES = Param::boolean("NCCL_COMM_SHRINK_SHARE_RESOURCES", false,
        "Whether communicators made by ncclCommShrink share their parent's resources by default");

    // ---- reliability and progress ----
    RAS_ENABLE = Param::boolean("NCCL_RAS_ENABLE", true,
        "Enable the RAS (reliability, availability, serviceability) subsystem");
    RAS_ADDR = Param::text("NCCL_RAS_ADDR", Some("localhost:28028"),
        "Address (<host>:<port>) the RAS subsystem listens on for client connections");
    HANG_REPORT_S = Param::integer("OXCCL_HANG_REPORT_S", 60,
        "Seconds an operation may go without progress before the watchdog reports it (0: never)").undocumented();
    HANG_ERROR = Param::boolean("OXCCL_HANG_ERROR", false,
        "Whether a reported hang also fails the communicator").undocumented();
    CHECK_MODE = Param::text("NCCL_CHECK_MODE", None,
        "DEBUG_LOCAL: each call's buffers are checked with the driver; DEBUG_GLOBAL: also every rank's calls against each other");
    CHECK_POINTERS = Param::boolean("NCCL_CHECK_POINTERS", false,
        "Check each call's buffers with the driver (older form of NCCL_CHECK_MODE=DEBUG_LOCAL)");
    CHECK_COLLECTIVES = Param::boolean("OXCCL_CHECK_COLLECTIVES", false,
        "Check that every rank calls the same collectives with matching arguments").undocumented();
    YIELD = Param::boolean("OXCCL_YIELD", true,
        "Let a kernel waiting on a peer yield its GPU to other work").undocumented();
    YIELD_SPIN_US = Param::integer("OXCCL_YIELD_SPIN_US", 30,
        "Microseconds a waiting kernel spins before yielding (1..1000000)").undocumented();
    YIELD_RESUMES = Param::integer("OXCCL_YIELD_RESUMES", -1,
        "Kernel launches after the first of a yielding operation, at most 32 (below 1: by ring size)").undocumented();

    // ---- one-rank copies (`sched::cost`) ----
    ONE_RANK_KERNEL_COPY_MAX = Param::integer("OXCCL_ONE_RANK_KERNEL_COPY_MAX", 4 << 20,
        "Bytes from which a one-rank communicator's copies go to the copy engine instead of the copy kernel").undocumented();
    ONE_RANK_COPY_CTA_BYTES = Param::integer("OXCCL_ONE_RANK_COPY_CTA_BYTES", 16 << 10,
        "Bytes per CTA of a one-rank communicator's copy kernel").undocumented();
    ONE_RANK_COPY_THREADS = Param::integer("OXCCL_ONE_RANK_COPY_THREADS", 512,
        "Threads per CTA of a one-rank communicator's copy kernel (a multiple of 32 in 32..=512)").undocumented();

    // ---- diagnostics ----
    HOST_PROFILE = Param::boolean("OXCCL_HOST_PROFILE", false,
        "Time the stages of every collective call on the host and print them at exit (read once)").undocumented();

    // ---- bandwidth-weighted channels ----
    WEIGHTED_CHANNELS = Param::boolean("OXCCL_WEIGHTED_CHANNELS", true,
        "Give network devices channels and bytes in proportion to their speed (0: even, as NVIDIA's)").undocumented();
    NET_SPEEDS = Param::text("OXCCL_NET_SPEEDS", None,
        "Network device speeds overriding what the devices report: name=Mbit/s,...").undocumented();

    // ---- network devices per GPU ----
    NETDEVS_POLICY = Param::text("NCCL_NETDEVS_POLICY", Some("AUTO"),
        "How many of its closest network devices a GPU uses: AUTO (shared among the GPUs as close), ALL, MAX:<n>");
    IB_PCI_RELAXED_ORDERING = Param::integer("NCCL_IB_PCI_RELAXED_ORDERING", 2,
        "Register memory with PCI relaxed ordering: 0 off, 1 on, 2 where the verbs library and device allow it");

    // Self-correcting channel weights (`core::adaptive`).
    ADAPTIVE_WEIGHTS = Param::boolean("OXCCL_ADAPTIVE_WEIGHTS", true,
        "Re-agree the network devices' channel weights from measured throughput while a communicator runs (needs it on every rank)").undocumented();
    ADAPTIVE_PERIOD_MS = Param::integer("OXCCL_ADAPTIVE_PERIOD_MS", 200,
        "Milliseconds between two exchanges of measured network rates for adaptive channel weights").undocumented();
    ADAPTIVE_QUEUE_MS = Param::integer("OXCCL_ADAPTIVE_QUEUE_MS", 200,
        "With adaptive channel weights: most milliseconds of large collectives (estimated at the speeds in use) that may wait ahead of the GPU behind the running one, so that new weights reach the next collectives").undocumented();

    // ---- topology files (`topo::file`) ----
    TOPO_FILE = Param::text("NCCL_TOPO_FILE", None,
        "XML topology file describing the node; what it says replaces detection (NVLink counts, PCI places, network speeds)");
    TOPO_DUMP_FILE = Param::text("NCCL_TOPO_DUMP_FILE", None,
        "File to write the node's topology to, in NCCL_TOPO_FILE's format");
    TOPO_DUMP_FILE_RANK = Param::integer("NCCL_TOPO_DUMP_FILE_RANK", 0,
        "Rank that writes NCCL_TOPO_DUMP_FILE").undocumented();

    // ---- IB: the ports of one NIC as one device ----
    IB_MERGE_NICS = Param::boolean("NCCL_IB_MERGE_NICS", true,
        "Use the ports of one physical NIC (one PCI device, any function) as one network device whose connections stripe over all of them");
}

/// The registered setting named `name` (the full `NCCL_`/`OXCCL_` name).
pub fn find(name: &str) -> Option<&'static Param> {
    ALL.iter().copied().find(|p| p.name == name)
}

/// Whether `param` is one of the registry's entries (not a `Param` made elsewhere).
pub fn is_registered(param: &Param) -> bool {
    ALL.iter().any(|p| std::ptr::eq(*p, param))
}
