/* Optional and not-yet-supported entry points, over all local GPUs in one process
 * (ncclCommInitAll): ncclGroupSimulateEnd, ncclDevCommCreate, ncclCommWindowRegister,
 * ncclCommRegister/Deregister and ncclMemAlloc buffers in all-reduces. Prints PASS/FAIL per
 * case and 'N passed, M failed'; exits non-zero on failure. The whole run is bounded by an
 * alarm (120 s): a hang prints FAIL and exits 2.
 *
 * usage: optional [-n NGPUS] [-r]
 *   -r  reference library (NVIDIA's): the window and device-communicator calls may succeed
 *       or fail in any way; by default (oxccl) they must fail with a message, the
 *       device communicator with ncclInvalidUsage. */
#include <cuda_runtime.h>
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* Declared in NVIDIA's nccl_device/core.h, which is C++ only; pointers make the ABI. */
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void *reqs, void *outDevComm);

#define MAXG 16
static int passed, failed;
static int ngpus, reference;
static ncclComm_t comms[MAXG];
static cudaStream_t streams[MAXG];

static void result(int ok, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* One PASS/FAIL line: the name, then the details when there are any. */
static void result(int ok, const char *name, const char *fmt, ...) {
  char detail[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name, detail[0] ? ": " : "", detail);
  if (ok) passed++;
  else failed++;
}

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "FAIL optional: still running after 120 s (a call hangs)\n";
  if (write(1, msg, sizeof msg - 1) < 0) _exit(2);
  _exit(2);
}

static int mentions_support(const char *msg) {
  if (!msg) return 0;
  for (const char *p = msg; *p; p++)
    if (!strncasecmp(p, "support", 7)) return 1;
  return 0;
}

/* Fill each rank's buffer with rank+1+(i%5), all-reduce in place (one group), check the sum on
 * the host. Returns the number of wrong elements over all ranks, or -1 if a call failed. */
static long allreduce_and_check(float **buf, size_t n, char *err, size_t errlen) {
  float *h = malloc(n * sizeof(float));
  for (int r = 0; r < ngpus; r++) {
    for (size_t i = 0; i < n; i++) h[i] = (float)(r + 1 + (int)(i % 5));
    cudaSetDevice(r);
    if (cudaMemcpy(buf[r], h, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) {
      snprintf(err, errlen, "cudaMemcpy to rank %d", r);
      free(h);
      return -1;
    }
  }
  ncclGroupStart();
  for (int r = 0; r < ngpus; r++) ncclAllReduce(buf[r], buf[r], n, ncclFloat, ncclSum, comms[r], streams[r]);
  ncclResult_t res = ncclGroupEnd();
  if (res != ncclSuccess) {
    snprintf(err, errlen, "all-reduce: %s / %s", ncclGetErrorString(res), ncclGetLastError(NULL));
    free(h);
    return -1;
  }
  long wrong = 0;
  float base = (float)(ngpus * (ngpus + 1) / 2);
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    if (cudaStreamSynchronize(streams[r]) != cudaSuccess ||
        cudaMemcpy(h, buf[r], n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
      snprintf(err, errlen, "CUDA error on rank %d: %s", r, cudaGetErrorString(cudaGetLastError()));
      free(h);
      return -1;
    }
    for (size_t i = 0; i < n; i++)
      if (h[i] != base + (float)(ngpus * (int)(i % 5))) wrong++;
  }
  free(h);
  snprintf(err, errlen, "%ld wrong elements", wrong);
  return wrong;
}

/* A plain all-reduce on fresh cudaMalloc buffers: the communicators still work. */
static void comms_still_work(const char *after) {
  const size_t n = 1 << 16;
  float *buf[MAXG];
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    cudaMalloc((void **)&buf[r], n * sizeof(float));
  }
  char err[512];
  long wrong = allreduce_and_check(buf, n, err, sizeof err);
  char name[160];
  snprintf(name, sizeof name, "communicators still work after %s", after);
  result(wrong == 0, name, "%s", wrong == 0 ? "" : err);
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    cudaFree(buf[r]);
  }
}

