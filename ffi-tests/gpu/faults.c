/* Faults among ranks sharing GPU 0, one process per rank or (-t) one thread per rank (issue
 * 13): the hang report, the mismatch report and the dead-rank error must name the right rank
 * and operation, and nothing may hang. Every case runs NRANKS rank processes (this binary
 * re-executed with --rank; -t: threads, below), each with NCCL_MULTI_RANK_GPU_ENABLE=1 on
 * device 0, OXCCL_HANG_REPORT_S=3 and its log in NCCL_DEBUG_FILE (a temporary folder, printed
 * afterwards). Every rank runs 3 all-reduces of 4096 floats (checked idle), then the last rank
 * ("the culprit") misbehaves in collective #4:
 *
 *   skip-report  the culprit never calls #4; OXCCL_HANG_ERROR unset: each waiting rank's log
 *                has exactly one "has made no progress" line for ncclAllReduce #4 (4096 ×
 *                float) naming the culprit (rank, host, pid) and its last enqueued/completed
 *                #3 and ending in what this rank's GPU waits for, from which rank (at 2
 *                ranks: the culprit); the culprit's log says it has not called it; the async error stays
 *                ncclSuccess; then ncclCommAbort releases the waiting ranks
 *   skip         the same with OXCCL_HANG_ERROR=1: the waiting ranks get ncclRemoteError
 *                whose ncclGetLastError(comm) (and ncclGetLastError(NULL) after
 *                ncclCommGetAsyncError) names the culprit; their streams go idle (kernels
 *                released) without ncclCommAbort
 *   collective   the culprit calls ncclAllGather (1024 floats) as #4: every rank's error says
 *                "rank C called ncclAllGather #4 (1024 × float) where ... called
 *                ncclAllReduce #4 (4096 × float)"
 *   count        the culprit calls ncclAllReduce with 2048 floats: the error names both
 *                counts (reported once the others stall; the culprit's own call may complete)
 *   kill         every rank calls #4; the culprit SIGKILLs itself 1 s later: the others get
 *                ncclRemoteError naming it (rank, pid, "is gone") within 10 s and their
 *                streams go idle (kernels released) before ncclCommAbort
 *   graph-skip   the all-reduce is a CUDA graph replayed 3 times, and the culprit skips the
 *                4th replay: the waiting ranks' GPUs report what they wait for, from which
 *                rank, with no pending operation and no error (graph_main)
 * With the collective check on (OXCCL_CHECK_COLLECTIVES=1, ranks filled with r+1; the three
 * all-reduces out of place and their sums checked):
 *   check-collective, check-count, check-root
 *                the culprit calls ncclAllGather (1024 floats), ncclAllReduce with 2048
 *                floats, or ncclBroadcast with itself as the root where the others name rank
 *                0, as #4: every rank's call returns ncclInvalidUsage within 15 s, its
 *                ncclGetLastError(comm) and ncclGetLastError(NULL) name the culprit and both
 *                calls in the hang report's words ("rank C called ncclAllGather #4 (1024 ×
 *                float) where ranks 0,..,C-1 called ncclAllReduce #4 (4096 × float)"), the
 *                async error is ncclInvalidUsage, the stream stays idle (nothing launched)
 *   check-nonblocking
 *                check-count on a non-blocking communicator (ncclInProgress answers are
 *                waited out through ncclCommGetAsyncError, bounded)
 *   check-group  a second communicator from ncclCommSplit; one ncclGroupStart/End with an
 *                all-reduce on each, the culprit's on the second with 2048 floats:
 *                ncclGroupEnd returns ncclInvalidUsage on every rank, the second
 *                communicator's error names the mismatch (#1 of that communicator), the first
 *                communicator's all-reduce runs and is right, its async error stays ncclSuccess
 *   check-good   the check on and every rank agreeing: broadcast, all-gather, reduce-scatter,
 *                a zero-count all-reduce (a no-op, checked too), a ring of sends and receives
 *                in a group, and two all-reduces in one group: every result right, no
 *                check or hang line in any log
 * After each case every rank tears down (ncclCommAbort after an error, else ncclCommDestroy);
 * a rank process has an 80 s alarm and the case a 100 s limit, after which it is killed.
 *
 * Ranks as threads (-t): every case's ranks are threads of ONE process instead, the binary
 * re-executed with --threads (forked and bounded by the case limit as a rank process is, so a
 * hang or a crash ends the case, not the driver): one pthread per rank, each with its own
 * ncclComm_t on device 0 from ncclCommInitRank with one ncclUniqueId the process makes, the
 * environment above set before the first NCCL call, one NCCL_DEBUG_FILE (DIR/threads.log).
 * The same cases and checks (the culprit is the last rank's thread; the others wait for it
 * through the same 'ready' flags), except:
 *   - kill is skipped (SKIP, counted as skipped): SIGKILL cannot end one rank thread alone;
 *     -H is refused (NCCL_HOSTID is per process)
 *   - a rank's log is the lines of the one file whose head, "comm 0x.. commHash 0x.. rank R
 *     (host ..", names it (head_rank: the watchdog's lines and errors begin so; the host:pid:tid
 *     prefix cannot tell ranks apart, the watchdog's own thread writes most lines): every
 *     per-rank count is of those; check-good wants no check or hang line in the whole file
 *   - "pid P" in a report names the one process, not the rank: the rank number does
 *   - ncclGetLastError(NULL) is per thread (src/error.rs): as in the process mode it must hold
 *     this rank's error, which its head must name (every rank's names the same mismatch), and
 *     the skipping culprit's must hold none of the others' errors
 *   - rank threads still running 75 s after the start are named and the process ends (exit 3)
 * Both modes wait for their first buffer on their own stream, never with
 * cudaDeviceSynchronize (which, in one process, waits for the other ranks' kernels).
 *
 * Prints one line per case and 'N passed, M failed, K skipped, J not run'; exit 0 iff nothing
 * failed and nothing was left out.
 *
 * usage: faults [-n NRANKS] [-t] [-H] [-c LIST] [-T SECONDS] [-l]
 *        | --rank CASE R N HEX DIR | --threads CASE N DIR     (the last two: the driver's)
 *   -n NRANKS   ranks per case, 2..8 (default 2)
 *   -t          every case's ranks as threads of one process (above)
 *   -H          every rank claims a host of its own (NCCL_HOSTID=oxccl-faults-host-R, and
 *               NCCL_SOCKET_IFNAME=lo unless set): the ranks reach each other over the
 *               network transport (loopback sockets), as ranks on separate machines
 *   -c LIST     only these cases (comma list of names or prefixes)
 *   -T SECONDS  time budget (default 600): a case gets at most what is left less 5 s (and
 *               100 s); with under 25 s left it is not started
 *   -l          list the cases (with -t, kill with why it is skipped) */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
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
#define COUNT 4096
#define CASE_LIMIT 100.0
#define EXIT_SKIP 77
#define JOIN_LIMIT 75 /* s: a rank thread still running then hangs (-t) */

