// Pausing frees a communicator's GPU memory; resuming brings it back behind the
// same handle. Both are collective: every rank of a communicator must pause
// and resume it, and all ranks walk communicators in the same (key) order.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "nccl/comm_registry.h"

namespace amem::nccl {

// How `recreate` ends the real communicators.
enum class Teardown {
  kDestroy = 0,          // ncclCommDestroy, one after another (graceful)
  kAbort = 1,            // ncclCommAbort, one after another
  kParallelDestroy = 2,  // ncclCommDestroy, all at once on their own threads
};

struct PauseRequest {
  std::vector<uint64_t> ids;  // empty: every active communicator
  Strategy strategy = Strategy::kAuto;
  double timeout_seconds = 60;
  Teardown teardown = Teardown::kDestroy;
};

// Nothing changes unless every selected communicator can be paused with the
// requested strategy (checked first). The message names the communicator.
Status PauseCommunicators(const PauseRequest& request);

// Marks the communicators as resuming so that calls arriving before
// ResumeCommunicators finishes wait for it instead of failing.
Status BeginResume(const std::vector<uint64_t>& ids);
Status ResumeCommunicators(const std::vector<uint64_t>& ids, double timeout_seconds);

// Which strategy `auto` picks for a communicator, and why the others are out.
Strategy ChooseStrategy(const ProxyComm& comm, std::string* why_not_suspend);

}  // namespace amem::nccl
