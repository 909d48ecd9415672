/* Bad inputs through the C ABI, no GPU needed. Every case runs in a forked child (so a crash
 * or hang in one case is recorded, not fatal) and prints one tab-separated line:
 *   RESULT <case> <code|CRASH:sig|TIMEOUT> <expected> <PASS|FAIL|INFO> <ms> <last error> <detail>
 * Expected codes are NVIDIA NCCL 2.32.3's answers on a machine with a working GPU (argument
 * errors ncclInvalidArgument, usage errors ncclInvalidUsage, ...). With --report the program
 * never fails (used to run NVIDIA's own library, which on a GPU-less machine fails many calls
 * on CUDA first); without it every case must give its expected code and, when it is an error,
 * leave a non-empty ncclGetLastError message. */
#include <nccl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ANY_ERROR (-100)  /* any error code (not ncclSuccess) */
#define ANY_CODE (-200)   /* behaviour still being built: recorded, not asserted */
#define WRONG_VALUE 1000  /* the call returned the right code but a wrong value */

static ncclComm_t const GARBAGE = (ncclComm_t)0x1234;
static char detail[512];

typedef int (*CaseFn)(void);
typedef struct {
  const char *name;
  CaseFn run;
  int expected;
  int driver_message; /* the error message must mention the driver/CUDA or "not yet supported" */
} Case;

static ncclUniqueId zero_id(void) {
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  return id;
}

/* ---- version, strings, unique id ---- */
static int version_null(void) { return ncclGetVersion(NULL); }
static int version_value(void) {
  int v = 0;
  int r = ncclGetVersion(&v);
  snprintf(detail, sizeof detail, "version %d", v);
  return r == ncclSuccess && v != NCCL_VERSION_CODE ? WRONG_VALUE : r;
}
static int error_string(int code) {
  const char *s = ncclGetErrorString((ncclResult_t)code);
  snprintf(detail, sizeof detail, "\"%s\"", s ? s : "(null)");
  return s && strcmp(s, "unknown result code") == 0 ? 0 : WRONG_VALUE;
}
static int errstr_minus1(void) { return error_string(-1); }
/* ncclTimeout (2.32): a known code with its own text. */
static int errstr_8(void) {
  const char *s = ncclGetErrorString(ncclTimeout);
  snprintf(detail, sizeof detail, "\"%s\"", s ? s : "(null)");
  return s && strcmp(s, "timeout") == 0 ? 0 : WRONG_VALUE;
}
static int errstr_9(void) { return error_string(9); }
static int errstr_100(void) { return error_string(100); }
static int errstr_int_min(void) { return error_string(INT_MIN); }
static int errstr_known(void) {
  size_t used = 0;
  for (int c = 0; c <= 7; c++) {
    const char *s = ncclGetErrorString((ncclResult_t)c);
    if (!s || !*s || strcmp(s, "unknown result code") == 0) return WRONG_VALUE;
    used += snprintf(detail + used, sizeof detail - used, "%s%s", c ? "|" : "", s);
    if (used >= sizeof detail) break;
  }
  return 0;
}
static int unique_id_null(void) { return ncclGetUniqueId(NULL); }
static int unique_id_no_driver(void) {
  ncclUniqueId id;
  return ncclGetUniqueId(&id);
}

/* ---- init ---- */
static int init_rank_null_out(void) { return ncclCommInitRank(NULL, 1, zero_id(), 0); }
static int init_rank_check(int nranks, int rank) {
  ncclComm_t comm = GARBAGE;
  int r = ncclCommInitRank(&comm, nranks, zero_id(), rank);
  snprintf(detail, sizeof detail, "comm after: %p", (void *)comm);
  return r;
}
static int init_rank_nranks0(void) { return init_rank_check(0, 0); }
static int init_rank_nranks_negative(void) { return init_rank_check(-3, 0); }
static int init_rank_rank_eq_nranks(void) { return init_rank_check(2, 2); }
static int init_rank_rank_negative(void) { return init_rank_check(2, -1); }
static int init_rank_no_driver(void) { return init_rank_check(1, 0); }
static int init_config_bad_magic(void) {
  ncclComm_t comm = NULL;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.magic = 0x12345678;
  return ncclCommInitRankConfig(&comm, 1, zero_id(), 0, &config);
}
static int init_config_null_out(void) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  return ncclCommInitRankConfig(NULL, 1, zero_id(), 0, &config);
}
static int init_config_bad_rank(void) {
  ncclComm_t comm = NULL;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  return ncclCommInitRankConfig(&comm, 4, zero_id(), 7, &config);
}
static int init_scalable_nid0(void) {
  ncclComm_t comm = NULL;
  ncclUniqueId id = zero_id();
  return ncclCommInitRankScalable(&comm, 1, 0, 0, &id, NULL);
}
static int init_scalable_null_ids(void) {
  ncclComm_t comm = NULL;
  return ncclCommInitRankScalable(&comm, 1, 0, 1, NULL, NULL);
}
static int init_all_ndev0(void) {
  ncclComm_t comms[1] = {GARBAGE};
  return ncclCommInitAll(comms, 0, NULL);
}
static int init_all_ndev_negative(void) {
  ncclComm_t comms[1];
  return ncclCommInitAll(comms, -1, NULL);
}
static int init_all_null_comms(void) { return ncclCommInitAll(NULL, 1, NULL); }

