/* Ranks sharing one GPU (GPU 0) for any libnccl.so.2 (ours or NVIDIA's, chosen by
 * LD_LIBRARY_PATH): NCCL_MULTI_RANK_GPU_ENABLE (the variable of NVIDIA's NCCL 2.30). Every case
 * runs in its own child process (this binary re-executed with --case NAME), because libraries
 * read the environment once per process and because a hang or a sticky CUDA error must not
 * hide the other cases. Each case sets or unsets NCCL_MULTI_RANK_GPU_ENABLE itself (setenv /
 * unsetenv) before its first init. Every wait is bounded: a case has a time limit (an alarm
 * in the child, a kill by the parent 15 s later), every wait for a stream, a thread or a
 * process inside a case has its own limit.
 *
 * Cases (names for -c; a prefix selects all that start with it, e.g. -c b,d):
 *   a-initall-unset     env unset: ncclCommInitAll(2, {0,0}) is ncclInvalidUsage, and
 *                       ncclGetLastError() mentions "same GPU" (required of oxccl only:
 *                       NVIDIA's ncclCommInitAll refuses a repeated device without a message)
 *   a-threads-unset     env unset: 2 threads, ncclCommInitRank on device 0: ncclInvalidUsage and
 *                       "same GPU" on every rank (the message required of oxccl only)
 *   b-initall-2/4/8     env=1: ncclCommInitAll of n ranks on device 0 (queries), then in one
 *                       group per collective (one stream per rank) at counts 1, 1023 and
 *                       2^20+3: all_reduce sum float and int32 (out of place), all_reduce in
 *                       place, broadcast and reduce from root n-1, all_gather, reduce_scatter
 *                       int32, gather and scatter (root n-1), alltoall, a ring of
 *                       ncclSend/ncclRecv, and one group holding an all_reduce and an all_gather
 *                       per rank; every element checked exactly on the host
 *   c-threads-2/4       env=1: n threads with device 0 current call ncclCommInitRank; each then
 *                       runs, outside any group on its own stream, all_reduce float, all_reduce
 *                       int32 in place and all_gather; checked
 *   d-same-stream       env=1: ncclGroupStart; ncclAllReduce(comm0, s); ncclAllReduce(comm1, s);
 *                       ncclGroupEnd is ncclInvalidUsage within 20 s (run in a worker thread),
 *                       the message names the stream or the ranks, nothing stays queued, and
 *                       then an all_reduce with separate streams is right
 *   d-same-stream-null  the same with the legacy default stream (stream 0) for both ranks
 *   d-same-stream-4     4 ranks, ranks 1 and 3 on one stream, ranks 0 and 2 on their own
 *   e-abort             env=1: 2 ranks; a warm-up all_reduce; then only rank 0 calls
 *                       ncclAllReduce (from a worker thread); after 1 s the main thread calls
 *                       ncclCommAbort(comm0), ncclCommAbort(comm1); rank 0's stream must be
 *                       idle within 15 s; the time is printed
 *   f-procs-2/4         env=1: n processes (this binary, --rank-proc), each on device 0,
 *                       ncclCommInitRank from a unique id passed in hex; all_reduce float,
 *                       all_reduce int32 in place, all_gather, checked; exit status = failures;
 *                       killed after 120 s
 *   f-procs-unset-2/4   env unset: every rank process's init is ncclInvalidUsage with
 *                       "same GPU" (the message required of oxccl only)
 * A library older than 2.30 that is not oxccl (NVIDIA's 2.28.9) refuses shared GPUs: an init
 * that fails with ncclInvalidUsage under NCCL_MULTI_RANK_GPU_ENABLE=1 is then reported as
 * "refused by this library: <error>" and the case counts as SKIP, not FAIL. oxccl is
 * recognised by the string "oxccl" in the loaded libnccl file; it never gets a SKIP.
 *
 * Prints one line per case with its time, then 'N passed, M failed, K skipped, J not run';
 * exits 0 iff nothing failed and nothing was left out for lack of time.
 *
 * usage: shared_gpu [-x] [-n MAX] [-c LIST] [-T SECONDS] [-l] | --copy-rate | --case NAME
 *   -x          skip the process cases (f-*)
 *   -n MAX      at most MAX ranks per case (default 8)
 *   -c LIST     only these cases (comma list of names or name prefixes)
 *   -T SECONDS  total time budget (default 900): a case's limit is cut to what is left less
 *               20 s; with under 30 s left a case is not started and is reported as not run
 *   -l          list the cases and exit
 *   --case NAME run one case in this process (what the children do; for debugging)
 *   --copy-rate not a test: the device-to-device cudaMemcpyAsync rate on GPU 0 at 1 MiB,
 *               16 MiB, 256 MiB and 1 GiB (CUDA events), to compare with one-rank copy times */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXR 8
#define ENV_NAME "NCCL_MULTI_RANK_GPU_ENABLE"
#define EXIT_SKIP 77      /* a case or rank process: refused by a reference library */
#define EXIT_HANG 3       /* a case: its alarm fired, or a bounded wait ran out */
#define EXIT_EXIT_HUNG 4  /* a case finished but exit() did not return */
#define STREAM_LIMIT 60.0 /* seconds a stream may stay busy after a collective */
#define BIG ((size_t)(1 << 20) + 3)

/* ---------------------------------------------------------------- state and reporting */

static int lib_version = 0, lib_is_oxccl = 0;
static char lib_path[4096] = "(not found in /proc/self/maps)";
static char self_exe[4096];
static int result_fd = -1;
static const char *case_name = "main";
static volatile sig_atomic_t exiting = 0;
static double case_deadline = 0;

static pthread_mutex_t report_mu = PTHREAD_MUTEX_INITIALIZER;
static int n_checks, n_fail, skipped;
static char first_fail[600];
static char skip_reason[600];

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void failf(int line, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void failf(int line, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&report_mu);
  n_fail++;
  if (!first_fail[0]) snprintf(first_fail, sizeof first_fail, "%.580s", msg);
  pthread_mutex_unlock(&report_mu);
  printf("  FAIL (line %d) %s\n", line, msg);
}

#define CHECK(cond, ...)                                    \
  do {                                                      \
    if (cond) {                                             \
      __atomic_add_fetch(&n_checks, 1, __ATOMIC_RELAXED);   \
    } else {                                                \
      failf(__LINE__, __VA_ARGS__);                         \
    }                                                       \
  } while (0)

static void note_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note_skip(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&report_mu);
  if (!skipped) snprintf(skip_reason, sizeof skip_reason, "%.580s", msg);
  skipped = 1;
  pthread_mutex_unlock(&report_mu);
  printf("  %s\n", msg);
}

/* The step the case is in, for the alarm message: two buffers so that the handler never reads
 * one that is being written (only the case's main thread calls set_step). */
static char stepbuf[2][256];
static const char *volatile step = "start";
static int stepflip;

static void set_step(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_step(const char *fmt, ...) {
  char *b = stepbuf[stepflip ^= 1];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof stepbuf[0], fmt, ap);
  va_end(ap);
  step = b;
}

static void put(char *buf, size_t *k, size_t cap, const char *s) { /* async-signal-safe */
  while (s && *s && *k + 1 < cap) buf[(*k)++] = *s++;
  buf[*k] = 0;
}

static void write_all(int fd, const char *s, size_t len) {
  while (len > 0) {
    ssize_t w = write(fd, s, len);
    if (w <= 0) return;
    s += w;
    len -= (size_t)w;
  }
}

static void on_alarm(int sig) {
  (void)sig;
  char buf[700];
  size_t k = 0;
  if (exiting) {
    put(buf, &k, sizeof buf, "FAIL exit() did not return within 15 s after the case finished");
  } else {
    put(buf, &k, sizeof buf, "FAIL time limit: ");
    put(buf, &k, sizeof buf, case_name);
    put(buf, &k, sizeof buf, " still running; step: ");
    put(buf, &k, sizeof buf, step);
  }
  write_all(1, "  ", 2);
  write_all(1, buf, k);
  write_all(1, "\n", 1);
  if (result_fd >= 0) write_all(result_fd, buf, k);
  _exit(exiting ? EXIT_EXIT_HUNG : EXIT_HANG);
}

