/* GPU lifecycle checks for any libnccl.so.2 (ours or NVIDIA's, chosen by LD_LIBRARY_PATH):
 * init in threads, init from one thread in a group, ncclCommInitAll, one process per GPU,
 * queries, split (with NCCL_SPLIT_NOCOLOR), shrink, non-blocking init, duplicate GPU,
 * a small all-reduce, and abort from another thread while ranks wait for a peer that never
 * comes. Prints init times and 'N passed, M failed'; exits non-zero on failure.
 *
 * usage: lifecycle [-n NGPUS] [-p] [-x]    (-p: one process per GPU; -x: skip data tests) */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static int passed, failed;
static int ngpus = 2, skip_data = 0;

#define CHECK(cond, ...)                                  \
  do {                                                    \
    if (cond) {                                           \
      passed++;                                           \
    } else {                                              \
      failed++;                                           \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);         \
      printf(__VA_ARGS__);                                \
      printf("\n");                                       \
    }                                                     \
  } while (0)

static double now(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return tv.tv_sec + tv.tv_usec * 1e-6;
}

struct rank_arg {
  int rank;
  ncclUniqueId id;
  ncclComm_t comm;
  ncclResult_t res;
  double seconds;
  int blocking;
};

static void *init_thread(void *p) {
  struct rank_arg *a = p;
  cudaSetDevice(a->rank);
  double t0 = now();
  if (a->blocking) {
    a->res = ncclCommInitRank(&a->comm, ngpus, a->id, a->rank);
  } else {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    a->res = ncclCommInitRankConfig(&a->comm, ngpus, a->id, a->rank, &cfg);
    if (a->res == ncclInProgress) {
      ncclResult_t st = ncclInProgress;
      while (st == ncclInProgress && now() - t0 < 60) {
        ncclCommGetAsyncError(a->comm, &st);
        usleep(1000);
      }
      a->res = st;
    }
  }
  a->seconds = now() - t0;
  return NULL;
}

/* Init ngpus ranks, one thread each; returns the slowest rank's seconds. */
static double init_threads(ncclComm_t *comms, int blocking) {
  pthread_t th[16];
  struct rank_arg args[16];
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId: %s", ncclGetLastError(NULL));
  for (int r = 0; r < ngpus; r++) {
    args[r] = (struct rank_arg){.rank = r, .id = id, .blocking = blocking};
    pthread_create(&th[r], NULL, init_thread, &args[r]);
  }
  double worst = 0;
  for (int r = 0; r < ngpus; r++) {
    pthread_join(th[r], NULL);
    CHECK(args[r].res == ncclSuccess, "rank %d init: %s / %s", r, ncclGetErrorString(args[r].res),
          ncclGetLastError(NULL));
    comms[r] = args[r].comm;
    if (args[r].seconds > worst) worst = args[r].seconds;
  }
  return worst;
}

static void check_queries(ncclComm_t *comms) {
  for (int r = 0; r < ngpus; r++) {
    int count = -1, dev = -1, rank = -1;
    CHECK(ncclCommCount(comms[r], &count) == ncclSuccess && count == ngpus, "count %d", count);
    CHECK(ncclCommCuDevice(comms[r], &dev) == ncclSuccess && dev == r, "device %d", dev);
    CHECK(ncclCommUserRank(comms[r], &rank) == ncclSuccess && rank == r, "rank %d", rank);
  }
}

static void destroy_all(ncclComm_t *comms, int n) {
  for (int r = 0; r < n; r++) {
    if (comms[r]) CHECK(ncclCommDestroy(comms[r]) == ncclSuccess, "destroy %d: %s", r, ncclGetLastError(comms[r]));
    comms[r] = NULL;
  }
}

/* One all-reduce of 1M floats (value rank+1) in a group over all comms; checks the sum. */
static void allreduce_check(ncclComm_t *comms, const char *what) {
  const size_t n = 1 << 20;
  float *buf[16];
  cudaStream_t st[16];
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    cudaStreamCreate(&st[r]);
    cudaMalloc((void **)&buf[r], n * sizeof(float));
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = (float)(r + 1 + (i % 7));
    cudaMemcpy(buf[r], h, n * sizeof(float), cudaMemcpyHostToDevice);
    free(h);
  }
  ncclGroupStart();
  for (int r = 0; r < ngpus; r++) ncclAllReduce(buf[r], buf[r], n, ncclFloat, ncclSum, comms[r], st[r]);
  ncclResult_t res = ncclGroupEnd();
  CHECK(res == ncclSuccess, "%s all-reduce: %s / %s", what, ncclGetErrorString(res), ncclGetLastError(NULL));
  float expect_base = (float)(ngpus * (ngpus + 1) / 2);
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    CHECK(cudaStreamSynchronize(st[r]) == cudaSuccess, "%s sync", what);
    float *h = malloc(n * sizeof(float));
    cudaMemcpy(h, buf[r], n * sizeof(float), cudaMemcpyDeviceToHost);
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++)
      if (h[i] != expect_base + ngpus * (float)(i % 7)) wrong++;
    CHECK(wrong == 0, "%s all-reduce rank %d: %zu wrong", what, r, wrong);
    free(h);
    cudaFree(buf[r]);
    cudaStreamDestroy(st[r]);
  }
}

