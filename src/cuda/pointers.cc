#include "cuda/pointers.h"

#include <cstdio>

#include "cuda/driver_api.h"

namespace amem::cuda {
namespace {

// The mapped region holding `address`: cuMemGetAddressRange, else the pointer's mapping
// attributes (what a driver gives for memory of the virtual memory API).
CUresult MappedRegion(const DriverApi& api, CUdeviceptr address, CUdeviceptr* base, uint64_t* size) {
  size_t bytes = 0;
  CUresult ranged = api.cuMemGetAddressRange(base, &bytes, address);
  if (ranged == kSuccess) {
    *size = bytes;
    return ranged;
  }
  uint64_t start = 0;
  if (api.cuPointerGetAttribute(&start, kPointerAttributeMappingBaseAddress, address) != kSuccess ||
      api.cuPointerGetAttribute(size, kPointerAttributeMappingSize, address) != kSuccess) {
    return ranged;
  }
  *base = start;
  return kSuccess;
}

CUresult Walk(const DriverApi& api, CUdeviceptr address, uint64_t limit, uint64_t* extent) {
  CUdeviceptr base = 0;
  uint64_t size = 0;
  CUresult first = MappedRegion(api, address, &base, &size);
  if (first != kSuccess) return first;
  CUdeviceptr end = base + size;
  // Memory of the virtual memory API is a reserved range mapped in pieces. A cudaMalloc
  // allocation is one piece, and what follows it belongs to other allocations: the walk is
  // for memory that is not legacy-IPC-capable (the virtual memory API's and pools') only.
  int legacy = 1;
  uint64_t reserved_start = 0;
  uint64_t reserved_size = 0;
  if (api.cuPointerGetAttribute(&legacy, kPointerAttributeIsLegacyIpcCapable, address) == kSuccess &&
      !legacy &&
      api.cuPointerGetAttribute(&reserved_start, kPointerAttributeRangeStart, address) == kSuccess &&
      api.cuPointerGetAttribute(&reserved_size, kPointerAttributeRangeSize, address) == kSuccess) {
    const CUdeviceptr reserved_end = reserved_start + reserved_size;
    while (end < reserved_end && end - address < limit) {
      CUdeviceptr next = 0;
      uint64_t next_size = 0;
      if (MappedRegion(api, end, &next, &next_size) != kSuccess || next != end || next_size == 0) break;
      end = next + next_size;
    }
  }
  *extent = end - address;
  return kSuccess;
}

}  // namespace

std::string Hex(uint64_t value) {
  char text[32];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(value));
  return text;
}

Status ExtentAt(CUdeviceptr address, uint64_t limit, uint64_t* bytes) {
  std::string why;
  const DriverApi* api = Driver(&why);
  if (api == nullptr) return Status::Error(why);
  CUresult result = Walk(*api, address, limit, bytes);
  if (result == kErrorInvalidContext) {  // no context current on this thread: borrow an active one
    int count = 0;
    if (api->cuDeviceGetCount(&count) != kSuccess) count = 0;
    for (int ordinal = 0; ordinal < count && result == kErrorInvalidContext; ++ordinal) {
      CUdevice device = 0;
      unsigned flags = 0;
      int active = 0;
      if (api->cuDeviceGet(&device, ordinal) != kSuccess ||
          api->cuDevicePrimaryCtxGetState(device, &flags, &active) != kSuccess || !active) {
        continue;
      }
      ScopedDeviceContext context(ordinal);  // retains a context that is active already
      if (context.status().ok()) result = Walk(*api, address, limit, bytes);
    }
    if (result == kErrorInvalidContext) {
      return Status::Error("address " + Hex(address) +
                           " cannot be device memory of this process: no CUDA context is active");
    }
  }
  if (result != kSuccess) {
    return Status::Error("address " + Hex(address) +
                         " is not device memory the CUDA driver knows (host memory, freed memory, or "
                         "memory of another process not opened here): " +
                         Check(result, "cuMemGetAddressRange").message());
  }
  return Status::Ok();
}

}  // namespace amem::cuda
