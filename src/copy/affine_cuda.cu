// The CUDA kernel of affine rows (affine.h), laid out as the byte copy kernel (copy_cuda.cu)
// is, since it has to move bytes as fast: one block per row piece (the host splits rows into
// pieces of at most kMaxPieceElements), the row's program in shared memory, a block of 512
// threads per piece. Rows computed in float32 whose steps are all scalars
// and none a division (a scale, an offset: the common case) take the hot path: 16-byte loads
// of the source (4 float32 or 8 bfloat16 values), four in flight per thread before the first
// is used (the tunables below), each step's constant converted once per row, no index
// arithmetic per element. Elements before the source's first 16-byte boundary, after
// the last whole load, and every element of a row whose destination is not aligned with its
// source go one at a time. Other rows (float64, vector steps, a division) take the general
// path, eight elements per thread at a time. The steps use the _rn intrinsics (affine_math.h):
// rounded once each, never contracted into a fused multiply-add.
#include <cuda_runtime.h>

#include <atomic>
#include <string>
#include <type_traits>

#include "copy/affine_cuda.h"
#include "copy/affine_kernel.h"
#include "copy/kernel_launch.h"

namespace amem::copy {
namespace {

// Tunables, each overridable at compile time (-D...) to measure variants of the hot path
// (benchmarks/affine_kernel.cu, scripts/tune_affine.sh); the library builds with these values.
// 512 threads, 2 blocks a multiprocessor and a block per piece: on an H200 the kernel went from
// 89-90% of cudaMemcpyAsync's rate to 95-96% (256 threads, 4 blocks, a grid of the resident
// blocks looping over the pieces; docs/benchmarks.md).
#ifndef AMEM_AFFINE_THREADS
#define AMEM_AFFINE_THREADS 512  // threads per block
#endif
#ifndef AMEM_AFFINE_IN_FLIGHT
#define AMEM_AFFINE_IN_FLIGHT 4  // 16-byte loads per thread issued before the first is used
#endif
#ifndef AMEM_AFFINE_MIN_BLOCKS
#define AMEM_AFFINE_MIN_BLOCKS 2  // __launch_bounds__' blocks per multiprocessor: the register cap
#endif
#ifndef AMEM_AFFINE_GRID
#define AMEM_AFFINE_GRID 0  // blocks per resident block slot; 0: one block per row piece
#endif
#ifndef AMEM_AFFINE_BALANCE
#define AMEM_AFFINE_BALANCE 0  // 1: grid trimmed so that every block runs the same number of pieces
#endif
// Which thread loads which 16 bytes of a batch (each thread's AMEM_AFFINE_IN_FLIGHT loads):
// 0: load u of thread t at t + u * threads (each load instruction of a block covers a contiguous
// threads * 16 bytes); 1: a warp's loads are one contiguous run of IN_FLIGHT * 512 bytes;
// 2: as 0, software pipelined: the next batch's loads are issued before this batch is stored;
// 3: as 0, staged through shared memory by asynchronous copies (cp.async), AMEM_AFFINE_STAGES
// batches in flight per thread without holding registers.
#ifndef AMEM_AFFINE_PATTERN
#define AMEM_AFFINE_PATTERN 0
#endif
// Pattern 3: batches in flight (STAGES * IN_FLIGHT * THREADS * 16 bytes of shared memory).
#ifndef AMEM_AFFINE_STAGES
#define AMEM_AFFINE_STAGES 4
#endif
// 1: a row of the program a block already holds skips reloading it (and the barriers around).
#ifndef AMEM_AFFINE_REUSE
#define AMEM_AFFINE_REUSE 0
#endif
// 1: bfloat16 results rounded and packed in their words' high halves (fewer instructions).
#ifndef AMEM_AFFINE_PACK
#define AMEM_AFFINE_PACK 0
#endif
// 0: plain loads; 1: streaming (ld.global.cs); 2: ld.global.nc with a 256-byte L2 prefetch.
#ifndef AMEM_AFFINE_LOAD
#define AMEM_AFFINE_LOAD 0
#endif
#ifndef AMEM_AFFINE_STORE
#define AMEM_AFFINE_STORE 0  // 0: plain stores; 1: streaming (st.global.cs: evict first)
#endif

constexpr int kThreads = AMEM_AFFINE_THREADS;
constexpr int kLoadBytes = 16;
constexpr int kInFlight = AMEM_AFFINE_IN_FLIGHT;
constexpr int kPattern = AMEM_AFFINE_PATTERN;
constexpr int kStages = AMEM_AFFINE_STAGES;
constexpr bool kReuse = AMEM_AFFINE_REUSE != 0;
// Pattern 3's staging buffer, in 16-byte slots (one otherwise: unused).
constexpr int kStagedSlots = kPattern == 3 ? kStages * kInFlight * kThreads : 1;
constexpr int64_t kFastRowElements = int64_t{1} << 30;  // element numbers of the hot path fit an int
static_assert(kThreads % 32 == 0 && kThreads >= kMaxAffineSteps && kInFlight >= 1,
              "whole warps, and a thread per step for the scalars");
static_assert(kPattern >= 0 && kPattern <= 3, "AMEM_AFFINE_PATTERN is 0, 1, 2 or 3");
static_assert(kStages >= 2 && kStagedSlots * 16 <= 40 * 1024,
              "pattern 3 stages in static shared memory (at most 40 KiB)");

// The hot path's 16-byte load of the source, with the cache policy chosen above.
__device__ __forceinline__ uint4 LoadSource(const uint4* from) {
#if AMEM_AFFINE_LOAD == 1 && defined(__CUDACC__)  // (the CPU emulation takes the plain load)
  return __ldcs(from);
#elif AMEM_AFFINE_LOAD == 2 && defined(__CUDA_ARCH__)
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(from));
  return v;
#else
  return *from;
#endif
}

// The hot path's stores of converted words, with the cache policy chosen above.
template <typename Vector>
__device__ __forceinline__ void StoreVector(Vector* to, const Vector& value) {
#if AMEM_AFFINE_STORE == 1 && defined(__CUDACC__)
  __stcs(to, value);
#else
  *to = value;
#endif
}

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
    StoreVector(reinterpret_cast<uint2*>(to), make_uint2(w[0], w[1]));
  } else {
#pragma unroll
    for (int i = 0; i < Words / 4; ++i) {
      StoreVector(reinterpret_cast<uint4*>(to) + i, make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]));
    }
  }
}

