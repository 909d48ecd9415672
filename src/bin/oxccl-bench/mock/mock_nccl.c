/* A CPU stand-in for libnccl.so.2 for oxccl-bench's smoke test (see run-mock.sh): all ranks
 * live in one process (-g); operations posted inside a group run at ncclGroupEnd, over host
 * memory from mock_cuda.c. Integer and float/double types only. Every communicator takes
 * 1 MiB of its device's memory at init. Knobs:
 *   MOCK_BREAK=1          all_reduce adds 1 to element 0 of rank 0 (the checker must notice)
 *   MOCK_REFUSE_SHARED=1  like NVIDIA's 2.28: ranks on one device (and one NCCL_HOSTID) are
 *                         refused with ncclInvalidUsage "Duplicate GPU detected" (at the
 *                         ncclGroupEnd of a -g init; in -p the ranks meet through files in
 *                         MOCK_DIR, so only init works across processes)
 *   MOCK_REFUSE_RANK=r    ncclCommInitRank of rank r answers ncclInvalidUsage; in -p the other
 *                         ranks then wait for it forever, as a real bootstrap would
 *   MOCK_INIT_HANG=1      ncclCommInitRank never returns
 *   MOCK_COLL_US=n        every group of operations (a collective) takes n microseconds more,
 *                         so that timed iterations span time (e.g. for --trace-interval)
 * Built with -DMOCK_REFUSES_SHARED the library always behaves as with MOCK_REFUSE_SHARED=1
 * (run-mock.sh builds such a copy for --vs tests). With NCCL_HOSTID set, init prints "mock nccl: rank R NCCL_HOSTID=..." on stdout. A
 * collective whose peers are not in this process fails with ncclInternalError. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct Comm { int rank, nranks, dev; char id[128]; unsigned long long mem; } Comm;
enum { Sum, Prod, Max, Min, Avg };
typedef struct { int kind, root, dtype, op, peer; const void *send; void *recv; size_t count; Comm *comm; } Post;
enum { AR, RS, RD, AG, A2A, BC, GA, SC, SEND, RECV };

static Post posts[4096];
static int nposts, depth;
static double premul[64];
static int npremul;
static char last_error[512];
/* Communicators initialised inside the open group (checked at its ncclGroupEnd). */
static Comm *group_inits[256];
static int ngroup_inits;

static int refuses_shared(void) {
#ifdef MOCK_REFUSES_SHARED
  return 1;
#else
  return getenv("MOCK_REFUSE_SHARED") != 0;
#endif
}

static int fail(int code, const char *text) {
  snprintf(last_error, sizeof last_error, "%s", text);
  return code;
}

static size_t tsize(int t) { static const size_t s[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1}; return s[t]; }
static double get(int t, const void *p, size_t i) {
  switch (t) {
    case 0: return ((const int8_t *)p)[i];
    case 1: return ((const uint8_t *)p)[i];
    case 2: return ((const int32_t *)p)[i];
    case 3: return ((const uint32_t *)p)[i];
    case 4: return (double)((const int64_t *)p)[i];
    case 5: return (double)((const uint64_t *)p)[i];
    case 7: return ((const float *)p)[i];
    case 8: return ((const double *)p)[i];
  }
  return 0;
}
static void put(int t, void *p, size_t i, double v) {
  switch (t) {
    case 0: ((int8_t *)p)[i] = (int8_t)v; break;
    case 1: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case 2: ((int32_t *)p)[i] = (int32_t)v; break;
    case 3: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case 4: ((int64_t *)p)[i] = (int64_t)v; break;
    case 5: ((uint64_t *)p)[i] = (uint64_t)v; break;
    case 7: ((float *)p)[i] = (float)v; break;
    case 8: ((double *)p)[i] = v; break;
  }
}

