// ox_proto.cuh — owns the protocol regions of a connection slot, in the generated names of
// ox_abi.h only: the Simple region is the first slot_bytes - slot_bytes/OX_LL_REGION_DIV
// bytes of a slot, the LL region the last slot_bytes/OX_LL_REGION_DIV, and an LL step, one
// 8-byte word {4 data bytes, 4-byte flag} per 4 payload bytes, carries
// slot_bytes/(2*OX_LL_REGION_DIV) bytes. Rust computes the same in src/sched/device
// (simple_step_bytes, ll_step_bytes).
#pragma once
#include "ox_abi.h"

// Payload bytes of one Simple step; also where a slot's LL region starts.
__device__ __forceinline__ uint32_t ox_simple_bytes(uint32_t slot_bytes) {
  return slot_bytes - slot_bytes / OX_LL_REGION_DIV;
}
// Payload bytes of one LL step.
__device__ __forceinline__ uint32_t ox_ll_payload(uint32_t slot_bytes) {
  return slot_bytes / (2 * OX_LL_REGION_DIV);
}
