/* The test net plugin's CUDA memory path on a machine without a GPU: the plugin is compiled
 * in (its static functions called directly) and its dlopen("libcuda.so.1") finds the stand-in
 * driver cuda_stub.c, loaded first under that SONAME, whose copies run only when a query of
 * their stream finds them due. A sender and a receiver, both with "CUDA" registrations, move
 * messages of many sizes as the proxy does (8 slots, 8 requests in flight each way, each
 * completed in order), and every received slot must hold its message once its test says
 * done; then the sender closes, and a receive posted after the last message fails. Run once
 * per OXTEST_CUDA_CONTEXT (primary, own): the copies' context.
 * Usage: cuda_copies STUB_PATH   (prints "N passed, M failed"; exit 0 when all passed) */
#include "oxtest_net.c"

#include <stdarg.h>

#define SLOTS 8
#define SLOT_BYTES 65536
#define MESSAGES 400

static int passed, failed;

static void check(int ok, const char* what) {
  if (ok) {
    passed++;
    printf("  ok   %s\n", what);
  } else {
    failed++;
    printf("  FAIL %s\n", what);
  }
}

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt,
                   ...) {
  (void)flags, (void)file, (void)line;
  if (level > OX_LOG_WARN) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

static size_t sizeOf(int m) { return m % 9 == 4 ? 0 : (size_t)(m * 7919 + 1) % SLOT_BYTES; }
static char byteOf(int m, size_t i) { return (char)(i * 31 + (size_t)m * 7 + 1); }

static double now(void) { return oxSeconds(); }

int main(int argc, char** argv) {
  void* stub = argc == 2 ? dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) : NULL;
  if (stub == NULL) {
    fprintf(stderr, "usage: cuda_copies STUB_PATH (the stand-in libcuda.so.1): %s\n",
            argc == 2 ? dlerror() : "no path");
    return 2;
  }
  setvbuf(stdout, NULL, _IONBF, 0);
  setenv("OXTEST_PTR_CUDA", "1", 1);
  check(oxInit(logger) == ncclSuccess, "init with CUDA memory");
  char handle[OX_HANDLE_MAXSIZE] = {0};
  void *listen = NULL, *send = NULL, *recv = NULL;
  check(oxListen(0, handle, &listen) == ncclSuccess, "listen");
  double deadline = now() + 20;
  while ((send == NULL || recv == NULL) && now() < deadline) {
    if (send == NULL && oxConnect(0, handle, &send, NULL) != ncclSuccess) break;
    if (recv == NULL && oxAccept(listen, &recv, NULL) != ncclSuccess) break;
  }
  check(send && recv, "connect and accept");
  if (!send || !recv) goto out;
  char* sendBuf = calloc(SLOTS, SLOT_BYTES);
  char* recvBuf = calloc(SLOTS, SLOT_BYTES);
  void *smh = NULL, *rmh = NULL;
  check(oxRegMr(send, sendBuf, SLOTS * SLOT_BYTES, OX_PTR_CUDA, &smh) == ncclSuccess &&
            oxRegMr(recv, recvBuf, SLOTS * SLOT_BYTES, OX_PTR_CUDA, &rmh) == ncclSuccess,
        "CUDA registrations (through the stand-in driver)");
  void* sreq[SLOTS];
  void* rreq[SLOTS];
  int sPosted = 0, sDone = 0, rPosted = 0, rDone = 0, wrong = 0, errors = 0;
  deadline = now() + 60;
  while (rDone < MESSAGES && errors == 0 && now() < deadline) {
    while (sPosted < MESSAGES && sPosted - sDone < SLOTS) {
      char* slot = sendBuf + (size_t)(sPosted % SLOTS) * SLOT_BYTES;
      for (size_t i = 0; i < sizeOf(sPosted); i++) slot[i] = byteOf(sPosted, i);
      void* req = NULL;
      if (oxIsend(send, slot, sizeOf(sPosted), 0, smh, &req) != ncclSuccess) errors++;
      if (req == NULL) break;
      sreq[sPosted++ % SLOTS] = req;
    }
    while (rPosted < MESSAGES && rPosted - rDone < SLOTS) {
      void* slot = recvBuf + (size_t)(rPosted % SLOTS) * SLOT_BYTES;
      size_t most = SLOT_BYTES;
      int tag = 0;
      void* req = NULL;
      if (oxIrecv(recv, 1, &slot, &most, &tag, &rmh, &req) != ncclSuccess) errors++;
      if (req == NULL) break;
      rreq[rPosted++ % SLOTS] = req;
    }
    int done = 0, n = 0;
    if (sDone < sPosted) {
      if (oxTest(sreq[sDone % SLOTS], &done, &n) != ncclSuccess) errors++;
      if (done) sDone++;
    }
    done = 0;
    if (rDone < rPosted) {
      if (oxTest(rreq[rDone % SLOTS], &done, &n) != ncclSuccess) errors++;
      if (done) {
        char* slot = recvBuf + (size_t)(rDone % SLOTS) * SLOT_BYTES;
        int bad = (size_t)n != sizeOf(rDone);
        for (size_t i = 0; !bad && i < sizeOf(rDone); i++) bad = slot[i] != byteOf(rDone, i);
        wrong += bad;
        memset(slot, 0xEE, SLOT_BYTES); /* what the next message must overwrite */
        rDone++;
      }
    }
  }
  check(errors == 0, "no plugin call failed");
  check(rDone == MESSAGES, "every message received (done in order, within 60 s)");
  check(wrong == 0, "every received slot holds its message once its test said done");
  printf("       %d messages, %d wrong\n", rDone, wrong);
  /* A receive after the last message: it fails once the sender has closed. */
  while (sDone < sPosted && now() < deadline) {
    int done = 0, n = 0;
    if (oxTest(sreq[sDone % SLOTS], &done, &n) != ncclSuccess) break;
    sDone += done;
  }
  oxDeregMr(send, smh);
  oxCloseComm(send);
  void* slot = recvBuf;
  size_t most = SLOT_BYTES;
  int tag = 0, done = 0, n = 0;
  void* req = NULL;
  ncclResult_t rc = oxIrecv(recv, 1, &slot, &most, &tag, &rmh, &req);
  while (rc == ncclSuccess && req && !done && now() < deadline) rc = oxTest(req, &done, &n);
  check(rc != ncclSuccess && !done, "a receive after the sender closed fails");
  oxDeregMr(recv, rmh);
  oxCloseComm(recv);
  /* Every context the plugin made current was popped again (the stand-in's pop fails on an
   * empty stack). */
  int (*pop)(void**) = (int (*)(void**))dlsym(stub, "cuCtxPopCurrent_v2");
  void* ctx = NULL;
  check(pop != NULL && pop(&ctx) != 0, "the plugin left no context current");
out:
  if (listen) oxCloseListen(listen);
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
