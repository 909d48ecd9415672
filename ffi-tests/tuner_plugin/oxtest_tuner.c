/*
 * oxtest_tuner.c: a small NCCL tuner plugin, "OxTestTuner", for oxccl's tests of the tuner
 * plugin ABI (NCCL_TUNER_PLUGIN=/path/libnccl-tuner-oxtest-vN.so).
 *
 * Built once per ABI version N in 2..6, each library exporting exactly one table,
 * ncclTunerPlugin_vN (everything else is static):
 *   cc -shared -fPIC -O2 -Wall -Wextra -Werror -DOXTEST_TUNER_VERSION=N \
 *      -o libnccl-tuner-oxtest-vN.so oxtest_tuner.c
 *
 * Behaviour, from the environment as it is when init is called (each context keeps its own
 * copy):
 *   OXTEST_TUNER_LOG=<file>   one line appended per call: the file is opened with O_APPEND
 *                             and each line written with one write(), so that two ranks of
 *                             one process, or several processes, do not interleave.
 *       init v=N nranks=R nnodes=K                       (v5, v6: then " commid=0x<hex>")
 *       coll v=2 func=F bytes=B pipe=P collnet=C nvls=V nch=H
 *       coll v=N func=F bytes=B pipe=P nalgo=A nproto=Q ring_ll=%.3f ring_ll128=%.3f
 *            ring_simple=%.3f tree_ll=%.3f tree_simple=%.3f nch=H          (v4+: " reg=R")
 *       chunk v=6 func=F bytes=B algo=A proto=P nch=H chunk=S
 *       finalize v=N
 *     Cost table values and nch are printed as received, before anything is changed; a table
 *     entry outside numAlgo x numProto (or no table at all) is printed as "na". A call whose
 *     context is NULL, or not one made by this plugin, gets " ctx=null" / " ctx=bad" at the
 *     end of its line (its line is then written to the file named in the environment now).
 *   OXTEST_TUNER_IGNORE=<algo>,<proto>   v3+: that cost table entry is set to -1.0 (ignored).
 *   OXTEST_TUNER_PICK=<algo>,<proto>     v3+: that entry is set to 0.0 unless it is -1.0
 *                             (applied after IGNORE); v2: returned through *algorithm and
 *                             *protocol (left as received without it).
 *       algo: tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree, pat;
 *       proto: ll, ll128, simple; case-insensitive. A value that does not parse is reported
 *       through the logger as a WARN and otherwise ignored.
 *   OXTEST_TUNER_CHANNELS=<n>            *nChannels = n.
 *   OXTEST_TUNER_FAIL_INIT=1             init logs its line, then returns ncclInternalError
 *                                        without making a context (*context = NULL).
 *   OXTEST_TUNER_FAIL_COLL=1             getCollInfo logs its line, then returns
 *                                        ncclInternalError and changes nothing.
 * init also calls the logger once (INFO, subsystem TUNING):
 *   "OxTestTuner v%d init: %zu ranks, %zu nodes"
 * v6's getChunkSize leaves *chunkSize as it is and returns ncclSuccess.
 *
 * The ABI is in tuner_abi.h (written from NCCL's public plugin ABI; NVIDIA's headers are not
 * included).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "tuner_abi.h"

#ifndef OXTEST_TUNER_VERSION
#error "build with -DOXTEST_TUNER_VERSION=N, N in 2..6"
#endif
#if OXTEST_TUNER_VERSION < 2 || OXTEST_TUNER_VERSION > 6
#error "OXTEST_TUNER_VERSION must be 2..6"
#endif

#define V OXTEST_TUNER_VERSION
#define EXPORT __attribute__((visibility("default")))
#define CTX_MAGIC 0x4f78547531e5c0deULL /* marks a context this plugin made */
#define LINE_MAX_LEN 1024

struct context {
  uint64_t magic;
  char *log; /* OXTEST_TUNER_LOG, or NULL */
  int pick_algo, pick_proto;     /* -1: not set */
  int ignore_algo, ignore_proto; /* -1: not set */
  int channels;                  /* -1: not set */
  int fail_coll;
  oxt_logger_t logger;
};

