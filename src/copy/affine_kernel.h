// The per-element work of affine rows (affine.h), shared by the CPU loop and the CUDA kernel:
// a program's steps on a pack of up to kPack values of the compute type, and the dispatch on
// the (source, destination) element types around it.
#pragma once

#include <cstdint>

#include "copy/affine.h"
#include "copy/affine_math.h"

namespace amem::copy::affine_kernel {

using affine_math::Bf16;
using affine_math::F16;

constexpr int kPack = 8;

template <typename C>
AMEM_HD C RoundTo(C v, int64_t dtype) {
  switch (dtype) {
    case kAffineF32: return static_cast<C>(static_cast<float>(v));
    case kAffineBf16: return static_cast<C>(affine_math::ToFloat(affine_math::ToBf16(static_cast<float>(v))));
    case kAffineF16: return static_cast<C>(affine_math::ToFloat(affine_math::ToF16(static_cast<float>(v))));
    default: return v;  // float64
  }
}

// Every value rounded to `dtype` (the switch once, outside the loop).
template <typename C>
AMEM_HD void RoundAll(C* v, int n, int64_t dtype) {
  switch (dtype) {
    case kAffineF32: for (int u = 0; u < n; ++u) v[u] = RoundTo<C>(v[u], kAffineF32); break;
    case kAffineBf16: for (int u = 0; u < n; ++u) v[u] = RoundTo<C>(v[u], kAffineBf16); break;
    case kAffineF16: for (int u = 0; u < n; ++u) v[u] = RoundTo<C>(v[u], kAffineF16); break;
    default: break;  // float64: held exactly
  }
}

// `v[u] op c[u]` (one constant `c[0]` when `scalar`), the operation chosen once.
template <int64_t Op, typename C>
AMEM_HD void OperateAll(C* v, int n, const C* c, bool scalar) {
  for (int u = 0; u < n; ++u) v[u] = affine_math::Operate<C>(Op, v[u], c[scalar ? 0 : u]);
}

// The program's steps on `n` (<= kPack) values of consecutive view elements from `first`.
template <typename C>
AMEM_HD void RunPack(C* v, int n, const AffineProgram& program, const double* constants, int64_t first) {
  for (int64_t k = 0; k < program.steps; ++k) {
    const AffineStep step = program.step[k];
    if (step.rounding & kRoundInput) RoundAll<C>(v, n, step.dtype);
    C c[kPack];
    const bool scalar = step.stride <= 0;
    if (scalar) {
      c[0] = static_cast<C>(constants[step.constant]);
    } else {
      for (int u = 0; u < n; ++u) c[u] = static_cast<C>(constants[step.constant + ((first + u) / step.stride) % step.extent]);
    }
    switch (step.op) {
      case kAffineMul: OperateAll<kAffineMul, C>(v, n, c, scalar); break;
      case kAffineDiv: OperateAll<kAffineDiv, C>(v, n, c, scalar); break;
      case kAffineAdd: OperateAll<kAffineAdd, C>(v, n, c, scalar); break;
      case kAffineSub: OperateAll<kAffineSub, C>(v, n, c, scalar); break;
      default: OperateAll<kAffineRsub, C>(v, n, c, scalar); break;
    }
    if (step.rounding & kRoundResult) RoundAll<C>(v, n, step.dtype);
  }
}

// Calls `f.template Go<S, D, C>()` for the program's types (C: float64 when the source or the
// destination is; a float64 step between narrower ends is refused where tables are built);
// false for unknown codes.
template <typename S, typename F>
AMEM_HD bool DispatchDestination(const AffineProgram& program, F& f) {
  switch (program.dst_dtype) {
    case kAffineF32: return f.template Go<S, float>();
    case kAffineBf16: return f.template Go<S, Bf16>();
    case kAffineF16: return f.template Go<S, F16>();
    case kAffineF64: return f.template Go<S, double>();
    default: return false;
  }
}

template <typename F>
AMEM_HD bool Dispatch(const AffineProgram& program, F& f) {
  switch (program.src_dtype) {
    case kAffineF32: return DispatchDestination<float>(program, f);
    case kAffineBf16: return DispatchDestination<Bf16>(program, f);
    case kAffineF16: return DispatchDestination<F16>(program, f);
    case kAffineF64: return DispatchDestination<double>(program, f);
    default: return false;
  }
}

template <typename S, typename D>
struct ComputeOf { using type = float; };
template <typename D>
struct ComputeOf<double, D> { using type = double; };
template <typename S>
struct ComputeOf<S, double> { using type = double; };
template <>
struct ComputeOf<double, double> { using type = double; };

}  // namespace amem::copy::affine_kernel