/* A bounded wait ran out: report and leave at once (the hung call cannot be cleaned up). */
static void die_hang(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_hang(const char *fmt, ...) {
  char msg[600], buf[700];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(buf, sizeof buf, "FAIL hang: %.600s", msg);
  printf("  %s\n", buf);
  fflush(stdout);
  if (result_fd >= 0) write_all(result_fd, buf, strlen(buf));
  _exit(EXIT_HANG);
}

/* Arm the alarm for a sub-step (seconds), or back to the case's own deadline (0). */
static void bound_step(unsigned seconds) {
  if (seconds == 0) {
    double left = case_deadline - now();
    seconds = left < 1 ? 1 : (unsigned)left;
  }
  alarm(seconds);
}

static void set_multi(int on) {
  if (on) setenv(ENV_NAME, "1", 1);
  else unsetenv(ENV_NAME);
  printf("  %s%s\n", ENV_NAME, on ? "=1" : " unset");
}

static int mentions(const char *msg, const char *what) { return msg && strcasestr(msg, what) != NULL; }

static const char *last_error(ncclComm_t comm) {
  const char *m = ncclGetLastError(comm);
  return m && *m ? m : "(no message)";
}

/* The loaded libnccl (from /proc/self/maps), its version, and whether it is oxccl. */
static void detect_library(void) {
  ncclGetVersion(&lib_version);
  FILE *f = fopen("/proc/self/maps", "r");
  char line[4096 + 256];
  while (f && fgets(line, sizeof line, f)) {
    char *p = strchr(line, '/');
    if (!p || !strstr(p, "/libnccl.so")) continue;
    p[strcspn(p, "\n")] = 0;
    snprintf(lib_path, sizeof lib_path, "%.4000s", p);
    break;
  }
  if (f) fclose(f);
  int fd = open(lib_path, O_RDONLY);
  struct stat sb;
  if (fd >= 0 && fstat(fd, &sb) == 0 && sb.st_size > 0) {
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map != MAP_FAILED) {
      lib_is_oxccl = memmem(map, (size_t)sb.st_size, "oxccl", 5) != NULL;
      munmap(map, (size_t)sb.st_size);
    }
  }
  if (fd >= 0) close(fd);
}

/* An init under NCCL_MULTI_RANK_GPU_ENABLE=1 failed: a pre-2.30 library that is not oxccl and
 * says ncclInvalidUsage refuses shared GPUs (SKIP); anything else is a failure. Returns 1 for
 * a refusal. */
static int init_failed(ncclResult_t res, const char *msg, const char *what) {
  if (res == ncclInvalidUsage && lib_version < 23000 && !lib_is_oxccl) {
    note_skip("refused by this library: %s: %s / %s", what, ncclGetErrorString(res), msg);
    return 1;
  }
  CHECK(0, "%s with %s=1: %s / %s", what, ENV_NAME, ncclGetErrorString(res), msg);
  return 0;
}

/* The refusal's message says ranks share the GPU: required of oxccl (NVIDIA 2.32's words,
 * "Multiple Ranks are using the same GPU/Partition"); only noted for other libraries (NVIDIA's
 * 2.28 said "Duplicate GPU detected"). */
static void duplicate_message(const char *msg, int rank) {
  int says = mentions(msg, "same GPU") || mentions(msg, "Duplicate GPU");
  if (lib_is_oxccl)
    CHECK(mentions(msg, "same GPU"), "rank %d: ncclGetLastError does not mention \"same GPU\": %s", rank, msg);
  else if (!says)
    printf("  note: rank %d's message does not say the GPU is shared (not required of this library)\n", rank);
}

/* ---------------------------------------------------------------- bounded threads */

struct job {
  void *(*fn)(void *);
  void *arg;
  int done;
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
};

static void *job_main(void *p) {
  struct job *j = p;
  j->fn(j->arg);
  pthread_mutex_lock(&j->mu);
  j->done = 1;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  return NULL;
}

static struct job *job_start(void *(*fn)(void *), void *arg) {
  struct job *j = calloc(1, sizeof *j);
  if (!j) die_hang("out of memory");
  j->fn = fn;
  j->arg = arg;
  pthread_mutex_init(&j->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&j->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&j->th, NULL, job_main, j) != 0) die_hang("pthread_create failed");
  return j;
}

/* Waits for the job until `deadline` (now()). 1: it finished (joined and freed); 0: it is still
 * running (left alone: the caller reports a hang and leaves the process). */
static int job_wait(struct job *j, double deadline) {
  pthread_mutex_lock(&j->mu);
  while (!j->done) {
    double left = deadline - now();
    if (left <= 0) break;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + (left < 0.2 ? left : 0.2);
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec > 999999999L) ts.tv_nsec = 999999999L;
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
  }
  int done = j->done;
  pthread_mutex_unlock(&j->mu);
  if (done) {
    pthread_join(j->th, NULL);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
  }
  return done;
}

/* Polls the stream until it is idle; a CUDA error is a failure (-1), busy past `seconds` a hang. */
static int wait_idle(cudaStream_t s, double seconds, const char *what) {
  double t0 = now();
  for (;;) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return 0;
    if (e != cudaErrorNotReady) {
      CHECK(0, "%s: stream error %s", what, cudaGetErrorString(e));
      return -1;
    }
    if (now() - t0 > seconds) die_hang("%s: stream still busy after %.0f s", what, seconds);
    usleep(100);
  }
}

/* ---------------------------------------------------------------- collectives and checks */

enum { C_ALLREDUCE, C_ALLREDUCE_INPLACE, C_BROADCAST, C_REDUCE, C_ALLGATHER, C_REDUCESCATTER,
       C_GATHER, C_SCATTER, C_ALLTOALL, C_SENDRECV };
static const char *const coll_name[] = {"all_reduce", "all_reduce in place", "broadcast", "reduce", "all_gather",
                                        "reduce_scatter", "gather", "scatter", "alltoall", "send/recv ring"};

/* One collective over n ranks; only the buffers of the ranks a caller prepares are used. Every
 * element is 4 bytes: ncclFloat or ncclInt32. */
struct op {
  int coll;
  ncclDataType_t type;
  size_t count;
  int n, root;
  void *send[MAXR], *recv[MAXR];
};

static int is_reduction(int c) {
  return c == C_ALLREDUCE || c == C_ALLREDUCE_INPLACE || c == C_REDUCE || c == C_REDUCESCATTER;
}

static size_t send_elems(const struct op *o) {
  switch (o->coll) {
    case C_REDUCESCATTER:
    case C_SCATTER:
    case C_ALLTOALL: return o->count * (size_t)o->n;
    default: return o->count;
  }
}

static size_t recv_elems(const struct op *o) {
  switch (o->coll) {
    case C_ALLGATHER:
    case C_GATHER:
    case C_ALLTOALL: return o->count * (size_t)o->n;
    default: return o->count;
  }
}

/* Inputs of reductions: small integers, so that every partial sum is exact in float (|sum| <=
 * 800) and in int32 (|sum| <= 8e6), whatever the order. */
static int32_t red_value(int r, size_t j, int wide) {
  uint64_t h = (uint64_t)j * 2654435761u + (uint64_t)r * 40503u + 17;
  return wide ? (int32_t)(h % 2000001) - 1000000 : (int32_t)(h % 201) - 100;
}

/* Inputs of data movement: unique per (rank, index) for index < 2^24, never -1 (the poison). */
static int32_t mov_value(int r, size_t j) { return (int32_t)(((uint32_t)r << 24) | (uint32_t)(j & 0xFFFFFF)); }

static int32_t in_value(const struct op *o, int r, size_t j) {
  return is_reduction(o->coll) ? red_value(r, j, o->type == ncclInt32) : mov_value(r, j);
}

static int64_t expect_value(const struct op *o, int r, size_t k) {
  size_t c = o->count;
  int n = o->n, wide = o->type == ncclInt32;
  int64_t s = 0;
  switch (o->coll) {
    case C_ALLREDUCE:
    case C_ALLREDUCE_INPLACE:
    case C_REDUCE:
      for (int q = 0; q < n; q++) s += red_value(q, k, wide);
      return s;
    case C_REDUCESCATTER:
      for (int q = 0; q < n; q++) s += red_value(q, (size_t)r * c + k, wide);
      return s;
    case C_BROADCAST: return mov_value(o->root, k);
    case C_ALLGATHER:
    case C_GATHER: return mov_value((int)(k / c), k % c);
    case C_SCATTER: return mov_value(o->root, (size_t)r * c + k);
    case C_ALLTOALL: return mov_value((int)(k / c), (size_t)r * c + k % c);
    case C_SENDRECV: return mov_value((r + n - 1) % n, k);
  }
  return 0;
}