static const char *CASES[] = {"skip-report", "skip", "collective", "count", "kill", "graph-skip", "check-collective",
                              "check-count", "check-root", "check-nonblocking", "check-group", "check-good"};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

static char self_exe[4096];
/* Per thread: a rank's counts and its tag (a rank is a thread under -t). */
static _Thread_local int n_fail, n_checks;
static _Thread_local char tag[64] = "main";
/* -t, and in the process a -t case runs in (--threads): every rank a thread of one process. */
static int threads_mode;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One FAIL line per failed check, whole even when rank threads print at once. */
#define CHECK(cond, ...)                                 \
  do {                                                   \
    if (cond) {                                          \
      n_checks++;                                        \
    } else {                                             \
      n_fail++;                                          \
      flockfile(stdout);                                 \
      printf("  [%s] FAIL (line %d) ", tag, __LINE__);   \
      printf(__VA_ARGS__);                               \
      printf("\n");                                      \
      fflush(stdout);                                    \
      funlockfile(stdout);                               \
    }                                                    \
  } while (0)

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "  FAIL rank process: 80 s alarm (a wait never ended)\n";
  static const char threads_msg[] = "  FAIL the rank threads' process: 80 s alarm (a wait never ended)\n";
  const char *m = threads_mode ? threads_msg : msg;
  size_t len = threads_mode ? sizeof threads_msg - 1 : sizeof msg - 1;
  if (write(1, m, len) < 0) _exit(3);
  _exit(3);
}

/* What rank processes of one case share: a file mapped by each. */
struct shared {
  volatile int pid[MAXR];
  volatile int ready[MAXR];
  volatile int done[MAXR];
};

