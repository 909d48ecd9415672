//! The C ABI of NCCL 2.32.3: every `#[repr(C)]` type, enum and constant that crosses the
//! library boundary. cbindgen generates `include/nccl.h` from these definitions (see
//! `cbindgen.toml`), so names follow NVIDIA's header exactly.
//!
//! Enums arrive from C as plain integers and may hold any value, so entry points take the
//! `Raw*` wrappers (rendered as the enum's C name in the header) and convert them with a
//! checked `TryFrom`; the Rust enums are only ever built from valid values.
#![allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    clippy::upper_case_acronyms
)]

use std::os::raw::{c_char, c_int, c_uint, c_void};

pub const NCCL_MAJOR: c_int = 2;
pub const NCCL_MINOR: c_int = 32;
pub const NCCL_PATCH: c_int = 3;
/// The version of the header (the ABI): NVIDIA's 2.32.3.
pub const NCCL_VERSION_CODE: c_int = 23203;
/// The version `ncclGetVersion` reports: the newest NVIDIA release whose every entry point
/// oxccl answers for real (callers test it to decide which features to use). The device API
/// (`ncclDevCommCreate` and its kernels) is the exception: it answers "not yet supported".
pub const RUNTIME_VERSION_CODE: c_int = NCCL_VERSION_CODE;
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
pub const NCCL_UNDEF_FLOAT: f32 = -1.0;
pub const NCCL_WIN_DEFAULT: c_int = 0x00;
pub const NCCL_WIN_COLL_SYMMETRIC: c_int = 0x01;
pub const NCCL_WIN_STRICT_ORDERING: c_int = 0x02;
/// Restrict window registration to GIN only.
pub const NCCL_WIN_GIN_ONLY: c_int = 0x04;
/// Restrict window registration to CFT COUNTED only.
pub const NCCL_WIN_CFT_COUNTED: c_int = 0x08;
pub const NCCL_WIN_REQUIRED_ALIGNMENT: usize = 4096;
pub const NCCL_CTA_POLICY_DEFAULT: c_int = 0x00;
pub const NCCL_CTA_POLICY_EFFICIENCY: c_int = 0x01;
pub const NCCL_CTA_POLICY_ZERO: c_int = 0x02;
pub const NCCL_SHRINK_DEFAULT: c_int = 0x00;
pub const NCCL_SHRINK_ABORT: c_int = 0x01;
pub const NCCL_REVOKE_DEFAULT: c_int = 0x00;
/// `ncclCommSuspend` flag: release the communicator's dynamic GPU memory.
pub const NCCL_SUSPEND_MEM: c_int = 0x01;
/// The `magic` of every initialised versioned struct (config, per-call config, encryption).
pub const NCCL_API_MAGIC: c_uint = 0xcafe_beef;
/// `ncclConfig_t::magic` of an initialised config.
pub const NCCL_CONFIG_MAGIC: c_uint = NCCL_API_MAGIC;
/// `ncclSimInfo_t::magic` of an initialised sim info.
pub const NCCL_SIM_INFO_MAGIC: c_uint = 0x7468_5283;

/// Opaque communicator handed to C (`struct ncclComm*`).
/// cbindgen:no-export
#[repr(C)]
pub struct ncclComm {
    _opaque: [u8; 0],
}
pub type ncclComm_t = *mut ncclComm;

/// Opaque window handle (`struct ncclWindow_vidmem*`).
/// cbindgen:no-export
#[repr(C)]
pub struct ncclWindow_vidmem {
    _opaque: [u8; 0],
}
pub type ncclWindow_t = *mut ncclWindow_vidmem;

/// CUDA's stream type; the header takes `cudaStream_t` from `cuda_runtime.h`.
#[repr(C)]
pub struct CUstream_st {
    _opaque: [u8; 0],
}
pub type cudaStream_t = *mut CUstream_st;

/// The 128 opaque bytes every rank needs to join a communicator.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ncclResult_t {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclTimeout = 8,
    ncclNumResults = 9,
}

