// What a pause will do to each communicator, decided before anything is touched:
// suspend or recreate, or a refusal naming why and what to do.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "nccl/comm_registry.h"

namespace amem::nccl {

struct PlanEntry {
  ProxyComm* comm = nullptr;
  Strategy strategy = Strategy::kRecreate;  // suspend or recreate
  bool refused = false;                     // the requested strategy cannot run here
  std::string why;
};

// Whether NCCL would let us suspend the communicator (suspend) or not (recreate), and why.
Strategy ChooseStrategy(const ProxyComm& comm, std::string* why);

// Every selected communicator's strategy (ids: distinct, tracked, active; empty =
// every active one). Fails on a bad selection, or when `auto` cannot read
// JAX_AMEM_NCCL_COST; refusals are in the entries.
// make_ids: where this process holds rank 0 of a communicator to recreate, make the
// unique id of its replacement now (it travels in the agreement, see PauseRequest).
// agreed: an agreement will merge every process's plan (recreate wins), so `auto` may
// choose by cost (auto_cost.h) for every communicator; without one, only for those whose
// ranks all live in this process (elsewhere a rank could choose otherwise and wait forever).
Status PlanPause(const std::vector<uint64_t>& ids, Strategy requested, std::vector<PlanEntry>* plan,
                 bool make_ids = false, bool agreed = false);

// The plan as JSON: id, key, rank, device, strategy, refused, why, next_id (hex or "").
std::string PlanJson(const std::vector<PlanEntry>& plan);

}  // namespace amem::nccl