static struct shared *map_shared(const char *dir, int create) {
  char path[4200];
  snprintf(path, sizeof path, "%s/shared", dir);
  int fd = open(path, O_RDWR | (create ? O_CREAT : 0), 0600);
  if (fd < 0) return NULL;
  if (create && ftruncate(fd, sizeof(struct shared)) != 0) {
    close(fd);
    return NULL;
  }
  void *p = mmap(NULL, sizeof(struct shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return p == MAP_FAILED ? NULL : (struct shared *)p;
}

/* The whole of a file (malloc'ed, NUL-terminated; empty if none). */
static char *read_file(const char *path) {
  FILE *f = fopen(path, "r");
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  if (f) {
    size_t got;
    while ((got = fread(buf + len, 1, cap - 1 - len, f)) > 0) {
      len += got;
      if (len + 1 == cap) {
        char *bigger = realloc(buf, cap *= 2);
        if (!bigger) break;
        buf = bigger;
      }
    }
    fclose(f);
  }
  buf[len] = 0;
  return buf;
}

/* NCCL_DEBUG_FILE of rank r: its own file, or under -t the one file of every rank thread. */
static void log_path(char *path, size_t cap, const char *dir, int r) {
  if (threads_mode) snprintf(path, cap, "%s/threads.log", dir);
  else snprintf(path, cap, "%s/rank%d.log", dir, r);
}

/* Rank r's log file as it is: under -t every rank's lines (check-good wants none of them). */
static char *whole_log(const char *dir, int r) {
  char path[4200];
  log_path(path, sizeof path, dir, r);
  return read_file(path);
}

/* The rank a log line or error message speaks for, -1 if none: the R of the head that the
 * watchdog's lines (the hang report, the culprit's answer, the GPU's wait, the collective
 * check) and its errors begin with, "comm 0x.. commHash 0x.. rank R (host ..", after the
 * "[time] host:pid:tid [dev] file:line (func) NCCL WARN " of src/debug.rs (a WARN's empty
 * line before it names no rank) and an API entry's "ncclXxx: ". The pid is
 * every rank's under -t and the tid no use (the watchdog's thread writes most lines). A lost
 * peer's line ("commHash 0x..: rank P (host ..) is gone", no case under -t) names the peer,
 * not the writer: -1. Of the few lines without a communicator's name, "rank R: .." (a
 * watchdog that cannot start or track completion) is R's, "watchdog: .." no rank's. */
static int head_rank(const char *text) {
  const char *p = strstr(text, " NCCL WARN ");
  const char *eol = strchr(text, '\n');
  p = p && (!eol || p < eol) ? p + strlen(" NCCL WARN ") : text;
  if (!strncmp(p, "nccl", 4)) {
    const char *colon = strstr(p, ": "), *space = strchr(p, ' ');
    if (colon && (!space || colon < space)) p = colon + 2;
  }
  int rank = -1, end = 0;
  if (sscanf(p, "comm %*[0-9a-fx] commHash %*[0-9a-fx] rank %d%n", &rank, &end) == 1 && end > 0 &&
      (!strncmp(p + end, " (host ", 7) || p[end] == ':')) /* ':' where the idents are unknown */
    return rank;
  end = 0;
  if (sscanf(p, "rank %d%n", &rank, &end) == 1 && end > 0 && p[end] == ':') return rank;
  return -1;
}

/* Rank r's own log lines (malloc'ed): its file, or under -t the lines of the one file whose
 * head names r (head_rank). Lines that name no rank are in no rank's text under -t. */
static char *rank_log(const char *dir, int r) {
  char *log = whole_log(dir, r);
  if (!log || !threads_mode) return log;
  char *out = log;
  for (char *line = log; *line;) {
    char *eol = strchr(line, '\n');
    size_t len = eol ? (size_t)(eol - line) + 1 : strlen(line);
    if (eol) *eol = 0; /* head_rank reads one line */
    int keep = head_rank(line) == r;
    if (eol) *eol = '\n';
    if (keep) {
      memmove(out, line, len);
      out += len;
    }
    line += len;
  }
  *out = 0;
  return log;
}

static int count_of(const char *text, const char *what) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
  return n;
}

/* Whether `s` is idle within `secs` (polling, never blocking). */
static int stream_idle_within(cudaStream_t s, double secs) {
  double t0 = now();
  for (;;) {
    cudaError_t e = cudaStreamQuery(s);
    if (e != cudaErrorNotReady) {
      cudaGetLastError();
      return 1;
    }
    if (now() - t0 > secs) return 0;
    usleep(2000);
  }
}

/* Zero COUNT floats at `buf` on `s` and wait for it there. Not cudaDeviceSynchronize: under
 * -t it would also wait for the other rank threads' kernels, which may wait for this rank. */
static int zero_on(float *buf, cudaStream_t s) {
  return cudaMemsetAsync(buf, 0, COUNT * sizeof(float), s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess;
}

static ncclResult_t async_error(ncclComm_t comm) {
  ncclResult_t e = ncclSuccess;
  ncclCommGetAsyncError(comm, &e);
  return e;
}

static const char *text_of(const char *m) { return m && *m ? m : "(no message)"; }

/* Collective #4 as the case wants it from rank r (the culprit is the last rank). */
static void call_fourth(const char *c, int r, int n, ncclComm_t comm, float *buf, float *big, cudaStream_t s) {
  int culprit = r == n - 1;
  ncclResult_t res = ncclSuccess;
  if ((!strncmp(c, "skip", 4) || !strcmp(c, "kill")) && culprit) return;
  if (!strcmp(c, "collective") && culprit)
    res = ncclAllGather(buf, big, 1024, ncclFloat, comm, s);
  else if (!strcmp(c, "count") && culprit)
    res = ncclAllReduce(buf, buf, COUNT / 2, ncclFloat, ncclSum, comm, s);
  else
    res = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, s);
  /* A culprit whose different call needs new connections waits for them on the host, in the
   * call, until the others give up: an error return is its end then. */
  if (culprit && (!strcmp(c, "collective") || !strcmp(c, "count")))
    printf("  [%s] collective #4 returned %s\n", tag, ncclGetErrorString(res));
  else
    CHECK(res == ncclSuccess, "collective #4 on rank %d: %s", r, ncclGetErrorString(res));
}

/* What a rank that waits in #4 must find in its error (or log line), naming culprit c. */
static void check_named(const char *c, const char *msg, int culprit, int pid) {
  char want[256];
  if (!strncmp(c, "skip", 4)) {
    CHECK(strstr(msg, "ncclAllReduce #4 (4096 × float) has made no progress"), "no stuck operation in: %s", msg);
    snprintf(want, sizeof want, "not called by 1 rank: rank %d (host ", culprit);
    CHECK(strstr(msg, want), "'%s' not in: %s", want, msg);
    CHECK(strstr(msg, "last enqueued ncclAllReduce #3 (4096 × float), last completed ncclAllReduce #3"),
          "no last enqueued/completed in: %s", msg);
  } else if (!strcmp(c, "collective")) {
    snprintf(want, sizeof want, "rank %d called ncclAllGather #4 (1024 × float) where ", culprit);
    CHECK(strstr(msg, want) && strstr(msg, "called ncclAllReduce #4 (4096 × float)"), "'%s' not in: %s", want, msg);
  } else if (!strcmp(c, "count")) {
    snprintf(want, sizeof want, "rank %d called ncclAllReduce #4 (2048 × float) where ", culprit);
    CHECK(strstr(msg, want) && strstr(msg, "called ncclAllReduce #4 (4096 × float)"), "'%s' not in: %s", want, msg);
  } else {
    snprintf(want, sizeof want, "rank %d (host ", culprit);
    CHECK(strstr(msg, want) && strstr(msg, "is gone"), "'%s ... is gone' not in: %s", want, msg);
  }
  if (strcmp(c, "collective") && strcmp(c, "count")) {
    snprintf(want, sizeof want, "pid %d,", pid);
    CHECK(strstr(msg, want), "culprit's '%s' not in: %s", want, msg);
  }
}

/* Wait until every rank but `skip` finished observing (bounded). */
static void wait_all_done(struct shared *sh, int n, int skip, double secs) {
  double t0 = now();
  for (;;) {
    int all = 1;
    for (int q = 0; q < n; q++) all &= q == skip || sh->done[q];
    if (all || now() - t0 > secs) return;
    usleep(10000);
  }
}

/* ---- The collective check (OXCCL_CHECK_COLLECTIVES=1). ---- */

/* Wait out ncclInProgress (a non-blocking communicator), bounded: the final state. */
static ncclResult_t settle(ncclComm_t comm, ncclResult_t res, double secs) {
  for (double t0 = now(); res == ncclInProgress && now() - t0 < secs; usleep(2000)) res = async_error(comm);
  return res;
}

/* Fill `count` floats at `dev` with `v`. */
static int fill(float *dev, size_t count, float v) {
  float *host = malloc(count * sizeof(float));
  if (!host) return 0;
  for (size_t i = 0; i < count; i++) host[i] = v;
  int ok = cudaMemcpy(dev, host, count * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess;
  free(host);
  return ok;
}

/* Whether `count` floats at `dev` are `want(i)`; the first wrong one is printed. */
static int holds(const char *what, const float *dev, size_t count, float (*want)(size_t, int, int), int r, int n) {
  float *host = malloc(count * sizeof(float));
  if (!host || cudaMemcpy(host, dev, count * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
    free(host);
    CHECK(0, "%s: cannot read the result back", what);
    return 0;
  }
  for (size_t i = 0; i < count; i++) {
    if (host[i] != want(i, r, n)) {
      CHECK(0, "%s: element %zu is %g, want %g", what, i, host[i], want(i, r, n));
      free(host);
      return 0;
    }
  }
  free(host);
  n_checks++;
  return 1;
}

static float sum_of_ranks(size_t i, int r, int n) { (void)i, (void)r; return (float)(n * (n + 1) / 2); }
static float root_value(size_t i, int r, int n) { (void)i, (void)r, (void)n; return 1.0f; }
static float gathered(size_t i, int r, int n) { (void)r, (void)n; return (float)(i / 1024 + 1); }
static float from_left(size_t i, int r, int n) { (void)i; return (float)((r + n - 1) % n + 1); }

/* What ranks 0..c-1 are called in a mismatch line: "rank 0" or "ranks 0,1,2". */
static void others_text(char *out, size_t cap, int c) {
  int len = snprintf(out, cap, "%s", c == 1 ? "rank 0" : "ranks 0");
  for (int q = 1; q < c && len < (int)cap; q++) len += snprintf(out + len, cap - len, ",%d", q);
}

static void wait_ready(struct shared *sh, int n) {
  for (double t0 = now(); now() - t0 < 30;) {
    int all = 1;
    for (int q = 0; q < n; q++) all &= sh->ready[q];
    if (all) return;
    usleep(10000);
  }
}

/* ncclCommInitRank for rank r of n: 0, or the rank process's exit status (EXIT_SKIP when
 * oxccl refuses the setup, as NVIDIA's refuses shared GPUs). */
static int init_rank(ncclComm_t *comm, int n, ncclUniqueId id, int r) {
  ncclResult_t res = ncclCommInitRank(comm, n, id, r);
  if (res == ncclSuccess) return 0;
  printf("  [%s] init refused: %s / %s\n", tag, ncclGetErrorString(res), text_of(ncclGetLastError(NULL)));
  return res == ncclInvalidUsage ? EXIT_SKIP : 1;
}

/* The GPU's clause of the report `line` (up to its end): CTAs waiting on a peer named by rank;
 * at 2 ranks that peer must be the culprit (at more, a ring's previous rank or, one-shot, any
 * peer may be named). */
static void check_gpu_clause(const char *line, int n, int culprit) {
  const char *gpu = strstr(line, "this rank's GPU: CTA"), *eol = strchr(line, '\n');
  if (gpu && eol && gpu > eol) gpu = NULL; /* another line's */
  CHECK(gpu && strstr(gpu, " from rank "), "no GPU wait naming a rank in: %.600s", line);
  if (gpu && n == 2) {
    char want[64];
    snprintf(want, sizeof want, "from rank %d (step ", culprit);
    CHECK(strstr(gpu, want), "'%s' not in the GPU's clause: %.400s", want, gpu);
  }
}

static int check_main(const char *c, int r, int n, ncclUniqueId id, const char *dir, struct shared *sh) {
  int culprit = n - 1, is_culprit = r == culprit;
  int nonblocking = !strcmp(c, "check-nonblocking"), group = !strcmp(c, "check-group");
  int good = !strcmp(c, "check-good");
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = nonblocking ? 0 : 1;
  ncclComm_t comm = NULL, second = NULL;
  ncclResult_t res = ncclCommInitRankConfig(&comm, n, id, r, &cfg);
  res = settle(comm, res, 60);
  if (res != ncclSuccess) {
    printf("  [%s] init refused: %s / %s\n", tag, ncclGetErrorString(res), text_of(ncclGetLastError(NULL)));
    return res == ncclInvalidUsage ? EXIT_SKIP : 1;
  }
  if (group) {
    res = ncclCommSplit(comm, 0, r, &second, NULL);
    CHECK(res == ncclSuccess && second, "ncclCommSplit: %s", ncclGetErrorString(res));
    if (!second) return 1;
  }
  cudaStream_t s;
  float *buf = NULL, *out = NULL, *big = NULL, *out2 = NULL;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc((void **)&buf, COUNT * sizeof(float)) != cudaSuccess ||
      cudaMalloc((void **)&out, COUNT * sizeof(float)) != cudaSuccess ||
      cudaMalloc((void **)&out2, COUNT * sizeof(float)) != cudaSuccess ||
      cudaMalloc((void **)&big, 1024 * MAXR * sizeof(float)) != cudaSuccess || !fill(buf, COUNT, (float)(r + 1)))
    return 1;
  for (int i = 0; i < 3; i++) {
    res = settle(comm, ncclAllReduce(buf, out, COUNT, ncclFloat, ncclSum, comm, s), 30);
    CHECK(res == ncclSuccess, "good all-reduce #%d: %s / %s", i + 1, ncclGetErrorString(res), text_of(ncclGetLastError(comm)));
  }
  CHECK(stream_idle_within(s, 30), "3 good all-reduces not done within 30 s");
  holds("all-reduce #3", out, COUNT, sum_of_ranks, r, n);
  sh->ready[r] = 1;
  wait_ready(sh, n);
  double t0 = now();
  if (good) {
    /* #4 broadcast from rank 0 (which holds 1), #5 all-gather of 1024 floats, #6
     * reduce-scatter, #7 a zero-count all-reduce, then a ring of sends and receives, then #8
     * and #9 in one group. */
    fill(out, COUNT, -1);
    res = ncclBroadcast(buf, out, COUNT, ncclFloat, 0, comm, s);
    CHECK(res == ncclSuccess, "broadcast: %s / %s", ncclGetErrorString(res), text_of(ncclGetLastError(comm)));
    res = ncclAllGather(buf, big, 1024, ncclFloat, comm, s);
    CHECK(res == ncclSuccess, "all-gather: %s", ncclGetErrorString(res));
    CHECK(stream_idle_within(s, 30), "broadcast and all-gather not done within 30 s");
    holds("broadcast", out, COUNT, root_value, r, n);
    holds("all-gather", big, 1024 * (size_t)n, gathered, r, n);
    fill(big, 1024 * (size_t)n, (float)(r + 1));
    res = ncclReduceScatter(big, out, 1024, ncclFloat, ncclSum, comm, s);
    CHECK(res == ncclSuccess, "reduce-scatter: %s", ncclGetErrorString(res));
    res = ncclAllReduce(buf, out2, 0, ncclFloat, ncclSum, comm, s);
    CHECK(res == ncclSuccess, "zero-count all-reduce: %s", ncclGetErrorString(res));
    CHECK(stream_idle_within(s, 30), "reduce-scatter not done within 30 s");
    holds("reduce-scatter", out, 1024, sum_of_ranks, r, n);
    ncclGroupStart();
    ncclSend(buf, COUNT, ncclFloat, (r + 1) % n, comm, s);
    ncclRecv(out2, COUNT, ncclFloat, (r + n - 1) % n, comm, s);
    res = ncclGroupEnd();
    CHECK(res == ncclSuccess, "send/receive ring: %s / %s", ncclGetErrorString(res), text_of(ncclGetLastError(NULL)));
    CHECK(stream_idle_within(s, 30), "send/receive ring not done within 30 s");
    holds("send/receive ring", out2, COUNT, from_left, r, n);
    ncclGroupStart();
    ncclAllReduce(buf, out, COUNT, ncclFloat, ncclSum, comm, s);
    ncclAllReduce(buf, out2, COUNT, ncclFloat, ncclSum, comm, s);
    res = ncclGroupEnd();
    CHECK(res == ncclSuccess, "two all-reduces in a group: %s", ncclGetErrorString(res));
    CHECK(stream_idle_within(s, 30), "two all-reduces not done within 30 s");
    holds("grouped all-reduce 1", out, COUNT, sum_of_ranks, r, n);
    holds("grouped all-reduce 2", out2, COUNT, sum_of_ranks, r, n);
    CHECK(async_error(comm) == ncclSuccess, "async error %s", ncclGetErrorString(async_error(comm)));
    printf("  [%s] 9 collectives and a send/receive ring checked and right in %.2f s\n", tag, now() - t0);
    sh->done[r] = 1;
    wait_all_done(sh, n, -1, 45);
    /* Under -t the one log of every rank: a line of any rank fails each. */
    char *log = whole_log(dir, r);
    CHECK(log && !strstr(log, "collective check") && !strstr(log, "has made no progress"),
          "a check or hang line in a healthy run: %s", log ? log : "(no log)");
    free(log);
    res = ncclCommDestroy(comm);
    CHECK(res == ncclSuccess, "ncclCommDestroy: %s", ncclGetErrorString(res));
    return n_fail > 76 ? 76 : n_fail;
  }
  /* #4 (or #1 of the split communicator), the culprit's differing. */
  char others[64], want[256], also[128];
  others_text(others, sizeof others, culprit);
  ncclComm_t failing = group ? second : comm;
  if (!strcmp(c, "check-collective")) {
    res = is_culprit ? ncclAllGather(buf, big, 1024, ncclFloat, comm, s)
                     : ncclAllReduce(buf, out, COUNT, ncclFloat, ncclSum, comm, s);
    snprintf(want, sizeof want, "rank %d called ncclAllGather #4 (1024 × float) where %s called ncclAllReduce #4 (4096 × float)",
             culprit, others);
  } else if (!strcmp(c, "check-root")) {
    res = ncclBroadcast(buf, out, COUNT, ncclFloat, is_culprit ? culprit : 0, comm, s);
    snprintf(want, sizeof want,
             "rank %d called ncclBroadcast #4 (4096 × float, root %d) where %s called ncclBroadcast #4 (4096 × float, root 0)",
             culprit, culprit, others);
  } else if (group) {
    fill(out2, COUNT, -1);
    ncclGroupStart();
    ncclAllReduce(buf, out2, COUNT, ncclFloat, ncclSum, comm, s);
    ncclAllReduce(buf, out, is_culprit ? COUNT / 2 : COUNT, ncclFloat, ncclSum, second, s);
    res = ncclGroupEnd();
    snprintf(want, sizeof want, "rank %d called ncclAllReduce #1 (2048 × float) where %s called ncclAllReduce #1 (4096 × float)",
             culprit, others);
  } else {
    res = ncclAllReduce(buf, out, is_culprit ? COUNT / 2 : COUNT, ncclFloat, ncclSum, comm, s);
    snprintf(want, sizeof want, "rank %d called ncclAllReduce #4 (2048 × float) where %s called ncclAllReduce #4 (4096 × float)",
             culprit, others);
  }
  if (nonblocking) res = settle(comm, res, 30);
  double took = now() - t0;
  char msg[2048], thread_msg[2048];
  snprintf(thread_msg, sizeof thread_msg, "%s", text_of(ncclGetLastError(NULL)));
  snprintf(msg, sizeof msg, "%s", text_of(ncclGetLastError(failing)));
  printf("  [%s] #4 returned %s after %.2f s: %s\n", tag, ncclGetErrorString(res), took, msg);
  CHECK(res == ncclInvalidUsage, "the call returned %s, want ncclInvalidUsage", ncclGetErrorString(res));
  CHECK(took < 15, "the check took %.1f s (limit 15)", took);
  CHECK(strstr(msg, want) != NULL, "'%s' not in ncclGetLastError(comm): %s", want, msg);
  CHECK(strstr(msg, "OXCCL_CHECK_COLLECTIVES=1") != NULL, "the setting is not named: %s", msg);
  snprintf(also, sizeof also, "rank %d (host ", r);
  CHECK(strstr(msg, also) != NULL, "'%s' (this rank) not in: %s", also, msg);
  CHECK(strstr(thread_msg, want) != NULL, "'%s' not in ncclGetLastError(NULL): %s", want, thread_msg);
  /* ncclGetLastError(NULL) is the calling thread's (src/error.rs): every rank's names the same
   * mismatch, so under -t only its head (this rank) tells it is not another thread's. */
  CHECK(head_rank(thread_msg) == r, "ncclGetLastError(NULL) speaks for rank %d, not this rank: %s",
        head_rank(thread_msg), thread_msg);
  CHECK(async_error(failing) == ncclInvalidUsage, "async error %s, want ncclInvalidUsage",
        ncclGetErrorString(async_error(failing)));
  CHECK(stream_idle_within(s, 5), "the stream is busy 5 s after the failed check (was something launched?)");
  if (group) {
    CHECK(async_error(comm) == ncclSuccess, "the first communicator's async error is %s",
          ncclGetErrorString(async_error(comm)));
    holds("the first communicator's all-reduce in the failed group", out2, COUNT, sum_of_ranks, r, n);
  }
  /* A later call on the failed communicator is refused at once. */
  res = ncclAllReduce(buf, out, COUNT, ncclFloat, ncclSum, failing, s);
  CHECK(res != ncclSuccess && res != ncclInProgress, "a call after the failed check returned %s", ncclGetErrorString(res));
  sh->done[r] = 1;
  wait_all_done(sh, n, -1, 45);
  double ta = now();
  res = ncclCommAbort(failing);
  CHECK(res == ncclSuccess, "ncclCommAbort: %s", ncclGetErrorString(res));
  if (group) {
    res = ncclCommDestroy(comm);
    CHECK(res == ncclSuccess, "ncclCommDestroy of the first communicator: %s", ncclGetErrorString(res));
  }
  printf("  [%s] teardown in %.2f s\n", tag, now() - ta);
  CHECK(stream_idle_within(s, 15), "stream still busy 15 s after the teardown");
  fflush(stdout);
  return n_fail > 76 ? 76 : n_fail;
}

/* graph-skip: every rank captures one all-reduce of COUNT floats in a CUDA graph and replays
 * it 3 times (checked idle); then every rank but the culprit replays it a 4th time. The host's
 * counters see no pending operation (graph work is numbered once, at capture), so only the
 * GPU's wait entries tell: each waiting rank's log must get exactly one "the GPU has waited"
 * line saying what its CTAs wait for, from which rank (at 2 ranks: the culprit), and no error;
 * the culprit's log none; ncclCommAbort then releases the waiting ranks' kernels. */
static int graph_main(int r, int n, ncclUniqueId id, const char *dir, struct shared *sh) {
  ncclComm_t comm = NULL;
  int refused = init_rank(&comm, n, id, r);
  if (refused) return refused;
  cudaStream_t s;
  float *buf = NULL;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc((void **)&buf, COUNT * sizeof(float)) != cudaSuccess || !zero_on(buf, s))
    return 1;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "begin capture");
  CHECK(ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, s) == ncclSuccess, "captured all-reduce");
  CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess, "end capture");
  CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "instantiate");
  if (n_fail) return 1; /* no graph to replay */
  for (int i = 0; i < 3; i++) CHECK(cudaGraphLaunch(exec, s) == cudaSuccess, "replay %d", i);
  CHECK(stream_idle_within(s, 30), "3 good replays not done within 30 s");
  sh->ready[r] = 1;
  wait_ready(sh, n);
  int culprit = n - 1, waits = r != culprit;
  if (waits) CHECK(cudaGraphLaunch(exec, s) == cudaSuccess, "4th replay");
  const char *what = "the GPU has waited";
  int reported = 0;
  for (double t0 = now(); waits && !reported && now() - t0 < 30; usleep(50000)) {
    char *log = rank_log(dir, r);
    reported = log && strstr(log, what);
    free(log);
  }
  char *log = rank_log(dir, r);
  if (waits) {
    CHECK(reported && log && count_of(log, what) == 1, "%d '%s' lines within 30 s, want 1",
          log ? count_of(log, what) : 0, what);
    const char *line = log ? strstr(log, what) : NULL;
    if (line) check_gpu_clause(line, n, culprit);
    CHECK(async_error(comm) == ncclSuccess, "a report, not an error: %s", ncclGetErrorString(async_error(comm)));
  } else {
    CHECK(!log || !strstr(log, what), "the culprit's GPU waits for nothing, yet: %.300s", log ? strstr(log, what) : "");
  }
  free(log);
  sh->done[r] = 1;
  wait_all_done(sh, n, -1, 45);
  double ta = now();
  ncclResult_t res = ncclCommAbort(comm);
  printf("  [%s] ncclCommAbort: %s in %.2f s\n", tag, ncclGetErrorString(res), now() - ta);
  CHECK(res == ncclSuccess, "abort: %s", ncclGetErrorString(res));
  CHECK(stream_idle_within(s, 15), "the 4th replay still running 15 s after ncclCommAbort");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  fflush(stdout);
  return n_fail > 76 ? 76 : n_fail;
}

