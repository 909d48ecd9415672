/* The entry points NCCL 2.31-2.32 added, on one GPU, against whichever libnccl.so.2 the loader
 * finds (oxccl's, or NVIDIA's 2.32.3 as the reference): properties, memory statistics,
 * suspend/resume (with cudaMemGetInfo around them), windows and their pointers, one-sided
 * put/signal/wait, per-call configured collectives, the parameter API, grow from NR to
 * 2*NR ranks (blocking and non-blocking; a consumed id and a size not larger refused), and
 * encryption. Every case prints one line
 *     CASE <name> rc=<code> <observations> | <ncclGetLastError>
 * so that two libraries' runs can be compared line by line; data checks print ok/WRONG.
 * Ranks are threads-free: NR communicators on GPU 0 in this process (ncclCommInitAll), driven
 * with group calls; grow uses one thread per rank. An alarm bounds the run.
 *
 * usage: api232 [-n NR] [-d DUMPFILE] [-s SECTIONS]   (NR default 2; SECTIONS: a string of
 *        letters p m w r c a g e = properties, memory, windows, rma, config, params, grow,
 *        encryption; default all) */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* nccl_device/host.h is C++ only: the few host functions used here, by their C ABI. */
typedef struct {
  size_t size;
  unsigned int magic, version;
  int rank, nRanks, cudaDev, nvmlDev;
  bool deviceApiSupport, multimemSupport;
  int ginType, nLsaTeams;
  bool hostRmaSupport;
  int railedGinType;
  uint64_t commHash;
  int ginMinStride, ginConnectionType;
  bool ginSupport[64];
  size_t devCommRuntimeVersionSize;
  bool cftSupport, cftMulticastSupport, cftCountedSupport;
} Props;
typedef struct { int nRanks, rank, stride; } Team;
ncclResult_t ncclCommQueryProperties(ncclComm_t comm, Props *props);
ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void **outPtr);
ncclResult_t ncclGetMultimemDevicePointer(ncclWindow_t window, size_t offset, void *mcBasePtr, void **outPtr);
ncclResult_t ncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank, void **outPtr);
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void **outPtr);
ncclResult_t ncclGetMultimemDeviceLeInfo(ncclWindow_t window, size_t offset, uint32_t *leId, size_t *leOffset);
ncclResult_t ncclGetPeerDeviceLeInfo(ncclWindow_t window, size_t offset, int peerWorld, uint32_t *leId, size_t *leOffset);
Team ncclTeamCft(ncclComm_t comm, int mode);
Team ncclTeamCftMultimem(ncclComm_t comm);
Team ncclTeamLsa(ncclComm_t comm);

#define MAXR 8
static int NR = 2;
static ncclComm_t comms[MAXR];
static cudaStream_t streams[2 * MAXR]; /* one per rank, grown communicators' too */
static const char *sections = "pmwrcage";
static const char *dumpfile;

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "CASE timeout rc=-1 the run hung (alarm)\n";
  if (write(1, msg, sizeof msg - 1) < 0) _exit(2);
  _exit(2);
}

static const char *last(ncclComm_t c) {
  const char *s = ncclGetLastError(c);
  return s ? s : "";
}

#define CASE(name, rc, ...)                                     \
  do {                                                          \
    int rc_ = (int)(rc);                                        \
    printf("CASE %-28s rc=%d ", name, rc_);                     \
    printf(__VA_ARGS__);                                        \
    printf(" | %s\n", rc_ == ncclSuccess ? "" : last(NULL));    \
    fflush(stdout);                                             \
  } while (0)

/* Printed before a call that may block, so that a hang names where it happened. */
static void step(const char *what) {
  printf("STEP %s\n", what);
  fflush(stdout);
}

static size_t gpu_used(void) {
  size_t freeb = 0, total = 0;
  cudaMemGetInfo(&freeb, &total);
  return total - freeb;
}

/* All-reduce (sum) of n floats over every rank, in place; returns wrong elements or -rc. */
static long allreduce(float **buf, size_t n, ncclComm_t *cs, int nr, ncclResult_t *rcOut) {
  float *h = malloc(n * sizeof(float));
  for (int r = 0; r < nr; r++) {
    for (size_t i = 0; i < n; i++) h[i] = (float)(r + 1 + (int)(i % 7));
    cudaMemcpy(buf[r], h, n * sizeof(float), cudaMemcpyHostToDevice);
  }
  ncclGroupStart();
  ncclResult_t rc = ncclSuccess;
  for (int r = 0; r < nr; r++) {
    ncclResult_t x = ncclAllReduce(buf[r], buf[r], n, ncclFloat, ncclSum, cs[r], streams[r]);
    if (rc == ncclSuccess) rc = x;
  }
  ncclResult_t end = ncclGroupEnd();
  if (rc == ncclSuccess) rc = end;
  *rcOut = rc;
  long wrong = 0;
  if (rc == ncclSuccess) {
    for (int r = 0; r < nr; r++) cudaStreamSynchronize(streams[r]);
    for (int r = 0; r < nr; r++) {
      cudaMemcpy(h, buf[r], n * sizeof(float), cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int q = 0; q < nr; q++) want += (float)(q + 1 + (int)(i % 7));
        if (h[i] != want) wrong++;
      }
    }
  }
  free(h);
  return wrong;
}

