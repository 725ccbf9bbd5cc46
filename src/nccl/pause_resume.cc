#include "nccl/pause_resume.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "cuda/driver_api.h"
#include "nccl/id_exchange.h"
#include "nccl/json_text.h"
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
  std::set<int> done;
  for (ProxyComm* comm : comms) {
    if (comm->device < 0 || !done.insert(comm->device).second) continue;
    cuda::ScopedDeviceContext context(comm->device);
    if (context.status().ok()) api->cuCtxSynchronize();
  }
}

bool GroupedSuspendSupported() { return Real().version >= 23003; }

bool IsZero(const ncclUniqueId& id) {
  for (char c : id.internal) {
    if (c != 0) return false;
  }
  return true;
}

// How independent communicators are paused and resumed (JAX_AMEM_NCCL_OVERLAP):
//   threads (default): each communicator's suspend / resume / teardown on a thread of
//     its own, and the suspends beside the recreates. Needed when several ranks of one
//     communicator live in this process: NCCL's suspend meets its peers at a barrier.
//     (Not faster than a group for NCCL 2.30.7's suspend: it offloads every 2 MiB
//     granule to a pinned host buffer it allocates then, 1.5 GB/s either way on the
//     H200, docs/nccl.md. The teardowns do overlap: 32 destroys in 0.8-1.0 s against
//     8.7-9.0 s in turn.)
//   group: suspends and resumes inside one ncclGroupStart/End where NCCL allows it
//     (>= 2.30.3), else threads.
//   serial: one after another, in key order (for debugging).
enum class Overlap { kThreads, kGroup, kSerial };

Overlap OverlapMode() {
  const char* value = std::getenv("JAX_AMEM_NCCL_OVERLAP");
  if (value != nullptr && std::strcmp(value, "serial") == 0) return Overlap::kSerial;
  if (value != nullptr && std::strcmp(value, "group") == 0) return Overlap::kGroup;
  return Overlap::kThreads;
}

bool Concurrent() { return OverlapMode() != Overlap::kSerial; }

// Runs `work` on every item, on threads of their own when `parallel`, each with
// the item's device current; the first error in item order wins.
template <typename Work>
Status ForEach(const std::vector<ProxyComm*>& comms, bool parallel, Work work) {
  std::vector<Status> results(comms.size());
  auto one = [&](size_t i) {
    cuda::ScopedDeviceContext context(comms[i]->device);
    results[i] = work(comms[i]);
  };
  if (parallel && comms.size() > 1) {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < comms.size(); ++i) threads.emplace_back(one, i);
    for (std::thread& thread : threads) thread.join();
  } else {
    for (size_t i = 0; i < comms.size(); ++i) one(i);
  }
  for (const Status& status : results) {
    if (!status.ok()) return status;
  }
  return Status::Ok();
}

// Two independent jobs, at once when overlapping.
Status Both(bool overlap, const std::function<Status()>& first, const std::function<Status()>& second) {
  if (!overlap) {
    Status a = first();
    Status b = a.ok() ? second() : Status::Ok();
    return a.ok() ? b : a;
  }
  Status a;
  std::thread thread([&] { a = first(); });
  Status b = second();
  thread.join();
  return a.ok() ? b : a;
}

Status Select(const std::vector<uint64_t>& ids, CommState wanted, std::vector<ProxyComm*>* out) {
  std::vector<ProxyComm*> all = Registry::Get().Sorted();
  if (ids.empty()) {
    for (ProxyComm* comm : all) {
      if (comm->state == wanted) out->push_back(comm);
    }
    return Status::Ok();
  }
  std::set<uint64_t> seen;
  for (uint64_t id : ids) {
    if (!seen.insert(id).second) {
      return Status::Error("communicator id " + std::to_string(id) +
                           " is given twice: name each communicator once");
    }
  }
  for (ProxyComm* comm : all) {  // key order, whatever the order of `ids`
    if (!seen.count(comm->id)) continue;
    if (comm->state != wanted) {
      return Status::Error("communicator " + std::to_string(comm->id) + " (" + comm->key + ") is " +
                           StateName(comm->state) + ", not " + StateName(wanted));
    }
    out->push_back(comm);
  }
  if (out->size() != ids.size()) {
    for (uint64_t id : ids) {
      bool found = false;
      for (ProxyComm* comm : *out) found |= comm->id == id;
      if (!found) return Status::Error("no communicator with id " + std::to_string(id) + " is tracked");
    }
  }
  return Status::Ok();
}