/* The classic cases (skip-report, skip, collective, count, kill) as rank r: a rank process or
 * a rank thread. */
static int classic_main(const char *c, int r, int n, ncclUniqueId id, const char *dir, struct shared *sh) {
  ncclComm_t comm = NULL;
  int refused = init_rank(&comm, n, id, r);
  if (refused) return refused;
  cudaStream_t s;
  float *buf = NULL, *big = NULL;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc((void **)&buf, COUNT * sizeof(float)) != cudaSuccess ||
      cudaMalloc((void **)&big, 1024 * MAXR * sizeof(float)) != cudaSuccess || !zero_on(buf, s))
    return 1;
  for (int i = 0; i < 3; i++) ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, s);
  CHECK(stream_idle_within(s, 30), "3 good all-reduces not done within 30 s");
  sh->ready[r] = 1;
  wait_ready(sh, n);
  int culprit = n - 1, is_culprit = r == culprit;
  int kill_case = !strcmp(c, "kill"), report_only = !strcmp(c, "skip-report");
  call_fourth(c, r, n, comm, buf, big, s);
  if (kill_case && is_culprit) {
    usleep(1000000);
    kill(getpid(), SIGKILL);
  }
  /* Observe: an error, a report line in the log, or the stream idle (bounded). */
  double t0 = now(), seen = -1;
  ncclResult_t err = ncclSuccess;
  int idle = 0, reported = 0;
  while (now() - t0 < (kill_case ? 12 : 30)) {
    err = async_error(comm);
    if (err != ncclSuccess) break;
    if (cudaStreamQuery(s) == cudaSuccess) {
      idle = 1;
      break;
    }
    cudaGetLastError();
    if (report_only) {
      char *log = rank_log(dir, r);
      reported = log && strstr(log, "has made no progress");
      free(log);
      if (reported) break;
    }
    usleep(20000);
  }
  seen = now() - t0;
  char msg[2048];
  snprintf(msg, sizeof msg, "%s", text_of(ncclGetLastError(comm)));
  int waits = !is_culprit;
  printf("  [%s] after %.1f s: %s%s%s\n", tag, seen, ncclGetErrorString(err), err != ncclSuccess ? ": " : "",
         err != ncclSuccess ? msg : (idle ? "(stream idle)" : reported ? "(report logged)" : "(still waiting)"));
  if (report_only && waits) {
    CHECK(reported && err == ncclSuccess, "no report line within 30 s, or an error (%s)", ncclGetErrorString(err));
    char *log = rank_log(dir, r);
    if (log) {
      CHECK(count_of(log, "has made no progress") == 1, "%d report lines, want 1", count_of(log, "has made no progress"));
      const char *line = strstr(log, "has made no progress");
      const char *start = line;
      while (start && start > log && start[-1] != '\n') start--;
      check_named(c, start ? start : "", culprit, sh->pid[culprit]);
      if (line) check_gpu_clause(line, n, culprit);
      free(log);
    }
  } else if (waits) {
    CHECK(err == ncclRemoteError, "async error %s, want ncclRemoteError", ncclGetErrorString(err));
    if (kill_case) CHECK(seen < 10, "the dead rank's error took %.1f s (limit 10)", seen);
    check_named(c, msg, culprit, sh->pid[culprit]);
    /* The communicator's own error speaks for this rank (under -t the others' name theirs);
     * a lost peer's names the peer. */
    if (!kill_case)
      CHECK(head_rank(msg) == r, "ncclGetLastError(comm) speaks for rank %d: %s", head_rank(msg), msg);
    const char *thread_msg = text_of(ncclGetLastError(NULL));
    CHECK(strstr(thread_msg, msg) != NULL, "ncclGetLastError(NULL) after the async error: %s", thread_msg);
    if (err != ncclSuccess)
      CHECK(stream_idle_within(s, 15), "kernels not released within 15 s of the error (before any abort)");
  }
  if (is_culprit) {
    /* The culprit answers the others and says, once, why they wait on it. */
    wait_all_done(sh, n, r, 45);
    char *log = rank_log(dir, r);
    char want[128];
    if (!strncmp(c, "skip", 4))
      snprintf(want, sizeof want, "in ncclAllReduce #4 (4096 × float), which rank %d has not called", r);
    else if (!strcmp(c, "collective"))
      snprintf(want, sizeof want, "rank %d called ncclAllGather #4 (1024 × float) where ", r);
    else
      snprintf(want, sizeof want, "rank %d called ncclAllReduce #4 (2048 × float) where ", r);
    CHECK(log && count_of(log, want) == 1, "culprit's log: %d lines with '%s'", log ? count_of(log, want) : 0, want);
    free(log);
    /* The others' errors are theirs: ncclGetLastError(NULL) is per thread (src/error.rs), so
     * under -t too the culprit's, which failed nothing, holds none of them. */
    const char *thread_msg = text_of(ncclGetLastError(NULL));
    if (!strncmp(c, "skip", 4))
      CHECK(!strstr(thread_msg, "has made no progress"), "the culprit's ncclGetLastError(NULL): %s", thread_msg);
  }
  sh->done[r] = 1;
  /* A killed culprit never finishes; one whose different collective needs new connections
   * waits for them on the host until the others tear down. */
  wait_all_done(sh, n, kill_case || !strcmp(c, "collective") ? culprit : -1, 45);
  double ta = now();
  int aborting = err != ncclSuccess || report_only;
  ncclResult_t res = aborting ? ncclCommAbort(comm) : ncclCommDestroy(comm);
  printf("  [%s] %s: %s in %.2f s\n", tag, aborting ? "ncclCommAbort" : "ncclCommDestroy", ncclGetErrorString(res),
         now() - ta);
  CHECK(res == ncclSuccess, "teardown: %s", ncclGetErrorString(res));
  CHECK(stream_idle_within(s, 15), "stream still busy 15 s after the teardown");
  fflush(stdout);
  return n_fail > 76 ? 76 : n_fail;
}

