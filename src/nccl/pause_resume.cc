#include "nccl/pause_resume.h"

#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "cuda/driver_api.h"
#include "nccl/id_exchange.h"
#include "nccl/nccl_status.h"

namespace amem::nccl {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Clock::time_point Deadline(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Free device memory as the driver sees it, or -1 without a driver (CPU tests).
int64_t FreeBytes(int device) {
  const cuda::DriverApi* api = cuda::Driver();
  if (api == nullptr || device < 0) return -1;
  cuda::ScopedDeviceContext context(device);
  if (!context.status().ok()) return -1;
  api->cuCtxSynchronize();
  size_t free_bytes = 0, total = 0;
  if (api->cuMemGetInfo(&free_bytes, &total) != cuda::kSuccess) return -1;
  return static_cast<int64_t>(free_bytes);
}

// Before pausing, work queued on the communicators' devices must be done.
void SynchronizeDevices(const std::vector<ProxyComm*>& comms) {
  const cuda::DriverApi* api = cuda::Driver();
  if (api == nullptr) return;
  for (ProxyComm* comm : comms) {
    if (comm->device < 0) continue;
    cuda::ScopedDeviceContext context(comm->device);
    if (context.status().ok()) api->cuCtxSynchronize();
  }
}

bool GroupedSuspendSupported() { return Real().version >= 23003; }

Status Select(const std::vector<uint64_t>& ids, CommState wanted, std::vector<ProxyComm*>* out) {
  std::vector<ProxyComm*> all = Registry::Get().Sorted();
  if (ids.empty()) {
    for (ProxyComm* comm : all) {
      if (comm->state == wanted) out->push_back(comm);
    }
    return Status::Ok();
  }
  for (ProxyComm* comm : all) {
    for (uint64_t id : ids) {
      if (comm->id != id) continue;
      if (comm->state != wanted) {
        return Status::Error("communicator " + std::to_string(id) + " (" + comm->key + ") is " +
                             StateName(comm->state) + ", not " + StateName(wanted));
      }
      out->push_back(comm);
    }
  }
  for (uint64_t id : ids) {
    bool found = false;
    for (ProxyComm* comm : *out) found |= comm->id == id;
    if (!found) return Status::Error("no communicator with id " + std::to_string(id) + " is tracked");
  }
  return Status::Ok();
}

// The new communicator must not try to share resources with a parent that no
// longer exists; everything else in the user's config is kept.
std::vector<char> ReinitConfig(const ProxyComm& comm) {
  std::vector<char> config = comm.config;
  if (!config.empty()) reinterpret_cast<ncclConfig_t*>(config.data())->splitShare = 0;
  return config;
}

// Calls `each` for every communicator, inside one NCCL group where suspend and
// resume may be grouped (NCCL >= 2.30.3); the first error wins.
template <typename Each>
Status ForEachMaybeGrouped(const std::vector<ProxyComm*>& comms, const char* what, Each each) {
  const bool grouped = GroupedSuspendSupported();
  if (grouped) Real().ncclGroupStart();
  Status status;
  for (ProxyComm* comm : comms) {
    Status one = each(comm);
    if (status.ok()) status = one;
  }
  if (grouped) {
    Status end = NcclCheck(Real().ncclGroupEnd(), std::string("ncclGroupEnd (") + what + ")");
    if (status.ok()) status = end;
  }
  return status;
}

int64_t MemStat(ncclComm_t real, ncclCommMemStat_t stat) {
  uint64_t bytes = 0;
  if (Real().ncclCommMemStats && Real().ncclCommMemStats(real, stat, &bytes) == ncclSuccess) {
    return static_cast<int64_t>(bytes);
  }
  return -1;
}

Status Suspend(const std::vector<ProxyComm*>& comms) {
  Status status = ForEachMaybeGrouped(comms, "suspend", [](ProxyComm* comm) {
    const auto start = Clock::now();
    comm->bytes_freed = MemStat(comm->real, kNcclStatGpuMemSuspend);
    comm->bytes_before_pause = MemStat(comm->real, kNcclStatGpuMemTotal);
    Status one = NcclCheck(Real().ncclCommSuspend(comm->real, kNcclSuspendMem),
                           "ncclCommSuspend(" + comm->key + ")");
    comm->pause_seconds = Since(start);
    return one;
  });
  if (!status.ok()) return status;
  for (ProxyComm* comm : comms) {
    comm->state = CommState::kPaused;
    comm->last_strategy = "suspend";
  }
  return Status::Ok();
}

void MarkPaused(ProxyComm* comm, int64_t bytes_freed, double seconds) {
  comm->real = nullptr;
  comm->state = CommState::kPaused;
  comm->last_strategy = "recreate";
  comm->bytes_freed = bytes_freed;
  comm->bytes_before_pause = bytes_freed;
  comm->pause_seconds = seconds;
}

Status MarkBroken(ProxyComm* comm, const Status& why) {
  comm->real = nullptr;
  comm->state = CommState::kBroken;
  comm->error = why.message();
  return Status::Error("pausing communicator " + comm->key + ": " + why.message());
}

// One communicator after another, each measured by the driver around its teardown.
Status TearDownInTurn(const std::vector<ProxyComm*>& comms, const PauseRequest& request,
                      double exchange_share) {
  const bool abort = request.teardown == Teardown::kAbort;
  for (ProxyComm* comm : comms) {
    const auto teardown_start = Clock::now();
    const int64_t free_before = FreeBytes(comm->device);
    Status ended = NcclCheck((abort ? Real().ncclCommAbort : Real().ncclCommDestroy)(comm->real),
                             abort ? "ncclCommAbort" : "ncclCommDestroy");
    const int64_t free_after = FreeBytes(comm->device);
    if (!ended.ok()) return MarkBroken(comm, ended);
    MarkPaused(comm, (free_before >= 0 && free_after >= 0) ? free_after - free_before : -1,
               exchange_share + Since(teardown_start));
  }
  return Status::Ok();
}

// Every ncclCommDestroy on its own thread: a destroy mostly waits (proxy threads,
// sockets), so N of them take about as long as one. Memory is measured per
// device around all of them and shared evenly among that device's communicators.
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
  for (size_t i = 0; i < comms.size(); ++i) {
    ProxyComm* comm = comms[i];
    if (!results[i].ok()) {
      Status broken = MarkBroken(comm, results[i]);
      if (first_error.ok()) first_error = broken;
      continue;
    }
    const int64_t before = free_before[comm->device];
    const int64_t after = FreeBytes(comm->device);
    MarkPaused(comm, (before >= 0 && after >= 0) ? (after - before) / per_device[comm->device] : -1,
               exchange_share + seconds);
  }
  return first_error;
}

Status Recreate(const std::vector<ProxyComm*>& comms, const PauseRequest& request) {
  const auto start = Clock::now();
  std::vector<ProxyComm*> stuck;
  Status exchanged = ExchangeNextIds(comms, request.timeout_seconds, &stuck);
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
  return request.teardown == Teardown::kParallelDestroy ? TearDownInParallel(comms, exchange_share)
                                                         : TearDownInTurn(comms, request, exchange_share);
}

Status Reinitialise(const std::vector<ProxyComm*>& comms, double timeout_seconds) {
  std::vector<std::vector<char>> configs;
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
    configs.push_back(ReinitConfig(*comm));
    if (configs.back().empty()) {
      results[i] = NcclCheck(Real().ncclCommInitRank(&fresh[i], comm->nranks, comm->next_id, comm->rank),
                             "ncclCommInitRank(" + comm->key + ")");
    } else {
      results[i] = NcclCheck(
          Real().ncclCommInitRankConfig(&fresh[i], comm->nranks, comm->next_id, comm->rank,
                                        reinterpret_cast<ncclConfig_t*>(configs.back().data())),
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
      comm->resume_seconds = Since(start);
    } else if (first_error.ok()) {
      first_error = status.ok() ? Status::Error("no communicator returned for " + comm->key) : status;
    }
  }
  return first_error;
}

Status ResumeSuspended(const std::vector<ProxyComm*>& comms) {
  const auto start = Clock::now();
  Status status = ForEachMaybeGrouped(comms, "resume", [](ProxyComm* comm) {
    return NcclCheck(Real().ncclCommResume(comm->real), "ncclCommResume(" + comm->key + ")");
  });
  if (!status.ok()) return status;
  for (ProxyComm* comm : comms) {
    comm->state = CommState::kActive;
    comm->resume_seconds = Since(start);
  }
  return Status::Ok();
}

}  // namespace

