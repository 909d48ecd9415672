/* A stand-in for the CUDA driver (SONAME libcuda.so.1), for running oxccl's host path on a
 * machine without a GPU, and for counting the driver calls it makes.
 *
 * Emulated: device 0 (CUDA_STANDIN_DEVICES=N gives N devices, at most 8), an H200-like GPU
 * (132 SMs, compute capability 9.0, 141 GiB, unified addressing, CUDA 13.0 driver) whose
 * "device memory" is host memory: a device pointer is a host pointer, and every device can
 * reach every other's memory. Primary and created contexts with a per-thread context stack;
 * primary-context resets (a reset context's streams are gone: destroying one aborts);
 * streams and events that are done at once, or, with CUDA_STANDIN_LAUNCH_US=N, a GPU that
 * takes N µs per kernel launch (each created stream runs its launches one after another, N µs
 * each, from when it is free; an event is done once its stream's launches before it are, a
 * stream waiting on an event is busy until then, and cuEventQuery / cuStreamQuery say
 * CUDA_ERROR_NOT_READY before; cuEventSynchronize / cuStreamSynchronize sleep until then;
 * the legacy and per-thread streams stay always done); cuMemAlloc (memfd-backed, so cuIpcGetMemHandle /
 * cuIpcOpenMemHandle work across processes of one user through /proc/<pid>/fd); pinned host
 * memory and host registration; the virtual memory API (memfd allocations of 2 MiB
 * granularity mapped with mmap into PROT_NONE reservations, access set with mprotect,
 * exported and imported as the memfd's file descriptor); copies and memsets, synchronous or
 * not, done at once with memcpy/memset; stream memory operations, done at once on host
 * memory (a wait whose condition does not hold yet does NOT wait: nothing else would ever
 * run to make it hold); modules and libraries that hand out function handles by name,
 * function attributes, occupancy, and kernel launches that check their configuration and
 * count, but run nothing, except oxccl's plain copy kernel (ox_copy_kernel), done as a memcpy.
 * Not emulated: other kernels (nothing they would write is ever written), stream capture and
 * graphs (streams never capture), managed memory, memory pools, multicast (NVLS), dma-bufs
 * (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0), IPC events, textures, anything else that is
 * not defined here: a program that looks up a missing symbol finds none.
 *
 * Every entry point counts its calls under its exported name (cuMemAlloc_v2, cuLaunchKernel):
 *   unsigned long cuda_standin_calls(const char *name)   calls since load or the last reset
 *                                                         (0 for a name never called)
 *   void cuda_standin_reset(void)                         every count back to 0
 *   const char *cuda_standin_name(unsigned long i)        the i-th function called since load
 *                                                         (NULL past the last): to list them
 * Built by ffi-tests/run.sh: cc -shared -fPIC -Wl,-soname,libcuda.so.1 -I <cuda include>, with
 * a libcuda.so link next to it (the name cudarc's loader tries first). */
#define _GNU_SOURCE
#include <cuda.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 8
#define CTX_STACK 16
#define GRANULARITY ((size_t)2 << 20)
#define TOTAL_MEM ((size_t)143771 << 20) /* an H200's 141 GB */
#define MAX_DYN_SMEM 232448              /* 227 KiB: the opt-in limit per block */
#define DEFAULT_DYN_SMEM 49152
#define MAX_PARAM_BYTES 32764

/* ---- call counters ---- */

struct counter {
  const char *name;
  unsigned long calls;
  int listed;
  struct counter *next;
};

static pthread_mutex_t countersLock = PTHREAD_MUTEX_INITIALIZER;
static struct counter *counters; /* every counter called at least once, newest first */
static unsigned long ncounters;