impl ncclResult_t {
    /// The result for a raw code read back from C (unknown codes become `None`).
    pub fn from_raw(code: c_int) -> Option<Self> {
        use ncclResult_t::*;
        Some(match code {
            0 => ncclSuccess,
            1 => ncclUnhandledCudaError,
            2 => ncclSystemError,
            3 => ncclInternalError,
            4 => ncclInvalidArgument,
            5 => ncclInvalidUsage,
            6 => ncclRemoteError,
            7 => ncclInProgress,
            8 => ncclTimeout,
            9 => ncclNumResults,
            _ => return None,
        })
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ncclRedOp_dummy_t {
    ncclNumOps_dummy = 5,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ncclRedOp_t {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    ncclNumOps = 5,
    ncclMaxRedOp = 0x7fff_ffff,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ncclDataType_t {
    ncclInt8 = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclFloat32 = 7,
    ncclFloat64 = 8,
    ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
    ncclNumTypes = 12,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ncclScalarResidence_t {
    ncclScalarDevice = 0,
    ncclScalarHostImmediate = 1,
}

/// A result code as C passes it (rendered `ncclResult_t` in the header).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawResult(pub c_int);
/// A data type as C passes it (rendered `ncclDataType_t`).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawDataType(pub c_int);
/// A reduction op as C passes it (rendered `ncclRedOp_t`); may be a dynamic op handle.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawRedOp(pub c_int);
/// A scalar residence as C passes it (rendered `ncclScalarResidence_t`).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawScalarResidence(pub c_int);

/// Communicator configuration, NCCL 2.31+ layout (`struct ncclConfig_v23100`).
/// Callers built against older headers pass a shorter struct: read only `size` bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclConfig_v23100 {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
    pub trafficClass: c_int,
    pub commName: *const c_char,
    pub collnetEnable: c_int,
    pub CTAPolicy: c_int,
    pub shrinkShare: c_int,
    pub nvlsCTAs: c_int,
    pub nChannelsPerNetPeer: c_int,
    pub nvlinkCentricSched: c_int,
    pub graphUsageMode: c_int,
    pub numRmaCtx: c_int,
    pub maxP2pPeers: c_int,
    pub graphStreamOrdering: c_int,
    pub launchOrderImplicit: c_int,
    pub numRmaSig: c_int,
    pub rmaEagerInit: c_int,
    pub hostCftMode: c_int,
    pub nvlsHostMode: c_int,
}
pub type ncclConfig_t = ncclConfig_v23100;

impl Default for ncclConfig_v23100 {
    /// The same values as `NCCL_CONFIG_INITIALIZER`.
    fn default() -> Self {
        let u = NCCL_CONFIG_UNDEF_INT;
        ncclConfig_v23100 {
            size: std::mem::size_of::<ncclConfig_t>(),
            magic: NCCL_API_MAGIC,
            version: NCCL_VERSION_CODE as c_uint,
            blocking: u,
            cgaClusterSize: u,
            minCTAs: u,
            maxCTAs: u,
            netName: std::ptr::null(),
            splitShare: u,
            trafficClass: u,
            commName: std::ptr::null(),
            collnetEnable: u,
            CTAPolicy: u,
            shrinkShare: u,
            nvlsCTAs: u,
            nChannelsPerNetPeer: u,
            nvlinkCentricSched: u,
            graphUsageMode: u,
            numRmaCtx: u,
            maxP2pPeers: u,
            graphStreamOrdering: u,
            launchOrderImplicit: u,
            numRmaSig: u,
            rmaEagerInit: u,
            hostCftMode: u,
            nvlsHostMode: u,
        }
    }
}

/// `ncclConfig_t::hostCftMode` values.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ncclHostCftMode_t {
    ncclHostCftDefault = -2147483648,
    ncclHostCftEnable = 1,
    ncclHostCftDisable = 2,
    ncclHostCftFallback = 3,
}

/// `ncclConfig_t::nvlsHostMode` flags (host NVLS components to disable; may be combined).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ncclNvlsHostMode_t {
    ncclNvlsHostModeDefault = -2147483648,
    ncclNvlsHostModeEnable = 0,
    ncclNvlsHostModeDisableTransport = 1,
    ncclNvlsHostModeDisableSymmetricMultimem = 2,
    ncclNvlsHostModeDisable = 2147483647,
}

/// The key of one vendor option of an `ncclConfigExt_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclConfigExtKey {
    pub vendorId: c_int,
    pub optionId: c_int,
}

/// The value of one vendor option of an `ncclConfigExt_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ncclConfigExtVal {
    pub i: c_int,
    pub s: *const c_char,
    pub raw: *mut c_void,
}

/// One vendor-specific option of a per-call configuration, chained through `next`. oxccl
/// has no options of its own and ignores every one, as NVIDIA's library does.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclConfigExt {
    pub next: *mut ncclConfigExt,
    pub key: ncclConfigExtKey,
    pub val: ncclConfigExtVal,
}
pub type ncclConfigExt_t = ncclConfigExt;

/// CUDA's event type; the header takes `cudaEvent_t` from `cuda_runtime.h`.
#[repr(C)]
pub struct CUevent_st {
    _opaque: [u8; 0],
}
pub type cudaEvent_t = *mut CUevent_st;

