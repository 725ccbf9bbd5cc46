// The CUDA runtime calls the kernels' launch code makes, answered for the emulated device
// (cuda_emulation.h): device 0, a few multiprocessors, four blocks resident on each, no errors.
#include "cuda_emulation.h"

extern "C" {

cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attribute, int) {
  if (attribute != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
  *value = amem::emulation::kMultiprocessors;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, const void*, int, size_t,
                                                                           unsigned int) {
  *blocks = 4;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetLastError(void) { return cudaSuccess; }

const char* CUDARTAPI cudaGetErrorString(cudaError_t) { return "(emulated device)"; }

}  // extern "C"