/* ---- communicator queries and lifecycle on NULL and garbage handles ---- */
static int count_null(void) { int n; return ncclCommCount(NULL, &n); }
static int count_garbage(void) { int n; return ncclCommCount(GARBAGE, &n); }
static int count_garbage_null_out(void) { return ncclCommCount(GARBAGE, NULL); }
static int cudevice_null(void) { int d; return ncclCommCuDevice(NULL, &d); }
static int cudevice_garbage(void) { int d; return ncclCommCuDevice(GARBAGE, &d); }
static int userrank_null(void) { int r; return ncclCommUserRank(NULL, &r); }
static int userrank_garbage(void) { int r; return ncclCommUserRank(GARBAGE, &r); }
static int async_error_null(void) { ncclResult_t e; return ncclCommGetAsyncError(NULL, &e); }
static int async_error_garbage(void) { ncclResult_t e; return ncclCommGetAsyncError(GARBAGE, &e); }
static int finalize_null(void) { return ncclCommFinalize(NULL); }
static int finalize_garbage(void) { return ncclCommFinalize(GARBAGE); }
static int destroy_null(void) { return ncclCommDestroy(NULL); }
static int destroy_garbage(void) { return ncclCommDestroy(GARBAGE); }
static int abort_null(void) { return ncclCommAbort(NULL); }
static int abort_garbage(void) { return ncclCommAbort(GARBAGE); }
static int revoke_null(void) { return ncclCommRevoke(NULL, NCCL_REVOKE_DEFAULT); }
static int revoke_null_flags(void) { return ncclCommRevoke(NULL, 1); }
static int revoke_garbage_default(void) { return ncclCommRevoke(GARBAGE, NCCL_REVOKE_DEFAULT); }
static int revoke_garbage_flags(void) { return ncclCommRevoke(GARBAGE, 1); }
static int split_null(void) { ncclComm_t n; return ncclCommSplit(NULL, 0, 0, &n, NULL); }
static int split_garbage(void) { ncclComm_t n; return ncclCommSplit(GARBAGE, 0, 0, &n, NULL); }
static int shrink_null(void) {
  int ex[1] = {0};
  ncclComm_t n;
  return ncclCommShrink(NULL, ex, 1, &n, NULL, NCCL_SHRINK_DEFAULT);
}
static int shrink_garbage_negative_count(void) {
  ncclComm_t n;
  return ncclCommShrink(GARBAGE, NULL, -1, &n, NULL, NCCL_SHRINK_DEFAULT);
}
static int comm_get_unique_id_null(void) { ncclUniqueId id; return ncclCommGetUniqueId(NULL, &id); }
static int comm_get_unique_id_garbage(void) { ncclUniqueId id; return ncclCommGetUniqueId(GARBAGE, &id); }
static int grow_all_null(void) { return ncclCommGrow(NULL, 4, NULL, -1, NULL, NULL); }
static int grow_null_newcomm(void) {
  ncclUniqueId id = zero_id();
  return ncclCommGrow(NULL, 4, &id, 2, NULL, NULL);
}
static int grow_new_rank_null_id(void) { ncclComm_t n; return ncclCommGrow(NULL, 4, NULL, 2, &n, NULL); }
static int grow_new_rank_eq_nranks(void) {
  ncclUniqueId id = zero_id();
  ncclComm_t n;
  return ncclCommGrow(NULL, 4, &id, 4, &n, NULL);
}
static int grow_new_rank_negative(void) {
  ncclUniqueId id = zero_id();
  ncclComm_t n;
  return ncclCommGrow(NULL, 4, &id, -1, &n, NULL);
}
/* A garbage parent asking for fewer ranks than any communicator has. */
static int grow_garbage_smaller(void) { ncclComm_t n; return ncclCommGrow(GARBAGE, 1, NULL, -1, &n, NULL); }
/* 2.31-2.32: suspend, memory statistics, windows, one-sided operations, encryption, and the
 * device-API host functions of nccl_device/host.h (C++ only there; declared here by their C ABI). */
typedef struct { int nRanks, rank, stride; } TeamAbi;
ncclResult_t ncclCommQueryProperties(ncclComm_t comm, void *props);
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void **outPtr);
ncclResult_t ncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank, void **outPtr);
ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void **outPtr);
ncclResult_t ncclGetMultimemDeviceLeInfo(ncclWindow_t window, size_t offset, uint32_t *leId, size_t *leOffset);
static int suspend_null(void) { return ncclCommSuspend(NULL, NCCL_SUSPEND_MEM); }
static int suspend_garbage(void) { return ncclCommSuspend(GARBAGE, NCCL_SUSPEND_MEM); }
static int resume_null(void) { return ncclCommResume(NULL); }
static int mem_stats_null(void) { uint64_t v; return ncclCommMemStats(NULL, ncclStatGpuMemTotal, &v); }
static int mem_stats_null_value(void) { return ncclCommMemStats(NULL, ncclStatGpuMemTotal, NULL); }
static int win_user_ptr_null(void) { void *p; return ncclWinGetUserPtr(NULL, NULL, &p); }
static int put_signal_null_comm(void) {
  char b[8] = {0};
  return ncclPutSignal(b, 1, ncclFloat, 0, NULL, 0, 0, 0, 0, NULL, NULL);
}
static int signal_null_comm(void) { return ncclSignal(0, 0, 0, 0, NULL, NULL); }
static int signal_garbage_comm(void) { return ncclSignal(0, 0, 0, 0, GARBAGE, NULL); }
static int wait_signal_null_comm(void) {
  ncclWaitSignalDesc_t d = {1, 0, 0, 0};
  return ncclWaitSignal(1, &d, NULL, NULL);
}
static int query_properties_null_comm(void) { char p[256] = {0}; return ncclCommQueryProperties(NULL, p); }
static int peer_pointer_null_window(void) { void *p; return ncclGetPeerDevicePointer(NULL, 0, 0, &p); }
static int lsa_pointer_null_window(void) { void *p; return ncclGetLsaDevicePointer(NULL, 0, 0, &p); }
static int lsa_multimem_null_window(void) { void *p; return ncclGetLsaMultimemDevicePointer(NULL, 0, &p); }
static int multimem_le_null_window(void) {
  uint32_t le;
  size_t off;
  return ncclGetMultimemDeviceLeInfo(NULL, 0, &le, &off);
}
static int encryption_null(void) { return ncclSetEncryption(NULL); }
static int encryption_none(void) {
  ncclEncryptionConfig_t c = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  return ncclSetEncryption(&c);
}
static int encryption_psk_null(void) {
  ncclEncryptionConfig_t c = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  c.mode = NCCL_ENCRYPTION_MODE_PSK;
  return ncclSetEncryption(&c);
}
static int encryption_psk_short(void) {
  ncclEncryptionConfig_t c = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  c.mode = NCCL_ENCRYPTION_MODE_PSK;
  c.psk = "too short";
  return ncclSetEncryption(&c);
}
static int encryption_psk_ok(void) {
  ncclEncryptionConfig_t c = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  c.mode = NCCL_ENCRYPTION_MODE_PSK;
  c.psk = "0123456789abcdef0123456789abcdef";
  return ncclSetEncryption(&c);
}
static int encryption_bad_mode(void) {
  ncclEncryptionConfig_t c = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  c.mode = 5;
  return ncclSetEncryption(&c);
}
static int encryption_bad_magic(void) {
  ncclEncryptionConfig_t c = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  c.magic = 1;
  return ncclSetEncryption(&c);
}
static int register_null(void) { char b[8]; void *h; return ncclCommRegister(NULL, b, 8, &h); }
static int deregister_null(void) { char b[8]; return ncclCommDeregister(NULL, b); }
static int window_register_null(void) {
  char b[8];
  ncclWindow_t w;
  return ncclCommWindowRegister(NULL, b, 8, &w, NCCL_WIN_DEFAULT);
}
static int window_deregister_null(void) { return ncclCommWindowDeregister(NULL, NULL); }
static int window_deregister_garbage_null_win(void) { return ncclCommWindowDeregister(GARBAGE, NULL); }
static int window_deregister_null_comm(void) {
  return ncclCommWindowDeregister(NULL, (ncclWindow_t)0x10);
}

