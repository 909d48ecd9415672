// reduce.cuh — owns the reduction functors: for each of the 12 data types, its compute type
// and sum/prod/max/min, and for each op its pre-transform (PreMulSum and float Avg multiply
// every input by a scalar) and post-transform (integer Avg divides the sum by nranks).
// Reused by the collectives (prims.cuh) and by the ox_check_reduce test entry (check.cu).
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include "ox_abi.h"

// Per-type arithmetic. C is the compute type (half for the fp8 types, as NCCL does);
// Bits is an unsigned integer of the same size as T, for raw loads and stores.
template <typename T> struct OxTraits;

template <typename T, typename U> struct OxIntTraits {
  using C = T;
  using Bits = U;
  static constexpr bool kFloat = false;
  __device__ static C to_c(T x) { return x; }
  __device__ static T from_c(C x) { return x; }
  // Wrap-around arithmetic through the unsigned type (no signed-overflow UB).
  __device__ static C add(C a, C b) { return (C)(U)((U)a + (U)b); }
  __device__ static C mul(C a, C b) { return (C)(U)((U)a * (U)b); }
  __device__ static C max(C a, C b) { return a < b ? b : a; }
  __device__ static C min(C a, C b) { return a < b ? a : b; }
  __device__ static C div_n(C a, int n) { return (C)(a / (C)n); }
  __device__ static C inv_n(int) { return (C)1; }  // unused: integer Avg is a post-divide
};
template <> struct OxTraits<int8_t> : OxIntTraits<int8_t, uint8_t> {};
template <> struct OxTraits<uint8_t> : OxIntTraits<uint8_t, uint8_t> {};
template <> struct OxTraits<int32_t> : OxIntTraits<int32_t, uint32_t> {};
template <> struct OxTraits<uint32_t> : OxIntTraits<uint32_t, uint32_t> {};
template <> struct OxTraits<int64_t> : OxIntTraits<int64_t, uint64_t> {};
template <> struct OxTraits<uint64_t> : OxIntTraits<uint64_t, uint64_t> {};

template <> struct OxTraits<float> {
  using C = float;
  using Bits = uint32_t;
  static constexpr bool kFloat = true;
  __device__ static C to_c(float x) { return x; }
  __device__ static float from_c(C x) { return x; }
  __device__ static C add(C a, C b) { return __fadd_rn(a, b); }
  __device__ static C mul(C a, C b) { return __fmul_rn(a, b); }
  __device__ static C max(C a, C b) { return fmaxf(a, b); }
  __device__ static C min(C a, C b) { return fminf(a, b); }
  __device__ static C div_n(C a, int) { return a; }
  __device__ static C inv_n(int n) { return 1.0f / (float)n; }
};
template <> struct OxTraits<double> {
  using C = double;
  using Bits = uint64_t;
  static constexpr bool kFloat = true;
  __device__ static C to_c(double x) { return x; }
  __device__ static double from_c(C x) { return x; }
  __device__ static C add(C a, C b) { return __dadd_rn(a, b); }
  __device__ static C mul(C a, C b) { return __dmul_rn(a, b); }
  __device__ static C max(C a, C b) { return fmax(a, b); }
  __device__ static C min(C a, C b) { return fmin(a, b); }
  __device__ static C div_n(C a, int) { return a; }
  __device__ static C inv_n(int n) { return 1.0 / (double)n; }
};
template <> struct OxTraits<__half> {
  using C = __half;
  using Bits = uint16_t;
  static constexpr bool kFloat = true;
  __device__ static C to_c(__half x) { return x; }
  __device__ static __half from_c(C x) { return x; }
  __device__ static C add(C a, C b) { return __hadd(a, b); }
  __device__ static C mul(C a, C b) { return __hmul(a, b); }
  __device__ static C max(C a, C b) { return __hmax(a, b); }
  __device__ static C min(C a, C b) { return __hmin(a, b); }
  __device__ static C div_n(C a, int) { return a; }
  __device__ static C inv_n(int n) { return __double2half(1.0 / (double)n); }
};
template <> struct OxTraits<__nv_bfloat16> {
  using C = __nv_bfloat16;
  using Bits = uint16_t;
  static constexpr bool kFloat = true;
  __device__ static C to_c(__nv_bfloat16 x) { return x; }
  __device__ static __nv_bfloat16 from_c(C x) { return x; }
  __device__ static C add(C a, C b) { return __hadd(a, b); }
  __device__ static C mul(C a, C b) { return __hmul(a, b); }
  __device__ static C max(C a, C b) { return __hmax(a, b); }
  __device__ static C min(C a, C b) { return __hmin(a, b); }
  __device__ static C div_n(C a, int) { return a; }
  __device__ static C inv_n(int n) { return __double2bfloat16(1.0 / (double)n); }
};
// fp8: computed in half, converted back with saturation to the largest finite value.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
// Before sm_89 the GPU has no fp8 conversion instructions and each conversion is emulated in
// dozens of instructions; inlined into every unrolled element of every loop, they made ptxas
// take about ten minutes for sm_80 (under one without the fp8 types). There, one out-of-line
// copy of each conversion; sm_89 and later convert inline, in one instruction.
template <typename F8> __device__ __noinline__ __half ox_fp8_to_half(F8 x) { return (__half)x; }
template <typename F8> __device__ __noinline__ F8 ox_half_to_fp8(__half x) { return F8(x); }
#define OX_FP8_CONVERT_OUT_OF_LINE 1
#endif
template <typename F8> struct OxFp8Traits {
  using C = __half;
  using Bits = uint8_t;
  static constexpr bool kFloat = true;
#ifdef OX_FP8_CONVERT_OUT_OF_LINE
  __device__ static C to_c(F8 x) { return ox_fp8_to_half<F8>(x); }
  __device__ static F8 from_c(C x) { return ox_half_to_fp8<F8>(x); }
#else
  __device__ static C to_c(F8 x) { return (__half)x; }
  __device__ static F8 from_c(C x) { return F8(x); }
#endif
  __device__ static C add(C a, C b) { return __hadd(a, b); }
  __device__ static C mul(C a, C b) { return __hmul(a, b); }
  __device__ static C max(C a, C b) { return __hmax(a, b); }
  __device__ static C min(C a, C b) { return __hmin(a, b); }
  __device__ static C div_n(C a, int) { return a; }
  __device__ static C inv_n(int n) { return __double2half(1.0 / (double)n); }
};
template <> struct OxTraits<__nv_fp8_e4m3> : OxFp8Traits<__nv_fp8_e4m3> {};
template <> struct OxTraits<__nv_fp8_e5m2> : OxFp8Traits<__nv_fp8_e5m2> {};