/* Rank r of case c, in its process or its thread (device 0 current): 0 passed, EXIT_SKIP
 * refused, else failed. */
static int run_rank(const char *c, int r, int n, ncclUniqueId id, const char *dir, struct shared *sh) {
  if (!strncmp(c, "check-", 6)) return check_main(c, r, n, id, dir, sh);
  if (!strcmp(c, "graph-skip")) return graph_main(r, n, id, dir, sh);
  return classic_main(c, r, n, id, dir, sh);
}

/* Make device 0 this thread's (a rank process's or a rank thread's), or say why not. */
static int set_device0(void) {
  cudaError_t e = cudaSetDevice(0);
  if (e == cudaSuccess) return 1;
  printf("  [%s] cudaSetDevice(0): %s\n", tag, cudaGetErrorString(e));
  return 0;
}

/* --rank: rank r as a process of its own. */
static int rank_main(const char *c, int r, int n, const char *hex, const char *dir) {
  snprintf(tag, sizeof tag, "%s rank %d", c, r);
  signal(SIGALRM, on_alarm);
  alarm(80);
  struct shared *sh = map_shared(dir, 0);
  if (!sh) {
    printf("  [%s] FAIL cannot map %s/shared\n", tag, dir);
    return 1;
  }
  sh->pid[r] = getpid();
  ncclUniqueId id;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
    unsigned v = 0;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return 1;
    id.internal[i] = (char)v;
  }
  if (!set_device0()) return 1;
  return run_rank(c, r, n, id, dir, sh);
}

