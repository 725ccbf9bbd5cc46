// One kernel launch copies every segment of a table between device buffers.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "copy/segments.h"
#include "cuda/driver_types.h"

namespace amem::copy {

// True when this build compiled the CUDA kernels (nvcc was found).
bool HaveCudaKernels();

// Pointers of a batched copy's buffers, passed to the kernel by value.
struct BufferPointers {
  const char* sources[kMaxBuffersPerSide];
  char* destinations[kMaxBuffersPerSide];
};

// Enqueues one launch for every row of a table on `stream` (rows validated on the host;
// `device_segments` in device memory). Rows naming a buffer slot left null are skipped.
Status LaunchBufferSegmentCopy(CUstream stream, const BufferPointers& pointers,
                               const BufferSegment* device_segments, int64_t count);

}  // namespace amem::copy
