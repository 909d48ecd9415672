/*
 * oxtest_net.c: a small NCCL net plugin, "OxTest", for oxccl's tests of the net-plugin ABI.
 * It is loaded both by oxccl (src/transport/net/plugin.rs) and by NVIDIA's libnccl.so.2
 * (NCCL_NET_PLUGIN=/path/liboxtest_net.so NCCL_NET=OxTest).
 *
 * What it is:
 *   - One device, "OxTest0": TCP over IPv4, listening on 127.0.0.1 (env OXTEST_NET_ADDR
 *     overrides the address), host memory only (ptrSupport = NCCL_PTR_HOST); with
 *     OXTEST_PTR_CUDA=1 in the environment (or built with -DOXTEST_PTR_CUDA) CUDA memory too
 *     (NCCL_PTR_HOST | NCCL_PTR_CUDA), as a GPUDirect RDMA plugin, without a NIC that reads
 *     GPU memory: see "CUDA memory" below. With OXTEST_PTR_DMABUF=1 it takes CUDA memory
 *     only as dma-bufs (NCCL_PTR_HOST | NCCL_PTR_DMABUF, regMrDmaBuf): the descriptor must
 *     be a dma-buf (its /proc/self/fdinfo names an exporter), then the memory moves as CUDA
 *     memory does.
 *   - Exports ncclNetPlugin_v8, _v9, _v10 and _v11, sharing one implementation.
 *   - Everything is non-blocking. connect takes at least two calls: the first starts a
 *     non-blocking TCP connect and keeps its socket in the handle (as NVIDIA's plugins keep
 *     their connect stage in the handle), a later one finishes it and sends a hello; accept
 *     returns a comm once a connection with a valid hello has arrived. A caller may
 *     therefore connect before the other side accepts, from the same thread.
 *   - A message is an 8-byte size header and the bytes. Requests of a comm complete in the
 *     order they were posted and make progress in isend/irecv/test; irecv's size is the most
 *     it accepts (a longer message fails with ncclInternalError), test reports the size
 *     actually received. Tags are ignored: a comm connects one sender to one receiver, and
 *     messages match in order. One receive per irecv (maxRecvs = 1); iflush has nothing to
 *     flush for host memory and returns no request.
 *
 * Built by ffi-tests/run.sh and by the cargo tests as
 *   cc -shared -fPIC -O2 -Wall -Werror -o liboxtest_net.so oxtest_net.c
 * Test variants: -DOXTEST_FAIL_INIT (init fails), -DOXTEST_EXPORT_ONLY=N (exports only
 * ncclNetPlugin_vN, N in 7..11; 7 is a version oxccl does not load), -DOXTEST_PTR_CUDA (CUDA
 * memory without the environment variable). With OXTEST_HOLD_AFTER=N in the environment, once
 * N requests of the process have completed every later test call never returns (a plugin
 * hung in a call: the caller's destroy and abort must still return).
 * closeSend / closeRecv of a comm with requests still in flight (posted, not yet reported done
 * by test) logs a WARN line saying how many, as aws-ofi-nccl does, and adds them to a
 * process-wide count that oxtest_requests_in_flight_at_close() returns.
 *
 * The ABI types below are written from NVIDIA's 2.28.9 headers (nccl_net.h, net_v8.h ..
 * net_v11.h, net_device.h, nccl_common.h); NVIDIA's headers are not included.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ---- the ABI ---- */

typedef enum {
  ncclSuccess = 0,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
} ncclResult_t;

enum { OX_LOG_WARN = 2, OX_LOG_INFO = 3, OX_LOG_TRACE = 5 };
#define OX_SUBSYS_NET 0x10
#define OX_PTR_HOST 0x1
#define OX_PTR_CUDA 0x2
#define OX_PTR_DMABUF 0x4
#define OX_HANDLE_MAXSIZE 128
#define OX_MAX_DEVS_PER_NIC 4
#define OX_MAX_NET_SIZE (1024L * 1024L * 1024L)

typedef void (*oxLogger_t)(int level, unsigned long flags, const char* file, int line,
                           const char* fmt, ...);
typedef ncclResult_t (*oxProfilerCallback_t)(void** eHandle, int type, void* pHandle,
                                             int64_t pluginId, void* extData);

typedef struct {
  int netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} oxDevHandle;

typedef struct {
  int ndevs;
  int devs[OX_MAX_DEVS_PER_NIC];
} oxVDeviceProps;

typedef struct {
  int trafficClass;
} oxCommConfig;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
} oxProps_v8;

/* ncclNetProperties_v9_t and _v10_t. */
typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
  oxVDeviceProps vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
} oxProps_v10;

/* ncclNetProperties_v11_t: v10's fields, then maxMultiRequestSize. */
typedef struct {
  oxProps_v10 base;
  int maxMultiRequestSize;
} oxProps_v11;

/* The entries with one signature in every version. */
#define OX_SHARED_ENTRIES                                                                  \
  ncclResult_t (*accept)(void* listenComm, void** recvComm, oxDevHandle** recvDevComm);     \
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);     \
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t off,  \
                              int fd, void** mhandle);                                     \
  ncclResult_t (*deregMr)(void* comm, void* mhandle);

#define OX_SHARED_TAIL                                                                     \
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,   \
                         void** request);                                                  \
  ncclResult_t (*test)(void* request, int* done, int* sizes);                              \
  ncclResult_t (*closeSend)(void* sendComm);                                               \
  ncclResult_t (*closeRecv)(void* recvComm);                                               \
  ncclResult_t (*closeListen)(void* listenComm);                                           \
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);             \
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);

typedef struct {
  const char* name;
  ncclResult_t (*init)(oxLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, oxProps_v8* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm, oxDevHandle** sendDevComm);
  OX_SHARED_ENTRIES
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags,
                        void** mhandles, void** request);
  OX_SHARED_TAIL
} oxNet_v8;

typedef struct {
  const char* name;
  ncclResult_t (*init)(oxLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, oxProps_v10* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm, oxDevHandle** sendDevComm);
  OX_SHARED_ENTRIES
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** request);
  OX_SHARED_TAIL
  ncclResult_t (*makeVDevice)(int* d, oxVDeviceProps* props);
} oxNet_v9;

typedef struct {
  const char* name;
  ncclResult_t (*init)(oxLogger_t logFunction, oxProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, oxProps_v10* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, oxCommConfig* config, void* handle, void** sendComm,
                          oxDevHandle** sendDevComm);
  OX_SHARED_ENTRIES
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
  OX_SHARED_TAIL
  ncclResult_t (*makeVDevice)(int* d, oxVDeviceProps* props);
} oxNet_v10;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, oxCommConfig* config,
                       oxLogger_t logFunction, oxProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, oxProps_v11* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                          oxDevHandle** sendDevComm);
  OX_SHARED_ENTRIES
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
  OX_SHARED_TAIL
  ncclResult_t (*makeVDevice)(int* d, oxVDeviceProps* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, void* netAttr);
} oxNet_v11;

