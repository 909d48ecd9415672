/*
 * tuner_abi.h: NCCL's tuner plugin ABI (NCCL_TUNER_PLUGIN; tables ncclTunerPlugin_v2 ..
 * ncclTunerPlugin_v6), written for oxccl's tests from the facts of NCCL's public plugin
 * ABI. NVIDIA's headers are not included: every name here carries an oxt_ / OXT_ prefix so
 * that it cannot clash with nccl.h, and only the layouts and values are NCCL's.
 */
#ifndef OXTEST_TUNER_ABI_H
#define OXTEST_TUNER_ABI_H

#include <stddef.h>
#include <stdint.h>

/* ncclResult_t */
typedef enum {
  oxt_success = 0,
  oxt_unhandled_cuda_error = 1,
  oxt_system_error = 2,
  oxt_internal_error = 3,
  oxt_invalid_argument = 4,
  oxt_invalid_usage = 5,
  oxt_remote_error = 6,
  oxt_in_progress = 7
} oxt_result_t;

/* ncclFunc_t */
typedef enum {
  oxt_func_broadcast = 0,
  oxt_func_reduce = 1,
  oxt_func_all_gather = 2,
  oxt_func_reduce_scatter = 3,
  oxt_func_all_reduce = 4,
  oxt_func_send_recv = 5,
  oxt_func_send = 6,
  oxt_func_recv = 7
} oxt_func_t;

/* ncclDebugLogLevel */
#define OXT_LOG_NONE 0
#define OXT_LOG_VERSION 1
#define OXT_LOG_WARN 2
#define OXT_LOG_INFO 3
#define OXT_LOG_ABORT 4
#define OXT_LOG_TRACE 5

/* ncclDebugLogSubSys: the tuner's subsystem flag */
#define OXT_LOG_TUNING 0x40UL

/* ncclDebugLogger_t */
typedef void (*oxt_logger_t)(int level, unsigned long flags, const char *file, int line, const char *fmt, ...);

/* Algorithm indices (rows of the cost table) */
#define OXT_ALGO_TREE 0
#define OXT_ALGO_RING 1
#define OXT_ALGO_COLLNET_DIRECT 2
#define OXT_ALGO_COLLNET_CHAIN 3
#define OXT_ALGO_NVLS 4
#define OXT_ALGO_NVLS_TREE 5
#define OXT_ALGO_PAT 6
#define OXT_NUM_ALGORITHMS 7

/* Protocol indices (columns of the cost table) */
#define OXT_PROTO_LL 0
#define OXT_PROTO_LL128 1
#define OXT_PROTO_SIMPLE 2
#define OXT_NUM_PROTOCOLS 3

/* A cost table entry the caller does not offer (and one the tuner takes away). */
#define OXT_ALGO_PROTO_IGNORE (-1.0f)

/* v3 and later pass the cost table as float** collCostTable; it is really one
 * float[numAlgo][numProto] block:  float (*table)[3] = (float (*)[3])collCostTable; */

/* ncclTuner_v2_t */
typedef struct {
  const char *name;
  oxt_result_t (*init)(size_t nRanks, size_t nNodes, oxt_logger_t logFunction, void **context);
  oxt_result_t (*getCollInfo)(void *context, oxt_func_t collType, size_t nBytes, int collNetSupport,
                              int nvlsSupport, int numPipeOps, int *algorithm, int *protocol, int *nChannels);
  oxt_result_t (*destroy)(void *context);
} oxt_tuner_v2_t;

/* ncclTuner_v3_t */
typedef struct {
  const char *name;
  oxt_result_t (*init)(size_t nRanks, size_t nNodes, oxt_logger_t logFunction, void **context);
  oxt_result_t (*getCollInfo)(void *context, oxt_func_t collType, size_t nBytes, int numPipeOps,
                              float **collCostTable, int numAlgo, int numProto, int *nChannels);
  oxt_result_t (*destroy)(void *context);
} oxt_tuner_v3_t;

/* ncclTuner_v4_t */
typedef struct {
  const char *name;
  oxt_result_t (*init)(size_t nRanks, size_t nNodes, oxt_logger_t logFunction, void **context);
  oxt_result_t (*getCollInfo)(void *context, oxt_func_t collType, size_t nBytes, int numPipeOps,
                              float **collCostTable, int numAlgo, int numProto, int regBuff, int *nChannels);
  oxt_result_t (*destroy)(void *context);
} oxt_tuner_v4_t;

/* ncclNvlDomainInfo_v5_t */
typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} oxt_nvl_domain_info_v5_t;

/* ncclTunerConstants_v5_t */
typedef struct {
  double baseLatencies[OXT_NUM_ALGORITHMS][OXT_NUM_PROTOCOLS];
  double hwLatencies[3][OXT_NUM_ALGORITHMS][OXT_NUM_PROTOCOLS];
  double llMaxBws[4][3];
  double perChMaxRingLL128Bws[4][3];
  double perChMaxTreeLL128Bws[4][3];
  double perChMaxTreeBws[4][3];
  double perChMaxNVLSTreeBws[4][3];
} oxt_tuner_constants_v5_t;

/* ncclTuner_v5_t */
typedef struct {
  const char *name;
  oxt_result_t (*init)(void **ctx, uint64_t commId, size_t nRanks, size_t nNodes, oxt_logger_t logFunction,
                       oxt_nvl_domain_info_v5_t *nvlDomainInfo, oxt_tuner_constants_v5_t *constants);
  oxt_result_t (*getCollInfo)(void *context, oxt_func_t collType, size_t nBytes, int numPipeOps,
                              float **collCostTable, int numAlgo, int numProto, int regBuff, int *nChannels);
  oxt_result_t (*finalize)(void *context);
} oxt_tuner_v5_t;

/* ncclTuner_v6_t */
typedef struct {
  const char *name;
  oxt_result_t (*init)(void **ctx, uint64_t commId, size_t nRanks, size_t nNodes, oxt_logger_t logFunction,
                       oxt_nvl_domain_info_v5_t *nvlDomainInfo, oxt_tuner_constants_v5_t *constants);
  oxt_result_t (*getCollInfo)(void *context, oxt_func_t collType, size_t nBytes, int numPipeOps,
                              float **collCostTable, int numAlgo, int numProto, int regBuff, int *nChannels);
  oxt_result_t (*finalize)(void *context);
  oxt_result_t (*getChunkSize)(void *context, oxt_func_t collType, size_t nBytes, int algo, int proto,
                               int nChannels, size_t *chunkSize);
} oxt_tuner_v6_t;

#endif /* OXTEST_TUNER_ABI_H */