static void simulate_check(void) {
  const size_t n = (1 << 20) / sizeof(float); /* 1 MiB */
  float *buf[MAXG];
  float *h = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) h[i] = 7.0f;
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    cudaMalloc((void **)&buf[r], n * sizeof(float));
    cudaMemcpy(buf[r], h, n * sizeof(float), cudaMemcpyHostToDevice);
  }
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  ncclResult_t res = ncclGroupSimulateEnd(&info);
  result(res != ncclSuccess, "ncclGroupSimulateEnd outside a group is an error", "got %s", ncclGetErrorString(res));

  ncclGroupStart();
  for (int r = 0; r < ngpus; r++) ncclAllReduce(buf[r], buf[r], n, ncclFloat, ncclSum, comms[r], streams[r]);
  res = ncclGroupSimulateEnd(&info);
  result(res == ncclSuccess, "ncclGroupSimulateEnd of a 1 MiB all-reduce", "%s / %s", ncclGetErrorString(res),
         ncclGetLastError(NULL));
  result(res == ncclSuccess && isfinite(info.estimatedTime) && info.estimatedTime > 0,
         "ncclGroupSimulateEnd estimatedTime > 0 and finite", "estimatedTime %g", (double)info.estimatedTime);
  if (res == ncclSuccess) printf("estimated time of a 1 MiB all-reduce on %d GPUs: %g us\n", ngpus, (double)info.estimatedTime);

  /* The simulated operations did not run. */
  long changed = 0;
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    cudaDeviceSynchronize();
    cudaMemcpy(h, buf[r], n * sizeof(float), cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; i++)
      if (h[i] != 7.0f) changed++;
  }
  result(changed == 0, "simulated all-reduce did not run", "%ld elements changed", changed);

  /* The group ended: a real all-reduce (its own group) works, and a stray ncclGroupEnd fails. */
  char err[512];
  long wrong = allreduce_and_check(buf, n, err, sizeof err);
  result(wrong == 0, "all-reduce after ncclGroupSimulateEnd (the group ended)", "%s", wrong == 0 ? "" : err);
  res = ncclGroupEnd();
  result(res != ncclSuccess, "ncclGroupEnd with no group open is an error", "got %s", ncclGetErrorString(res));
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    cudaFree(buf[r]);
  }
  free(h);
}

/* Calls that are collective in NVIDIA's library run in one thread per rank. */
struct call_arg {
  int rank;
  int what; /* 0: ncclDevCommCreate, 1: ncclCommWindowRegister, 2: ncclCommWindowDeregister */
  void *buff;
  size_t size;
  ncclWindow_t win;
  ncclResult_t res;
  char msg[512];
};

static void *call_thread(void *p) {
  struct call_arg *a = p;
  cudaSetDevice(a->rank);
  if (a->what == 0) {
    static char reqs[MAXG][4096]; /* zeroed ncclDevCommRequirements: nothing requested */
    static char out[MAXG][65536];
    a->res = ncclDevCommCreate(comms[a->rank], reqs[a->rank], out[a->rank]);
  } else if (a->what == 1) {
    a->res = ncclCommWindowRegister(comms[a->rank], a->buff, a->size, &a->win, NCCL_WIN_DEFAULT);
  } else {
    a->res = ncclCommWindowDeregister(comms[a->rank], a->win);
  }
  const char *m = ncclGetLastError(comms[a->rank]);
  snprintf(a->msg, sizeof a->msg, "%s", m ? m : "");
  return NULL;
}

static void run_on_all(struct call_arg *args) {
  pthread_t th[MAXG];
  for (int r = 0; r < ngpus; r++) pthread_create(&th[r], NULL, call_thread, &args[r]);
  for (int r = 0; r < ngpus; r++) pthread_join(th[r], NULL);
}

static void devcomm_check(void) {
  struct call_arg args[MAXG];
  for (int r = 0; r < ngpus; r++) args[r] = (struct call_arg){.rank = r, .what = 0};
  run_on_all(args);
  for (int r = 0; r < ngpus; r++) {
    if (reference) {
      printf("INFO ncclDevCommCreate rank %d: %s / %s\n", r, ncclGetErrorString(args[r].res), args[r].msg);
      continue;
    }
    result(args[r].res == ncclInvalidUsage && mentions_support(args[r].msg), "ncclDevCommCreate is ncclInvalidUsage with a message",
           "rank %d: %s / '%s'", r, ncclGetErrorString(args[r].res), args[r].msg);
  }
  comms_still_work("ncclDevCommCreate");
}

static void window_check(void) {
  const size_t size = 1 << 20; /* a multiple of NCCL_WIN_REQUIRED_ALIGNMENT */
  struct call_arg args[MAXG];
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    args[r] = (struct call_arg){.rank = r, .what = 1, .size = size};
    if (ncclMemAlloc(&args[r].buff, size) != ncclSuccess) {
      result(0, "ncclMemAlloc for the window", "rank %d: %s", r, ncclGetLastError(NULL));
      return;
    }
  }
  run_on_all(args);
  int all_ok = 1;
  for (int r = 0; r < ngpus; r++) all_ok = all_ok && args[r].res == ncclSuccess;
  for (int r = 0; r < ngpus; r++) {
    if (args[r].res == ncclSuccess) {
      printf("INFO ncclCommWindowRegister rank %d: succeeded (window %p)\n", r, (void *)args[r].win);
      if (!reference) result(all_ok, "ncclCommWindowRegister succeeded on every rank", "rank %d", r);
    } else if (reference) {
      printf("INFO ncclCommWindowRegister rank %d: %s / %s\n", r, ncclGetErrorString(args[r].res), args[r].msg);
    } else {
      result(args[r].msg[0] != 0, "ncclCommWindowRegister fails with a message", "rank %d: %s / '%s'", r,
             ncclGetErrorString(args[r].res), args[r].msg);
      printf("ncclCommWindowRegister rank %d: %s / %s\n", r, ncclGetErrorString(args[r].res), args[r].msg);
    }
  }
  if (all_ok) {
    for (int r = 0; r < ngpus; r++) args[r].what = 2;
    run_on_all(args);
    for (int r = 0; r < ngpus; r++)
      result(args[r].res == ncclSuccess, "ncclCommWindowDeregister", "rank %d: %s / %s", r,
             ncclGetErrorString(args[r].res), args[r].msg);
  }
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    ncclMemFree(args[r].buff);
  }
  comms_still_work("ncclCommWindowRegister");
}