/* Allocates rank r's buffers, writes the inputs and poisons the output (0xFF bytes: -1 and NaN),
 * all queued on s. host holds at least send_elems() elements. */
static int op_prepare_rank(struct op *o, int r, cudaStream_t s, int32_t *host) {
  size_t ns = send_elems(o), nr = recv_elems(o);
  o->send[r] = o->recv[r] = NULL;
  if (cudaMalloc(&o->send[r], ns * 4) != cudaSuccess) {
    CHECK(0, "cudaMalloc %zu B: %s", ns * 4, cudaGetErrorString(cudaGetLastError()));
    o->send[r] = NULL;
    return -1;
  }
  for (size_t j = 0; j < ns; j++) {
    int32_t v = in_value(o, r, j);
    if (o->type == ncclFloat) {
      float f = (float)v;
      memcpy(&host[j], &f, 4);
    } else {
      host[j] = v;
    }
  }
  if (cudaMemcpyAsync(o->send[r], host, ns * 4, cudaMemcpyHostToDevice, s) != cudaSuccess) {
    CHECK(0, "cudaMemcpyAsync to rank %d: %s", r, cudaGetErrorString(cudaGetLastError()));
    return -1;
  }
  if (o->coll == C_ALLREDUCE_INPLACE) {
    o->recv[r] = o->send[r];
    return 0;
  }
  if (cudaMalloc(&o->recv[r], nr * 4) != cudaSuccess) {
    CHECK(0, "cudaMalloc %zu B: %s", nr * 4, cudaGetErrorString(cudaGetLastError()));
    o->recv[r] = NULL;
    return -1;
  }
  if (cudaMemsetAsync(o->recv[r], 0xFF, nr * 4, s) != cudaSuccess) {
    CHECK(0, "cudaMemsetAsync rank %d: %s", r, cudaGetErrorString(cudaGetLastError()));
    return -1;
  }
  return 0;
}

static void op_free_rank(struct op *o, int r) {
  if (o->recv[r] && o->recv[r] != o->send[r]) cudaFree(o->recv[r]);
  if (o->send[r]) cudaFree(o->send[r]);
  o->send[r] = o->recv[r] = NULL;
}

static ncclResult_t first_error(ncclResult_t a, ncclResult_t b) { return a != ncclSuccess ? a : b; }

static ncclResult_t op_issue(const struct op *o, int r, ncclComm_t comm, cudaStream_t s) {
  const void *sb = o->send[r];
  void *rb = o->recv[r];
  size_t c = o->count;
  ncclDataType_t t = o->type;
  switch (o->coll) {
    case C_ALLREDUCE:
    case C_ALLREDUCE_INPLACE: return ncclAllReduce(sb, rb, c, t, ncclSum, comm, s);
    case C_BROADCAST: return ncclBroadcast(sb, rb, c, t, o->root, comm, s);
    case C_REDUCE: return ncclReduce(sb, rb, c, t, ncclSum, o->root, comm, s);
    case C_ALLGATHER: return ncclAllGather(sb, rb, c, t, comm, s);
    case C_REDUCESCATTER: return ncclReduceScatter(sb, rb, c, t, ncclSum, comm, s);
    case C_GATHER: return ncclGather(sb, rb, c, t, o->root, comm, s);
    case C_SCATTER: return ncclScatter(sb, rb, c, t, o->root, comm, s);
    case C_ALLTOALL: return ncclAlltoAll(sb, rb, c, t, comm, s);
    case C_SENDRECV: {
      int n = o->n, next = (r + 1) % n, prev = (r + n - 1) % n;
      ncclResult_t res = ncclGroupStart();
      res = first_error(res, ncclSend(sb, c, t, next, comm, s));
      res = first_error(res, ncclRecv(rb, c, t, prev, comm, s));
      return first_error(res, ncclGroupEnd());
    }
  }
  return ncclInvalidArgument;
}

/* Copies rank r's output back (the stream must be idle) and compares every element; returns the
 * number of wrong elements (err: the first), or -1 on a CUDA error. */
static long op_verify_rank(const struct op *o, int r, int32_t *host, char *err, size_t errlen) {
  if ((o->coll == C_REDUCE || o->coll == C_GATHER) && r != o->root) return 0;
  size_t nr = recv_elems(o);
  cudaError_t e = cudaMemcpy(host, o->recv[r], nr * 4, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "rank %d: cudaMemcpy back: %s", r, cudaGetErrorString(e));
    return -1;
  }
  long wrong = 0;
  for (size_t k = 0; k < nr; k++) {
    int64_t want = expect_value(o, r, k);
    int bad;
    char got[48];
    if (o->type == ncclFloat) {
      float v;
      memcpy(&v, &host[k], 4);
      bad = v != (float)want;
      snprintf(got, sizeof got, "%.9g", (double)v);
    } else {
      bad = host[k] != (int32_t)want;
      snprintf(got, sizeof got, "%d", (int)host[k]);
    }
    if (bad) {
      if (!wrong) snprintf(err, errlen, "rank %d element %zu of %zu: got %s, want %lld", r, k, nr, got, (long long)want);
      wrong++;
    }
  }
  return wrong;
}

/* Runs ops[0..nops) in one group over n ranks (rank r's ops in order on st[r]), waits for the
 * streams (bounded) and checks every output. Returns the number of failed checks. */
static int run_group(const char *label, struct op *ops, int nops, ncclComm_t *comms, cudaStream_t *st, int n) {
  double t0 = now();
  int before = n_fail;
  size_t maxe = 1;
  for (int i = 0; i < nops; i++) {
    if (send_elems(&ops[i]) > maxe) maxe = send_elems(&ops[i]);
    if (recv_elems(&ops[i]) > maxe) maxe = recv_elems(&ops[i]);
    for (int r = 0; r < MAXR; r++) ops[i].send[r] = ops[i].recv[r] = NULL;
  }
  int32_t *host = malloc(maxe * 4);
  if (!host) die_hang("out of host memory");
  set_step("%s: buffers", label);
  int ok = 1;
  for (int i = 0; i < nops && ok; i++)
    for (int r = 0; r < n && ok; r++) ok = op_prepare_rank(&ops[i], r, st[r], host) == 0;
  for (int r = 0; r < n; r++) wait_idle(st[r], STREAM_LIMIT, "buffer setup");
  if (ok) {
    set_step("%s: group", label);
    ncclResult_t issue = ncclSuccess;
    int bad_rank = -1;
    ncclResult_t res = ncclGroupStart();
    for (int r = 0; r < n; r++)
      for (int i = 0; i < nops; i++) {
        ncclResult_t x = op_issue(&ops[i], r, comms[r], st[r]);
        if (x != ncclSuccess && issue == ncclSuccess) {
          issue = x;
          bad_rank = r;
        }
      }
    res = first_error(res, ncclGroupEnd());
    CHECK(issue == ncclSuccess, "%s: enqueue on rank %d: %s / %s", label, bad_rank, ncclGetErrorString(issue),
          last_error(NULL));
    CHECK(res == ncclSuccess, "%s: ncclGroupEnd: %s / %s", label, ncclGetErrorString(res), last_error(NULL));
    set_step("%s: waiting for the streams", label);
    for (int r = 0; r < n; r++) wait_idle(st[r], STREAM_LIMIT, label);
    if (issue == ncclSuccess && res == ncclSuccess) {
      for (int i = 0; i < nops; i++)
        for (int r = 0; r < n; r++) {
          char err[300] = "";
          long wrong = op_verify_rank(&ops[i], r, host, err, sizeof err);
          CHECK(wrong == 0, "%s: %s%s%ld wrong: %s", label, nops > 1 ? coll_name[ops[i].coll] : "",
                nops > 1 ? ": " : "", wrong, err);
        }
    }
  }
  for (int i = 0; i < nops; i++)
    for (int r = 0; r < n; r++) op_free_rank(&ops[i], r);
  free(host);
  int failures = n_fail - before;
  printf("  %-52s %s (%.3f s)\n", label, failures ? "FAILED" : "ok", now() - t0);
  return failures;
}

