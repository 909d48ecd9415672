/* hostpath_cpu.c: what one small collective costs the caller on the host, and how many CUDA
 * driver calls it makes, with the NCCL library found on LD_LIBRARY_PATH (oxccl) running
 * against the stand-in driver of cuda_standin.c (also found there, as libcuda.so.1). Needs no
 * GPU: the stand-in's launches run nothing, so only what the library does on the host counts.
 *
 * With -r R, R communicators of one process (ncclCommInitAll on R stand-in devices), every case
 * one group of each rank's call, as one thread drives several GPUs (small out-of-place cases,
 * ROW names prefixed r2_, r4_ ...). By default:
 * One communicator of one rank (ncclCommInitAll on device 0) and one non-blocking stream from
 * the driver. For each collective (allreduce, allgather, reducescatter, broadcast, reduce,
 * alltoall, gather, scatter, and a send/recv to self in a group) at 8 B, 32 KiB and 512 KiB,
 * out of place and in place, and for groups of 2 and 8 allreduces of 8 B: a warm-up, then N
 * calls back to back timed with CLOCK_MONOTONIC (host_ns) and CLOCK_THREAD_CPUTIME_ID
 * (cpu_ns), then a shorter loop between the stand-in's call counters, giving the driver calls
 * per operation by function name (fractions when not every call makes them):
 *   ROW <collective> <bytes> <out|in> host_ns=<per call> cpu_ns=<per call> driver_calls=<f:n,...>
 * A group row is per group: ROW group2_allreduce 8 out ...
 * The stand-in runs no kernel but oxccl's plain copy kernel, which it does as a memcpy, as it
 * does the driver's copies: so a one-rank out-of-place collective's data can be checked (the
 * copy kernel below 4 MiB, the driver's copy above), and the 512 KiB out-of-place allreduce
 * row ends with wrong=<elements not as expected>. That memcpy is done in the call: the host_ns
 * of the larger rows is mostly the copy's work, done by the CPU.
 * INIT and DESTROY lines list the driver calls of the whole start (this program's own
 * cuInit, cuDevicePrimaryCtxRetain and cuCtxSetCurrent included) and of ncclCommDestroy;
 * the CALLED line every driver function called in the whole run, in the order first called.
 * Without the stand-in's counters (a real driver) driver_calls is n/a.
 *
 * usage: hostpath_cpu [-n N] [-c COLLECTIVE] [-s BYTES] [-m M] [-G] [-r R]   (N calls per case,
 * default 100000; -c and -s run only the cases of that collective or size, e.g. to profile one of
 * them; -m M moves the buffers by one message size every call, through M places, as
 * nccl-tests does: the library then serves its plans for moved buffers; -G puts every single
 * call in a group of its own, as nccl-tests does; -r R: R ranks, above; -P, one rank only: before
 * the cases, an all-reduce from host memory the driver does not know and one from device memory,
 * and ncclCommRegister of the host memory, printed as "POINTER host_malloc=<result>
 * device=<result> register_host=<result> last=<ncclGetLastError>", to see NCCL_CHECK_MODE's
 * pointer checks)
 * Exit 0 when every call succeeded, ncclCommDestroy too, and no element was wrong; 1
 * otherwise; 2 on bad usage or a run past the alarm (600 s). */
#define _GNU_SOURCE
#include <nccl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "driver.h"

#define MAX_BYTES (512 << 10)
#define WARMUP 100
#define COUNTED_CALLS 1000


#define MAX_RANKS 8
static int nranks = 1; /* communicators of one process, one per stand-in device (-r) */
static ncclComm_t comms[MAX_RANKS];
static cudaStream_t streams[MAX_RANKS];
static float *in, *out;
static long iters = 100000;
static long moves = 1;  /* places the buffers move through, one per call (-m) */
static long calls_made; /* calls issued so far: picks the place */
static int grouped;     /* every single call inside ncclGroupStart/End (-G) */
static int rows;

static void onAlarm(int sig) {
  (void)sig;
  static const char msg[] = "FAIL hostpath_cpu: still running after 600 s (a call hangs)\n";
  if (write(1, msg, sizeof msg - 1) < 0) _exit(2);
  _exit(2);
}

