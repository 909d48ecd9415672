/* A CPU stand-in for libnccl.so.2 for oxccl-bench's smoke test (see run-mock.sh): all ranks
 * live in one process (-g); operations posted inside a group run at ncclGroupEnd, over host
 * memory from mock_cuda.c. Integer and float/double types only. MOCK_BREAK=1 makes
 * all_reduce add 1 to element 0 of rank 0 (to prove the checker notices). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct Comm { int rank, nranks; char id[128]; } Comm;
enum { Sum, Prod, Max, Min, Avg };
typedef struct { int kind, root, dtype, op, peer; const void *send; void *recv; size_t count; Comm *comm; } Post;
enum { AR, RS, RD, AG, A2A, BC, GA, SC, SEND, RECV };

static Post posts[4096];
static int nposts, depth;
static double premul[64];
static int npremul;

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

int ncclGetVersion(int *v) { *v = 99901; return 0; }
int ncclGetUniqueId(ncclUniqueId *id) { memset(id, 0, sizeof *id); id->internal[0] = 42; return 0; }
int ncclCommInitRank(Comm **c, int n, ncclUniqueId id, int r) {
  *c = calloc(1, sizeof(Comm)); (*c)->rank = r; (*c)->nranks = n; memcpy((*c)->id, id.internal, 128); return 0;
}
int ncclCommDestroy(Comm *c) { free(c); return 0; }
int ncclCommAbort(Comm *c) { (void)c; return 0; }
int ncclCommGetAsyncError(Comm *c, int *e) { (void)c; *e = 0; return 0; }
const char *ncclGetErrorString(int r) { return r ? "mock failure" : "no error"; }
const char *ncclGetLastError(Comm *c) { (void)c; return "mock last error"; }
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

static void execute(void) {
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
int ncclGroupEnd(void) { if (--depth == 0) execute(); return 0; }
static int post(int kind, const void *s, void *r, size_t c, int t, int op, int root, int peer, Comm *comm) {
  if (t == 6 || t >= 9) return 4; /* types the mock does not reduce */
  posts[nposts++] = (Post){kind, root, t, op, peer, s, r, c, comm};
  if (depth == 0) execute();
  return 0;
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
