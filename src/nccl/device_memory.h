// The driver's view of the devices the communicators live on: their free memory
// (what a recreate's teardown gave back) and a barrier for work already queued.
#pragma once

#include <cstdint>
#include <vector>

#include "nccl/comm_registry.h"

namespace amem::nccl {

// Free device memory as the driver sees it, or -1 without a driver (CPU tests).
int64_t FreeBytes(int device);

// Before pausing, work queued on the communicators' devices must be done.
void SynchronizeDevices(const std::vector<ProxyComm*>& comms);

}  // namespace amem::nccl
