// The per-element work of affine rows (affine.h), shared by the CPU loop and the CUDA kernel:
// a program's steps on N consecutive values of the compute type, and the dispatch on the
// (source, destination) element types around it.
#pragma once

#include <cstdint>

#include "copy/affine.h"
#include "copy/affine_math.h"

namespace amem::copy::affine_kernel {

using affine_math::Bf16;
using affine_math::F16;

template <typename C>
AMEM_HD C RoundTo(C v, int dtype) {
  switch (dtype) {
    case kAffineF32: return static_cast<C>(static_cast<float>(v));
    case kAffineBf16: return static_cast<C>(affine_math::ToFloat(affine_math::ToBf16(static_cast<float>(v))));
    case kAffineF16: return static_cast<C>(affine_math::ToFloat(affine_math::ToF16(static_cast<float>(v))));
    default: return v;  // float64
  }
}

template <int Dtype, typename C, int N>
AMEM_HD void RoundEach(C (&v)[N]) {
  AMEM_UNROLL
  for (int u = 0; u < N; ++u) v[u] = RoundTo<C>(v[u], Dtype);
}

// Every value rounded to `dtype` (the switch once, outside the loop).
template <typename C, int N>
AMEM_HD void RoundAll(C (&v)[N], int dtype) {
  switch (dtype) {
    case kAffineF32: RoundEach<kAffineF32, C, N>(v); break;
    case kAffineBf16: RoundEach<kAffineBf16, C, N>(v); break;
    case kAffineF16: RoundEach<kAffineF16, C, N>(v); break;
    default: break;  // float64: held exactly
  }
}

// `v[u] op c[u]`, the operation chosen once.
template <int64_t Op, typename C, int N>
AMEM_HD void OperateAll(C (&v)[N], const C (&c)[N]) {
  AMEM_UNROLL
  for (int u = 0; u < N; ++u) v[u] = affine_math::Operate<C>(Op, v[u], c[u]);
}

// A vector step's constants for view elements first .. first + N - 1: entry
// ((first + u) / stride) % extent, divided once and then counted element by element.
template <typename C, int N>
AMEM_HD void VectorConstants(C (&c)[N], const AffineStep& step, const double* constants, int64_t first) {
  const int64_t quotient = first / step.stride;
  int64_t within = first - quotient * step.stride;
  int64_t entry = quotient % step.extent;
  AMEM_UNROLL
  for (int u = 0; u < N; ++u) {
    c[u] = static_cast<C>(constants[step.constant + entry]);
    if (++within == step.stride) {
      within = 0;
      if (++entry == step.extent) entry = 0;
    }
  }
}

// One step on N values with their constants `c`: its input rounded, the operation, its result
// rounded; each rounding only where the host marked it as not a no-op. `Divisions` false: the
// caller has sent every division elsewhere (the GPU's hot path: a division's slow case is a call).
template <typename C, int N, bool Divisions = true>
AMEM_HD void ApplyStep(C (&v)[N], const AffineStep& step, const C (&c)[N]) {
  const int rounding = static_cast<int>(step.rounding);
  const int dtype = static_cast<int>(step.dtype);
  if (rounding & kRoundInput) RoundAll<C, N>(v, dtype);
  switch (static_cast<int>(step.op)) {
    case kAffineMul: OperateAll<kAffineMul, C, N>(v, c); break;
    case kAffineDiv:
      if constexpr (Divisions) OperateAll<kAffineDiv, C, N>(v, c);
      break;
    case kAffineAdd: OperateAll<kAffineAdd, C, N>(v, c); break;
    case kAffineSub: OperateAll<kAffineSub, C, N>(v, c); break;
    default: OperateAll<kAffineRsub, C, N>(v, c); break;
  }
  if (rounding & kRoundResult) RoundAll<C, N>(v, dtype);
}

// The program's steps on N values of consecutive view elements from `first` (the element
// number vectors are indexed by), each step's constant one scalar or a vector's entries.
template <typename C, int N>
AMEM_HD void RunSteps(C (&v)[N], const AffineProgram& program, const double* constants, int64_t first) {
  for (int64_t k = 0; k < program.steps; ++k) {
    const AffineStep& step = program.step[k];
    C c[N];
    if (step.stride <= 0) {
      const C value = static_cast<C>(constants[step.constant]);
      AMEM_UNROLL
      for (int u = 0; u < N; ++u) c[u] = value;
    } else {
      VectorConstants<C, N>(c, step, constants, first);
    }
    ApplyStep<C, N>(v, step, c);
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