static void properties(void) {
  for (int r = 0; r < NR; r++) {
    Props p;
    memset(&p, 0x5a, sizeof p);
    p.size = sizeof p;
    p.magic = 0xcafebeef;
    p.version = NCCL_VERSION_CODE;
    ncclResult_t rc = ncclCommQueryProperties(comms[r], &p);
    CASE("query_properties", rc,
         "rank %d nRanks %d cudaDev %d nvmlDev %d devApi %d multimem %d ginType %d nLsaTeams %d "
         "hostRma %d railedGin %d hashNonZero %d ginMinStride %d ginConn %d ginSupport0-5 %d%d%d%d%d%d "
         "rtSize %zu cft %d cftMc %d cftCounted %d",
         p.rank, p.nRanks, p.cudaDev, p.nvmlDev, p.deviceApiSupport, p.multimemSupport, p.ginType,
         p.nLsaTeams, p.hostRmaSupport, p.railedGinType, p.commHash != 0, p.ginMinStride,
         p.ginConnectionType, p.ginSupport[0], p.ginSupport[1], p.ginSupport[2], p.ginSupport[3],
         p.ginSupport[4], p.ginSupport[5], p.devCommRuntimeVersionSize, p.cftSupport,
         p.cftMulticastSupport, p.cftCountedSupport);
  }
  Props p;
  memset(&p, 0, sizeof p);
  CASE("query_properties_uninit", ncclCommQueryProperties(comms[0], &p), "magic 0");
  CASE("query_properties_null", ncclCommQueryProperties(comms[0], NULL), "props NULL");
  Team t = ncclTeamCft(comms[0], 0);
  printf("CASE %-28s rc=0 nRanks %d rank %d stride %d | %s\n", "team_cft", t.nRanks, t.rank, t.stride, last(NULL));
  t = ncclTeamCftMultimem(comms[0]);
  printf("CASE %-28s rc=0 nRanks %d rank %d stride %d | %s\n", "team_cft_multimem", t.nRanks, t.rank, t.stride, last(NULL));
  t = ncclTeamLsa(comms[NR - 1]);
  printf("CASE %-28s rc=0 nRanks %d rank %d stride %d\n", "team_lsa", t.nRanks, t.rank, t.stride);
}

static void mem_stats(const char *when) {
  for (int r = 0; r < NR; r++) {
    uint64_t v[4] = {0};
    ncclResult_t rc = ncclSuccess;
    for (int s = 0; s < 4; s++) {
      ncclResult_t x = ncclCommMemStats(comms[r], (ncclCommMemStat_t)s, &v[s]);
      if (x != ncclSuccess) rc = x;
    }
    char name[64];
    snprintf(name, sizeof name, "memstats_%s_r%d", when, r);
    CASE(name, rc, "suspendable %llu suspended %llu persist %llu total %llu",
         (unsigned long long)v[0], (unsigned long long)v[1], (unsigned long long)v[2],
         (unsigned long long)v[3]);
  }
}

/* Suspend or resume every rank at once, one thread per rank (the calls may wait for each other). */
struct sr_arg {
  int rank, resume;
  ncclResult_t rc;
};
static void *sr_thread(void *p) {
  struct sr_arg *a = p;
  cudaSetDevice(0);
  a->rc = a->resume ? ncclCommResume(comms[a->rank]) : ncclCommSuspend(comms[a->rank], NCCL_SUSPEND_MEM);
  return NULL;
}
static void suspend_resume_all(int resume) {
  struct sr_arg a[MAXR];
  pthread_t th[MAXR];
  step(resume ? "resume all ranks" : "suspend all ranks");
  for (int r = 0; r < NR; r++) {
    a[r] = (struct sr_arg){r, resume, ncclSuccess};
    pthread_create(&th[r], NULL, sr_thread, &a[r]);
  }
  for (int r = 0; r < NR; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < NR; r++) CASE(resume ? "resume" : "suspend", a[r].rc, "rank %d", r);
}