/* The driver calls the mock needs, from the libcuda.so.1 the bench already loaded. */
static int (*get_device)(int *);
static int (*mem_alloc)(unsigned long long *, size_t);
static int (*mem_free)(unsigned long long);
static int bind_cuda(void) {
  if (get_device) return 0;
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
  if (!cuda) return -1;
  get_device = (int (*)(int *))dlsym(cuda, "cuCtxGetDevice");
  mem_alloc = (int (*)(unsigned long long *, size_t))dlsym(cuda, "cuMemAlloc_v2");
  mem_free = (int (*)(unsigned long long))dlsym(cuda, "cuMemFree_v2");
  return get_device && mem_alloc && mem_free ? 0 : -1;
}

static const char *host_id(void) { const char *h = getenv("NCCL_HOSTID"); return h ? h : "mock-host"; }

static int duplicate_error(int a, int b, int dev) {
  char text[256];
  snprintf(text, sizeof text, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %d", a, b, dev);
  return fail(5, text);
}

/* -p: every rank writes "device hostid" to MOCK_DIR/init-<id>-<rank>, waits for all of them
 * (forever, like a bootstrap whose peer died), then checks for a shared device. */
static int meet_across_processes(Comm *c) {
  const char *dir = getenv("MOCK_DIR");
  if (!dir) return 0;
  char path[512], hex[17];
  for (int i = 0; i < 8; i++) snprintf(hex + 2 * i, 3, "%02x", (unsigned char)c->id[i]);
  snprintf(path, sizeof path, "%s/init-%s-%d", dir, hex, c->rank);
  FILE *f = fopen(path, "w");
  if (!f) return fail(2, "mock: cannot write its meeting file");
  fprintf(f, "%d %s\n", c->dev, host_id());
  fclose(f);
  for (int r = 0; r < c->nranks; r++) {
    snprintf(path, sizeof path, "%s/init-%s-%d", dir, hex, r);
    int dev = -1;
    char host[256] = "";
    for (;;) {
      f = fopen(path, "r");
      if (f && fscanf(f, "%d %255s", &dev, host) == 2) { fclose(f); break; }
      if (f) fclose(f);
      usleep(10000);
    }
    if (refuses_shared() && r != c->rank && dev == c->dev && strcmp(host, host_id()) == 0)
      return duplicate_error(c->rank, r, dev);
  }
  return 0;
}

int ncclGetVersion(int *v) { *v = 99901; return 0; }
int ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  unsigned long long stamp = (unsigned long long)getpid() << 32 ^ (unsigned long long)time(0);
  memcpy(id->internal, &stamp, sizeof stamp);
  id->internal[8] = 42;
  return 0;
}
int ncclCommInitRank(Comm **c, int n, ncclUniqueId id, int r) {
  if (getenv("MOCK_INIT_HANG")) for (;;) sleep(1);
  if (getenv("NCCL_HOSTID")) { printf("mock nccl: rank %d NCCL_HOSTID=%s\n", r, getenv("NCCL_HOSTID")); fflush(stdout); }
  const char *refuse = getenv("MOCK_REFUSE_RANK");
  if (refuse && atoi(refuse) == r) {
    char text[128];
    snprintf(text, sizeof text, "mock: rank %d refuses this configuration", r);
    return fail(5, text);
  }
  if (bind_cuda() != 0) return fail(1, "mock: cannot reach the mock libcuda.so.1");
  Comm *comm = calloc(1, sizeof(Comm));
  comm->rank = r; comm->nranks = n; memcpy(comm->id, id.internal, 128);
  if (get_device(&comm->dev) != 0) { free(comm); return fail(1, "mock: no current CUDA context"); }
  if (mem_alloc(&comm->mem, 1 << 20) != 0) { free(comm); return fail(1, "mock: out of device memory"); }
  *c = comm;
  if (depth > 0) { group_inits[ngroup_inits++ & 255] = comm; return 0; }
  return meet_across_processes(comm);
}
int ncclCommDestroy(Comm *c) { if (c->mem) mem_free(c->mem); free(c); return 0; }
int ncclCommAbort(Comm *c) { (void)c; return 0; }
int ncclCommGetAsyncError(Comm *c, int *e) { (void)c; *e = 0; return 0; }
const char *ncclGetErrorString(int r) { return r ? "mock failure" : "no error"; }
const char *ncclGetLastError(Comm *c) { (void)c; return last_error; }
int ncclRedOpCreatePreMulSum(int *op, void *scalar, int dtype, int res, Comm *c) {
  (void)res; (void)c;
  premul[npremul] = dtype == 6 || dtype >= 9 ? 2.0 : get(dtype, scalar, 0);
  *op = 5 + npremul++;
  return 0;
}
int ncclRedOpDestroy(int op, Comm *c) { (void)op; (void)c; return 0; }

