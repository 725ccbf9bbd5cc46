// The CUDA kernel of affine rows (affine.h), laid out as the byte copy kernel (copy_cuda.cu)
// is, since it has to move bytes as fast: one block per row piece (the host splits rows into
// pieces of at most kMaxPieceElements), the row's program in shared memory, a block of 512
// threads per piece. Rows computed in float32 whose steps are all scalars
// and none a division (a scale, an offset: the common case) take the hot path: 16-byte loads
// of the source (4 float32 or 8 bfloat16 values), four in flight per thread before the first
// is used (the shape below), each step's constant converted once per row, no index
// arithmetic per element. Elements before the source's first 16-byte boundary, after
// the last whole load, and every element of a row whose destination is not aligned with its
// source go one at a time. Other rows (float64, vector steps, a division) take the general
// path, eight elements per thread at a time. The steps use the _rn intrinsics (affine_math.h):
// rounded once each, never contracted into a fused multiply-add.
#include <cuda_runtime.h>

#include <string>
#include <type_traits>

#include "copy/affine_cuda.h"
#include "copy/affine_kernel.h"
#include "copy/kernel_launch.h"

namespace amem::copy {
namespace {

// The hot path's shape: 512 threads, at most 2 blocks a multiprocessor (the register cap of
// __launch_bounds__) and a block per row piece; each thread issues 4 16-byte loads, thread t's
// load u at t + u * 512 (each load instruction of a block covers a contiguous 8 KiB), before it
// uses the first. On an H200 this went from 89-90% of cudaMemcpyAsync's rate to 95-96% (256
// threads, 4 blocks, a grid of the resident blocks looping over the pieces); warp-contiguous
// runs, software pipelining, staging through shared memory (cp.async), streaming and L2-prefetch
// hints, bfloat16 packed in high halves, programs kept across rows and balanced grids were all
// at or below that (docs/benchmarks.md, 0.2.0). scripts/tune_affine.sh times it on a GPU.
constexpr int kThreads = 512;
constexpr int kMinBlocks = 2;
constexpr int kInFlight = 4;
constexpr int kLoadBytes = 16;
constexpr int64_t kFastRowElements = int64_t{1} << 30;  // element numbers of the hot path fit an int
static_assert(kThreads % 32 == 0 && kThreads >= kMaxAffineSteps && kInFlight >= 1,
              "whole warps, and a thread per step for the scalars");

// The hot path's elements as bits in 32-bit words (float32: one a word, the 16-bit types two,
// the first in the low half), so that a load's values stay in registers as whole words.
template <typename T>
__device__ __forceinline__ T FromWord(uint32_t word, int u) {
  if constexpr (sizeof(T) == sizeof(uint32_t)) {
    return __uint_as_float(word);
  } else {
    return T{static_cast<uint16_t>(word >> (16 * (u & 1)))};
  }
}
template <typename T>
__device__ __forceinline__ uint32_t ToWord(T value, int u) {
  if constexpr (sizeof(T) == sizeof(uint32_t)) {
    return __float_as_uint(value);
  } else {
    return static_cast<uint32_t>(value.bits) << (16 * (u & 1));
  }
}

// `Words` 32-bit words stored at `to` (aligned to their size, at most 16 bytes a store).
template <int Words>
__device__ __forceinline__ void StoreWords(char* to, const uint32_t (&w)[Words]) {
  if constexpr (Words == 2) {
    *reinterpret_cast<uint2*>(to) = make_uint2(w[0], w[1]);
  } else {
#pragma unroll
    for (int i = 0; i < Words / 4; ++i) {
      reinterpret_cast<uint4*>(to)[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
    }
  }
}

// One row's work. `Fast`: the program computes in float32, every step is a scalar and none a
// division (the planner makes divisions multiplications by the reciprocal, as XLA does), and
// the row's element numbers fit 32 bits: the kernel's hot path, whole 16-byte loads, inlined.
// Otherwise (float64, vector steps, a division, a row longer than 2^30) the general path: eight
// elements a thread at a time, in a function of its own so that its registers (the vector
// constants' divisions) do not weigh on the hot path's.
template <bool Fast>
struct DeviceRow {
  const char* src;
  char* dst;
  int64_t src_element;
  int64_t dst_element;
  int64_t count;
  const AffineProgram* program;  // in shared memory
  const double* constants;
  const float* scalars;          // Fast: step k's constant, converted once (shared memory)
  bool bf16_product = false;     // Fast: bfloat16 in and out, one exact scale (affine_math.h's MulBf16Pair)

  // The steps on N values of the compute type (the first is view element `first`).
  template <typename C, int N>
  __device__ __forceinline__ void Steps(C (&v)[N], int64_t first) const {
    if constexpr (Fast) {
      const int steps = static_cast<int>(program->steps);
      for (int k = 0; k < steps; ++k) {
        C c[N];
#pragma unroll
        for (int u = 0; u < N; ++u) c[u] = scalars[k];
        affine_kernel::ApplyStep<C, N, false>(v, program->step[k], c);
      }
    } else {
      affine_kernel::RunSteps<C, N>(v, *program, constants, first);
    }
  }

  // `N` elements from element `i` of the row, read and written one by one (any alignment).
  template <typename S, typename D, typename C, int N>
  __device__ __forceinline__ void Run(const S* in, D* out, int64_t i) const {
    C v[N];
#pragma unroll
    for (int u = 0; u < N; ++u) v[u] = affine_math::Load<C>(in[i + u]);
    Steps<C, N>(v, src_element + i);
#pragma unroll
    for (int u = 0; u < N; ++u) out[i + u] = affine_math::Store<D, C>::Of(v[u]);
  }

  // One 16-byte load's N elements converted, run through the (scalar) steps, converted to the
  // destination's type and stored at `to`.
  template <typename S, typename D, typename C, int N>
  __device__ __forceinline__ void Convert(const uint4& a, char* to) const {
    const uint32_t in[4] = {a.x, a.y, a.z, a.w};
    if constexpr (std::is_same_v<S, affine_math::Bf16> && std::is_same_v<D, affine_math::Bf16>) {
      if (bf16_product) {
        uint32_t out[4];
#pragma unroll
        for (int w = 0; w < 4; ++w) out[w] = affine_math::MulBf16Pair(in[w], scalars[0]);
        StoreWords<4>(to, out);
        return;
      }
    }
    C v[N];
#pragma unroll
    for (int u = 0; u < N; ++u) v[u] = affine_math::Load<C>(FromWord<S>(in[u * sizeof(S) / 4], u));
    Steps<C, N>(v, 0);
    constexpr int kWords = N * static_cast<int>(sizeof(D)) / 4;
    uint32_t out[kWords] = {};
    if constexpr (std::is_same_v<D, affine_math::Bf16>) {
#pragma unroll
      for (int w = 0; w < kWords; ++w) out[w] = affine_math::ToBf16Pair(v[2 * w], v[2 * w + 1]);
    } else {
#pragma unroll
      for (int u = 0; u < N; ++u) out[u * sizeof(D) / 4] |= ToWord<D>(affine_math::Store<D, C>::Of(v[u]), u);
    }
    StoreWords<kWords>(to, out);
  }

  template <typename S, typename D>
  __device__ bool Go() const {
    using C = typename affine_kernel::ComputeOf<S, D>::type;
    if constexpr (!Fast) {
      return Loose<S, D, C>();
    } else if constexpr (sizeof(C) == sizeof(float)) {
      return Packed<S, D, C>();
    } else {
      return false;  // never called: float64 programs take the general path
    }
  }

  // The `loads` 16-byte loads from `from` in batches of kInFlight per thread, thread t's load u
  // of a batch at t + u * kThreads; returns this thread's first load of what whole batches left,
  // which the caller takes kThreads apart.
  template <typename S, typename D, typename C, int N>
  __device__ __forceinline__ int Batches(const uint4* from, char* to, int loads) const {
    constexpr int kOutBytes = N * static_cast<int>(sizeof(D));
    const auto at = [to](int load) { return to + static_cast<int64_t>(load) * kOutBytes; };
    int k = threadIdx.x;
    for (; k + (kInFlight - 1) * kThreads < loads; k += kInFlight * kThreads) {
      uint4 a[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) a[u] = from[k + u * kThreads];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) Convert<S, D, C, N>(a[u], at(k + u * kThreads));
    }
    return k;
  }

  template <typename S, typename D, typename C>
  __device__ bool Packed() const {
    constexpr int N = kLoadBytes / static_cast<int>(sizeof(S));
    constexpr int kOutBytes = N * static_cast<int>(sizeof(D));  // 8, 16 or 32
    constexpr int kOutAlign = kOutBytes < kLoadBytes ? kOutBytes : kLoadBytes;
    const int n = static_cast<int>(count);
    const S* in = reinterpret_cast<const S*>(src) + src_element;
    D* out = reinterpret_cast<D*>(dst) + dst_element;
    // Elements until the source is at a 16-byte boundary; whole loads only if the
    // destination is then aligned to its side of them too.
    const uintptr_t in_address = reinterpret_cast<uintptr_t>(in);
    int head = static_cast<int>((kLoadBytes - in_address % kLoadBytes) % kLoadBytes / sizeof(S));
    if (head > n) head = n;
    const bool whole = in_address % sizeof(S) == 0 && reinterpret_cast<uintptr_t>(out + head) % kOutAlign == 0;
    if (!whole) head = n;
    for (int i = threadIdx.x; i < head; i += kThreads) Run<S, D, C, 1>(in, out, i);
    const int loads = (n - head) / N;
    const uint4* from = reinterpret_cast<const uint4*>(in + head);
    char* to = reinterpret_cast<char*>(out + head);
    int k = Batches<S, D, C, N>(from, to, loads);
    for (; k < loads; k += kThreads) {
      Convert<S, D, C, N>(from[k], to + static_cast<int64_t>(k) * kOutBytes);
    }
    for (int i = head + loads * N + threadIdx.x; i < n; i += kThreads) Run<S, D, C, 1>(in, out, i);
    return true;
  }

  template <typename S, typename D, typename C>
  __device__ bool Loose() const {
    constexpr int N = 8;
    const S* in = reinterpret_cast<const S*>(src) + src_element;
    D* out = reinterpret_cast<D*>(dst) + dst_element;
    const int64_t whole = count / N * N;
    for (int64_t i = static_cast<int64_t>(threadIdx.x) * N; i < whole; i += kThreads * N) Run<S, D, C, N>(in, out, i);
    for (int64_t i = whole + threadIdx.x; i < count; i += kThreads) Run<S, D, C, 1>(in, out, i);
    return true;
  }
};

__device__ __noinline__ void RunGeneral(const char* from, char* to, const AffineRow r, const AffineProgram* program,
                                        const double* constants) {
  const DeviceRow<false> run{from, to, r.src_element, r.dst_element, r.count, program, constants, nullptr};
  affine_kernel::Dispatch(*program, run);
}

__global__ void __launch_bounds__(kThreads, kMinBlocks)
    AffineCopyKernel(const BufferPointers pointers, const AffineRow* __restrict__ rows, int64_t count,
                     const AffineProgram* __restrict__ programs, int64_t program_count,
                     const double* __restrict__ constants, int64_t constant_count) {
  __shared__ AffineProgram program;
  __shared__ float scalars[kMaxAffineSteps];
  for (int64_t k = blockIdx.x; k < count; k += gridDim.x) {
    const AffineRow r = rows[k];
    if (r.count <= 0 || r.src_index < 0 || r.dst_index < 0 || r.src_index >= kMaxBuffersPerSide ||
        r.dst_index >= kMaxBuffersPerSide || r.program < 0 || r.program >= program_count) {
      continue;  // checked on the host; never fault on a bad row (the same for every thread)
    }
    const char* from = pointers.sources[r.src_index];
    char* to = pointers.destinations[r.dst_index];
    if (from == nullptr || to == nullptr) continue;
    __syncthreads();  // the previous row's threads are done with `program` and `scalars`
    const auto* words = reinterpret_cast<const int64_t*>(&programs[r.program]);
    for (int w = threadIdx.x; w < static_cast<int>(sizeof(AffineProgram) / sizeof(int64_t)); w += kThreads) {
      reinterpret_cast<int64_t*>(&program)[w] = words[w];
    }
    __syncthreads();
    bool sane = program.steps >= 1 && program.steps <= kMaxAffineSteps;
    bool plain_steps = true;  // scalars, no division (its slow case is a call: registers)
    for (int64_t s = 0; sane && s < program.steps; ++s) {
      const AffineStep& step = program.step[s];
      const int64_t length = step.stride > 0 ? step.extent : 1;
      sane = step.constant >= 0 && length >= 1 && step.constant <= constant_count - length;
      plain_steps = plain_steps && step.stride <= 0 && step.op != kAffineDiv;
    }
    if (!sane) continue;
    if (plain_steps && program.wide == 0 && r.count <= kFastRowElements) {
      if (threadIdx.x < program.steps) {
        scalars[threadIdx.x] = static_cast<float>(constants[program.step[threadIdx.x].constant]);
      }
      __syncthreads();
      const bool bf16_product = affine_math::IsBf16Product(program, scalars[0]);
      const DeviceRow<true> run{from,      to,       r.src_element, r.dst_element, r.count, &program,
                                constants, scalars, bf16_product};
      affine_kernel::Dispatch(program, run);
    } else {
      RunGeneral(from, to, r, &program, constants);
    }
  }
}

}  // namespace

Status LaunchAffineCopy(CUstream stream, const BufferPointers& pointers, const AffineRow* device_rows,
                        int64_t count, const AffineTable& device_table) {
  if (count == 0) return Status::Ok();
  const int64_t blocks = count < 0x7fffffff ? count : 0x7fffffff;  // a block per row piece
  AMEM_LAUNCH(AffineCopyKernel, static_cast<int>(blocks), kThreads, reinterpret_cast<cudaStream_t>(stream))(
      pointers, device_rows, count, device_table.programs, device_table.program_count,
      device_table.constants, device_table.constant_count);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    return Status::Error(std::string("affine copy kernel launch failed: ") + cudaGetErrorString(error));
  }
  return Status::Ok();
}

}  // namespace amem::copy
