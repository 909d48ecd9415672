/* A stand-in for the CUDA driver (SONAME libcuda.so.1) with just what the test net plugin's
 * CUDA memory calls, for machines without a GPU: "device memory" is host memory, every
 * pointer is on device 0, and a copy is truly asynchronous: it is only queued on its stream,
 * and runs (memcpy) when a query of that stream, some calls later, finds it due. A plugin
 * that used the bytes before its copy was seen done would read stale ones.
 * Built by ffi-tests/run.sh: cc -shared -fPIC -Wl,-soname,libcuda.so.1. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define STUB_NOT_READY 600
#define STUB_QUERIES_BEFORE_DONE 3

struct stubCopy {
  void* dst;
  const void* src;
  size_t bytes;
  struct stubCopy* next;
};

struct stubStream {
  struct stubCopy* head; /* in order */
  struct stubCopy** tail;
  int queries; /* queries since the last copy was queued */
};

static pthread_mutex_t stubLock = PTHREAD_MUTEX_INITIALIZER;

int cuPointerGetAttribute(void* data, int attribute, unsigned long long ptr) {
  (void)attribute, (void)ptr;
  *(int*)data = 0;
  return 0;
}
int cuDevicePrimaryCtxRetain(void** ctx, int dev) {
  (void)dev;
  *ctx = (void*)0x1;
  return 0;
}
/* Contexts: 0x1 is device 0's primary context, 0x2 the one context cuCtxCreate makes. Each
 * thread has a stack of current contexts (its depth is all that is kept); streams and device
 * memory are made only with a context current, and every push must be popped. */
#define STUB_PRIMARY ((void*)0x1)
#define STUB_CREATED ((void*)0x2)
static __thread int stubDepth;
static __thread void* stubTop[16];
static int stubKnown(void* ctx) { return ctx == STUB_PRIMARY || ctx == STUB_CREATED; }
int cuCtxPushCurrent_v2(void* ctx) {
  if (!stubKnown(ctx) || stubDepth == 16) return 201;
  stubTop[stubDepth++] = ctx;
  return 0;
}
int cuCtxPopCurrent_v2(void** ctx) {
  if (stubDepth == 0) return 201;
  stubDepth--;
  if (ctx) *ctx = stubTop[stubDepth];
  return 0;
}
int cuDeviceGet(int* device, int ordinal) {
  if (ordinal != 0) return 101;
  *device = 0;
  return 0;
}
/* As the driver's: the new context is pushed onto the calling thread's stack. */
int cuCtxCreate_v2(void** ctx, unsigned flags, int device) {
  (void)flags;
  if (device != 0) return 101;
  *ctx = STUB_CREATED;
  return cuCtxPushCurrent_v2(STUB_CREATED);
}
int cuMemAlloc_v2(unsigned long long* dptr, size_t bytes) {
  if (stubDepth == 0) return 201;
  void* p = malloc(bytes);
  *dptr = (unsigned long long)(size_t)p;
  return p ? 0 : 2;
}
int cuMemFree_v2(unsigned long long dptr) {
  free((void*)(size_t)dptr);
  return 0;
}
int cuStreamCreate(void** stream, unsigned flags) {
  (void)flags;
  if (stubDepth == 0) return 201;
  struct stubStream* s = calloc(1, sizeof(*s));
  if (s == NULL) return 2;
  s->tail = &s->head;
  *stream = s;
  return 0;
}
static int stubQueue(void* stream, void* dst, const void* src, size_t bytes) {
  struct stubCopy* c = malloc(sizeof(*c));
  if (c == NULL) return 2;
  c->dst = dst, c->src = src, c->bytes = bytes, c->next = NULL;
  struct stubStream* s = stream;
  pthread_mutex_lock(&stubLock);
  *s->tail = c;
  s->tail = &c->next;
  s->queries = 0;
  pthread_mutex_unlock(&stubLock);
  return 0;
}
int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void* src, size_t bytes, void* stream) {
  return stubQueue(stream, (void*)(size_t)dst, src, bytes);
}
int cuMemcpyDtoHAsync_v2(void* dst, unsigned long long src, size_t bytes, void* stream) {
  return stubQueue(stream, dst, (const void*)(size_t)src, bytes);
}
int cuMemcpyPeerAsync(unsigned long long dst, void* dstCtx, unsigned long long src, void* srcCtx,
                      size_t bytes, void* stream) {
  if (!stubKnown(dstCtx) || !stubKnown(srcCtx)) return 201;
  return stubQueue(stream, (void*)(size_t)dst, (const void*)(size_t)src, bytes);
}
/* Runs the queued copies once they are due: "not ready" for the first queries after a copy
 * was queued. */
int cuStreamQuery(void* stream) {
  struct stubStream* s = stream;
  pthread_mutex_lock(&stubLock);
  if (s->head && ++s->queries < STUB_QUERIES_BEFORE_DONE) {
    pthread_mutex_unlock(&stubLock);
    return STUB_NOT_READY;
  }
  while (s->head) {
    struct stubCopy* c = s->head;
    memcpy(c->dst, c->src, c->bytes);
    s->head = c->next;
    free(c);
  }
  s->tail = &s->head;
  pthread_mutex_unlock(&stubLock);
  return 0;
}
/* Copies never seen done are dropped (their buffers may be gone already). */
int cuStreamDestroy_v2(void* stream) {
  struct stubStream* s = stream;
  while (s->head) {
    struct stubCopy* c = s->head;
    s->head = c->next;
    free(c);
  }
  free(s);
  return 0;
}
int cuMemHostAlloc(void** p, size_t bytes, unsigned flags) {
  (void)flags;
  if (stubDepth == 0) return 201;
  *p = malloc(bytes);
  return *p ? 0 : 2;
}
int cuMemFreeHost(void* p) {
  free(p);
  return 0;
}
