// CUDA IPC memory handles, so that a swap can write the buffers of another process on the same
// host (the swap's same-host route in Python).
//
// The exporter (a PyTorch rollout) turns a device pointer into (handle, offset in its
// allocation, allocation size): PyTorch's caching allocator sub-allocates, and a handle is
// always for a whole cudaMalloc block. The importer (the trainer) opens each handle once per
// device (cached here, reference counted) and adds the offset itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "cuda/driver_api.h"

namespace amem::cuda {

struct ExportedPointer {
  IpcMemHandle handle;
  uint64_t offset = 0;            // of the pointer in its allocation
  size_t allocation_bytes = 0;    // the whole allocation the handle maps
};

// `bytes` as a handle; an error unless it is exactly kIpcHandleBytes long.
Status HandleFromBytes(const std::string& bytes, IpcMemHandle* out);

// Refuses memory of another device and memory that is not IPC-capable (VMM, pools).
Status ExportPointer(CUdeviceptr pointer, int ordinal, ExportedPointer* out);

// The base address of another process's allocation mapped on device `ordinal`; each handle is
// mapped once per device, further opens count references.
Status OpenHandle(const IpcMemHandle& handle, int ordinal, CUdeviceptr* base);

// Drops one reference; the last unmaps (cuIpcCloseMemHandle).
Status CloseHandle(const IpcMemHandle& handle, int ordinal);

// Bytes from an open handle's base to the end of its allocation as the driver mapped it here
// (0: the driver could not say).
Status MappedBytes(const IpcMemHandle& handle, int ordinal, size_t* bytes);

// Number of handles mapped now (per device).
size_t OpenCount();

// `nbytes` bytes at a device address, copied to `out` (a synchronous driver copy).
Status ReadDevice(int ordinal, CUdeviceptr address, size_t nbytes, char* out);

}  // namespace amem::cuda