// Pattern 3's copies of 16 bytes into shared memory, a group of them committed, and the wait
// until at most `Pending` groups of this thread are still in flight. The CPU emulation copies at
// once (its index arithmetic is what it checks).
__device__ __forceinline__ void StageLoad(uint4* slot, const uint4* from) {
#if defined(__CUDA_ARCH__)
  const auto at = static_cast<unsigned>(__cvta_generic_to_shared(slot));
#if AMEM_AFFINE_LOAD == 2
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(at), "l"(from) : "memory");
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(at), "l"(from) : "memory");
#endif
#else
  *slot = *from;
#endif
}
__device__ __forceinline__ void StageCommit() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int Pending>
__device__ __forceinline__ void StageWait() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
#endif
}

// A bfloat16 result in the high half of a word (AMEM_AFFINE_PACK): the bits ToBf16 gives, shifted
// up 16 (a NaN: (u >> 16) | 0x40 there is u | 0x400000 here; otherwise the same rounding sum),
// so that two words pack with one byte permute and no shift, and the NaN test is one compare.
struct Bf16Pack {
  static __device__ __forceinline__ uint32_t High(float value) {
    const uint32_t u = __float_as_uint(value);
    if (value != value) return u | 0x00400000u;
    return u + 0x7fffu + ((u >> 16) & 1u);
  }
  // The high halves of `low` and `high`, in that order.
  static __device__ __forceinline__ uint32_t Halves(uint32_t low, uint32_t high) {
#if defined(__CUDACC__)
    return __byte_perm(low, high, 0x7632);
#else
    return (low >> 16) | (high & 0xffff0000u);
#endif
  }
};

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
  uint4* staged;                 // Fast, pattern 3: the block's staging slots (shared memory)
  bool bf16_product = false;     // Fast, AMEM_BF16_MUL: bfloat16 in and out, one exact scale (affine_math.h)

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
    if constexpr (AMEM_BF16_MUL && std::is_same_v<S, affine_math::Bf16> && std::is_same_v<D, affine_math::Bf16>) {
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
    if constexpr (AMEM_AFFINE_PACK && std::is_same_v<D, affine_math::Bf16>) {
#pragma unroll
      for (int w = 0; w < kWords; ++w) {
        out[w] = Bf16Pack::Halves(Bf16Pack::High(v[2 * w]), Bf16Pack::High(v[2 * w + 1]));
      }
    } else if constexpr (AMEM_BF16_CVT && std::is_same_v<D, affine_math::Bf16>) {
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

  // The `loads` 16-byte loads from `from` in batches of kInFlight per thread (AMEM_AFFINE_PATTERN
  // says which thread takes which); returns this thread's first load of what whole batches left,
  // which the caller takes kThreads apart (pattern 1 takes its own remainder: `loads`).
  template <typename S, typename D, typename C, int N>
  __device__ __forceinline__ int Batches(const uint4* from, char* to, int loads) const {
    constexpr int kOutBytes = N * static_cast<int>(sizeof(D));
    const auto at = [to](int load) { return to + static_cast<int64_t>(load) * kOutBytes; };
    if constexpr (kPattern == 1) {
      // Thread t's loads: k + u * 32 from k = its warp's run + its lane, runs of kInFlight * 32;
      // then what its last run holds below `loads` (nothing left for the caller's loop).
      int k = static_cast<int>(threadIdx.x) / 32 * (kInFlight * 32) + static_cast<int>(threadIdx.x) % 32;
      for (; k + (kInFlight - 1) * 32 < loads; k += kInFlight * kThreads) {
        uint4 a[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) a[u] = LoadSource(from + k + u * 32);
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) Convert<S, D, C, N>(a[u], at(k + u * 32));
      }
#pragma unroll
      for (int u = 0; u < kInFlight - 1; ++u) {
        if (k + u * 32 < loads) Convert<S, D, C, N>(LoadSource(from + k + u * 32), at(k + u * 32));
      }
      return loads;
    } else {
      int k = threadIdx.x;
      if constexpr (kPattern == 0) {
        for (; k + (kInFlight - 1) * kThreads < loads; k += kInFlight * kThreads) {
          uint4 a[kInFlight];
#pragma unroll
          for (int u = 0; u < kInFlight; ++u) a[u] = LoadSource(from + k + u * kThreads);
#pragma unroll
          for (int u = 0; u < kInFlight; ++u) Convert<S, D, C, N>(a[u], at(k + u * kThreads));
        }
      } else if constexpr (kPattern == 3) {
        // Batch b (this thread's loads k + b * step + u * threads) lands in stage b % kStages;
        // each thread reads back only the slots it filled itself, so no barrier is needed.
        constexpr int kStep = kInFlight * kThreads;
        const int last = k + (kInFlight - 1) * kThreads;  // this thread's last load of batch 0
        const int batches = last < loads ? (loads - last - 1) / kStep + 1 : 0;
        uint4* mine = staged + threadIdx.x;  // slot (stage, u) at mine[(stage * kInFlight + u) * kThreads]
        const auto issue = [&](int b) {
#pragma unroll
          for (int u = 0; u < kInFlight; ++u) {
            StageLoad(mine + ((b % kStages) * kInFlight + u) * kThreads, from + k + b * kStep + u * kThreads);
          }
        };
        for (int b = 0; b < kStages - 1; ++b) {
          if (b < batches) issue(b);
          StageCommit();  // an empty group when there is no batch b: the count of groups stays fixed
        }
        for (int b = 0; b < batches; ++b) {
          // Stage (b - 1) % kStages was read into registers and stored last round: free again.
          if (b + kStages - 1 < batches) issue(b + kStages - 1);
          StageCommit();
          StageWait<kStages - 1>();  // batch b has landed
#pragma unroll
          for (int u = 0; u < kInFlight; ++u) {
            Convert<S, D, C, N>(mine[((b % kStages) * kInFlight + u) * kThreads], at(k + b * kStep + u * kThreads));
          }
        }
        StageWait<0>();  // nothing of this row left in flight (empty groups only, by now)
        k += batches * kStep;
      } else if (k + (kInFlight - 1) * kThreads < loads) {
        // Pipelined: loads stay in flight while the previous batch is converted and stored (each
        // element still read and written by one thread, read before it is written).
        uint4 a[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) a[u] = LoadSource(from + k + u * kThreads);
        for (;;) {
          const int next = k + kInFlight * kThreads;
          const bool more = next + (kInFlight - 1) * kThreads < loads;
          uint4 b[kInFlight] = {};
          if (more) {
#pragma unroll
            for (int u = 0; u < kInFlight; ++u) b[u] = LoadSource(from + next + u * kThreads);
          }
#pragma unroll
          for (int u = 0; u < kInFlight; ++u) Convert<S, D, C, N>(a[u], at(k + u * kThreads));
          k = next;
          if (!more) break;
#pragma unroll
          for (int u = 0; u < kInFlight; ++u) a[u] = b[u];
        }
      }
      return k;
    }
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
      Convert<S, D, C, N>(LoadSource(from + k), to + static_cast<int64_t>(k) * kOutBytes);
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
  const DeviceRow<false> run{from, to, r.src_element, r.dst_element, r.count, program, constants, nullptr, nullptr};
  affine_kernel::Dispatch(*program, run);
}

__global__ void __launch_bounds__(kThreads, AMEM_AFFINE_MIN_BLOCKS)
    AffineCopyKernel(const BufferPointers pointers, const AffineRow* __restrict__ rows, int64_t count,
                     const AffineProgram* __restrict__ programs, int64_t program_count,
                     const double* __restrict__ constants, int64_t constant_count) {
  __shared__ AffineProgram program;
  __shared__ float scalars[kMaxAffineSteps];
  __shared__ uint4 staged[kStagedSlots];
  __shared__ int64_t loaded;  // kReuse: the program `program` and `scalars` hold (-1: none yet)
  if (kReuse) {
    if (threadIdx.x == 0) loaded = -1;
    __syncthreads();
  }
  for (int64_t k = blockIdx.x; k < count; k += gridDim.x) {
    const AffineRow r = rows[k];
    if (r.count <= 0 || r.src_index < 0 || r.dst_index < 0 || r.src_index >= kMaxBuffersPerSide ||
        r.dst_index >= kMaxBuffersPerSide || r.program < 0 || r.program >= program_count) {
      continue;  // checked on the host; never fault on a bad row (the same for every thread)
    }
    const char* from = pointers.sources[r.src_index];
    char* to = pointers.destinations[r.dst_index];
    if (from == nullptr || to == nullptr) continue;
    // With kReuse, every thread reads `loaded` before the first barrier below, and it changes
    // only after that barrier: all threads take the same branch.
    const bool reload = !kReuse || r.program != loaded;
    if (reload) {
      __syncthreads();  // the previous row's threads are done with `program` and `scalars`
      const auto* words = reinterpret_cast<const int64_t*>(&programs[r.program]);
      for (int w = threadIdx.x; w < static_cast<int>(sizeof(AffineProgram) / sizeof(int64_t)); w += kThreads) {
        reinterpret_cast<int64_t*>(&program)[w] = words[w];
      }
      if (kReuse && threadIdx.x == 0) loaded = r.program;
      __syncthreads();
    }
    bool sane = program.steps >= 1 && program.steps <= kMaxAffineSteps;
    bool plain_steps = true;  // scalars, no division (its slow case is a call: registers)
    for (int64_t s = 0; sane && s < program.steps; ++s) {
      const AffineStep& step = program.step[s];
      const int64_t length = step.stride > 0 ? step.extent : 1;
      sane = step.constant >= 0 && length >= 1 && step.constant <= constant_count - length;
      plain_steps = plain_steps && step.stride <= 0 && step.op != kAffineDiv;
    }
    if (!sane) continue;
    if (kReuse && reload) {  // the scalars of a sane program, once for all its rows (fast or not)
      if (threadIdx.x < program.steps) {
        scalars[threadIdx.x] = static_cast<float>(constants[program.step[threadIdx.x].constant]);
      }
      __syncthreads();
    }
    if (plain_steps && program.wide == 0 && r.count <= kFastRowElements) {
      if (!kReuse) {
        if (threadIdx.x < program.steps) {
          scalars[threadIdx.x] = static_cast<float>(constants[program.step[threadIdx.x].constant]);
        }
        __syncthreads();
      }
      const bool bf16_product = affine_math::IsBf16Product(program, scalars[0]);
      const DeviceRow<true> run{from,      to,      r.src_element, r.dst_element, r.count, &program,
                                constants, scalars, staged,        bf16_product};
      affine_kernel::Dispatch(program, run);
    } else {
      RunGeneral(from, to, r, &program, constants);
    }
  }
}

// Blocks the current device holds at once (multiprocessors times blocks each), read once per
// device (two threads reading it at once both store the same number).
int ResidentBlocks() {
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices];  // 0: not read yet
  int device = 0;
  cudaGetDevice(&device);
  const bool cached = device >= 0 && device < kDevices;
  if (cached) {
    if (const int blocks = known[device].load(std::memory_order_relaxed); blocks > 0) return blocks;
  }
  int sms = 0, each = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms < 1) sms = 132;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&each, AffineCopyKernel, kThreads, 0) != cudaSuccess || each < 1) {
    each = AMEM_AFFINE_MIN_BLOCKS;
  }
  if (cached) known[device].store(sms * each, std::memory_order_relaxed);
  return sms * each;
}

}  // namespace

Status LaunchAffineCopy(CUstream stream, const BufferPointers& pointers, const AffineRow* device_rows,
                        int64_t count, const AffineTable& device_table) {
  if (count == 0) return Status::Ok();
  const int64_t slots = AMEM_AFFINE_GRID > 0 ? ResidentBlocks() * int64_t{AMEM_AFFINE_GRID} : count;
  int64_t blocks = count < slots ? count : slots;
  if (AMEM_AFFINE_BALANCE) {  // as many rounds of pieces, spread evenly: no block runs one more than the others
    const int64_t rounds = (count + blocks - 1) / blocks;
    blocks = (count + rounds - 1) / rounds;
  }
  if (blocks > 0x7fffffff) blocks = 0x7fffffff;
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
