#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "copy/copy_cuda.h"

namespace amem::copy {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

// Copies `bytes` with the widest word both pointers are aligned to, then the tail.
template <typename Word>
__device__ void CopyRun(const char* __restrict__ src, char* __restrict__ dst, int64_t bytes) {
  const int64_t words = bytes / static_cast<int64_t>(sizeof(Word));
  const Word* s = reinterpret_cast<const Word*>(src);
  Word* d = reinterpret_cast<Word*>(dst);
  int64_t i = threadIdx.x;
  // Several independent loads in flight per thread keep HBM busy.
  for (; i + (kUnroll - 1) * kThreads < words; i += kUnroll * kThreads) {
    Word v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = s[i + u * kThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) d[i + u * kThreads] = v[u];
  }
  for (; i < words; i += kThreads) d[i] = s[i];
  for (int64_t b = words * sizeof(Word) + threadIdx.x; b < bytes; b += kThreads) dst[b] = src[b];
}

__global__ void __launch_bounds__(kThreads)
    SegmentCopyKernel(const char* __restrict__ src, int64_t src_bytes, char* __restrict__ dst,
                      int64_t dst_bytes, const Segment* __restrict__ segments, int64_t count) {
  for (int64_t k = blockIdx.x; k < count; k += gridDim.x) {
    const Segment s = segments[k];
    if (s.bytes <= 0 || s.src_offset < 0 || s.dst_offset < 0 ||
        s.src_offset > src_bytes - s.bytes || s.dst_offset > dst_bytes - s.bytes) {
      continue;  // never fault the GPU on a bad table
    }
    const char* from = src + s.src_offset;
    char* to = dst + s.dst_offset;
    const uintptr_t alignment = reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to);
    if ((alignment & 15) == 0) {
      CopyRun<uint4>(from, to, s.bytes);
    } else if ((alignment & 7) == 0) {
      CopyRun<uint2>(from, to, s.bytes);
    } else if ((alignment & 3) == 0) {
      CopyRun<uint32_t>(from, to, s.bytes);
    } else {
      CopyRun<uint8_t>(from, to, s.bytes);
    }
  }
}

// Multiprocessor count of the current device, cached per device.
int MultiprocessorCount() {
  static std::mutex mutex;
  static std::unordered_map<int, int> counts;
  int device = 0;
  cudaGetDevice(&device);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = counts.find(device);
  if (it != counts.end()) return it->second;
  int count = 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    count = 132;
  }
  counts[device] = count;
  return count;
}

}  // namespace

bool HaveCudaKernels() { return true; }

Status LaunchSegmentCopy(CUstream stream, const char* src, int64_t src_bytes, char* dst,
                         int64_t dst_bytes, const Segment* device_segments, int64_t count) {
  if (count == 0) return Status::Ok();
  const int64_t blocks_wanted = static_cast<int64_t>(MultiprocessorCount()) * 8;
  const int blocks = static_cast<int>(count < blocks_wanted ? count : blocks_wanted);
  SegmentCopyKernel<<<blocks, kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      src, src_bytes, dst, dst_bytes, device_segments, count);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    return Status::Error(std::string("segment copy kernel launch failed: ") +
                         cudaGetErrorString(error));
  }
  return Status::Ok();
}

}  // namespace amem::copy
