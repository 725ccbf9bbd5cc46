#include "nccl/pause_resume.h"

#include <cstring>

#include "nccl/device_memory.h"
#include "nccl/overlap.h"
#include "nccl/recreate.h"
#include "nccl/selection.h"
#include "nccl/suspend.h"

namespace amem::nccl {
namespace {

bool IsZero(const ncclUniqueId& id) {
  for (char c : id.internal) {
    if (c != 0) return false;
  }
  return true;
}

}  // namespace

Status PauseCommunicators(const PauseRequest& request, std::vector<ProxyComm*>* selected) {
  std::unique_lock<std::shared_mutex> lock(Registry::Get().lock());
  std::vector<PlanEntry> plan;
  // With agreed strategies, the same plan the agreement was made from (same rates, same bytes).
  Status status = PlanPause(request.ids, request.strategy, &plan, false, !request.strategies.empty());
  if (!status.ok() || plan.empty()) return status;
  if (!request.strategies.empty()) {
    if (request.strategies.size() != request.ids.size()) {
      return Status::Error("one strategy per communicator id is needed");
    }
    // What every process agreed on replaces the local choice (checked the same way):
    // another rank of the communicator may have to recreate what this one could suspend.
    for (PlanEntry& entry : plan) {
      for (size_t i = 0; i < request.ids.size(); ++i) {
        if (request.ids[i] != entry.comm->id || request.strategies[i] == entry.strategy) continue;
        std::vector<PlanEntry> again;
        PlanPause({entry.comm->id}, request.strategies[i], &again);
        const std::string local_why = entry.why;
        entry = again.at(0);
        if (!entry.refused) entry.why = "another rank of it recreates it (here: " + local_why + ")";
      }
    }
  }
  // Nothing is touched unless every communicator can be paused as planned.
  for (const PlanEntry& entry : plan) {
    if (entry.refused) return Status::Error(entry.why);
  }
  std::vector<ProxyComm*> suspend, recreate;
  for (const PlanEntry& entry : plan) {
    ProxyComm* comm = entry.comm;
    comm->strategy_why = entry.why;
    comm->next_id_given = false;
    for (size_t i = 0; i < request.next_ids.size() && i < request.ids.size(); ++i) {
      if (request.ids[i] != comm->id || IsZero(request.next_ids[i])) continue;
      comm->next_id = request.next_ids[i];
      comm->next_id_given = true;
    }
    selected->push_back(comm);
    (entry.strategy == Strategy::kSuspend ? suspend : recreate).push_back(comm);
  }
  SynchronizeDevices(*selected);
  // The suspends and the recreates touch different communicators: overlapped.
  return Both(Concurrent() && !suspend.empty() && !recreate.empty(),
              [&] { return Suspend(suspend); }, [&] { return Recreate(recreate, request.teardown, request.timeout_seconds); });
}

Status BeginResume(const std::vector<uint64_t>& ids) {
  std::unique_lock<std::shared_mutex> lock(Registry::Get().lock());
  std::vector<ProxyComm*> selected;
  Status status = Select(ids, CommState::kPaused, &selected);
  if (!status.ok()) return status;
  for (ProxyComm* comm : selected) comm->resuming.store(true, std::memory_order_release);
  return Status::Ok();
}

void CancelResume() {
  for (ProxyComm* comm : Registry::Get().Sorted()) {
    comm->resuming.store(false, std::memory_order_release);
  }
}

Status ResumeCommunicators(const std::vector<uint64_t>& ids, double timeout_seconds,
                           std::vector<ProxyComm*>* selected) {
  Status status;
  {
    std::unique_lock<std::shared_mutex> lock(Registry::Get().lock());
    status = Select(ids, CommState::kPaused, selected);
    if (status.ok()) {
      std::vector<ProxyComm*> suspended, recreated;
      for (ProxyComm* comm : *selected) {
        (comm->last_strategy == "suspend" ? suspended : recreated).push_back(comm);
      }
      status = Both(Concurrent() && !suspended.empty() && !recreated.empty(),
                    [&] { return ResumeSuspended(suspended); },
                    [&] { return Reinitialise(recreated, timeout_seconds); });
    }
  }
  CancelResume();  // whatever happened, nobody waits on these any more
  return status;
}

Status RecoverCommunicators(const std::vector<uint64_t>& ids, const char* unique_ids,
                            double timeout_seconds) {
  std::unique_lock<std::shared_mutex> lock(Registry::Get().lock());
  std::vector<ProxyComm*> selected;
  for (size_t i = 0; i < ids.size(); ++i) {
    ProxyComm* found = nullptr;
    for (ProxyComm* comm : Registry::Get().Sorted()) {
      if (comm->id == ids[i]) found = comm;
    }
    if (found == nullptr) return Status::Error("no communicator with id " + std::to_string(ids[i]) + " is tracked");
    if (found->state == CommState::kPaused) {
      return Status::Error("communicator " + found->key + " is paused: resume it instead of recovering it");
    }
    std::memcpy(found->next_id.internal, unique_ids + i * NCCL_UNIQUE_ID_BYTES, NCCL_UNIQUE_ID_BYTES);
    selected.push_back(found);
  }
  for (ProxyComm* comm : selected) {
    // Still active here, but its peers lost it: end it without waiting for them.
    if (comm->real != nullptr && Real().ncclCommAbort) Real().ncclCommAbort(comm->real);
    comm->real = nullptr;
    comm->state = CommState::kBroken;
  }
  return Reinitialise(selected, timeout_seconds);
}

}  // namespace amem::nccl