// The new communicator must not share resources with anything (there is no
// parent any more, and sharing would make it unsuspendable); everything else in
// the user's config is kept.
std::vector<char> ReinitConfig(const ProxyComm& comm) {
  std::vector<char> config = comm.config;
  if (!config.empty()) reinterpret_cast<ncclConfig_t*>(config.data())->splitShare = 0;
  return config;
}

int64_t MemStat(ncclComm_t real, ncclCommMemStat_t stat) {
  uint64_t bytes = 0;
  if (real != nullptr && Real().ncclCommMemStats &&
      Real().ncclCommMemStats(real, stat, &bytes) == ncclSuccess) {
    return static_cast<int64_t>(bytes);
  }
  return -1;
}

// `each` for every communicator: inside one NCCL group when asked for and NCCL
// allows it (>= 2.30.3); otherwise each on its own thread, or in key order
// (serial). The first error wins.
template <typename Each>
Status GroupedOrEach(const std::vector<ProxyComm*>& comms, const char* what, Each each) {
  if (OverlapMode() != Overlap::kGroup || !GroupedSuspendSupported()) {
    return ForEach(comms, Concurrent(), each);
  }
  Real().ncclGroupStart();
  Status status;
  for (ProxyComm* comm : comms) {
    Status one = each(comm);
    if (status.ok()) status = one;
  }
  Status end = NcclCheck(Real().ncclGroupEnd(), std::string("ncclGroupEnd (") + what + ")");
  return status.ok() ? end : status;
}

Status Suspend(const std::vector<ProxyComm*>& comms) {
  if (comms.empty()) return Status::Ok();
  for (ProxyComm* comm : comms) {
    comm->suspendable_bytes = MemStat(comm->real, kNcclStatGpuMemSuspend);
    comm->bytes_before_pause = MemStat(comm->real, kNcclStatGpuMemTotal);
  }
  const auto start = Clock::now();
  Status status = GroupedOrEach(comms, "suspend", [](ProxyComm* comm) {
    return NcclCheck(Real().ncclCommSuspend(comm->real, kNcclSuspendMem),
                     "ncclCommSuspend(" + comm->key + ")");
  });
  const double seconds = Since(start);
  if (!status.ok()) return status;
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

void MarkPaused(ProxyComm* comm, int64_t bytes_freed, double seconds, double teardown) {
  comm->real = nullptr;
  comm->teardown_seconds = teardown;
  comm->state = CommState::kPaused;
  comm->last_strategy = "recreate";
  comm->bytes_freed = bytes_freed;
  comm->bytes_kept = 0;  // nothing of the communicator is left
  comm->pause_seconds = seconds;
}

Status MarkBroken(ProxyComm* comm, const Status& why) {
  comm->real = nullptr;
  comm->state = CommState::kBroken;
  comm->error = why.message();
  return Status::Error("pausing communicator " + comm->key + ": " + why.message());
}

// NCCL's count of the communicator's device memory, read before it is ended
// (-1 when the NCCL has no ncclCommMemStats).
void RecordBeforeTeardown(const std::vector<ProxyComm*>& comms) {
  for (ProxyComm* comm : comms) {
    comm->bytes_before_pause = MemStat(comm->real, kNcclStatGpuMemTotal);
    comm->suspendable_bytes = MemStat(comm->real, kNcclStatGpuMemSuspend);
  }
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
    const int64_t driver = (free_before >= 0 && free_after >= 0) ? free_after - free_before : -1;
    const double teardown = Since(teardown_start);
    MarkPaused(comm, driver >= 0 ? driver : comm->bytes_before_pause, exchange_share + teardown,
               teardown);
  }
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
  return first_error;
}

Status Recreate(const std::vector<ProxyComm*>& comms, const PauseRequest& request) {
  if (comms.empty()) return Status::Ok();
  const auto start = Clock::now();
  RecordBeforeTeardown(comms);
  // The ids every rank agreed on (made by rank 0 for the plan) are in next_id
  // already; the others go over the communicator before it is ended.
  std::vector<ProxyComm*> unknown, stuck;
  for (ProxyComm* comm : comms) {
    if (!comm->next_id_given) unknown.push_back(comm);
  }
  Status exchanged = ExchangeNextIds(unknown, request.timeout_seconds, &stuck);
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
  return request.teardown == Teardown::kParallelDestroy ? TearDownInParallel(comms, exchange_share)
                                                         : TearDownInTurn(comms, request, exchange_share);
}