struct abort_arg {
  ncclComm_t *comms;
  int n;
};

static void *abort_later(void *p) {
  struct abort_arg *a = p;
  sleep(2);
  for (int r = 0; r < a->n; r++) ncclCommAbort(a->comms[r]);
  return NULL;
}

/* Every rank but the last enters an all-reduce; the last never does. Abort must release
 * the waiting kernels: the streams finish within 20 s. */
static void abort_check(void) {
  printf("-- abort\n");
  ncclComm_t comms[16] = {0};
  init_threads(comms, 1);
  const size_t n = 1 << 16;
  float *buf[16];
  cudaStream_t st[16];
  int waiting = ngpus - 1;
  ncclGroupStart();
  for (int r = 0; r < waiting; r++) {
    cudaSetDevice(r);
    cudaStreamCreate(&st[r]);
    cudaMalloc((void **)&buf[r], n * sizeof(float));
    ncclAllReduce(buf[r], buf[r], n, ncclFloat, ncclSum, comms[r], st[r]);
  }
  /* The group end may block in connection setup waiting for the absent rank; abort from
   * another thread must release it as well. */
  pthread_t th;
  struct abort_arg aa = {comms, waiting};
  pthread_create(&th, NULL, abort_later, &aa);
  double t0 = now();
  ncclGroupEnd();
  int done = 1;
  for (int r = 0; r < waiting; r++) {
    cudaSetDevice(r);
    while (cudaStreamQuery(st[r]) == cudaErrorNotReady) {
      if (now() - t0 > 20) {
        done = 0;
        break;
      }
      usleep(1000);
    }
  }
  pthread_join(th, NULL);
  CHECK(done, "abort did not release the waiting ranks within 20 s");
  printf("abort released waiting ranks after %.2f s\n", now() - t0);
  if (comms[ngpus - 1]) ncclCommAbort(comms[ngpus - 1]);
  cudaGetLastError();
}

static void split_check(ncclComm_t *comms) {
  printf("-- split\n");
  ncclComm_t sub[16] = {0};
  ncclGroupStart();
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    int color = r == 0 && ngpus > 2 ? NCCL_SPLIT_NOCOLOR : r % 2;
    ncclCommSplit(comms[r], color, ngpus - r, &sub[r], NULL);
  }
  ncclResult_t res = ncclGroupEnd();
  CHECK(res == ncclSuccess, "split group: %s / %s", ncclGetErrorString(res), ncclGetLastError(NULL));
  for (int r = 0; r < ngpus; r++) {
    if (r == 0 && ngpus > 2) {
      CHECK(sub[r] == NULL, "NOCOLOR rank got a communicator");
      continue;
    }
    int count = -1, rank = -1;
    ncclCommCount(sub[r], &count);
    ncclCommUserRank(sub[r], &rank);
    int members = 0, before = 0;
    for (int q = 0; q < ngpus; q++) {
      if (q == 0 && ngpus > 2) continue;
      if (q % 2 != r % 2) continue;
      members++;
      if (ngpus - q < ngpus - r) before++; /* key = ngpus - q: larger q sorts first */
    }
    CHECK(count == members && rank == before, "split rank %d: count %d (want %d) rank %d (want %d)", r, count,
          members, rank, before);
  }
  destroy_all(sub, ngpus);
}