/* ---- reduction ops ---- */
static int redop_create_null_comm(void) {
  ncclRedOp_t op;
  float scalar = 2.0f;
  return ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, NULL);
}
static int redop_destroy_sum_null(void) { return ncclRedOpDestroy(ncclSum, NULL); }
static int redop_destroy_avg_garbage(void) { return ncclRedOpDestroy(ncclAvg, GARBAGE); }
static int redop_destroy_negative_null(void) { return ncclRedOpDestroy((ncclRedOp_t)-1, NULL); }
static int redop_destroy_uncreated_null(void) { return ncclRedOpDestroy(ncclNumOps, NULL); }

/* ---- collectives and p2p on NULL / garbage communicators, with bad types and ops ---- */
static char buf[64];
static int allreduce(ncclComm_t comm, int dtype, int op) {
  return ncclAllReduce(buf, buf, 4, (ncclDataType_t)dtype, (ncclRedOp_t)op, comm, NULL);
}
static int allreduce_null(void) { return allreduce(NULL, ncclFloat32, ncclSum); }
static int allreduce_garbage(void) { return allreduce(GARBAGE, ncclFloat32, ncclSum); }
static int allreduce_dtype_minus1(void) { return allreduce(NULL, -1, ncclSum); }
static int allreduce_dtype_12(void) { return allreduce(NULL, 12, ncclSum); }
static int allreduce_dtype_1000(void) { return allreduce(NULL, 1000, ncclSum); }
static int allreduce_op_minus1(void) { return allreduce(NULL, ncclFloat32, -1); }
static int allreduce_op_5(void) { return allreduce(NULL, ncclFloat32, 5); }
static int allreduce_op_huge(void) { return allreduce(NULL, ncclFloat32, INT_MAX); }
static int broadcast_null(void) { return ncclBroadcast(buf, buf, 4, ncclInt8, 0, NULL, NULL); }
static int broadcast_root_garbage(void) { return ncclBroadcast(buf, buf, 4, ncclInt8, -5, GARBAGE, NULL); }
static int bcast_null(void) { return ncclBcast(buf, 4, ncclInt8, 0, NULL, NULL); }
static int reduce_null(void) { return ncclReduce(buf, buf, 4, ncclInt32, ncclMax, 0, NULL, NULL); }
static int reduce_root_huge_null(void) { return ncclReduce(buf, buf, 4, ncclInt32, ncclMax, INT_MAX, NULL, NULL); }
static int allgather_null(void) { return ncclAllGather(buf, buf, 4, ncclInt8, NULL, NULL); }
static int reducescatter_null(void) { return ncclReduceScatter(buf, buf, 4, ncclInt8, ncclSum, NULL, NULL); }
static int alltoall_null(void) { return ncclAlltoAll(buf, buf, 4, ncclInt8, NULL, NULL); }
static int gather_null(void) { return ncclGather(buf, buf, 4, ncclInt8, 0, NULL, NULL); }
static int scatter_null(void) { return ncclScatter(buf, buf, 4, ncclInt8, 0, NULL, NULL); }
static int send_null(void) { return ncclSend(buf, 4, ncclInt8, 1, NULL, NULL); }
static int recv_null(void) { return ncclRecv(buf, 4, ncclInt8, 1, NULL, NULL); }

