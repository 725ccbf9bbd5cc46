// Stand-in used when the package was built without nvcc: the pipes need the CUDA runtime.
#include "transport/bucket_pipe.h"

namespace amem::transport {
namespace {
Status NoCuda() {
  return Status::Error(
      "the NCCL transport needs the CUDA build of jax-amem (nvcc was not found at build time); "
      "reinstall it on a machine with the CUDA toolkit");
}
}  // namespace

Status CreatePipe(int, int64_t, int64_t*) { return NoCuda(); }
Status DestroyPipe(int64_t) { return NoCuda(); }
int64_t PipeStagingBytes(int64_t) { return -1; }
int PipeDevice(int64_t) { return -1; }
Status PipeSend(int64_t, CUstream, int, const copy::BufferPointers&, const copy::BufferSegment*, int64_t,
                int64_t, int, ncclComm_t, const AffineGather&) {
  return NoCuda();
}
Status PipeRecv(int64_t, CUstream, int, const copy::BufferPointers&, const copy::BufferSegment*, int64_t,
                int64_t, int, ncclComm_t) {
  return NoCuda();
}
Status PipeDrain(int64_t, CUstream) { return NoCuda(); }

}  // namespace amem::transport
