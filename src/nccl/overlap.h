// How independent communicators are paused and resumed (JAX_AMEM_NCCL_OVERLAP):
//   threads (default): each communicator's suspend / resume / teardown on a thread of
//     its own, and the suspends beside the recreates. Needed when several ranks of one
//     communicator live in this process: NCCL's suspend meets its peers at a barrier.
//     (Not faster than a group for NCCL 2.30.7's suspend: it offloads every 2 MiB
//     granule to a pinned host buffer it allocates then, 1.5 GB/s either way on the
//     H200, docs/nccl.md. The teardowns do overlap: 32 destroys in 0.8-1.0 s against
//     8.7-9.0 s in turn.)
//   group: suspends and resumes inside one ncclGroupStart/End where NCCL allows it
//     (>= 2.30.3), else threads.
//   serial: one after another, in key order (for debugging).
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "cuda/driver_api.h"
#include "nccl/comm_registry.h"
#include "nccl/nccl_status.h"

namespace amem::nccl {

enum class Overlap { kThreads, kGroup, kSerial };

Overlap OverlapMode();  // read at each call: a program may change it between pauses
inline bool Concurrent() { return OverlapMode() != Overlap::kSerial; }

// Runs `work` on every item, on threads of their own when `parallel`, each with
// the item's device current; the first error in item order wins.
template <typename Work>
Status ForEach(const std::vector<ProxyComm*>& comms, bool parallel, Work work) {
  std::vector<Status> results(comms.size());
  auto one = [&](size_t i) {
    cuda::ScopedDeviceContext context(comms[i]->device);
    results[i] = work(comms[i]);
  };
  if (parallel && comms.size() > 1) {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < comms.size(); ++i) threads.emplace_back(one, i);
    for (std::thread& thread : threads) thread.join();
  } else {
    for (size_t i = 0; i < comms.size(); ++i) one(i);
  }
  for (const Status& status : results) {
    if (!status.ok()) return status;
  }
  return Status::Ok();
}

// Two independent jobs, at once when `overlap`; the first one's error wins.
Status Both(bool overlap, const std::function<Status()>& first, const std::function<Status()>& second);

// Whether NCCL takes suspends and resumes inside one group (>= 2.30.3).
bool GroupedSuspendSupported();

// `each` for every communicator: inside one NCCL group when asked for and NCCL
// allows it; otherwise as ForEach (threads, or key order when serial). The first
// error wins.
template <typename Each>
Status GroupedOrEach(const std::vector<ProxyComm*>& comms, const char* what, Each each) {
  if (OverlapMode() != Overlap::kGroup || !GroupedSuspendSupported()) {
    return ForEach(comms, Concurrent(), each);
  }
  Real().ncclGroupStart();
  Status status;
  for (ProxyComm* comm : comms) {
    Status one = each(comm);
    if (status.ok()) status = one;
  }
  Status end = NcclCheck(Real().ncclGroupEnd(), std::string("ncclGroupEnd (") + what + ")");
  return status.ok() ? end : status;
}

}  // namespace amem::nccl
