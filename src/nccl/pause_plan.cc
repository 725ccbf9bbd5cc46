#include "nccl/pause_plan.h"

#include <map>
#include <sstream>

#include "nccl/auto_cost.h"
#include "nccl/json_text.h"
#include "nccl/real_nccl.h"
#include "nccl/selection.h"

namespace amem::nccl {

Strategy ChooseStrategy(const ProxyComm& comm, std::string* why) {
  if (Real().ncclCommSuspend == nullptr || Real().ncclCommResume == nullptr) {
    *why = "the loaded NCCL (" + std::to_string(Real().version) +
           ") has no ncclCommSuspend (needs NCCL >= 2.29.7)";
    return Strategy::kRecreate;
  }
  const int sharers = Registry::Get().ManagerSharers(comm);
  if (sharers > 0) {
    *why = "it shares NCCL's memory manager with " + std::to_string(sharers) +
           " other communicator(s) (" +
           (comm.parent_id != 0 ? "split from communicator " + std::to_string(comm.parent_id)
                                : std::string("a parent whose children were split")) +
           " with splitShare), which ncclCommSuspend refuses";
    return Strategy::kRecreate;
  }
  *why = "it has a memory manager of its own";
  return Strategy::kSuspend;
}

Status PlanPause(const std::vector<uint64_t>& ids, Strategy requested, std::vector<PlanEntry>* plan,
                 bool make_ids, bool agreed) {
  std::vector<ProxyComm*> selected;
  Status status = Select(ids, CommState::kActive, &selected);
  if (!status.ok()) return status;
  for (ProxyComm* comm : selected) {
    PlanEntry entry;
    entry.comm = comm;
    std::string why;
    const Strategy automatic = ChooseStrategy(*comm, &why);
    entry.strategy = requested == Strategy::kAuto ? automatic : requested;
    entry.why = requested == Strategy::kAuto ? why : "asked for";
    if (entry.strategy == Strategy::kSuspend && automatic != Strategy::kSuspend) {
      entry.refused = true;
      entry.why = "cannot suspend communicator " + comm->key + ": " + why +
                  ". Use strategy='recreate' or 'auto'" +
                  (comm->parent_id != 0 || comm->split_share
                       ? ", or keep communicators suspendable (JAX_AMEM_NCCL_KEEP_SUSPENDABLE=1 "
                         "before the first collective)"
                       : "") + ".";
    } else if (entry.strategy == Strategy::kRecreate) {
      const int tied = comm->registrations + comm->windows + comm->device_comms;
      if (tied > 0) {
        entry.refused = true;
        entry.why =
            "cannot recreate communicator " + comm->key + ": it has " +
            std::to_string(comm->registrations) + " registered buffer(s), " +
            std::to_string(comm->windows) + " window(s) and " + std::to_string(comm->device_comms) +
            " device communicator(s) that would point at the destroyed communicator. "
            "Deregister them first (for XLA: run without --xla_gpu_enable_nccl_user_buffers), "
            "or use strategy='suspend' on NCCL >= 2.29.7.";
      } else if (comm->real == nullptr) {
        entry.refused = true;
        entry.why = "communicator " + comm->key + " has no real communicator to pause";
      }
    }
    plan->push_back(entry);
  }
  if (requested == Strategy::kAuto) {
    // Each communicator's local ranks: all of them here means no other process chooses.
    std::map<std::string, int> local;
    for (const PlanEntry& entry : *plan) ++local[entry.comm->key];
    std::vector<bool> decides;
    for (const PlanEntry& entry : *plan) decides.push_back(agreed || local[entry.comm->key] >= entry.comm->nranks);
    status = ChooseByCost(plan, decides);
    if (!status.ok()) {
      plan->clear();
      return status;
    }
  }
  bool refused = false;
  for (const PlanEntry& entry : *plan) refused |= entry.refused;
  // The pause's own plan (no ids to make) keeps the ids the caller's plan made: where no
  // agreement carries one to every rank, ExchangeNextIds sends it instead of a new one.
  if (!make_ids) return Status::Ok();
  for (PlanEntry& entry : *plan) {
    ProxyComm* comm = entry.comm;
    comm->next_id_made = false;
    // Rank 0 makes the id of the communicator's replacement now, so that it travels
    // in the agreement instead of over the communicator (a collective there is slow
    // and allocates: on a communicator that never ran one, it connects it first).
    // Not when this plan is refused already: an id that is never used leaves NCCL's
    // bootstrap root waiting.
    if (!refused && entry.strategy == Strategy::kRecreate && comm->rank == 0 &&
        comm->nranks > 1 && Real().ncclGetUniqueId != nullptr) {
      comm->next_id_made = Real().ncclGetUniqueId(&comm->next_id) == ncclSuccess;
    }
  }
  return Status::Ok();
}

std::string PlanJson(const std::vector<PlanEntry>& plan) {
  static const char kHex[] = "0123456789abcdef";
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlanEntry& entry = plan[i];
    std::string next_id;  // hex, or empty: none made here
    for (int b = 0; entry.comm->next_id_made && b < NCCL_UNIQUE_ID_BYTES; ++b) {
      const auto byte = static_cast<unsigned char>(entry.comm->next_id.internal[b]);
      next_id += kHex[byte >> 4];
      next_id += kHex[byte & 15];
    }
    out << (i ? "," : "") << "{\"id\":" << entry.comm->id << ",\"key\":" << JsonString(entry.comm->key)
        << ",\"rank\":" << entry.comm->rank << ",\"nranks\":" << entry.comm->nranks
        << ",\"device\":" << entry.comm->device
        << ",\"strategy\":\"" << StrategyName(entry.strategy)
        << "\",\"refused\":" << (entry.refused ? "true" : "false") << ",\"why\":" << JsonString(entry.why)
        << ",\"next_id\":\"" << next_id << "\"}";
  }
  out << "]";
  return out.str();
}

}  // namespace amem::nccl