/* One rank's op outside any group, from that rank's own thread or process; checked. */
static int run_single(const char *label, struct op *o, int r, ncclComm_t comm, cudaStream_t s) {
  double t0 = now();
  int before = n_fail;
  size_t maxe = send_elems(o) > recv_elems(o) ? send_elems(o) : recv_elems(o);
  int32_t *host = malloc(maxe * 4);
  if (!host) die_hang("out of host memory");
  o->send[r] = o->recv[r] = NULL;
  if (op_prepare_rank(o, r, s, host) == 0) {
    wait_idle(s, STREAM_LIMIT, "buffer setup");
    ncclResult_t res = op_issue(o, r, comm, s);
    CHECK(res == ncclSuccess, "rank %d %s: %s / %s", r, label, ncclGetErrorString(res), last_error(comm));
    wait_idle(s, STREAM_LIMIT, label);
    if (res == ncclSuccess) {
      char err[300] = "";
      long wrong = op_verify_rank(o, r, host, err, sizeof err);
      CHECK(wrong == 0, "rank %d %s: %ld wrong: %s", r, label, wrong, err);
    }
  } else {
    wait_idle(s, STREAM_LIMIT, "buffer setup");
  }
  op_free_rank(o, r);
  free(host);
  int failures = n_fail - before;
  printf("  rank %d %-45s %s (%.3f s)\n", r, label, failures ? "FAILED" : "ok", now() - t0);
  return failures;
}

/* The per-rank sequence of the thread and process cases (the same on every rank). */
static void rank_sequence(int r, int n, ncclComm_t comm, cudaStream_t s) {
  struct op a = {.coll = C_ALLREDUCE, .type = ncclFloat, .count = BIG, .n = n};
  run_single("all_reduce float count 2^20+3", &a, r, comm, s);
  struct op b = {.coll = C_ALLREDUCE_INPLACE, .type = ncclInt32, .count = 1023, .n = n};
  run_single("all_reduce int32 in place count 1023", &b, r, comm, s);
  struct op c = {.coll = C_ALLGATHER, .type = ncclInt32, .count = 1023, .n = n};
  run_single("all_gather int32 count 1023", &c, r, comm, s);
}

static void check_queries(ncclComm_t comm, int n, int r) {
  int count = -1, dev = -1, rank = -1;
  ncclResult_t a = ncclCommCount(comm, &count), b = ncclCommCuDevice(comm, &dev), c = ncclCommUserRank(comm, &rank);
  CHECK(a == ncclSuccess && count == n, "rank %d: ncclCommCount %d (want %d): %s", r, count, n, ncclGetErrorString(a));
  CHECK(b == ncclSuccess && dev == 0, "rank %d: ncclCommCuDevice %d (want 0): %s", r, dev, ncclGetErrorString(b));
  CHECK(c == ncclSuccess && rank == r, "rank %d: ncclCommUserRank %d: %s", r, rank, ncclGetErrorString(c));
}

static void destroy_comms(ncclComm_t *comms, int n) {
  set_step("ncclCommDestroy");
  for (int r = 0; r < n; r++) {
    if (!comms[r]) continue;
    ncclResult_t res = ncclCommDestroy(comms[r]);
    CHECK(res == ncclSuccess, "ncclCommDestroy rank %d: %s / %s", r, ncclGetErrorString(res), last_error(NULL));
    comms[r] = NULL;
  }
}

static void abort_comms(ncclComm_t *comms, int n) {
  set_step("ncclCommAbort");
  for (int r = 0; r < n; r++)
    if (comms[r]) ncclCommAbort(comms[r]);
  for (int r = 0; r < n; r++) comms[r] = NULL;
}

static void create_streams(cudaStream_t *st, int n) {
  for (int r = 0; r < n; r++) {
    cudaError_t e = cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking);
    if (e != cudaSuccess) die_hang("cudaStreamCreateWithFlags: %s", cudaGetErrorString(e));
  }
}

static void destroy_streams(cudaStream_t *st, int n) {
  for (int r = 0; r < n; r++) cudaStreamDestroy(st[r]);
}

/* ncclCommInitAll of n ranks on device 0 with the env set; 0 when the comms are usable. */
static int init_all_on_gpu0(ncclComm_t *comms, int n) {
  int devs[MAXR] = {0};
  for (int r = 0; r < MAXR; r++) comms[r] = NULL;
  set_step("ncclCommInitAll(%d ranks, device 0 each)", n);
  double t0 = now();
  ncclResult_t res = ncclCommInitAll(comms, n, devs);
  if (res != ncclSuccess) {
    char msg[600];
    snprintf(msg, sizeof msg, "%.590s", last_error(NULL));
    init_failed(res, msg, "ncclCommInitAll on one GPU");
    abort_comms(comms, n);
    return -1;
  }
  printf("  ncclCommInitAll of %d ranks on device 0: %.3f s\n", n, now() - t0);
  for (int r = 0; r < n; r++) check_queries(comms[r], n, r);
  return 0;
}

/* ---------------------------------------------------------------- a: env unset */

static void case_a_initall(int n, int variant) {
  (void)variant;
  set_multi(0);
  ncclComm_t comms[MAXR] = {0};
  int devs[MAXR] = {0};
  set_step("ncclCommInitAll(%d, {0,...})", n);
  ncclResult_t res = ncclCommInitAll(comms, n, devs);
  const char *msg = last_error(NULL);
  printf("  ncclCommInitAll(%d, {0,0}): %s / %s\n", n, ncclGetErrorString(res), msg);
  CHECK(res == ncclInvalidUsage, "ncclCommInitAll on one GPU without %s gave %s, want ncclInvalidUsage", ENV_NAME,
        ncclGetErrorString(res));
  if (!lib_is_oxccl && !mentions(msg, "same GPU") && !mentions(msg, "Duplicate GPU"))
    printf("  note: no message that the GPU is shared (NVIDIA's ncclCommInitAll refuses a repeated device silently)\n");
  else
    duplicate_message(msg, 0);
  if (res == ncclSuccess) destroy_comms(comms, n);
  else abort_comms(comms, n);
}

struct init_thread_arg {
  int rank, n;
  ncclUniqueId id;
  ncclComm_t comm;
  ncclResult_t res;
  double seconds;
  char msg[600];
  /* c: the rank continues with its sequence when *go is 1, aborts when -1 */
  volatile int *go;
  int *inits_done;
};

static void *unset_init_thread(void *p) {
  struct init_thread_arg *a = p;
  cudaSetDevice(0);
  double t0 = now();
  a->res = ncclCommInitRank(&a->comm, a->n, a->id, a->rank);
  snprintf(a->msg, sizeof a->msg, "%.590s", last_error(NULL)); /* the thread's own message */
  a->seconds = now() - t0;
  if (a->comm) ncclCommAbort(a->comm); /* failed or not: this case never uses it */
  a->comm = NULL;
  return NULL;
}

static void case_a_threads(int n, int variant) {
  (void)variant;
  set_multi(0);
  ncclUniqueId id;
  ncclResult_t res = ncclGetUniqueId(&id);
  CHECK(res == ncclSuccess, "ncclGetUniqueId: %s", ncclGetErrorString(res));
  if (res != ncclSuccess) return;
  struct init_thread_arg args[MAXR];
  struct job *jobs[MAXR];
  set_step("%d threads in ncclCommInitRank on device 0", n);
  for (int r = 0; r < n; r++) {
    memset(&args[r], 0, sizeof args[r]);
    args[r].rank = r;
    args[r].n = n;
    args[r].id = id;
    jobs[r] = job_start(unset_init_thread, &args[r]);
  }
  double deadline = now() + 45;
  for (int r = 0; r < n; r++)
    if (!job_wait(jobs[r], deadline)) die_hang("rank %d: ncclCommInitRank (and abort) did not return within 45 s", r);
  for (int r = 0; r < n; r++) {
    printf("  rank %d: ncclCommInitRank on device 0: %s / %s (%.3f s)\n", r, ncclGetErrorString(args[r].res),
           args[r].msg, args[r].seconds);
    CHECK(args[r].res == ncclInvalidUsage, "rank %d: init on a shared GPU without %s gave %s, want ncclInvalidUsage",
          r, ENV_NAME, ncclGetErrorString(args[r].res));
    duplicate_message(args[r].msg, r);
  }
}

/* ---------------------------------------------------------------- b: InitAll on one GPU */