Strategy ChooseStrategy(const ProxyComm& comm, std::string* why_not_suspend) {
  if (Real().ncclCommSuspend == nullptr || Real().ncclCommResume == nullptr) {
    *why_not_suspend = "the loaded NCCL (" + std::to_string(Real().version) +
                       ") has no ncclCommSuspend (needs NCCL >= 2.29.7)";
    return Strategy::kRecreate;
  }
  if (comm.split_share) {
    *why_not_suspend = "it was created with splitShare, which ncclCommSuspend refuses";
    return Strategy::kRecreate;
  }
  why_not_suspend->clear();
  return Strategy::kSuspend;
}

Status PauseCommunicators(const PauseRequest& request) {
  std::unique_lock<std::shared_mutex> lock(Registry::Get().lock());
  std::vector<ProxyComm*> selected;
  Status status = Select(request.ids, CommState::kActive, &selected);
  if (!status.ok() || selected.empty()) return status;

  // Decide every communicator's strategy before touching any of them.
  std::vector<ProxyComm*> suspend, recreate;
  for (ProxyComm* comm : selected) {
    std::string why_not_suspend;
    Strategy automatic = ChooseStrategy(*comm, &why_not_suspend);
    Strategy chosen = request.strategy == Strategy::kAuto ? automatic : request.strategy;
    if (chosen == Strategy::kSuspend && automatic != Strategy::kSuspend) {
      return Status::Error("cannot suspend communicator " + comm->key + ": " + why_not_suspend +
                           ". Use strategy='recreate' or 'auto'.");
    }
    if (chosen == Strategy::kRecreate) {
      const int tied = comm->registrations + comm->windows + comm->device_comms;
      if (tied > 0) {
        return Status::Error(
            "cannot recreate communicator " + comm->key + ": it has " +
            std::to_string(comm->registrations) + " registered buffer(s), " +
            std::to_string(comm->windows) + " window(s) and " + std::to_string(comm->device_comms) +
            " device communicator(s) that would point at the destroyed communicator. "
            "Deregister them first (for XLA: run without --xla_gpu_enable_nccl_user_buffers), "
            "or use strategy='suspend' on NCCL >= 2.29.7.");
      }
      if (comm->real == nullptr) {
        return Status::Error("communicator " + comm->key + " has no real communicator to pause");
      }
    }
    (chosen == Strategy::kSuspend ? suspend : recreate).push_back(comm);
  }
  SynchronizeDevices(selected);
  if (!suspend.empty()) status = Suspend(suspend);
  if (status.ok() && !recreate.empty()) status = Recreate(recreate, request);
  return status;
}