/* ---- the configured collectives (ncclXConfig): the config is checked, then the comm ---- */
static int allreduce_config(ncclComm_t comm, const ncclCollConfig_t *config) {
  return ncclAllReduceConfig(buf, buf, 4, ncclFloat32, ncclSum, comm, NULL, config);
}
static ncclCollConfig_t coll_config(void) {
  ncclCollConfig_t c = NCCL_COLLCONFIG_INITIALIZER;
  return c;
}
static int allreduce_config_null_config(void) { return allreduce_config(NULL, NULL); }
static int allreduce_config_null_comm(void) {
  ncclCollConfig_t c = coll_config();
  return allreduce_config(NULL, &c);
}
static int allreduce_config_garbage_comm(void) {
  ncclCollConfig_t c = coll_config();
  return allreduce_config(GARBAGE, &c);
}
static int allreduce_config_bad_magic(void) {
  ncclCollConfig_t c = coll_config();
  c.magic = 0x1234;
  return allreduce_config(NULL, &c);
}
static int allreduce_config_size_8(void) {
  ncclCollConfig_t c = coll_config();
  c.size = 8;
  return allreduce_config(NULL, &c);
}
static int allreduce_config_size_56(void) {
  ncclCollConfig_t c = coll_config();
  c.size = 56;
  return allreduce_config(NULL, &c);
}
static int allreduce_config_force_2(void) {
  ncclCollConfig_t c = coll_config();
  c.forceAlgSelection = 2;
  return allreduce_config(NULL, &c);
}
static int allreduce_config_policy_4(void) {
  ncclCollConfig_t c = coll_config();
  c.CTAPolicy = 4;
  return allreduce_config(NULL, &c);
}
static int allreduce_config_maxctas_0(void) {
  ncclCollConfig_t c = coll_config();
  c.maxCTAs = 0;
  return allreduce_config(NULL, &c);
}
static int allreduce_config_min_above_max(void) {
  ncclCollConfig_t c = coll_config();
  c.minCTAs = 8;
  c.maxCTAs = 2;
  return allreduce_config(NULL, &c);
}
static int allreduce_config_unknown_selection(void) {
  ncclCollConfig_t c = coll_config();
  c.algSelection = "no-such-algorithm";
  return allreduce_config(NULL, &c);
}
static int allreduce_config_ext_cycle(void) {
  ncclConfigExt_t a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  a.next = &b;
  b.next = &a;
  ncclCollConfig_t c = coll_config();
  c.ext = &a;
  return allreduce_config(NULL, &c);
}
static int broadcast_config_null(void) {
  ncclCollConfig_t c = coll_config();
  return ncclBroadcastConfig(buf, buf, 4, ncclInt8, 0, NULL, NULL, &c);
}
static int reduce_config_null(void) {
  ncclCollConfig_t c = coll_config();
  return ncclReduceConfig(buf, buf, 4, ncclInt8, ncclSum, 0, NULL, NULL, &c);
}
static int allgather_config_null(void) {
  ncclCollConfig_t c = coll_config();
  return ncclAllGatherConfig(buf, buf, 4, ncclInt8, NULL, NULL, &c);
}
static int reducescatter_config_null(void) {
  ncclCollConfig_t c = coll_config();
  return ncclReduceScatterConfig(buf, buf, 4, ncclInt8, ncclSum, NULL, NULL, &c);
}
static int alltoall_config_null(void) {
  ncclCollConfig_t c = coll_config();
  return ncclAlltoAllConfig(buf, buf, 4, ncclInt8, NULL, NULL, &c);
}
static int gather_config_null(void) {
  ncclCollConfig_t c = coll_config();
  return ncclGatherConfig(buf, buf, 4, ncclInt8, 0, NULL, NULL, &c);
}
static int scatter_config_null(void) {
  ncclCollConfig_t c = coll_config();
  return ncclScatterConfig(buf, buf, 4, ncclInt8, 0, NULL, NULL, &c);
}
static int send_peer_garbage(void) { return ncclSend(buf, SIZE_MAX, (ncclDataType_t)99, -1, GARBAGE, NULL); }
static int recv_garbage(void) { return ncclRecv(buf, 4, ncclInt8, 0, GARBAGE, NULL); }

/* ---- groups ---- */
static int group_end_without_start(void) { return ncclGroupEnd(); }
static int group_nested_end_twice(void) {
  if (ncclGroupStart() != ncclSuccess || ncclGroupEnd() != ncclSuccess) return WRONG_VALUE;
  return ncclGroupEnd();
}
static int group_simulate_without_start(void) {
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  return ncclGroupSimulateEnd(&info);
}
static int group_simulate_bad_magic(void) {
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  info.magic = 0xdeadbeef;
  if (ncclGroupStart() != ncclSuccess) return WRONG_VALUE;
  return ncclGroupSimulateEnd(&info);
}
static int group_simulate_null_info(void) {
  if (ncclGroupStart() != ncclSuccess) return WRONG_VALUE;
  return ncclGroupSimulateEnd(NULL);
}
static int group_simulate_empty(void) {
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  if (ncclGroupStart() != ncclSuccess) return WRONG_VALUE;
  int r = ncclGroupSimulateEnd(&info);
  snprintf(detail, sizeof detail, "estimatedTime %g", (double)info.estimatedTime);
  return r;
}

/* ---- memory ---- */
static int mem_alloc_null_ptr(void) { return ncclMemAlloc(NULL, 1024); }
static int mem_alloc_no_driver(void) { void *p = NULL; return ncclMemAlloc(&p, 1024); }
static int mem_free_foreign(void) { int on_stack[4]; return ncclMemFree(on_stack); }
static int mem_free_heap(void) {
  void *p = malloc(64);
  int r = ncclMemFree(p);
  free(p);
  return r;
}

/* ---- the parameter API (2.32): NULL, unknown keys and type mismatches are
 * ncclInvalidArgument; keys are full NCCL_ names ---- */
