// One kernel launch copies every segment of a table between two device buffers.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "copy/segments.h"
#include "cuda/driver_types.h"

namespace amem::copy {

// True when this build compiled the CUDA kernels (nvcc was found).
bool HaveCudaKernels();

// Enqueues the copy on `stream`. `device_segments` points to the table in
// device memory. Segments outside the buffers are skipped by the kernel (the
// host validated them already; the check keeps a bad table from faulting the GPU).
Status LaunchSegmentCopy(CUstream stream, const char* src, int64_t src_bytes, char* dst,
                         int64_t dst_bytes, const Segment* device_segments, int64_t count);

// Pointers of a batched copy's buffers, passed to the kernel by value.
struct BufferPointers {
  const char* sources[kMaxBuffersPerSide];
  char* destinations[kMaxBuffersPerSide];
};

// One launch for every row of a many-buffer table (validated on the host;
// `device_segments` in device memory).
Status LaunchBufferSegmentCopy(CUstream stream, const BufferPointers& pointers,
                               const BufferSegment* device_segments, int64_t count);

}  // namespace amem::copy
