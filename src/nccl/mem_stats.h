// NCCL's own count of a communicator's device memory (ncclCommMemStats, NCCL >= 2.29.7).
#pragma once

#include <cstdint>

#include "nccl/nccl_types.h"

namespace amem::nccl {

// The statistic, or -1 when the loaded NCCL has no ncclCommMemStats (or refuses).
int64_t MemStat(ncclComm_t real, ncclCommMemStat_t stat);

}  // namespace amem::nccl