static ncclParamHandle_t bound(const char *key) {
  ncclParamHandle_t h = NULL;
  return ncclParamBind(&h, key) == ncclSuccess ? h : NULL;
}
static int param_bind_null_out(void) { return ncclParamBind(NULL, "NCCL_DEBUG"); }
static int param_bind_null_key(void) {
  ncclParamHandle_t h = NULL;
  return ncclParamBind(&h, NULL);
}
static int param_bind_unknown(void) {
  ncclParamHandle_t h = NULL;
  return ncclParamBind(&h, "NCCL_NO_SUCH_PARAM");
}
static int param_bind_short_name(void) {
  ncclParamHandle_t h = NULL;
  return ncclParamBind(&h, "DEBUG");
}
static int param_bind_debug(void) {
  ncclParamHandle_t h = NULL;
  int r = ncclParamBind(&h, "NCCL_DEBUG");
  return r == ncclSuccess && h == NULL ? WRONG_VALUE : r;
}
/* Each typed getter: NULL handle, NULL out, and NCCL_DEBUG (an enum: no integer or string). */
#define PARAM_GETTER_CASES(fn, T)                                                   \
  static int param_##fn##_null_handle(void) {                                       \
    T v;                                                                           \
    return ncclParam##fn(NULL, &v);                                                \
  }                                                                                \
  static int param_##fn##_null_out(void) {                                          \
    return ncclParam##fn(bound("NCCL_DEBUG_SUBSYS"), NULL);                         \
  }                                                                                \
  static int param_##fn##_on_enum(void) {                                           \
    T v;                                                                           \
    return ncclParam##fn(bound("NCCL_DEBUG"), &v);                                 \
  }
PARAM_GETTER_CASES(GetI8, int8_t)
PARAM_GETTER_CASES(GetI16, int16_t)
PARAM_GETTER_CASES(GetI32, int32_t)
PARAM_GETTER_CASES(GetI64, int64_t)
PARAM_GETTER_CASES(GetU8, uint8_t)
PARAM_GETTER_CASES(GetU16, uint16_t)
PARAM_GETTER_CASES(GetU32, uint32_t)
PARAM_GETTER_CASES(GetU64, uint64_t)
PARAM_GETTER_CASES(GetStr, const char *)
static int param_get_raw_enum(void) {
  char buf[64];
  int len = -1;
  int r = ncclParamGet(bound("NCCL_DEBUG"), buf, sizeof buf, &len);
  snprintf(detail, sizeof detail, "len %d", len);
  return r == ncclSuccess && len != 4 ? WRONG_VALUE : r;
}
static int param_get_raw_too_small(void) {
  char buf[64];
  int len = -1;
  return ncclParamGet(bound("NCCL_DEBUG"), buf, 1, &len);
}
static int param_get_raw_null_handle(void) {
  char buf[64];
  int len = -1;
  return ncclParamGet(NULL, buf, sizeof buf, &len);
}
static int param_get_raw_null_out(void) {
  int len = -1;
  return ncclParamGet(bound("NCCL_DEBUG"), NULL, 64, &len);
}
static int param_get_raw_null_len(void) {
  char buf[64];
  return ncclParamGet(bound("NCCL_DEBUG"), buf, sizeof buf, NULL);
}
static int param_parameter_debug(void) {
  const char *v = NULL;
  int len = -1;
  int r = ncclParamGetParameter("NCCL_DEBUG", &v, &len);
  snprintf(detail, sizeof detail, "\"%s\" %d", v ? v : "(null)", len);
  return r == ncclSuccess && (!v || (int)strlen(v) != len) ? WRONG_VALUE : r;
}
static int param_parameter_unknown(void) {
  const char *v = NULL;
  int len = -1;
  return ncclParamGetParameter("NCCL_NO_SUCH_PARAM", &v, &len);
}
static int param_parameter_null_key(void) {
  const char *v = NULL;
  int len = -1;
  return ncclParamGetParameter(NULL, &v, &len);
}
static int param_parameter_null_value(void) {
  int len = -1;
  return ncclParamGetParameter("NCCL_DEBUG", NULL, &len);
}
static int param_parameter_null_len(void) {
  const char *v = NULL;
  return ncclParamGetParameter("NCCL_DEBUG", &v, NULL);
}
static int param_keys_null_table(void) {
  int n = -1;
  return ncclParamGetAllParameterKeys(NULL, &n);
}
static int param_keys_null_len(void) {
  const char **t = NULL;
  return ncclParamGetAllParameterKeys(&t, NULL);
}
/* ncclParamDumpAll's report, captured from stdout (where NVIDIA's library prints it). */
static char dumped[1 << 16];
static int capture_dump(void) {
  fflush(stdout);
  FILE *tmp = tmpfile();
  int saved = dup(1);
  if (!tmp || saved < 0 || dup2(fileno(tmp), 1) < 0) return WRONG_VALUE;
  ncclParamDumpAll();
  fflush(stdout);
  dup2(saved, 1);
  close(saved);
  rewind(tmp);
  size_t n = fread(dumped, 1, sizeof dumped - 1, tmp);
  dumped[n] = 0;
  fclose(tmp);
  return 0;
}
static int param_dump(void) {
  if (capture_dump()) return WRONG_VALUE;
  const char *subsys = strstr(dumped, "NCCL_DEBUG_SUBSYS (uint64_t)");
  snprintf(detail, sizeof detail, "%zu bytes", strlen(dumped));
  return strncmp(dumped, "=== ncclParam Registry Dump ===\n", 32) || !subsys ? WRONG_VALUE : 0;
}
/* A setting from the environment read back every way: bind, typed reads, text, raw bytes, the
 * key table and the dump. */