#if defined(__LP64__)
_Static_assert(sizeof(oxDevHandle) == 32, "ncclNetDeviceHandle_t");
_Static_assert(sizeof(oxProps_v8) == 64, "ncclNetProperties_v8_t");
_Static_assert(sizeof(oxProps_v10) == 104, "ncclNetProperties_v10_t");
_Static_assert(offsetof(oxProps_v10, maxP2pBytes) == 88, "maxP2pBytes");
_Static_assert(sizeof(oxProps_v11) == 112, "ncclNetProperties_v11_t");
_Static_assert(offsetof(oxProps_v11, maxMultiRequestSize) == 104, "maxMultiRequestSize");
_Static_assert(sizeof(oxNet_v8) == 19 * 8, "ncclNet_v8_t");
_Static_assert(sizeof(oxNet_v9) == 20 * 8, "ncclNet_v9_t");
_Static_assert(sizeof(oxNet_v10) == 20 * 8, "ncclNet_v10_t");
_Static_assert(sizeof(oxNet_v11) == 22 * 8, "ncclNet_v11_t");
_Static_assert(offsetof(oxNet_v11, test) == 13 * 8, "ncclNet_v11_t.test");
#endif

/* ---- the plugin's state ---- */

#define OX_HELLO 0x6f78746573746e31ULL /* "oxtestn1" */
#define OX_CTX_MAGIC 0x6f78637478ULL
#define OX_MAX_REQUESTS 32

static oxLogger_t oxLog;
static struct in_addr oxAddr;

#define OXLOG(level, ...)                                                                  \
  do {                                                                                     \
    if (oxLog) oxLog(level, OX_SUBSYS_NET, __FILE__, __LINE__, __VA_ARGS__);               \
  } while (0)
#define OXWARN(...) OXLOG(OX_LOG_WARN, __VA_ARGS__)

/* What listen hands the sender. stageFd is the plugin's own state of a connect in progress
 * (its socket + 1; 0 means none): the caller passes the same handle to each connect call. */
struct oxHandle {
  uint64_t magic;
  struct sockaddr_in addr;
  int stageFd;
};
_Static_assert(sizeof(struct oxHandle) <= OX_HANDLE_MAXSIZE, "handle too large");

struct oxListenComm {
  int fd;
  int pendingFd; /* an accepted socket whose hello has not fully arrived, or -1 */
  uint64_t hello;
  size_t helloBytes;
};

struct oxComm;

struct oxMr;

struct oxRequest {
  struct oxComm* comm;
  int used;
  int done;
  char* data;    /* where the bytes move: the caller's buffer, or a CUDA buffer's shadow */
  struct oxMr* cudaMr; /* a receive into CUDA memory: copied to cudaDst once complete */
  char* cudaDst;
  size_t size;   /* a send's size, a receive's most */
  uint64_t header;
  size_t headerBytes;
  size_t dataBytes;
};

struct oxComm {
  int fd;
  int isSend;
  ncclResult_t failed;
  uint64_t posted;     /* requests posted */
  uint64_t completed;  /* requests whose bytes have all moved, in order */
  struct oxRequest reqs[OX_MAX_REQUESTS];
};

struct oxMr {
  char* data;
  size_t size;
  int type;     /* OX_PTR_HOST or OX_PTR_CUDA */
  char* shadow; /* CUDA memory: its host shadow, as large (pinned) */
  void* memCtx; /* CUDA memory: the primary context of its device (the memory's) */
  void* ctx;    /* CUDA memory: the context the copies run in (see oxCopyContext) */
  void* stream; /* CUDA memory: a non-blocking stream of ctx for the copies */
  unsigned long long staging; /* own context: as large, device memory of ctx */
};

struct oxCtx {
  uint64_t magic;
  uint64_t commId;
  int trafficClass;
};

/* ---- CUDA memory ----
 * With OXTEST_PTR_CUDA=1 the plugin also registers CUDA memory (regMr of type NCCL_PTR_CUDA),
 * as a GPUDirect RDMA plugin does. A CUDA registration gets a host shadow of the same size;
 * a send copies its bytes from the GPU into the shadow when it is posted and sends from
 * there; a receive lands in the shadow and is copied to the GPU before test reports it done,
 * so iflush has nothing to flush. The CUDA driver is opened at run time (libcuda.so.1) at the
 * first CUDA registration. Copies run from whichever thread calls the plugin, on a
 * non-blocking stream of the registration's, into a pinned shadow, and are waited for,
 * polling the stream (a copy still running after 5 s is logged): a copy from pageable memory
 * may return before its bytes reach the GPU.
 *
 * Which context the copies run in (OXTEST_CUDA_CONTEXT) matters with several ranks in one
 * process. A kernel waiting for a receive's bytes runs until the copy has landed them, and the
 * GPU feeds the streams of one context through a few hardware queues
 * (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default): a copy queued behind another stream's work that
 * waits for that kernel (another rank's stream waiting for the launch that carries it) never
 * runs. NVIDIA's advice for CUDA calls from a progress thread is a context of its own.
 *   primary (default)  the primary context of the memory's device, the kernels' own: fast,
 *                      and safe with one rank per process, whose streams never wait for a
 *                      running kernel of another stream;
 *   own                a context the plugin creates per device, whose queues hold only its
 *                      copies: through a device staging buffer of the registration's and
 *                      cuMemcpyPeerAsync, since a copy straight into the primary context's
 *                      memory is queued in that context (measured: it hung with one queue).
 *                      The GPU time-slices between the contexts, so each copy may wait
 *                      milliseconds for its turn. */

/* OXTEST_HOLD_AFTER=N: once N requests of the process have completed, every later test call
 * never returns (a plugin that hangs in a call, for the caller's abort path). Set at init. */
static long oxHoldAfter = -1;
static long oxCompleted; /* requests reported done, process-wide (atomic) */
static int oxCudaPointers; /* set at init */
static int oxDmaBufPointers; /* set at init (OXTEST_PTR_DMABUF=1) */
enum { OX_CTX_PRIMARY, OX_CTX_OWN };
static int oxCopyContext; /* set at init (OXTEST_CUDA_CONTEXT) */

