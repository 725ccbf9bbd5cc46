// The swap's copy kernel alone (copy::LaunchBufferSegmentCopy, what segment_copy_to_addresses
// launches), against cudaMemcpyAsync of the same buffers, measured in the same run with CUDA
// events: what the kernel itself costs, apart from the XLA call around it. On the GPU machine:
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -Isrc benchmarks/copy_kernel.cu src/copy/copy_cuda.cu \
//        src/copy/segments.cc -o /tmp/copy_kernel && /tmp/copy_kernel
//
// Each case: COUNT source and COUNT destination buffers of its own (cudaMalloc, as PyTorch's and
// XLA's allocators give), one row per buffer pair, split into the library's pieces
// (copy::kMaxPieceBytes) as the swap's tables are. Times are medians of 20 runs.
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "copy/copy_cuda.h"
#include "copy/segments.h"
#include "cuda_timing.h"

using amem::bench::Check;
using amem::bench::MedianMilliseconds;
using amem::copy::BufferPointers;
using amem::copy::BufferSegment;

int main() {
  cudaStream_t stream;
  Check(cudaStreamCreate(&stream), "cudaStreamCreate");
  struct Case { int count; long long bytes; };
  const Case cases[] = {{512, 16 << 10}, {256, 4 << 20}, {64, 16 << 20}, {16, 64 << 20},
                        {4, 256 << 20}, {1, 1 << 30}};
  std::printf("%-16s %10s %12s %12s %10s\n", "case", "MiB", "memcpy ms", "kernel ms", "kernel/memcpy");
  for (const Case& c : cases) {
    std::vector<char*> src(c.count), dst(c.count);
    BufferPointers pointers{};
    std::vector<BufferSegment> rows;
    for (int i = 0; i < c.count; ++i) {
      Check(cudaMalloc(&src[i], c.bytes), "cudaMalloc");
      Check(cudaMalloc(&dst[i], c.bytes), "cudaMalloc");
      Check(cudaMemset(src[i], i, c.bytes), "cudaMemset");
      pointers.sources[i] = src[i];
      pointers.destinations[i] = dst[i];
      rows.push_back({i, i, 0, 0, c.bytes, 0});
    }
    const auto pieces = amem::copy::SplitBufferSegments(rows.data(), rows.size());
    BufferSegment* table = nullptr;
    Check(cudaMalloc(&table, pieces.size() * sizeof(BufferSegment)), "cudaMalloc");
    Check(cudaMemcpy(table, pieces.data(), pieces.size() * sizeof(BufferSegment), cudaMemcpyHostToDevice),
          "table upload");
    const float memcpy_ms = MedianMilliseconds([&] {
      for (int i = 0; i < c.count; ++i) cudaMemcpyAsync(dst[i], src[i], c.bytes, cudaMemcpyDeviceToDevice, stream);
    }, stream);
    const float kernel_ms = MedianMilliseconds([&] {
      amem::copy::LaunchBufferSegmentCopy(reinterpret_cast<CUstream>(stream), pointers, table,
                                          static_cast<int64_t>(pieces.size()));
    }, stream);
    Check(cudaGetLastError(), "kernel");
    char name[48];
    std::snprintf(name, sizeof(name), "%d x %lld KiB", c.count, c.bytes >> 10);
    std::printf("%-16s %10.1f %12.3f %12.3f %9.0f%%\n", name, c.count * c.bytes / 1048576.0, memcpy_ms,
                kernel_ms, 100.0 * memcpy_ms / kernel_ms);
    cudaFree(table);
    for (int i = 0; i < c.count; ++i) {
      cudaFree(src[i]);
      cudaFree(dst[i]);
    }
  }
  return 0;
}