static int param_round_trip(void) {
  setenv("NCCL_BUFFSIZE", "1048576", 1);
  ncclParamHandle_t h = NULL;
  int r = ncclParamBind(&h, "NCCL_BUFFSIZE");
  if (r != ncclSuccess) return r;
  int64_t i64 = 0;
  int32_t i32 = 0;
  int8_t i8 = 0;
  if ((r = ncclParamGetI64(h, &i64)) || (r = ncclParamGetI32(h, &i32))) return r;
  if (ncclParamGetI8(h, &i8) != ncclInvalidArgument) return WRONG_VALUE; /* does not fit */
  const char *v = NULL;
  int len = -1;
  if ((r = ncclParamGetParameter("NCCL_BUFFSIZE", &v, &len))) return r;
  int64_t raw = 0;
  int rawlen = -1;
  if ((r = ncclParamGet(h, &raw, sizeof raw, &rawlen))) return r;
  const char **table = NULL;
  int n = -1, seen = 0;
  if ((r = ncclParamGetAllParameterKeys(&table, &n))) return r;
  for (int i = 0; i < n; i++)
    seen += !strcmp(table[i], "NCCL_BUFFSIZE") + !strcmp(table[i], "NCCL_DEBUG");
  if (capture_dump()) return WRONG_VALUE;
  int in_dump = strstr(dumped, "NCCL_BUFFSIZE (") &&
                strstr(dumped, "Current value=1048576 set_by=EnvVar");
  snprintf(detail, sizeof detail, "i64 %lld i32 %d text \"%s\" raw %lld/%d keys %d seen %d dump %d",
           (long long)i64, (int)i32, v ? v : "(null)", (long long)raw, rawlen, n, seen, in_dump);
  int ok = i64 == 1048576 && i32 == 1048576 && v && !strcmp(v, "1048576") && len == 7 &&
           raw == 1048576 && rawlen == 8 && seen == 2 && in_dump;
  return ok ? 0 : WRONG_VALUE;
}