static void case_b(int n, int variant) {
  (void)variant;
  set_multi(1);
  cudaSetDevice(0);
  ncclComm_t comms[MAXR];
  if (init_all_on_gpu0(comms, n)) return;
  cudaStream_t st[MAXR];
  create_streams(st, n);
  static const struct {
    int coll;
    ncclDataType_t type;
  } tests[] = {
      {C_ALLREDUCE, ncclFloat},   {C_ALLREDUCE, ncclInt32}, {C_ALLREDUCE_INPLACE, ncclFloat},
      {C_BROADCAST, ncclInt32},   {C_REDUCE, ncclFloat},    {C_ALLGATHER, ncclInt32},
      {C_REDUCESCATTER, ncclInt32}, {C_GATHER, ncclInt32},  {C_SCATTER, ncclInt32},
      {C_ALLTOALL, ncclInt32},    {C_SENDRECV, ncclInt32},
  };
  const size_t counts[] = {1, 1023, BIG};
  for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
    for (size_t ti = 0; ti < sizeof tests / sizeof tests[0]; ti++) {
      struct op o = {.coll = tests[ti].coll, .type = tests[ti].type, .count = counts[ci], .n = n, .root = n - 1};
      char label[160];
      snprintf(label, sizeof label, "%s %s count %zu%s", coll_name[o.coll], o.type == ncclFloat ? "float" : "int32",
               o.count, o.root >= 0 && (o.coll == C_BROADCAST || o.coll == C_REDUCE || o.coll == C_GATHER ||
                                        o.coll == C_SCATTER) ? " root n-1" : "");
      run_group(label, &o, 1, comms, st, n);
    }
  }
  struct op fused[2] = {
      {.coll = C_ALLREDUCE, .type = ncclFloat, .count = BIG, .n = n},
      {.coll = C_ALLGATHER, .type = ncclInt32, .count = 1023, .n = n},
  };
  run_group("one group: all_reduce float 2^20+3 + all_gather 1023", fused, 2, comms, st, n);
  destroy_streams(st, n);
  destroy_comms(comms, n);
}

/* ---------------------------------------------------------------- c: threads, InitRank */

static void *c_thread(void *p) {
  struct init_thread_arg *a = p;
  cudaSetDevice(0);
  double t0 = now();
  a->res = ncclCommInitRank(&a->comm, a->n, a->id, a->rank);
  snprintf(a->msg, sizeof a->msg, "%.590s", last_error(NULL));
  a->seconds = now() - t0;
  __atomic_add_fetch(a->inits_done, 1, __ATOMIC_SEQ_CST);
  while (*a->go == 0) usleep(1000); /* the main thread decides within its own bounded wait */
  if (*a->go < 0) {
    if (a->comm) ncclCommAbort(a->comm);
    a->comm = NULL;
    return NULL;
  }
  check_queries(a->comm, a->n, a->rank);
  cudaStream_t s;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) die_hang("cudaStreamCreate");
  rank_sequence(a->rank, a->n, a->comm, s);
  cudaStreamDestroy(s);
  ncclResult_t res = ncclCommDestroy(a->comm);
  CHECK(res == ncclSuccess, "rank %d: ncclCommDestroy: %s / %s", a->rank, ncclGetErrorString(res), last_error(NULL));
  a->comm = NULL;
  return NULL;
}

static void case_c(int n, int variant) {
  (void)variant;
  set_multi(1);
  ncclUniqueId id;
  ncclResult_t res = ncclGetUniqueId(&id);
  CHECK(res == ncclSuccess, "ncclGetUniqueId: %s", ncclGetErrorString(res));
  if (res != ncclSuccess) return;
  struct init_thread_arg args[MAXR];
  struct job *jobs[MAXR];
  volatile int go = 0;
  int inits_done = 0;
  set_step("%d threads in ncclCommInitRank on device 0", n);
  for (int r = 0; r < n; r++) {
    memset(&args[r], 0, sizeof args[r]);
    args[r].rank = r;
    args[r].n = n;
    args[r].id = id;
    args[r].go = &go;
    args[r].inits_done = &inits_done;
    jobs[r] = job_start(c_thread, &args[r]);
  }
  double t0 = now();
  while (__atomic_load_n(&inits_done, __ATOMIC_SEQ_CST) < n) {
    if (now() - t0 > 90) die_hang("ncclCommInitRank in %d threads: not every rank returned within 90 s", n);
    usleep(1000);
  }
  int ok = 0, invalid = 0;
  double worst = 0;
  for (int r = 0; r < n; r++) {
    ok += args[r].res == ncclSuccess;
    invalid += args[r].res == ncclInvalidUsage;
    if (args[r].seconds > worst) worst = args[r].seconds;
  }
  if (ok == n) {
    printf("  ncclCommInitRank in %d threads on device 0: %.3f s (slowest rank)\n", n, worst);
  } else if (invalid == n) {
    init_failed(ncclInvalidUsage, args[0].msg, "ncclCommInitRank in threads on one GPU");
  } else {
    for (int r = 0; r < n; r++)
      CHECK(args[r].res == ncclSuccess, "rank %d: ncclCommInitRank with %s=1: %s / %s", r, ENV_NAME,
            ncclGetErrorString(args[r].res), args[r].msg);
  }
  set_step("the %d threads' collectives", n);
  __atomic_store_n(&go, ok == n ? 1 : -1, __ATOMIC_SEQ_CST);
  double deadline = now() + 90;
  for (int r = 0; r < n; r++)
    if (!job_wait(jobs[r], deadline)) die_hang("rank %d's thread did not finish within 90 s", r);
}

/* ---------------------------------------------------------------- d: one stream, two ranks */

struct same_stream_arg {
  int n;
  ncclComm_t *comms;
  void **buf;
  size_t count;
  cudaStream_t *streams; /* the stream of each rank: some are the same */
  ncclResult_t issue[MAXR], end;
  char msg[600];
  char comm_msg[MAXR][300];
};

static void *same_stream_group(void *p) {
  struct same_stream_arg *a = p;
  cudaSetDevice(0);
  ncclResult_t start = ncclGroupStart();
  for (int r = 0; r < a->n; r++)
    a->issue[r] = ncclAllReduce(a->buf[r], a->buf[r], a->count, ncclFloat, ncclSum, a->comms[r], a->streams[r]);
  a->end = first_error(start, ncclGroupEnd());
  snprintf(a->msg, sizeof a->msg, "%.590s", last_error(NULL)); /* this thread's message */
  for (int r = 0; r < a->n; r++) snprintf(a->comm_msg[r], sizeof a->comm_msg[r], "%.290s", last_error(a->comms[r]));
  return NULL;
}

/* variant 0: both ranks on stream s; 1: both on stream 0; 2: 4 ranks, ranks 1 and 3 share. */
static void case_d(int n, int variant) {
  set_multi(1);
  cudaSetDevice(0);
  ncclComm_t comms[MAXR];
  if (init_all_on_gpu0(comms, n)) return;
  cudaStream_t own[MAXR], shared;
  create_streams(own, n);
  create_streams(&shared, 1);
  cudaStream_t use[MAXR];
  int share_a = 0, share_b = 1;
  for (int r = 0; r < n; r++) use[r] = own[r];
  if (variant == 0) {
    use[0] = use[1] = shared;
  } else if (variant == 1) {
    use[0] = use[1] = 0; /* the legacy default stream */
  } else {
    share_a = 1;
    share_b = 3;
    use[1] = use[3] = shared;
  }
  const size_t count = 1023;
  void *buf[MAXR];
  for (int r = 0; r < n; r++) {
    if (cudaMalloc(&buf[r], count * 4) != cudaSuccess) die_hang("cudaMalloc");
    cudaMemset(buf[r], 0, count * 4);
  }
  cudaDeviceSynchronize();
  struct same_stream_arg arg = {.n = n, .comms = comms, .buf = buf, .count = count, .streams = use};
  printf("  one group: ncclAllReduce of ranks %d and %d on one stream (%s)%s\n", share_a, share_b,
         variant == 1 ? "stream 0" : "a created stream", variant == 2 ? ", ranks 0 and 2 on their own" : "");
  set_step("ncclGroupEnd with ranks %d and %d on one stream", share_a, share_b);
  double t0 = now();
  struct job *j = job_start(same_stream_group, &arg);
  if (!job_wait(j, t0 + 20))
    die_hang("ncclGroupEnd with ranks %d and %d of one communicator on one stream did not return within 20 s", share_a,
             share_b);
  printf("  returned after %.3f s: ncclGroupEnd %s; enqueue:", now() - t0, ncclGetErrorString(arg.end));
  for (int r = 0; r < n; r++) printf(" rank %d %s", r, ncclGetErrorString(arg.issue[r]));
  printf("\n  ncclGetLastError(NULL) in that thread: %s\n", arg.msg);
  for (int r = 0; r < n; r++) printf("  ncclGetLastError(comm %d): %s\n", r, arg.comm_msg[r]);
  CHECK(arg.end == ncclInvalidUsage, "ncclGroupEnd with two ranks on one stream gave %s, want ncclInvalidUsage",
        ncclGetErrorString(arg.end));
  int named = mentions(arg.msg, "stream") || mentions(arg.msg, "rank");
  for (int r = 0; r < n; r++) named = named || mentions(arg.comm_msg[r], "stream") || mentions(arg.comm_msg[r], "rank");
  CHECK(named, "no error message names the stream or the ranks: '%s'", arg.msg);
  /* Nothing of the refused group may stay queued (a rank waiting for a peer would hang). */
  set_step("streams after the refused group");
  for (int r = 0; r < n; r++) wait_idle(use[r], 10, "a stream after the refused group");
  char label[120];
  snprintf(label, sizeof label, "afterwards: all_reduce float 2^20+3, %d streams", n);
  struct op o = {.coll = C_ALLREDUCE, .type = ncclFloat, .count = BIG, .n = n};
  run_group(label, &o, 1, comms, own, n);
  struct op o2 = {.coll = C_ALLGATHER, .type = ncclInt32, .count = 1023, .n = n};
  run_group("afterwards: all_gather int32 1023", &o2, 1, comms, own, n);
  for (int r = 0; r < n; r++) cudaFree(buf[r]);
  destroy_streams(own, n);
  destroy_streams(&shared, 1);
  destroy_comms(comms, n);
}

