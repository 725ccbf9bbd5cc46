#include "nccl/device_memory.h"

#include <set>

#include "cuda/driver_api.h"

namespace amem::nccl {

int64_t FreeBytes(int device) {
  const cuda::DriverApi* api = cuda::Driver();
  if (api == nullptr || device < 0) return -1;
  cuda::ScopedDeviceContext context(device);
  if (!context.status().ok()) return -1;
  api->cuCtxSynchronize();
  size_t free_bytes = 0, total = 0;
  if (api->cuMemGetInfo(&free_bytes, &total) != cuda::kSuccess) return -1;
  return static_cast<int64_t>(free_bytes);
}

void SynchronizeDevices(const std::vector<ProxyComm*>& comms) {
  const cuda::DriverApi* api = cuda::Driver();
  if (api == nullptr) return;
  std::set<int> done;
  for (ProxyComm* comm : comms) {
    if (comm->device < 0 || !done.insert(comm->device).second) continue;
    cuda::ScopedDeviceContext context(comm->device);
    if (context.status().ok()) api->cuCtxSynchronize();
  }
}

}  // namespace amem::nccl
