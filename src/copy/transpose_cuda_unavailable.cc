// Stand-in used when the package was built without nvcc.
#include "copy/transpose.h"

namespace amem::copy {

Status LaunchTransposeRows(CUstream, const BufferPointers&, const TransposeRow*, const TransposeRow*, int64_t count,
                           int64_t units, const AffineTable&) {
  if (count == 0 || units == 0) return Status::Ok();
  return Status::Error(
      "jax-amem was built without CUDA kernels (nvcc was not found at build time); "
      "reinstall it on a machine with the CUDA toolkit to copy on the GPU");
}

}  // namespace amem::copy
