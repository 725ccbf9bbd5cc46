#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "copy/copy_cuda.h"
#include "copy/kernel_launch.h"

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

// The widest word both ends are aligned to.
__device__ void CopyAligned(const char* from, char* to, int64_t bytes) {
  const uintptr_t alignment = reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to);
  if ((alignment & 15) == 0) {
    CopyRun<uint4>(from, to, bytes);
  } else if ((alignment & 7) == 0) {
    CopyRun<uint2>(from, to, bytes);
  } else if ((alignment & 3) == 0) {
    CopyRun<uint32_t>(from, to, bytes);
  } else {
    CopyRun<uint8_t>(from, to, bytes);
  }
}

// Rows between many buffers; the pointers come by value with the launch.
__global__ void __launch_bounds__(kThreads)
    BufferSegmentCopyKernel(const BufferPointers pointers, const BufferSegment* __restrict__ segments,
                            int64_t count) {
  for (int64_t k = blockIdx.x; k < count; k += gridDim.x) {
    const BufferSegment s = segments[k];
    if (s.bytes <= 0 || s.src_index < 0 || s.dst_index < 0 || s.src_index >= kMaxBuffersPerSide ||
        s.dst_index >= kMaxBuffersPerSide) {
      continue;  // validated on the host; never fault on a bad row
    }
    const char* from = pointers.sources[s.src_index];
    char* to = pointers.destinations[s.dst_index];
    // Callers zero the slots past their buffers: an index beyond them (a table not made for
    // this call) is skipped instead of dereferencing null. Offsets cannot be checked here.
    if (from == nullptr || to == nullptr) continue;
    CopyAligned(from + s.src_offset, to + s.dst_offset, s.bytes);
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

int Blocks(int64_t count) {
  const int64_t blocks_wanted = static_cast<int64_t>(MultiprocessorCount()) * 8;
  return static_cast<int>(count < blocks_wanted ? count : blocks_wanted);
}

Status LaunchStatus(const char* what) {
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    return Status::Error(std::string(what) + " kernel launch failed: " + cudaGetErrorString(error));
  }
  return Status::Ok();
}

}  // namespace

bool HaveCudaKernels() { return true; }

Status LaunchBufferSegmentCopy(CUstream stream, const BufferPointers& pointers,
                               const BufferSegment* device_segments, int64_t count) {
  if (count == 0) return Status::Ok();
  AMEM_LAUNCH(BufferSegmentCopyKernel, Blocks(count), kThreads, reinterpret_cast<cudaStream_t>(stream))(
      pointers, device_segments, count);
  return LaunchStatus("batched segment copy");
}

}  // namespace amem::copy
