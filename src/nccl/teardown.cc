#include "nccl/teardown.h"

#include <algorithm>
#include <map>
#include <thread>

#include "nccl/auto_cost.h"
#include "nccl/clock.h"
#include "nccl/device_memory.h"
#include "nccl/host_memory.h"
#include "nccl/mem_stats.h"
#include "nccl/nccl_status.h"

namespace amem::nccl {
namespace {

void MarkPaused(ProxyComm* comm, int64_t bytes_freed, double seconds, double teardown) {
  comm->real = nullptr;
  comm->teardown_seconds = teardown;
  comm->state = CommState::kPaused;
  comm->last_strategy = "recreate";
  comm->bytes_freed = bytes_freed;
  comm->bytes_kept = 0;  // nothing of the communicator is left
  comm->pause_seconds = seconds;
}

// One communicator after another, each measured by the driver around its teardown.
Status TearDownInTurn(const std::vector<ProxyComm*>& comms, bool abort, double exchange_share) {
  double slowest = 0;
  for (ProxyComm* comm : comms) {
    const auto teardown_start = Clock::now();
    const int64_t free_before = FreeBytes(comm->device);
    Status ended = NcclCheck((abort ? Real().ncclCommAbort : Real().ncclCommDestroy)(comm->real),
                             abort ? "ncclCommAbort" : "ncclCommDestroy");
    const int64_t free_after = FreeBytes(comm->device);
    if (!ended.ok()) return MarkBroken(comm, ended);
    const int64_t driver = (free_before >= 0 && free_after >= 0) ? free_after - free_before : -1;
    const double teardown = Since(teardown_start);
    slowest = std::max(slowest, teardown);
    MarkPaused(comm, driver >= 0 ? driver : comm->bytes_before_pause, exchange_share + teardown,
               teardown);
  }
  RecordTeardown(slowest);
  return Status::Ok();
}

// Every ncclCommDestroy on its own thread: a destroy mostly waits (proxy threads,
// sockets), so N of them take about as long as one. The driver's reading around
// them is one communicator's own only when it is alone on its device; otherwise
// each reports NCCL's count (ncclCommMemStats), or unknown (-1) without it.
Status TearDownInParallel(const std::vector<ProxyComm*>& comms, double exchange_share) {
  const auto start = Clock::now();
  std::map<int, int64_t> free_before;
  std::map<int, int> per_device;
  for (ProxyComm* comm : comms) {
    if (!free_before.count(comm->device)) free_before[comm->device] = FreeBytes(comm->device);
    ++per_device[comm->device];
  }
  std::vector<Status> results(comms.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < comms.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = NcclCheck(Real().ncclCommDestroy(comms[i]->real), "ncclCommDestroy");
    });
  }
  for (std::thread& thread : threads) thread.join();
  const double seconds = Since(start);
  Status first_error;
  std::map<int, int64_t> free_after;
  for (size_t i = 0; i < comms.size(); ++i) {
    ProxyComm* comm = comms[i];
    if (!results[i].ok()) {
      Status broken = MarkBroken(comm, results[i]);
      if (first_error.ok()) first_error = broken;
      continue;
    }
    if (!free_after.count(comm->device)) free_after[comm->device] = FreeBytes(comm->device);
    const int64_t before = free_before[comm->device], after = free_after[comm->device];
    const bool alone = per_device[comm->device] == 1 && before >= 0 && after >= 0;
    MarkPaused(comm, alone ? after - before : comm->bytes_before_pause, exchange_share + seconds,
               seconds);
  }
  if (first_error.ok()) RecordTeardown(seconds);
  return first_error;
}

}  // namespace

Status MarkBroken(ProxyComm* comm, const Status& why) {
  comm->real = nullptr;
  comm->state = CommState::kBroken;
  comm->error = why.message();
  return Status::Error("pausing communicator " + comm->key + ": " + why.message());
}

void RecordBeforeTeardown(const std::vector<ProxyComm*>& comms) {
  for (ProxyComm* comm : comms) {
    comm->bytes_before_pause = MemStat(comm->real, kNcclStatGpuMemTotal);
    comm->suspendable_bytes = MemStat(comm->real, kNcclStatGpuMemSuspend);
  }
}

Status TearDown(const std::vector<ProxyComm*>& comms, Teardown teardown, double exchange_share) {
  Status status = teardown == Teardown::kParallelDestroy
                      ? TearDownInParallel(comms, exchange_share)
                      : TearDownInTurn(comms, teardown == Teardown::kAbort, exchange_share);
  ReturnFreeHostMemory();  // what the ended communicators held on the host
  return status;
}

}  // namespace amem::nccl