/// Per-call configuration of the `ncclXConfig` collectives (`struct ncclCollConfig_v23200`).
/// Read by the caller's `size`, like `ncclConfig_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclCollConfig_v23200 {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub ext: *mut ncclConfigExt_t,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub nvlsCTAs: c_int,
    pub cgaClusterSize: c_int,
    pub algSelection: *const c_char,
    pub forceAlgSelection: c_int,
    pub CTAPolicy: c_int,
    pub userProfilerTag: u64,
    pub launchCompletionEvent: cudaEvent_t,
}
pub type ncclCollConfig_t = ncclCollConfig_v23200;

impl Default for ncclCollConfig_v23200 {
    /// The same values as `NCCL_COLLCONFIG_INITIALIZER`.
    fn default() -> Self {
        let u = NCCL_CONFIG_UNDEF_INT;
        ncclCollConfig_v23200 {
            size: std::mem::size_of::<ncclCollConfig_t>(),
            magic: NCCL_API_MAGIC,
            version: NCCL_VERSION_CODE as c_uint,
            ext: std::ptr::null_mut(),
            minCTAs: u,
            maxCTAs: u,
            nvlsCTAs: u,
            cgaClusterSize: u,
            algSelection: std::ptr::null(),
            forceAlgSelection: 1,
            CTAPolicy: u,
            userProfilerTag: 0,
            launchCompletionEvent: std::ptr::null_mut(),
        }
    }
}

/// The statistics `ncclCommMemStats` reports.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ncclCommMemStat_t {
    /// Allocated GPU memory that can be suspended (bytes).
    ncclStatGpuMemSuspend = 0,
    /// Whether the GPU memory is suspended (0 active, 1 suspended).
    ncclStatGpuMemSuspended = 1,
    /// Allocated GPU memory that cannot be suspended (bytes).
    ncclStatGpuMemPersist = 2,
    /// Total GPU memory tracked by the communicator (bytes).
    ncclStatGpuMemTotal = 3,
}

/// A memory statistic as C passes it (rendered `ncclCommMemStat_t`).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawCommMemStat(pub c_int);

/// How many signals to wait for from one peer on one signal index and context.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ncclWaitSignalDesc_t {
    pub opCnt: c_int,
    pub peer: c_int,
    pub sigIdx: c_int,
    pub ctx: c_int,
}

/// `ncclEncryptionConfig_t::mode`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ncclEncryptionMode_t {
    NCCL_ENCRYPTION_MODE_NONE = 0,
    NCCL_ENCRYPTION_MODE_PSK = 1,
}

/// Encryption of the library's TCP sockets (`struct ncclEncryptionConfig_v23200`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclEncryptionConfig_v23200 {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub mode: c_int,
    pub psk: *const c_char,
}
pub type ncclEncryptionConfig_t = ncclEncryptionConfig_v23200;

/// Opaque handle of one parameter (`struct ncclParamHandle*`).
/// cbindgen:no-export
#[repr(C)]
pub struct ncclParamHandle {
    _opaque: [u8; 0],
}
pub type ncclParamHandle_t = *mut ncclParamHandle;

/// Simulation results of `ncclGroupSimulateEnd` (`struct ncclSimInfo_v22200`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclSimInfo_v22200 {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub estimatedTime: f32,
}
pub type ncclSimInfo_t = ncclSimInfo_v22200;

// ---- Device-API host types (nccl_device/core.h). Only what the host functions touch. ----

/// A team of ranks (`struct ncclTeam`), returned by value from the team functions.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ncclTeam {
    pub nRanks: c_int,
    pub rank: c_int,
    pub stride: c_int,
}
pub type ncclTeam_t = ncclTeam;

