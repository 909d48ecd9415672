/* The configured collectives of NCCL 2.32 (ncclXConfig with an ncclCollConfig_t), all ranks of
 * one process (ncclCommInitAll), by default 2 ranks on GPU 0 (NCCL_MULTI_RANK_GPU_ENABLE=1).
 * Each of the 8 collectives runs with each config case, all ranks in one group, on int32 data
 * whose results are checked exactly:
 *   null        config NULL (the plain call)
 *   default     NCCL_COLLCONFIG_INITIALIZER
 *   max1        maxCTAs = 1
 *   minmax4     minCTAs = maxCTAs = 4
 *   ring        algSelection "ring": success for the ring collectives; alltoall, gather and
 *               scatter have no ring (ncclInvalidArgument)
 *   unsat-force algSelection "collnetdirect", forceAlgSelection 1: ncclInvalidArgument
 *   unsat-auto  the same with forceAlgSelection 0: automatic selection, success
 *   event       launchCompletionEvent: cudaEventSynchronize on it, then the event must have
 *               been recorded (cudaEventElapsedTime from an event recorded before the call)
 *   graph-event the event case under CUDA graph capture: the captured graph must hold an
 *               event-record node; the graph is launched and its results checked
 * Every case prints one line: PASS/FAIL/DIFF, collective, case, what was observed (return
 * codes, group end, results, event). Against NVIDIA's library (-r) a code or event observation
 * other than ours is a DIFF line (reported, not a failure); wrong data is always a FAIL.
 * NVIDIA's library refuses ranks sharing a GPU: then (or with -n 1) one rank runs.
 * Prints 'N passed, M failed, D differ'; exits non-zero on failure. Bounded by an alarm (240 s).
 *
 * usage: coll_config [-n NRANKS] [-d] [-r]
 *   -n  ranks (default 2)   -d  rank r on GPU r (default: all on GPU 0)
 *   -r  reference library (NVIDIA's): status differences are reported, not failures */
#include <cuda_runtime.h>
#include <nccl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXR 8
#define COUNT 70001 /* elements per rank block: odd, several channels' worth */
static int passed, failed, differ;
static int nranks = 2, distinct, reference;
static ncclComm_t comms[MAXR];
static cudaStream_t streams[MAXR];
static int *sendbuf[MAXR], *recvbuf[MAXR];
static int *host;

enum kind { ALLREDUCE, BROADCAST, REDUCE, ALLGATHER, REDUCESCATTER, ALLTOALL, GATHER, SCATTER, NKINDS };
static const char *kind_names[NKINDS] = {"AllReduce", "Broadcast", "Reduce", "AllGather",
                                          "ReduceScatter", "AlltoAll", "Gather", "Scatter"};
enum { NULLCFG, DEFAULT, MAX1, MINMAX4, RING, UNSAT_FORCE, UNSAT_AUTO, EVENT, GRAPH_EVENT, NCASES };
static const char *case_names[NCASES] = {"null", "default", "max1", "minmax4", "ring",
                                         "unsat-force", "unsat-auto", "event", "graph-event"};

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "FAIL coll_config: still running after 240 s (a call hangs)\n";
  if (write(1, msg, sizeof msg - 1) < 0) _exit(2);
  _exit(2);
}

