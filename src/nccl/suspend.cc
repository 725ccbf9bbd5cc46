#include "nccl/suspend.h"

#include <algorithm>

#include "nccl/auto_cost.h"
#include "nccl/clock.h"
#include "nccl/mem_stats.h"
#include "nccl/nccl_status.h"
#include "nccl/overlap.h"

namespace amem::nccl {

Status Suspend(const std::vector<ProxyComm*>& comms) {
  if (comms.empty()) return Status::Ok();
  int64_t suspendable = 0;
  for (ProxyComm* comm : comms) {
    comm->suspendable_bytes = MemStat(comm->real, kNcclStatGpuMemSuspend);
    comm->bytes_before_pause = MemStat(comm->real, kNcclStatGpuMemTotal);
    suspendable += std::max<int64_t>(comm->suspendable_bytes, 0);
  }
  const auto start = Clock::now();
  Status status = GroupedOrEach(comms, "suspend", [](ProxyComm* comm) {
    return NcclCheck(Real().ncclCommSuspend(comm->real, kNcclSuspendMem),
                     "ncclCommSuspend(" + comm->key + ")");
  });
  const double seconds = Since(start);
  if (!status.ok()) return status;
  RecordSuspend(suspendable, seconds);
  for (ProxyComm* comm : comms) {
    comm->state = CommState::kPaused;
    comm->last_strategy = "suspend";
    comm->pause_seconds = seconds;
    // NCCL's own count for this communicator: what suspend released, what stayed.
    const bool suspended = MemStat(comm->real, kNcclStatGpuMemSuspended) == 1;
    comm->bytes_freed = suspended ? comm->suspendable_bytes : -1;
    comm->bytes_kept = MemStat(comm->real, kNcclStatGpuMemPersist);
  }
  return Status::Ok();
}

Status ResumeSuspended(const std::vector<ProxyComm*>& comms) {
  if (comms.empty()) return Status::Ok();
  int64_t restored = 0;
  for (ProxyComm* comm : comms) restored += std::max<int64_t>(comm->bytes_freed, 0);
  const auto start = Clock::now();
  Status status = GroupedOrEach(comms, "resume", [](ProxyComm* comm) {
    return NcclCheck(Real().ncclCommResume(comm->real), "ncclCommResume(" + comm->key + ")");
  });
  if (!status.ok()) return status;
  const double seconds = Since(start);
  RecordResume(restored, seconds);
  for (ProxyComm* comm : comms) {
    comm->state = CommState::kActive;
    comm->resume_seconds = seconds;
  }
  return Status::Ok();
}

}  // namespace amem::nccl
