/* One-sided operations between two processes sharing GPU 0: each rank registers a symmetric
 * window in ncclMemAlloc memory; rank 0 puts two 1 MiB chunks into rank 1's window, each with
 * a signal, and rank 1 checks each chunk after waiting for its signal (exact data, in order);
 * then rank 1 signals rank 0 three times (signal index 2 of the 4 the config asks for) and
 * rank 0 waits for the three. Runs against
 * whichever libnccl.so.2 the loader finds. Prints PASS/FAIL lines and 'N passed, M failed';
 * an alarm bounds the run.
 *
 * usage: rma2p [-H]   (set NCCL_MULTI_RANK_GPU_ENABLE=1 for two ranks on one GPU)
 *   -H  each process claims a host of its own (NCCL_HOSTID): the operations go over the
 *       network instead of through mapped memory */
#include <cuda_runtime.h>
#include <nccl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHUNK (1 << 18) /* floats: 1 MiB */
#define WBYTES (8 << 20)

static int failures;
static void check(int rank, int ok, const char *what, ncclResult_t rc) {
  printf("%s rank %d %s%s%s\n", ok ? "PASS" : "FAIL", rank, what, rc == ncclSuccess ? "" : ": ",
         rc == ncclSuccess ? "" : ncclGetLastError(NULL));
  fflush(stdout);
  if (!ok) failures++;
}

static float value(int chunk, size_t i) { return (float)(chunk * 1000 + (int)(i % 997)); }

static int hosts;

static int run(int rank, ncclUniqueId id) {
  if (hosts) setenv("NCCL_HOSTID", rank ? "rma2p-host-b" : "rma2p-host-a", 1);
  cudaSetDevice(0);
  ncclComm_t comm;
  /* Signal index 2 below: NVIDIA's default is one signal index (numRmaSig 1). */
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.numRmaSig = 4;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, 2, id, rank, &config);
  check(rank, rc == ncclSuccess, "init", rc);
  if (rc != ncclSuccess) return 1;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  char *buf = NULL;
  rc = ncclMemAlloc((void **)&buf, WBYTES);
  check(rank, rc == ncclSuccess, "ncclMemAlloc", rc);
  cudaMemset(buf, 0, WBYTES);
  ncclWindow_t win = NULL;
  rc = ncclCommWindowRegister(comm, buf, WBYTES, &win, NCCL_WIN_COLL_SYMMETRIC);
  check(rank, rc == ncclSuccess, "window register (collective, across processes)", rc);
  if (rc != ncclSuccess) return 1;
  float *h = malloc(CHUNK * sizeof(float));
  if (rank == 0) {
    /* The two source chunks live in rank 0's own window, at 4 MiB and 5 MiB. */
    for (int c = 0; c < 2; c++) {
      for (size_t i = 0; i < CHUNK; i++) h[i] = value(c + 1, i);
      cudaMemcpy(buf + (4 << 20) + c * (1 << 20), h, CHUNK * sizeof(float), cudaMemcpyHostToDevice);
    }
    for (int c = 0; c < 2; c++) {
      rc = ncclPutSignal(buf + (4 << 20) + c * (1 << 20), CHUNK, ncclFloat, 1, win, 4096 + c * (1 << 20), 0, 0, 0,
                         comm, s);
      check(rank, rc == ncclSuccess, c ? "put chunk 2 + signal" : "put chunk 1 + signal", rc);
    }
    ncclWaitSignalDesc_t d = {3, 1, 2, 0};
    rc = ncclWaitSignal(1, &d, comm, s);
    check(rank, rc == ncclSuccess, "wait for 3 signals from rank 1 (sigIdx 2)", rc);
    check(rank, cudaStreamSynchronize(s) == cudaSuccess, "stream completes after the 3 signals", ncclSuccess);
  } else {
    float *dev;
    cudaMalloc((void **)&dev, CHUNK * sizeof(float));
    for (int c = 0; c < 2; c++) {
      ncclWaitSignalDesc_t d = {1, 0, 0, 0};
      rc = ncclWaitSignal(1, &d, comm, s);
      check(rank, rc == ncclSuccess, "wait for one signal from rank 0", rc);
      cudaMemcpyAsync(dev, buf + 4096 + c * (1 << 20), CHUNK * sizeof(float), cudaMemcpyDeviceToDevice, s);
      cudaStreamSynchronize(s);
      cudaMemcpy(h, dev, CHUNK * sizeof(float), cudaMemcpyDeviceToHost);
      long wrong = 0;
      for (size_t i = 0; i < CHUNK; i++) wrong += h[i] != value(c + 1, i);
      char what[96];
      snprintf(what, sizeof what, "chunk %d exact after its signal (%ld wrong)", c + 1, wrong);
      check(rank, wrong == 0, what, ncclSuccess);
    }
    for (int k = 0; k < 3; k++) {
      rc = ncclSignal(0, 2, 0, 0, comm, s);
      check(rank, rc == ncclSuccess, "signal rank 0 (sigIdx 2)", rc);
    }
    cudaStreamSynchronize(s);
    cudaFree(dev);
  }
  rc = ncclCommWindowDeregister(comm, win);
  check(rank, rc == ncclSuccess, "window deregister", rc);
  ncclMemFree(buf);
  ncclCommDestroy(comm);
  free(h);
  return failures != 0;
}

int main(int argc, char **argv) {
  hosts = argc > 1 && strcmp(argv[1], "-H") == 0;
  alarm(60);
  int fds[2];
  if (pipe(fds) != 0) return 2;
  fflush(stdout);
  /* Fork before any CUDA or NCCL call; rank 0 makes the id and passes it through the pipe. */
  pid_t child = fork();
  ncclUniqueId id;
  if (child == 0) {
    close(fds[1]);
    if (read(fds[0], &id, sizeof id) != (ssize_t)sizeof id) _exit(3);
    _exit(run(1, id));
  }
  close(fds[0]);
  if (hosts) setenv("NCCL_HOSTID", "rma2p-host-a", 1);
  ncclResult_t rc = ncclGetUniqueId(&id);
  if (rc != ncclSuccess || write(fds[1], &id, sizeof id) != (ssize_t)sizeof id) {
    printf("FAIL ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
    kill(child, SIGKILL);
    return 1;
  }
  int bad = run(0, id);
  int status = 0;
  waitpid(child, &status, 0);
  int child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!child_ok)
    printf("FAIL rank 1 process: %s %d\n", WIFEXITED(status) ? "exit" : "signal",
           WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  printf("rma2p: %s\n", bad || !child_ok ? "FAILED" : "all passed");
  return bad || !child_ok;
}
