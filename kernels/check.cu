// check.cu — owns the test entry `ox_check_reduce`, used by src/bin/oxccl-kernel-check: applies
// one (type, op) functor elementwise, as a two-input reduction would:
// out[i] = post(combine(pre(a[i]), pre(b[i]))), through the same ox_reduce_copy as the
// collectives (first pass pre-transforms b into out, second pass combines with a).
#include "prims.cuh"

extern "C" __global__ void ox_check_reduce(const void* a, const void* b, void* out, uint64_t n,
                                           uint32_t dtype, uint32_t op, uint32_t flags,
                                           uint64_t scalar, int32_t nranks) {
  bool pre = ox_has_pre(dtype, op), post = ox_has_post(dtype, op);
  OxRedArgs x;
  x.src0 = (const char*)b;
  x.src1 = nullptr;
  x.dst0 = (char*)out;
  x.dst1 = nullptr;
  x.n = n;
  x.pre = pre;
  x.post = false;
  ox_reduce_copy(x, dtype, op, flags, scalar, nranks);
  __syncthreads();
  x.src0 = (const char*)a;
  x.src1 = (const char*)out;
  x.pre = pre;
  x.post = post;
  ox_reduce_copy(x, dtype, op, flags, scalar, nranks);
}
