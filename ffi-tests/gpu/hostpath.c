/* hostpath.c: what one small collective costs the caller, host and stream, for any NCCL
 * library (ours or NVIDIA's, chosen by LD_LIBRARY_PATH), on GPU 0.
 *
 * For each collective, size and place (out of / in place) it issues N calls back to back on
 * one stream after a warm-up and prints one ROW line:
 *   ROW <ranks> <collective> <bytes> <place> host=<µs per call> stream=<µs per op>
 *       cpu=<µs per call> wrong=<n>
 * host is the caller's time inside the calls (the enqueue path: nothing waits for the GPU),
 * cpu the CPU time the whole process spent meanwhile (the caller and every thread of the
 * library: what the calls cost the host's CPUs, more than host where a library's own threads
 * work while the caller calls, less where the caller sleeps in a call),
 * stream the time from the first call to the end of the last operation on the stream divided
 * by N: what nccl-tests reports as time when the host is the bottleneck, and the GPU time
 * otherwise. With -r 2 the two ranks are communicators of one process driven by group calls
 * (NCCL_MULTI_RANK_GPU_ENABLE=1), host and stream per group of both ranks' calls; with -p the
 * two ranks are two processes (rank 0 the parent; run it under MPS to let their kernels run
 * side by side), each driving its own rank, and rank 0 prints the rows.
 * Baselines (BASE lines): cudaMemcpyAsync device to device and cudaEventRecord per call.
 *
 * usage: hostpath [-r 1|2 | -p] [-n N] [-c LIST] [-s LIST]
 *   -c  collectives (allreduce,allgather,broadcast,reduce,reducescatter,alltoall,gather,
 *       scatter,sendrecv; default all), -s sizes in bytes (default 8,32768,524288,8388608)
 * An alarm bounds the run (120 s). Exit 0 when every result was right, 1 otherwise. */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <nccl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXR 2
static int nr = 1, iters = 2000;
/* This process's ranks: nlocal communicators, of ranks first .. first + nlocal - 1. */
static int nlocal = 1, first = 0;
static ncclComm_t comms[MAXR];
static cudaStream_t streams[MAXR];
static const char *colls = "allreduce,allgather,broadcast,reduce,reducescatter,alltoall,gather,scatter,sendrecv";
static const char *sizes = "8,32768,524288,8388608";

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static double cpu_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "FAIL hostpath: still running after 120 s (a call hangs)\n";
  if (write(1, msg, sizeof msg - 1) < 0) _exit(2);
  _exit(2);
}

#define CUDA(x)                                                                      \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      printf("FAIL %s: %s\n", #x, cudaGetErrorString(e_));                           \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

/* Elements per rank of a collective moving `bytes` of floats (at least 1 element). */
static size_t elems(size_t bytes) { return bytes < 4 ? 1 : bytes / 4; }

/* Buffer bytes a rank needs for the send or receive side of `coll` with n elements. */
static size_t buf_bytes(const char *coll, size_t n) {
  bool wide = !strcmp(coll, "allgather") || !strcmp(coll, "reducescatter") || !strcmp(coll, "alltoall") ||
              !strcmp(coll, "gather") || !strcmp(coll, "scatter");
  return (wide ? (size_t)nr : 1) * n * sizeof(float);
}

/* The call of local rank l (global rank first + l). */
static ncclResult_t issue(const char *c, int l, float *in, float *out, size_t n) {
  ncclComm_t comm = comms[l];
  cudaStream_t s = streams[l];
  int r = first + l;
  int root = nr - 1;
  if (!strcmp(c, "allreduce")) return ncclAllReduce(in, out, n, ncclFloat, ncclSum, comm, s);
  if (!strcmp(c, "allgather")) return ncclAllGather(in, out, n, ncclFloat, comm, s);
  if (!strcmp(c, "broadcast")) return ncclBroadcast(in, out, n, ncclFloat, root, comm, s);
  if (!strcmp(c, "reduce")) return ncclReduce(in, out, n, ncclFloat, ncclSum, root, comm, s);
  if (!strcmp(c, "reducescatter")) return ncclReduceScatter(in, out, n, ncclFloat, ncclSum, comm, s);
  if (!strcmp(c, "alltoall")) return ncclAlltoAll(in, out, n, ncclFloat, comm, s);
  if (!strcmp(c, "gather")) return ncclGather(in, out, n, ncclFloat, root, comm, s);
  if (!strcmp(c, "scatter")) return ncclScatter(in, out, n, ncclFloat, root, comm, s);
  if (!strcmp(c, "sendrecv")) {
    ncclResult_t a = ncclGroupStart();
    if (a == ncclSuccess) a = ncclSend(in, n, ncclFloat, (r + 1) % nr, comm, s);
    if (a == ncclSuccess) a = ncclRecv(out, n, ncclFloat, (r + nr - 1) % nr, comm, s);
    ncclResult_t b = ncclGroupEnd();
    return a != ncclSuccess ? a : b;
  }
  return ncclInvalidArgument;
}