/* ---------------------------------------------------------------- e: abort */

struct lone_arg {
  ncclComm_t comm;
  void *buf;
  size_t count;
  cudaStream_t s;
  ncclResult_t res;
  volatile double returned;
};

static void *lone_allreduce(void *p) {
  struct lone_arg *a = p;
  cudaSetDevice(0);
  a->res = ncclAllReduce(a->buf, a->buf, a->count, ncclFloat, ncclSum, a->comm, a->s);
  a->returned = now();
  return NULL;
}

static void case_e(int n, int variant) {
  (void)variant;
  set_multi(1);
  cudaSetDevice(0);
  ncclComm_t comms[MAXR];
  if (init_all_on_gpu0(comms, n)) return;
  cudaStream_t st[MAXR];
  create_streams(st, n);
  const size_t count = 1 << 20;
  /* Connections of this size and algorithm are set up by a complete all-reduce first, so that
   * rank 0's kernel (not a host-side connect) is what waits for rank 1. */
  struct op warm = {.coll = C_ALLREDUCE, .type = ncclFloat, .count = count, .n = n};
  if (run_group("warm-up all_reduce float 2^20, both ranks", &warm, 1, comms, st, n)) {
    abort_comms(comms, n);
    return;
  }
  void *buf;
  if (cudaMalloc(&buf, count * 4) != cudaSuccess) die_hang("cudaMalloc");
  cudaMemset(buf, 0, count * 4);
  cudaDeviceSynchronize();
  struct lone_arg la = {.comm = comms[0], .buf = buf, .count = count, .s = st[0], .res = ncclSuccess};
  set_step("rank 0 alone in ncclAllReduce");
  double t_start = now();
  struct job *j = job_start(lone_allreduce, &la);
  usleep(1000 * 1000);
  cudaError_t q = cudaStreamQuery(st[0]);
  printf("  after 1 s: rank 0's ncclAllReduce %s; its stream %s\n", la.returned > 0 ? "returned" : "has not returned",
         q == cudaErrorNotReady ? "is busy (waiting for rank 1)" : cudaGetErrorString(q));
  /* An all-reduce that completes without its peer cannot be right. */
  CHECK(!(q == cudaSuccess && la.returned > 0 && la.res == ncclSuccess),
        "rank 0's ncclAllReduce finished within 1 s although rank 1 never called it");
  set_step("ncclCommAbort(comm 0) from the main thread (limit 20 s)");
  bound_step(20);
  double t_abort = now();
  ncclResult_t ra = ncclCommAbort(comms[0]);
  double t_abort0 = now() - t_abort;
  set_step("ncclCommAbort(comm 1) from the main thread (limit 20 s)");
  bound_step(20);
  ncclResult_t rb = ncclCommAbort(comms[1]);
  double t_abort1 = now() - t_abort;
  bound_step(0);
  comms[0] = comms[1] = NULL;
  printf("  ncclCommAbort(comm 0): %s after %.3f s; ncclCommAbort(comm 1): %s after %.3f s\n", ncclGetErrorString(ra),
         t_abort0, ncclGetErrorString(rb), t_abort1);
  CHECK(ra == ncclSuccess, "ncclCommAbort(comm 0): %s", ncclGetErrorString(ra));
  CHECK(rb == ncclSuccess, "ncclCommAbort(comm 1): %s", ncclGetErrorString(rb));
  set_step("rank 0's stream after the abort (limit 15 s)");
  double released = -1;
  cudaError_t last = cudaErrorNotReady;
  while (now() - t_abort < 15) {
    last = cudaStreamQuery(st[0]);
    if (last != cudaErrorNotReady) {
      released = now() - t_abort;
      break;
    }
    usleep(200);
  }
  if (released >= 0)
    printf("  abort released rank 0's stream after %.3f s (stream: %s)\n", released, cudaGetErrorString(last));
  CHECK(released >= 0, "rank 0's stream still busy 15 s after ncclCommAbort");
  if (released < 0) die_hang("rank 0's stream still busy 15 s after ncclCommAbort");
  if (!job_wait(j, t_abort + 15)) die_hang("rank 0's ncclAllReduce did not return within 15 s of the abort");
  printf("  rank 0's ncclAllReduce returned %s, %.3f s after it was called\n", ncclGetErrorString(la.res),
         la.returned - t_start);
  cudaGetLastError();
  cudaFree(buf);
  cudaGetLastError();
  destroy_streams(st, n);
}

/* ---------------------------------------------------------------- f: processes */

static void id_to_hex(const ncclUniqueId *id, char *hex) {
  const unsigned char *b = (const unsigned char *)id->internal;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) snprintf(hex + 2 * i, 3, "%02x", b[i]);
}

static int hex_to_id(const char *hex, ncclUniqueId *id) {
  if (strlen(hex) != 2 * NCCL_UNIQUE_ID_BYTES) return -1;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
    id->internal[i] = (char)v;
  }
  return 0;
}

/* fork + exec of this binary; the child dies with its parent (PR_SET_PDEATHSIG). */
static pid_t spawn_self(char *const argv[]) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    execv(self_exe, argv);
    _exit(127);
  }
  return pid;
}

/* One rank process: exit status = failed checks (at most 76), EXIT_SKIP for a refusal. */
static int rank_proc(const char *hex, int n, int r, int env_on) {
  char name[32];
  snprintf(name, sizeof name, "rank %d", r);
  case_name = name;
  signal(SIGALRM, on_alarm);
  alarm(130);
  if (env_on) setenv(ENV_NAME, "1", 1);
  else unsetenv(ENV_NAME);
  ncclUniqueId id;
  if (hex_to_id(hex, &id)) {
    printf("  [rank %d] bad unique id '%s'\n", r, hex);
    return 1;
  }
  cudaError_t ce = cudaSetDevice(0);
  if (ce != cudaSuccess) {
    printf("  [rank %d] FAIL cudaSetDevice(0): %s\n", r, cudaGetErrorString(ce));
    return 1;
  }
  ncclComm_t comm = NULL;
  double t0 = now();
  set_step("rank %d: ncclCommInitRank", r);
  ncclResult_t res = ncclCommInitRank(&comm, n, id, r);
  char msg[600];
  snprintf(msg, sizeof msg, "%.590s", last_error(NULL));
  printf("  [rank %d pid %d] ncclCommInitRank on device 0 (%s%s): %s / %s (%.3f s)\n", r, (int)getpid(), ENV_NAME,
         env_on ? "=1" : " unset", ncclGetErrorString(res), res == ncclSuccess ? "" : msg, now() - t0);
  if (!env_on) {
    CHECK(res == ncclInvalidUsage, "rank %d: init on a shared GPU without %s gave %s, want ncclInvalidUsage", r,
          ENV_NAME, ncclGetErrorString(res));
    duplicate_message(msg, r);
    if (comm) ncclCommAbort(comm);
  } else if (res != ncclSuccess) {
    if (init_failed(res, msg, "ncclCommInitRank in a process on a shared GPU")) return EXIT_SKIP;
    if (comm) ncclCommAbort(comm);
  } else {
    check_queries(comm, n, r);
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) die_hang("cudaStreamCreate");
    rank_sequence(r, n, comm, s);
    cudaStreamDestroy(s);
    set_step("rank %d: ncclCommDestroy", r);
    res = ncclCommDestroy(comm);
    CHECK(res == ncclSuccess, "rank %d: ncclCommDestroy: %s / %s", r, ncclGetErrorString(res), last_error(NULL));
  }
  fflush(stdout);
  return n_fail > 76 ? 76 : n_fail;
}

