#include "nccl/first_use.h"

#include <vector>

namespace amem::nccl {
namespace {

// NCCL's groups are per thread, and so is what a group's end must time.
thread_local int group_depth = 0;
thread_local std::vector<ncclComm_t> first_uses;  // proxy handles, looked up again at the end

}  // namespace

bool InGroup() { return group_depth > 0; }

void NoteFirstUseInGroup(ncclComm_t handle) { first_uses.push_back(handle); }

ncclResult_t StartGroup() {
  const ncclResult_t result = Real().ncclGroupStart();
  if (result == ncclSuccess) ++group_depth;
  return result;
}

ncclResult_t EndGroup() {
  if (group_depth == 0) return Real().ncclGroupEnd();  // unmatched: NCCL says so
  if (--group_depth > 0 || first_uses.empty()) return Real().ncclGroupEnd();
  std::vector<ncclComm_t> handles;
  handles.swap(first_uses);
  const auto start = Clock::now();
  const ncclResult_t result = Real().ncclGroupEnd();
  const double share = Since(start) / static_cast<double>(handles.size());
  for (ncclComm_t handle : handles) {
    ProxyComm* proxy = Registry::Get().Find(handle);
    if (proxy == nullptr) continue;  // destroyed inside the group: nothing to keep
    if (result == ncclSuccess) {
      proxy->connect_seconds.store(share);
    } else if (result != ncclInProgress) {
      proxy->awaiting_first_use.store(true);
    }
  }
  return result;
}

}  // namespace amem::nccl
