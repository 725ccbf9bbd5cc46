#include <thread>
#include <vector>

#include "cuda/driver_api.h"
#include "nccl/auto_cost.h"
#include "nccl/clock.h"
#include "nccl/first_use.h"
#include "nccl/host_memory.h"
#include "nccl/nccl_status.h"
#include "nccl/recreate.h"

namespace amem::nccl {
namespace {

// The new communicator must not share resources with anything (there is no
// parent any more, and sharing would make it unsuspendable); everything else in
// the user's config is kept.
std::vector<char> ReinitConfig(const ProxyComm& comm) {
  std::vector<char> config = comm.config;
  if (!config.empty()) reinterpret_cast<ncclConfig_t*>(config.data())->splitShare = 0;
  return config;
}

}  // namespace

Status Reinitialise(const std::vector<ProxyComm*>& comms, double timeout_seconds) {
  if (comms.empty()) return Status::Ok();
  std::vector<std::vector<char>> configs(comms.size());
  std::vector<ncclComm_t> fresh(comms.size(), nullptr);
  std::vector<Status> results(comms.size());
  const auto start = Clock::now();
  Real().ncclGroupStart();
  for (size_t i = 0; i < comms.size(); ++i) {
    ProxyComm* comm = comms[i];
    cuda::ScopedDeviceContext context(comm->device);
    if (cuda::Driver() != nullptr && comm->device >= 0 && !context.status().ok()) {
      results[i] = context.status();
      continue;
    }
    configs[i] = ReinitConfig(*comm);
    if (configs[i].empty()) {
      results[i] = NcclCheck(Real().ncclCommInitRank(&fresh[i], comm->nranks, comm->next_id, comm->rank),
                             "ncclCommInitRank(" + comm->key + ")");
    } else {
      results[i] = NcclCheck(
          Real().ncclCommInitRankConfig(&fresh[i], comm->nranks, comm->next_id, comm->rank,
                                        reinterpret_cast<ncclConfig_t*>(configs[i].data())),
          "ncclCommInitRankConfig(" + comm->key + ")");
    }
  }
  Status group = NcclCheck(Real().ncclGroupEnd(), "ncclGroupEnd (re-initialisation)");
  const auto deadline = Deadline(timeout_seconds);
  Status first_error = group;
  for (size_t i = 0; i < comms.size(); ++i) {
    ProxyComm* comm = comms[i];
    Status status = group.ok() ? results[i] : group;
    while (status.ok() && fresh[i] != nullptr) {  // nonblocking communicators finish later
      ncclResult_t state = ncclSuccess;
      Real().ncclCommGetAsyncError(fresh[i], &state);
      if (state == ncclSuccess) break;
      if (state != ncclInProgress) {
        status = NcclCheck(state, "re-initialising " + comm->key);
      } else if (Clock::now() > deadline) {
        status = Status::Error("re-initialising " + comm->key + " did not finish within " +
                               std::to_string(timeout_seconds) + " s: did every rank call resume?");
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    if (status.ok() && fresh[i] != nullptr) {
      comm->real = fresh[i];
      comm->state = CommState::kActive;
      comm->error.clear();
      comm->split_share = false;  // ReinitConfig: its future splits get their own resources
      comm->manager = Registry::Get().NewManager();
      comm->resume_seconds = Since(start);
      comm->awaiting_first_use.store(true);  // it connects again at its first collective
    } else if (first_error.ok()) {
      first_error = status.ok() ? Status::Error("no communicator returned for " + comm->key) : status;
    }
  }
  if (first_error.ok()) RecordReinit(static_cast<int>(comms.size()), Since(start));
  ReturnFreeHostMemory();  // the initialisation's temporaries, freed on NCCL's threads
  return first_error;
}

}  // namespace amem::nccl
