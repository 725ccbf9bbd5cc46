// The parts of NCCL's public C ABI the interposer touches, declared here so the
// package builds without nccl.h (values and layouts follow NCCL's nccl.h,
// stable since 2.19; functions added later are looked up at run time).
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

typedef struct ncclComm* ncclComm_t;
typedef struct ncclWindow_vidmem* ncclWindow_t;
typedef struct CUstream_st* cudaStream_t;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef int ncclDataType_t;  // enum in nccl.h; ncclUint8 == 1
typedef int ncclRedOp_t;     // enum in nccl.h
typedef int ncclScalarResidence_t;
typedef int ncclCommMemStat_t;

constexpr int kNcclUint8 = 1;
constexpr int kNcclSplitNoColor = -1;
constexpr int kNcclShrinkAbort = 0x01;        // NCCL_SHRINK_ABORT
constexpr int kNcclSuspendMem = 0x01;         // NCCL_SUSPEND_MEM (2.29.7+)
constexpr int kNcclStatGpuMemSuspend = 0;     // ncclStatGpuMemSuspend
constexpr int kNcclStatGpuMemSuspended = 1;   // ncclStatGpuMemSuspended (0 or 1)
constexpr int kNcclStatGpuMemPersist = 2;     // ncclStatGpuMemPersist
constexpr int kNcclStatGpuMemTotal = 3;       // ncclStatGpuMemTotal

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

// ncclConfig_t begins with these fields in every version; the interposer only
// reads `size` (to copy the whole struct) plus the two fields named below,
// whose offsets are stable since 2.14.
struct ncclConfigHeader {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
};
typedef struct ncclConfigHeader ncclConfig_t;

// Opaque to the interposer: passed through untouched.
typedef struct ncclSimInfo ncclSimInfo_t;
typedef struct ncclCollConfig ncclCollConfig_t;
typedef struct ncclDevCommRequirements ncclDevCommRequirements_t;
typedef struct ncclDevComm ncclDevComm_t;
typedef struct ncclCommProperties ncclCommProperties_t;
typedef struct ncclWaitSignalDesc ncclWaitSignalDesc_t;

}  // extern "C"