/// Opaque device-API structs: we never read them until the device API is built.
#[repr(C)]
pub struct ncclDevComm {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct ncclDevCommRequirements {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct ncclDevResourceRequirements {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct ncclLsaBarrierHandle {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct ncclGinBarrierHandle {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct ncclLLA2AHandle {
    _opaque: [u8; 0],
}

/// A multimem handle (`struct ncclMultimemHandle`), passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclMultimemHandle {
    pub mcBasePtr: *mut c_void,
}
pub type ncclMultimemHandle_t = ncclMultimemHandle;

/// The CFT team layouts of `ncclTeamCft` (`ncclCftTeamMode_t`), as C passes them.
pub type ncclCftTeamMode_t = c_int;
/// A CFT load/store endpoint id.
pub type ncclCftLeId = u32;

/// GIN outbox and all-to-all inbox handles: never filled, GIN is not built.
#[repr(C)]
pub struct ncclGinOutboxHandle {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct ncclGinInboxA2AHandle {
    _opaque: [u8; 0],
}

/// GIN backends (`ncclGinType_t`).
pub const NCCL_GIN_TYPE_NONE: c_int = 0;
/// GIN connection layouts (`ncclGinConnectionType_t`).
pub const NCCL_GIN_CONNECTION_NONE: c_int = 0;

/// What a communicator supports (`struct ncclCommProperties`, nccl_device/host.h), written by
/// `ncclCommQueryProperties` up to the caller's `size`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclCommProperties {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub rank: c_int,
    pub nRanks: c_int,
    pub cudaDev: c_int,
    pub nvmlDev: c_int,
    pub deviceApiSupport: bool,
    pub multimemSupport: bool,
    pub ginType: c_int,
    pub nLsaTeams: c_int,
    pub hostRmaSupport: bool,
    pub railedGinType: c_int,
    pub commHash: u64,
    pub ginMinStride: c_int,
    pub ginConnectionType: c_int,
    pub ginSupport: [bool; 64],
    pub devCommRuntimeVersionSize: usize,
    pub cftSupport: bool,
    pub cftMulticastSupport: bool,
    pub cftCountedSupport: bool,
}
pub type ncclCommProperties_t = ncclCommProperties;

/// The header every versioned struct of the API starts with (`ncclConfig_t`,
/// `ncclCollConfig_t`, `ncclEncryptionConfig_t`, `ncclCommProperties_t`, ...).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VersionedHeader {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
}

/// A caller's versioned struct, read by the size it declares: its first `size` bytes laid
/// over `base` (the fields an older, shorter struct lacks keep `base`'s values; a newer,
/// longer one is read up to our size). Returns the header as the caller wrote it, and the
/// merged struct.
///
/// # Safety
/// `p` is non-NULL and points to a struct that starts with a `VersionedHeader` and has at
/// least `size` readable bytes, `size` being its first field (NCCL's contract).
pub unsafe fn read_versioned<T: Copy>(p: *const T, base: T) -> (VersionedHeader, T) {
    // SAFETY: every versioned struct starts with the header (the caller's contract).
    let header = unsafe { (p as *const VersionedHeader).read_unaligned() };
    let mut out = base;
    let n = header.size.min(std::mem::size_of::<T>());
    // SAFETY: the caller provides `header.size` readable bytes; at most that many are copied,
    // into a `T` of at least `n` bytes. `T` is plain C data.
    unsafe { std::ptr::copy_nonoverlapping(p as *const u8, &mut out as *mut T as *mut u8, n) };
    (header, out)
}

/// Write `value` into the caller's versioned struct at `p`, up to the `size` it declares.
///
/// # Safety
/// As for [`read_versioned`], with the `size` bytes writable.
pub unsafe fn write_versioned<T: Copy>(p: *mut T, value: &T) {
    // SAFETY: every versioned struct starts with the header (the caller's contract).
    let size = unsafe { (p as *const VersionedHeader).read_unaligned() }.size;
    let n = size.min(std::mem::size_of::<T>());
    // SAFETY: at most the caller's `size` bytes are written, from a `T` of at least `n`.
    unsafe { std::ptr::copy_nonoverlapping(value as *const T as *const u8, p as *mut u8, n) };
}

/// Untyped pointer alias used by the allocation entry points.
pub type VoidPtr = *mut c_void;

impl ncclDataType_t {
    /// Checked conversion from the integer C passed.
    pub fn from_raw(raw: RawDataType) -> Option<Self> {
        use ncclDataType_t::*;
        Some(match raw.0 {
            0 => ncclInt8,
            1 => ncclUint8,
            2 => ncclInt32,
            3 => ncclUint32,
            4 => ncclInt64,
            5 => ncclUint64,
            6 => ncclFloat16,
            7 => ncclFloat32,
            8 => ncclFloat64,
            9 => ncclBfloat16,
            10 => ncclFloat8e4m3,
            11 => ncclFloat8e5m2,
            _ => return None,
        })
    }

    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        use ncclDataType_t::*;
        match self {
            ncclInt8 | ncclUint8 | ncclFloat8e4m3 | ncclFloat8e5m2 => 1,
            ncclFloat16 | ncclBfloat16 => 2,
            ncclInt32 | ncclUint32 | ncclFloat32 => 4,
            ncclInt64 | ncclUint64 | ncclFloat64 => 8,
            ncclNumTypes => 0,
        }
    }

