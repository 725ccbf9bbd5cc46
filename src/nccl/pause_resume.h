// The pause / resume orchestration: plan, check, then suspend and recreate side by side.
// Each strategy lives in a file of its own (suspend.h, recreate.h, teardown.h); `auto`'s
// choice in pause_plan.h and auto_cost.h; how work overlaps in overlap.h.
//
// Pausing frees a communicator's GPU memory; resuming brings it back behind the
// same handle. Both are collective: every rank of a communicator must pause
// and resume it, and all ranks walk communicators in the same (key) order.
// Python agrees on the plan across processes (jax_amem/nccl/_agree.py) before
// anything here touches NCCL.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "nccl/comm_registry.h"
#include "nccl/pause_plan.h"
#include "nccl/teardown.h"

namespace amem::nccl {

struct PauseRequest {
  std::vector<uint64_t> ids;
  // One per id, suspend or recreate (what every rank agreed on); empty: decided here.
  std::vector<Strategy> strategies;
  Strategy strategy = Strategy::kAuto;  // used when `strategies` is empty
  // One per id (or empty): the unique id the replacement of a recreated communicator
  // will use, as its rank 0 made it for the plan and the agreement carried it. All
  // zero: none is known here, and the id goes over the communicator before it is
  // ended (a broadcast from rank 0).
  std::vector<ncclUniqueId> next_ids;
  double timeout_seconds = 60;
  Teardown teardown = Teardown::kDestroy;
};

// Nothing changes unless every selected communicator can be paused with its
// strategy (checked first). The message names the communicator. `selected`: the
// communicators it paused (or tried to), for the report.
Status PauseCommunicators(const PauseRequest& request, std::vector<ProxyComm*>* selected);

// Marks the communicators as resuming so that calls arriving before
// ResumeCommunicators finishes wait for it instead of failing.
Status BeginResume(const std::vector<uint64_t>& ids);
void CancelResume();  // every communicator: stop waiting (its resume will not come)
Status ResumeCommunicators(const std::vector<uint64_t>& ids, double timeout_seconds,
                           std::vector<ProxyComm*>* selected);

// Initialises broken communicators again behind the same handles, each with the
// unique id its ranks agreed on (`unique_ids`: 128 bytes per id). A communicator
// that is still active here (its peer broke) is aborted first. Collective.
Status RecoverCommunicators(const std::vector<uint64_t>& ids, const char* unique_ids,
                            double timeout_seconds);

}  // namespace amem::nccl