/* ---- Ranks as threads (-t). ---- */

/* A rank thread: what it runs and, once joined, its status (as a rank process's). */
struct rank_thread {
  pthread_t thread;
  const char *c, *dir;
  int r, n, status;
  ncclUniqueId id;
  struct shared *sh;
};

static void *rank_thread_main(void *arg) {
  struct rank_thread *t = arg;
  snprintf(tag, sizeof tag, "%s rank %d thread", t->c, t->r);
  t->sh->pid[t->r] = getpid();
  t->status = set_device0() ? run_rank(t->c, t->r, t->n, t->id, t->dir, t->sh) : 1;
  fflush(stdout);
  return NULL;
}

/* --threads: case c with its n ranks as threads of this process, each with its own
 * communicator on device 0 from one ncclUniqueId made here; the environment (the driver's,
 * case_env) is in place before the first NCCL call. The status is a rank process's: 0,
 * EXIT_SKIP when the setup is refused, else failed. A thread still running JOIN_LIMIT s after
 * the start is named, and the process ends at once (_exit: a thread stuck in the library is
 * not taken back, and the exit handlers could wait for it). */
static int threads_main(const char *c, int n, const char *dir) {
  static struct rank_thread threads[MAXR];
  snprintf(tag, sizeof tag, "%s threads", c);
  signal(SIGALRM, on_alarm);
  alarm(80);
  struct timespec deadline; /* pthread_timedjoin_np's clock */
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += JOIN_LIMIT;
  if (n < 2 || n > MAXR || !strcmp(c, "kill")) { /* the driver asks for neither */
    printf("  [%s] FAIL no such thread case (%d ranks)\n", tag, n);
    return 1;
  }
  struct shared *sh = map_shared(dir, 0);
  if (!sh) {
    printf("  [%s] FAIL cannot map %s/shared\n", tag, dir);
    return 1;
  }
  ncclUniqueId id;
  ncclResult_t res = ncclGetUniqueId(&id);
  if (res != ncclSuccess) {
    printf("  [%s] FAIL ncclGetUniqueId: %s / %s\n", tag, ncclGetErrorString(res), text_of(ncclGetLastError(NULL)));
    return 1;
  }
  int started = 0;
  for (int r = 0; r < n; r++) {
    threads[r] = (struct rank_thread){.c = c, .dir = dir, .r = r, .n = n, .status = 1, .id = id, .sh = sh};
    if (pthread_create(&threads[r].thread, NULL, rank_thread_main, &threads[r]) != 0) {
      printf("  [%s] FAIL cannot start rank thread %d\n", tag, r);
      break;
    }
    started++;
  }
  int hung = 0, bad = started < n, skips = 0;
  for (int r = 0; r < started; r++) {
    if (pthread_timedjoin_np(threads[r].thread, NULL, &deadline) != 0) {
      printf("  FAIL rank thread %d still running after %d s (a hang)\n", r, JOIN_LIMIT);
      hung++;
    } else if (threads[r].status == EXIT_SKIP) {
      skips++;
    } else if (threads[r].status != 0) {
      printf("  rank thread %d: status %d\n", r, threads[r].status);
      bad++;
    }
  }
  fflush(stdout);
  if (hung) _exit(3);
  return bad ? 1 : skips ? EXIT_SKIP : 0;
}

