// What the standalone CUDA benchmarks (copy_kernel.cu, affine_kernel.cu, transpose_kernel.cu)
// share: failing loudly on a CUDA error, and the median time of some work enqueued on a stream,
// by CUDA events.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace amem::bench {

inline void Check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(error));
    std::exit(1);
  }
}

// Milliseconds of `enqueue`'s work on `stream`: the median of `runs`, after one warm-up.
template <typename Enqueue>
float MedianMilliseconds(Enqueue enqueue, cudaStream_t stream, int runs = 20) {
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  enqueue();  // warm-up
  Check(cudaStreamSynchronize(stream), "warm-up");
  std::vector<float> times;
  for (int run = 0; run < runs; ++run) {
    cudaEventRecord(start, stream);
    enqueue();
    cudaEventRecord(stop, stream);
    Check(cudaEventSynchronize(stop), "run");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace amem::bench
