// What the CUDA driver knows about an address: the extent of the device memory that holds it,
// so that a copy to a raw address can be bounded by its allocation before it is run.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "cuda/driver_types.h"

namespace amem::cuda {

// "0x7f12..." for messages.
std::string Hex(uint64_t value);

// Bytes from `address` to the end of the device memory that holds it: a cuMemAlloc
// (cudaMalloc) allocation; for memory of the virtual memory API (PyTorch's expandable
// segments, stream-ordered pools), the mapped pieces that follow one another without a gap
// inside the address range reserved for them, walked until `limit` bytes are reached.
// An error when the driver does not know the address (host memory, freed memory, a pointer
// of another process). Creates no context: it asks in the current one, else in an active
// primary context, so a process that does not use the GPU never gets one from here.
Status ExtentAt(CUdeviceptr address, uint64_t limit, uint64_t* bytes);

}  // namespace amem::cuda
