// The arithmetic of constant steps (affine.h), one definition for the CPU loop and the CUDA
// kernel: bit-exact conversions between float32 and bfloat16 / float16 (round to nearest even,
// float16 subnormals kept, overflow to infinity, NaN kept NaN), and the four operations
// rounded once each. On the GPU the operations are the _rn intrinsics, which nvcc never
// contracts into a fused multiply-add; the CPU file is compiled with -ffp-contract=off.
#pragma once

#include <cstdint>
#include <cstring>

#include "copy/affine.h"

#if defined(__CUDACC__)
#define AMEM_HD __host__ __device__ __forceinline__
#define AMEM_UNROLL _Pragma("unroll")
#else
#define AMEM_HD inline
#define AMEM_UNROLL
#endif

namespace amem::copy::affine_math {

// Storage types: the bits of one element.
struct Bf16 { uint16_t bits; };
struct F16 { uint16_t bits; };

AMEM_HD uint32_t BitsOf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
AMEM_HD float FloatOf(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

AMEM_HD float ToFloat(Bf16 x) { return FloatOf(static_cast<uint32_t>(x.bits) << 16); }

// On sm_80 and later the GPU rounds with its conversion
// instruction (cvt.rn.bf16.f32: round to nearest even, subnormals kept, overflow to infinity:
// the same bits as the integer rounding below for every number), two values a word where they
// are stored in pairs; a NaN still takes the integer path, since the instruction writes the
// canonical NaN where ml_dtypes keeps the sign and the payload. Fewer instructions for the
// bfloat16 destinations of the affine and stepped transpose kernels (H100: bf16 -> bf16 scaled
// swaps 2-7% faster than the integer rounding alone, docs/benchmarks.md).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define AMEM_BF16_CVT_ON_DEVICE 1
#else
#define AMEM_BF16_CVT_ON_DEVICE 0
#endif

AMEM_HD Bf16 ToBf16(float f) {
  uint32_t u = BitsOf(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
#if AMEM_BF16_CVT_ON_DEVICE
  uint16_t bits;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(f));
  return Bf16{bits};
#else
  u += 0x7fffu + ((u >> 16) & 1u);
  return Bf16{static_cast<uint16_t>(u >> 16)};
#endif
}

// Two values as bfloat16 in one word (`low` in the low half), as ToBf16 rounds each: on the GPU
// from sm_80 one instruction for the pair unless either is a NaN.
AMEM_HD uint32_t ToBf16Pair(float low, float high) {
#if AMEM_BF16_CVT_ON_DEVICE
  if (!(low != low) && !(high != high)) {
    uint32_t word;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(word) : "f"(high), "f"(low));  // d.hi = high, d.lo = low
    return word;
  }
#endif
  return static_cast<uint32_t>(ToBf16(low).bits) | static_cast<uint32_t>(ToBf16(high).bits) << 16;
}

AMEM_HD float ToFloat(F16 x) {
  const uint32_t sign = static_cast<uint32_t>(x.bits & 0x8000u) << 16;
  const uint32_t exponent = (x.bits >> 10) & 0x1fu;
  const uint32_t mantissa = x.bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float32
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return FloatOf(sign | 0x7f800000u | (mantissa << 13));
  return FloatOf(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

AMEM_HD F16 ToF16(float f) {
  const uint32_t u = BitsOf(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t x = u & 0x7fffffffu;
  if (x > 0x7f800000u) return F16{static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu))};  // NaN
  if (x >= 0x477ff000u) return F16{static_cast<uint16_t>(sign | 0x7c00u)};  // >= 65520: infinity
  if (x < 0x38800000u) {  // below 2^-14: a subnormal (or zero), mantissa * 2^-24
    if (x < 0x33000000u) return F16{sign};  // at most 2^-25: rounds to zero (the tie to even)
    const uint32_t m = (x & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - (x >> 23);  // 14 .. 24
    uint32_t r = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (r & 1u))) ++r;
    return F16{static_cast<uint16_t>(sign | r)};
  }
  uint32_t v = x - (112u << 23);  // exponent rebased from 127 to 15
  v += 0xfffu + ((v >> 13) & 1u);
  return F16{static_cast<uint16_t>(sign | (v >> 13))};
}

// Element type -> compute type C (float or double), and back with one rounding.
template <typename C> AMEM_HD C Load(float x) { return static_cast<C>(x); }
template <typename C> AMEM_HD C Load(double x) { return static_cast<C>(x); }
template <typename C> AMEM_HD C Load(Bf16 x) { return static_cast<C>(ToFloat(x)); }
template <typename C> AMEM_HD C Load(F16 x) { return static_cast<C>(ToFloat(x)); }

// Narrowing from double to the 16-bit types goes through float32, as ml_dtypes converts.
template <typename D, typename C> struct Store;
template <typename C> struct Store<float, C> { static AMEM_HD float Of(C v) { return static_cast<float>(v); } };
template <typename C> struct Store<double, C> { static AMEM_HD double Of(C v) { return static_cast<double>(v); } };
template <typename C> struct Store<Bf16, C> { static AMEM_HD Bf16 Of(C v) { return ToBf16(static_cast<float>(v)); } };
template <typename C> struct Store<F16, C> { static AMEM_HD F16 Of(C v) { return ToF16(static_cast<float>(v)); } };

// `a op b` (op: AffineOp) rounded once: on the GPU the _rn intrinsics, never contracted.
template <typename T>
AMEM_HD T Operate(int64_t op, T a, T b) {
#if defined(__CUDA_ARCH__)
  constexpr bool single = sizeof(T) == sizeof(float);
  switch (op) {
    case kAffineMul: return single ? __fmul_rn(a, b) : __dmul_rn(a, b);
    case kAffineDiv: return single ? __fdiv_rn(a, b) : __ddiv_rn(a, b);
    case kAffineAdd: return single ? __fadd_rn(a, b) : __dadd_rn(a, b);
    case kAffineSub: return single ? __fsub_rn(a, b) : __dsub_rn(a, b);
    default: return single ? __fsub_rn(b, a) : __dsub_rn(b, a);  // kAffineRsub
  }
#else
  switch (op) {
    case kAffineMul: return a * b;
    case kAffineDiv: return a / b;
    case kAffineAdd: return a + b;
    case kAffineSub: return a - b;
    default: return b - a;  // kAffineRsub
  }
#endif
}

// A bfloat16 row whose one step is a multiplication by a scale that bfloat16 holds exactly runs
// one bfloat16 multiply a pair on sm_90 (mul.rn.bf16x2). The same bits as a float32 multiply then a rounding to bfloat16: the
// product of two bfloat16 values (8 significant bits each) is exact in float32 wherever it is
// a normal float32, and in float32's subnormal range a first rounding could only move it onto a
// bfloat16 midpoint if its significant bits spanned 17 or more; NaNs are the canonical NaN both
// ways (the GPU's float32 multiply writes it, and ToBf16 keeps it 0x7fff). On the H200 it
// brought the transposed bf16 -> bf16 scaled swap from 1.36x the plain one to 1.14-1.27x
// (docs/benchmarks.md).

// Whether `scale` is a bfloat16 value (not a NaN): the condition for MulBf16Pair.
AMEM_HD bool HeldByBf16(float scale) { return scale == scale && ToFloat(ToBf16(scale)) == scale; }

// One bfloat16 value times `scale` (HeldByBf16), rounded to bfloat16: the bits of the steps'
// float32 multiply (Operate) and ToBf16, which is what it runs where the instruction is not.
AMEM_HD Bf16 MulBf16(Bf16 x, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint16_t product;
  asm("mul.rn.bf16 %0, %1, %2;" : "=h"(product) : "h"(x.bits), "h"(ToBf16(scale).bits));
  return Bf16{product};
#else
  return ToBf16(Operate<float>(kAffineMul, ToFloat(x), scale));
#endif
}

// Two bfloat16 values in a word (the first in the low half) each times `scale` (HeldByBf16), as
// MulBf16 multiplies each.
AMEM_HD uint32_t MulBf16Pair(uint32_t pair, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t both = static_cast<uint32_t>(ToBf16(scale).bits) * 0x10001u;
  uint32_t product;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(product) : "r"(pair), "r"(both));
  return product;
#else
  return static_cast<uint32_t>(MulBf16(Bf16{static_cast<uint16_t>(pair & 0xffffu)}, scale).bits) |
         static_cast<uint32_t>(MulBf16(Bf16{static_cast<uint16_t>(pair >> 16)}, scale).bits) << 16;
#endif
}

// Whether a program runs as MulBf16 / MulBf16Pair: bfloat16 in and out, one
// multiplication with no rounding of its own, by `scale` (its constant as float32) that
// bfloat16 holds exactly.
AMEM_HD bool IsBf16Product(const AffineProgram& program, float scale) {
  return program.steps == 1 && program.step[0].op == kAffineMul && program.step[0].stride <= 0 &&
         program.step[0].rounding == 0 && program.src_dtype == kAffineBf16 && program.dst_dtype == kAffineBf16 &&
         HeldByBf16(scale);
}

}  // namespace amem::copy::affine_math
