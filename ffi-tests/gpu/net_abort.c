/* ncclCommAbort of a rank that waits on the network, on GPU 0, for any
 * libnccl.so.2 (ours or NVIDIA's, chosen by LD_LIBRARY_PATH). Two ranks; rank 0 enters an
 * all-reduce that rank 1 never joins, and is aborted; the abort must return
 * within 10 s, rank 0's stream must be idle within 10 s of it (its kernel released), rank 0's
 * call must have returned, and rank 1 must tear down within 15 s afterwards. Every case runs
 * in its own processes (this binary re-executed with --rank), each with an 60 s alarm; the
 * parent kills what is still running after 75 s, so nothing can hang.
 *
 * How the ranks reach the network (the MODE of a case name, MODE-WAY):
 *   threads  one process, ncclCommInitAll(2, {0, 0}), with NCCL_P2P_DISABLE=1
 *            NCCL_SHM_DISABLE=1 NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_SOCKET_IFNAME=lo
 *   procs    one process per rank on GPU 0, the same variables
 *   hostid   one process per rank on GPU 0, each claiming its own host
 *            (NCCL_HOSTID=net-abort-host-R, NCCL_SOCKET_IFNAME=lo): what NVIDIA's library
 *            runs too (it refuses the two others: "Duplicate GPU", reported as SKIP)
 * What rank 0 waits in, and how the abort comes (the WAY):
 *   kernel   3 all-reduces of 4096 floats (small: LL) of both ranks first (connections up),
 *            then rank 0's 4th: its kernel waits for rank 1's data over the network. The main
 *            thread checks that the stream stays busy and ncclCommGetAsyncError stays
 *            ncclSuccess, while another thread calls ncclCommAbort at 2 s
 *   poll     the same with 4 Mi floats (16 MiB: Simple), but the main thread itself polls
 *            ncclCommGetAsyncError for 3 s (it must stay ncclSuccess, the stream busy), then
 *            calls ncclCommAbort
 *   connect  no warm-up: rank 0's first all-reduce (in a worker thread) waits on the host to
 *            connect to rank 1 over the network; the main thread calls ncclCommAbort at 2 s;
 *            the worker's ncclAllReduce must return within 10 s of it (any result)
 * Rank 1 (the peer) inits, joins the warm-up, then waits (bounded) until rank 0 is done and
 * calls ncclCommDestroy.
 *
 * Prints one line per case with its time, then 'N passed, M failed, K skipped, J not run';
 * exits 0 iff nothing failed and nothing was left out for lack of time.
 *
 * usage: net_abort [-c LIST] [-T SECONDS] [-l] | --rank CASE R DIR
 *   -c LIST     only these cases (comma list of names or prefixes, e.g. -c hostid)
 *   -T SECONDS  time budget (default 600): a case gets at most what is left less 5 s (and
 *               75 s); with under 30 s left it is not started
 *   -l          list the cases */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <fcntl.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SMALL 4096
#define LARGE (4u << 20)
#define CASE_LIMIT 75.0
#define RANK_ALARM 60
#define WAIT_S 2.0
#define POLL_S 3.0
#define ABORT_LIMIT 10.0
#define RELEASE_LIMIT 10.0
#define PEER_LIMIT 15.0
#define EXIT_SKIP 77

static const char *CASES[] = {"threads-kernel", "threads-poll", "threads-connect", "procs-kernel", "procs-poll",
                              "procs-connect",  "hostid-kernel", "hostid-poll",    "hostid-connect"};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

static char self_exe[4096];
static int n_fail;
static char tag[96] = "main";

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define CHECK(cond, ...)                               \
  do {                                                 \
    if (!(cond)) {                                     \
      n_fail++;                                        \
      printf("  [%s] FAIL (line %d) ", tag, __LINE__); \
      printf(__VA_ARGS__);                             \
      printf("\n");                                    \
      fflush(stdout);                                  \
    }                                                  \
  } while (0)

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "  FAIL rank process: 60 s alarm (a wait never ended)\n";
  if (write(1, msg, sizeof msg - 1) < 0) _exit(3);
  _exit(3);
}