static void memory(void) {
  size_t n = 1 << 20;
  float *buf[MAXR];
  size_t base = gpu_used();
  for (int r = 0; r < NR; r++) cudaMalloc((void **)&buf[r], n * sizeof(float));
  mem_stats("after_init");
  ncclResult_t rc;
  long wrong = allreduce(buf, n, comms, NR, &rc);
  CASE("allreduce_before_suspend", rc, "wrong %ld", wrong);
  mem_stats("after_allreduce");
  size_t before = gpu_used();
  printf("CASE %-28s rc=0 used_over_base_MiB %.1f\n", "gpu_used_active", (before - base) / 1048576.0);
  uint64_t bad;
  CASE("memstats_bad_stat", ncclCommMemStats(comms[0], (ncclCommMemStat_t)7, &bad), "stat 7");
  CASE("memstats_null_value", ncclCommMemStats(comms[0], ncclStatGpuMemTotal, NULL), "value NULL");
  if (NR == 1) CASE("suspend_bad_flags", ncclCommSuspend(comms[0], 0x10), "flags 0x10");
  suspend_resume_all(0);
  size_t suspended = gpu_used();
  printf("CASE %-28s rc=0 used_over_base_MiB %.1f released_MiB %.1f\n", "gpu_used_suspended",
         (suspended - base) / 1048576.0, ((double)before - (double)suspended) / 1048576.0);
  mem_stats("suspended");
  if (NR == 1) CASE("suspend_twice", ncclCommSuspend(comms[0], NCCL_SUSPEND_MEM), "again");
  step("allreduce while suspended");
  wrong = allreduce(buf, n, comms, NR, &rc);
  CASE("allreduce_while_suspended", rc, "wrong %ld", wrong);
  suspend_resume_all(1);
  if (NR == 1) CASE("resume_twice", ncclCommResume(comms[0]), "again");
  printf("CASE %-28s rc=0 used_over_base_MiB %.1f\n", "gpu_used_resumed", (gpu_used() - base) / 1048576.0);
  mem_stats("resumed");
  wrong = allreduce(buf, n, comms, NR, &rc);
  CASE("allreduce_after_resume", rc, "wrong %ld", wrong);
  for (int r = 0; r < NR; r++) cudaFree(buf[r]);
}

static ncclWindow_t wins[MAXR];
static float *wbuf[MAXR];
static const size_t WBYTES = 4 << 20;

static void windows(void) {
  ncclResult_t rc;
  for (int r = 0; r < NR; r++) {
    rc = ncclMemAlloc((void **)&wbuf[r], WBYTES);
    if (rc != ncclSuccess) { CASE("mem_alloc", rc, "rank %d", r); return; }
    cudaMemset(wbuf[r], 0, WBYTES);
  }
  step("window register");
  ncclGroupStart();
  for (int r = 0; r < NR; r++) ncclCommWindowRegister(comms[r], wbuf[r], WBYTES, &wins[r], NCCL_WIN_COLL_SYMMETRIC);
  rc = ncclGroupEnd();
  CASE("window_register", rc, "symmetric, %zu bytes from ncclMemAlloc", WBYTES);
  if (rc != ncclSuccess) { wins[0] = NULL; return; }
  for (int r = 0; r < NR; r++) {
    void *p = NULL;
    rc = ncclWinGetUserPtr(comms[r], wins[r], &p);
    CASE("win_get_user_ptr", rc, "rank %d matches %d", r, p == (void *)wbuf[r]);
  }
  for (int peer = 0; peer < NR; peer++) {
    void *p = NULL;
    rc = ncclGetPeerDevicePointer(wins[0], 64, peer, &p);
    CASE("peer_device_pointer", rc, "rank 0 peer %d nonNull %d own %d", peer, p != NULL, p == (void *)((char *)wbuf[0] + 64));
    p = NULL;
    rc = ncclGetLsaDevicePointer(wins[0], 64, peer, &p);
    CASE("lsa_device_pointer", rc, "rank 0 lsaRank %d nonNull %d", peer, p != NULL);
  }
  /* Load/store through a peer pointer: write 7.0 into rank 1's copy from the host side. */
  if (NR > 1) {
    void *p = NULL;
    if (ncclGetPeerDevicePointer(wins[0], 0, 1, &p) == ncclSuccess && p) {
      float seven = 7.0f, back = 0;
      cudaMemcpy(p, &seven, sizeof seven, cudaMemcpyHostToDevice);
      cudaMemcpy(&back, wbuf[1], sizeof back, cudaMemcpyDeviceToHost);
      CASE("peer_pointer_reaches_peer", ncclSuccess, "%s", back == 7.0f ? "ok" : "WRONG");
      cudaMemset(wbuf[1], 0, sizeof back);
    }
  }
  {
    void *p = NULL;
    size_t leOff = 0;
    uint32_t le = 0;
    CASE("peer_pointer_bad_peer", ncclGetPeerDevicePointer(wins[0], 0, NR + 3, &p), "peer %d", NR + 3);
    CASE("peer_pointer_past_end", ncclGetPeerDevicePointer(wins[0], WBYTES + 8, 0, &p), "offset past end");
    CASE("peer_pointer_null_win", ncclGetPeerDevicePointer(NULL, 0, 0, &p), "window NULL");
    CASE("lsa_multimem_pointer", ncclGetLsaMultimemDevicePointer(wins[0], 0, &p), "NVLS off");
    CASE("multimem_pointer", ncclGetMultimemDevicePointer(wins[0], 0, NULL, &p), "handle NULL");
    CASE("multimem_le_info", ncclGetMultimemDeviceLeInfo(wins[0], 0, &le, &leOff), "-");
    CASE("peer_le_info", ncclGetPeerDeviceLeInfo(wins[0], 0, 0, &le, &leOff), "-");
    CASE("win_get_user_ptr_null_win", ncclWinGetUserPtr(comms[0], NULL, &p), "-");
  }
  /* A second registration (default flags) inside the first window's memory, deregistered. */
  ncclWindow_t sym[MAXR];
  step("symmetric window register");
  ncclGroupStart();
  for (int r = 0; r < NR; r++) ncclCommWindowRegister(comms[r], (char *)wbuf[r] + (2 << 20), 1 << 20, &sym[r], NCCL_WIN_DEFAULT);
  rc = ncclGroupEnd();
  CASE("window_register_second", rc, "flags 0, second half, 1 MiB");
  if (rc == ncclSuccess) {
    ncclGroupStart();
    for (int r = 0; r < NR; r++) ncclCommWindowDeregister(comms[r], sym[r]);
    CASE("window_deregister_second", ncclGroupEnd(), "-");
  }
  {
    float *plain[MAXR];
    ncclWindow_t pw[MAXR];
    for (int r = 0; r < NR; r++) cudaMalloc((void **)&plain[r], 1 << 20);
    step("cudaMalloc window register");
    ncclGroupStart();
    for (int r = 0; r < NR; r++) ncclCommWindowRegister(comms[r], plain[r], 1 << 20, &pw[r], NCCL_WIN_DEFAULT);
    rc = ncclGroupEnd();
    CASE("window_register_cudamalloc", rc, "cudaMalloc buffer");
    if (rc == ncclSuccess) {
      ncclGroupStart();
      for (int r = 0; r < NR; r++) ncclCommWindowDeregister(comms[r], pw[r]);
      ncclGroupEnd();
    }
    for (int r = 0; r < NR; r++) cudaFree(plain[r]);
  }
}