#define CU(x)                                                     \
  do {                                                            \
    CUresult e_ = (x);                                            \
    if (e_ != CUDA_SUCCESS) {                                     \
      printf("FAIL %s: CUDA driver error %d\n", #x, (int)e_);     \
      exit(1);                                                    \
    }                                                             \
  } while (0)

#define NCCL(x)                                                                                    \
  do {                                                                                             \
    ncclResult_t r_ = (x);                                                                         \
    if (r_ != ncclSuccess) {                                                                       \
      printf("FAIL %s: %s (%s)\n", #x, ncclGetErrorString(r_), ncclGetLastError(comms[0]));        \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)


static double nowNs(clockid_t clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

/* One operation: a collective, a send/recv pair to self in a group, or a group of
 * `group` allreduces. */
struct op {
  const char *name;
  size_t bytes;
  int inplace;
  int group; /* 0: not a group case */
};

/* Collective `c` of rank `r`; a send/recv sends to the next rank and receives from the one
 * before (to itself with one rank). */
static ncclResult_t issue1(const char *c, int r, float *src, float *dst, size_t n) {
  ncclComm_t comm = comms[r];
  cudaStream_t stream = streams[r];
  if (!strcmp(c, "allreduce")) return ncclAllReduce(src, dst, n, ncclFloat, ncclSum, comm, stream);
  if (!strcmp(c, "allgather")) return ncclAllGather(src, dst, n, ncclFloat, comm, stream);
  if (!strcmp(c, "reducescatter")) return ncclReduceScatter(src, dst, n, ncclFloat, ncclSum, comm, stream);
  if (!strcmp(c, "broadcast")) return ncclBroadcast(src, dst, n, ncclFloat, 0, comm, stream);
  if (!strcmp(c, "reduce")) return ncclReduce(src, dst, n, ncclFloat, ncclSum, 0, comm, stream);
  if (!strcmp(c, "alltoall")) return ncclAlltoAll(src, dst, n, ncclFloat, comm, stream);
  if (!strcmp(c, "gather")) return ncclGather(src, dst, n, ncclFloat, 0, comm, stream);
  if (!strcmp(c, "scatter")) return ncclScatter(src, dst, n, ncclFloat, 0, comm, stream);
  if (!strcmp(c, "sendrecv")) {
    ncclResult_t a = ncclGroupStart();
    if (a == ncclSuccess) a = ncclSend(src, n, ncclFloat, (r + 1) % nranks, comm, stream);
    if (a == ncclSuccess) a = ncclRecv(dst, n, ncclFloat, (r + nranks - 1) % nranks, comm, stream);
    ncclResult_t b = ncclGroupEnd();
    return a != ncclSuccess ? a : b;
  }
  return ncclInvalidArgument;
}

/* With one rank every collective's in-place form has its input and output in one buffer. */
static ncclResult_t issue(const struct op *o) {
  size_t n = o->bytes / sizeof(float);
  size_t shift = (size_t)(calls_made++ % moves) * n;
  float *src = in + shift, *dst = (o->inplace ? in : out) + shift;
  if (o->group == 0 && !grouped && nranks == 1) return issue1(o->name, 0, src, dst, n);
  /* Several ranks: one group of every rank's call(s), as one thread drives several GPUs. */
  ncclResult_t a = ncclGroupStart();
  for (int r = 0; r < nranks; r++)
    for (int i = 0; i < (o->group ? o->group : 1) && a == ncclSuccess; i++) a = issue1(o->name, r, src, dst, n);
  ncclResult_t b = ncclGroupEnd();
  return a != ncclSuccess ? a : b;
}

static void loop(const struct op *o, long k) {
  for (long i = 0; i < k; i++) {
    ncclResult_t r = issue(o);
    if (r != ncclSuccess) {
      printf("FAIL %s %zu %s (call %ld): %s (%s)\n", o->name, o->bytes, o->inplace ? "in" : "out", i,
             ncclGetErrorString(r), ncclGetLastError(comms[0]));
      exit(1);
    }
  }
}

/* "f:n,..." for every driver function called since the last reset, n per k operations. */
static void countsSince(long k, char *text, size_t len) {
  if (cu.calls == NULL || cu.reset == NULL || cu.name == NULL) {
    snprintf(text, len, "n/a");
    return;
  }
  size_t at = 0;
  text[0] = 0;
  const char *f;
  for (unsigned long i = 0; (f = cu.name(i)) != NULL && at < len; i++) {
    unsigned long c = cu.calls(f);
    if (c == 0) continue;
    if (c % (unsigned long)k == 0)
      at += snprintf(text + at, len - at, "%s%s:%lu", at ? "," : "", f, c / (unsigned long)k);
    else
      at += snprintf(text + at, len - at, "%s%s:%.3g", at ? "," : "", f, (double)c / (double)k);
  }
  if (at == 0) snprintf(text, len, "none");
}

/* The driver calls of k operations, per operation. */
static void driverCalls(const struct op *o, char *text, size_t len) {
  long k = iters < COUNTED_CALLS ? iters : COUNTED_CALLS;
  if (cu.reset) cu.reset();
  loop(o, k);
  countsSince(k, text, len);
}

/* The 512 KiB out-of-place allreduce of one rank is a copy: in filled with a pattern, out
 * zeroed, one call; the elements of out not equal to in's. */
static void syncAll(void) {
  for (int r = 0; r < nranks; r++) CU(cu.streamSynchronize((CUstream)streams[r]));
}

static long checkCopy(const struct op *o) {
  size_t n = o->bytes / sizeof(float);
  float *host = malloc(o->bytes), *back = malloc(o->bytes);
  if (host == NULL || back == NULL) exit(1);
  for (size_t i = 0; i < n; i++) host[i] = (float)(i % 1000) + 0.5f;
  CU(cu.memcpyHtoD((CUdeviceptr)(uintptr_t)in, host, o->bytes));
  CU(cu.memsetD8((CUdeviceptr)(uintptr_t)out, 0, o->bytes));
  calls_made -= calls_made % moves; /* the next call uses the buffers' first place */
  loop(o, 1);
  syncAll();
  CU(cu.memcpyDtoH(back, (CUdeviceptr)(uintptr_t)out, o->bytes));
  long wrong = 0;
  for (size_t i = 0; i < n; i++) wrong += back[i] != host[i];
  free(host);
  free(back);
  return wrong;
}

static long runCase(const struct op *o) {
  long warm = iters < WARMUP ? iters : WARMUP;
  loop(o, warm);
  double m0 = nowNs(CLOCK_MONOTONIC), c0 = nowNs(CLOCK_THREAD_CPUTIME_ID);
  loop(o, iters);
  double m1 = nowNs(CLOCK_MONOTONIC), c1 = nowNs(CLOCK_THREAD_CPUTIME_ID);
  syncAll();
  char calls[1024];
  driverCalls(o, calls, sizeof calls);
  syncAll();
  long wrong = -1;
  if (o->group == 0 && !o->inplace && o->bytes == MAX_BYTES && !strcmp(o->name, "allreduce")) wrong = checkCopy(o);
  char name[32];
  const char *prefix = nranks == 1 ? "" : nranks == 2 ? "r2_" : nranks == 4 ? "r4_" : "rN_";
  if (o->group) snprintf(name, sizeof name, "%sgroup%d_%s", prefix, o->group, o->name);
  else snprintf(name, sizeof name, "%s%s", prefix, o->name);
  printf("ROW %s %zu %s host_ns=%.0f cpu_ns=%.0f driver_calls=%s", name, o->bytes, o->inplace ? "in" : "out",
         (m1 - m0) / (double)iters, (c1 - c0) / (double)iters, calls);
  if (wrong >= 0) printf(" wrong=%ld", wrong);
  printf("\n");
  fflush(stdout);
  rows++;
  return wrong > 0 ? wrong : 0;
}

int main(int argc, char **argv) {
  int opt;
  const char *only_coll = NULL;
  long only_bytes = -1;
  int probe = 0;
  while ((opt = getopt(argc, argv, "n:c:s:m:Gr:P")) != -1) {
    if (opt == 'n') iters = atol(optarg);
    else if (opt == 'c') only_coll = optarg;
    else if (opt == 's') only_bytes = atol(optarg);
    else if (opt == 'm') moves = atol(optarg);
    else if (opt == 'G') grouped = 1;
    else if (opt == 'r') nranks = atoi(optarg);
    else if (opt == 'P') probe = 1;
    else iters = 0;
  }
  if (iters < 1 || moves < 1 || moves > 64 || nranks < 1 || nranks > MAX_RANKS || optind != argc ||
      (probe && nranks != 1)) {
    fprintf(stderr, "usage: hostpath_cpu [-n N] [-c COLLECTIVE] [-s BYTES] [-m 1..64] [-G] [-r 1..8] [-P]\n");
    return 2;
  }
  signal(SIGALRM, onAlarm);
  alarm(600);
  if (nranks > 1) {
    char n[8];
    snprintf(n, sizeof n, "%d", nranks);
    setenv("CUDA_STANDIN_DEVICES", n, 1); /* one stand-in device per rank */
  }
  loadDriver();
  /* As cudaSetDevice(0) would: device 0's primary context current on this thread. */
  CUcontext ctx;
  CU(cu.init(0));
  CU(cu.primaryCtxRetain(&ctx, 0));
  CU(cu.ctxSetCurrent(ctx));
  int devs[MAX_RANKS], version = 0;
  for (int r = 0; r < nranks; r++) devs[r] = r;
  NCCL(ncclGetVersion(&version));
  NCCL(ncclCommInitAll(comms, nranks, devs));
  char calls[2048];
  countsSince(1, calls, sizeof calls);
  printf("INIT driver_calls=%s\n", calls); /* since the start, this program's own calls too */
  for (int r = nranks - 1; r >= 0; r--) { /* each rank's stream on its device; device 0 last */
    CUcontext c;
    CUstream s;
    CU(cu.primaryCtxRetain(&c, r));
    CU(cu.ctxSetCurrent(c));
    CU(cu.streamCreate(&s, CU_STREAM_NON_BLOCKING));
    streams[r] = (cudaStream_t)s;
  }
  CUdeviceptr a, b;
  size_t room = (size_t)MAX_BYTES * (size_t)moves;
  CU(cu.memAlloc(&a, room));
  CU(cu.memAlloc(&b, room));
  in = (float *)(uintptr_t)a, out = (float *)(uintptr_t)b;
  CU(cu.memsetD8(a, 0, room));
  CU(cu.memsetD8(b, 0, room));
  printf("hostpath_cpu: NCCL version code %d, %d rank(s) on device(s) 0..%d, %ld calls per case, driver "
         "counters %s\n",
         version, nranks, nranks - 1, iters, cu.calls ? "from the stand-in" : "absent");

  if (probe) {
    float *host = malloc(64);
    if (host == NULL) return 2;
    ncclResult_t fromHost = ncclAllReduce(host, out, 8, ncclFloat, ncclSum, comms[0], streams[0]);
    const char *last = ncclGetLastError(comms[0]);
    char lastText[512];
    snprintf(lastText, sizeof lastText, "%s", last ? last : "");
    ncclResult_t fromDevice = ncclAllReduce(in, out, 8, ncclFloat, ncclSum, comms[0], streams[0]);
    void *handle = NULL;
    ncclResult_t registered = ncclCommRegister(comms[0], host, 64, &handle);
    if (registered == ncclSuccess) ncclCommDeregister(comms[0], handle);
    printf("POINTER host_malloc=%d device=%d register_host=%d last=%s\n", (int)fromHost, (int)fromDevice,
           (int)registered, lastText);
    syncAll();
    free(host);
  }
  static const char *colls[] = {"allreduce", "allgather", "reducescatter", "broadcast", "reduce",
                                "alltoall",  "gather",    "scatter",       "sendrecv"};
  static const size_t sizes[] = {8, 32 << 10, MAX_BYTES};
  long wrong = 0;
  for (size_t c = 0; c < sizeof colls / sizeof colls[0]; c++)
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
      for (int inplace = 0; inplace < 2; inplace++) {
        if ((only_coll && strcmp(only_coll, colls[c])) || (only_bytes >= 0 && (size_t)only_bytes != sizes[z]))
          continue;
        /* Several ranks: small out-of-place calls only (in place means other offsets there). */
        if (nranks > 1 && (inplace || sizes[z] == MAX_BYTES)) continue;
        struct op o = {colls[c], sizes[z], inplace, 0};
        wrong += runCase(&o);
      }
  for (int g = 2; g <= 8 && !only_coll && only_bytes < 0; g *= 4) {
    struct op o = {"allreduce", 8, 0, g};
    wrong += runCase(&o);
  }

  syncAll();
  if (cu.reset) cu.reset();
  for (int r = 0; r < nranks; r++) NCCL(ncclCommDestroy(comms[r]));
  countsSince(1, calls, sizeof calls);
  printf("DESTROY driver_calls=%s\n", calls);
  CU(cu.memFree(a));
  CU(cu.memFree(b));
  for (int r = 0; r < nranks; r++) CU(cu.streamDestroy((CUstream)streams[r]));
  if (cu.name) {
    printf("CALLED");
    const char *f;
    for (unsigned long i = 0; (f = cu.name(i)) != NULL; i++) printf("%s%s", i ? "," : " ", f);
    printf("\n");
  }
  printf("hostpath_cpu: %d rows, ncclCommDestroy ncclSuccess, %s\n", rows,
         wrong ? "WRONG copies" : "copies right");
  return wrong ? 1 : 0;
}
