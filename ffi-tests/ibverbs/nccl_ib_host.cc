/* nccl_ib_host.cc: drives NVIDIA's own IB transport (ncclNetIb of net_ib.cc, compiled from
 * NVIDIA's NCCL sources by scripts/nccl-ib-host.sh, with no GPU) over the software verbs
 * device, as NCCL's proxy would with host memory: two processes (fork), rank 0 listens and
 * accepts, rank 1 connects; host buffers registered with regMr; for each size a receive
 * (irecv, one buffer) and a send (isend) tested to completion, the received bytes and size
 * exact; then a grouped receive of 2 buffers (the multi-receive path: sizes written by RDMA);
 * then closes. Prints "ok"/"FAIL" lines and "N passed, M failed"; exit 0 only when all pass.
 * The stubs at the end stand for the parts of NCCL the transport links to but this run does
 * not reach (CUDA, the GDAKI GIN, the environment plugin). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "net.h"

static int passed, failed;
static const char* who = "?";

static void check(bool cond, const char* what) {
  (cond ? passed : failed)++;
  printf("%s [%s] %s\n", cond ? "ok   " : "FAIL ", who, what);
  fflush(stdout);
}

static void die(const char* what) {
  printf("FAIL  [%s] fatal: %s\n", who, what);
  fflush(stdout);
  exit(2);
}

static double now() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Calls f() until it yields a non-null handle or 20 s pass. */
template <typename F> static void* until_ready(F f, const char* what) {
  void* h = NULL;
  double t0 = now();
  while (h == NULL) {
    if (f(&h) != ncclSuccess) die(what);
    if (h == NULL && now() - t0 > 20) die(what);
  }
  return h;
}

static void wait_done(void* req, int* sizes, const char* what) {
  int done = 0;
  double t0 = now();
  while (!done) {
    if (ncclNetIb.test(req, &done, sizes) != ncclSuccess) die(what);
    if (!done && now() - t0 > 20) die(what);
  }
}

static unsigned char pat(size_t i, size_t seed) { return (unsigned char)(i * 131 + (i >> 11) + seed); }

static const size_t kSizes[] = {0, 12, 1028, 65540, 1048580, 4194304 + 8};
static const size_t kBuf = 8 << 20;