static Post *find(int kind, int rank, int peer_of) {
  for (int i = 0; i < nposts; i++)
    if (posts[i].kind == kind && posts[i].comm->rank == rank && (peer_of < 0 || posts[i].peer == peer_of)) return &posts[i];
  return 0;
}
static double reduce_at(Post *p, int n, size_t idx, const void *(*src)(int)) {
  double acc = 0;
  for (int r = 0; r < n; r++) {
    double v = get(p->dtype, src(r), idx);
    if (p->op >= 5) v *= premul[p->op - 5];
    if (r == 0) { acc = v; continue; }
    switch (p->op) {
      case Prod: acc *= v; break;
      case Max: acc = v > acc ? v : acc; break;
      case Min: acc = v < acc ? v : acc; break;
      default: acc += v;
    }
  }
  if (p->op == Avg) acc = p->dtype >= 6 ? acc / n : (double)((long long)acc / n);
  return acc;
}
static int cur_kind;
static const void *send_of(int r) { return find(cur_kind, r, -1)->send; }

/* Every peer a post needs must have posted in this group (-p runs hold one rank each). */
static int peers_present(void) {
  for (int i = 0; i < nposts; i++) {
    Post *p = &posts[i];
    int kind = p->kind == RECV ? SEND : p->kind;
    for (int r = 0; r < p->comm->nranks; r++) {
      if (p->kind == RECV && r != p->peer) continue;
      if (!find(kind, r, p->kind == RECV ? p->comm->rank : -1)) {
        nposts = 0;
        return fail(3, "mock: a peer of this collective is not in this process (the mock runs -p with one rank only)");
      }
    }
  }
  return 0;
}

/* NVIDIA's check at init: two ranks of one communicator on one device and host. */
static int check_group_inits(void) {
  int n = ngroup_inits > 256 ? 256 : ngroup_inits;
  ngroup_inits = 0;
  if (!refuses_shared()) return 0;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < i; j++)
      if (group_inits[i]->dev == group_inits[j]->dev && memcmp(group_inits[i]->id, group_inits[j]->id, 128) == 0)
        return duplicate_error(group_inits[i]->rank, group_inits[j]->rank, group_inits[i]->dev);
  return 0;
}

