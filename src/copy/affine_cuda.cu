// The CUDA kernel of affine rows (affine.h): one block per row piece (the host splits rows into
// pieces of at most kMaxPieceElements), the row's program in shared memory, eight elements
// per thread and load where both ends are aligned to eight elements (16-byte loads for the
// 16-bit types; two packs per thread in flight), one element at a time elsewhere. The steps use the _rn intrinsics
// (affine_math.h): rounded once each, never contracted into a fused multiply-add.
#include <cuda_runtime.h>

#include <string>

#include "copy/affine_cuda.h"
#include "copy/affine_kernel.h"

namespace amem::copy {
namespace {

constexpr int kThreads = 256;
using affine_kernel::kPack;

template <typename T>
struct alignas(sizeof(T) * kPack >= 16 ? 16 : sizeof(T) * kPack) Pack {
  T v[kPack];
};

struct DeviceRow {
  const char* src;
  char* dst;
  int64_t src_element;
  int64_t dst_element;
  int64_t count;
  const AffineProgram* program;
  const double* constants;

  // `n` elements from `i` (element by element: any alignment).
  template <typename S, typename D, typename C>
  __device__ void Loose(const S* in, D* out, int64_t i, int n) {
    C v[kPack];
    for (int u = 0; u < n; ++u) v[u] = affine_math::Load<C>(in[i + u]);
    affine_kernel::RunPack<C>(v, n, *program, constants, src_element + i);
    for (int u = 0; u < n; ++u) out[i + u] = affine_math::Store<D, C>::Of(v[u]);
  }

  // One pack: loaded values in, the program run, stored.
  template <typename S, typename D, typename C>
  __device__ __forceinline__ void Convert(const Pack<S>& a, Pack<D>& to, int64_t first) {
    C v[kPack];
#pragma unroll
    for (int u = 0; u < kPack; ++u) v[u] = affine_math::Load<C>(a.v[u]);
    affine_kernel::RunPack<C>(v, kPack, *program, constants, first);
    Pack<D> b;
#pragma unroll
    for (int u = 0; u < kPack; ++u) b.v[u] = affine_math::Store<D, C>::Of(v[u]);
    to = b;
  }

  template <typename S, typename D>
  __device__ bool Go() {
    using C = typename affine_kernel::ComputeOf<S, D>::type;
    const S* in = reinterpret_cast<const S*>(src) + src_element;
    D* out = reinterpret_cast<D*>(dst) + dst_element;
    // Elements until the source is aligned to a whole pack; packs only if the destination is then too.
    const uintptr_t in_at = reinterpret_cast<uintptr_t>(in) / sizeof(S);
    int64_t head = static_cast<int64_t>((kPack - in_at % kPack) % kPack);
    if (head > count) head = count;
    const bool packed = reinterpret_cast<uintptr_t>(in + head) % alignof(Pack<S>) == 0 &&
                        reinterpret_cast<uintptr_t>(out + head) % alignof(Pack<D>) == 0;
    if (!packed) head = count;
    for (int64_t i = threadIdx.x; i < head; i += blockDim.x) Loose<S, D, C>(in, out, i, 1);
    const int64_t packs = (count - head) / kPack;
    const Pack<S>* in_packs = reinterpret_cast<const Pack<S>*>(in + head);
    Pack<D>* out_packs = reinterpret_cast<Pack<D>*>(out + head);
    // Two packs per thread per turn, both loaded before either is computed: twice the bytes in flight.
    const int64_t stride = blockDim.x;
    for (int64_t k = threadIdx.x; k < packs; k += 2 * stride) {
      const bool second = k + stride < packs;
      const Pack<S> a = in_packs[k];
      Pack<S> a2;
      if (second) a2 = in_packs[k + stride];
      Convert<S, D, C>(a, out_packs[k], src_element + head + k * kPack);
      if (second) Convert<S, D, C>(a2, out_packs[k + stride], src_element + head + (k + stride) * kPack);
    }
    for (int64_t i = head + packs * kPack + threadIdx.x; i < count; i += blockDim.x) Loose<S, D, C>(in, out, i, 1);
    return true;
  }
};

// At least four blocks per multiprocessor (registers capped to fit): the bytes in flight.
__global__ void __launch_bounds__(kThreads, 4)
    AffineCopyKernel(const BufferPointers pointers, const AffineRow* __restrict__ rows, int64_t count,
                     const AffineProgram* __restrict__ programs, int64_t program_count,
                     const double* __restrict__ constants, int64_t constant_count) {
  __shared__ AffineProgram program;
  for (int64_t k = blockIdx.x; k < count; k += gridDim.x) {
    const AffineRow r = rows[k];
    if (r.count <= 0 || r.src_index < 0 || r.dst_index < 0 || r.src_index >= kMaxBuffersPerSide ||
        r.dst_index >= kMaxBuffersPerSide || r.program < 0 || r.program >= program_count) {
      continue;  // checked on the host; never fault on a bad row (the same for every thread)
    }
    const char* from = pointers.sources[r.src_index];
    char* to = pointers.destinations[r.dst_index];
    if (from == nullptr || to == nullptr) continue;
    __syncthreads();  // the previous row's threads are done with `program`
    const auto* words = reinterpret_cast<const int64_t*>(&programs[r.program]);
    for (int w = threadIdx.x; w < static_cast<int>(sizeof(AffineProgram) / sizeof(int64_t)); w += blockDim.x) {
      reinterpret_cast<int64_t*>(&program)[w] = words[w];
    }
    __syncthreads();
    bool sane = program.steps >= 1 && program.steps <= kMaxAffineSteps;
    for (int64_t s = 0; sane && s < program.steps; ++s) {
      const AffineStep& step = program.step[s];
      const int64_t length = step.stride > 0 ? step.extent : 1;
      sane = step.constant >= 0 && length >= 1 && step.constant <= constant_count - length;
    }
    if (!sane) continue;
    DeviceRow run{from, to, r.src_element, r.dst_element, r.count, &program, constants};
    affine_kernel::Dispatch(program, run);
  }
}

int AffineBlocks(int64_t count) {
  static int sms = [] {
    int device = 0, n = 0;
    cudaGetDevice(&device);
    return cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) == cudaSuccess ? n : 132;
  }();
  const int64_t wanted = static_cast<int64_t>(sms) * 8;
  return static_cast<int>(count < wanted ? count : wanted);
}

}  // namespace

Status LaunchAffineCopy(CUstream stream, const BufferPointers& pointers, const AffineRow* device_rows,
                        int64_t count, const AffineTable& device_table) {
  if (count == 0) return Status::Ok();
  AffineCopyKernel<<<AffineBlocks(count), kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      pointers, device_rows, count, device_table.programs, device_table.program_count,
      device_table.constants, device_table.constant_count);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    return Status::Error(std::string("affine copy kernel launch failed: ") + cudaGetErrorString(error));
  }
  return Status::Ok();
}

}  // namespace amem::copy