static struct {
  int loaded;
  int (*pointerGetAttribute)(void* data, int attribute, unsigned long long ptr);
  int (*primaryCtxRetain)(void** ctx, int dev);
  int (*ctxPush)(void* ctx);
  int (*ctxPop)(void** ctx);
  int (*memcpyDtoHAsync)(void* dst, unsigned long long src, size_t bytes, void* stream);
  int (*memcpyHtoDAsync)(unsigned long long dst, const void* src, size_t bytes, void* stream);
  int (*streamCreate)(void** stream, unsigned flags);
  int (*streamQuery)(void* stream);
  int (*streamDestroy)(void* stream);
  int (*memHostAlloc)(void** p, size_t bytes, unsigned flags);
  int (*memFreeHost)(void* p);
  /* an own context only */
  int (*deviceGet)(int* device, int ordinal);
  int (*ctxCreate)(void** ctx, unsigned flags, int device);
  int (*memAlloc)(unsigned long long* dptr, size_t bytes);
  int (*memFree)(unsigned long long dptr);
  int (*memcpyPeerAsync)(unsigned long long dst, void* dstCtx, unsigned long long src,
                         void* srcCtx, size_t bytes, void* stream);
} oxCu;

#define OX_MAX_CUDA_DEVICES 64
static void* oxOwnCtx[OX_MAX_CUDA_DEVICES]; /* the plugin's context per device, made once */

#define OX_CU_STREAM_NON_BLOCKING 1
#define OX_CUDA_ERROR_NOT_READY 600

#define OX_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9

static ncclResult_t oxCudaLoadLocked(void) {
  if (oxCu.loaded) return ncclSuccess;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    OXWARN("NET/OxTest : CUDA memory needs libcuda.so.1: %s", dlerror());
    return ncclSystemError;
  }
  *(void**)&oxCu.pointerGetAttribute = dlsym(lib, "cuPointerGetAttribute");
  *(void**)&oxCu.primaryCtxRetain = dlsym(lib, "cuDevicePrimaryCtxRetain");
  *(void**)&oxCu.ctxPush = dlsym(lib, "cuCtxPushCurrent_v2");
  *(void**)&oxCu.ctxPop = dlsym(lib, "cuCtxPopCurrent_v2");
  *(void**)&oxCu.memcpyDtoHAsync = dlsym(lib, "cuMemcpyDtoHAsync_v2");
  *(void**)&oxCu.memcpyHtoDAsync = dlsym(lib, "cuMemcpyHtoDAsync_v2");
  *(void**)&oxCu.streamCreate = dlsym(lib, "cuStreamCreate");
  *(void**)&oxCu.streamQuery = dlsym(lib, "cuStreamQuery");
  *(void**)&oxCu.streamDestroy = dlsym(lib, "cuStreamDestroy_v2");
  *(void**)&oxCu.memHostAlloc = dlsym(lib, "cuMemHostAlloc");
  *(void**)&oxCu.memFreeHost = dlsym(lib, "cuMemFreeHost");
  if (!oxCu.pointerGetAttribute || !oxCu.primaryCtxRetain || !oxCu.ctxPush || !oxCu.ctxPop ||
      !oxCu.memcpyDtoHAsync || !oxCu.memcpyHtoDAsync || !oxCu.streamCreate ||
      !oxCu.streamQuery || !oxCu.streamDestroy || !oxCu.memHostAlloc ||
      !oxCu.memFreeHost) {
    OXWARN("NET/OxTest : libcuda.so.1 lacks a function CUDA memory needs");
    return ncclSystemError;
  }
  if (oxCopyContext == OX_CTX_OWN) {
    *(void**)&oxCu.deviceGet = dlsym(lib, "cuDeviceGet");
    *(void**)&oxCu.ctxCreate = dlsym(lib, "cuCtxCreate_v2");
    *(void**)&oxCu.memAlloc = dlsym(lib, "cuMemAlloc_v2");
    *(void**)&oxCu.memFree = dlsym(lib, "cuMemFree_v2");
    *(void**)&oxCu.memcpyPeerAsync = dlsym(lib, "cuMemcpyPeerAsync");
    if (!oxCu.deviceGet || !oxCu.ctxCreate || !oxCu.memAlloc || !oxCu.memFree ||
        !oxCu.memcpyPeerAsync) {
      OXWARN("NET/OxTest : libcuda.so.1 lacks a function a context of the plugin's needs");
      return ncclSystemError;
    }
  }
  oxCu.loaded = 1;
  return ncclSuccess;
}

static pthread_mutex_t oxCudaLock = PTHREAD_MUTEX_INITIALIZER;

/* Open the driver once (under a lock: several communicators' proxy threads may register
 * at once). */
static ncclResult_t oxCudaLoad(void) {
  pthread_mutex_lock(&oxCudaLock);
  ncclResult_t rc = oxCudaLoadLocked();
  pthread_mutex_unlock(&oxCudaLock);
  return rc;
}

/* The plugin's own context on device dev, created at its first use (cuCtxCreate makes it
 * current: it is popped at once, so the caller's context stays current). Lives until the
 * process exits. NULL on failure. */
static void* oxOwnContext(int dev) {
  if (dev < 0 || dev >= OX_MAX_CUDA_DEVICES) return NULL;
  pthread_mutex_lock(&oxCudaLock);
  if (oxOwnCtx[dev] == NULL) {
    int device = 0;
    void* ctx = NULL;
    void* popped;
    int rc = oxCu.deviceGet(&device, dev);
    if (rc == 0) rc = oxCu.ctxCreate(&ctx, 0, device);
    if (rc == 0) {
      oxCu.ctxPop(&popped);
      oxOwnCtx[dev] = ctx;
      OXLOG(OX_LOG_INFO, "NET/OxTest : copies to and from device %d run in a context of their own",
            dev);
    } else {
      OXWARN("NET/OxTest : creating a context on device %d failed (CUDA error %d)", dev, rc);
    }
  }
  void* ctx = oxOwnCtx[dev];
  pthread_mutex_unlock(&oxCudaLock);
  return ctx;
}

/* Copy between a CUDA registration and its shadow in the registration's context. */
static double oxSeconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Wait for the copy on the registration's stream (polling, as cuStreamSynchronize would
 * block); a copy still running after 5 s is logged once, and again when it ends: a test run
 * stuck in the plugin says so. The CUDA result. */