/* One call of every rank (a group when there are several). */
static ncclResult_t call_all(const char *c, float **in, float **out, size_t n) {
  if (nlocal == 1) return issue(c, 0, in[0], out[0], n);
  ncclResult_t rc = ncclGroupStart();
  for (int l = 0; l < nlocal && rc == ncclSuccess; l++) rc = issue(c, l, in[l], out[l], n);
  ncclResult_t end = ncclGroupEnd();
  return rc != ncclSuccess ? rc : end;
}

/* Whether the first element of local rank 0's result is what the collective gives with every
 * rank's input filled with (rank + 1). Only meaningful out of place; checked on rank 0. */
static long check_first(const char *c, float **out) {
  float got = 0;
  CUDA(cudaMemcpy(&got, out[0], sizeof got, cudaMemcpyDeviceToHost));
  float sum = 0;
  for (int r = 0; r < nr; r++) sum += (float)(r + 1);
  /* reduce and gather deliver at the root (rank nr-1) only: checked with one rank. */
  if (first != 0 || ((!strcmp(c, "reduce") || !strcmp(c, "gather")) && nr > 1)) return 0;
  float want = 1; /* all-gather and all-to-all: rank 0's own block first */
  if (!strcmp(c, "allreduce") || !strcmp(c, "reducescatter") || !strcmp(c, "reduce")) want = sum;
  else if (!strcmp(c, "broadcast") || !strcmp(c, "scatter") || !strcmp(c, "sendrecv")) want = (float)nr;
  return got != want;
}

static void fill(float *d, size_t n, float v) {
  float *h = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) h[i] = v;
  CUDA(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
  free(h);
}

static long run_case(const char *c, size_t bytes, bool inplace) {
  size_t n = elems(bytes);
  size_t sb = buf_bytes(c, n), rb = sb;
  float *in[MAXR], *out[MAXR];
  for (int r = 0; r < nlocal; r++) {
    size_t cap = (sb > rb ? sb : rb) * (size_t)nr + 256;
    CUDA(cudaMalloc((void **)&in[r], cap));
    fill(in[r], cap / sizeof(float), (float)(first + r + 1));
    if (inplace) out[r] = in[r];
    else CUDA(cudaMalloc((void **)&out[r], cap));
  }
  /* In place: NCCL's in-place layouts (all-gather's input at the rank's block of the output,
   * reduce-scatter's output at its block of the input); the other collectives use one buffer. */
  float *sin[MAXR];
  for (int r = 0; r < nlocal; r++) {
    sin[r] = in[r];
    if (inplace && !strcmp(c, "allgather")) sin[r] = in[r] + (size_t)(first + r) * n;
  }
  float **src = sin, *dst[MAXR];
  for (int r = 0; r < nlocal; r++)
    dst[r] = (inplace && !strcmp(c, "reducescatter")) ? in[r] + (size_t)(first + r) * n : out[r];
  ncclResult_t rc = ncclSuccess;
  for (int i = 0; i < 20 && rc == ncclSuccess; i++) rc = call_all(c, src, dst, n);
  for (int r = 0; r < nlocal; r++) CUDA(cudaStreamSynchronize(streams[r]));
  long wrong = 0;
  if (rc == ncclSuccess && !inplace) wrong = check_first(c, dst);
  double c0 = cpu_us(), t0 = now_us();
  for (int i = 0; i < iters && rc == ncclSuccess; i++) rc = call_all(c, src, dst, n);
  double t1 = now_us(), c1 = cpu_us();
  for (int r = 0; r < nlocal; r++) CUDA(cudaStreamSynchronize(streams[r]));
  double t2 = now_us();
  if (first != 0) {
    /* The other process of -p: rank 0 reports. */
  } else if (rc != ncclSuccess) {
    printf("ROW %d %-13s %9zu %-3s rc=%d %s\n", nr, c, bytes, inplace ? "in" : "out", rc, ncclGetLastError(NULL));
    wrong++;
  } else {
    printf("ROW %d %-13s %9zu %-3s host=%.2f stream=%.2f cpu=%.2f wrong=%ld\n", nr, c, bytes,
           inplace ? "in" : "out", (t1 - t0) / iters, (t2 - t0) / iters, (c1 - c0) / iters, wrong);
  }
  fflush(stdout);
  for (int r = 0; r < nlocal; r++) {
    cudaFree(in[r]);
    if (!inplace) cudaFree(out[r]);
  }
  return wrong;
}