#define CASE(fn, expected) {#fn, fn, expected, 0}
static const Case cases[] = {
    CASE(version_null, ncclInvalidArgument),
    CASE(version_value, ncclSuccess),
    CASE(errstr_minus1, 0),
    CASE(errstr_8, 0),
    CASE(errstr_9, 0),
    CASE(errstr_100, 0),
    CASE(errstr_int_min, 0),
    CASE(errstr_known, 0),
    CASE(unique_id_null, ncclInvalidArgument),
    CASE(unique_id_no_driver, ANY_CODE),
    CASE(init_rank_null_out, ncclInvalidArgument),
    CASE(init_rank_nranks0, ncclInvalidArgument),
    CASE(init_rank_nranks_negative, ncclInvalidArgument),
    CASE(init_rank_rank_eq_nranks, ncclInvalidArgument),
    CASE(init_rank_rank_negative, ncclInvalidArgument),
    {"init_rank_no_driver", init_rank_no_driver, ANY_ERROR, 1},
    CASE(init_config_bad_magic, ncclInvalidArgument),
    CASE(init_config_null_out, ncclInvalidArgument),
    CASE(init_config_bad_rank, ncclInvalidArgument),
    CASE(init_scalable_nid0, ncclInvalidArgument),
    CASE(init_scalable_null_ids, ncclInvalidArgument),
    CASE(init_all_ndev0, ncclSuccess),
    CASE(init_all_ndev_negative, ncclInvalidArgument),
    CASE(init_all_null_comms, ncclInvalidArgument),
    CASE(count_null, ncclInvalidArgument),
    CASE(count_garbage, ncclInvalidArgument),
    CASE(count_garbage_null_out, ncclInvalidArgument),
    CASE(cudevice_null, ncclInvalidArgument),
    CASE(cudevice_garbage, ncclInvalidArgument),
    CASE(userrank_null, ncclInvalidArgument),
    CASE(userrank_garbage, ncclInvalidArgument),
    CASE(async_error_null, ncclInvalidArgument),
    CASE(async_error_garbage, ncclInvalidArgument),
    CASE(finalize_null, ncclSuccess),
    CASE(finalize_garbage, ncclInvalidArgument),
    CASE(destroy_null, ncclSuccess),
    CASE(destroy_garbage, ncclInvalidArgument),
    CASE(abort_null, ncclSuccess),
    CASE(abort_garbage, ncclInvalidArgument),
    CASE(revoke_null, ncclSuccess),
    CASE(revoke_null_flags, ncclSuccess),
    CASE(revoke_garbage_default, ncclInvalidArgument),
    CASE(revoke_garbage_flags, ncclInvalidArgument),
    CASE(split_null, ncclInvalidArgument),
    CASE(split_garbage, ncclInvalidArgument),
    CASE(shrink_null, ncclInvalidArgument),
    CASE(shrink_garbage_negative_count, ncclInvalidArgument),
    CASE(comm_get_unique_id_null, ncclInvalidArgument),
    CASE(comm_get_unique_id_garbage, ncclInvalidArgument),
    CASE(grow_all_null, ncclInvalidArgument),
    CASE(grow_null_newcomm, ncclInvalidArgument),
    CASE(grow_new_rank_null_id, ncclInvalidArgument),
    CASE(grow_new_rank_eq_nranks, ncclInvalidArgument),
    CASE(grow_new_rank_negative, ncclInvalidArgument),
    CASE(grow_garbage_smaller, ncclInvalidArgument),
    CASE(suspend_null, ncclInvalidArgument),
    CASE(suspend_garbage, ncclInvalidArgument),
    CASE(resume_null, ncclInvalidArgument),
    CASE(mem_stats_null, ncclInvalidArgument),
    CASE(mem_stats_null_value, ncclInvalidArgument),
    CASE(win_user_ptr_null, ncclInvalidArgument),
    CASE(put_signal_null_comm, ncclInvalidArgument),
    CASE(signal_null_comm, ncclInvalidArgument),
    CASE(signal_garbage_comm, ncclInvalidArgument),
    CASE(wait_signal_null_comm, ncclInvalidArgument),
    CASE(query_properties_null_comm, ncclInvalidArgument),
    CASE(peer_pointer_null_window, ncclInvalidArgument),
    CASE(lsa_pointer_null_window, ncclInvalidArgument),
    CASE(lsa_multimem_null_window, ncclInvalidArgument),
    CASE(multimem_le_null_window, ncclInvalidArgument),
    CASE(encryption_null, ncclSuccess),
    CASE(encryption_none, ncclSuccess),
    CASE(encryption_psk_null, ncclInvalidArgument),
    CASE(encryption_psk_short, ncclInvalidArgument),
    CASE(encryption_psk_ok, ncclSuccess),
    CASE(encryption_bad_mode, ncclInvalidArgument),
    CASE(encryption_bad_magic, ncclInvalidArgument),
    CASE(register_null, ncclInvalidArgument),
    CASE(deregister_null, ncclInvalidArgument),
    CASE(window_register_null, ncclInvalidArgument),
    CASE(window_deregister_null, ncclSuccess),
    CASE(window_deregister_garbage_null_win, ncclSuccess),
    CASE(window_deregister_null_comm, ncclInvalidArgument),
    CASE(redop_create_null_comm, ncclInvalidArgument),
    CASE(redop_destroy_sum_null, ncclInvalidArgument),
    CASE(redop_destroy_avg_garbage, ncclInvalidArgument),
    CASE(redop_destroy_negative_null, ncclInvalidArgument),
    CASE(redop_destroy_uncreated_null, ncclInvalidArgument),
    CASE(allreduce_null, ncclInvalidArgument),
    CASE(allreduce_garbage, ncclInvalidArgument),
    CASE(allreduce_dtype_minus1, ncclInvalidArgument),
    CASE(allreduce_dtype_12, ncclInvalidArgument),
    CASE(allreduce_dtype_1000, ncclInvalidArgument),
    CASE(allreduce_op_minus1, ncclInvalidArgument),
    CASE(allreduce_op_5, ncclInvalidArgument),
    CASE(allreduce_op_huge, ncclInvalidArgument),
    CASE(broadcast_null, ncclInvalidArgument),
    CASE(broadcast_root_garbage, ncclInvalidArgument),
    CASE(bcast_null, ncclInvalidArgument),
    CASE(reduce_null, ncclInvalidArgument),
    CASE(reduce_root_huge_null, ncclInvalidArgument),
    CASE(allgather_null, ncclInvalidArgument),
    CASE(reducescatter_null, ncclInvalidArgument),
    CASE(alltoall_null, ncclInvalidArgument),
    CASE(gather_null, ncclInvalidArgument),
    CASE(scatter_null, ncclInvalidArgument),
    CASE(send_null, ncclInvalidArgument),
    CASE(recv_null, ncclInvalidArgument),
    CASE(allreduce_config_null_config, ncclInvalidArgument),
    CASE(allreduce_config_null_comm, ncclInvalidArgument),
    CASE(allreduce_config_garbage_comm, ncclInvalidArgument),
    CASE(allreduce_config_bad_magic, ncclInvalidArgument),
    CASE(allreduce_config_size_8, ncclInvalidArgument),
    CASE(allreduce_config_size_56, ncclInvalidArgument),
    CASE(allreduce_config_force_2, ncclInvalidArgument),
    CASE(allreduce_config_policy_4, ncclInvalidArgument),
    CASE(allreduce_config_maxctas_0, ncclInvalidArgument),
    CASE(allreduce_config_min_above_max, ncclInvalidArgument),
    CASE(allreduce_config_unknown_selection, ncclInvalidArgument),
    CASE(allreduce_config_ext_cycle, ncclInvalidArgument),
    CASE(broadcast_config_null, ncclInvalidArgument),
    CASE(reduce_config_null, ncclInvalidArgument),
    CASE(allgather_config_null, ncclInvalidArgument),
    CASE(reducescatter_config_null, ncclInvalidArgument),
    CASE(alltoall_config_null, ncclInvalidArgument),
    CASE(gather_config_null, ncclInvalidArgument),
    CASE(scatter_config_null, ncclInvalidArgument),
    CASE(send_peer_garbage, ncclInvalidArgument),
    CASE(recv_garbage, ncclInvalidArgument),
    CASE(group_end_without_start, ncclInvalidUsage),
    CASE(group_nested_end_twice, ncclInvalidUsage),
    CASE(group_simulate_without_start, ncclInvalidUsage),
    CASE(group_simulate_bad_magic, ncclInvalidArgument),
    CASE(group_simulate_null_info, ncclSuccess),
    CASE(group_simulate_empty, ANY_CODE),
    CASE(mem_alloc_null_ptr, ncclUnhandledCudaError),
    CASE(mem_alloc_no_driver, ANY_ERROR),
    CASE(mem_free_foreign, ncclUnhandledCudaError),
    CASE(mem_free_heap, ncclUnhandledCudaError),
    CASE(param_bind_null_out, ncclInvalidArgument),
    CASE(param_bind_null_key, ncclInvalidArgument),
    CASE(param_bind_unknown, ncclInvalidArgument),
    CASE(param_bind_short_name, ncclInvalidArgument),
    CASE(param_bind_debug, ncclSuccess),
    CASE(param_GetI8_null_handle, ncclInvalidArgument),
    CASE(param_GetI8_null_out, ncclInvalidArgument),
    CASE(param_GetI8_on_enum, ncclInvalidArgument),
    CASE(param_GetI16_null_handle, ncclInvalidArgument),
    CASE(param_GetI16_null_out, ncclInvalidArgument),
    CASE(param_GetI16_on_enum, ncclInvalidArgument),
    CASE(param_GetI32_null_handle, ncclInvalidArgument),
    CASE(param_GetI32_null_out, ncclInvalidArgument),
    CASE(param_GetI32_on_enum, ncclInvalidArgument),
    CASE(param_GetI64_null_handle, ncclInvalidArgument),
    CASE(param_GetI64_null_out, ncclInvalidArgument),
    CASE(param_GetI64_on_enum, ncclInvalidArgument),
    CASE(param_GetU8_null_handle, ncclInvalidArgument),
    CASE(param_GetU8_null_out, ncclInvalidArgument),
    CASE(param_GetU8_on_enum, ncclInvalidArgument),
    CASE(param_GetU16_null_handle, ncclInvalidArgument),
    CASE(param_GetU16_null_out, ncclInvalidArgument),
    CASE(param_GetU16_on_enum, ncclInvalidArgument),
    CASE(param_GetU32_null_handle, ncclInvalidArgument),
    CASE(param_GetU32_null_out, ncclInvalidArgument),
    CASE(param_GetU32_on_enum, ncclInvalidArgument),
    CASE(param_GetU64_null_handle, ncclInvalidArgument),
    CASE(param_GetU64_null_out, ncclInvalidArgument),
    CASE(param_GetU64_on_enum, ncclInvalidArgument),
    CASE(param_GetStr_null_handle, ncclInvalidArgument),
    CASE(param_GetStr_null_out, ncclInvalidArgument),
    CASE(param_GetStr_on_enum, ncclInvalidArgument),
    CASE(param_get_raw_enum, ncclSuccess),
    CASE(param_get_raw_too_small, ncclInvalidArgument),
    CASE(param_get_raw_null_handle, ncclInvalidArgument),
    CASE(param_get_raw_null_out, ncclInvalidArgument),
    CASE(param_get_raw_null_len, ncclInvalidArgument),
    CASE(param_parameter_debug, ncclSuccess),
    CASE(param_parameter_unknown, ncclInvalidArgument),
    CASE(param_parameter_null_key, ncclInvalidArgument),
    CASE(param_parameter_null_value, ncclInvalidArgument),
    CASE(param_parameter_null_len, ncclInvalidArgument),
    CASE(param_keys_null_table, ncclInvalidArgument),
    CASE(param_keys_null_len, ncclInvalidArgument),
    CASE(param_dump, ncclSuccess),
    CASE(param_round_trip, ncclSuccess),
};

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* What the child reports back through the pipe. */
typedef struct {
  int code;
  double ms;
  char last_error[512];
  char detail[512];
} Outcome;