static void case_f(int n, int env_on) {
  set_multi(env_on);
  ncclUniqueId id;
  ncclResult_t res = ncclGetUniqueId(&id);
  CHECK(res == ncclSuccess, "ncclGetUniqueId: %s", ncclGetErrorString(res));
  if (res != ncclSuccess) return;
  char hex[2 * NCCL_UNIQUE_ID_BYTES + 1];
  id_to_hex(&id, hex);
  char nstr[16], rstr[MAXR][16];
  snprintf(nstr, sizeof nstr, "%d", n);
  pid_t pids[MAXR];
  int status[MAXR], done[MAXR];
  fflush(stdout);
  for (int r = 0; r < n; r++) {
    snprintf(rstr[r], sizeof rstr[r], "%d", r);
    char *argv[] = {self_exe, "--rank-proc", hex, nstr, rstr[r], env_on ? "1" : "0", NULL};
    pids[r] = spawn_self(argv);
    done[r] = pids[r] < 0;
    status[r] = 0;
    CHECK(pids[r] > 0, "fork: %s", strerror(errno));
  }
  set_step("waiting for %d rank processes (limit 120 s)", n);
  double t0 = now();
  int left = 0;
  for (;;) {
    left = 0;
    for (int r = 0; r < n; r++) {
      if (done[r]) continue;
      pid_t w = waitpid(pids[r], &status[r], WNOHANG);
      if (w == pids[r] || (w < 0 && errno == ECHILD)) done[r] = 1;
      else left++;
    }
    if (!left || now() - t0 > 120) break;
    usleep(20000);
  }
  int killed = 0;
  for (int r = 0; r < n; r++) {
    if (done[r]) continue;
    kill(pids[r], SIGKILL);
    waitpid(pids[r], &status[r], 0);
    killed++;
    CHECK(0, "rank process %d (pid %d) still running after 120 s: killed", r, (int)pids[r]);
  }
  int skips = 0, bad = 0;
  for (int r = 0; r < n; r++) {
    if (pids[r] <= 0) continue;
    int st = status[r];
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (code == EXIT_SKIP) skips++;
    else if (code != 0) bad++;
    if (WIFSIGNALED(st)) printf("  rank process %d: killed by signal %d\n", r, WTERMSIG(st));
    else if (code != 0 && code != EXIT_SKIP) printf("  rank process %d: exit status %d\n", r, code);
  }
  printf("  %d rank processes done in %.3f s: %d ok, %d refused, %d failed, %d killed\n", n, now() - t0,
         n - skips - bad, skips, bad, killed);
  if (env_on && skips == n) {
    note_skip("refused by this library: every rank process's ncclCommInitRank (see the lines above)");
  } else {
    CHECK(bad == 0 && skips == 0, "%d of %d rank processes failed (%d refused)", bad + skips, n, skips);
  }
}

/* ---------------------------------------------------------------- the cases */

struct case_def {
  const char *name;
  void (*fn)(int n, int variant);
  int n, variant, limit, proc;
  const char *what;
};

static const struct case_def cases[] = {
    {"a-initall-unset", case_a_initall, 2, 0, 60, 0, "env unset: ncclCommInitAll(2, {0,0}) is ncclInvalidUsage"},
    {"a-threads-unset", case_a_threads, 2, 0, 60, 0, "env unset: 2 threads' ncclCommInitRank on device 0 refused"},
    {"b-initall-2", case_b, 2, 0, 150, 0, "env=1: ncclCommInitAll of 2 ranks on device 0, every collective"},
    {"b-initall-4", case_b, 4, 0, 150, 0, "env=1: ncclCommInitAll of 4 ranks on device 0, every collective"},
    {"b-initall-8", case_b, 8, 0, 200, 0, "env=1: ncclCommInitAll of 8 ranks on device 0, every collective"},
    {"c-threads-2", case_c, 2, 0, 120, 0, "env=1: 2 threads, ncclCommInitRank, collectives outside groups"},
    {"c-threads-4", case_c, 4, 0, 120, 0, "env=1: 4 threads, ncclCommInitRank, collectives outside groups"},
    {"d-same-stream", case_d, 2, 0, 90, 0, "env=1: 2 ranks on one stream in one group: ncclInvalidUsage"},
    {"d-same-stream-null", case_d, 2, 1, 90, 0, "env=1: 2 ranks on stream 0 in one group: ncclInvalidUsage"},
    {"d-same-stream-4", case_d, 4, 2, 90, 0, "env=1: ranks 1 and 3 of 4 on one stream: ncclInvalidUsage"},
    {"e-abort", case_e, 2, 0, 75, 0, "env=1: ncclCommAbort releases a rank waiting for a peer"},
    {"f-procs-2", case_f, 2, 1, 150, 1, "env=1: 2 processes on device 0"},
    {"f-procs-4", case_f, 4, 1, 150, 1, "env=1: 4 processes on device 0"},
    {"f-procs-unset-2", case_f, 2, 0, 150, 1, "env unset: 2 processes on device 0 refused"},
    {"f-procs-unset-4", case_f, 4, 0, 150, 1, "env unset: 4 processes on device 0 refused"},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* In the child: run one case, write its verdict to the result pipe, exit. */
static int run_case(const char *name, int limit) {
  const struct case_def *c = NULL;
  for (int i = 0; i < NCASES; i++)
    if (!strcmp(cases[i].name, name)) c = &cases[i];
  if (!c) {
    printf("shared_gpu: no case '%s' (see -l)\n", name);
    return 2;
  }
  case_name = c->name;
  if (result_fd >= 0) fcntl(result_fd, F_SETFD, FD_CLOEXEC); /* not for the rank processes */
  if (limit <= 0) limit = c->limit;
  case_deadline = now() + limit;
  signal(SIGALRM, on_alarm);
  alarm((unsigned)limit);
  detect_library();
  if (c->fn != case_f) {
    set_step("cudaSetDevice(0)");
    cudaError_t e = cudaSetDevice(0);
    if (e != cudaSuccess) {
      CHECK(0, "cudaSetDevice(0): %s", cudaGetErrorString(e));
      c = NULL;
    }
  }
  if (c) c->fn(c->n, c->variant);
  char buf[1400];
  int code;
  if (n_fail) {
    snprintf(buf, sizeof buf, "FAIL %d of %d checks failed; first: %s", n_fail, n_fail + n_checks, first_fail);
    code = 1;
  } else if (skipped) {
    snprintf(buf, sizeof buf, "SKIP %s", skip_reason);
    code = EXIT_SKIP;
  } else {
    snprintf(buf, sizeof buf, "PASS %d checks", n_checks);
    code = 0;
  }
  if (result_fd >= 0) write_all(result_fd, buf, strlen(buf));
  else printf("%s\n", buf);
  fflush(stdout);
  exiting = 1;
  alarm(15); /* library destructors at exit must not hang the run */
  return code;
}

/* --copy-rate: device-to-device cudaMemcpyAsync on GPU 0 at a few sizes, timed with CUDA events
 * (for comparison with one-rank collective times). Not a test: prints a table, exit 0 unless a
 * CUDA call fails or a copy does not finish within 60 s. */
static int copy_rate(void) {
  static const size_t sizes[] = {(size_t)1 << 20, (size_t)16 << 20, (size_t)256 << 20, (size_t)1 << 30};
  static const int iters[] = {200, 50, 10, 5};
  signal(SIGALRM, on_alarm);
  alarm(240);
  void *src = NULL, *dst = NULL;
  cudaStream_t s;
  cudaEvent_t e0, e1;
  cudaError_t e = cudaSetDevice(0);
  if (e == cudaSuccess) e = cudaMalloc(&src, sizes[3]);
  if (e == cudaSuccess) e = cudaMalloc(&dst, sizes[3]);
  if (e == cudaSuccess) e = cudaMemset(src, 1, sizes[3]);
  if (e == cudaSuccess) e = cudaMemset(dst, 0, sizes[3]);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreate(&e0);
  if (e == cudaSuccess) e = cudaEventCreate(&e1);
  if (e != cudaSuccess) {
    printf("copy-rate: CUDA setup failed: %s\n", cudaGetErrorString(e));
    return 1;
  }
  printf("# device-to-device cudaMemcpyAsync on GPU 0 (one non-blocking stream, CUDA events)\n");
  printf("# %12s %8s %12s %10s %14s\n", "size (B)", "iters", "time (us)", "GB/s", "r+w GB/s");
  for (int i = 0; i < 4; i++) {
    size_t n = sizes[i];
    for (int w = 0; w < 2; w++) cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s);
    cudaEventRecord(e0, s);
    for (int k = 0; k < iters[i]; k++) cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s);
    cudaEventRecord(e1, s);
    double t0 = now();
    while ((e = cudaEventQuery(e1)) == cudaErrorNotReady) {
      if (now() - t0 > 60) {
        printf("copy-rate: copies of %zu B not done after 60 s\n", n);
        return 1;
      }
      usleep(100);
    }
    float ms = 0;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0, e1);
    if (e != cudaSuccess) {
      printf("copy-rate: %s\n", cudaGetErrorString(e));
      return 1;
    }
    double us = (double)ms * 1000.0 / iters[i];
    double gbs = (double)n / (us * 1e-6) / 1e9;
    printf("  %12zu %8d %12.2f %10.2f %14.2f\n", n, iters[i], us, gbs, 2 * gbs);
  }
  cudaFree(src);
  cudaFree(dst);
  return 0;
}