static void register_check(void) {
  const size_t n = 1 << 20;
  float *buf[MAXG];
  void *handle[MAXG];
  int ok = 1;
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    cudaMalloc((void **)&buf[r], n * sizeof(float));
    handle[r] = NULL;
    ncclResult_t res = ncclCommRegister(comms[r], buf[r], n * sizeof(float), &handle[r]);
    if (res != ncclSuccess || !handle[r]) ok = 0;
    result(res == ncclSuccess && handle[r], "ncclCommRegister of a cudaMalloc buffer", "rank %d: %s / %s", r,
           ncclGetErrorString(res), ncclGetLastError(comms[r]));
  }
  char err[512];
  long wrong = allreduce_and_check(buf, n, err, sizeof err);
  result(wrong == 0, "all-reduce on registered buffers", "%s", wrong == 0 ? "" : err);
  /* Twice more, so that a cached registration is used as well. */
  wrong = allreduce_and_check(buf, n, err, sizeof err);
  result(wrong == 0, "all-reduce on registered buffers, again", "%s", wrong == 0 ? "" : err);
  for (int r = 0; r < ngpus; r++) {
    if (!ok) break;
    cudaSetDevice(r);
    ncclResult_t res = ncclCommDeregister(comms[r], handle[r]);
    result(res == ncclSuccess, "ncclCommDeregister", "rank %d: %s / %s", r, ncclGetErrorString(res),
           ncclGetLastError(comms[r]));
  }
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    cudaFree(buf[r]);
  }
  comms_still_work("ncclCommDeregister and cudaFree");
}

static void memalloc_check(void) {
  const size_t n = 3 << 18; /* 3 MiB of floats: not a power of two */
  float *buf[MAXG];
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    buf[r] = NULL;
    ncclResult_t res = ncclMemAlloc((void **)&buf[r], n * sizeof(float));
    result(res == ncclSuccess && buf[r], "ncclMemAlloc", "rank %d: %s / %s", r, ncclGetErrorString(res),
           ncclGetLastError(NULL));
    if (res != ncclSuccess || !buf[r]) return;
  }
  char err[512];
  long wrong = allreduce_and_check(buf, n, err, sizeof err);
  result(wrong == 0, "all-reduce on ncclMemAlloc buffers", "%s", wrong == 0 ? "" : err);
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    ncclResult_t res = ncclMemFree(buf[r]);
    result(res == ncclSuccess, "ncclMemFree", "rank %d: %s", r, ncclGetErrorString(res));
  }
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* keep every line if a hang is killed */
  signal(SIGALRM, on_alarm);
  alarm(120);
  int want = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-n") && i + 1 < argc) want = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-r")) reference = 1;
  }
  if (cudaGetDeviceCount(&ngpus) != cudaSuccess || ngpus < 1) {
    printf("FAIL optional: no CUDA device\n0 passed, 1 failed\n");
    return 1;
  }
  if (want > 0 && want < ngpus) ngpus = want;
  if (ngpus > MAXG) ngpus = MAXG;
  int version = 0;
  ncclGetVersion(&version);
  printf("library version %d, %d GPUs, %s expectations\n", version, ngpus, reference ? "reference" : "oxccl");
  ncclResult_t res = ncclCommInitAll(comms, ngpus, NULL);
  result(res == ncclSuccess, "ncclCommInitAll", "%s / %s", ncclGetErrorString(res), ncclGetLastError(NULL));
  if (res != ncclSuccess) {
    printf("%d passed, %d failed\n", passed, failed);
    return 1;
  }
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    cudaStreamCreate(&streams[r]);
  }
  printf("-- ncclGroupSimulateEnd\n");
  simulate_check();
  printf("-- ncclDevCommCreate\n");
  devcomm_check();
  printf("-- ncclCommWindowRegister\n");
  window_check();
  printf("-- ncclCommRegister\n");
  register_check();
  printf("-- ncclMemAlloc\n");
  memalloc_check();
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    cudaStreamDestroy(streams[r]);
    res = ncclCommDestroy(comms[r]);
    result(res == ncclSuccess, "ncclCommDestroy", "rank %d: %s", r, ncclGetErrorString(res));
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