static void clean(char *s) {
  for (; *s; s++)
    if (*s == '\t' || *s == '\n' || *s == '\r') *s = ' ';
}

static int mentions_driver(const char *msg) {
  static const char *words[] = {"driver", "cuda", "libcuda", "not yet supported", "no device"};
  for (size_t i = 0; i < sizeof words / sizeof *words; i++) {
    const char *w = words[i];
    for (const char *p = msg; *p; p++)
      if (strncasecmp(p, w, strlen(w)) == 0) return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  int report_only = argc > 1 && strcmp(argv[1], "--report") == 0;
  const char *only = getenv("BAD_INPUTS_CASE");
  int passed = 0, failed = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const Case *c = &cases[i];
    if (only && strcmp(only, c->name) != 0) continue;
    int fds[2];
    if (pipe(fds) != 0) { perror("pipe"); return 2; }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 2; }
    if (pid == 0) {
      close(fds[0]);
      alarm(20); /* nothing may hang: SIGALRM ends the case */
      Outcome o;
      memset(&o, 0, sizeof o);
      detail[0] = 0;
      double t0 = now_ms();
      o.code = c->run();
      o.ms = now_ms() - t0;
      const char *msg = ncclGetLastError(NULL);
      snprintf(o.last_error, sizeof o.last_error, "%s", msg ? msg : "(null)");
      snprintf(o.detail, sizeof o.detail, "%s", detail);
      if (write(fds[1], &o, sizeof o) != (ssize_t)sizeof o) _exit(3);
      _exit(0);
    }
    close(fds[1]);
    Outcome o;
    memset(&o, 0, sizeof o);
    ssize_t got = read(fds[0], &o, sizeof o);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    char code[32];
    int ok;
    if (got != (ssize_t)sizeof o) {
      if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
        snprintf(code, sizeof code, "TIMEOUT");
      else if (WIFSIGNALED(status))
        snprintf(code, sizeof code, "CRASH:%s", strsignal(WTERMSIG(status)));
      else
        snprintf(code, sizeof code, "EXIT:%d", WEXITSTATUS(status));
      ok = 0;
      snprintf(o.last_error, sizeof o.last_error, "-");
    } else {
      snprintf(code, sizeof code, "%d", o.code);
      int is_error = o.code != ncclSuccess;
      if (c->expected == ANY_CODE) ok = 1;
      else if (c->expected == ANY_ERROR) ok = is_error && o.code != WRONG_VALUE;
      else ok = o.code == c->expected;
      /* Every error leaves a message for ncclGetLastError (error-string cases excepted). */
      if (is_error && o.code != WRONG_VALUE && o.last_error[0] == 0) ok = 0;
      if (c->driver_message) ok = ok && o.ms < 5000.0 && mentions_driver(o.last_error);
    }
    clean(o.last_error);
    clean(o.detail);
    const char *verdict = report_only || c->expected == ANY_CODE ? "INFO" : ok ? "PASS" : "FAIL";
    if (!report_only && c->expected != ANY_CODE) ok ? passed++ : failed++;
    char expected[16];
    if (c->expected == ANY_ERROR) snprintf(expected, sizeof expected, "error");
    else if (c->expected == ANY_CODE) snprintf(expected, sizeof expected, "any");
    else snprintf(expected, sizeof expected, "%d", c->expected);
    printf("RESULT\t%s\t%s\t%s\t%s\t%.0f\t%s\t%s\n", c->name, code, expected, verdict, o.ms,
           o.last_error, o.detail);
  }
  if (!report_only) printf("bad_inputs: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