static int selected(const char *name, const char *list) {
  if (!list) return 1;
  char copy[1024];
  snprintf(copy, sizeof copy, "%s", list);
  char *save = NULL;
  for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
    if (*t && !strncmp(name, t, strlen(t))) return 1;
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* keep every line if a case is killed */
  ssize_t len = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
  if (len <= 0) {
    printf("shared_gpu: cannot read /proc/self/exe\n");
    return 2;
  }
  self_exe[len] = 0;
  if (argc == 6 && !strcmp(argv[1], "--rank-proc")) {
    int code = rank_proc(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    fflush(stdout);
    exiting = 1;
    alarm(15);
    return code;
  }
  int max_ranks = MAXR, skip_procs = 0, list = 0, budget = 900;
  const char *only = NULL, *one = NULL;
  int limit = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-n") && i + 1 < argc) max_ranks = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-x")) skip_procs = 1;
    else if (!strcmp(argv[i], "-c") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "-T") && i + 1 < argc) budget = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-l")) list = 1;
    else if (!strcmp(argv[i], "--copy-rate")) return copy_rate();
    else if (!strcmp(argv[i], "--case") && i + 1 < argc) one = argv[++i];
    else if (!strcmp(argv[i], "--result-fd") && i + 1 < argc) result_fd = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--limit") && i + 1 < argc) limit = atoi(argv[++i]);
    else {
      printf("usage: shared_gpu [-x] [-n MAX] [-c LIST] [-T SECONDS] [-l] | --case NAME | --copy-rate\n");
      return 2;
    }
  }
  if (list) {
    for (int i = 0; i < NCASES; i++) printf("%-20s %3d s  %s\n", cases[i].name, cases[i].limit, cases[i].what);
    return 0;
  }
  if (one) return run_case(one, limit);

  detect_library();
  const char *env = getenv(ENV_NAME);
  printf("library %s: version %d, %s; %s in the environment: %s (each case sets or unsets it)\n", lib_path,
         lib_version, lib_is_oxccl ? "oxccl" : "not oxccl (refusals under " ENV_NAME "=1 count as SKIP)", ENV_NAME,
         env ? env : "unset");
  printf("max ranks %d, process cases %s, time budget %d s\n", max_ranks, skip_procs ? "skipped" : "on", budget);
  int passed = 0, failed = 0, skips = 0, not_run = 0;
  char failed_names[1024] = "", not_run_names[1024] = "";
  double start = now();
  for (int i = 0; i < NCASES; i++) {
    const struct case_def *c = &cases[i];
    if (c->n > max_ranks || (skip_procs && c->proc) || !selected(c->name, only)) continue;
    double left = budget - (now() - start);
    int lim = c->limit;
    if (left < lim + 20) {
      if (left < 30) {
        printf("NOT RUN %-20s (time budget: %.0f s left)\n", c->name, left);
        not_run++;
        size_t l = strlen(not_run_names);
        snprintf(not_run_names + l, sizeof not_run_names - l, " %s", c->name);
        continue;
      }
      lim = (int)left - 20;
    }
    printf("-- %s: %s (limit %d s)\n", c->name, c->what, lim);
    int pfd[2];
    if (pipe(pfd) != 0) {
      printf("shared_gpu: pipe: %s\n", strerror(errno));
      return 2;
    }
    char fdstr[16], limstr[16];
    snprintf(fdstr, sizeof fdstr, "%d", pfd[1]);
    snprintf(limstr, sizeof limstr, "%d", lim);
    char *cargv[] = {self_exe, "--case", (char *)c->name, "--result-fd", fdstr, "--limit", limstr, NULL};
    double t0 = now();
    pid_t pid = spawn_self(cargv);
    close(pfd[1]);
    int status = 0, killed = 0;
    if (pid > 0) {
      for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid || (w < 0 && errno != EINTR)) break;
        if (now() - t0 > lim + 15) {
          kill(pid, SIGKILL);
          waitpid(pid, &status, 0);
          killed = 1;
          break;
        }
        usleep(20000);
      }
    }
    double secs = now() - t0;
    char res[1500] = "";
    fcntl(pfd[0], F_SETFL, O_NONBLOCK);
    size_t got = 0;
    for (;;) {
      ssize_t k = read(pfd[0], res + got, sizeof res - 1 - got);
      if (k <= 0) break;
      got += (size_t)k;
      if (got >= sizeof res - 1) break;
    }
    res[got] = 0;
    close(pfd[0]);
    const char *verdict;
    char detail[1600];
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    const char *body = res[0] ? (strchr(res, ' ') ? strchr(res, ' ') + 1 : res) : "";
    if (pid <= 0) {
      verdict = "FAIL";
      snprintf(detail, sizeof detail, "fork: %s", strerror(errno));
    } else if (killed) {
      verdict = "FAIL";
      snprintf(detail, sizeof detail, "killed after %d s (no end)%s%s", lim + 15, res[0] ? "; " : "", res);
    } else if (WIFSIGNALED(status)) {
      verdict = "FAIL";
      snprintf(detail, sizeof detail, "killed by signal %d%s%s", WTERMSIG(status), res[0] ? "; " : "", res);
    } else if (code == 0 && !strncmp(res, "PASS", 4)) {
      verdict = "PASS";
      snprintf(detail, sizeof detail, "%s", body);
    } else if (code == EXIT_SKIP) {
      verdict = "SKIP";
      snprintf(detail, sizeof detail, "%s", body);
    } else if (code == EXIT_EXIT_HUNG) {
      verdict = "FAIL";
      snprintf(detail, sizeof detail, "%s", body);
    } else {
      verdict = "FAIL";
      snprintf(detail, sizeof detail, "exit status %d: %s", code, res[0] ? body : "(no result)");
    }
    printf("%s %-20s %8.2f s  %s\n", verdict, c->name, secs, detail);
    if (!strcmp(verdict, "PASS")) passed++;
    else if (!strcmp(verdict, "SKIP")) skips++;
    else {
      failed++;
      size_t l = strlen(failed_names);
      snprintf(failed_names + l, sizeof failed_names - l, " %s", c->name);
    }
  }
  printf("%d passed, %d failed, %d skipped, %d not run (%.1f s)%s%s%s%s\n", passed, failed, skips, not_run,
         now() - start, failed ? "; failed:" : "", failed_names, not_run ? "; not run:" : "", not_run_names);
  return failed || not_run ? 1 : 0;
}