static void enlist(struct counter *c) {
  pthread_mutex_lock(&countersLock);
  if (!c->listed) {
    c->next = counters;
    counters = c;
    ncounters++;
    __atomic_store_n(&c->listed, 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&countersLock);
}

static inline void countCall(struct counter *c) {
  if (!__atomic_load_n(&c->listed, __ATOMIC_ACQUIRE)) enlist(c);
  __atomic_fetch_add(&c->calls, 1, __ATOMIC_RELAXED);
}

/* First statement of every entry point: __func__ is the exported name (cuda.h's macros turn
 * cuMemAlloc into cuMemAlloc_v2 before the function is defined). */
#define COUNTED()                                                   \
  static struct counter counter_ = {__func__, 0, 0, NULL};          \
  countCall(&counter_)

EXPORT unsigned long cuda_standin_calls(const char *name) {
  unsigned long n = 0;
  pthread_mutex_lock(&countersLock);
  for (struct counter *c = counters; c && name; c = c->next)
    if (!strcmp(c->name, name)) n = __atomic_load_n(&c->calls, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&countersLock);
  return n;
}

EXPORT void cuda_standin_reset(void) {
  pthread_mutex_lock(&countersLock);
  for (struct counter *c = counters; c; c = c->next) __atomic_store_n(&c->calls, 0, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&countersLock);
}

EXPORT const char *cuda_standin_name(unsigned long i) {
  const char *name = NULL;
  pthread_mutex_lock(&countersLock);
  if (i < ncounters) {
    struct counter *c = counters;
    for (unsigned long k = ncounters - 1; k > i; k--) c = c->next; /* oldest is index 0 */
    name = c->name;
  }
  pthread_mutex_unlock(&countersLock);
  return name;
}

/* ---- errors ---- */

struct errorText {
  CUresult code;
  const char *name, *text;
};
#define ERR(code, text) {code, #code, text}
static const struct errorText errors[] = {
    ERR(CUDA_SUCCESS, "no error"),
    ERR(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    ERR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    ERR(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    ERR(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    ERR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    ERR(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    ERR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    ERR(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    ERR(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
    ERR(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    ERR(CUDA_ERROR_NOT_READY, "device not ready"),
    ERR(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch"),
    ERR(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled"),
    ERR(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled"),
    ERR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is already mapped"),
    ERR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region"),
    ERR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    ERR(CUDA_ERROR_UNKNOWN, "unknown error"),
};

static const struct errorText *errorOf(CUresult code) {
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].code == code) return &errors[i];
  return NULL;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr) {
  COUNTED();
  const struct errorText *e = errorOf(error);
  if (pStr == NULL) return CUDA_ERROR_INVALID_VALUE;
  *pStr = e ? e->name : NULL;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr) {
  COUNTED();
  const struct errorText *e = errorOf(error);
  if (pStr == NULL) return CUDA_ERROR_INVALID_VALUE;
  *pStr = e ? e->text : NULL;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- driver and devices ---- */

static int initialized;
static int ndevices = 1;

static int validDevice(CUdevice dev) { return initialized && dev >= 0 && dev < ndevices; }

EXPORT CUresult cuInit(unsigned int flags) {
  COUNTED();
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  const char *env = getenv("CUDA_STANDIN_DEVICES");
  if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE) && env && atoi(env) >= 1)
    ndevices = atoi(env) > MAX_DEVICES ? MAX_DEVICES : atoi(env);
  __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *driverVersion) {
  COUNTED();
  if (driverVersion == NULL) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = 13000;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count) {
  COUNTED();
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
  *count = ndevices;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  COUNTED();
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

/* Device i sits at PCI 00ff:(0x10 + i):00.0, a domain no real machine's sysfs has. */
#define PCI_DOMAIN 0xff
#define PCI_BUS(dev) (0x10 + (dev))

static int attributeValue(CUdevice_attribute attrib, CUdevice dev) {
  switch (attrib) {
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return DEFAULT_DYN_SMEM;
  case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
  case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
  case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
  case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
  case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1980000;
  case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
  case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
  case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
  case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
  case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return 1;
  case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return PCI_BUS(dev);
  case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: return 0;
  case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: return PCI_DOMAIN;
  case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 2619000;
  case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 6144;
  case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 52428800;
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
  case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 3;
  case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
  case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
  case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: return 1;
  case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: return 1;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return 233472;
  case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
  case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 1;
  case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: return 1;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: return 1;
  case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: return 1;
  case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: return 1;
  case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR: return 1;
  case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return MAX_DYN_SMEM;
  case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: return 1;
  case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;
  case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: return 1;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return 32;
  case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: return 1024;
  case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: return 1;
  case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 0;
  case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: return 1;
  case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: return 1;
  case CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT: return 4;
  case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: return 0;
  case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED: return 0;
  case CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS: return 1;
  default: return 0;
  }
}

EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  COUNTED();
  if (pi == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(dev)) return initialized ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_NOT_INITIALIZED;
  *pi = attributeValue(attrib, dev);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  COUNTED();
  if (name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "NVIDIA H200 (CUDA stand-in)");
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
  COUNTED();
  if (uuid == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  static const char base[16] = "cuda-standin-gpu";
  memcpy(uuid->bytes, base, sizeof base);
  uuid->bytes[15] = (char)('0' + dev);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev) {
  COUNTED();
  if (pciBusId == NULL || len < 13) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(pciBusId, (size_t)len, "%04X:%02X:00.0", PCI_DOMAIN, PCI_BUS(dev));
  return CUDA_SUCCESS;
}

/* Accepts "domain:bus:device.function" and "bus:device.function", any case. */
EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId) {
  COUNTED();
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  if (dev == NULL || pciBusId == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (sscanf(pciBusId, "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4) {
    domain = 0;
    if (sscanf(pciBusId, "%x:%x.%x", &bus, &device, &function) != 3) return CUDA_ERROR_INVALID_VALUE;
  }
  for (int d = 0; d < ndevices && initialized; d++)
    if (domain == PCI_DOMAIN && bus == (unsigned)PCI_BUS(d) && device == 0 && function == 0) {
      *dev = d;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
  COUNTED();
  if (bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = TOTAL_MEM;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev) {
  COUNTED();
  if (canAccessPeer == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(dev) || !validDevice(peerDev)) return CUDA_ERROR_INVALID_DEVICE;
  *canAccessPeer = dev != peerDev;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetP2PAttribute(int *value, CUdevice_P2PAttribute attrib, CUdevice srcDevice,
                                        CUdevice dstDevice) {
  COUNTED();
  if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(srcDevice) || !validDevice(dstDevice) || srcDevice == dstDevice) return CUDA_ERROR_INVALID_DEVICE;
  *value = attrib == CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK ? 0 : 1;
  return CUDA_SUCCESS;
}

/* ---- contexts ---- */

#define CTX_MAGIC 0x43545853u

struct CUctx_st {
  unsigned magic;
  CUdevice dev;
  int primary;
  int retains;           /* primary contexts: cuDevicePrimaryCtxRetain minus releases */
  unsigned flags;
  unsigned long long id;
  unsigned peers;        /* devices whose memory this context was given access to */
  unsigned resets;       /* primary contexts: cuDevicePrimaryCtxReset calls so far */
};

static struct CUctx_st primaries[MAX_DEVICES];
static unsigned long long nextCtxId = 1;
static __thread CUcontext ctxStack[CTX_STACK];
static __thread int ctxDepth;

static CUcontext current(void) { return ctxDepth ? ctxStack[ctxDepth - 1] : NULL; }
static int validCtx(CUcontext c) { return c != NULL && c->magic == CTX_MAGIC; }

static struct CUctx_st *primary(CUdevice dev) {
  struct CUctx_st *c = &primaries[dev];
  if (c->magic != CTX_MAGIC) {
    c->dev = dev, c->primary = 1;
    c->id = __atomic_fetch_add(&nextCtxId, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&c->magic, CTX_MAGIC, __ATOMIC_RELEASE);
  }
  return c;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  COUNTED();
  if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(dev)) return initialized ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_NOT_INITIALIZED;
  struct CUctx_st *c = primary(dev);
  __atomic_fetch_add(&c->retains, 1, __ATOMIC_RELAXED);
  *pctx = c;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  COUNTED();
  if (!validDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  struct CUctx_st *c = primary(dev);
  if (__atomic_load_n(&c->retains, __ATOMIC_RELAXED) <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  __atomic_fetch_sub(&c->retains, 1, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}

/* As the driver's (what cudaDeviceReset and the CUDA runtime's teardown at exit call): the
 * primary context's streams, memory and modules are gone, the handle stays. Here its streams
 * are marked gone: destroying one afterwards aborts the process, as the real driver crashes
 * on the freed stream; other calls on one fail with CUDA_ERROR_INVALID_HANDLE. */
EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  COUNTED();
  if (!validDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  struct CUctx_st *c = primary(dev);
  __atomic_fetch_add(&c->resets, 1, __ATOMIC_RELAXED);
  __atomic_store_n(&c->retains, 0, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
  COUNTED();
  if (flags == NULL || active == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = primaries[dev].flags;
  *active = __atomic_load_n(&primaries[dev].retains, __ATOMIC_RELAXED) > 0;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  COUNTED();
  if (!validDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  primary(dev)->flags = flags;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev) {
  COUNTED();
  (void)params;
  if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(dev)) return initialized ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_NOT_INITIALIZED;
  if (ctxDepth == CTX_STACK) return CUDA_ERROR_OUT_OF_MEMORY;
  struct CUctx_st *c = calloc(1, sizeof *c);
  if (c == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  c->magic = CTX_MAGIC, c->dev = dev, c->flags = flags;
  c->id = __atomic_fetch_add(&nextCtxId, 1, __ATOMIC_RELAXED);
  ctxStack[ctxDepth++] = c;
  *pctx = c;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDestroy(CUcontext ctx) {
  COUNTED();
  if (!validCtx(ctx) || ctx->primary) return CUDA_ERROR_INVALID_CONTEXT;
  if (current() == ctx) ctxDepth--;
  ctx->magic = 0;
  free(ctx);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
  COUNTED();
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  *pctx = current();
  return CUDA_SUCCESS;
}

/* As the driver's: replaces the top of the thread's stack; NULL pops it. */
EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  COUNTED();
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx == NULL) {
    if (ctxDepth) ctxDepth--;
    return CUDA_SUCCESS;
  }
  if (!validCtx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctxDepth == 0) ctxDepth = 1;
  ctxStack[ctxDepth - 1] = ctx;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) {
  COUNTED();
  if (!validCtx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctxDepth == CTX_STACK) return CUDA_ERROR_OUT_OF_MEMORY;
  ctxStack[ctxDepth++] = ctx;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx) {
  COUNTED();
  if (ctxDepth == 0) return CUDA_ERROR_INVALID_CONTEXT;
  ctxDepth--;
  if (pctx) *pctx = ctxStack[ctxDepth];
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *device) {
  COUNTED();
  if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (current() == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  *device = current()->dev;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetFlags(unsigned int *flags) {
  COUNTED();
  if (flags == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (current() == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  *flags = current()->flags;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long *ctxId) {
  COUNTED();
  if (ctxId == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (ctx == NULL) ctx = current();
  if (!validCtx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  *ctxId = ctx->id;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version) {
  COUNTED();
  if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (ctx == NULL) ctx = current();
  if (!validCtx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  *version = 13000;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority) {
  COUNTED();
  if (leastPriority) *leastPriority = 0;
  if (greatestPriority) *greatestPriority = -5;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) {
  COUNTED();
  return current() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int flags) {
  COUNTED();
  CUcontext me = current();
  if (me == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (!validCtx(peerContext) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (peerContext->dev == me->dev) return CUDA_ERROR_INVALID_DEVICE;
  unsigned bit = 1u << peerContext->dev;
  if (__atomic_fetch_or(&me->peers, bit, __ATOMIC_RELAXED) & bit) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peerContext) {
  COUNTED();
  CUcontext me = current();
  if (me == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (!validCtx(peerContext)) return CUDA_ERROR_INVALID_VALUE;
  unsigned bit = 1u << peerContext->dev;
  if (!(__atomic_fetch_and(&me->peers, ~bit, __ATOMIC_RELAXED) & bit)) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
  return CUDA_SUCCESS;
}

/* ---- memory regions: what every allocation, registration and mapping covers ---- */

enum regionKind {
  REGION_DEVICE = 1,     /* cuMemAlloc: a memfd mapping, fd kept for IPC */
  REGION_HOST = 2,       /* cuMemHostAlloc */
  REGION_REGISTERED = 4, /* cuMemHostRegister */
  REGION_RESERVED = 8,   /* cuMemAddressReserve */
  REGION_MAPPED = 16,    /* cuMemMap, inside a reservation */
  REGION_IPC = 32,       /* cuIpcOpenMemHandle */
};
#define REGION_MEMORY (REGION_DEVICE | REGION_HOST | REGION_REGISTERED | REGION_MAPPED | REGION_IPC)

struct region {
  uintptr_t base;
  size_t size;
  enum regionKind kind;
  int fd; /* REGION_DEVICE: its memfd; else -1 */
  CUdevice dev;
  CUcontext ctx;
  unsigned long long id;
  struct region *next;
};

static pthread_mutex_t regionsLock = PTHREAD_MUTEX_INITIALIZER;
static struct region *regions;
static unsigned long long nextRegionId = 1;
static size_t deviceBytesInUse;

static size_t pageSize(void) { return (size_t)sysconf(_SC_PAGESIZE); }
static size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

static CUresult addRegion(uintptr_t base, size_t size, enum regionKind kind, int fd) {
  struct region *r = calloc(1, sizeof *r);
  if (r == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  CUcontext c = current();
  r->base = base, r->size = size, r->kind = kind, r->fd = fd;
  r->dev = c ? c->dev : 0, r->ctx = c;
  pthread_mutex_lock(&regionsLock);
  r->id = nextRegionId++;
  r->next = regions;
  regions = r;
  if (kind & (REGION_DEVICE | REGION_MAPPED)) deviceBytesInUse += size;
  pthread_mutex_unlock(&regionsLock);
  return CUDA_SUCCESS;
}

/* The region of one of `kinds` that holds `p`, copied into *out (0 when none). */
static int findRegion(uintptr_t p, unsigned kinds, struct region *out) {
  int found = 0;
  pthread_mutex_lock(&regionsLock);
  for (struct region *r = regions; r && !found; r = r->next)
    if ((r->kind & kinds) && p >= r->base && p - r->base < r->size) *out = *r, found = 1;
  pthread_mutex_unlock(&regionsLock);
  return found;
}

/* Removes the region of one of `kinds` that starts at `base` (and, if size is not 0, has that
 * size), copied into *out; 0 when none. */
static int takeRegion(uintptr_t base, size_t size, unsigned kinds, struct region *out) {
  int found = 0;
  pthread_mutex_lock(&regionsLock);
  for (struct region **pr = &regions; *pr; pr = &(*pr)->next) {
    struct region *r = *pr;
    if ((r->kind & kinds) && r->base == base && (size == 0 || r->size == size)) {
      *out = *r;
      *pr = r->next;
      if (r->kind & (REGION_DEVICE | REGION_MAPPED)) deviceBytesInUse -= r->size;
      free(r);
      found = 1;
      break;
    }
  }
  pthread_mutex_unlock(&regionsLock);
  return found;
}

/* ---- memory ---- */

static void *sharedMapping(size_t size, int *fdOut) {
  int fd = memfd_create("cuda_standin", MFD_CLOEXEC);
  if (fd < 0) return NULL;
  void *p = MAP_FAILED;
  if (ftruncate(fd, (off_t)size) == 0) p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return NULL;
  }
  *fdOut = fd;
  return p;
}

EXPORT CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) {
  COUNTED();
  if (dptr == NULL || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (current() == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  size_t size = roundUp(bytesize, pageSize());
  int fd = -1;
  void *p = sharedMapping(size, &fd);
  if (p == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  if (addRegion((uintptr_t)p, size, REGION_DEVICE, fd) != CUDA_SUCCESS) {
    munmap(p, size);
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *dptr = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree(CUdeviceptr dptr) {
  COUNTED();
  struct region r;
  if (dptr == 0) return CUDA_SUCCESS;
  if (!takeRegion((uintptr_t)dptr, 0, REGION_DEVICE, &r)) return CUDA_ERROR_INVALID_VALUE;
  munmap((void *)r.base, r.size);
  close(r.fd);
  return CUDA_SUCCESS;
}

static CUresult hostAlloc(void **pp, size_t bytesize) {
  if (pp == NULL || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (current() == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  size_t size = roundUp(bytesize, pageSize());
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  if (addRegion((uintptr_t)p, size, REGION_HOST, -1) != CUDA_SUCCESS) {
    munmap(p, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *pp = p;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) {
  COUNTED();
  (void)flags;
  return hostAlloc(pp, bytesize);
}

EXPORT CUresult cuMemAllocHost(void **pp, size_t bytesize) {
  COUNTED();
  return hostAlloc(pp, bytesize);
}

EXPORT CUresult cuMemFreeHost(void *p) {
  COUNTED();
  struct region r;
  if (!takeRegion((uintptr_t)p, 0, REGION_HOST, &r)) return CUDA_ERROR_INVALID_VALUE;
  munmap((void *)r.base, r.size);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int flags) {
  COUNTED();
  struct region r;
  if (pdptr == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!findRegion((uintptr_t)p, REGION_HOST | REGION_REGISTERED, &r)) return CUDA_ERROR_INVALID_VALUE;
  *pdptr = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p) {
  COUNTED();
  struct region r;
  if (pFlags == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!findRegion((uintptr_t)p, REGION_HOST | REGION_REGISTERED, &r)) return CUDA_ERROR_INVALID_VALUE;
  *pFlags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int flags) {
  COUNTED();
  struct region r;
  (void)flags;
  if (p == NULL || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (current() == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (findRegion((uintptr_t)p, REGION_REGISTERED | REGION_HOST, &r) ||
      findRegion((uintptr_t)p + bytesize - 1, REGION_REGISTERED | REGION_HOST, &r))
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  return addRegion((uintptr_t)p, bytesize, REGION_REGISTERED, -1);
}

EXPORT CUresult cuMemHostUnregister(void *p) {
  COUNTED();
  struct region r;
  if (!takeRegion((uintptr_t)p, 0, REGION_REGISTERED, &r)) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo(size_t *free, size_t *total) {
  COUNTED();
  if (current() == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&regionsLock);
  size_t used = deviceBytesInUse;
  pthread_mutex_unlock(&regionsLock);
  if (free) *free = used < TOTAL_MEM ? TOTAL_MEM - used : 0;
  if (total) *total = TOTAL_MEM;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
  COUNTED();
  struct region r;
  if (!findRegion((uintptr_t)dptr, REGION_MEMORY, &r)) return CUDA_ERROR_NOT_FOUND;
  if (pbase) *pbase = (CUdeviceptr)r.base;
  if (psize) *psize = r.size;
  return CUDA_SUCCESS;
}

/* One attribute of the memory at ptr (found or not) into data; CUDA_ERROR_INVALID_VALUE for
 * attributes this stand-in does not answer. */
static CUresult pointerAttribute(void *data, CUpointer_attribute attribute, uintptr_t ptr, const struct region *r) {
  int isDevice = r && (r->kind & (REGION_DEVICE | REGION_MAPPED | REGION_IPC));
  switch (attribute) {
  case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = r ? r->ctx : NULL; return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    *(unsigned *)data = !r ? 0 : isDevice ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = r ? (CUdeviceptr)ptr : 0; return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_HOST_POINTER: *(void **)data = r && !isDevice ? (void *)ptr : NULL; return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *(int *)data = 1; return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_BUFFER_ID:
  case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: *(unsigned long long *)data = r ? r->id : 0; return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = 0; return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = r ? r->dev : -2; return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(int *)data = r && r->kind == REGION_DEVICE; return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
  case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: *(CUdeviceptr *)data = r ? r->base : 0; return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
  case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: *(size_t *)data = r ? r->size : 0; return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = r != NULL; return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    *(unsigned long long *)data = r && r->kind == REGION_MAPPED ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
    return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: *(int *)data = isDevice; return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
    *(unsigned *)data = r ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
    return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *(CUmemoryPool *)data = NULL; return CUDA_SUCCESS;
  default: return CUDA_ERROR_INVALID_VALUE;
  }
}

/* As the driver's: memory it does not know is an error here, but not in cuPointerGetAttributes. */
EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  COUNTED();
  struct region r;
  if (data == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!findRegion((uintptr_t)ptr, REGION_MEMORY, &r)) return CUDA_ERROR_INVALID_VALUE;
  return pointerAttribute(data, attribute, (uintptr_t)ptr, &r);
}

EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
                                       CUdeviceptr ptr) {
  COUNTED();
  struct region r;
  int known = findRegion((uintptr_t)ptr, REGION_MEMORY, &r);
  if (attributes == NULL || data == NULL) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < numAttributes; i++) {
    CUresult res = pointerAttribute(data[i], attributes[i], (uintptr_t)ptr, known ? &r : NULL);
    if (res != CUDA_SUCCESS) return res;
  }
  return CUDA_SUCCESS;
}

/* ---- copies and memsets: at once ---- */

static CUresult copy(uintptr_t dst, uintptr_t src, size_t n) {
  if (n && (dst == 0 || src == 0)) return CUDA_ERROR_INVALID_VALUE;
  if (n) memmove((void *)dst, (const void *)src, n);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  COUNTED();
  return copy(dst, src, n);
}
EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  COUNTED();
  (void)s;
  return copy(dst, src, n);
}
EXPORT CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n) {
  COUNTED();
  return copy(dst, (uintptr_t)src, n);
}
EXPORT CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
  COUNTED();
  (void)s;
  return copy(dst, (uintptr_t)src, n);
}
EXPORT CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
  COUNTED();
  return copy((uintptr_t)dst, src, n);
}
EXPORT CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  COUNTED();
  (void)s;
  return copy((uintptr_t)dst, src, n);
}
EXPORT CUresult cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  COUNTED();
  return copy(dst, src, n);
}
EXPORT CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  COUNTED();
  (void)s;
  return copy(dst, src, n);
}
EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dstCtx, CUdeviceptr src, CUcontext srcCtx, size_t n) {
  COUNTED();
  if (!validCtx(dstCtx) || !validCtx(srcCtx)) return CUDA_ERROR_INVALID_CONTEXT;
  return copy(dst, src, n);
}
EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dstCtx, CUdeviceptr src, CUcontext srcCtx, size_t n,
                                  CUstream s) {
  COUNTED();
  (void)s;
  if (!validCtx(dstCtx) || !validCtx(srcCtx)) return CUDA_ERROR_INVALID_CONTEXT;
  return copy(dst, src, n);
}

static CUresult fill(uintptr_t dst, const void *value, size_t width, size_t n) {
  if (n && dst == 0) return CUDA_ERROR_INVALID_VALUE;
  if (dst % width) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < n; i++) memcpy((char *)dst + i * width, value, width);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n) {
  COUNTED();
  if (n && dst == 0) return CUDA_ERROR_INVALID_VALUE;
  memset((void *)(uintptr_t)dst, v, n);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
  COUNTED();
  (void)s;
  if (n && dst == 0) return CUDA_ERROR_INVALID_VALUE;
  memset((void *)(uintptr_t)dst, v, n);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemsetD16(CUdeviceptr dst, unsigned short v, size_t n) {
  COUNTED();
  return fill(dst, &v, sizeof v, n);
}
EXPORT CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short v, size_t n, CUstream s) {
  COUNTED();
  (void)s;
  return fill(dst, &v, sizeof v, n);
}
EXPORT CUresult cuMemsetD32(CUdeviceptr dst, unsigned int v, size_t n) {
  COUNTED();
  return fill(dst, &v, sizeof v, n);
}
EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s) {
  COUNTED();
  (void)s;
  return fill(dst, &v, sizeof v, n);
}

/* ---- the virtual memory API ---- */

#define VMM_MAGIC 0x564d4d53u

struct vmmHandle {
  unsigned magic;
  int fd;
  size_t size;
  CUmemAllocationHandleType types;
};

static struct vmmHandle *vmmOf(CUmemGenericAllocationHandle h) {
  struct vmmHandle *v = (struct vmmHandle *)(uintptr_t)h;
  return v && v->magic == VMM_MAGIC ? v : NULL;
}

static CUresult newHandle(int fd, size_t size, CUmemAllocationHandleType types, CUmemGenericAllocationHandle *out) {
  struct vmmHandle *v = calloc(1, sizeof *v);
  if (v == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  v->magic = VMM_MAGIC, v->fd = fd, v->size = size, v->types = types;
  *out = (CUmemGenericAllocationHandle)(uintptr_t)v;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option) {
  COUNTED();
  (void)option;
  if (granularity == NULL || prop == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && !validDevice(prop->location.id))
    return CUDA_ERROR_INVALID_DEVICE;
  *granularity = GRANULARITY;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
  COUNTED();
  if (handle == NULL || prop == NULL || flags != 0 || size == 0 || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && !validDevice(prop->location.id))
    return CUDA_ERROR_INVALID_DEVICE;
  int fd = memfd_create("cuda_standin_vmm", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult res = ftruncate(fd, (off_t)size) == 0 ? newHandle(fd, size, prop->requestedHandleTypes, handle)
                                                  : CUDA_ERROR_OUT_OF_MEMORY;
  if (res != CUDA_SUCCESS) close(fd);
  return res;
}

/* Mappings keep the pages alive; the handle's fd goes now. */
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  COUNTED();
  struct vmmHandle *v = vmmOf(handle);
  if (v == NULL) return CUDA_ERROR_INVALID_VALUE;
  close(v->fd);
  v->magic = 0;
  free(v);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                    unsigned long long flags) {
  COUNTED();
  (void)addr;
  if (ptr == NULL || size == 0 || size % GRANULARITY || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment == 0) alignment = GRANULARITY;
  if (alignment & (alignment - 1)) return CUDA_ERROR_INVALID_VALUE;
  size_t span = size + alignment;
  char *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  char *base = (char *)roundUp((uintptr_t)p, alignment);
  if (base > p) munmap(p, (size_t)(base - p));
  if (base + size < p + span) munmap(base + size, (size_t)(p + span - (base + size)));
  if (addRegion((uintptr_t)base, size, REGION_RESERVED, -1) != CUDA_SUCCESS) {
    munmap(base, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *ptr = (CUdeviceptr)(uintptr_t)base;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  COUNTED();
  struct region r;
  if (!takeRegion((uintptr_t)ptr, size, REGION_RESERVED, &r)) return CUDA_ERROR_INVALID_VALUE;
  munmap((void *)r.base, r.size);
  return CUDA_SUCCESS;
}

/* Mapped without access: cuMemSetAccess gives it. */
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags) {
  COUNTED();
  struct vmmHandle *v = vmmOf(handle);
  struct region r;
  if (v == NULL || flags != 0 || size == 0 || size % GRANULARITY || offset % GRANULARITY || offset + size > v->size)
    return CUDA_ERROR_INVALID_VALUE;
  if (!findRegion((uintptr_t)ptr, REGION_RESERVED, &r) || (uintptr_t)ptr + size > r.base + r.size)
    return CUDA_ERROR_INVALID_VALUE;
  if (findRegion((uintptr_t)ptr, REGION_MAPPED, &r)) return CUDA_ERROR_INVALID_VALUE;
  void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, v->fd, (off_t)offset);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  return addRegion((uintptr_t)ptr, size, REGION_MAPPED, -1);
}

/* The range goes back to a PROT_NONE reservation. */
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  COUNTED();
  struct region r;
  if (!takeRegion((uintptr_t)ptr, size, REGION_MAPPED, &r)) return CUDA_ERROR_INVALID_VALUE;
  mmap((void *)r.base, r.size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
  COUNTED();
  struct region r;
  if (desc == NULL || count == 0) return CUDA_ERROR_INVALID_VALUE;
  if (!findRegion((uintptr_t)ptr, REGION_MAPPED, &r) || (uintptr_t)ptr + size > r.base + r.size)
    return CUDA_ERROR_INVALID_VALUE;
  int prot = PROT_NONE;
  for (size_t i = 0; i < count; i++) {
    if (desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE && !validDevice(desc[i].location.id))
      return CUDA_ERROR_INVALID_DEVICE;
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ) prot |= PROT_READ;
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) prot |= PROT_READ | PROT_WRITE;
  }
  return mprotect((void *)(uintptr_t)ptr, size, prot) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                             CUmemAllocationHandleType handleType, unsigned long long flags) {
  COUNTED();
  struct vmmHandle *v = vmmOf(handle);
  if (shareableHandle == NULL || v == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !(v->types & handleType)) return CUDA_ERROR_NOT_SUPPORTED;
  int fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *(int *)shareableHandle = fd;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                               CUmemAllocationHandleType shHandleType) {
  COUNTED();
  struct stat st;
  int fd = (int)(intptr_t)osHandle;
  if (handle == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  if (fstat(fd, &st) != 0) return CUDA_ERROR_INVALID_VALUE;
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult res = newHandle(own, (size_t)st.st_size, shHandleType, handle);
  if (res != CUDA_SUCCESS) close(own);
  return res;
}

/* No dma-bufs: CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0. */
EXPORT CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                              CUmemRangeHandleType handleType, unsigned long long flags) {
  COUNTED();
  (void)handle, (void)dptr, (void)size, (void)handleType, (void)flags;
  return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- IPC: another process opens the exporter's memfd through /proc/<pid>/fd ---- */

struct ipcHandle {
  char magic[8];
  int pid, fd;
  uint64_t size, id;
};

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
  COUNTED();
  struct region r;
  struct ipcHandle h = {"STANDIN", (int)getpid(), 0, 0, 0};
  _Static_assert(sizeof h <= sizeof pHandle->reserved, "an IPC handle holds 64 bytes");
  if (pHandle == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!findRegion((uintptr_t)dptr, REGION_DEVICE, &r)) return CUDA_ERROR_INVALID_VALUE;
  h.fd = r.fd, h.size = r.size, h.id = r.id;
  memset(pHandle, 0, sizeof *pHandle);
  memcpy(pHandle->reserved, &h, sizeof h);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) {
  COUNTED();
  struct ipcHandle h;
  char path[64];
  (void)flags;
  if (pdptr == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (current() == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  memcpy(&h, handle.reserved, sizeof h);
  if (memcmp(h.magic, "STANDIN", 8) != 0) return CUDA_ERROR_INVALID_VALUE;
  snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  void *p = mmap(NULL, (size_t)h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  if (addRegion((uintptr_t)p, (size_t)h.size, REGION_IPC, -1) != CUDA_SUCCESS) {
    munmap(p, (size_t)h.size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *pdptr = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  COUNTED();
  struct region r;
  if (!takeRegion((uintptr_t)dptr, 0, REGION_IPC, &r)) return CUDA_ERROR_INVALID_VALUE;
  munmap((void *)r.base, r.size);
  return CUDA_SUCCESS;
}

/* ---- streams: always done; the legacy (NULL, 0x1) and per-thread (0x2) streams are valid ---- */

#define STREAM_MAGIC 0x5354524du

struct CUstream_st {
  unsigned magic;
  unsigned flags;
  int priority;
  CUcontext ctx;
  unsigned long long id;
  int primaryDev;        /* the device of its primary context, or -1 */
  unsigned resets;       /* that context's resets when it was made */
  long long busyUntil;   /* CLOCK_MONOTONIC ns when its launches so far are done */
};

static unsigned long long nextStreamId = 16;

/* The slow GPU of CUDA_STANDIN_LAUNCH_US: ns per launch (0: everything done at once), and the
 * lock that orders the streams' and events' times. */
static long long launchNs = -1;
static pthread_mutex_t gpuTime = PTHREAD_MUTEX_INITIALIZER;
static long long monoNs(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}
static long long perLaunchNs(void) {
  long long v = __atomic_load_n(&launchNs, __ATOMIC_RELAXED);
  if (v < 0) {
    const char *env = getenv("CUDA_STANDIN_LAUNCH_US");
    v = env && atoll(env) > 0 ? atoll(env) * 1000LL : 0;
    __atomic_store_n(&launchNs, v, __ATOMIC_RELAXED);
  }
  return v;
}
/* Sleeps until CLOCK_MONOTONIC reaches `until` ns. */
static void sleepUntil(long long until) {
  for (long long now = monoNs(); now < until; now = monoNs()) {
    struct timespec d = {(until - now) / 1000000000LL, (until - now) % 1000000000LL};
    nanosleep(&d, NULL);
  }
}

static int builtinStream(CUstream s) { return (uintptr_t)s <= 2; }
/* A stream of a primary context reset since it was made: freed memory in the real driver. */
static int resetAway(CUstream s) {
  return s->primaryDev >= 0 && __atomic_load_n(&primaries[s->primaryDev].resets, __ATOMIC_RELAXED) != s->resets;
}
static int validStream(CUstream s) { return builtinStream(s) || (s->magic == STREAM_MAGIC && !resetAway(s)); }

static CUresult streamCreate(CUstream *phStream, unsigned int flags, int priority) {
  if (phStream == NULL || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
  if (current() == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (s == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  s->magic = STREAM_MAGIC, s->flags = flags, s->priority = priority, s->ctx = current();
  s->primaryDev = s->ctx->primary ? s->ctx->dev : -1;
  s->resets = s->ctx->primary ? __atomic_load_n(&s->ctx->resets, __ATOMIC_RELAXED) : 0;
  s->id = __atomic_fetch_add(&nextStreamId, 1, __ATOMIC_RELAXED);
  *phStream = s;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
  COUNTED();
  return streamCreate(phStream, flags, priority);
}

EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int flags) {
  COUNTED();
  return streamCreate(phStream, flags, 0);
}

EXPORT CUresult cuStreamDestroy(CUstream hStream) {
  COUNTED();
  if (!builtinStream(hStream) && hStream->magic == STREAM_MAGIC && resetAway(hStream)) {
    fprintf(stderr, "cuda stand-in: cuStreamDestroy of stream %llu, whose primary context (device %d) was "
            "reset after it was made: the real driver reads freed memory here and crashes\n",
            hStream->id, hStream->primaryDev);
    abort();
  }
  if (builtinStream(hStream) || !validStream(hStream)) return CUDA_ERROR_INVALID_HANDLE;
  hStream->magic = 0;
  free(hStream);
  return CUDA_SUCCESS;
}

/* When a stream's work so far is done (0 for the legacy and per-thread streams). */
static long long streamDone(CUstream s) {
  if (builtinStream(s)) return 0;
  pthread_mutex_lock(&gpuTime);
  long long t = s->busyUntil;
  pthread_mutex_unlock(&gpuTime);
  return t;
}

EXPORT CUresult cuStreamQuery(CUstream hStream) {
  COUNTED();
  if (!validStream(hStream)) return CUDA_ERROR_INVALID_HANDLE;
  return streamDone(hStream) > monoNs() ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
  COUNTED();
  if (!validStream(hStream)) return CUDA_ERROR_INVALID_HANDLE;
  sleepUntil(streamDone(hStream));
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags) {
  COUNTED();
  if (flags == NULL || !validStream(hStream)) return CUDA_ERROR_INVALID_VALUE;
  *flags = builtinStream(hStream) ? 0 : hStream->flags;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetPriority(CUstream hStream, int *priority) {
  COUNTED();
  if (priority == NULL || !validStream(hStream)) return CUDA_ERROR_INVALID_VALUE;
  *priority = builtinStream(hStream) ? 0 : hStream->priority;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetId(CUstream hStream, unsigned long long *streamId) {
  COUNTED();
  if (streamId == NULL || !validStream(hStream)) return CUDA_ERROR_INVALID_VALUE;
  *streamId = builtinStream(hStream) ? (uintptr_t)hStream : hStream->id;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx) {
  COUNTED();
  if (pctx == NULL || !validStream(hStream)) return CUDA_ERROR_INVALID_VALUE;
  *pctx = builtinStream(hStream) ? current() : hStream->ctx;
  return *pctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static long long eventReadyAt(CUevent e);

EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int flags) {
  COUNTED();
  (void)flags;
  if (!validStream(hStream) || !hEvent) return CUDA_ERROR_INVALID_HANDLE;
  if (!builtinStream(hStream)) {
    long long ready = eventReadyAt(hEvent);
    pthread_mutex_lock(&gpuTime);
    if (hStream->busyUntil < ready) hStream->busyUntil = ready;
    pthread_mutex_unlock(&gpuTime);
  }
  return CUDA_SUCCESS;
}

/* Streams never capture. */
EXPORT CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
  COUNTED();
  if (captureStatus == NULL || !validStream(hStream)) return CUDA_ERROR_INVALID_VALUE;
  *captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out,
                                       CUgraph *graph_out, const CUgraphNode **dependencies_out,
                                       const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out) {
  COUNTED();
  if (captureStatus_out == NULL || !validStream(hStream)) return CUDA_ERROR_INVALID_VALUE;
  *captureStatus_out = CU_STREAM_CAPTURE_STATUS_NONE;
  if (id_out) *id_out = 0;
  if (graph_out) *graph_out = NULL;
  if (dependencies_out) *dependencies_out = NULL;
  if (edgeData_out) *edgeData_out = NULL;
  if (numDependencies_out) *numDependencies_out = 0;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamUpdateCaptureDependencies(CUstream hStream, CUgraphNode *dependencies,
                                                  const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                                  unsigned int flags) {
  COUNTED();
  (void)dependencies, (void)dependencyData, (void)numDependencies, (void)flags;
  return validStream(hStream) ? CUDA_ERROR_ILLEGAL_STATE : CUDA_ERROR_INVALID_VALUE;
}

static __thread CUstreamCaptureMode captureMode = CU_STREAM_CAPTURE_MODE_GLOBAL;

EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  COUNTED();
  if (mode == NULL) return CUDA_ERROR_INVALID_VALUE;
  CUstreamCaptureMode previous = captureMode;
  captureMode = *mode;
  *mode = previous;
  return CUDA_SUCCESS;
}

/* Stream memory operations, at once. A wait whose condition does not hold does not wait. */
EXPORT CUresult cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  COUNTED();
  (void)flags;
  if (!validStream(stream) || addr == 0 || addr % 4) return CUDA_ERROR_INVALID_VALUE;
  __atomic_store_n((cuuint32_t *)(uintptr_t)addr, value, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamWriteValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  COUNTED();
  (void)flags;
  if (!validStream(stream) || addr == 0 || addr % 8) return CUDA_ERROR_INVALID_VALUE;
  __atomic_store_n((cuuint64_t *)(uintptr_t)addr, value, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  COUNTED();
  (void)value, (void)flags;
  if (!validStream(stream) || addr == 0 || addr % 4) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamWaitValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  COUNTED();
  (void)value, (void)flags;
  if (!validStream(stream) || addr == 0 || addr % 8) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

/* ---- events: done as soon as recorded ---- */

#define EVENT_MAGIC 0x45564e54u

struct CUevent_st {
  unsigned magic;
  unsigned flags;
  int recorded;
  struct timespec when;
  long long readyAt; /* CLOCK_MONOTONIC ns when the work before its record is done */
};

static int validEvent(CUevent e) { return e != NULL && e->magic == EVENT_MAGIC; }
/* When the work before the event's last record is done (0: at once, or not the stand-in's). */
static long long eventReadyAt(CUevent e) { return validEvent(e) ? __atomic_load_n(&e->readyAt, __ATOMIC_ACQUIRE) : 0; }

EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int flags) {
  COUNTED();
  if (phEvent == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (current() == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  struct CUevent_st *e = calloc(1, sizeof *e);
  if (e == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  e->magic = EVENT_MAGIC, e->flags = flags;
  *phEvent = e;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy(CUevent hEvent) {
  COUNTED();
  if (!validEvent(hEvent)) return CUDA_ERROR_INVALID_HANDLE;
  hEvent->magic = 0;
  free(hEvent);
  return CUDA_SUCCESS;
}

static CUresult record(CUevent e, CUstream s) {
  if (!validEvent(e) || !validStream(s)) return CUDA_ERROR_INVALID_HANDLE;
  e->recorded = 1;
  if (!(e->flags & CU_EVENT_DISABLE_TIMING)) clock_gettime(CLOCK_MONOTONIC, &e->when);
  long long ready = 0;
  if (!builtinStream(s) && perLaunchNs() > 0) {
    pthread_mutex_lock(&gpuTime);
    ready = s->busyUntil;
    pthread_mutex_unlock(&gpuTime);
  }
  __atomic_store_n(&e->readyAt, ready, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  COUNTED();
  return record(hEvent, hStream);
}

EXPORT CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
  COUNTED();
  (void)flags;
  return record(hEvent, hStream);
}

EXPORT CUresult cuEventQuery(CUevent hEvent) {
  COUNTED();
  if (!validEvent(hEvent)) return CUDA_ERROR_INVALID_HANDLE;
  return eventReadyAt(hEvent) > monoNs() ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
  COUNTED();
  if (!validEvent(hEvent)) return CUDA_ERROR_INVALID_HANDLE;
  sleepUntil(eventReadyAt(hEvent));
  return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
  COUNTED();
  if (pMilliseconds == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!validEvent(hStart) || !validEvent(hEnd) || ((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING))
    return CUDA_ERROR_INVALID_HANDLE;
  if (!hStart->recorded || !hEnd->recorded) return CUDA_ERROR_INVALID_HANDLE;
  *pMilliseconds = (float)((hEnd->when.tv_sec - hStart->when.tv_sec) * 1e3 +
                           (hEnd->when.tv_nsec - hStart->when.tv_nsec) / 1e6);
  return CUDA_SUCCESS;
}

/* ---- modules, libraries, functions: handles by name; launches run nothing ---- */

#define MODULE_MAGIC 0x4d4f444cu
#define FUNC_MAGIC 0x46554e43u
#define FUNC_REGS 64

struct CUfunc_st {
  unsigned magic;
  char name[128];
  int maxDynamicSmem;
  struct CUmod_st *module;
  struct CUfunc_st *next;
};

struct CUkern_st {
  struct CUfunc_st *func;
  struct CUkern_st *next;
};

struct CUmod_st {
  unsigned magic;
  struct CUfunc_st *funcs;
  struct CUkern_st *kernels;
};

struct CUlib_st {
  struct CUmod_st module;
};

static pthread_mutex_t modulesLock = PTHREAD_MUTEX_INITIALIZER;

static int validModule(CUmodule m) { return m != NULL && m->magic == MODULE_MAGIC; }
static int validFunc(CUfunction f) { return f != NULL && f->magic == FUNC_MAGIC; }

/* The function `name` of module m, made on first lookup. */
static struct CUfunc_st *functionOf(struct CUmod_st *m, const char *name) {
  struct CUfunc_st *f;
  pthread_mutex_lock(&modulesLock);
  for (f = m->funcs; f && strcmp(f->name, name); f = f->next) {}
  if (f == NULL && strlen(name) < sizeof f->name && (f = calloc(1, sizeof *f)) != NULL) {
    f->magic = FUNC_MAGIC, f->maxDynamicSmem = DEFAULT_DYN_SMEM, f->module = m;
    strcpy(f->name, name);
    f->next = m->funcs;
    m->funcs = f;
  }
  pthread_mutex_unlock(&modulesLock);
  return f;
}

static void freeModule(struct CUmod_st *m) {
  while (m->funcs) {
    struct CUfunc_st *f = m->funcs;
    m->funcs = f->next;
    f->magic = 0;
    free(f);
  }
  while (m->kernels) {
    struct CUkern_st *k = m->kernels;
    m->kernels = k->next;
    free(k);
  }
  m->magic = 0;
}

static CUresult moduleLoad(CUmodule *module, const void *image) {
  if (module == NULL || image == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (current() == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  struct CUmod_st *m = calloc(1, sizeof *m);
  if (m == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  m->magic = MODULE_MAGIC;
  *module = m;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  COUNTED();
  return moduleLoad(module, image);
}

EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options,
                                   void **optionValues) {
  COUNTED();
  (void)numOptions, (void)options, (void)optionValues;
  return moduleLoad(module, image);
}

EXPORT CUresult cuModuleUnload(CUmodule hmod) {
  COUNTED();
  if (!validModule(hmod)) return CUDA_ERROR_INVALID_HANDLE;
  freeModule(hmod);
  free(hmod);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
  COUNTED();
  if (hfunc == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!validModule(hmod)) return CUDA_ERROR_INVALID_HANDLE;
  *hfunc = functionOf(hmod, name);
  return *hfunc ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                  void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                                  void **libraryOptionValues, unsigned int numLibraryOptions) {
  COUNTED();
  (void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
  (void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
  if (library == NULL || code == NULL) return CUDA_ERROR_INVALID_VALUE;
  struct CUlib_st *l = calloc(1, sizeof *l);
  if (l == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  l->module.magic = MODULE_MAGIC;
  *library = l;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuLibraryUnload(CUlibrary library) {
  COUNTED();
  if (library == NULL || !validModule(&library->module)) return CUDA_ERROR_INVALID_HANDLE;
  freeModule(&library->module);
  free(library);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuLibraryGetModule(CUmodule *pMod, CUlibrary library) {
  COUNTED();
  if (pMod == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (library == NULL || !validModule(&library->module)) return CUDA_ERROR_INVALID_HANDLE;
  *pMod = &library->module;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name) {
  COUNTED();
  if (pKernel == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (library == NULL || !validModule(&library->module)) return CUDA_ERROR_INVALID_HANDLE;
  struct CUfunc_st *f = functionOf(&library->module, name);
  if (f == NULL) return CUDA_ERROR_NOT_FOUND;
  struct CUkern_st *k;
  pthread_mutex_lock(&modulesLock);
  for (k = library->module.kernels; k && k->func != f; k = k->next) {}
  if (k == NULL && (k = calloc(1, sizeof *k)) != NULL) {
    k->func = f;
    k->next = library->module.kernels;
    library->module.kernels = k;
  }
  pthread_mutex_unlock(&modulesLock);
  *pKernel = k;
  return k ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel) {
  COUNTED();
  if (pFunc == NULL || kernel == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (current() == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  *pFunc = kernel->func;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncLoad(CUfunction function) {
  COUNTED();
  return validFunc(function) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuFuncIsLoaded(CUfunctionLoadingState *state, CUfunction function) {
  COUNTED();
  if (state == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!validFunc(function)) return CUDA_ERROR_INVALID_HANDLE;
  *state = CU_FUNCTION_LOADING_STATE_LOADED;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc) {
  COUNTED();
  if (pi == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!validFunc(hfunc)) return CUDA_ERROR_INVALID_HANDLE;
  switch (attrib) {
  case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
  case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = FUNC_REGS; break;
  case CU_FUNC_ATTRIBUTE_PTX_VERSION: *pi = 90; break;
  case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = 90; break;
  case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = hfunc->maxDynamicSmem; break;
  case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *pi = -1; break;
  default: *pi = 0; break;
  }
  return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
  COUNTED();
  if (!validFunc(hfunc)) return CUDA_ERROR_INVALID_HANDLE;
  if (attrib == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    if (value < 0 || value > MAX_DYN_SMEM) return CUDA_ERROR_INVALID_VALUE;
    hfunc->maxDynamicSmem = value;
  }
  return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
  COUNTED();
  (void)config;
  return validFunc(hfunc) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Resident blocks of `blockSize` threads per SM: limited by threads, registers, blocks and
 * shared memory, as on an SM of 2048 threads, 64 Ki registers and 228 KiB. */
static int blocksPerSm(int blockSize, size_t dynamicSmem) {
  if (blockSize <= 0 || blockSize > 1024) return 0;
  int warps = (blockSize + 31) / 32;
  int byThreads = 2048 / (warps * 32);
  int byRegs = 65536 / (warps * 32 * FUNC_REGS);
  int bySmem = (int)(233472 / (dynamicSmem + 1024));
  int n = byThreads < byRegs ? byThreads : byRegs;
  n = n < bySmem ? n : bySmem;
  return n < 32 ? n : 32;
}

EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize,
                                                            size_t dynamicSMemSize) {
  COUNTED();
  if (numBlocks == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!validFunc(func)) return CUDA_ERROR_INVALID_HANDLE;
  *numBlocks = blocksPerSm(blockSize, dynamicSMemSize);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, CUfunction func, int blockSize,
                                                                     size_t dynamicSMemSize, unsigned int flags) {
  COUNTED();
  (void)flags;
  if (numBlocks == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!validFunc(func)) return CUDA_ERROR_INVALID_HANDLE;
  *numBlocks = blocksPerSm(blockSize, dynamicSMemSize);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuOccupancyMaxPotentialBlockSize(int *minGridSize, int *blockSize, CUfunction func,
                                                 CUoccupancyB2DSize blockSizeToDynamicSMemSize, size_t dynamicSMemSize,
                                                 int blockSizeLimit) {
  COUNTED();
  if (minGridSize == NULL || blockSize == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!validFunc(func)) return CUDA_ERROR_INVALID_HANDLE;
  int block = blockSizeLimit > 0 && blockSizeLimit < 1024 ? blockSizeLimit : 1024;
  size_t smem = blockSizeToDynamicSMemSize ? blockSizeToDynamicSMemSize(block) : dynamicSMemSize;
  *blockSize = block;
  *minGridSize = blocksPerSm(block, smem) * 132;
  return CUDA_SUCCESS;
}

/* A launch's configuration checked as the driver would; nothing runs. */
static CUresult checkLaunch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, unsigned smem, CUstream s, void **params, void **extra) {
  if (!validFunc(f) || !validStream(s)) return CUDA_ERROR_INVALID_HANDLE;
  if (current() == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (!gx || !gy || !gz || !bx || !by || !bz || gy > 65535 || gz > 65535) return CUDA_ERROR_INVALID_VALUE;
  if ((unsigned long)bx * by * bz > 1024 || bz > 64) return CUDA_ERROR_INVALID_VALUE;
  if ((int)smem > f->maxDynamicSmem) return CUDA_ERROR_INVALID_VALUE;
  if (params && extra) return CUDA_ERROR_INVALID_VALUE;
  for (void **e = extra; e && *e != CU_LAUNCH_PARAM_END; e += 2) {
    if (*e == CU_LAUNCH_PARAM_BUFFER_SIZE && *(size_t *)e[1] > MAX_PARAM_BYTES) return CUDA_ERROR_INVALID_VALUE;
    if (*e != CU_LAUNCH_PARAM_BUFFER_SIZE && *e != CU_LAUNCH_PARAM_BUFFER_POINTER) return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

/* The one kernel whose effect is done here: oxccl's plain copy, ox_copy_kernel(char *dst,
 * const char *src, uint64_t bytes), is a memcpy, so a one-rank collective's data can be
 * checked whether the library copies with the driver or with that kernel. */
static CUresult runKnownKernel(CUfunction f, void **params) {
  if (params == NULL || strcmp(f->name, "ox_copy_kernel") != 0) return CUDA_SUCCESS;
  return copy(*(CUdeviceptr *)params[0], *(CUdeviceptr *)params[1], (size_t)*(uint64_t *)params[2]);
}

/* A launch on `s` keeps it busy for CUDA_STANDIN_LAUNCH_US after its earlier work. */
static void occupy(CUstream s) {
  long long ns = perLaunchNs();
  if (ns == 0 || builtinStream(s)) return;
  pthread_mutex_lock(&gpuTime);
  long long now = monoNs();
  s->busyUntil = (s->busyUntil > now ? s->busyUntil : now) + ns;
  pthread_mutex_unlock(&gpuTime);
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                               unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                               unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra) {
  COUNTED();
  CUresult r = checkLaunch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                           hStream, kernelParams, extra);
  if (r == CUDA_SUCCESS) occupy(hStream);
  return r == CUDA_SUCCESS ? runKnownKernel(f, kernelParams) : r;
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
  COUNTED();
  if (config == NULL) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = checkLaunch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                           config->blockDimY, config->blockDimZ, config->sharedMemBytes, config->hStream,
                           kernelParams, extra);
  if (r == CUDA_SUCCESS) occupy(config->hStream);
  return r;
}