    /// NCCL's short name for the type, as its logs print it.
    pub fn name(self) -> &'static str {
        use ncclDataType_t::*;
        match self {
            ncclInt8 => "int8",
            ncclUint8 => "uint8",
            ncclInt32 => "int32",
            ncclUint32 => "uint32",
            ncclInt64 => "int64",
            ncclUint64 => "uint64",
            ncclFloat16 => "half",
            ncclFloat32 => "float",
            ncclFloat64 => "double",
            ncclBfloat16 => "bfloat16",
            ncclFloat8e4m3 => "fp8e4m3",
            ncclFloat8e5m2 => "fp8e5m2",
            ncclNumTypes => "invalid",
        }
    }

    /// Whether the type is a floating-point type.
    pub fn is_float(self) -> bool {
        use ncclDataType_t::*;
        matches!(
            self,
            ncclFloat16
                | ncclFloat32
                | ncclFloat64
                | ncclBfloat16
                | ncclFloat8e4m3
                | ncclFloat8e5m2
        )
    }

    /// All twelve real data types, in enum order.
    pub const ALL: [ncclDataType_t; 12] = {
        use ncclDataType_t::*;
        [
            ncclInt8,
            ncclUint8,
            ncclInt32,
            ncclUint32,
            ncclInt64,
            ncclUint64,
            ncclFloat16,
            ncclFloat32,
            ncclFloat64,
            ncclBfloat16,
            ncclFloat8e4m3,
            ncclFloat8e5m2,
        ]
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_nvidia_2_32_3() {
        assert_eq!(std::mem::size_of::<ncclUniqueId>(), 128);
        assert_eq!(std::mem::size_of::<VersionedHeader>(), 16);
        assert_eq!(std::mem::size_of::<ncclConfig_t>(), 120);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, graphUsageMode), 80);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, nvlsHostMode), 112);
        assert_eq!(std::mem::size_of::<ncclCollConfig_t>(), 72);
        assert_eq!(std::mem::offset_of!(ncclCollConfig_t, algSelection), 40);
        assert_eq!(std::mem::offset_of!(ncclCollConfig_t, userProfilerTag), 56);
        assert_eq!(std::mem::size_of::<ncclConfigExt_t>(), 24);
        assert_eq!(std::mem::size_of::<ncclEncryptionConfig_t>(), 32);
        assert_eq!(std::mem::size_of::<ncclWaitSignalDesc_t>(), 16);
        assert_eq!(std::mem::size_of::<ncclCommProperties_t>(), 152);
        assert_eq!(std::mem::offset_of!(ncclCommProperties_t, commHash), 56);
        assert_eq!(std::mem::offset_of!(ncclCommProperties_t, ginSupport), 72);
        assert_eq!(
            std::mem::offset_of!(ncclCommProperties_t, cftCountedSupport),
            146
        );
        assert_eq!(std::mem::offset_of!(ncclConfig_t, netName), 32);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, commName), 48);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, nvlinkCentricSched), 76);
        assert_eq!(std::mem::size_of::<ncclSimInfo_t>(), 24);
        assert_eq!(std::mem::size_of::<ncclResult_t>(), 4);
        assert_eq!(std::mem::size_of::<ncclRedOp_t>(), 4);
    }

    #[test]
    fn a_shorter_older_struct_keeps_the_defaults_past_its_size() {
        let mut old = [0u8; 80];
        let header = VersionedHeader {
            size: 80,
            magic: NCCL_API_MAGIC,
            version: 22809,
        };
        // SAFETY: old has room for the header.
        unsafe { (old.as_mut_ptr() as *mut VersionedHeader).write_unaligned(header) };
        old[16..20].copy_from_slice(&1i32.to_ne_bytes()); // blocking
                                                          // SAFETY: old is an 80-byte struct starting with its header.
        let (h, cfg) =
            unsafe { read_versioned(old.as_ptr() as *const ncclConfig_t, ncclConfig_t::default()) };
        assert_eq!(h, header);
        assert_eq!(cfg.blocking, 1);
        assert_eq!(cfg.size, 80);
        assert_eq!(cfg.nvlsHostMode, NCCL_CONFIG_UNDEF_INT);
    }

    #[test]
    fn data_type_round_trip() {
        for (i, t) in ncclDataType_t::ALL.iter().enumerate() {
            assert_eq!(ncclDataType_t::from_raw(RawDataType(i as c_int)), Some(*t));
        }
        assert_eq!(ncclDataType_t::from_raw(RawDataType(12)), None);
        assert_eq!(ncclDataType_t::from_raw(RawDataType(-1)), None);
    }
}
