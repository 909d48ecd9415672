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
  SIZE(struct ncclConfig_v22800);
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
  VALUE(NCCL_WIN_REQUIRED_ALIGNMENT);
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
  }
  {
    ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
    printf("simInfo: size %zu magic %#x version %u estimatedTime %a\n", info.size, info.magic,
           info.version, (double)info.estimatedTime);
  }
  return 0;
}