// Initialises every communicator again with its next_id, in one NCCL group,
// behind the same proxy; each then has a memory manager of its own.
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
    } else if (first_error.ok()) {
      first_error = status.ok() ? Status::Error("no communicator returned for " + comm->key) : status;
    }
  }
  return first_error;
}

// JAX_AMEM_NCCL_SUSPEND_LIMIT (opt-in; bytes, or with K, M, G): the most `auto` suspends in
// one pause of this process before it recreates instead. -1: no limit (unset or unreadable).
int64_t SuspendLimit() {
  const char* value = std::getenv("JAX_AMEM_NCCL_SUSPEND_LIMIT");
  if (value == nullptr || *value == '\0') return -1;
  char* end = nullptr;
  const double number = std::strtod(value, &end);
  double unit = 1;
  if (*end == 'K' || *end == 'k') unit = 1024.0, ++end;
  else if (*end == 'M' || *end == 'm') unit = 1024.0 * 1024, ++end;
  else if (*end == 'G' || *end == 'g') unit = 1024.0 * 1024 * 1024, ++end;
  if (*end != '\0' || !(number >= 0)) return -1;
  return static_cast<int64_t>(number * unit);
}

std::string Size(int64_t bytes) {
  char text[32];
  if (bytes >= (int64_t{1} << 30)) {
    std::snprintf(text, sizeof(text), "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  } else if (bytes >= (int64_t{1} << 20)) {
    std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  } else {
    std::snprintf(text, sizeof(text), "%lld bytes", static_cast<long long>(bytes));
  }
  return text;
}

// NCCL 2.30.7's suspend offloads every 2 MiB granule through a pinned host buffer it
// allocates then: about 1 s per GiB for suspend plus resume on the H200, whatever the
// overlap, where a recreate's teardown runs on every communicator at once (12 GiB: 12.1 s
// against 2.1 s, docs/nccl.md). Above the limit, `auto` recreates what it can; the
// communicators it recreates connect again at their next collective.
void RecreateAboveLimit(std::vector<PlanEntry>* plan) {
  const int64_t limit = SuspendLimit();
  if (limit < 0) return;
  int64_t total = 0;
  for (const PlanEntry& entry : *plan) {
    if (entry.strategy == Strategy::kSuspend) total += std::max<int64_t>(MemStat(entry.comm->real, kNcclStatGpuMemSuspend), 0);
  }
  if (total <= limit) return;
  for (PlanEntry& entry : *plan) {
    const ProxyComm& comm = *entry.comm;
    if (entry.strategy != Strategy::kSuspend || entry.refused || comm.real == nullptr ||
        comm.registrations + comm.windows + comm.device_comms > 0) {
      continue;
    }
    entry.strategy = Strategy::kRecreate;
    entry.why = "this process would suspend " + Size(total) + ", above JAX_AMEM_NCCL_SUSPEND_LIMIT (" +
                Size(limit) + "): NCCL's suspend moves about 1 GiB/s, a recreate ends every "
                "communicator at once";
  }
}

Status ResumeSuspended(const std::vector<ProxyComm*>& comms) {
  if (comms.empty()) return Status::Ok();
  const auto start = Clock::now();
  Status status = GroupedOrEach(comms, "resume", [](ProxyComm* comm) {
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
                 bool make_ids) {
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
  if (requested == Strategy::kAuto) RecreateAboveLimit(plan);
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

Status PauseCommunicators(const PauseRequest& request, std::vector<ProxyComm*>* selected) {
  std::unique_lock<std::shared_mutex> lock(Registry::Get().lock());
  std::vector<PlanEntry> plan;
  Status status = PlanPause(request.ids, request.strategy, &plan);
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
        if (!entry.refused) entry.why = "another rank of it cannot suspend it (here: " + local_why + ")";
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
              [&] { return Suspend(suspend); }, [&] { return Recreate(recreate, request); });
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