/* ---- The driver. ---- */

/* Print the logs' lines that matter (the watchdog's WARN lines), each under the rank that
 * wrote it: its file's, or under -t the rank its head names (head_rank; "no rank" if none). */
static void print_logs(const char *dir, int n) {
  for (int r = 0; r < (threads_mode ? 1 : n); r++) {
    char *log = whole_log(dir, r);
    if (!log) continue;
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
      if (!strstr(line, " WARN ")) continue;
      int who = threads_mode ? head_rank(line) : r;
      if (who >= 0) printf("    rank %d log: %.1200s\n", who, line);
      else printf("    log (no rank): %.1200s\n", line);
    }
    free(log);
  }
}

/* -H: each rank process claims a host of its own. */
static int hostid_per_rank;

/* The environment of a case's process, set before it makes any NCCL call: rank r's, or under
 * -t (r = -1) that of the one process of every rank thread. */
static void case_env(const char *c, const char *dir, int r) {
  char logpath[4200];
  log_path(logpath, sizeof logpath, dir, r);
  setenv("NCCL_DEBUG_FILE", logpath, 1);
  setenv("NCCL_DEBUG", "WARN", 1);
  setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
  setenv("OXCCL_HANG_REPORT_S", "3", 1);
  if (strcmp(c, "skip-report")) setenv("OXCCL_HANG_ERROR", "1", 1);
  else unsetenv("OXCCL_HANG_ERROR");
  if (!strncmp(c, "check-", 6)) setenv("OXCCL_CHECK_COLLECTIVES", "1", 1);
  else unsetenv("OXCCL_CHECK_COLLECTIVES");
  if (hostid_per_rank && r >= 0) {
    char host[64];
    snprintf(host, sizeof host, "oxccl-faults-host-%d", r);
    setenv("NCCL_HOSTID", host, 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  }
}

/* One case: its rank processes, or under -t its one process of rank threads, bounded; 0 ok,
 * 1 failed, 2 skipped. */
static int run_case(const char *c, int n, double limit) {
  char dir[] = "/tmp/oxccl-faults.XXXXXX";
  if (!mkdtemp(dir)) return 1;
  struct shared *sh = map_shared(dir, 1);
  if (!sh) return 1;
  char hex[2 * NCCL_UNIQUE_ID_BYTES + 1] = "", nstr[8], rstr[MAXR][8];
  if (!threads_mode) { /* under -t the process makes its own */
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id.internal[i]);
  }
  snprintf(nstr, sizeof nstr, "%d", n);
  int procs = threads_mode ? 1 : n;
  pid_t pids[MAXR];
  int status[MAXR] = {0}, done[MAXR] = {0};
  fflush(stdout);
  double t0 = now();
  for (int r = 0; r < procs; r++) {
    snprintf(rstr[r], sizeof rstr[r], "%d", r);
    pid_t parent = getpid();
    pids[r] = fork();
    if (pids[r] == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      case_env(c, dir, threads_mode ? -1 : r);
      char *rank_argv[] = {self_exe, "--rank", (char *)c, rstr[r], nstr, hex, dir, NULL};
      char *threads_argv[] = {self_exe, "--threads", (char *)c, nstr, dir, NULL};
      execv(self_exe, threads_mode ? threads_argv : rank_argv);
      _exit(127);
    }
  }
  for (int left = procs; left > 0 && now() - t0 < limit;) {
    left = 0;
    for (int r = 0; r < procs; r++) {
      if (done[r] || pids[r] <= 0) continue;
      if (waitpid(pids[r], &status[r], WNOHANG) == pids[r]) done[r] = 1;
      else left++;
    }
    usleep(20000);
  }
  int bad = 0, skips = 0;
  for (int r = 0; r < procs; r++) {
    char who[64];
    if (threads_mode) snprintf(who, sizeof who, "the rank threads' process");
    else snprintf(who, sizeof who, "rank process %d", r);
    if (pids[r] <= 0) {
      bad++;
      continue;
    }
    if (!done[r]) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status[r], 0);
      printf("  FAIL %s still running after %.0f s: killed (a hang)\n", who, limit);
      bad++;
      continue;
    }
    int st = status[r];
    int expect_kill = !threads_mode && !strcmp(c, "kill") && r == n - 1;
    if (expect_kill) {
      if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
        printf("  FAIL the culprit was meant to die by SIGKILL\n");
        bad++;
      }
    } else if (WIFEXITED(st) && WEXITSTATUS(st) == EXIT_SKIP) {
      skips++;
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      printf("  %s: %s %d\n", who, WIFEXITED(st) ? "exit status" : "signal",
             WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      bad++;
    }
  }
  print_logs(dir, n);
  printf("%s %s (%d ranks on GPU 0%s) in %.1f s\n", bad ? "FAIL" : skips ? "SKIP" : "PASS", c, n,
         threads_mode ? ", threads of one process" : hostid_per_rank ? ", each its own host" : "", now() - t0);
  fflush(stdout);
  munmap(sh, sizeof *sh);
  return bad ? 1 : skips ? 2 : 0;
}

