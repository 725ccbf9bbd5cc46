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

namespace amem::nccl {

// How `recreate` ends the real communicators.
enum class Teardown {
  kDestroy = 0,          // ncclCommDestroy, one after another (graceful)
  kAbort = 1,            // ncclCommAbort, one after another
  kParallelDestroy = 2,  // ncclCommDestroy, all at once on their own threads
};

// What a pause would do to one communicator, decided before anything is touched.
struct PlanEntry {
  ProxyComm* comm = nullptr;
  Strategy strategy = Strategy::kRecreate;  // suspend or recreate
  bool refused = false;                     // the requested strategy cannot run here
  std::string why;
};

// Every selected communicator's strategy (ids: distinct, tracked, active; empty =
// every active one). Fails only on a bad selection; refusals are in the entries.
// make_ids: where this process holds rank 0 of a communicator to recreate, make the
// unique id of its replacement now (it travels in the agreement, see PauseRequest).
Status PlanPause(const std::vector<uint64_t>& ids, Strategy requested, std::vector<PlanEntry>* plan,
                 bool make_ids = false);
// The plan as JSON: id, key, rank, device, strategy, refused, why, next_id (hex or "").
std::string PlanJson(const std::vector<PlanEntry>& plan);

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

// Which strategy `auto` picks for a communicator, and why.
Strategy ChooseStrategy(const ProxyComm& comm, std::string* why);

}  // namespace amem::nccl
