#include "nccl/first_use.h"

#include <algorithm>
#include <vector>

namespace amem::nccl {
namespace {

// NCCL's groups are per thread, and so is what a group's end must time.
thread_local int group_depth = 0;
thread_local std::vector<ncclComm_t> first_uses;  // proxy handles, looked up again at the end

int64_t Nanoseconds(Clock::time_point at) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
}

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
  const double seconds = Since(start);
  for (ncclComm_t handle : handles) {
    ProxyComm* proxy = Registry::Get().Find(handle);
    if (proxy == nullptr) continue;  // destroyed inside the group: nothing to keep
    FirstUseAnswered(*proxy, result, start, seconds, static_cast<int>(handles.size()));
  }
  return result;
}

void FirstUseAnswered(ProxyComm& proxy, ncclResult_t result, Clock::time_point start, double seconds,
                      int shared_by) {
  if (result == ncclSuccess) {
    proxy.connect_seconds.store(seconds / shared_by);
  } else if (result == ncclInProgress) {
    proxy.connect_shared_by.store(shared_by);
    proxy.connect_since_ns.store(std::max<int64_t>(Nanoseconds(start), 1));
  } else {
    proxy.awaiting_first_use.store(true);
  }
}

void ConnectAnswered(ProxyComm& proxy, ncclResult_t state) {
  if (state == ncclInProgress || proxy.connect_since_ns.load() == 0) return;
  const int64_t since = proxy.connect_since_ns.exchange(0);
  if (since == 0 || state != ncclSuccess) return;  // another thread took it, or it failed
  const double seconds = static_cast<double>(Nanoseconds(Clock::now()) - since) / 1e9;
  proxy.connect_seconds.store(seconds / std::max(proxy.connect_shared_by.load(), 1));
}

}  // namespace amem::nccl
