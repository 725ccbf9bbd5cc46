// The exported ncclGroupStart / ncclGroupEnd: forwarded to NCCL, with this thread's
// group depth kept so that a communicator's first collective inside a group is timed
// at the group's end, where NCCL connects it (first_use.h).
#include "nccl/first_use.h"
#include "nccl/guard.h"

using namespace amem::nccl;

AMEM_EXPORT ncclResult_t ncclGroupStart() {
  if (Real().ncclGroupStart == nullptr) return Unsupported("ncclGroupStart");
  return StartGroup();
}

AMEM_EXPORT ncclResult_t ncclGroupEnd() {
  if (Real().ncclGroupEnd == nullptr) return Unsupported("ncclGroupEnd");
  return EndGroup();
}