static int oxCudaWait(struct oxMr* mr, size_t bytes, int toDevice) {
  const double start = oxSeconds();
  int warned = 0;
  for (;;) {
    int rc = oxCu.streamQuery(mr->stream);
    if (rc != OX_CUDA_ERROR_NOT_READY) {
      if (warned)
        OXWARN("NET/OxTest : the copy of %lu bytes %s the GPU ended after %.1f s",
               (unsigned long)bytes, toDevice ? "to" : "from", oxSeconds() - start);
      return rc;
    }
    if (!warned && oxSeconds() - start > 5.0) {
      OXWARN("NET/OxTest : a copy of %lu bytes %s the GPU has not ended after 5 s",
             (unsigned long)bytes, toDevice ? "to" : "from");
      warned = 1;
    }
    sched_yield();
  }
}

static ncclResult_t oxCudaCopy(struct oxMr* mr, char* dev, char* host, size_t bytes,
                               int toDevice) {
  if (bytes == 0) return ncclSuccess;
  void* popped;
  if (oxCu.ctxPush(mr->ctx) != 0) {
    OXWARN("NET/OxTest : cuCtxPushCurrent failed");
    return ncclSystemError;
  }
  unsigned long long gpu = (unsigned long long)(uintptr_t)dev;
  int rc;
  if (mr->staging) { /* own context: through the staging buffer, at the same offset */
    unsigned long long stage = mr->staging + (unsigned long long)(dev - mr->data);
    if (toDevice) {
      rc = oxCu.memcpyHtoDAsync(stage, host, bytes, mr->stream);
      if (rc == 0) rc = oxCu.memcpyPeerAsync(gpu, mr->memCtx, stage, mr->ctx, bytes, mr->stream);
    } else {
      rc = oxCu.memcpyPeerAsync(stage, mr->ctx, gpu, mr->memCtx, bytes, mr->stream);
      if (rc == 0) rc = oxCu.memcpyDtoHAsync(host, stage, bytes, mr->stream);
    }
  } else {
    rc = toDevice ? oxCu.memcpyHtoDAsync(gpu, host, bytes, mr->stream)
                  : oxCu.memcpyDtoHAsync(host, gpu, bytes, mr->stream);
  }
  if (rc == 0) rc = oxCudaWait(mr, bytes, toDevice);
  oxCu.ctxPop(&popped);
  if (rc != 0) {
    OXWARN("NET/OxTest : copying %lu bytes %s the GPU failed (CUDA error %d)",
           (unsigned long)bytes, toDevice ? "to" : "from", rc);
    return ncclSystemError;
  }
  return ncclSuccess;
}

/* Free what a CUDA registration holds. */
static void oxCudaRelease(struct oxMr* mr) {
  void* popped;
  if (mr->ctx == NULL || oxCu.ctxPush(mr->ctx) != 0) return;
  if (mr->shadow) oxCu.memFreeHost(mr->shadow);
  if (mr->stream) oxCu.streamDestroy(mr->stream);
  if (mr->staging) oxCu.memFree(mr->staging);
  oxCu.ctxPop(&popped);
  mr->shadow = NULL;
  mr->stream = NULL;
  mr->staging = 0;
}

/* A CUDA registration of [data, data + size): its device's context, the copies' context, a
 * stream there, a pinned host shadow and (own context) a device staging buffer. */
static ncclResult_t oxCudaRegister(struct oxMr* mr) {
  ncclResult_t rc = oxCudaLoad();
  if (rc != ncclSuccess) return rc;
  int dev = -1;
  if (oxCu.pointerGetAttribute(&dev, OX_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                               (unsigned long long)(uintptr_t)mr->data) != 0 ||
      oxCu.primaryCtxRetain(&mr->memCtx, dev) != 0) {
    OXWARN("NET/OxTest : %p is not CUDA memory of a device", mr->data);
    return ncclInvalidArgument;
  }
  mr->ctx = oxCopyContext == OX_CTX_PRIMARY ? mr->memCtx : oxOwnContext(dev);
  if (mr->ctx == NULL) return ncclSystemError;
  void* popped;
  if (oxCu.ctxPush(mr->ctx) != 0) return ncclSystemError;
  int cu = oxCu.streamCreate(&mr->stream, OX_CU_STREAM_NON_BLOCKING);
  if (cu == 0) cu = oxCu.memHostAlloc((void**)&mr->shadow, mr->size ? mr->size : 1, 0);
  if (cu == 0 && oxCopyContext == OX_CTX_OWN)
    cu = oxCu.memAlloc(&mr->staging, mr->size ? mr->size : 1);
  oxCu.ctxPop(&popped);
  if (cu != 0) {
    OXWARN("NET/OxTest : a stream or %lu bytes of pinned memory failed (CUDA error %d)",
           (unsigned long)mr->size, cu);
    oxCudaRelease(mr);
    return ncclSystemError;
  }
  OXLOG(OX_LOG_TRACE, "NET/OxTest : registered %lu bytes of CUDA memory on device %d",
        (unsigned long)mr->size, dev);
  return ncclSuccess;
}

/* ---- helpers ---- */

static ncclResult_t oxSystemError(const char* what) {
  OXWARN("NET/OxTest : %s failed: %s", what, strerror(errno));
  return ncclSystemError;
}

static int oxWouldBlock(void) { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR; }

static ncclResult_t oxNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return oxSystemError("fcntl");
  return ncclSuccess;
}

static ncclResult_t oxCheckDev(int dev) {
  if (dev == 0) return ncclSuccess;
  OXWARN("NET/OxTest : no device %d", dev);
  return ncclInvalidArgument;
}

/* Move bytes [*done, size) of buf on fd; stops without error when the socket would block. */
static ncclResult_t oxMove(int fd, int isSend, char* buf, size_t size, size_t* done) {
  while (*done < size) {
    ssize_t n = isSend ? send(fd, buf + *done, size - *done, MSG_NOSIGNAL)
                       : recv(fd, buf + *done, size - *done, 0);
    if (n > 0) {
      *done += (size_t)n;
    } else if (n == 0 && !isSend) {
      OXWARN("NET/OxTest : connection closed by the peer");
      return ncclRemoteError;
    } else if (n < 0 && oxWouldBlock()) {
      return ncclSuccess;
    } else {
      return oxSystemError(isSend ? "send" : "recv");
    }
  }
  return ncclSuccess;
}

/* Progress one request; *complete once all its bytes have moved. */
static ncclResult_t oxStep(struct oxComm* c, struct oxRequest* r, int* complete) {
  ncclResult_t rc = oxMove(c->fd, c->isSend, (char*)&r->header, sizeof(r->header),
                           &r->headerBytes);
  if (rc != ncclSuccess || r->headerBytes < sizeof(r->header)) return rc;
  if (!c->isSend && r->header > r->size) {
    OXWARN("NET/OxTest : message truncated: received %lu bytes into a buffer of %lu",
           (unsigned long)r->header, (unsigned long)r->size);
    return ncclInternalError;
  }
  size_t size = c->isSend ? r->size : (size_t)r->header;
  rc = oxMove(c->fd, c->isSend, r->data, size, &r->dataBytes);
  *complete = rc == ncclSuccess && r->dataBytes == size;
  return rc;
}