static void rma(void) {
  if (!wins[0] || NR < 2) { printf("CASE rma skipped: no window\n"); return; }
  size_t n = 1 << 18; /* 1 MiB of floats */
  /* NVIDIA's library takes the source from a registered window too: rank 0's own copy. */
  float *src = (float *)((char *)wbuf[0] + (2 << 20));
  float *h = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) h[i] = (float)(i % 1000) + 0.5f;
  cudaMemcpy(src, h, n * sizeof(float), cudaMemcpyHostToDevice);
  ncclWaitSignalDesc_t d = {1, 0, 0, 0};
  /* Rank 0 puts into rank 1's window at offset 4096 with signal 0; rank 1 waits. */
  step("put+wait in a group");
  ncclGroupStart();
  ncclResult_t rp = ncclPutSignal(src, n, ncclFloat, 1, wins[0], 4096, 0, 0, 0, comms[0], streams[0]);
  ncclResult_t rw = ncclWaitSignal(1, &d, comms[1], streams[1]);
  ncclResult_t rg = ncclGroupEnd();
  CASE("put_signal", rp, "group rc %d", rg);
  CASE("wait_signal", rw, "-");
  if (rp == ncclSuccess && rw == ncclSuccess && rg == ncclSuccess) {
    /* A copy on rank 1's stream after the wait sees the data. */
    float *seen;
    cudaMalloc((void **)&seen, n * sizeof(float));
    cudaMemcpyAsync(seen, (char *)wbuf[1] + 4096, n * sizeof(float), cudaMemcpyDeviceToDevice, streams[1]);
    step("synchronize after put+wait");
    cudaError_t e0 = cudaStreamSynchronize(streams[0]), e1 = cudaStreamSynchronize(streams[1]);
    float *g = malloc(n * sizeof(float));
    cudaMemcpy(g, seen, n * sizeof(float), cudaMemcpyDeviceToHost);
    long wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += g[i] != h[i];
    CASE("put_data_after_wait", ncclSuccess, "cuda %d %d wrong %ld %s", e0, e1, wrong, wrong ? "WRONG" : "ok");
    free(g);
    cudaFree(seen);
  }
  /* Signals alone: rank 1 signals rank 0 three times on (sigIdx 0, ctx 0); rank 0 waits for 3. */
  step("signal x3 + wait 3");
  ncclGroupStart();
  ncclResult_t s[3];
  for (int k = 0; k < 3; k++) s[k] = ncclSignal(0, 0, 0, 0, comms[1], streams[1]);
  ncclWaitSignalDesc_t d3 = {3, 1, 0, 0};
  rw = ncclWaitSignal(1, &d3, comms[0], streams[0]);
  rg = ncclGroupEnd();
  CASE("signal_x3_wait3", s[0] | s[1] | s[2] | rw, "group rc %d sync %d %d", rg, cudaStreamSynchronize(streams[0]),
       cudaStreamSynchronize(streams[1]));
  /* Outside a group: each call on its own (the wait is stream-ordered, so it is issued last). */
  step("put, then wait, no group");
  rp = ncclPutSignal((char *)wbuf[1] + (2 << 20), 256, ncclFloat, 0, wins[1], 0, 0, 0, 0, comms[1], streams[1]);
  ncclWaitSignalDesc_t d4 = {1, 1, 0, 0};
  rw = ncclWaitSignal(1, &d4, comms[0], streams[0]);
  CASE("put_wait_no_group", rp | rw, "put %d wait %d sync %d %d", rp, rw, cudaStreamSynchronize(streams[0]),
       cudaStreamSynchronize(streams[1]));
  /* Other signal indices and contexts, and bad arguments. */
  CASE("signal_sigidx1", ncclSignal(0, 1, 0, 0, comms[1], streams[1]), "sigIdx 1 (default numRmaSig)");
  CASE("signal_ctx1", ncclSignal(0, 0, 1, 0, comms[1], streams[1]), "ctx 1 (default numRmaCtx)");
  CASE("signal_bad_peer", ncclSignal(NR + 2, 0, 0, 0, comms[1], streams[1]), "peer %d", NR + 2);
  CASE("signal_flags", ncclSignal(0, 0, 0, 1, comms[1], streams[1]), "flags 1");
  CASE("put_null_win", ncclPutSignal(src, 4, ncclFloat, 1, NULL, 0, 0, 0, 0, comms[0], streams[0]), "-");
  CASE("put_past_end", ncclPutSignal(src, n, ncclFloat, 1, wins[0], WBYTES - 16, 0, 0, 0, comms[0], streams[0]), "-");
  CASE("wait_null_descs", ncclWaitSignal(1, NULL, comms[0], streams[0]), "-");
  CASE("wait_zero", ncclWaitSignal(0, &d, comms[0], streams[0]), "nDesc 0");
  step("device synchronize after the bad-argument cases");
  cudaDeviceSynchronize();
  /* Balance the outstanding signals so the windows can be deregistered cleanly. */
  ncclGroupStart();
  for (int r = 0; r < NR; r++) ncclCommWindowDeregister(comms[r], wins[r]);
  CASE("window_deregister", ncclGroupEnd(), "-");
  for (int r = 0; r < NR; r++) ncclMemFree(wbuf[r]);
  free(h);
}

