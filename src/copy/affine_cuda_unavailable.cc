// Stand-in used when the package was built without nvcc.
#include "copy/affine_cuda.h"

namespace amem::copy {

Status LaunchAffineCopy(CUstream, const BufferPointers&, const AffineRow*, int64_t count, const AffineTable&) {
  if (count == 0) return Status::Ok();
  return Status::Error(
      "jax-amem was built without CUDA kernels (nvcc was not found at build time); "
      "reinstall it on a machine with the CUDA toolkit to copy on the GPU");
}

}  // namespace amem::copy
