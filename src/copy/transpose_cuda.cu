// The fused transpose-and-cast kernel (transpose.h): one launch for a table of rows. Each block
// takes work units in turn: a 64x64 tile of a transposed view (read from the source along its
// rows into shared memory, converted, written along the view's rows: both sides coalesced), or
// a run of a cast. The conversions are CUDA's round-to-nearest-even instructions, the ones
// XLA's convert compiles to on the GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "copy/transpose.h"

namespace amem::copy {
namespace {

constexpr int kTile = static_cast<int>(kTransposeTile);
constexpr int kThreadsX = 32, kThreadsY = 8, kThreads = kThreadsX * kThreadsY;
constexpr int kPitch = kTile + 1;  // padding: a column of the tile spans all banks

struct Same2 {
  using Source = uint16_t;
  using Destination = uint16_t;
  __device__ static uint16_t Convert(uint16_t v) { return v; }
};
struct Same4 {
  using Source = uint32_t;
  using Destination = uint32_t;
  __device__ static uint32_t Convert(uint32_t v) { return v; }
};
struct F32ToBF16 {
  using Source = float;
  using Destination = __nv_bfloat16;
  __device__ static __nv_bfloat16 Convert(float v) { return __float2bfloat16_rn(v); }
};
struct F32ToF16 {
  using Source = float;
  using Destination = __half;
  __device__ static __half Convert(float v) { return __float2half_rn(v); }
};
struct BF16ToF32 {
  using Source = __nv_bfloat16;
  using Destination = float;
  __device__ static float Convert(__nv_bfloat16 v) { return __bfloat162float(v); }
};
struct F16ToF32 {
  using Source = __half;
  using Destination = float;
  __device__ static float Convert(__half v) { return __half2float(v); }
};

// Tile `unit` of a transposed row: view rows [j0, j0 + 64) of matrix b, view columns [i0, i0 + 64).
template <typename K>
__device__ void TransposeTile(const TransposeRow& row, int64_t unit, const char* source, char* destination,
                              unsigned char* shared) {
  using S = typename K::Source;
  using D = typename K::Destination;
  D* tile = reinterpret_cast<D*>(shared);
  const int64_t view_cols = row.rows, view_rows = row.cols, matrix = row.rows * row.cols;
  const int64_t tiles_down = (view_rows + kTile - 1) / kTile, tiles_across = (view_cols + kTile - 1) / kTile;
  const int64_t g0 = row.first / view_cols;
  const int64_t t0 = (g0 / view_rows) * tiles_down + (g0 % view_rows) / kTile;
  const int64_t tile_row = t0 + unit / tiles_across;
  const int64_t b = tile_row / tiles_down;
  const int64_t j0 = (tile_row % tiles_down) * kTile, i0 = (unit % tiles_across) * kTile;
  const S* src = reinterpret_cast<const S*>(source) + b * matrix;
  // Read: source rows i (the view's columns), along j (the view's rows): coalesced.
  for (int y = threadIdx.y; y < kTile; y += kThreadsY) {
    const int64_t i = i0 + y;
    for (int x = threadIdx.x; x < kTile; x += kThreadsX) {
      const int64_t j = j0 + x;
      if (i < view_cols && j < view_rows) tile[y * kPitch + x] = K::Convert(src[i * view_rows + j]);
    }
  }
  __syncthreads();
  // Write: view rows j, along i: coalesced; only the elements inside [first, first + count).
  D* dst = reinterpret_cast<D*>(destination + row.dst_offset);
  const int64_t end = row.first + row.count;
  for (int y = threadIdx.y; y < kTile; y += kThreadsY) {
    const int64_t j = j0 + y;
    if (j >= view_rows) break;
    const int64_t base = b * matrix + j * view_cols;
    for (int x = threadIdx.x; x < kTile; x += kThreadsX) {
      const int64_t i = i0 + x;
      const int64_t e = base + i;
      if (i < view_cols && e >= row.first && e < end) dst[e - row.first] = tile[x * kPitch + y];
    }
  }
  __syncthreads();  // the tile is the next unit's
}

// Unit `unit` of a cast row: elements [unit * kCastUnit, +kCastUnit) of the row.
template <typename K>
__device__ void CastRun(const TransposeRow& row, int64_t unit, const char* source, char* destination) {
  using S = typename K::Source;
  using D = typename K::Destination;
  const S* src = reinterpret_cast<const S*>(source) + row.first;
  D* dst = reinterpret_cast<D*>(destination + row.dst_offset);
  const int64_t begin = unit * kCastUnit;
  const int64_t end = begin + kCastUnit < row.count ? begin + kCastUnit : row.count;
  const int thread = threadIdx.y * kThreadsX + threadIdx.x;
  // Four elements a thread where both ends allow (kCastUnit is a multiple of 4): one wide load
  // and one wide store, as the copy kernel's words.
  struct alignas(4 * sizeof(S)) Loaded { S v[4]; };
  struct alignas(4 * sizeof(D)) Stored { D v[4]; };
  const bool wide = (reinterpret_cast<uintptr_t>(src) % sizeof(Loaded)) == 0 &&
                    (reinterpret_cast<uintptr_t>(dst) % sizeof(Stored)) == 0;
  int64_t n = begin + thread;
  if (wide) {
    for (int64_t q = begin + 4 * thread; q + 4 <= end; q += 4 * kThreads) {
      const Loaded in = *reinterpret_cast<const Loaded*>(src + q);
      Stored out;
#pragma unroll
      for (int k = 0; k < 4; ++k) out.v[k] = K::Convert(in.v[k]);
      *reinterpret_cast<Stored*>(dst + q) = out;
    }
    n = begin + ((end - begin) / 4) * 4 + thread;  // the tail
  }
  for (; n < end; n += kThreads) dst[n] = K::Convert(src[n]);
}

template <typename K>
__device__ void RunUnit(const TransposeRow& row, int64_t unit, const char* source, char* destination,
                        unsigned char* shared) {
  if (row.rows > 1 && row.cols > 1) {
    TransposeTile<K>(row, unit, source, destination, shared);
  } else {
    CastRun<K>(row, unit, source, destination);
  }
}

__global__ void __launch_bounds__(kThreads)
    TransposeKernel(const BufferPointers pointers, const TransposeRow* __restrict__ rows, int64_t count,
                    int64_t units) {
  __shared__ __align__(16) unsigned char shared[kTile * kPitch * 4];
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    int64_t lo = 0, hi = count - 1;  // the last row whose first unit is at most u
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (rows[mid].units <= u) lo = mid; else hi = mid - 1;
    }
    const TransposeRow row = rows[lo];
    if (row.src_index < 0 || row.dst_index < 0 || row.src_index >= kMaxBuffersPerSide ||
        row.dst_index >= kMaxBuffersPerSide) {
      continue;  // checked on the host; never fault on a bad row
    }
    const char* source = pointers.sources[row.src_index];
    char* destination = pointers.destinations[row.dst_index];
    if (source == nullptr || destination == nullptr) continue;
    const int64_t unit = u - row.units;
    switch (row.kind) {  // the same for every thread of the block: no divergence
      case kTransposeCopy2: RunUnit<Same2>(row, unit, source, destination, shared); break;
      case kTransposeCopy4: RunUnit<Same4>(row, unit, source, destination, shared); break;
      case kTransposeF32ToBF16: RunUnit<F32ToBF16>(row, unit, source, destination, shared); break;
      case kTransposeF32ToF16: RunUnit<F32ToF16>(row, unit, source, destination, shared); break;
      case kTransposeBF16ToF32: RunUnit<BF16ToF32>(row, unit, source, destination, shared); break;
      case kTransposeF16ToF32: RunUnit<F16ToF32>(row, unit, source, destination, shared); break;
      default: break;
    }
  }
}

int Blocks(int64_t units) {
  static int count = [] {
    int device = 0, multiprocessors = 0;
    cudaGetDevice(&device);
    if (cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      multiprocessors = 132;
    }
    return multiprocessors * 8;
  }();
  return static_cast<int>(units < count ? units : count);
}

}  // namespace

Status LaunchTransposeRows(CUstream stream, const BufferPointers& pointers, const TransposeRow* device_rows,
                           int64_t count, int64_t units) {
  if (count == 0 || units == 0) return Status::Ok();
  TransposeKernel<<<Blocks(units), dim3(kThreadsX, kThreadsY), 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      pointers, device_rows, count, units);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    return Status::Error(std::string("transpose copy kernel launch failed: ") + cudaGetErrorString(error));
  }
  return Status::Ok();
}

}  // namespace amem::copy