static const char *text_of(const char *m) { return m && *m ? m : "(no message)"; }

/* What the rank processes of one case share: a file mapped by each. */
struct shared {
  ncclUniqueId id;
  volatile int id_ready;
  volatile int warm[2];
  volatile int done0;
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

/* Wait (bounded) until *flag is set; 1 when it was. */
static int wait_flag(volatile int *flag, double secs) {
  for (double t0 = now(); now() - t0 < secs; usleep(5000))
    if (*flag) return 1;
  return *flag != 0;
}

/* Whether `s` is idle within `secs` of `t0` (polling, never blocking); the time it took. */
static double idle_after(cudaStream_t s, double t0, double secs) {
  while (now() - t0 < secs) {
    cudaError_t e = cudaStreamQuery(s);
    if (e != cudaErrorNotReady) {
      cudaGetLastError();
      return now() - t0;
    }
    usleep(1000);
  }
  return -1;
}

static ncclResult_t async_error(ncclComm_t comm) {
  ncclResult_t e = ncclSuccess;
  if (ncclCommGetAsyncError(comm, &e) != ncclSuccess) return ncclInternalError;
  return e;
}

static int way_is(const char *c, const char *way) {
  const char *dash = strchr(c, '-');
  return dash && !strcmp(dash + 1, way);
}

/* Floats of every all-reduce of case `c`. */
static size_t count_of(const char *c) { return way_is(c, "poll") ? LARGE : SMALL; }

/* A thread that calls an NCCL function and notes when it returned. */
struct call {
  ncclComm_t comm;
  float *buf;
  size_t count;
  cudaStream_t s;
  double delay; /* abort: seconds to wait first */
  volatile ncclResult_t res;
  volatile double started, returned;
  pthread_t th;
};

static void *allreduce_main(void *p) {
  struct call *a = p;
  cudaSetDevice(0);
  a->started = now();
  a->res = ncclAllReduce(a->buf, a->buf, a->count, ncclFloat, ncclSum, a->comm, a->s);
  a->returned = now();
  return NULL;
}

static void *abort_main(void *p) {
  struct call *a = p;
  usleep((useconds_t)(a->delay * 1e6));
  a->started = now();
  a->res = ncclCommAbort(a->comm);
  a->returned = now();
  return NULL;
}

/* Join `a` if it returns within `secs` of its start (else leave it: the case fails and ends). */
static int joined(struct call *a, double secs) {
  double t0 = now();
  while (a->returned == 0 && now() - t0 < secs) usleep(2000);
  if (a->returned == 0) return 0;
  pthread_join(a->th, NULL);
  return 1;
}

/* Rank 0's part once its comm is up (and, for kernel/poll, warmed up): the lone all-reduce
 * and the abort. */
static void wait_and_abort(const char *c, ncclComm_t comm, float *buf, cudaStream_t s) {
  struct call ar = {.comm = comm, .buf = buf, .count = count_of(c), .s = s};
  struct call ab = {.comm = comm, .delay = WAIT_S};
  double t0 = now();
  int connect = way_is(c, "connect"), poll = way_is(c, "poll");
  if (connect) {
    if (pthread_create(&ar.th, NULL, allreduce_main, &ar) != 0) {
      CHECK(0, "pthread_create");
      return;
    }
  } else {
    ncclResult_t r = ncclAllReduce(buf, buf, ar.count, ncclFloat, ncclSum, comm, s);
    CHECK(r == ncclSuccess, "rank 0's lone all-reduce #4: %s", ncclGetErrorString(r));
    ar.returned = now();
  }
  if (!poll && pthread_create(&ab.th, NULL, abort_main, &ab) != 0) {
    CHECK(0, "pthread_create");
    return;
  }
  /* Until the abort: the stream stays busy (the all-reduce cannot finish alone), and no
   * error appears (rank 1 is alive, only late). */
  double until = poll ? POLL_S : WAIT_S - 0.2;
  ncclResult_t e = ncclSuccess;
  int busy = 1, stream_busy = 1;
  while (now() - t0 < until) {
    e = async_error(comm);
    stream_busy = cudaStreamQuery(s) == cudaErrorNotReady;
    cudaGetLastError();
    /* Not finished: its kernel still runs, or (connect) the call has not returned. */
    busy = stream_busy || (connect && ar.returned == 0);
    if ((e != ncclSuccess && e != ncclInProgress) || !busy) break;
    usleep(20000);
  }
  printf("  [%s] after %.1f s alone: async error %s, stream %s%s\n", tag, now() - t0, ncclGetErrorString(e),
         stream_busy ? "busy" : "idle",
         connect ? (ar.returned ? ", its ncclAllReduce returned" : ", still in its ncclAllReduce") : "");
  CHECK(e == ncclSuccess || e == ncclInProgress, "async error %s before the abort: %s", ncclGetErrorString(e),
        text_of(ncclGetLastError(comm)));
  CHECK(busy, "rank 0's all-reduce ended although rank 1 never called it");
  double ta;
  ncclResult_t ra;
  if (poll) {
    ta = now();
    ra = ncclCommAbort(comm);
    ab.returned = now();
  } else {
    /* The abort thread starts at WAIT_S; it must return within ABORT_LIMIT of that. */
    if (!joined(&ab, WAIT_S + ABORT_LIMIT + 1)) {
      CHECK(0, "ncclCommAbort from another thread did not return within %.0f s", ABORT_LIMIT);
      return;
    }
    ta = ab.started;
    ra = ab.res;
  }
  double took = ab.returned - ta;
  printf("  [%s] ncclCommAbort%s: %s in %.3f s\n", tag, poll ? "" : " (other thread)", ncclGetErrorString(ra), took);
  CHECK(ra == ncclSuccess, "ncclCommAbort: %s", ncclGetErrorString(ra));
  CHECK(took < ABORT_LIMIT, "ncclCommAbort took %.1f s (limit %.0f)", took, ABORT_LIMIT);
  double idle = idle_after(s, ta, RELEASE_LIMIT);
  printf("  [%s] stream idle %.3f s after the abort began\n", tag, idle);
  CHECK(idle >= 0, "rank 0's stream still busy %.0f s after the abort began", RELEASE_LIMIT);
  if (connect) {
    int back = joined(&ar, ta + RELEASE_LIMIT - now());
    CHECK(back, "rank 0's ncclAllReduce (waiting to connect) did not return within %.0f s of the abort",
          RELEASE_LIMIT);
    if (back)
      printf("  [%s] its ncclAllReduce returned %s %.3f s after the abort began\n", tag, ncclGetErrorString(ar.res),
             ar.returned - ta);
  }
}

static int alloc(float **buf, size_t count, cudaStream_t *s) {
  cudaError_t e = cudaStreamCreateWithFlags(s, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc((void **)buf, count * sizeof(float));
  if (e == cudaSuccess) e = cudaMemset(*buf, 0, count * sizeof(float));
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) printf("  [%s] FAIL stream and buffer of %zu floats: %s\n", tag, count, cudaGetErrorString(e));
  return e != cudaSuccess;
}

/* A peer's orderly end once rank 0 is done (or gave up waiting). */
static void peer_teardown(ncclComm_t comm, struct shared *sh) {
  if (!wait_flag(&sh->done0, 45)) printf("  [%s] rank 0 not done after 45 s; tearing down anyway\n", tag);
  double t0 = now();
  ncclResult_t r = ncclCommDestroy(comm);
  double took = now() - t0;
  printf("  [%s] ncclCommDestroy: %s in %.3f s\n", tag, ncclGetErrorString(r), took);
  CHECK(took < PEER_LIMIT, "the peer's ncclCommDestroy took %.1f s (limit %.0f)", took, PEER_LIMIT);
}

/* Mode threads: both ranks in this process. */
static int threads_main(const char *c) {
  snprintf(tag, sizeof tag, "%s", c);
  int devs[2] = {0, 0};
  ncclComm_t comms[2] = {NULL, NULL};
  ncclResult_t res = ncclCommInitAll(comms, 2, devs);
  if (res != ncclSuccess) {
    printf("  [%s] ncclCommInitAll refused: %s / %s\n", tag, ncclGetErrorString(res),
           text_of(ncclGetLastError(NULL)));
    return res == ncclInvalidUsage ? EXIT_SKIP : 1;
  }
  float *buf[2];
  cudaStream_t s[2];
  size_t count = count_of(c);
  if (alloc(&buf[0], count, &s[0]) || alloc(&buf[1], count, &s[1])) return 1;
  if (!way_is(c, "connect")) {
    for (int i = 0; i < 3; i++) {
      ncclGroupStart();
      for (int r = 0; r < 2; r++) ncclAllReduce(buf[r], buf[r], count, ncclFloat, ncclSum, comms[r], s[r]);
      res = ncclGroupEnd();
      CHECK(res == ncclSuccess, "warm-up all-reduce %d: %s", i + 1, ncclGetErrorString(res));
    }
    CHECK(idle_after(s[0], now(), 30) >= 0 && idle_after(s[1], now(), 30) >= 0, "warm-up not done within 30 s");
  }
  wait_and_abort(c, comms[0], buf[0], s[0]);
  struct shared done = {.done0 = 1};
  peer_teardown(comms[1], &done);
  fflush(stdout);
  return n_fail > 76 ? 76 : n_fail;
}

/* Modes procs and hostid: rank r of two processes. */
static int rank_main(const char *c, int r, const char *dir) {
  snprintf(tag, sizeof tag, "%s rank %d", c, r);
  struct shared *sh = map_shared(dir, 0);
  if (!sh) {
    printf("  [%s] FAIL cannot map %s/shared\n", tag, dir);
    return 1;
  }
  cudaError_t ce = cudaSetDevice(0);
  if (ce != cudaSuccess) {
    printf("  [%s] FAIL cudaSetDevice(0): %s\n", tag, cudaGetErrorString(ce));
    sh->done0 = 1;
    return 1;
  }
  if (r == 0) {
    ncclResult_t res = ncclGetUniqueId(&sh->id);
    if (res != ncclSuccess) {
      printf("  [%s] ncclGetUniqueId: %s\n", tag, ncclGetErrorString(res));
      return 1;
    }
    __sync_synchronize();
    sh->id_ready = 1;
  } else if (!wait_flag(&sh->id_ready, 30)) {
    printf("  [%s] FAIL no unique id from rank 0 within 30 s\n", tag);
    return 1;
  }
  __sync_synchronize();
  ncclComm_t comm = NULL;
  ncclResult_t res = ncclCommInitRank(&comm, 2, sh->id, r);
  if (res != ncclSuccess) {
    printf("  [%s] init refused: %s / %s\n", tag, ncclGetErrorString(res), text_of(ncclGetLastError(NULL)));
    sh->done0 = 1;
    return res == ncclInvalidUsage ? EXIT_SKIP : 1;
  }
  float *buf;
  cudaStream_t s;
  size_t count = count_of(c);
  if (alloc(&buf, count, &s)) return 1;
  if (!way_is(c, "connect")) {
    for (int i = 0; i < 3; i++) {
      res = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, s);
      CHECK(res == ncclSuccess, "warm-up all-reduce %d: %s", i + 1, ncclGetErrorString(res));
    }
    CHECK(idle_after(s, now(), 30) >= 0, "warm-up not done within 30 s");
  }
  sh->warm[r] = 1;
  if (r == 1) {
    peer_teardown(comm, sh);
  } else {
    if (!wait_flag(&sh->warm[1], 30)) CHECK(0, "rank 1 not ready within 30 s");
    wait_and_abort(c, comm, buf, s);
    sh->done0 = 1;
  }
  fflush(stdout);
  return n_fail > 76 ? 76 : n_fail;
}

