// Stand-in used when the package was built without nvcc.
#include "copy/copy_cuda.h"

namespace amem::copy {

bool HaveCudaKernels() { return false; }

namespace {
Status NoKernels() {
  return Status::Error(
      "jax-amem was built without CUDA kernels (nvcc was not found at build time); "
      "reinstall it on a machine with the CUDA toolkit to copy on the GPU");
}
}  // namespace

Status LaunchBufferSegmentCopy(CUstream, const BufferPointers&, const BufferSegment*,
                               int64_t count) {
  return count == 0 ? Status::Ok() : NoKernels();
}

}  // namespace amem::copy