/* Progress a comm's requests in the order they were posted. */
static ncclResult_t oxProgress(struct oxComm* c) {
  while (c->failed == ncclSuccess && c->completed < c->posted) {
    struct oxRequest* r = &c->reqs[c->completed % OX_MAX_REQUESTS];
    int complete = 0;
    c->failed = oxStep(c, r, &complete);
    if (!complete) break;
    if (r->cudaMr) {
      c->failed = oxCudaCopy(r->cudaMr, r->cudaDst, r->data, (size_t)r->header, 1);
      if (c->failed != ncclSuccess) break;
    }
    r->done = 1;
    c->completed++;
  }
  return c->failed;
}

static ncclResult_t oxPost(struct oxComm* c, void* data, size_t size, void* mhandle,
                           void** request) {
  *request = NULL;
  if (c->failed != ncclSuccess) return c->failed;
  struct oxMr* mr = (struct oxMr*)mhandle;
  if (mr && size && ((char*)data < mr->data || (char*)data + size > mr->data + mr->size)) {
    OXWARN("NET/OxTest : buffer %p+%lu is outside its registration", data,
           (unsigned long)size);
    return ncclInvalidArgument;
  }
  struct oxRequest* r = &c->reqs[c->posted % OX_MAX_REQUESTS];
  if (r->used) return ncclSuccess; /* all slots busy: the caller tries again */
  memset(r, 0, sizeof(*r));
  r->data = (char*)data;
  if (mr && mr->type == OX_PTR_CUDA && size) { /* the bytes move through the shadow */
    r->data = mr->shadow + ((char*)data - mr->data);
    if (c->isSend) {
      ncclResult_t rc = oxCudaCopy(mr, (char*)data, r->data, size, 0);
      if (rc != ncclSuccess) return rc;
    } else {
      r->cudaMr = mr;
      r->cudaDst = (char*)data;
    }
  }
  r->comm = c;
  r->used = 1;
  r->size = size;
  if (c->isSend) r->header = size;
  c->posted++;
  *request = r;
  /* Progress may complete earlier requests and then meet a failure (a peer that closed in
   * order after its last message): the tests say so, this request was taken. */
  (void)oxProgress(c);
  return ncclSuccess;
}

static void oxFillProps(int dev, oxProps_v10* p) {
  memset(p, 0, sizeof(*p));
  p->name = (char*)"OxTest0";
  p->pciPath = NULL;
  p->guid = 0x6f78746573740000ULL + (uint64_t)dev;
  p->ptrSupport = OX_PTR_HOST | (oxCudaPointers ? OX_PTR_CUDA : 0) |
                 (oxDmaBufPointers ? OX_PTR_DMABUF : 0);
  p->speed = 10000;
  p->maxComms = 65536;
  p->maxRecvs = 1;
  p->netDeviceType = 0; /* NCCL_NET_DEVICE_HOST */
  p->vProps.ndevs = 1;
  p->vProps.devs[0] = dev;
  /* test() reports sizes as int: keep every message below 2 GiB. */
  p->maxP2pBytes = OX_MAX_NET_SIZE;
  p->maxCollBytes = OX_MAX_NET_SIZE;
}

/* ---- the entries, once for all versions ---- */

static ncclResult_t oxInit(oxLogger_t logFunction) {
  oxLog = logFunction;
  const char* addr = getenv("OXTEST_NET_ADDR");
  if (addr == NULL || addr[0] == '\0') addr = "127.0.0.1";
  if (inet_pton(AF_INET, addr, &oxAddr) != 1) {
    OXWARN("NET/OxTest : OXTEST_NET_ADDR=%s is not an IPv4 address", addr);
    return ncclInvalidArgument;
  }
#ifdef OXTEST_FAIL_INIT
  OXWARN("NET/OxTest : built with OXTEST_FAIL_INIT, failing init");
  return ncclInternalError;
#endif
  const char* cudaPtrs = getenv("OXTEST_PTR_CUDA");
#ifdef OXTEST_PTR_CUDA
  oxCudaPointers = cudaPtrs == NULL || strcmp(cudaPtrs, "0") != 0;
#else
  oxCudaPointers = cudaPtrs != NULL && strcmp(cudaPtrs, "1") == 0;
#endif
  const char* dmaBufPtrs = getenv("OXTEST_PTR_DMABUF");
  oxDmaBufPointers = dmaBufPtrs != NULL && strcmp(dmaBufPtrs, "1") == 0;
  const char* hold = getenv("OXTEST_HOLD_AFTER");
  if (hold != NULL && hold[0] != '\0') oxHoldAfter = strtol(hold, NULL, 10);
  const char* context = getenv("OXTEST_CUDA_CONTEXT");
  if (context == NULL || context[0] == '\0' || strcmp(context, "primary") == 0) {
    oxCopyContext = OX_CTX_PRIMARY;
  } else if (strcmp(context, "own") == 0) {
    oxCopyContext = OX_CTX_OWN;
  } else {
    OXWARN("NET/OxTest : OXTEST_CUDA_CONTEXT=%s is neither primary nor own", context);
    return ncclInvalidArgument;
  }
  OXLOG(OX_LOG_INFO, "NET/OxTest : using %s, %d device(s), %s%s", addr, 1,
        oxCudaPointers ? "host and CUDA memory (CUDA memory copied through host memory)"
                       : "host memory only",
        oxDmaBufPointers ? ", and CUDA memory as dma-bufs" : "");
  return ncclSuccess;
}

static ncclResult_t oxDevices(int* ndev) {
  *ndev = 1;
  return ncclSuccess;
}

static ncclResult_t oxListen(int dev, void* opaqueHandle, void** listenComm) {
  *listenComm = NULL;
  ncclResult_t rc = oxCheckDev(dev);
  if (rc != ncclSuccess) return rc;
  struct oxHandle* handle = (struct oxHandle*)opaqueHandle;
  memset(handle, 0, sizeof(*handle));
  handle->magic = OX_HELLO;
  handle->addr.sin_family = AF_INET;
  handle->addr.sin_addr = oxAddr;
  handle->addr.sin_port = 0;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return oxSystemError("socket");
  socklen_t len = sizeof(handle->addr);
  if (bind(fd, (struct sockaddr*)&handle->addr, len) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, (struct sockaddr*)&handle->addr, &len) != 0 ||
      (rc = oxNonBlocking(fd)) != ncclSuccess) {
    rc = rc != ncclSuccess ? rc : oxSystemError("bind/listen");
    close(fd);
    return rc;
  }
  struct oxListenComm* l = calloc(1, sizeof(*l));
  if (l == NULL) {
    close(fd);
    return ncclSystemError;
  }
  l->fd = fd;
  l->pendingFd = -1;
  *listenComm = l;
  OXLOG(OX_LOG_TRACE, "NET/OxTest : listening on port %d", ntohs(handle->addr.sin_port));
  return ncclSuccess;
}