/* The environment of case `c`'s rank r (set before the library reads it). */
static void case_env(const char *c, int r) {
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  if (!strncmp(c, "hostid", 6)) {
    char host[64];
    snprintf(host, sizeof host, "net-abort-host-%d", r);
    setenv("NCCL_HOSTID", host, 1);
    unsetenv("NCCL_P2P_DISABLE");
    unsetenv("NCCL_SHM_DISABLE");
  } else {
    unsetenv("NCCL_HOSTID");
    setenv("NCCL_P2P_DISABLE", "1", 1);
    setenv("NCCL_SHM_DISABLE", "1", 1);
    setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
  }
  /* A watchdog report or error must not end the wait before the abort does. */
  unsetenv("OXCCL_HANG_ERROR");
}

/* One case: its processes, bounded; 0 ok, 1 failed, 2 skipped. */
static int run_case(const char *c, double limit) {
  char dir[] = "/tmp/oxccl-net-abort.XXXXXX";
  if (!mkdtemp(dir)) return 1;
  struct shared *sh = map_shared(dir, 1);
  if (!sh) return 1;
  int procs = strncmp(c, "threads", 7) ? 2 : 1;
  pid_t pids[2] = {-1, -1};
  int status[2] = {0, 0}, done[2] = {0, 0};
  fflush(stdout);
  double t0 = now();
  for (int r = 0; r < procs; r++) {
    char rstr[8];
    snprintf(rstr, sizeof rstr, "%d", r);
    pid_t parent = getpid();
    pids[r] = fork();
    if (pids[r] == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      case_env(c, r);
      char *argv[] = {self_exe, "--rank", (char *)c, rstr, dir, NULL};
      execv(self_exe, argv);
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
    if (pids[r] <= 0) {
      bad++;
      continue;
    }
    if (!done[r]) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status[r], 0);
      printf("  FAIL rank process %d still running after %.0f s: killed (a hang)\n", r, limit);
      bad++;
      continue;
    }
    int st = status[r];
    if (WIFEXITED(st) && WEXITSTATUS(st) == EXIT_SKIP) {
      skips++;
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      printf("  rank process %d: %s %d\n", r, WIFEXITED(st) ? "exit status" : "signal",
             WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      bad++;
    }
  }
  printf("%s %s in %.1f s\n", bad ? "FAIL" : skips ? "SKIP" : "PASS", c, now() - t0);
  fflush(stdout);
  munmap(sh, sizeof *sh);
  char path[4200];
  snprintf(path, sizeof path, "%s/shared", dir);
  unlink(path);
  rmdir(dir);
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

int main(int argc, char **argv) {
  ssize_t len = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
  if (len <= 0) return 2;
  self_exe[len] = 0;
  if (argc == 5 && !strcmp(argv[1], "--rank")) {
    signal(SIGALRM, on_alarm);
    alarm(RANK_ALARM);
    if (!strncmp(argv[2], "threads", 7)) return threads_main(argv[2]);
    return rank_main(argv[2], atoi(argv[3]), argv[4]);
  }
  int budget = 600, opt;
  const char *list = NULL;
  while ((opt = getopt(argc, argv, "c:T:l")) != -1) {
    switch (opt) {
    case 'c': list = optarg; break;
    case 'T': budget = atoi(optarg); break;
    case 'l':
      for (int i = 0; i < NCASES; i++) printf("%s\n", CASES[i]);
      return 0;
    default: fprintf(stderr, "usage: net_abort [-c LIST] [-T SECONDS] [-l]\n"); return 2;
    }
  }
  double t0 = now();
  int passed = 0, failed = 0, skipped = 0, not_run = 0;
  for (int i = 0; i < NCASES; i++) {
    if (!selected(CASES[i], list)) continue;
    double left = budget - (now() - t0);
    if (left < 30) {
      printf("NOT RUN %s (time budget)\n", CASES[i]);
      not_run++;
      continue;
    }
    int r = run_case(CASES[i], left - 5 < CASE_LIMIT ? left - 5 : CASE_LIMIT);
    if (r == 0) passed++;
    else if (r == 1) failed++;
    else skipped++;
  }
  printf("%d passed, %d failed, %d skipped, %d not run\n", passed, failed, skipped, not_run);
  return failed || not_run ? 1 : 0;
}
