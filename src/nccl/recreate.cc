#include "nccl/recreate.h"

#include "nccl/clock.h"
#include "nccl/id_exchange.h"
#include "nccl/real_nccl.h"

namespace amem::nccl {

Status Recreate(const std::vector<ProxyComm*>& comms, Teardown teardown, double timeout_seconds) {
  if (comms.empty()) return Status::Ok();
  const auto start = Clock::now();
  RecordBeforeTeardown(comms);
  // The ids every rank agreed on (made by rank 0 for the plan) are in next_id
  // already; the others go over the communicator before it is ended.
  std::vector<ProxyComm*> unknown, stuck;
  for (ProxyComm* comm : comms) {
    if (!comm->next_id_given) unknown.push_back(comm);
  }
  Status exchanged = ExchangeNextIds(unknown, timeout_seconds, &stuck);
  for (ProxyComm* comm : comms) comm->next_id_made = false;  // each id made is used now, or never
  if (!exchanged.ok()) {
    // Peers that did not join leave our broadcast waiting forever: abort those
    // communicators so the GPU is not held, and say so on each of them.
    for (ProxyComm* comm : stuck) {
      if (Real().ncclCommAbort) Real().ncclCommAbort(comm->real);
      comm->real = nullptr;
      comm->state = CommState::kBroken;
      comm->error = exchanged.message();
    }
    return exchanged;
  }
  const double exchange_share = Since(start) / static_cast<double>(comms.size());
  return TearDown(comms, teardown, exchange_share);
}

}  // namespace amem::nccl
