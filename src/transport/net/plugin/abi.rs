//! The C ABI of NCCL 2.28.9's net plugins, versions 8 to 11 (`nccl_net.h`, `net/net_v8.h` ..
//! `net/net_v11.h`, `nccl_common.h`, `nccl_device/net_device.h`): the function tables a plugin
//! exports as `ncclNetPlugin_vN`, their property structs and the types they take. Names follow
//! NVIDIA's headers exactly so that a field can be checked against them by eye; the layouts are
//! asserted at compile time (LP64).
//!
//! Result codes cross as plain `c_int` (a plugin may return any value); enums likewise.
#![allow(non_camel_case_types, non_snake_case)]

use std::os::raw::{c_char, c_int, c_void};

/// `NCCL_NET_MAX_DEVS_PER_NIC` of 2.28.9.
pub const NCCL_NET_MAX_DEVS_PER_NIC: usize = 4;
/// `MAX_NET_SIZE`: the most bytes one v8 (int-sized) send or receive may carry.
pub const MAX_NET_SIZE: usize = 1 << 30;
/// `NCCL_MAX_NET_SIZE_BYTES`: the largest `maxP2pBytes` NCCL accepts.
pub const NCCL_MAX_NET_SIZE_BYTES: usize = 1 << 40;
/// `NCCL_NET_TRAFFIC_CLASS_UNDEF`.
pub const NCCL_NET_TRAFFIC_CLASS_UNDEF: c_int = -1;
/// `ncclNetDeviceType::NCCL_NET_DEVICE_HOST`: no device offload.
pub const NCCL_NET_DEVICE_HOST: c_int = 0;

pub use crate::plugin::logger::ncclDebugLogger_t;

/// `ncclProfilerCallback_t` (oxccl passes NULL).
pub type ncclProfilerCallback_t =
    Option<unsafe extern "C" fn(*mut *mut c_void, c_int, *mut c_void, i64, *mut c_void) -> c_int>;

/// `ncclNetDeviceHandle_v7_t`, the same struct through `_v11_t`.
#[repr(C)]
pub struct ncclNetDeviceHandle_t {
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub handle: *mut c_void,
    pub size: usize,
    pub needsProxyProgress: c_int,
}

/// `ncclNetVDeviceProps_v9_t` .. `_v11_t` (one layout).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclNetVDeviceProps_t {
    pub ndevs: c_int,
    pub devs: [c_int; NCCL_NET_MAX_DEVS_PER_NIC],
}

/// `ncclNetCommConfig_v10_t` and `_v11_t` (one layout).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclNetCommConfig_t {
    pub trafficClass: c_int,
}

/// `ncclNetCommAttr_v11_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclNetCommAttr_v11_t {
    pub maxConcurrentPeers: i32,
    pub minConcurrentPeers: i32,
    pub maxFlowsPerPeer: i32,
    pub minFlowsPerPeer: i32,
}

/// `ncclNetAttr_v11_t` (the argument of `setNetAttr`, which oxccl does not call).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclNetAttr_v11_t {
    pub sendCommAttr: ncclNetCommAttr_v11_t,
    pub recvCommAttr: ncclNetCommAttr_v11_t,
    pub op: u32,
    pub algo: u32,
    pub proto: u32,
}

/// `ncclNetProperties_v8_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclNetProperties_v8_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
}

/// `ncclNetProperties_v9_t`, and `ncclNetProperties_v10_t`, which has the same fields.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclNetProperties_v9_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub forceFlush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub vProps: ncclNetVDeviceProps_t,
    pub maxP2pBytes: usize,
    pub maxCollBytes: usize,
}

/// `ncclNetProperties_v11_t`: v10's fields and `maxMultiRequestSize`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclNetProperties_v11_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub forceFlush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub vProps: ncclNetVDeviceProps_t,
    pub maxP2pBytes: usize,
    pub maxCollBytes: usize,
    pub maxMultiRequestSize: c_int,
}

// The entries every version shares, by signature.
pub type DevicesFn = unsafe extern "C" fn(ndev: *mut c_int) -> c_int;
pub type ListenFn =
    unsafe extern "C" fn(dev: c_int, handle: *mut c_void, listenComm: *mut *mut c_void) -> c_int;