static void execute(void) {
  const char *extra_us = getenv("MOCK_COLL_US");
  if (extra_us) usleep((useconds_t)atoi(extra_us));
  /* Snapshot every send buffer first: in-place variants overwrite them. */
  void *copies[4096];
  for (int i = 0; i < nposts; i++) {
    Post *p = &posts[i];
    int n = p->comm->nranks;
    size_t elems = p->count * ((p->kind == RS || p->kind == A2A || p->kind == SC) ? n : 1);
    copies[i] = 0;
    if (p->send) { copies[i] = malloc(elems * tsize(p->dtype) + 1); memcpy(copies[i], p->send, elems * tsize(p->dtype)); p->send = copies[i]; }
  }
  for (int i = 0; i < nposts; i++) {
    Post *p = &posts[i];
    int n = p->comm->nranks, me = p->comm->rank, t = p->dtype;
    size_t c = p->count, es = tsize(t);
    cur_kind = p->kind;
    switch (p->kind) {
      case AR: case RD:
        if (p->kind == RD && me != p->root) break;
        for (size_t k = 0; k < c; k++) put(t, p->recv, k, reduce_at(p, n, k, send_of));
        if (getenv("MOCK_BREAK") && me == 0 && c > 0) put(t, p->recv, 0, get(t, p->recv, 0) + 1);
        break;
      case RS:
        for (size_t k = 0; k < c; k++) put(t, p->recv, k, reduce_at(p, n, me * c + k, send_of));
        break;
      case AG: case GA:
        if (p->kind == GA && me != p->root) break;
        for (int r = 0; r < n; r++) memcpy((char *)p->recv + r * c * es, find(p->kind, r, -1)->send, c * es);
        break;
      case A2A:
        for (int r = 0; r < n; r++) memcpy((char *)p->recv + r * c * es, (const char *)find(A2A, r, -1)->send + me * c * es, c * es);
        break;
      case BC: memcpy(p->recv, find(BC, p->root, -1)->send, c * es); break;
      case SC: memcpy(p->recv, (const char *)find(SC, p->root, -1)->send + me * c * es, c * es); break;
      case RECV: memcpy(p->recv, find(SEND, p->peer, me)->send, c * es); break;
    }
  }
  for (int i = 0; i < nposts; i++) free(copies[i]);
  nposts = 0;
}

int ncclGroupStart(void) { depth++; return 0; }
int ncclGroupEnd(void) {
  if (--depth > 0) return 0;
  int result = check_group_inits();
  if (result == 0) result = peers_present();
  if (result == 0) execute();
  return result;
}
static int post(int kind, const void *s, void *r, size_t c, int t, int op, int root, int peer, Comm *comm) {
  if (t == 6 || t >= 9) return fail(4, "mock: this type is not implemented"); /* half, bf16, fp8 */
  posts[nposts++] = (Post){kind, root, t, op, peer, s, r, c, comm};
  if (depth > 0) return 0;
  int result = peers_present();
  if (result == 0) execute();
  return result;
}
int ncclAllReduce(const void *s, void *r, size_t c, int t, int op, Comm *m, void *st) { (void)st; return post(AR, s, r, c, t, op, 0, -1, m); }
int ncclReduceScatter(const void *s, void *r, size_t c, int t, int op, Comm *m, void *st) { (void)st; return post(RS, s, r, c, t, op, 0, -1, m); }
int ncclReduce(const void *s, void *r, size_t c, int t, int op, int root, Comm *m, void *st) { (void)st; return post(RD, s, r, c, t, op, root, -1, m); }
int ncclAllGather(const void *s, void *r, size_t c, int t, Comm *m, void *st) { (void)st; return post(AG, s, r, c, t, 0, 0, -1, m); }
int ncclAlltoAll(const void *s, void *r, size_t c, int t, Comm *m, void *st) { (void)st; return post(A2A, s, r, c, t, 0, 0, -1, m); }
int ncclBroadcast(const void *s, void *r, size_t c, int t, int root, Comm *m, void *st) { (void)st; return post(BC, s, r, c, t, 0, root, -1, m); }
int ncclGather(const void *s, void *r, size_t c, int t, int root, Comm *m, void *st) { (void)st; return post(GA, s, r, c, t, 0, root, -1, m); }
int ncclScatter(const void *s, void *r, size_t c, int t, int root, Comm *m, void *st) { (void)st; return post(SC, s, r, c, t, 0, root, -1, m); }
int ncclSend(const void *s, size_t c, int t, int peer, Comm *m, void *st) { (void)st; return post(SEND, s, 0, c, t, 0, 0, peer, m); }
int ncclRecv(void *r, size_t c, int t, int peer, Comm *m, void *st) { (void)st; return post(RECV, 0, r, c, t, 0, 0, peer, m); }