static void config_one(const char *name, ncclCollConfig_t *cfg) {
  size_t n = 1 << 16;
  float *buf[MAXR];
  float *hb = malloc(n * sizeof(float));
  for (int r = 0; r < NR; r++) {
    cudaMalloc((void **)&buf[r], n * sizeof(float));
    for (size_t i = 0; i < n; i++) hb[i] = (float)(r + 1);
    cudaMemcpy(buf[r], hb, n * sizeof(float), cudaMemcpyHostToDevice);
  }
  ncclGroupStart();
  ncclResult_t rc = ncclSuccess;
  for (int r = 0; r < NR; r++) {
    ncclResult_t x = ncclAllReduceConfig(buf[r], buf[r], n, ncclFloat, ncclSum, comms[r], streams[r], cfg);
    if (rc == ncclSuccess) rc = x;
  }
  ncclResult_t end = ncclGroupEnd();
  if (rc == ncclSuccess) rc = end;
  long wrong = 0;
  if (rc == ncclSuccess) {
    if (cfg && cfg->launchCompletionEvent) {
      cudaError_t e = cudaEventSynchronize(cfg->launchCompletionEvent);
      printf("CASE %-28s rc=0 event sync %d\n", "launch_event_sync", e);
    }
    for (int r = 0; r < NR; r++) {
      cudaStreamSynchronize(streams[r]);
      cudaMemcpy(hb, buf[r], n * sizeof(float), cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < n; i++) wrong += hb[i] != (float)(NR * (NR + 1) / 2);
    }
  }
  CASE(name, rc, "wrong %ld", wrong);
  for (int r = 0; r < NR; r++) cudaFree(buf[r]);
  free(hb);
}

static void configs(void) {
  config_one("allreduce_config_null", NULL);
  ncclCollConfig_t c = NCCL_COLLCONFIG_INITIALIZER;
  config_one("allreduce_config_default", &c);
  c.maxCTAs = 1;
  config_one("allreduce_config_max1", &c);
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER;
  c.minCTAs = 4;
  c.maxCTAs = 4;
  config_one("allreduce_config_ctas4", &c);
  const char *sel[] = {"ring", "tree", "nvls", "collnet", "^ring", "allreduce:ring", "bogus", ""};
  for (int i = 0; i < 8; i++) {
    for (int force = 1; force >= 0; force--) {
      c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER;
      c.algSelection = sel[i];
      c.forceAlgSelection = force;
      char name[64];
      snprintf(name, sizeof name, "alg_%s_force%d", sel[i][0] ? sel[i] : "empty", force);
      config_one(name, &c);
    }
  }
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER;
  c.CTAPolicy = NCCL_CTA_POLICY_ZERO;
  config_one("allreduce_config_policy_zero", &c);
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER;
  c.magic = 1;
  config_one("allreduce_config_bad_magic", &c);
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER;
  c.maxCTAs = 1000;
  config_one("allreduce_config_max1000", &c);
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER;
  c.minCTAs = 8;
  c.maxCTAs = 2;
  config_one("allreduce_config_min_gt_max", &c);
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER;
  ncclConfigExt_t ext = {NULL, {12345, 1}, {0}};
  ext.val.i = 3;
  c.ext = &ext;
  c.userProfilerTag = 42;
  config_one("allreduce_config_ext_tag", &c);
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER;
  cudaEvent_t ev;
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  c.launchCompletionEvent = ev;
  config_one("allreduce_config_event", &c);
  cudaEventDestroy(ev);
}

