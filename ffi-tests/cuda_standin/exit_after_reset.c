/* Streams the library keeps must outlive neither their context nor be destroyed after it is
 * gone. Two ranks as threads of one process, each on a stand-in device of its own
 * (cuda_standin.c), each making its communicator with ncclCommInitRank, running a few
 * collectives (the first connects the ring, zeroing the connection buffers through the
 * library's synchronous helpers on this thread) and destroying it. Then, while both
 * threads are still alive, the main thread resets both devices' primary contexts, as
 * cudaDeviceReset or the CUDA runtime's teardown at process exit do (which run before the
 * destructors of the threads that are still alive), and only then do the threads end. The
 * stand-in aborts the process when a stream of a reset primary context is destroyed: the real
 * driver reads freed memory there and crashes (seen with NVIDIA's nccl-tests under MPI, one
 * rank per process, at exit).
 * Prints "exit_after_reset: ok" and exits 0 when every call succeeded and the threads ended;
 * 1 on a failed call; the stand-in's abort otherwise.
 * Built by ffi-tests/run.sh against the stand-in's libcuda.so.1 and our libnccl.so. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "driver.h"
#include "nccl.h"

#define RANKS 2
#define COUNT 1024

static ncclUniqueId id;
static pthread_barrier_t destroyed, reset;

#define CHECK(what, ok)                                                 \
  do {                                                                  \
    if (!(ok)) {                                                        \
      printf("FAIL %s (line %d)\n", what, __LINE__);                    \
      exit(1);                                                          \
    }                                                                   \
  } while (0)
#define CU(call) CHECK(#call, (call) == CUDA_SUCCESS)
#define NCCL(call) CHECK(#call, (call) == ncclSuccess)

/* One rank: its communicator from start to destroy, then alive until the contexts are reset. */
static void *rank(void *arg) {
  int r = (int)(long)arg;
  CUcontext ctx;
  CUstream stream;
  CUdeviceptr send, recv;
  ncclComm_t comm;
  CU(cu.primaryCtxRetain(&ctx, r));
  CU(cu.ctxSetCurrent(ctx));
  NCCL(ncclCommInitRank(&comm, RANKS, id, r));
  CU(cu.streamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CU(cu.memAlloc(&send, COUNT * sizeof(float) * RANKS));
  CU(cu.memAlloc(&recv, COUNT * sizeof(float) * RANKS));
  for (int i = 0; i < 3; i++) {
    NCCL(ncclAllReduce((void *)send, (void *)recv, COUNT, ncclFloat, ncclSum, comm, (cudaStream_t)stream));
    NCCL(ncclAllGather((void *)send, (void *)recv, COUNT, ncclFloat, comm, (cudaStream_t)stream));
  }
  CU(cu.streamSynchronize(stream));
  NCCL(ncclCommDestroy(comm));
  CU(cu.memFree(send));
  CU(cu.memFree(recv));
  CU(cu.streamDestroy(stream));
  pthread_barrier_wait(&destroyed);
  pthread_barrier_wait(&reset);
  return NULL; /* the thread's destructors run now, after the reset */
}

int main(void) {
  setenv("CUDA_STANDIN_DEVICES", "2", 1);
  loadDriver();
  CU(cu.init(0));
  NCCL(ncclGetUniqueId(&id));
  pthread_barrier_init(&destroyed, NULL, RANKS + 1);
  pthread_barrier_init(&reset, NULL, RANKS + 1);
  pthread_t threads[RANKS];
  for (long r = 0; r < RANKS; r++) CHECK("pthread_create", pthread_create(&threads[r], NULL, rank, (void *)r) == 0);
  pthread_barrier_wait(&destroyed);
  for (int r = 0; r < RANKS; r++) CU(cu.primaryCtxReset(r));
  pthread_barrier_wait(&reset);
  for (int r = 0; r < RANKS; r++) CHECK("pthread_join", pthread_join(threads[r], NULL) == 0);
  printf("exit_after_reset: ok\n");
  return 0;
}