/* Appends `text` and a newline to the file at `path` with one write(). */
static void append_line(const char *path, const char *text) {
  if (path == NULL || path[0] == 0) return;
  char line[LINE_MAX_LEN + 2];
  int n = snprintf(line, sizeof line, "%s\n", text);
  if (n < 0) return;
  if ((size_t)n >= sizeof line) { /* cut short: still one line */
    n = (int)sizeof line - 1;
    line[n - 1] = '\n';
  }
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ssize_t w = write(fd, line, (size_t)n);
  (void)w;
  close(fd);
}

/* The context `ctx`, when it is one of ours; else NULL, with *note saying why. */
static struct context *our_context(void *ctx, const char **note) {
  struct context *c = ctx;
  *note = "";
  if (c == NULL) {
    *note = " ctx=null";
    return NULL;
  }
  if (c->magic != CTX_MAGIC) {
    *note = " ctx=bad";
    return NULL;
  }
  return c;
}

/* The log file for a call on `c` (the environment's when `c` is not ours). */
static const char *log_path(const struct context *c) { return c ? c->log : getenv("OXTEST_TUNER_LOG"); }

static void log_linef(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_linef(const char *path, const char *fmt, ...) {
  if (path == NULL || path[0] == 0) return;
  char text[LINE_MAX_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  append_line(path, text);
}

static const char *const algo_names[OXT_NUM_ALGORITHMS] = {"tree", "ring", "collnet_direct", "collnet_chain",
                                                           "nvls", "nvls_tree", "pat"};
static const char *const proto_names[OXT_NUM_PROTOCOLS] = {"ll", "ll128", "simple"};

static int index_of(const char *name, size_t len, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (strlen(names[i]) == len && strncasecmp(name, names[i], len) == 0) return i;
  return -1;
}

/* "<algo>,<proto>" from the environment variable `var` into *algo, *proto (-1, -1 when unset
 * or when it does not parse; the latter WARNs through the logger). */
static void parse_pair(const char *var, oxt_logger_t logger, int *algo, int *proto) {
  *algo = *proto = -1;
  const char *s = getenv(var);
  if (s == NULL || s[0] == 0) return;
  const char *comma = strchr(s, ',');
  int a = comma ? index_of(s, (size_t)(comma - s), algo_names, OXT_NUM_ALGORITHMS) : -1;
  int p = comma ? index_of(comma + 1, strlen(comma + 1), proto_names, OXT_NUM_PROTOCOLS) : -1;
  if (a < 0 || p < 0) {
    if (logger)
      logger(OXT_LOG_WARN, OXT_LOG_TUNING, __FILE__, __LINE__,
             "OxTestTuner: %s=%s is not <algo>,<proto>; ignored", var, s);
    return;
  }
  *algo = a;
  *proto = p;
}

static int env_is_1(const char *var) {
  const char *s = getenv(var);
  return s != NULL && strcmp(s, "1") == 0;
}

/* init of every version: logs, then makes the context (unless told to fail). */
static oxt_result_t common_init(void **context, const char *commid_text, size_t nRanks, size_t nNodes,
                                oxt_logger_t logger) {
  const char *path = getenv("OXTEST_TUNER_LOG");
  log_linef(path, "init v=%d nranks=%zu nnodes=%zu%s%s", V, nRanks, nNodes, commid_text,
            context ? "" : " ctx=null");
  if (logger)
    logger(OXT_LOG_INFO, OXT_LOG_TUNING, __FILE__, __LINE__, "OxTestTuner v%d init: %zu ranks, %zu nodes", V,
           nRanks, nNodes);
  if (context == NULL) return oxt_invalid_argument;
  *context = NULL;
  if (env_is_1("OXTEST_TUNER_FAIL_INIT")) return oxt_internal_error;

  struct context *c = calloc(1, sizeof *c);
  if (c == NULL) return oxt_system_error;
  c->magic = CTX_MAGIC;
  c->logger = logger;
  if (path != NULL && path[0] != 0) {
    c->log = strdup(path);
    if (c->log == NULL) {
      free(c);
      return oxt_system_error;
    }
  }
  parse_pair("OXTEST_TUNER_PICK", logger, &c->pick_algo, &c->pick_proto);
  parse_pair("OXTEST_TUNER_IGNORE", logger, &c->ignore_algo, &c->ignore_proto);
  c->channels = -1;
  const char *ch = getenv("OXTEST_TUNER_CHANNELS");
  if (ch != NULL && ch[0] != 0) {
    char *end;
    long n = strtol(ch, &end, 10);
    if (*end == 0 && n >= 0 && n <= 1024) c->channels = (int)n;
    else if (logger)
      logger(OXT_LOG_WARN, OXT_LOG_TUNING, __FILE__, __LINE__,
             "OxTestTuner: OXTEST_TUNER_CHANNELS=%s is not a channel count; ignored", ch);
  }
  c->fail_coll = env_is_1("OXTEST_TUNER_FAIL_COLL");
  *context = c;
  return oxt_success;
}

/* finalize (v5, v6) and destroy (v2..v4). */
static oxt_result_t common_finalize(void *context) {
  const char *note;
  struct context *c = our_context(context, &note);
  log_linef(log_path(c), "finalize v=%d%s", V, note);
  if (c == NULL) return context == NULL ? oxt_success : oxt_internal_error;
  c->magic = 0;
  free(c->log);
  free(c);
  return oxt_success;
}

#if V == 2
static oxt_result_t v2_coll(void *context, oxt_func_t collType, size_t nBytes, int collNetSupport,
                            int nvlsSupport, int numPipeOps, int *algorithm, int *protocol, int *nChannels) {
  const char *note;
  struct context *c = our_context(context, &note);
  log_linef(log_path(c), "coll v=2 func=%d bytes=%zu pipe=%d collnet=%d nvls=%d nch=%d%s", (int)collType, nBytes,
            numPipeOps, collNetSupport, nvlsSupport, nChannels ? *nChannels : -1, note);
  if (c == NULL) return oxt_invalid_argument;
  if (c->fail_coll) return oxt_internal_error;
  if (c->pick_algo >= 0 && algorithm && protocol) {
    *algorithm = c->pick_algo;
    *protocol = c->pick_proto;
  }
  if (c->channels >= 0 && nChannels) *nChannels = c->channels;
  return oxt_success;
}

static oxt_result_t v2_init(size_t nRanks, size_t nNodes, oxt_logger_t logFunction, void **context) {
  return common_init(context, "", nRanks, nNodes, logFunction);
}

EXPORT const oxt_tuner_v2_t ncclTunerPlugin_v2 = {
    .name = "OxTestTuner",
    .init = v2_init,
    .getCollInfo = v2_coll,
    .destroy = common_finalize,
};
#else /* V >= 3: a cost table */

/* Table entry [a][p] as text ("na" outside the table). The table is float[numAlgo][3]. */
static void entry_text(char *buf, size_t len, float (*table)[OXT_NUM_PROTOCOLS], int numAlgo, int numProto,
                       int a, int p) {
  if (table == NULL || a >= numAlgo || p >= numProto || p >= OXT_NUM_PROTOCOLS) snprintf(buf, len, "na");
  else snprintf(buf, len, "%.3f", (double)table[a][p]);
}

static int in_table(int numAlgo, int numProto, int a, int p) {
  return a >= 0 && p >= 0 && a < numAlgo && p < numProto && p < OXT_NUM_PROTOCOLS;
}

static oxt_result_t cost_coll(void *context, oxt_func_t collType, size_t nBytes, int numPipeOps,
                              float **collCostTable, int numAlgo, int numProto, const char *reg_text,
                              int *nChannels) {
  const char *note;
  struct context *c = our_context(context, &note);
  float(*table)[OXT_NUM_PROTOCOLS] = (float(*)[OXT_NUM_PROTOCOLS])collCostTable;
  char rl[24], rl128[24], rs[24], tl[24], ts[24];
  entry_text(rl, sizeof rl, table, numAlgo, numProto, OXT_ALGO_RING, OXT_PROTO_LL);
  entry_text(rl128, sizeof rl128, table, numAlgo, numProto, OXT_ALGO_RING, OXT_PROTO_LL128);
  entry_text(rs, sizeof rs, table, numAlgo, numProto, OXT_ALGO_RING, OXT_PROTO_SIMPLE);
  entry_text(tl, sizeof tl, table, numAlgo, numProto, OXT_ALGO_TREE, OXT_PROTO_LL);
  entry_text(ts, sizeof ts, table, numAlgo, numProto, OXT_ALGO_TREE, OXT_PROTO_SIMPLE);
  log_linef(log_path(c),
            "coll v=%d func=%d bytes=%zu pipe=%d nalgo=%d nproto=%d ring_ll=%s ring_ll128=%s ring_simple=%s "
            "tree_ll=%s tree_simple=%s nch=%d%s%s",
            V, (int)collType, nBytes, numPipeOps, numAlgo, numProto, rl, rl128, rs, tl, ts,
            nChannels ? *nChannels : -1, reg_text, note);
  if (c == NULL) return oxt_invalid_argument;
  if (c->fail_coll) return oxt_internal_error;
  if (table != NULL) {
    if (in_table(numAlgo, numProto, c->ignore_algo, c->ignore_proto))
      table[c->ignore_algo][c->ignore_proto] = OXT_ALGO_PROTO_IGNORE;
    if (in_table(numAlgo, numProto, c->pick_algo, c->pick_proto) &&
        table[c->pick_algo][c->pick_proto] != OXT_ALGO_PROTO_IGNORE)
      table[c->pick_algo][c->pick_proto] = 0.0f;
  }
  if (c->channels >= 0 && nChannels) *nChannels = c->channels;
  return oxt_success;
}

#if V == 3
static oxt_result_t v3_coll(void *context, oxt_func_t collType, size_t nBytes, int numPipeOps,
                            float **collCostTable, int numAlgo, int numProto, int *nChannels) {
  return cost_coll(context, collType, nBytes, numPipeOps, collCostTable, numAlgo, numProto, "", nChannels);
}
#else
static oxt_result_t v4_coll(void *context, oxt_func_t collType, size_t nBytes, int numPipeOps,
                            float **collCostTable, int numAlgo, int numProto, int regBuff, int *nChannels) {
  char reg[24];
  snprintf(reg, sizeof reg, " reg=%d", regBuff);
  return cost_coll(context, collType, nBytes, numPipeOps, collCostTable, numAlgo, numProto, reg, nChannels);
}
#endif

#if V <= 4
static oxt_result_t v34_init(size_t nRanks, size_t nNodes, oxt_logger_t logFunction, void **context) {
  return common_init(context, "", nRanks, nNodes, logFunction);
}
#else
static oxt_result_t v5_init(void **ctx, uint64_t commId, size_t nRanks, size_t nNodes, oxt_logger_t logFunction,
                            oxt_nvl_domain_info_v5_t *nvlDomainInfo, oxt_tuner_constants_v5_t *constants) {
  (void)nvlDomainInfo;
  (void)constants;
  char commid[32];
  snprintf(commid, sizeof commid, " commid=0x%" PRIx64, commId);
  return common_init(ctx, commid, nRanks, nNodes, logFunction);
}
#endif

#if V == 3
EXPORT const oxt_tuner_v3_t ncclTunerPlugin_v3 = {
    .name = "OxTestTuner",
    .init = v34_init,
    .getCollInfo = v3_coll,
    .destroy = common_finalize,
};
#elif V == 4
EXPORT const oxt_tuner_v4_t ncclTunerPlugin_v4 = {
    .name = "OxTestTuner",
    .init = v34_init,
    .getCollInfo = v4_coll,
    .destroy = common_finalize,
};
#elif V == 5
EXPORT const oxt_tuner_v5_t ncclTunerPlugin_v5 = {
    .name = "OxTestTuner",
    .init = v5_init,
    .getCollInfo = v4_coll,
    .finalize = common_finalize,
};
#else
static oxt_result_t v6_chunk(void *context, oxt_func_t collType, size_t nBytes, int algo, int proto,
                             int nChannels, size_t *chunkSize) {
  const char *note;
  struct context *c = our_context(context, &note);
  char chunk[24];
  if (chunkSize) snprintf(chunk, sizeof chunk, "%zu", *chunkSize);
  else snprintf(chunk, sizeof chunk, "null");
  log_linef(log_path(c), "chunk v=6 func=%d bytes=%zu algo=%d proto=%d nch=%d chunk=%s%s", (int)collType, nBytes,
            algo, proto, nChannels, chunk, note);
  return c == NULL ? oxt_invalid_argument : oxt_success;
}

EXPORT const oxt_tuner_v6_t ncclTunerPlugin_v6 = {
    .name = "OxTestTuner",
    .init = v5_init,
    .getCollInfo = v4_coll,
    .finalize = common_finalize,
    .getChunkSize = v6_chunk,
};
#endif
#endif /* V >= 3 */
