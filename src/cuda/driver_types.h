// The few CUDA driver API types jax-amem uses, declared here so that nothing
// needs cuda.h: the package must build and import on machines with no toolkit.
// The layouts and values follow the public CUDA driver API (cuda.h).
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {
typedef int CUresult;  // 0 == CUDA_SUCCESS
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream;
typedef struct CUevent_st* CUevent;
typedef struct CUmemPoolHandle_st* CUmemoryPool;
typedef unsigned long long CUdeviceptr;
}

namespace amem::cuda {
constexpr CUresult kSuccess = 0;
constexpr int kAttributeMultiprocessorCount = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr unsigned kMemHostAllocPortable = 0x01;   // CU_MEMHOSTALLOC_PORTABLE
constexpr unsigned kMemHostRegisterPortable = 0x01;  // CU_MEMHOSTREGISTER_PORTABLE
constexpr unsigned kStreamNonBlocking = 0x01;      // CU_STREAM_NON_BLOCKING
constexpr int kMemPoolAttrReservedMemCurrent = 5;  // CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT
constexpr int kMemPoolAttrUsedMemCurrent = 7;      // CU_MEMPOOL_ATTR_USED_MEM_CURRENT
}  // namespace amem::cuda
