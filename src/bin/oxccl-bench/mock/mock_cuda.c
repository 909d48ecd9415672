/* A CPU stand-in for libcuda.so.1, just enough of the driver API for oxccl-bench's own smoke
 * test on machines without a GPU (see run-mock.sh). Device memory is host memory, work runs
 * immediately, events hold wall-clock times. MOCK_GPUS sets the device count (default 2).
 * Every device has one primary context (device + 1), shared by all ranks placed on it, and
 * its own count of allocated bytes for cuMemGetInfo. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
static __thread long current_ctx;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

CUresult cuInit(unsigned flags) { (void)flags; return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int *n) {
  const char *env = getenv("MOCK_GPUS");
  *n = env ? atoi(env) : 2;
  return 0;
}
CUresult cuDeviceGetName(char *name, int len, int dev) { snprintf(name, len, "Mock GPU %d", dev); return 0; }
CUresult cuGetErrorString(CUresult r, const char **s) { (void)r; *s = "mock error"; return 0; }
CUresult cuGetErrorName(CUresult r, const char **s) { (void)r; *s = "MOCK_ERROR"; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = (void *)(long)(dev + 1); return 0; }
CUresult cuCtxSetCurrent(void *ctx) { current_ctx = (long)ctx; return 0; }
/* The device of the current context (contexts are device + 1); used by mock_nccl.c. */
CUresult cuCtxGetDevice(int *dev) { if (current_ctx <= 0) return 201; /* INVALID_CONTEXT */ *dev = (int)current_ctx - 1; return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
static size_t used[64];
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
  *total = (size_t)80 << 30;
  *free_bytes = *total - used[current_ctx & 63];
  return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  void *m = malloc(n);
  if (!m) return 2;
  used[current_ctx & 63] += n;
  *p = (CUdeviceptr)(uintptr_t)m;
  return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)(uintptr_t)p); return 0; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { memcpy((void *)(uintptr_t)d, s, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { memcpy(d, (void *)(uintptr_t)s, n); return 0; }
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { memset((void *)(uintptr_t)d, v, n); return 0; }
CUresult cuStreamCreate(void **s, unsigned flags) { (void)flags; *s = malloc(8); return 0; }
CUresult cuStreamDestroy_v2(void *s) { free(s); return 0; }
CUresult cuEventCreate(void **e, unsigned flags) { (void)flags; *e = calloc(1, sizeof(double)); return 0; }
CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }
CUresult cuEventRecord(void *e, void *s) { (void)s; *(double *)e = now_ms(); return 0; }
CUresult cuEventQuery(void *e) { (void)e; return getenv("MOCK_HANG") ? 600 /* NOT_READY */ : 0; }
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) { *ms = (float)(*(double *)b - *(double *)a); return 0; }
CUresult cuStreamBeginCapture_v2(void *s, int mode) { (void)s; (void)mode; return 0; }
CUresult cuStreamEndCapture(void *s, void **g) { (void)s; *g = malloc(8); return 0; }
CUresult cuGraphInstantiateWithFlags(void **e, void *g, unsigned long long f) { (void)g; (void)f; *e = malloc(8); return 0; }
CUresult cuGraphDestroy(void *g) { free(g); return 0; }
CUresult cuGraphExecDestroy(void *e) { free(e); return 0; }
CUresult cuGraphLaunch(void *e, void *s) { (void)e; (void)s; return 0; }