/* ncclCommShrink without the last rank: the others get a communicator of ngpus-1 ranks. */
static void shrink_check(ncclComm_t *comms) {
  if (ngpus < 2) return;
  printf("-- shrink\n");
  ncclComm_t sub[16] = {0};
  int exclude = ngpus - 1;
  ncclGroupStart();
  for (int r = 0; r < ngpus - 1; r++) {
    cudaSetDevice(r);
    ncclCommShrink(comms[r], &exclude, 1, &sub[r], NULL, NCCL_SHRINK_DEFAULT);
  }
  ncclResult_t res = ncclGroupEnd();
  CHECK(res == ncclSuccess, "shrink group: %s / %s", ncclGetErrorString(res), ncclGetLastError(NULL));
  for (int r = 0; r < ngpus - 1; r++) {
    int count = -1, rank = -1;
    ncclCommCount(sub[r], &count);
    ncclCommUserRank(sub[r], &rank);
    CHECK(count == ngpus - 1 && rank == r, "shrink rank %d: count %d rank %d", r, count, rank);
  }
  destroy_all(sub, ngpus - 1);
}

/* ncclCommRevoke stops the communicator for new work; destroy still succeeds. */
static void revoke_check(void) {
  printf("-- revoke\n");
  ncclComm_t comms[16] = {0};
  init_threads(comms, 1);
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    CHECK(ncclCommRevoke(comms[r], NCCL_REVOKE_DEFAULT) == ncclSuccess, "revoke %d: %s", r, ncclGetLastError(comms[r]));
  }
  float *buf;
  cudaSetDevice(0);
  cudaMalloc((void **)&buf, 64);
  ncclResult_t res = ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, comms[0], 0);
  CHECK(res != ncclSuccess, "all-reduce on a revoked communicator succeeded");
  cudaFree(buf);
  destroy_all(comms, ngpus);
}

/* Two unique ids (ncclCommInitRankScalable): every rank passes both. */
struct scalable_arg {
  int rank;
  ncclUniqueId ids[2];
  ncclComm_t comm;
  ncclResult_t res;
};

static void *scalable_thread(void *p) {
  struct scalable_arg *a = p;
  cudaSetDevice(a->rank);
  a->res = ncclCommInitRankScalable(&a->comm, ngpus, a->rank, 2, a->ids, NULL);
  return NULL;
}

static void scalable_check(void) {
  if (ngpus < 2) return;
  printf("-- scalable\n");
  pthread_t th[16];
  struct scalable_arg args[16];
  ncclUniqueId ids[2];
  ncclGetUniqueId(&ids[0]);
  ncclGetUniqueId(&ids[1]);
  for (int r = 0; r < ngpus; r++) {
    args[r] = (struct scalable_arg){.rank = r};
    memcpy(args[r].ids, ids, sizeof ids);
    pthread_create(&th[r], NULL, scalable_thread, &args[r]);
  }
  ncclComm_t comms[16] = {0};
  for (int r = 0; r < ngpus; r++) {
    pthread_join(th[r], NULL);
    CHECK(args[r].res == ncclSuccess, "scalable init rank %d: %s", r, ncclGetLastError(NULL));
    comms[r] = args[r].comm;
  }
  check_queries(comms);
  destroy_all(comms, ngpus);
}

/* ncclMemAlloc memory works as a collective buffer and is freed by ncclMemFree. */
static void memalloc_check(ncclComm_t *comms) {
  printf("-- ncclMemAlloc\n");
  const size_t n = 1 << 18;
  float *buf[16];
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    buf[r] = NULL;
    ncclResult_t res = ncclMemAlloc((void **)&buf[r], n * sizeof(float));
    CHECK(res == ncclSuccess && buf[r], "ncclMemAlloc: %s", ncclGetLastError(NULL));
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = (float)(r + 1);
    CHECK(cudaMemcpy(buf[r], h, n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess, "copy to ncclMemAlloc memory");
    free(h);
  }
  ncclGroupStart();
  for (int r = 0; r < ngpus; r++) ncclAllReduce(buf[r], buf[r], n, ncclFloat, ncclSum, comms[r], 0);
  CHECK(ncclGroupEnd() == ncclSuccess, "all-reduce on ncclMemAlloc memory: %s", ncclGetLastError(NULL));
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    cudaDeviceSynchronize();
    float v = 0;
    cudaMemcpy(&v, buf[r] + n - 1, sizeof v, cudaMemcpyDeviceToHost);
    CHECK(v == (float)(ngpus * (ngpus + 1) / 2), "ncclMemAlloc all-reduce rank %d: %f", r, v);
    CHECK(ncclMemFree(buf[r]) == ncclSuccess, "ncclMemFree: %s", ncclGetLastError(NULL));
  }
}