static void baselines(void) {
  void *a, *b;
  CUDA(cudaMalloc(&a, 1 << 20));
  CUDA(cudaMalloc(&b, 1 << 20));
  cudaEvent_t ev;
  CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  for (int k = 0; k < 2; k++) {
    size_t bytes = k ? (512 << 10) : 8;
    for (int i = 0; i < 20; i++) CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, streams[0]));
    CUDA(cudaStreamSynchronize(streams[0]));
    double t0 = now_us();
    for (int i = 0; i < iters; i++) CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, streams[0]));
    double t1 = now_us();
    CUDA(cudaStreamSynchronize(streams[0]));
    double t2 = now_us();
    printf("BASE cudaMemcpyAsync_DtoD %zu host=%.2f stream=%.2f\n", bytes, (t1 - t0) / iters, (t2 - t0) / iters);
  }
  double t0 = now_us();
  for (int i = 0; i < iters; i++) CUDA(cudaEventRecord(ev, streams[0]));
  double t1 = now_us();
  CUDA(cudaStreamSynchronize(streams[0]));
  printf("BASE cudaEventRecord 0 host=%.2f stream=%.2f\n", (t1 - t0) / iters, (now_us() - t0) / iters);
  cudaEventDestroy(ev);
  cudaFree(a);
  cudaFree(b);
}

/* -p: fork rank 1, hand it rank 0's unique id through a pipe (CUDA is not touched before the
 * fork), and initialize one communicator per process. Returns the pid of the child in the
 * parent, 0 in the child. */
static pid_t two_processes(ncclComm_t *comm) {
  int fds[2];
  if (pipe(fds) != 0) {
    printf("FAIL pipe\n");
    exit(1);
  }
  pid_t pid = fork();
  if (pid < 0) {
    printf("FAIL fork\n");
    exit(1);
  }
  ncclUniqueId id;
  first = pid == 0 ? 1 : 0;
  if (first == 0) {
    ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) {
      printf("FAIL ncclGetUniqueId: %s\n", ncclGetErrorString(rc));
      exit(1);
    }
    if (write(fds[1], &id, sizeof id) != sizeof id) exit(1);
  } else if (read(fds[0], &id, sizeof id) != sizeof id) {
    exit(1);
  }
  close(fds[0]);
  close(fds[1]);
  CUDA(cudaSetDevice(0));
  ncclResult_t rc = ncclCommInitRank(comm, 2, id, first);
  if (rc != ncclSuccess) {
    printf("FAIL ncclCommInitRank(rank %d of 2 processes on GPU 0): %s %s\n", first, ncclGetErrorString(rc),
           ncclGetLastError(NULL));
    exit(1);
  }
  return pid;
}

int main(int argc, char **argv) {
  int opt;
  bool procs = false;
  while ((opt = getopt(argc, argv, "r:pn:c:s:")) != -1) {
    if (opt == 'r') nr = atoi(optarg);
    else if (opt == 'p') procs = true;
    else if (opt == 'n') iters = atoi(optarg);
    else if (opt == 'c') colls = optarg;
    else if (opt == 's') sizes = optarg;
  }
  if (nr < 1 || nr > MAXR || iters < 1) {
    fprintf(stderr, "usage: hostpath [-r 1|2 | -p] [-n N] [-c LIST] [-s LIST]\n");
    return 2;
  }
  signal(SIGALRM, on_alarm);
  alarm(120);
  int v = 0;
  ncclGetVersion(&v);
  pid_t child = 0;
  if (procs) {
    nr = 2;
    nlocal = 1;
    child = two_processes(&comms[0]);
  } else {
    nlocal = nr;
    CUDA(cudaSetDevice(0));
    int devs[MAXR] = {0};
    ncclResult_t rc = ncclCommInitAll(comms, nr, devs);
    if (rc != ncclSuccess) {
      printf("FAIL ncclCommInitAll(%d ranks on GPU 0): %s %s\n", nr, ncclGetErrorString(rc), ncclGetLastError(NULL));
      return 1;
    }
  }
  for (int r = 0; r < nlocal; r++) CUDA(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
  if (first == 0)
    printf("hostpath: NCCL version code %d, %d rank(s) on GPU 0%s, %d calls per case\n", v, nr,
           procs ? " in 2 processes" : "", iters);
  if (nr == 1) baselines();
  long wrong = 0;
  char *cl = strdup(colls);
  for (char *c = strtok(cl, ","); c; c = strtok(NULL, ",")) {
    char *sl = strdup(sizes), *save = NULL;
    for (char *s = strtok_r(sl, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
      size_t bytes = strtoull(s, NULL, 10);
      wrong += run_case(c, bytes, false);
      wrong += run_case(c, bytes, true);
    }
    free(sl);
  }
  free(cl);
  for (int r = 0; r < nlocal; r++) ncclCommDestroy(comms[r]);
  if (first != 0) return wrong ? 1 : 0;
  if (child > 0) {
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      printf("FAIL rank 1's process: status %#x\n", status);
      wrong++;
    }
  }
  printf("hostpath: %s\n", wrong ? "WRONG results" : "all results right");
  return wrong ? 1 : 0;
}
