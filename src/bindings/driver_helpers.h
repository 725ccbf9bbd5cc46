// What several binding files need from the CUDA driver: the table or an
// exception saying why it is missing, Status -> exception, and a device's
// current memory pool (the one XLA's cuda_async allocator draws from).
#pragma once

#include <stdexcept>
#include <string>

#include "common/status.h"
#include "cuda/driver_api.h"

namespace amem::bindings {

inline const cuda::DriverApi& RequireDriver() {
  std::string why;
  const cuda::DriverApi* api = cuda::Driver(&why);
  if (api == nullptr) throw std::runtime_error(why);
  return *api;
}

inline void Raise(const Status& status) {
  if (!status.ok()) throw std::runtime_error(status.message());
}

// Call with `ordinal`'s context current (cuda::ScopedDeviceContext).
inline CUmemoryPool DeviceMemPool(const cuda::DriverApi& api, int ordinal) {
  CUdevice device = 0;
  Raise(cuda::Check(api.cuDeviceGet(&device, ordinal), "cuDeviceGet"));
  CUmemoryPool pool = nullptr;
  Raise(cuda::Check(api.cuDeviceGetMemPool(&pool, device), "cuDeviceGetMemPool"));
  return pool;
}

}  // namespace amem::bindings