static void params(void) {
  const char **keys = NULL;
  int nkeys = -1;
  ncclResult_t rc = ncclParamGetAllParameterKeys(&keys, &nkeys);
  CASE("param_all_keys", rc, "%d keys", nkeys);
  const char *probe[] = {"NCCL_DEBUG", "NCCL_BUFFSIZE", "NCCL_NTHREADS", "NCCL_P2P_LEVEL", "NCCL_ALGO",
                         "NCCL_PROTO", "NCCL_SOCKET_IFNAME", "NCCL_NVLS_ENABLE", "NCCL_MULTI_RANK_GPU_ENABLE",
                         "NCCL_MAX_NCHANNELS", "NCCL_NET_GDR_LEVEL", "NCCL_CUMEM_ENABLE"};
  for (int i = 0; i < (int)(sizeof probe / sizeof probe[0]); i++) {
    const char *v = NULL;
    int len = -1;
    rc = ncclParamGetParameter(probe[i], &v, &len);
    ncclParamHandle_t h = NULL;
    ncclResult_t rb = ncclParamBind(&h, probe[i]);
    int64_t i64 = -7;
    ncclResult_t ri = h ? ncclParamGetI64(h, &i64) : rb;
    CASE("param", rc, "%s = '%s' (len %d) bind %d i64 rc %d value %lld", probe[i], v ? v : "(null)", len, rb, ri,
         (long long)i64);
  }
  if (keys && nkeys > 0) {
    printf("KEYS");
    for (int i = 0; i < nkeys; i++) printf(" %s", keys[i]);
    printf("\n");
  }
  if (dumpfile) {
    fflush(stdout);
    int saved = dup(1);
    FILE *f = freopen(dumpfile, "w", stdout);
    (void)f;
    ncclParamDumpAll();
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    printf("CASE %-28s rc=0 written to %s\n", "param_dump_all", dumpfile);
  }
}

/* Grow: the NR existing ranks and NR new ones (threads) build a 2*NR-rank communicator. */
struct grow_arg {
  int rank; /* existing rank index, or new rank's rank in the grown communicator */
  bool existing;
  const ncclUniqueId *id;
  ncclConfig_t *config;
  ncclComm_t out;
  ncclResult_t first; /* what ncclCommGrow returned */
  ncclResult_t rc;    /* and once a non-blocking one completed, its async state */
};
static void *grow_thread(void *p) {
  struct grow_arg *a = p;
  cudaSetDevice(0);
  if (a->existing)
    a->first = ncclCommGrow(comms[a->rank], 2 * NR, a->rank == 0 ? a->id : NULL, -1, &a->out, a->config);
  else
    a->first = ncclCommGrow(NULL, 2 * NR, a->id, a->rank, &a->out, a->config);
  a->rc = a->first;
  /* A non-blocking communicator may still be in progress after ncclSuccess: ask it. */
  bool nonblocking = a->config != NULL && !a->config->blocking;
  if (nonblocking && a->rc == ncclSuccess && a->out != NULL) a->rc = ncclInProgress;
  while (a->rc == ncclInProgress && a->out != NULL) {
    if (ncclCommGetAsyncError(a->out, &a->rc) != ncclSuccess) break;
    if (a->rc == ncclInProgress) usleep(1000);
  }
  return NULL;
}
/* Members 0..members-1 of the grown communicator call ncclCommGrow at once (the first NR are
 * the existing ranks); returns the last error of any member, ncclSuccess if none. */
static ncclResult_t grow_members(int members, const ncclUniqueId *id, ncclConfig_t *config,
                                 struct grow_arg *args) {
  pthread_t th[2 * MAXR];
  for (int i = 0; i < members; i++) {
    args[i] = (struct grow_arg){i, i < NR, id, config, NULL, ncclSuccess, ncclSuccess};
    pthread_create(&th[i], NULL, grow_thread, &args[i]);
  }
  for (int i = 0; i < members; i++) pthread_join(th[i], NULL);
  ncclResult_t all = ncclSuccess;
  for (int i = 0; i < members; i++)
    if (args[i].rc != ncclSuccess) all = args[i].rc;
  return all;
}
/* Every collective of the API on nr communicators (int32, exact values): all-reduce,
 * broadcast, reduce, all-gather, reduce-scatter, all-to-all, gather, scatter and a send/recv
 * ring, each with count elements per rank and roots chosen away from rank 0. Prints one CASE
 * per collective, named PREFIX_<collective>. */
enum { C_AR, C_BC, C_RED, C_AG, C_RS, C_A2A, C_GATHER, C_SCATTER, C_SENDRECV, C_COUNT };
static const char *coll_names[C_COUNT] = {"allreduce", "broadcast", "reduce", "allgather", "reducescatter",
                                          "alltoall", "gather", "scatter", "sendrecv"};
