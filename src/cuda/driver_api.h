// The CUDA driver API, loaded at run time with dlopen("libcuda.so.1").
//
// Why at run time: `import jax_amem` must work on machines with no GPU and no
// driver, and XLA itself reaches the driver the same way, so we share its
// libcuda mapping instead of linking our own.
#pragma once

#include <string>

#include "common/status.h"
#include "cuda/driver_types.h"

namespace amem::cuda {

// cuda.h's CUipcMemHandle: 64 opaque bytes, passed by value.
constexpr int kIpcHandleBytes = 64;  // CU_IPC_HANDLE_SIZE
struct IpcMemHandle {
  char reserved[kIpcHandleBytes];
};
constexpr unsigned kIpcMemLazyEnablePeerAccess = 0x1;     // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
constexpr int kPointerAttributeDeviceOrdinal = 9;         // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr int kPointerAttributeIsLegacyIpcCapable = 10;   // CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
constexpr int kPointerAttributeRangeStart = 11;           // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR (reserved range)
constexpr int kPointerAttributeRangeSize = 12;            // CU_POINTER_ATTRIBUTE_RANGE_SIZE
constexpr int kPointerAttributeMappingSize = 18;          // CU_POINTER_ATTRIBUTE_MAPPING_SIZE
constexpr int kPointerAttributeMappingBaseAddress = 19;   // CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR
constexpr CUresult kErrorInvalidContext = 201;            // CUDA_ERROR_INVALID_CONTEXT

// One pointer per driver entry point jax-amem calls. Filled once by Driver().
struct DriverApi {
  CUresult (*cuInit)(unsigned flags);
  CUresult (*cuDriverGetVersion)(int* version);
  CUresult (*cuGetErrorString)(CUresult error, const char** text);
  CUresult (*cuDeviceGetCount)(int* count);
  CUresult (*cuDeviceGet)(CUdevice* device, int ordinal);
  CUresult (*cuDeviceGetAttribute)(int* value, int attribute, CUdevice device);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* context, CUdevice device);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice device);
  CUresult (*cuDevicePrimaryCtxGetState)(CUdevice device, unsigned* flags, int* active);
  CUresult (*cuCtxPushCurrent)(CUcontext context);
  CUresult (*cuCtxPopCurrent)(CUcontext* context);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuMemGetInfo)(size_t* free_bytes, size_t* total_bytes);
  CUresult (*cuMemAlloc)(CUdeviceptr* pointer, size_t bytes);
  CUresult (*cuMemFree)(CUdeviceptr pointer);
  CUresult (*cuMemHostAlloc)(void** pointer, size_t bytes, unsigned flags);
  CUresult (*cuMemFreeHost)(void* pointer);
  CUresult (*cuMemcpyAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
  CUresult (*cuStreamSynchronize)(CUstream stream);
  CUresult (*cuDeviceGetMemPool)(CUmemoryPool* pool, CUdevice device);
  CUresult (*cuMemPoolTrimTo)(CUmemoryPool pool, size_t min_bytes_to_keep);
  CUresult (*cuMemPoolGetAttribute)(CUmemoryPool pool, int attribute, void* value);
  CUresult (*cuMemcpyDtoHAsync)(void* dst, CUdeviceptr src, size_t bytes, CUstream stream);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream);
  CUresult (*cuStreamCreate)(CUstream* stream, unsigned flags);
  CUresult (*cuDeviceGetPCIBusId)(char* bus_id, int length, CUdevice device);
  CUresult (*cuStreamDestroy)(CUstream stream);
  CUresult (*cuStreamQuery)(CUstream stream);  // 0 when done, 600 (not ready) while running
  CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void* src, size_t bytes);
  CUresult (*cuMemcpyDtoH)(void* dst, CUdeviceptr src, size_t bytes);
  // CUDA IPC (cuda/ipc.cc): export an allocation, map another process's into this one;
  // and what the driver knows of a pointer (cuda/pointers.cc, cuda/ipc.cc).
  CUresult (*cuIpcGetMemHandle)(IpcMemHandle* handle, CUdeviceptr pointer);
  CUresult (*cuIpcOpenMemHandle)(CUdeviceptr* pointer, IpcMemHandle handle, unsigned flags);
  CUresult (*cuIpcCloseMemHandle)(CUdeviceptr pointer);
  CUresult (*cuMemGetAddressRange)(CUdeviceptr* base, size_t* bytes, CUdeviceptr pointer);
  CUresult (*cuPointerGetAttribute)(void* data, int attribute, CUdeviceptr pointer);
  // Pinning memory we mapped ourselves (memory/host_blocks.cc).
  CUresult (*cuMemHostRegister)(void* pointer, size_t bytes, unsigned flags);
  CUresult (*cuMemHostUnregister)(void* pointer);
};

// The loaded table, or nullptr when the driver is missing; `why` then says
// what failed (library not found, a symbol missing, cuInit's error).
const DriverApi* Driver(std::string* why = nullptr);

// Status for a driver call: "<what>: <driver's error name and text>".
Status Check(CUresult result, const char* what);

// Makes `ordinal`'s primary context current for the lifetime of the guard. Retaining it
// creates it when the device has none yet (hundreds of MiB of device memory): use it only for
// a device the process works on.
class ScopedDeviceContext {
 public:
  explicit ScopedDeviceContext(int ordinal);
  ~ScopedDeviceContext();
  const Status& status() const { return status_; }

 private:
  Status status_;
  CUdevice device_ = 0;
  bool pushed_ = false;
  bool retained_ = false;
};

}  // namespace amem::cuda