static void duplicate_gpu_check(void) {
  printf("-- duplicate GPU\n");
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  ncclComm_t c[2] = {0};
  cudaSetDevice(0);
  ncclGroupStart();
  ncclCommInitRank(&c[0], 2, id, 0);
  ncclCommInitRank(&c[1], 2, id, 1);
  ncclResult_t res = ncclGroupEnd();
  CHECK(res == ncclInvalidUsage, "two ranks on one GPU gave %s, want ncclInvalidUsage", ncclGetErrorString(res));
  for (int r = 0; r < 2; r++)
    if (c[r]) ncclCommAbort(c[r]);
}

static int child_rank(int rank, ncclUniqueId id) {
  cudaSetDevice(rank);
  ncclComm_t comm;
  double t0 = now();
  ncclResult_t res = ncclCommInitRank(&comm, ngpus, id, rank);
  CHECK(res == ncclSuccess, "process rank %d init: %s / %s", rank, ncclGetErrorString(res), ncclGetLastError(NULL));
  if (res != ncclSuccess) return 1;
  printf("process rank %d init %.3f s\n", rank, now() - t0);
  if (!skip_data) {
    const size_t n = 1 << 20;
    float *buf;
    cudaMalloc((void **)&buf, n * sizeof(float));
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = (float)(rank + 1);
    cudaMemcpy(buf, h, n * sizeof(float), cudaMemcpyHostToDevice);
    res = ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, 0);
    CHECK(res == ncclSuccess, "process all-reduce: %s", ncclGetLastError(comm));
    cudaDeviceSynchronize();
    cudaMemcpy(h, buf, n * sizeof(float), cudaMemcpyDeviceToHost);
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++)
      if (h[i] != (float)(ngpus * (ngpus + 1) / 2)) wrong++;
    CHECK(wrong == 0, "process rank %d all-reduce: %zu wrong", rank, wrong);
    free(h);
    cudaFree(buf);
  }
  CHECK(ncclCommDestroy(comm) == ncclSuccess, "process destroy");
  return failed ? 1 : 0;
}

int main(int argc, char **argv) {
  int procs = 0;
  setvbuf(stdout, NULL, _IOLBF, 0); /* keep every line if a hang is killed */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-n") && i + 1 < argc) ngpus = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-p")) procs = 1;
    else if (!strcmp(argv[i], "-x")) skip_data = 1;
  }
  int version = 0;
  ncclGetVersion(&version);
  printf("library version %d, %d GPUs, %s\n", version, ngpus, procs ? "one process per GPU" : "threads");
  if (procs) {
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
    pid_t pids[16];
    double t0 = now();
    for (int r = 0; r < ngpus; r++) {
      pids[r] = fork();
      if (pids[r] == 0) exit(child_rank(r, id));
    }
    int bad = 0;
    for (int r = 0; r < ngpus; r++) {
      int status = 0;
      waitpid(pids[r], &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) bad++;
    }
    CHECK(bad == 0, "%d child processes failed", bad);
    printf("processes done in %.3f s\n", now() - t0);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
  }
  ncclComm_t comms[16] = {0};
  double t = init_threads(comms, 1);
  printf("init (threads, blocking): %.3f s\n", t);
  check_queries(comms);
  if (!skip_data) allreduce_check(comms, "threads");
  split_check(comms);
  shrink_check(comms);
  if (!skip_data) memalloc_check(comms);
  destroy_all(comms, ngpus);
  revoke_check();
  scalable_check();

  t = init_threads(comms, 0);
  printf("init (threads, non-blocking): %.3f s\n", t);
  check_queries(comms);
  destroy_all(comms, ngpus);

  double t0 = now();
  ncclResult_t res = ncclCommInitAll(comms, ngpus, NULL);
  CHECK(res == ncclSuccess, "ncclCommInitAll: %s", ncclGetLastError(NULL));
  printf("init (ncclCommInitAll): %.3f s\n", now() - t0);
  check_queries(comms);
  if (!skip_data) allreduce_check(comms, "InitAll");
  destroy_all(comms, ngpus);

  ncclUniqueId id;
  ncclGetUniqueId(&id);
  t0 = now();
  ncclGroupStart();
  for (int r = 0; r < ngpus; r++) {
    cudaSetDevice(r);
    ncclCommInitRank(&comms[r], ngpus, id, r);
  }
  res = ncclGroupEnd();
  CHECK(res == ncclSuccess, "group init: %s", ncclGetLastError(NULL));
  printf("init (one thread, group): %.3f s\n", now() - t0);
  check_queries(comms);
  destroy_all(comms, ngpus);

  duplicate_gpu_check();
  if (!skip_data) abort_check();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