static int32_t input_at(int q, size_t j) { return (int32_t)(q * 1000 + (int)(j % 997)); }
/* The value rank r must hold at out[j] after collective c, or 0 with *check=false. */
static int32_t expected(int c, int r, size_t j, size_t count, int nr, bool *check) {
  int root = nr - 1;
  *check = true;
  int32_t sum = 0;
  switch (c) {
  case C_AR:
    if (j >= count) break;
    for (int q = 0; q < nr; q++) sum += input_at(q, j);
    return sum;
  case C_BC:
    if (j >= count) break;
    return input_at(root, j);
  case C_RED:
    if (j >= count || r != root) break;
    for (int q = 0; q < nr; q++) sum += input_at(q, j);
    return sum;
  case C_AG:
  case C_GATHER:
    if (c == C_GATHER && r != root) break;
    return input_at((int)(j / count), j % count);
  case C_RS:
    if (j >= count) break;
    for (int q = 0; q < nr; q++) sum += input_at(q, (size_t)r * count + j);
    return sum;
  case C_A2A:
    return input_at((int)(j / count), (size_t)r * count + j % count);
  case C_SCATTER:
    if (j >= count) break;
    return input_at(root, (size_t)r * count + j);
  case C_SENDRECV:
    if (j >= count) break;
    return input_at((r + nr - 1) % nr, j);
  }
  *check = false;
  return 0;
}
static ncclResult_t issue_collective(int c, int r, const int32_t *in, int32_t *out, size_t count, ncclComm_t comm,
                                     int nr, cudaStream_t s) {
  int root = nr - 1;
  switch (c) {
  case C_AR: return ncclAllReduce(in, out, count, ncclInt32, ncclSum, comm, s);
  case C_BC: return ncclBroadcast(in, out, count, ncclInt32, root, comm, s);
  case C_RED: return ncclReduce(in, out, count, ncclInt32, ncclSum, root, comm, s);
  case C_AG: return ncclAllGather(in, out, count, ncclInt32, comm, s);
  case C_RS: return ncclReduceScatter(in, out, count, ncclInt32, ncclSum, comm, s);
  case C_A2A: return ncclAlltoAll(in, out, count, ncclInt32, comm, s);
  case C_GATHER: return ncclGather(in, out, count, ncclInt32, root, comm, s);
  case C_SCATTER: return ncclScatter(in, out, count, ncclInt32, root, comm, s);
  case C_SENDRECV: {
    ncclResult_t a = ncclSend(in, count, ncclInt32, (r + 1) % nr, comm, s);
    ncclResult_t b = ncclRecv(out, count, ncclInt32, (r + nr - 1) % nr, comm, s);
    return a != ncclSuccess ? a : b;
  }
  }
  return ncclInvalidArgument;
}
static void every_collective(ncclComm_t *cs, int nr, size_t count, const char *prefix) {
  size_t total = count * (size_t)nr;
  int32_t *in[2 * MAXR], *out[2 * MAXR];
  int32_t *h = malloc(total * sizeof(int32_t));
  for (int r = 0; r < nr; r++) {
    cudaMalloc((void **)&in[r], total * sizeof(int32_t));
    cudaMalloc((void **)&out[r], total * sizeof(int32_t));
    for (size_t j = 0; j < total; j++) h[j] = input_at(r, j);
    cudaMemcpy(in[r], h, total * sizeof(int32_t), cudaMemcpyHostToDevice);
  }
  char name[64];
  for (int c = 0; c < C_COUNT; c++) {
    snprintf(name, sizeof name, "%s %s", prefix, coll_names[c]);
    step(name);
    for (int r = 0; r < nr; r++) cudaMemset(out[r], 0xff, total * sizeof(int32_t));
    cudaDeviceSynchronize();
    ncclResult_t rc = ncclGroupStart();
    for (int r = 0; r < nr && rc == ncclSuccess; r++) rc = issue_collective(c, r, in[r], out[r], count, cs[r], nr, streams[r]);
    ncclResult_t end = ncclGroupEnd();
    if (rc == ncclSuccess) rc = end;
    long wrong = 0;
    if (rc == ncclSuccess) {
      for (int r = 0; r < nr; r++) cudaStreamSynchronize(streams[r]);
      for (int r = 0; r < nr; r++) {
        cudaMemcpy(h, out[r], total * sizeof(int32_t), cudaMemcpyDeviceToHost);
        for (size_t j = 0; j < total; j++) {
          bool check;
          int32_t want = expected(c, r, j, count, nr, &check);
          if (check && h[j] != want) wrong++;
        }
      }
    }
    snprintf(name, sizeof name, "%s_%s_i32", prefix, coll_names[c]);
    CASE(name, rc, "%d ranks, %zu int32 per rank, wrong %ld", nr, count, wrong);
  }
  for (int r = 0; r < nr; r++) {
    cudaFree(in[r]);
    cudaFree(out[r]);
  }
  free(h);
}