static struct oxComm* oxNewComm(int fd, int isSend) {
  struct oxComm* c = calloc(1, sizeof(*c));
  if (c == NULL) return NULL;
  c->fd = fd;
  c->isSend = isSend;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return c;
}

/* Start the connect (first call) or finish it (a later call, once the socket is writable). */
static ncclResult_t oxConnect(int dev, void* opaqueHandle, void** sendComm,
                              oxDevHandle** sendDevComm) {
  (void)sendDevComm; /* no device offload */
  *sendComm = NULL;
  ncclResult_t rc = oxCheckDev(dev);
  if (rc != ncclSuccess) return rc;
  struct oxHandle* handle = (struct oxHandle*)opaqueHandle;
  if (handle->magic != OX_HELLO) {
    OXWARN("NET/OxTest : connect to a handle that is not OxTest's");
    return ncclInvalidArgument;
  }
  if (handle->stageFd == 0) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return oxSystemError("socket");
    if (connect(fd, (struct sockaddr*)&handle->addr, sizeof(handle->addr)) != 0 &&
        errno != EINPROGRESS) {
      rc = oxSystemError("connect");
      close(fd);
      return rc;
    }
    handle->stageFd = fd + 1;
    return ncclSuccess; /* come back later */
  }
  int fd = handle->stageFd - 1;
  struct pollfd p = {.fd = fd, .events = POLLOUT};
  int ready = poll(&p, 1, 0);
  if (ready == 0 || (ready < 0 && errno == EINTR)) return ncclSuccess; /* not yet */
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
    errno = err ? err : errno;
    handle->stageFd = 0;
    close(fd);
    return oxSystemError("connect");
  }
  uint64_t hello = OX_HELLO;
  handle->stageFd = 0;
  if (send(fd, &hello, sizeof(hello), MSG_NOSIGNAL) != (ssize_t)sizeof(hello)) {
    rc = oxSystemError("send hello");
    close(fd);
    return rc;
  }
  struct oxComm* c = oxNewComm(fd, 1);
  if (c == NULL) {
    close(fd);
    return ncclSystemError;
  }
  *sendComm = c;
  return ncclSuccess;
}

static void oxDropPending(struct oxListenComm* l) {
  close(l->pendingFd);
  l->pendingFd = -1;
  l->helloBytes = 0;
}

static ncclResult_t oxAccept(void* listenComm, void** recvComm, oxDevHandle** recvDevComm) {
  (void)recvDevComm;
  *recvComm = NULL;
  struct oxListenComm* l = (struct oxListenComm*)listenComm;
  if (l->pendingFd < 0) {
    int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return oxWouldBlock() || errno == ECONNABORTED ? ncclSuccess : oxSystemError("accept");
    l->pendingFd = fd;
    l->helloBytes = 0;
  }
  while (l->helloBytes < sizeof(l->hello)) {
    ssize_t n = recv(l->pendingFd, (char*)&l->hello + l->helloBytes,
                     sizeof(l->hello) - l->helloBytes, 0);
    if (n < 0 && oxWouldBlock()) return ncclSuccess;
    if (n <= 0) { /* closed or failed before its hello: not a peer of ours */
      oxDropPending(l);
      return ncclSuccess;
    }
    l->helloBytes += (size_t)n;
  }
  if (l->hello != OX_HELLO) {
    OXWARN("NET/OxTest : dropping a connection without OxTest's hello");
    oxDropPending(l);
    return ncclSuccess;
  }
  struct oxComm* c = oxNewComm(l->pendingFd, 0);
  if (c == NULL) return ncclSystemError;
  l->pendingFd = -1;
  *recvComm = c;
  return ncclSuccess;
}

/* A registration of [data, data + size) of memory type OX_PTR_HOST or OX_PTR_CUDA (with its
 * CUDA shadow and stream). */
static ncclResult_t oxNewMr(void* data, size_t size, int type, struct oxMr** out) {
  struct oxMr* mr = calloc(1, sizeof(*mr));
  if (mr == NULL) return ncclSystemError;
  mr->data = (char*)data;
  mr->size = size;
  mr->type = type;
  if (type == OX_PTR_CUDA) {
    ncclResult_t rc = oxCudaRegister(mr);
    if (rc != ncclSuccess) {
      free(mr);
      return rc;
    }
  }
  *out = mr;
  return ncclSuccess;
}

static ncclResult_t oxRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  (void)comm;
  *mhandle = NULL;
  if (type != OX_PTR_HOST && !(type == OX_PTR_CUDA && oxCudaPointers)) {
    OXLOG(OX_LOG_INFO, "NET/OxTest : cannot register memory of type %d", type);
    return ncclInternalError;
  }
  struct oxMr* mr = NULL;
  ncclResult_t rc = oxNewMr(data, size, type, &mr);
  *mhandle = mr;
  return rc;
}

/* The exporter named in fd's /proc/self/fdinfo entry ("exp_name:" of a dma-buf), into name;
 * 0 when fd is not a dma-buf. */
static int oxDmaBufExporter(int fd, char* name, size_t len) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
  FILE* f = fopen(path, "r");
  if (f == NULL) return 0;
  char line[256];
  int found = 0;
  while (!found && fgets(line, sizeof(line), f) != NULL) {
    if (strncmp(line, "exp_name:", 9) == 0) {
      const char* v = line + 9;
      while (*v == ' ' || *v == '\t') v++;
      snprintf(name, len, "%.*s", (int)strcspn(v, "\n"), v);
      found = 1;
    }
  }
  fclose(f);
  return found;
}

static ncclResult_t oxRegMrDmaBuf(void* comm, void* data, size_t size, int type,
                                  uint64_t offset, int fd, void** mhandle) {
  *mhandle = NULL;
  char exporter[64] = "";
  if (!oxDmaBufPointers || type != OX_PTR_CUDA) {
    OXWARN("NET/OxTest : regMrDmaBuf of memory type %d: %s", type,
           oxDmaBufPointers ? "only CUDA memory comes as a dma-buf" : "dma-bufs are off");
    return ncclInternalError;
  }
  if (offset != 0 || !oxDmaBufExporter(fd, exporter, sizeof(exporter))) {
    OXWARN("NET/OxTest : regMrDmaBuf: fd %d (offset %llu) is not a dma-buf", fd,
           (unsigned long long)offset);
    return ncclInternalError;
  }
  struct oxMr* mr = NULL;
  ncclResult_t rc = oxNewMr(data, size, OX_PTR_CUDA, &mr);
  if (rc != ncclSuccess) return rc;
  *mhandle = mr;
  OXLOG(OX_LOG_INFO, "NET/OxTest : registered a dma-buf of %zu bytes (exporter %s) on comm %p",
        size, exporter, comm);
  return ncclSuccess;
}