static int selected(const char *c, const char *list) {
  if (!list) return 1;
  char buf[512];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ","))
    if (!strncmp(c, tok, strlen(tok))) return 1;
  return 0;
}

/* Why -t skips `kill`. */
static const char KILL_UNDER_THREADS[] =
    "no thread equivalent: a signal cannot kill one rank thread alone (SIGKILL ends the "
    "process, every rank with it); run it without -t";

static void usage(void) {
  fprintf(stderr, "usage: faults [-n NRANKS] [-t] [-H] [-c LIST] [-T SECONDS] [-l]\n");
}

int main(int argc, char **argv) {
  ssize_t len = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
  if (len <= 0) return 2;
  self_exe[len] = 0;
  if (argc == 7 && !strcmp(argv[1], "--rank")) return rank_main(argv[2], atoi(argv[3]), atoi(argv[4]), argv[5], argv[6]);
  if (argc == 5 && !strcmp(argv[1], "--threads")) {
    threads_mode = 1;
    return threads_main(argv[2], atoi(argv[3]), argv[4]);
  }
  int n = 2, budget = 600, opt, list_only = 0;
  const char *list = NULL;
  while ((opt = getopt(argc, argv, "n:tHc:T:l")) != -1) {
    switch (opt) {
    case 'n': n = atoi(optarg); break;
    case 't': threads_mode = 1; break;
    case 'H': hostid_per_rank = 1; break;
    case 'c': list = optarg; break;
    case 'T': budget = atoi(optarg); break;
    case 'l': list_only = 1; break;
    default: usage(); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "faults: unexpected argument '%s'\n", argv[optind]);
    usage();
    return 2;
  }
  if (threads_mode && hostid_per_rank) {
    fprintf(stderr, "faults: -H needs a process per rank (NCCL_HOSTID is per process), not -t\n");
    return 2;
  }
  if (list_only) {
    for (int i = 0; i < NCASES; i++)
      if (threads_mode && !strcmp(CASES[i], "kill")) printf("%s\tskipped under -t: %s\n", CASES[i], KILL_UNDER_THREADS);
      else printf("%s\n", CASES[i]);
    return 0;
  }
  if (n < 2 || n > MAXR) {
    fprintf(stderr, "faults: -n must be 2..%d\n", MAXR);
    return 2;
  }
  double t0 = now();
  int passed = 0, failed = 0, skipped = 0, not_run = 0;
  for (int i = 0; i < NCASES; i++) {
    if (!selected(CASES[i], list)) continue;
    if (threads_mode && !strcmp(CASES[i], "kill")) {
      printf("SKIP kill (%d ranks as threads): %s\n", n, KILL_UNDER_THREADS);
      skipped++;
      continue;
    }
    double left = budget - (now() - t0);
    if (left < 25) {
      printf("NOT RUN %s (time budget)\n", CASES[i]);
      not_run++;
      continue;
    }
    int r = run_case(CASES[i], n, left - 5 < CASE_LIMIT ? left - 5 : CASE_LIMIT);
    if (r == 0) passed++;
    else if (r == 1) failed++;
    else skipped++;
  }
  printf("%d passed, %d failed, %d skipped, %d not run\n", passed, failed, skipped, not_run);
  return failed || not_run ? 1 : 0;
}