/* Ranks, sizes and every collective on a grown communicator, then the old one; destroys it. */
static void check_grown(struct grow_arg *args, const char *what) {
  ncclComm_t g[2 * MAXR];
  char name[64];
  for (int i = 0; i < 2 * NR; i++) {
    g[i] = args[i].out;
    int rank = -1, count = -1;
    ncclCommUserRank(g[i], &rank);
    ncclCommCount(g[i], &count);
    snprintf(name, sizeof name, "%s_rank", what);
    printf("CASE %-28s rc=0 member %d rank %d count %d\n", name, i, rank, count);
  }
  step("allreduce on the grown communicator");
  size_t n = 1 << 18;
  float *buf[2 * MAXR];
  for (int i = 0; i < 2 * NR; i++) cudaMalloc((void **)&buf[i], n * sizeof(float));
  ncclResult_t rc;
  long wrong = allreduce(buf, n, g, 2 * NR, &rc);
  snprintf(name, sizeof name, "%s_allreduce", what);
  CASE(name, rc, "wrong %ld", wrong);
  every_collective(g, 2 * NR, 100003, what);
  wrong = allreduce(buf, n, comms, NR, &rc);
  snprintf(name, sizeof name, "old_comm_after_%s", what);
  CASE(name, rc, "wrong %ld", wrong);
  for (int i = 0; i < 2 * NR; i++) {
    ncclCommDestroy(g[i]);
    cudaFree(buf[i]);
  }
}
static void grow(void) {
  ncclUniqueId id;
  ncclResult_t rc = ncclCommGetUniqueId(comms[0], &id);
  CASE("comm_get_unique_id", rc, "root rank 0");
  ncclUniqueId id2;
  rc = ncclCommGetUniqueId(comms[0], &id2);
  CASE("comm_get_unique_id_again", rc, "while unconsumed, same id %d", rc == ncclSuccess && !memcmp(&id, &id2, sizeof id));
  if (rc != ncclSuccess) return;
  step("grow");
  struct grow_arg args[2 * MAXR];
  ncclResult_t all = grow_members(2 * NR, &id, NULL, args);
  CASE("comm_grow", all, "to %d ranks", 2 * NR);
  if (all == ncclSuccess) check_grown(args, "grown");

  ncclUniqueId id3;
  rc = ncclCommGetUniqueId(comms[0], &id3);
  CASE("comm_get_unique_id_after_grow", rc, "differs from the consumed one %d", memcmp(&id, &id3, sizeof id) != 0);
  if (rc == ncclSuccess) {
    step("non-blocking grow");
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    all = grow_members(2 * NR, &id3, &cfg, args);
    int inprogress = 0;
    for (int i = 0; i < 2 * NR; i++) inprogress += args[i].first == ncclInProgress;
    CASE("comm_grow_nonblocking", all, "to %d ranks, %d calls returned ncclInProgress", 2 * NR, inprogress);
    if (all == ncclSuccess) check_grown(args, "grown_nb");
  }

  ncclComm_t n = NULL;
  CASE("comm_grow_not_larger", ncclCommGrow(comms[0], NR, NULL, -1, &n, NULL), "nRanks %d = the communicator's", NR);
  /* Last: a library that does not refuse the consumed id may wait here for new ranks. */
  step("grow with the consumed id");
  all = grow_members(NR, &id, NULL, args);
  CASE("comm_grow_consumed_id", all, "existing ranks only, the first grow's id");
}

static void encryption(void) {
  ncclEncryptionConfig_t ec = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  ec.mode = NCCL_ENCRYPTION_MODE_PSK;
  ec.psk = "0123456789abcdef0123456789abcdef";
  CASE("set_encryption_psk", ncclSetEncryption(&ec), "32-byte key");
  ncclComm_t c2[MAXR];
  int devs[MAXR] = {0};
  ncclResult_t rc = ncclCommInitAll(c2, NR, devs);
  CASE("init_with_psk", rc, "%d ranks", NR);
  if (rc == ncclSuccess)
    for (int r = 0; r < NR; r++) ncclCommDestroy(c2[r]);
  ec.mode = NCCL_ENCRYPTION_MODE_NONE;
  ec.psk = NULL;
  CASE("set_encryption_none", ncclSetEncryption(&ec), "-");
}

int main(int argc, char **argv) {
  int opt;
  while ((opt = getopt(argc, argv, "n:d:s:")) != -1) {
    if (opt == 'n') NR = atoi(optarg);
    else if (opt == 'd') dumpfile = optarg;
    else if (opt == 's') sections = optarg;
  }
  if (NR < 1 || NR > MAXR) NR = 2;
  signal(SIGALRM, on_alarm);
  alarm(150);
  int v = 0;
  ncclGetVersion(&v);
  printf("CASE %-28s rc=0 %d\n", "version", v);
  cudaSetDevice(0);
  int devs[MAXR] = {0};
  ncclResult_t rc = ncclCommInitAll(comms, NR, devs);
  CASE("init_all", rc, "%d ranks on GPU 0", NR);
  if (rc != ncclSuccess) return 1;
  for (int r = 0; r < 2 * NR; r++) cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking);
  if (strchr(sections, 'p')) properties();
  if (strchr(sections, 'm')) memory();
  if (strchr(sections, 'w')) windows();
  if (strchr(sections, 'r')) rma();
  if (strchr(sections, 'c')) configs();
  if (strchr(sections, 'a')) params();
  if (strchr(sections, 'g')) grow();
  if (strchr(sections, 'e')) encryption();
  for (int r = 0; r < NR; r++) ncclCommDestroy(comms[r]);
  printf("CASE %-28s rc=0\n", "done");
  return 0;
}