// Raw bit casts between T and its Bits type.
template <typename T>
__device__ __forceinline__ T ox_from_bits(typename OxTraits<T>::Bits b) {
  T t;
  memcpy(&t, &b, sizeof(T));
  return t;
}
template <typename T>
__device__ __forceinline__ typename OxTraits<T>::Bits ox_to_bits(T t) {
  typename OxTraits<T>::Bits b;
  memcpy(&b, &t, sizeof(T));
  return b;
}

// The functor of one (type, op): combine two values, pre- and post-transform one value.
template <typename T, int OP> struct OxRed {
  using Tr = OxTraits<T>;
  using C = typename Tr::C;
  // Inputs are multiplied by a scalar: user PreMulSum, and Avg on floating-point types.
  static constexpr bool kHasPre = OP == OX_PREMULSUM || (OP == OX_AVG && Tr::kFloat);
  // The result is divided by nranks: Avg on integer types.
  static constexpr bool kHasPost = OP == OX_AVG && !Tr::kFloat;
  C scalar;
  int nranks;

  // flags/scalar/nranks as in OxWork; scalar_device reads the device pointer now.
  __device__ OxRed(uint32_t flags, uint64_t scalar_word, int n) : nranks(n) {
    scalar = C();
    if (OP == OX_PREMULSUM) {
      typename Tr::Bits bits;
      if (flags & OX_FLAG_SCALAR_DEVICE) {
        bits = *(const volatile typename Tr::Bits*)scalar_word;
      } else {
        bits = (typename Tr::Bits)scalar_word;
      }
      scalar = Tr::to_c(ox_from_bits<T>(bits));
    } else if (OP == OX_AVG) {
      scalar = Tr::inv_n(n);
    }
  }
  __device__ __forceinline__ C combine(C a, C b) const {
    if (OP == OX_PROD) return Tr::mul(a, b);
    if (OP == OX_MAX) return Tr::max(a, b);
    if (OP == OX_MIN) return Tr::min(a, b);
    return Tr::add(a, b);
  }
  __device__ __forceinline__ C pre(C a) const { return kHasPre ? Tr::mul(a, scalar) : a; }
  __device__ __forceinline__ C post(C a) const { return kHasPost ? Tr::div_n(a, nranks) : a; }
};

// Runs BODY with T bound to the C++ type of a runtime data type code.
#define OX_FOR_TYPE(dtype, BODY)                       \
  switch (dtype) {                                     \
    case OX_INT8: { using T = int8_t; BODY; } break;   \
    case OX_UINT8: { using T = uint8_t; BODY; } break; \
    case OX_INT32: { using T = int32_t; BODY; } break; \
    case OX_UINT32: { using T = uint32_t; BODY; } break; \
    case OX_INT64: { using T = int64_t; BODY; } break; \
    case OX_UINT64: { using T = uint64_t; BODY; } break; \
    case OX_HALF: { using T = __half; BODY; } break;   \
    case OX_FLOAT: { using T = float; BODY; } break;   \
    case OX_DOUBLE: { using T = double; BODY; } break; \
    case OX_BF16: { using T = __nv_bfloat16; BODY; } break; \
    case OX_FP8E4M3: { using T = __nv_fp8_e4m3; BODY; } break; \
    case OX_FP8E5M2: { using T = __nv_fp8_e5m2; BODY; } break; \
    default: break;                                    \
  }

#define OX_FOR_OP(op, BODY)                                     \
  switch (op) {                                                 \
    case OX_SUM: { constexpr int OP = OX_SUM; BODY; } break;    \
    case OX_PROD: { constexpr int OP = OX_PROD; BODY; } break;  \
    case OX_MAX: { constexpr int OP = OX_MAX; BODY; } break;    \
    case OX_MIN: { constexpr int OP = OX_MIN; BODY; } break;    \
    case OX_AVG: { constexpr int OP = OX_AVG; BODY; } break;    \
    case OX_PREMULSUM: { constexpr int OP = OX_PREMULSUM; BODY; } break; \
    default: break;                                             \
  }

// Whether (dtype, op) has a pre / post transform, at run time.
__device__ __forceinline__ bool ox_has_pre(uint32_t dtype, uint32_t op) {
  bool is_float = dtype >= OX_HALF;
  return op == OX_PREMULSUM || (op == OX_AVG && is_float);
}
__device__ __forceinline__ bool ox_has_post(uint32_t dtype, uint32_t op) {
  return op == OX_AVG && dtype < OX_HALF;
}