Status BeginResume(const std::vector<uint64_t>& ids) {
  std::unique_lock<std::shared_mutex> lock(Registry::Get().lock());
  std::vector<ProxyComm*> selected;
  Status status = Select(ids, CommState::kPaused, &selected);
  if (!status.ok()) return status;
  for (ProxyComm* comm : selected) comm->resuming.store(true, std::memory_order_release);
  return Status::Ok();
}

Status ResumeCommunicators(const std::vector<uint64_t>& ids, double timeout_seconds) {
  std::vector<ProxyComm*> selected;
  Status status;
  {
    std::unique_lock<std::shared_mutex> lock(Registry::Get().lock());
    status = Select(ids, CommState::kPaused, &selected);
    if (status.ok()) {
      std::vector<ProxyComm*> suspended, recreated;
      for (ProxyComm* comm : selected) {
        (comm->last_strategy == "suspend" ? suspended : recreated).push_back(comm);
      }
      if (!suspended.empty()) status = ResumeSuspended(suspended);
      if (status.ok() && !recreated.empty()) status = Reinitialise(recreated, timeout_seconds);
    }
  }
  // Whatever happened, nobody waits on these any more.
  for (ProxyComm* comm : Registry::Get().Sorted()) {
    comm->resuming.store(false, std::memory_order_release);
  }
  return status;
}

}  // namespace amem::nccl
