/* ABI facts of nccl.h: sizes, alignments, field offsets, enum values, macro values and types,
 * initializer contents. Compiled once against NVIDIA's nccl.h and once against ours (as C and
 * as C++); the printed outputs must be identical. Calls no library function. */
#include <nccl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define SIZE(T) printf("sizeof(%s) = %zu, alignof = %zu\n", #T, sizeof(T), (size_t)_Alignof(T))
#define OFFSET(T, F) printf("offsetof(%s, %s) = %zu, size %zu\n", #T, #F, offsetof(T, F), sizeof(((T *)0)->F))
#define VALUE(E) printf("%s = %lld (sizeof %zu, signed %d)\n", #E, (long long)(E), sizeof(E), (E) > 0 ? 1 : ((0 * (E) - 1) < 0))

#ifdef __cplusplus
#define _Alignof alignof
#endif

int main(void) {
  /* Types */
  SIZE(ncclUniqueId);
  SIZE(ncclConfig_t);
  SIZE(struct ncclConfig_v23100);
  SIZE(ncclCollConfig_t);
  SIZE(struct ncclCollConfig_v23200);
  SIZE(ncclConfigExt_t);
  SIZE(struct ncclConfigExt);
  SIZE(ncclWaitSignalDesc_t);
  SIZE(ncclEncryptionConfig_t);
  SIZE(struct ncclEncryptionConfig_v23200);
  SIZE(ncclEncryptionMode_t);
  SIZE(ncclCommMemStat_t);
  SIZE(ncclHostCftMode_t);
  SIZE(ncclNvlsHostMode_t);
  SIZE(ncclParamHandle_t);
  SIZE(ncclSimInfo_t);
  SIZE(struct ncclSimInfo_v22200);
  SIZE(ncclResult_t);
  SIZE(ncclRedOp_t);
  SIZE(ncclRedOp_dummy_t);
  SIZE(ncclDataType_t);
  SIZE(ncclScalarResidence_t);
  SIZE(ncclComm_t);
  SIZE(ncclWindow_t);

  /* Field offsets */
  OFFSET(ncclUniqueId, internal);
  OFFSET(ncclConfig_t, size);
  OFFSET(ncclConfig_t, magic);
  OFFSET(ncclConfig_t, version);
  OFFSET(ncclConfig_t, blocking);
  OFFSET(ncclConfig_t, cgaClusterSize);
  OFFSET(ncclConfig_t, minCTAs);
  OFFSET(ncclConfig_t, maxCTAs);
  OFFSET(ncclConfig_t, netName);
  OFFSET(ncclConfig_t, splitShare);
  OFFSET(ncclConfig_t, trafficClass);
  OFFSET(ncclConfig_t, commName);
  OFFSET(ncclConfig_t, collnetEnable);
  OFFSET(ncclConfig_t, CTAPolicy);
  OFFSET(ncclConfig_t, shrinkShare);
  OFFSET(ncclConfig_t, nvlsCTAs);
  OFFSET(ncclConfig_t, nChannelsPerNetPeer);
  OFFSET(ncclConfig_t, nvlinkCentricSched);
  OFFSET(ncclConfig_t, graphUsageMode);
  OFFSET(ncclConfig_t, numRmaCtx);
  OFFSET(ncclConfig_t, maxP2pPeers);
  OFFSET(ncclConfig_t, graphStreamOrdering);
  OFFSET(ncclConfig_t, launchOrderImplicit);
  OFFSET(ncclConfig_t, numRmaSig);
  OFFSET(ncclConfig_t, rmaEagerInit);
  OFFSET(ncclConfig_t, hostCftMode);
  OFFSET(ncclConfig_t, nvlsHostMode);
  OFFSET(ncclCollConfig_t, size);
  OFFSET(ncclCollConfig_t, magic);
  OFFSET(ncclCollConfig_t, version);
  OFFSET(ncclCollConfig_t, ext);
  OFFSET(ncclCollConfig_t, minCTAs);
  OFFSET(ncclCollConfig_t, maxCTAs);
  OFFSET(ncclCollConfig_t, nvlsCTAs);
  OFFSET(ncclCollConfig_t, cgaClusterSize);
  OFFSET(ncclCollConfig_t, algSelection);
  OFFSET(ncclCollConfig_t, forceAlgSelection);
  OFFSET(ncclCollConfig_t, CTAPolicy);
  OFFSET(ncclCollConfig_t, userProfilerTag);
  OFFSET(ncclCollConfig_t, launchCompletionEvent);
  OFFSET(ncclConfigExt_t, next);
  OFFSET(ncclConfigExt_t, key);
  OFFSET(ncclConfigExt_t, key.vendorId);
  OFFSET(ncclConfigExt_t, key.optionId);
  OFFSET(ncclConfigExt_t, val);
  OFFSET(ncclConfigExt_t, val.i);
  OFFSET(ncclConfigExt_t, val.s);
  OFFSET(ncclConfigExt_t, val.raw);
  OFFSET(ncclWaitSignalDesc_t, opCnt);
  OFFSET(ncclWaitSignalDesc_t, peer);
  OFFSET(ncclWaitSignalDesc_t, sigIdx);
  OFFSET(ncclWaitSignalDesc_t, ctx);
  OFFSET(ncclEncryptionConfig_t, size);
  OFFSET(ncclEncryptionConfig_t, magic);
  OFFSET(ncclEncryptionConfig_t, version);
  OFFSET(ncclEncryptionConfig_t, mode);
  OFFSET(ncclEncryptionConfig_t, psk);
  OFFSET(ncclSimInfo_t, size);
  OFFSET(ncclSimInfo_t, magic);
  OFFSET(ncclSimInfo_t, version);
  OFFSET(ncclSimInfo_t, estimatedTime);

  /* Enum values */
  VALUE(ncclSuccess);
  VALUE(ncclUnhandledCudaError);
  VALUE(ncclSystemError);
  VALUE(ncclInternalError);
  VALUE(ncclInvalidArgument);
  VALUE(ncclInvalidUsage);
  VALUE(ncclRemoteError);
  VALUE(ncclInProgress);
  VALUE(ncclTimeout);
  VALUE(ncclNumResults);
  VALUE(ncclNumOps_dummy);
  VALUE(ncclSum);
  VALUE(ncclProd);
  VALUE(ncclMax);
  VALUE(ncclMin);
  VALUE(ncclAvg);
  VALUE(ncclNumOps);
  VALUE(ncclMaxRedOp);
  VALUE(ncclInt8);
  VALUE(ncclChar);
  VALUE(ncclUint8);
  VALUE(ncclInt32);
  VALUE(ncclInt);
  VALUE(ncclUint32);
  VALUE(ncclInt64);
  VALUE(ncclUint64);
  VALUE(ncclFloat16);
  VALUE(ncclHalf);
  VALUE(ncclFloat32);
  VALUE(ncclFloat);
  VALUE(ncclFloat64);
  VALUE(ncclDouble);
  VALUE(ncclBfloat16);
  VALUE(ncclFloat8e4m3);
  VALUE(ncclFloat8e5m2);
  VALUE(ncclNumTypes);
  VALUE(ncclScalarDevice);
  VALUE(ncclScalarHostImmediate);
  VALUE(ncclHostCftDefault);
  VALUE(ncclHostCftEnable);
  VALUE(ncclHostCftDisable);
  VALUE(ncclHostCftFallback);
  VALUE(ncclNvlsHostModeDefault);
  VALUE(ncclNvlsHostModeEnable);
  VALUE(ncclNvlsHostModeDisableTransport);
  VALUE(ncclNvlsHostModeDisableSymmetricMultimem);
  VALUE(ncclNvlsHostModeDisable);
  VALUE(ncclStatGpuMemSuspend);
  VALUE(ncclStatGpuMemSuspended);
  VALUE(ncclStatGpuMemPersist);
  VALUE(ncclStatGpuMemTotal);
  VALUE(NCCL_ENCRYPTION_MODE_NONE);
  VALUE(NCCL_ENCRYPTION_MODE_PSK);

  /* Macros */
  VALUE(NCCL_MAJOR);
  VALUE(NCCL_MINOR);
  VALUE(NCCL_PATCH);
  printf("NCCL_SUFFIX = \"%s\" (sizeof %zu)\n", NCCL_SUFFIX, sizeof(NCCL_SUFFIX));
  VALUE(NCCL_VERSION_CODE);
  VALUE(NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH));
  VALUE(NCCL_VERSION(2, 8, 4));
  VALUE(NCCL_VERSION(2, 9, 0));
  VALUE(NCCL_VERSION(3, 0, 1));
  VALUE(NCCL_VERSION(1 + 1, 27 + 1, 9));
  printf("NCCL_COMM_NULL = %p (sizeof %zu)\n", (void *)NCCL_COMM_NULL, sizeof(NCCL_COMM_NULL));
  VALUE(NCCL_UNIQUE_ID_BYTES);
  VALUE(NCCL_CONFIG_UNDEF_INT);
  printf("NCCL_CONFIG_UNDEF_PTR = %p (sizeof %zu)\n", (void *)NCCL_CONFIG_UNDEF_PTR,
         sizeof(NCCL_CONFIG_UNDEF_PTR));
  VALUE(NCCL_SPLIT_NOCOLOR);
  printf("NCCL_UNDEF_FLOAT = %a (sizeof %zu)\n", (double)NCCL_UNDEF_FLOAT, sizeof(NCCL_UNDEF_FLOAT));
  VALUE(NCCL_WIN_DEFAULT);
  VALUE(NCCL_WIN_COLL_SYMMETRIC);
  VALUE(NCCL_WIN_STRICT_ORDERING);
  VALUE(NCCL_WIN_GIN_ONLY);
  VALUE(NCCL_WIN_CFT_COUNTED);
  VALUE(NCCL_WIN_REQUIRED_ALIGNMENT);
  printf("NCCL_API_MAGIC = %#llx (sizeof %zu)\n", (unsigned long long)NCCL_API_MAGIC,
         sizeof(NCCL_API_MAGIC));
  VALUE(NCCL_SUSPEND_MEM);
  VALUE(NCCL_CTA_POLICY_DEFAULT);
  VALUE(NCCL_CTA_POLICY_EFFICIENCY);
  VALUE(NCCL_CTA_POLICY_ZERO);
  VALUE(NCCL_SHRINK_DEFAULT);
  VALUE(NCCL_SHRINK_ABORT);
  VALUE(NCCL_REVOKE_DEFAULT);

  /* Initializers: every field, and every byte (padding included, after a memset). */
  {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    printf("config: size %zu magic %#x version %u blocking %d cgaClusterSize %d minCTAs %d "
           "maxCTAs %d netName %p splitShare %d trafficClass %d commName %p collnetEnable %d "
           "CTAPolicy %d shrinkShare %d nvlsCTAs %d nChannelsPerNetPeer %d "
           "nvlinkCentricSched %d\n",
           config.size, config.magic, config.version, config.blocking, config.cgaClusterSize,
           config.minCTAs, config.maxCTAs, (const void *)config.netName, config.splitShare,
           config.trafficClass, (const void *)config.commName, config.collnetEnable,
           config.CTAPolicy, config.shrinkShare, config.nvlsCTAs, config.nChannelsPerNetPeer,
           config.nvlinkCentricSched);
    printf("config (2.31+): graphUsageMode %d numRmaCtx %d maxP2pPeers %d graphStreamOrdering %d "
           "launchOrderImplicit %d numRmaSig %d rmaEagerInit %d hostCftMode %d nvlsHostMode %d\n",
           config.graphUsageMode, config.numRmaCtx, config.maxP2pPeers, config.graphStreamOrdering,
           config.launchOrderImplicit, config.numRmaSig, config.rmaEagerInit, config.hostCftMode,
           config.nvlsHostMode);
  }
  {
    ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
    printf("collConfig: size %zu magic %#x version %u ext %p minCTAs %d maxCTAs %d nvlsCTAs %d "
           "cgaClusterSize %d algSelection %p forceAlgSelection %d CTAPolicy %d "
           "userProfilerTag %llu launchCompletionEvent %p\n",
           cc.size, cc.magic, cc.version, (void *)cc.ext, cc.minCTAs, cc.maxCTAs, cc.nvlsCTAs,
           cc.cgaClusterSize, (const void *)cc.algSelection, cc.forceAlgSelection, cc.CTAPolicy,
           (unsigned long long)cc.userProfilerTag, (void *)cc.launchCompletionEvent);
  }
  {
    ncclEncryptionConfig_t ec = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
    printf("encryptionConfig: size %zu magic %#x version %u mode %d psk %p\n", ec.size, ec.magic,
           ec.version, ec.mode, (const void *)ec.psk);
  }
  {
    ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
    printf("simInfo: size %zu magic %#x version %u estimatedTime %a\n", info.size, info.magic,
           info.version, (double)info.estimatedTime);
  }
  return 0;
}
