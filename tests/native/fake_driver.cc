// The CUDA driver as the direct launch calls it (src/cuda/driver_api.h), for the kernel
// emulation test: device memory is host memory, so a DirectCopy made for device 0 uploads its
// table with memcpy, runs its bulk rows as memcpy and its kernels on CPU threads
// (cuda_emulation.h). Linked instead of src/cuda/driver_api.cc; the entries the direct launch
// does not call stay null.
#include <cstdlib>
#include <cstring>

#include "cuda/driver_api.h"

namespace amem::cuda {
namespace {

CUresult Allocate(CUdeviceptr* pointer, size_t bytes) {
  *pointer = reinterpret_cast<CUdeviceptr>(std::malloc(bytes == 0 ? 1 : bytes));
  return *pointer == 0 ? 2 : 0;  // CUDA_ERROR_OUT_OF_MEMORY
}
CUresult Release(CUdeviceptr pointer) {
  std::free(reinterpret_cast<void*>(pointer));
  return 0;
}
CUresult Upload(CUdeviceptr to, const void* from, size_t bytes) {
  std::memcpy(reinterpret_cast<void*>(to), from, bytes);
  return 0;
}
CUresult CopyOnStream(CUdeviceptr to, CUdeviceptr from, size_t bytes, CUstream) {
  std::memcpy(reinterpret_cast<void*>(to), reinterpret_cast<const void*>(from), bytes);
  return 0;
}

DriverApi Emulated() {
  DriverApi api{};
  api.cuMemAlloc = Allocate;
  api.cuMemFree = Release;
  api.cuMemcpyHtoD = Upload;
  api.cuMemcpyAsync = CopyOnStream;
  return api;
}

}  // namespace

const DriverApi* Driver(std::string*) {
  static const DriverApi api = Emulated();
  return &api;
}

Status Check(CUresult result, const char* what) {
  return result == 0 ? Status::Ok() : Status::Error(std::string(what) + ": emulated driver error " + std::to_string(result));
}

ScopedDeviceContext::ScopedDeviceContext(int) {}
ScopedDeviceContext::~ScopedDeviceContext() = default;

}  // namespace amem::cuda