static void line(const char *verdict, int k, int c, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void line(const char *verdict, int k, int c, const char *fmt, ...) {
  char detail[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  printf("%s %s %s: %s\n", verdict, kind_names[k], case_names[c], detail);
  fflush(stdout);
  if (!strcmp(verdict, "PASS")) passed++;
  else if (!strcmp(verdict, "DIFF")) differ++;
  else failed++;
}

static int value(int rank, size_t j) { return rank * 1000 + (int)(j % 997) + 1; }
static int root(void) { return nranks - 1; }
static int is_p2p(int k) { return k == ALLTOALL || k == GATHER || k == SCATTER; }

/* Elements rank r receives (checked), and the expected value of element i there; -1: rank r's
 * output is not defined (non-roots of Reduce and Gather). */
static size_t out_len(int k, int r) {
  switch (k) {
  case ALLREDUCE: case BROADCAST: case REDUCESCATTER: case SCATTER: return COUNT;
  case REDUCE: return r == root() ? COUNT : 0;
  case GATHER: return r == root() ? (size_t)COUNT * nranks : 0;
  default: return (size_t)COUNT * nranks;
  }
}
static long expect(int k, int r, size_t i) {
  long s = 0;
  switch (k) {
  case ALLREDUCE: case REDUCE:
    for (int q = 0; q < nranks; q++) s += value(q, i);
    return s;
  case BROADCAST: return value(root(), i);
  case ALLGATHER: case GATHER: return value((int)(i / COUNT), i % COUNT);
  case REDUCESCATTER:
    for (int q = 0; q < nranks; q++) s += value(q, (size_t)r * COUNT + i);
    return s;
  case ALLTOALL: return value((int)(i / COUNT), (size_t)r * COUNT + i % COUNT);
  default: return value(root(), (size_t)r * COUNT + i); /* SCATTER */
  }
}

static ncclResult_t call(int k, int r, const ncclCollConfig_t *cfg) {
  int *s = sendbuf[r], *d = recvbuf[r];
  ncclComm_t comm = comms[r];
  cudaStream_t st = streams[r];
  switch (k) {
  case ALLREDUCE: return ncclAllReduceConfig(s, d, COUNT, ncclInt32, ncclSum, comm, st, cfg);
  case BROADCAST: return ncclBroadcastConfig(s, d, COUNT, ncclInt32, root(), comm, st, cfg);
  case REDUCE: return ncclReduceConfig(s, d, COUNT, ncclInt32, ncclSum, root(), comm, st, cfg);
  case ALLGATHER: return ncclAllGatherConfig(s, d, COUNT, ncclInt32, comm, st, cfg);
  case REDUCESCATTER: return ncclReduceScatterConfig(s, d, COUNT, ncclInt32, ncclSum, comm, st, cfg);
  case ALLTOALL: return ncclAlltoAllConfig(s, d, COUNT, ncclInt32, comm, st, cfg);
  case GATHER: return ncclGatherConfig(s, d, COUNT, ncclInt32, root(), comm, st, cfg);
  default: return ncclScatterConfig(s, d, COUNT, ncclInt32, root(), comm, st, cfg);
  }
}

static int dev_of(int r) { return distinct ? r : 0; }

/* Reset every rank's buffers: inputs to value(), outputs to -1. */
static int reset_buffers(void) {
  size_t n = (size_t)COUNT * nranks;
  for (int r = 0; r < nranks; r++) {
    for (size_t j = 0; j < n; j++) host[j] = value(r, j);
    if (cudaSetDevice(dev_of(r)) != cudaSuccess ||
        cudaMemcpy(sendbuf[r], host, n * sizeof(int), cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemset(recvbuf[r], 0xff, n * sizeof(int)) != cudaSuccess)
      return -1;
  }
  return 0;
}

/* Wrong elements over all ranks (after synchronising every stream), -1 on a CUDA error. */
static long wrong_elements(int k, char *first, size_t len) {
  long wrong = 0;
  first[0] = 0;
  for (int r = 0; r < nranks; r++) {
    cudaSetDevice(dev_of(r));
    if (cudaStreamSynchronize(streams[r]) != cudaSuccess) return -1;
    size_t n = out_len(k, r);
    if (n == 0) continue;
    if (cudaMemcpy(host, recvbuf[r], n * sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) return -1;
    for (size_t i = 0; i < n; i++) {
      long want = expect(k, r, i);
      if (host[i] != want) {
        if (!wrong) snprintf(first, len, " (rank %d [%zu] = %d, want %ld)", r, i, host[i], want);
        wrong++;
      }
    }
  }
  return wrong;
}

/* The config of case c, with the launch event ev where the case has one. */
static ncclCollConfig_t config_of(int c, cudaEvent_t ev) {
  ncclCollConfig_t cfg = NCCL_COLLCONFIG_INITIALIZER;
  switch (c) {
  case MAX1: cfg.maxCTAs = 1; break;
  case MINMAX4: cfg.minCTAs = 4; cfg.maxCTAs = 4; break;
  case RING: cfg.algSelection = "ring"; break;
  case UNSAT_FORCE: cfg.algSelection = "collnetdirect"; break;
  case UNSAT_AUTO: cfg.algSelection = "collnetdirect"; cfg.forceAlgSelection = 0; break;
  case EVENT: case GRAPH_EVENT: cfg.launchCompletionEvent = ev; break;
  default: break;
  }
  return cfg;
}

/* What oxccl answers for collective k with case c. */
static ncclResult_t expected_code(int k, int c) {
  if (c == UNSAT_FORCE) return ncclInvalidArgument;
  if (c == RING && is_p2p(k)) return ncclInvalidArgument;
  return ncclSuccess;
}

/* Event-record nodes of a graph, -1 on error. */
static int event_record_nodes(cudaGraph_t g) {
  size_t n = 0;
  if (cudaGraphGetNodes(g, NULL, &n) != cudaSuccess) return -1;
  cudaGraphNode_t *nodes = calloc(n ? n : 1, sizeof *nodes);
  int found = 0;
  if (cudaGraphGetNodes(g, nodes, &n) != cudaSuccess) found = -1;
  for (size_t i = 0; found >= 0 && i < n; i++) {
    enum cudaGraphNodeType t;
    if (cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess && t == cudaGraphNodeTypeEventRecord) found++;
  }
  free(nodes);
  return found;
}

static void run_case(int k, int c) {
  char obs[512], first[160];
  cudaEvent_t ev[MAXR] = {0}, start[MAXR] = {0};
  cudaGraph_t graph[MAXR] = {0};
  cudaGraphExec_t exec[MAXR] = {0};
  int with_event = c == EVENT || c == GRAPH_EVENT, graph_mode = c == GRAPH_EVENT;
  if (reset_buffers()) { line("FAIL", k, c, "CUDA error setting up buffers"); return; }
  for (int r = 0; r < nranks && with_event; r++) {
    cudaSetDevice(dev_of(r));
    cudaEventCreate(&ev[r]);
    cudaEventCreate(&start[r]);
    if (!graph_mode) cudaEventRecord(start[r], streams[r]);
  }
  for (int r = 0; r < nranks && graph_mode; r++) {
    cudaSetDevice(dev_of(r));
    cudaStreamBeginCapture(streams[r], cudaStreamCaptureModeRelaxed);
  }
  ncclResult_t first_code = ncclSuccess;
  ncclGroupStart();
  for (int r = 0; r < nranks; r++) {
    ncclCollConfig_t cfg = config_of(c, ev[r]);
    ncclResult_t res = call(k, r, c == NULLCFG ? NULL : &cfg);
    if (r == 0) first_code = res;
  }
  ncclResult_t end_code = ncclGroupEnd();
  int records = -2; /* not a graph case */
  for (int r = 0; r < nranks && graph_mode; r++) {
    cudaSetDevice(dev_of(r));
    if (cudaStreamEndCapture(streams[r], &graph[r]) != cudaSuccess) { records = -1; continue; }
    int n = event_record_nodes(graph[r]);
    if (r == 0 || n < records) records = n;
    if (cudaGraphInstantiate(&exec[r], graph[r], 0) != cudaSuccess) records = -1;
  }
  for (int r = 0; r < nranks && graph_mode && records >= 0; r++) {
    cudaSetDevice(dev_of(r));
    cudaEventRecord(start[r], streams[r]);
    cudaGraphLaunch(exec[r], streams[r]);
  }
  /* The event: synchronise on it, then it must have been recorded after `start`. */
  const char *event_obs = "";
  if (with_event && first_code == ncclSuccess) {
    int recorded = 1;
    for (int r = 0; r < nranks; r++) {
      float ms;
      cudaSetDevice(dev_of(r));
      if (cudaEventSynchronize(ev[r]) != cudaSuccess || cudaEventElapsedTime(&ms, start[r], ev[r]) != cudaSuccess)
        recorded = 0;
    }
    cudaGetLastError();
    event_obs = recorded ? ", event recorded" : ", event NOT recorded";
    if (!recorded) first_code = ncclInternalError; /* observed as a failure below */
  }
  long wrong = 0;
  first[0] = 0;
  if (first_code == ncclSuccess && end_code == ncclSuccess) wrong = wrong_elements(k, first, sizeof first);
  for (int r = 0; r < nranks; r++) {
    cudaSetDevice(dev_of(r));
    cudaStreamSynchronize(streams[r]);
    if (exec[r]) cudaGraphExecDestroy(exec[r]);
    if (graph[r]) cudaGraphDestroy(graph[r]);
    if (ev[r]) cudaEventDestroy(ev[r]);
    if (start[r]) cudaEventDestroy(start[r]);
  }
  cudaGetLastError();
  const char *msg = first_code == ncclSuccess ? "" : ncclGetLastError(NULL);
  snprintf(obs, sizeof obs, "call %s, group end %s%s%s%s%s%s", ncclGetErrorString(first_code),
           ncclGetErrorString(end_code), event_obs,
           records == -2 ? "" : records > 0 ? ", event-record node" : ", NO event-record node",
           first_code == ncclSuccess ? (wrong ? ", WRONG results" : ", results exact") : "",
           first, msg && msg[0] ? " | " : "");
  if (msg && msg[0]) strncat(obs, msg, sizeof obs - strlen(obs) - 1);
  int code_ok = first_code == expected_code(k, c) && (first_code != ncclSuccess || end_code == ncclSuccess);
  int graph_ok = records == -2 || records > 0;
  if (wrong != 0) line("FAIL", k, c, "%s (%ld wrong)", obs, wrong);
  else if (code_ok && graph_ok) line("PASS", k, c, "%s", obs);
  else line(reference ? "DIFF" : "FAIL", k, c, "%s (oxccl: %s)", obs, ncclGetErrorString(expected_code(k, c)));
}

static int init(void) {
  int devs[MAXR];
  for (int r = 0; r < nranks; r++) devs[r] = dev_of(r);
  setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
  ncclResult_t res = ncclCommInitAll(comms, nranks, devs);
  if (res != ncclSuccess && nranks > 1 && !distinct) {
    printf("NOTE ncclCommInitAll of %d ranks on GPU 0: %s (%s); running 1 rank\n", nranks,
           ncclGetErrorString(res), ncclGetLastError(NULL));
    nranks = 1;
    res = ncclCommInitAll(comms, nranks, devs);
  }
  if (res != ncclSuccess) {
    printf("FAIL init: ncclCommInitAll: %s (%s)\n", ncclGetErrorString(res), ncclGetLastError(NULL));
    return -1;
  }
  size_t bytes = (size_t)COUNT * nranks * sizeof(int);
  host = malloc(bytes);
  for (int r = 0; r < nranks; r++) {
    cudaSetDevice(dev_of(r));
    if (cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc((void **)&sendbuf[r], bytes) != cudaSuccess || cudaMalloc((void **)&recvbuf[r], bytes) != cudaSuccess) {
      printf("FAIL init: CUDA allocation on rank %d\n", r);
      return -1;
    }
  }
  int version = 0;
  ncclGetVersion(&version);
  printf("coll_config: %d rank(s)%s, NCCL version code %d%s\n", nranks,
         distinct ? " on GPUs 0.." : " on GPU 0", version, reference ? " (reference)" : "");
  return 0;
}

int main(int argc, char **argv) {
  int opt;
  while ((opt = getopt(argc, argv, "n:dr")) != -1) {
    if (opt == 'n') nranks = atoi(optarg);
    else if (opt == 'd') distinct = 1;
    else if (opt == 'r') reference = 1;
    else {
      fprintf(stderr, "usage: %s [-n NRANKS] [-d] [-r]\n", argv[0]);
      return 2;
    }
  }
  if (nranks < 1 || nranks > MAXR) {
    fprintf(stderr, "coll_config: -n must be 1..%d\n", MAXR);
    return 2;
  }
  signal(SIGALRM, on_alarm);
  alarm(240);
  if (init()) return 1;
  for (int k = 0; k < NKINDS; k++)
    for (int c = 0; c < NCASES; c++) run_case(k, c);
  for (int r = 0; r < nranks; r++) ncclCommDestroy(comms[r]);
  printf("%d passed, %d failed, %d differ\n", passed, failed, differ);
  return failed ? 1 : 0;
}