static ncclResult_t oxDeregMr(void* comm, void* mhandle) {
  (void)comm;
  struct oxMr* mr = (struct oxMr*)mhandle;
  if (mr && mr->type == OX_PTR_CUDA) oxCudaRelease(mr);
  free(mr);
  return ncclSuccess;
}

static ncclResult_t oxIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                            void** request) {
  (void)tag;
  return oxPost((struct oxComm*)sendComm, data, size, mhandle, request);
}

static ncclResult_t oxIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                            void** mhandles, void** request) {
  (void)tags;
  if (n != 1) {
    *request = NULL;
    OXWARN("NET/OxTest : irecv of %d buffers, maxRecvs is 1", n);
    return ncclInvalidArgument;
  }
  return oxPost((struct oxComm*)recvComm, data[0], sizes[0], mhandles[0], request);
}

static ncclResult_t oxIflush(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                             void** request) {
  (void)recvComm, (void)n, (void)data, (void)sizes, (void)mhandles;
  *request = NULL; /* host memory, or CUDA memory already copied: nothing to flush */
  return ncclSuccess;
}

/* A request that completed is done, whatever happened on its comm since: progress may move
 * on to later requests in the same call (pre-posted receives), and a peer that closed in
 * order after its last message makes the next one fail, not this one. */
static void oxHoldIfDue(void) {
  if (oxHoldAfter < 0 || __atomic_load_n(&oxCompleted, __ATOMIC_ACQUIRE) < oxHoldAfter) return;
  OXWARN("NET/OxTest : OXTEST_HOLD_AFTER=%ld: this test call never returns", oxHoldAfter);
  for (;;) sleep(1);
}

static ncclResult_t oxTest(void* request, int* done, int* sizes) {
  struct oxRequest* r = (struct oxRequest*)request;
  *done = 0;
  if (r == NULL || !r->used) return ncclInvalidArgument;
  oxHoldIfDue();
  ncclResult_t rc = oxProgress(r->comm);
  if (!r->done) return rc;
  *done = 1;
  if (sizes) sizes[0] = (int)(r->comm->isSend ? r->size : r->header);
  r->used = 0;
  __atomic_add_fetch(&oxCompleted, 1, __ATOMIC_ACQ_REL);
  return ncclSuccess;
}

/* Requests closed while still in flight, process-wide (atomic): posted and not yet reported
 * done by test. A caller should close a comm with none (NVIDIA's library does); aws-ofi-nccl
 * warns for each such comm, and so does this plugin. Read by oxccl's cargo tests through
 * oxtest_requests_in_flight_at_close. */
static long oxInflightAtClose;

long oxtest_requests_in_flight_at_close(void) {
  return __atomic_load_n(&oxInflightAtClose, __ATOMIC_ACQUIRE);
}

static ncclResult_t oxCloseComm(void* comm) {
  struct oxComm* c = (struct oxComm*)comm;
  if (c == NULL) return ncclSuccess;
  int inflight = 0;
  for (int i = 0; i < OX_MAX_REQUESTS; i++) inflight += c->reqs[i].used;
  if (inflight > 0) {
    OXWARN("NET/OxTest : Closing %s comm %p with %d requests in flight",
           c->isSend ? "send" : "recv", comm, inflight);
    __atomic_add_fetch(&oxInflightAtClose, inflight, __ATOMIC_ACQ_REL);
  }
  close(c->fd);
  free(c);
  return ncclSuccess;
}

static ncclResult_t oxCloseListen(void* listenComm) {
  struct oxListenComm* l = (struct oxListenComm*)listenComm;
  if (l == NULL) return ncclSuccess;
  if (l->pendingFd >= 0) close(l->pendingFd);
  close(l->fd);
  free(l);
  return ncclSuccess;
}

/* ---- per-version entries ---- */

static ncclResult_t oxGetProperties_v8(int dev, oxProps_v8* props) {
  ncclResult_t rc = oxCheckDev(dev);
  if (rc != ncclSuccess) return rc;
  oxProps_v10 p;
  oxFillProps(dev, &p);
  memset(props, 0, sizeof(*props));
  props->name = p.name;
  props->pciPath = p.pciPath;
  props->guid = p.guid;
  props->ptrSupport = p.ptrSupport;
  props->regIsGlobal = p.regIsGlobal;
  props->speed = p.speed;
  props->port = p.port;
  props->latency = p.latency;
  props->maxComms = p.maxComms;
  props->maxRecvs = p.maxRecvs;
  props->netDeviceType = p.netDeviceType;
  props->netDeviceVersion = p.netDeviceVersion;
  return ncclSuccess;
}

static ncclResult_t oxGetProperties_v10(int dev, oxProps_v10* props) {
  ncclResult_t rc = oxCheckDev(dev);
  if (rc == ncclSuccess) oxFillProps(dev, props);
  return rc;
}

static ncclResult_t oxGetProperties_v11(int dev, oxProps_v11* props) {
  ncclResult_t rc = oxGetProperties_v10(dev, &props->base);
  props->maxMultiRequestSize = 1;
  return rc;
}

static ncclResult_t oxIsend_v8(void* sendComm, void* data, int size, int tag, void* mhandle,
                               void** request) {
  if (size < 0) return ncclInvalidArgument;
  return oxIsend(sendComm, data, (size_t)size, tag, mhandle, request);
}

static ncclResult_t oxIrecv_v8(void* recvComm, int n, void** data, int* sizes, int* tags,
                               void** mhandles, void** request) {
  size_t size = 0;
  if (n == 1) {
    if (sizes[0] < 0) return ncclInvalidArgument;
    size = (size_t)sizes[0];
  }
  return oxIrecv(recvComm, n, data, &size, tags, mhandles, request);
}

static ncclResult_t oxInit_v10(oxLogger_t logFunction, oxProfilerCallback_t profFunction) {
  (void)profFunction;
  return oxInit(logFunction);
}

static ncclResult_t oxConnect_v10(int dev, oxCommConfig* config, void* handle, void** sendComm,
                                  oxDevHandle** sendDevComm) {
  (void)config;
  return oxConnect(dev, handle, sendComm, sendDevComm);
}

