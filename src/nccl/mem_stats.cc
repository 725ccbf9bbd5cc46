#include "nccl/mem_stats.h"

#include "nccl/real_nccl.h"

namespace amem::nccl {

int64_t MemStat(ncclComm_t real, ncclCommMemStat_t stat) {
  uint64_t bytes = 0;
  if (real != nullptr && Real().ncclCommMemStats &&
      Real().ncclCommMemStats(real, stat, &bytes) == ncclSuccess) {
    return static_cast<int64_t>(bytes);
  }
  return -1;
}

}  // namespace amem::nccl