int main() {
  int p2c[2], c2p[2];
  if (pipe(p2c) || pipe(c2p)) return 2;
  pid_t pid = fork();
  if (pid < 0) return 2;
  int rank = pid == 0;
  who = rank ? "send" : "recv";
  int wfd = rank ? c2p[1] : p2c[1], rfd = rank ? p2c[0] : c2p[0];

  void* ctx = NULL;
  ncclNetCommConfig_t config = {};
  config.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF;
  if (ncclNetIb.init(&ctx, 1, &config, NULL, NULL) != ncclSuccess) die("ncclNetIb.init");
  int ndev = 0;
  ncclNetProperties_t props;
  check(ncclNetIb.devices(&ndev) == ncclSuccess && ndev == 1, "one IB device");
  if (ndev < 1 || ncclNetIb.getProperties(0, &props) != ncclSuccess) die("getProperties");
  printf("      device %s speed %d port %d ptrSupport %d pciPath %s maxComms %d\n", props.name,
         props.speed, props.port, props.ptrSupport, props.pciPath ? props.pciPath : "(none)",
         props.maxComms);
  check(strcmp(props.name, "soft_0") == 0 && props.speed == 100000 && props.ptrSupport == NCCL_PTR_HOST,
        "soft_0, 100 Gb/s, host memory only (no GPU Direct, no dma-buf)");

  char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* comm = NULL;
  void* lcomm = NULL;
  if (rank == 0) {
    if (ncclNetIb.listen(ctx, 0, handle, &lcomm) != ncclSuccess) die("listen");
    if (write(wfd, handle, sizeof handle) != (ssize_t)sizeof handle) die("pipe");
    comm = until_ready([&](void** h) { return ncclNetIb.accept(lcomm, h, NULL); }, "accept");
  } else {
    size_t got = 0;
    while (got < sizeof handle) {
      ssize_t r = read(rfd, handle + got, sizeof handle - got);
      if (r <= 0) die("pipe");
      got += (size_t)r;
    }
    comm = until_ready([&](void** h) {
      ncclNetDeviceHandle_t* dh = NULL;
      return ncclNetIb.connect(ctx, 0, handle, h, &dh);
    }, "connect");
  }
  check(comm != NULL, rank ? "connect: QPs INIT, RTR, RTS" : "accept: QPs INIT, RTR, RTS");

  char* buf = (char*)aligned_alloc(4096, 2 * kBuf);
  if (!buf) die("alloc");
  memset(buf, 0, 2 * kBuf);
  void* mh = NULL;
  check(ncclNetIb.regMr(comm, buf, 2 * kBuf, NCCL_PTR_HOST, &mh) == ncclSuccess && mh,
        "regMr of host memory (NCCL's flags: remote atomic, relaxed ordering)");

  for (size_t s = 0; s < sizeof kSizes / sizeof kSizes[0]; s++) {
    size_t size = kSizes[s];
    int tag = 7 + (int)s;
    char what[128];
    if (rank == 0) {
      memset(buf, 0xee, size + 64);
      void* data = buf;
      size_t cap = kBuf;
      void* req = until_ready([&](void** h) { return ncclNetIb.irecv(comm, 1, &data, &cap, &tag, &mh, NULL, h); }, "irecv");
      int got = -1;
      wait_done(req, &got, "test(recv)");
      bool same = got == (int)size;
      for (size_t i = 0; i < size && same; i++) same = (unsigned char)buf[i] == pat(i, s);
      same = same && (unsigned char)buf[size] == 0xee;
      snprintf(what, sizeof what, "%zu bytes received exactly, size reported", size);
      check(same, what);
    } else {
      for (size_t i = 0; i < size; i++) buf[i] = (char)pat(i, s);
      void* req = until_ready([&](void** h) { return ncclNetIb.isend(comm, buf, size, tag, mh, NULL, h); }, "isend");
      int sent = -1;
      wait_done(req, &sent, "test(send)");
      snprintf(what, sizeof what, "%zu bytes sent", size);
      check(sent == (int)size, what);
    }
  }

  /* a grouped receive of two buffers: the sender's sizes land by RDMA in the sizes fifo */
  const size_t two[2] = {65536 + 4, 300};
  if (rank == 0) {
    void* data[2] = {buf, buf + kBuf};
    size_t caps[2] = {kBuf, kBuf};
    int tags[2] = {100, 101};
    void* mhs[2] = {mh, mh};
    memset(buf, 0, 2 * kBuf);
    void* req = until_ready([&](void** h) { return ncclNetIb.irecv(comm, 2, data, caps, tags, mhs, NULL, h); }, "irecv(2)");
    int got[2] = {-1, -1};
    wait_done(req, got, "test(recv 2)");
    bool same = got[0] == (int)two[0] && got[1] == (int)two[1];
    for (size_t i = 0; i < two[0] && same; i++) same = (unsigned char)buf[i] == pat(i, 50);
    for (size_t i = 0; i < two[1] && same; i++) same = (unsigned char)buf[kBuf + i] == pat(i, 51);
    check(same, "grouped receive of 2: both buffers exact, both sizes");
  } else {
    for (size_t i = 0; i < two[0]; i++) buf[i] = (char)pat(i, 50);
    for (size_t i = 0; i < two[1]; i++) buf[kBuf + i] = (char)pat(i, 51);
    void* r0 = until_ready([&](void** h) { return ncclNetIb.isend(comm, buf, two[0], 100, mh, NULL, h); }, "isend(a)");
    void* r1 = until_ready([&](void** h) { return ncclNetIb.isend(comm, buf + kBuf, two[1], 101, mh, NULL, h); }, "isend(b)");
    int s0 = -1, s1 = -1;
    wait_done(r0, &s0, "test(send a)");
    wait_done(r1, &s1, "test(send b)");
    check(s0 == (int)two[0] && s1 == (int)two[1], "two sends into a grouped receive");
  }

  /* both sides done before either closes (a close destroys the QPs) */
  char c = 'x';
  if (write(wfd, &c, 1) != 1 || read(rfd, &c, 1) != 1) die("pipe");
  bool closed = ncclNetIb.deregMr(comm, mh) == ncclSuccess &&
                (rank ? ncclNetIb.closeSend(comm) : ncclNetIb.closeRecv(comm)) == ncclSuccess &&
                (rank || ncclNetIb.closeListen(lcomm) == ncclSuccess) &&
                ncclNetIb.finalize(ctx) == ncclSuccess;
  check(closed, "deregMr, close, finalize");
  if (rank) {
    printf("send: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
  }
  int st = 0;
  waitpid(pid, &st, 0);
  check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the sending process passed");
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

/* ---- stubs: what net_ib.cc's object links to and this run does not reach */
extern "C" {
cudaError_t cudaGetDevice(int*) { return cudaErrorNoDevice; }
cudaError_t cudaDeviceGetAttribute(int*, cudaDeviceAttr, int) { return cudaErrorNoDevice; }
cudaError_t cudaDeviceGetPCIBusId(char*, int, int) { return cudaErrorNoDevice; }
const char* cudaGetErrorString(cudaError_t) { return "no CUDA in this test"; }
}
const char* ncclEnvPluginGetEnv(const char* name) { return getenv(name); }
bool ncclEnvPluginInitialized() { return true; }
void ncclInitEnv() {}
ncclResult_t ncclGinGdakiCreateContext(void*, int, int, void**, ncclNetDeviceHandle_v7_t**) { return ncclInternalError; }
ncclResult_t ncclGinGdakiDeregMrSym(void*, void*) { return ncclInternalError; }
ncclResult_t ncclGinGdakiDestroyContext(void*) { return ncclInternalError; }
ncclResult_t ncclGinGdakiProgress(void*) { return ncclInternalError; }
ncclResult_t ncclGinGdakiQueryLastError(void*, bool*) { return ncclInternalError; }
ncclResult_t ncclGinGdakiRegMrSym(void*, void*, unsigned long, int, void**, void**) { return ncclInternalError; }