static ncclResult_t oxIsend_v10(void* sendComm, void* data, size_t size, int tag,
                                void* mhandle, void* phandle, void** request) {
  (void)phandle;
  return oxIsend(sendComm, data, size, tag, mhandle, request);
}

static ncclResult_t oxIrecv_v10(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                                void** mhandles, void** phandles, void** request) {
  (void)phandles;
  return oxIrecv(recvComm, n, data, sizes, tags, mhandles, request);
}

static ncclResult_t oxCheckCtx(void* ctx) {
  if (ctx != NULL && ((struct oxCtx*)ctx)->magic == OX_CTX_MAGIC) return ncclSuccess;
  OXWARN("NET/OxTest : called with context %p, not the one init returned", ctx);
  return ncclInvalidArgument;
}

static ncclResult_t oxInit_v11(void** ctx, uint64_t commId, oxCommConfig* config,
                               oxLogger_t logFunction, oxProfilerCallback_t profFunction) {
  (void)profFunction;
  *ctx = NULL;
  ncclResult_t rc = oxInit(logFunction);
  if (rc != ncclSuccess) return rc;
  struct oxCtx* c = calloc(1, sizeof(*c));
  if (c == NULL) return ncclSystemError;
  c->magic = OX_CTX_MAGIC;
  c->commId = commId;
  c->trafficClass = config ? config->trafficClass : -1;
  *ctx = c;
  OXLOG(OX_LOG_INFO, "NET/OxTest : context for comm 0x%llx, traffic class %d",
        (unsigned long long)commId, c->trafficClass);
  return ncclSuccess;
}

static ncclResult_t oxListen_v11(void* ctx, int dev, void* handle, void** listenComm) {
  ncclResult_t rc = oxCheckCtx(ctx);
  return rc != ncclSuccess ? rc : oxListen(dev, handle, listenComm);
}

static ncclResult_t oxConnect_v11(void* ctx, int dev, void* handle, void** sendComm,
                                  oxDevHandle** sendDevComm) {
  ncclResult_t rc = oxCheckCtx(ctx);
  return rc != ncclSuccess ? rc : oxConnect(dev, handle, sendComm, sendDevComm);
}

static ncclResult_t oxFinalize(void* ctx) {
  ncclResult_t rc = oxCheckCtx(ctx);
  if (rc != ncclSuccess) return rc;
  struct oxCtx* c = (struct oxCtx*)ctx;
  OXLOG(OX_LOG_INFO, "NET/OxTest : finalized the context of comm 0x%llx",
        (unsigned long long)c->commId);
  c->magic = 0; /* a second finalize, or a later use, is then caught */
  free(c);
  return ncclSuccess;
}

/* ---- the exported tables ---- */

#define OX_SHARED_VALUES                                                                   \
  .devices = oxDevices, .accept = oxAccept, .regMr = oxRegMr, .regMrDmaBuf = oxRegMrDmaBuf, \
  .deregMr = oxDeregMr, .iflush = oxIflush, .test = oxTest, .closeSend = oxCloseComm,        \
  .closeRecv = oxCloseComm, .closeListen = oxCloseListen, .getDeviceMr = NULL,               \
  .irecvConsumed = NULL

/* The tables oxccl and NCCL look for. With -DOXTEST_EXPORT_ONLY=N only ncclNetPlugin_vN is
 * exported (the others are kept under hidden names); N = 7 exports a table under the name of
 * a version oxccl does not load (its contents are never read). */
#if !defined(OXTEST_EXPORT_ONLY) || OXTEST_EXPORT_ONLY == 8
#define OX_V8 __attribute__((visibility("default"))) const oxNet_v8 ncclNetPlugin_v8
#else
#define OX_V8 __attribute__((visibility("hidden"))) const oxNet_v8 oxHiddenNet_v8
#endif
#if !defined(OXTEST_EXPORT_ONLY) || OXTEST_EXPORT_ONLY == 9
#define OX_V9 __attribute__((visibility("default"))) const oxNet_v9 ncclNetPlugin_v9
#else
#define OX_V9 __attribute__((visibility("hidden"))) const oxNet_v9 oxHiddenNet_v9
#endif
#if !defined(OXTEST_EXPORT_ONLY) || OXTEST_EXPORT_ONLY == 10
#define OX_V10 __attribute__((visibility("default"))) const oxNet_v10 ncclNetPlugin_v10
#else
#define OX_V10 __attribute__((visibility("hidden"))) const oxNet_v10 oxHiddenNet_v10
#endif
#if !defined(OXTEST_EXPORT_ONLY) || OXTEST_EXPORT_ONLY == 11
#define OX_V11 __attribute__((visibility("default"))) const oxNet_v11 ncclNetPlugin_v11
#else
#define OX_V11 __attribute__((visibility("hidden"))) const oxNet_v11 oxHiddenNet_v11
#endif

#if defined(OXTEST_EXPORT_ONLY) && OXTEST_EXPORT_ONLY == 7
__attribute__((visibility("default"))) const oxNet_v8 ncclNetPlugin_v7 = {
    .name = "OxTest", .init = oxInit, .getProperties = oxGetProperties_v8,
    .listen = oxListen, .connect = oxConnect, .isend = oxIsend_v8, .irecv = oxIrecv_v8,
    OX_SHARED_VALUES};
#endif

OX_V8 = {.name = "OxTest", .init = oxInit, .getProperties = oxGetProperties_v8,
         .listen = oxListen, .connect = oxConnect, .isend = oxIsend_v8, .irecv = oxIrecv_v8,
         OX_SHARED_VALUES};

OX_V9 = {.name = "OxTest", .init = oxInit, .getProperties = oxGetProperties_v10,
         .listen = oxListen, .connect = oxConnect, .isend = oxIsend, .irecv = oxIrecv,
         OX_SHARED_VALUES, .makeVDevice = NULL};

OX_V10 = {.name = "OxTest", .init = oxInit_v10, .getProperties = oxGetProperties_v10,
          .listen = oxListen, .connect = oxConnect_v10, .isend = oxIsend_v10,
          .irecv = oxIrecv_v10, OX_SHARED_VALUES, .makeVDevice = NULL};

OX_V11 = {.name = "OxTest", .init = oxInit_v11, .getProperties = oxGetProperties_v11,
          .listen = oxListen_v11, .connect = oxConnect_v11, .isend = oxIsend_v10,
          .irecv = oxIrecv_v10, OX_SHARED_VALUES, .makeVDevice = NULL, .finalize = oxFinalize,
          .setNetAttr = NULL};