pub type AcceptFn = unsafe extern "C" fn(
    listenComm: *mut c_void,
    recvComm: *mut *mut c_void,
    recvDevComm: *mut *mut ncclNetDeviceHandle_t,
) -> c_int;
pub type RegMrFn = unsafe extern "C" fn(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    type_: c_int,
    mhandle: *mut *mut c_void,
) -> c_int;
pub type RegMrDmaBufFn = unsafe extern "C" fn(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    type_: c_int,
    offset: u64,
    fd: c_int,
    mhandle: *mut *mut c_void,
) -> c_int;
pub type DeregMrFn = unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void) -> c_int;
pub type IflushFn = unsafe extern "C" fn(
    recvComm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> c_int;
pub type TestFn =
    unsafe extern "C" fn(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> c_int;
pub type CloseFn = unsafe extern "C" fn(comm: *mut c_void) -> c_int;
pub type GetDeviceMrFn = unsafe extern "C" fn(
    comm: *mut c_void,
    mhandle: *mut c_void,
    dptr_mhandle: *mut *mut c_void,
) -> c_int;
pub type IrecvConsumedFn =
    unsafe extern "C" fn(recvComm: *mut c_void, n: c_int, request: *mut c_void) -> c_int;
pub type MakeVDeviceFn =
    unsafe extern "C" fn(d: *mut c_int, props: *mut ncclNetVDeviceProps_t) -> c_int;

/// Sends and receives of v9 and later (sizes in `size_t`), without and with profiler handles.
pub type IsendV9Fn = unsafe extern "C" fn(
    sendComm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> c_int;
pub type IrecvV9Fn = unsafe extern "C" fn(
    recvComm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> c_int;
pub type IsendV10Fn = unsafe extern "C" fn(
    sendComm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    phandle: *mut c_void,
    request: *mut *mut c_void,
) -> c_int;
pub type IrecvV10Fn = unsafe extern "C" fn(
    recvComm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> c_int;
/// `connect` of v8 and v9.
pub type ConnectV8Fn = unsafe extern "C" fn(
    dev: c_int,
    handle: *mut c_void,
    sendComm: *mut *mut c_void,
    sendDevComm: *mut *mut ncclNetDeviceHandle_t,
) -> c_int;

/// `connect` of v10 (with the comm config) and v11 (with the context).
pub type ConnectV10Fn = unsafe extern "C" fn(
    dev: c_int,
    config: *mut ncclNetCommConfig_t,
    handle: *mut c_void,
    sendComm: *mut *mut c_void,
    sendDevComm: *mut *mut ncclNetDeviceHandle_t,
) -> c_int;
pub type ConnectV11Fn = unsafe extern "C" fn(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    sendComm: *mut *mut c_void,
    sendDevComm: *mut *mut ncclNetDeviceHandle_t,
) -> c_int;
pub type ListenV11Fn = unsafe extern "C" fn(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listenComm: *mut *mut c_void,
) -> c_int;
/// Sends and receives of v8 (sizes in `int`).
pub type IsendV8Fn = unsafe extern "C" fn(
    sendComm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> c_int;
pub type IrecvV8Fn = unsafe extern "C" fn(
    recvComm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> c_int;
pub type PropsV8Fn = unsafe extern "C" fn(dev: c_int, props: *mut ncclNetProperties_v8_t) -> c_int;
pub type PropsV9Fn = unsafe extern "C" fn(dev: c_int, props: *mut ncclNetProperties_v9_t) -> c_int;
pub type PropsV11Fn =
    unsafe extern "C" fn(dev: c_int, props: *mut ncclNetProperties_v11_t) -> c_int;
pub type InitV8Fn = unsafe extern "C" fn(logFunction: ncclDebugLogger_t) -> c_int;
pub type InitV10Fn = unsafe extern "C" fn(
    logFunction: ncclDebugLogger_t,
    profFunction: ncclProfilerCallback_t,
) -> c_int;
pub type InitV11Fn = unsafe extern "C" fn(
    ctx: *mut *mut c_void,
    commId: u64,
    config: *mut ncclNetCommConfig_t,
    logFunction: ncclDebugLogger_t,
    profFunction: ncclProfilerCallback_t,
) -> c_int;
pub type FinalizeFn = unsafe extern "C" fn(ctx: *mut c_void) -> c_int;
pub type SetNetAttrFn =
    unsafe extern "C" fn(ctx: *mut c_void, netAttr: *mut ncclNetAttr_v11_t) -> c_int;

/// `ncclNet_v8_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclNet_v8_t {
    pub name: *const c_char,
    pub init: Option<InitV8Fn>,
    pub devices: Option<DevicesFn>,
    pub getProperties: Option<PropsV8Fn>,
    pub listen: Option<ListenFn>,
    pub connect: Option<ConnectV8Fn>,
    pub accept: Option<AcceptFn>,
    pub regMr: Option<RegMrFn>,
    pub regMrDmaBuf: Option<RegMrDmaBufFn>,
    pub deregMr: Option<DeregMrFn>,
    pub isend: Option<IsendV8Fn>,
    pub irecv: Option<IrecvV8Fn>,
    pub iflush: Option<IflushFn>,
    pub test: Option<TestFn>,
    pub closeSend: Option<CloseFn>,
    pub closeRecv: Option<CloseFn>,
    pub closeListen: Option<CloseFn>,
    pub getDeviceMr: Option<GetDeviceMrFn>,
    pub irecvConsumed: Option<IrecvConsumedFn>,
}

/// `ncclNet_v9_t`: sizes become `size_t`; `makeVDevice` is added.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclNet_v9_t {
    pub name: *const c_char,
    pub init: Option<InitV8Fn>,
    pub devices: Option<DevicesFn>,
    pub getProperties: Option<PropsV9Fn>,
    pub listen: Option<ListenFn>,
    pub connect: Option<ConnectV8Fn>,
    pub accept: Option<AcceptFn>,
    pub regMr: Option<RegMrFn>,
    pub regMrDmaBuf: Option<RegMrDmaBufFn>,
    pub deregMr: Option<DeregMrFn>,
    pub isend: Option<IsendV9Fn>,
    pub irecv: Option<IrecvV9Fn>,
    pub iflush: Option<IflushFn>,
    pub test: Option<TestFn>,
    pub closeSend: Option<CloseFn>,
    pub closeRecv: Option<CloseFn>,
    pub closeListen: Option<CloseFn>,
    pub getDeviceMr: Option<GetDeviceMrFn>,
    pub irecvConsumed: Option<IrecvConsumedFn>,
    pub makeVDevice: Option<MakeVDeviceFn>,
}

/// `ncclNet_v10_t`: `init` takes a profiler callback, `connect` a comm config, sends and
/// receives profiler handles.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclNet_v10_t {
    pub name: *const c_char,
    pub init: Option<InitV10Fn>,
    pub devices: Option<DevicesFn>,
    pub getProperties: Option<PropsV9Fn>,
    pub listen: Option<ListenFn>,
    pub connect: Option<ConnectV10Fn>,
    pub accept: Option<AcceptFn>,
    pub regMr: Option<RegMrFn>,
    pub regMrDmaBuf: Option<RegMrDmaBufFn>,
    pub deregMr: Option<DeregMrFn>,
    pub isend: Option<IsendV10Fn>,
    pub irecv: Option<IrecvV10Fn>,
    pub iflush: Option<IflushFn>,
    pub test: Option<TestFn>,
    pub closeSend: Option<CloseFn>,
    pub closeRecv: Option<CloseFn>,
    pub closeListen: Option<CloseFn>,
    pub getDeviceMr: Option<GetDeviceMrFn>,
    pub irecvConsumed: Option<IrecvConsumedFn>,
    pub makeVDevice: Option<MakeVDeviceFn>,
}

/// `ncclNet_v11_t`: `init` takes a context out-pointer, the communicator's id and the comm
/// config (moved there from `connect`); `listen` and `connect` take the context; `finalize`
/// and `setNetAttr` are added.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclNet_v11_t {
    pub name: *const c_char,
    pub init: Option<InitV11Fn>,
    pub devices: Option<DevicesFn>,
    pub getProperties: Option<PropsV11Fn>,
    pub listen: Option<ListenV11Fn>,
    pub connect: Option<ConnectV11Fn>,
    pub accept: Option<AcceptFn>,
    pub regMr: Option<RegMrFn>,
    pub regMrDmaBuf: Option<RegMrDmaBufFn>,
    pub deregMr: Option<DeregMrFn>,
    pub isend: Option<IsendV10Fn>,
    pub irecv: Option<IrecvV10Fn>,
    pub iflush: Option<IflushFn>,
    pub test: Option<TestFn>,
    pub closeSend: Option<CloseFn>,
    pub closeRecv: Option<CloseFn>,
    pub closeListen: Option<CloseFn>,
    pub getDeviceMr: Option<GetDeviceMrFn>,
    pub irecvConsumed: Option<IrecvConsumedFn>,
    pub makeVDevice: Option<MakeVDeviceFn>,
    pub finalize: Option<FinalizeFn>,
    pub setNetAttr: Option<SetNetAttrFn>,
}

// Layouts of NVIDIA's 2.28.9 headers on LP64 (x86-64, aarch64).
#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<ncclNetDeviceHandle_t>() == 32);
    assert!(size_of::<ncclNetVDeviceProps_t>() == 20);
    assert!(size_of::<ncclNetCommConfig_t>() == 4);
    assert!(size_of::<ncclNetAttr_v11_t>() == 44);
    assert!(size_of::<ncclNetProperties_v8_t>() == 64);
    assert!(offset_of!(ncclNetProperties_v8_t, netDeviceVersion) == 56);
    assert!(size_of::<ncclNetProperties_v9_t>() == 104);
    assert!(offset_of!(ncclNetProperties_v9_t, vProps) == 64);
    assert!(offset_of!(ncclNetProperties_v9_t, maxP2pBytes) == 88);
    assert!(size_of::<ncclNetProperties_v11_t>() == 112);
    assert!(offset_of!(ncclNetProperties_v11_t, maxMultiRequestSize) == 104);
    // A name and 18, 19, 19 and 21 entries.
    assert!(size_of::<ncclNet_v8_t>() == 19 * 8);
    assert!(size_of::<ncclNet_v9_t>() == 20 * 8);
    assert!(size_of::<ncclNet_v10_t>() == 20 * 8);
    assert!(size_of::<ncclNet_v11_t>() == 22 * 8);
    assert!(offset_of!(ncclNet_v8_t, irecvConsumed) == 18 * 8);
    assert!(offset_of!(ncclNet_v11_t, test) == 13 * 8);
    assert!(offset_of!(ncclNet_v11_t, setNetAttr) == 21 * 8);
};
