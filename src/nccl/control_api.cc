// The interposer's own C API, called from Python (jax_amem/nccl/_control.py)
// through ctypes: the interposer is a separate shared object (it must carry the
// SONAME libnccl.so.2), so its control surface is a small C ABI. Reports
// travel as JSON text.
#include <dlfcn.h>

#include <cstring>
#include <string>

#include "nccl/auto_cost.h"
#include "nccl/guard.h"
#include "nccl/json_text.h"
#include "nccl/keep_suspendable.h"
#include "nccl/nccl_status.h"
#include "nccl/pause_resume.h"

using namespace amem::nccl;

namespace {

int Report(const amem::Status& status, char* error, int error_bytes) {
  if (status.ok()) return 0;
  if (error != nullptr && error_bytes > 0) {
    std::strncpy(error, status.message().c_str(), error_bytes - 1);
    error[error_bytes - 1] = '\0';
  }
  return 1;
}

std::vector<uint64_t> Ids(const uint64_t* ids, int count) {
  return ids == nullptr ? std::vector<uint64_t>() : std::vector<uint64_t>(ids, ids + count);
}

}  // namespace

// Bumped when this C API changes: the number lives in jax_amem/nccl/_loader.py
// (ABI_VERSION), which the build reads (src/nccl/CMakeLists.txt) and Python checks.
AMEM_EXPORT int amem_nccl_abi_version() { return AMEM_NCCL_ABI_VERSION; }

AMEM_EXPORT int amem_nccl_real_version() { return Real().version; }

AMEM_EXPORT int amem_nccl_has_suspend() {
  return Real().ncclCommSuspend != nullptr && Real().ncclCommResume != nullptr;
}

// 1 when a bare dlopen("libnccl.so.2") in this process returns the interposer,
// i.e. XLA (and PyTorch) will see it; 0 when the real library got there first.
AMEM_EXPORT int amem_nccl_is_front() {
  void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return 0;
  const bool ours = dlsym(handle, "amem_nccl_abi_version") != nullptr;
  dlclose(handle);
  return ours ? 1 : 0;
}

// JSON list of every tracked communicator; valid until the next call on this thread.
AMEM_EXPORT const char* amem_nccl_snapshot() {
  thread_local std::string text;
  text = Registry::Get().SnapshotJson();
  return text.c_str();
}

// What pause(strategy) would do to each selected communicator, touching nothing
// but, with make_ids, the ids rank 0 makes for the communicators to recreate:
// {"plan": [...]} or {"error": "..."}. strategy: 0 auto, 1 suspend, 2 recreate.
// flags: 1 make_ids; 2 agreed (an agreement merges every process's plan, so `auto`
// may choose by cost for every communicator; see pause_plan.h).
// Valid until the next call on this thread.
AMEM_EXPORT const char* amem_nccl_plan(const uint64_t* ids, int count, int strategy, int flags) {
  thread_local std::string text;
  std::vector<PlanEntry> plan;
  std::unique_lock<std::shared_mutex> lock(Registry::Get().lock());
  amem::Status status = strategy < 0 || strategy > 2
                            ? amem::Status::Error("strategy must be 0 (auto), 1 (suspend) or 2 (recreate)")
                            : PlanPause(Ids(ids, count), static_cast<Strategy>(strategy), &plan,
                                        (flags & 1) != 0, (flags & 2) != 0);
  text = status.ok() ? "{\"plan\":" + PlanJson(plan) + "}" : "{\"error\":" + JsonString(status.message()) + "}";
  return text.c_str();
}

// strategies: one per id, 1 suspend or 2 recreate (what every rank agreed on), or
// null to decide here with `strategy` (0 auto, 1 suspend, 2 recreate).
// next_ids: 128 bytes per id, the replacement's unique id of each communicator to
// recreate as its rank 0 made it (all zero: unknown, sent over the communicator), or null.
// teardown: 0 destroy, 1 abort, 2 parallel destroy.
// rows: the paused communicators' rows (JSON), valid until the next call on this thread.
AMEM_EXPORT int amem_nccl_pause(const uint64_t* ids, const int* strategies, const char* next_ids,
                                int count, int strategy, double timeout_seconds, int teardown,
                                const char** rows, char* error, int error_bytes) {
  thread_local std::string text;
  PauseRequest request;
  request.ids = Ids(ids, count);
  if (strategy < 0 || strategy > 2) {
    return Report(amem::Status::Error("strategy must be 0 (auto), 1 (suspend) or 2 (recreate)"),
                  error, error_bytes);
  }
  request.strategy = static_cast<Strategy>(strategy);
  for (int i = 0; strategies != nullptr && i < count; ++i) {
    if (strategies[i] != 1 && strategies[i] != 2) {
      return Report(amem::Status::Error("an agreed strategy must be 1 (suspend) or 2 (recreate)"),
                    error, error_bytes);
    }
    request.strategies.push_back(static_cast<Strategy>(strategies[i]));
  }
  for (int i = 0; next_ids != nullptr && i < count; ++i) {
    ncclUniqueId id;
    std::memcpy(id.internal, next_ids + static_cast<size_t>(i) * NCCL_UNIQUE_ID_BYTES, NCCL_UNIQUE_ID_BYTES);
    request.next_ids.push_back(id);
  }
  request.timeout_seconds = timeout_seconds;
  if (teardown < 0 || teardown > 2) {
    return Report(amem::Status::Error("teardown must be 0 (destroy), 1 (abort) or 2 (parallel destroy)"),
                  error, error_bytes);
  }
  request.teardown = static_cast<Teardown>(teardown);
  std::vector<ProxyComm*> selected;
  const amem::Status status = PauseCommunicators(request, &selected);
  text = Registry::Get().RowsJson(selected);
  if (rows != nullptr) *rows = text.c_str();
  return Report(status, error, error_bytes);
}

// `auto`'s cost model: {"rates": {...}} or {"error": "..."} (JAX_AMEM_NCCL_COST unreadable).
// reset: 1 forgets what this process measured first. Valid until the next call on this thread.
AMEM_EXPORT const char* amem_nccl_cost_rates(int reset) {
  thread_local std::string text;
  if (reset == 1) ResetCostModel();
  CostRates rates;
  const amem::Status status = CurrentRates(&rates);
  text = status.ok() ? "{\"rates\":" + CostRatesJson(rates) + "}" : "{\"error\":" + JsonString(status.message()) + "}";
  return text.c_str();
}

// Calls waiting for a resume stop waiting (its agreement failed: still paused).
AMEM_EXPORT void amem_nccl_cancel_resume() { CancelResume(); }

// A fresh NCCL unique id (128 bytes) for recover(): made by one rank, handed to
// the others over the jax.distributed key-value store.
AMEM_EXPORT int amem_nccl_new_unique_id(char* out, char* error, int error_bytes) {
  ncclUniqueId id{};
  if (Real().ncclGetUniqueId == nullptr) {
    return Report(amem::Status::Error("the loaded NCCL has no ncclGetUniqueId"), error, error_bytes);
  }
  amem::Status status = NcclCheck(Real().ncclGetUniqueId(&id), "ncclGetUniqueId");
  if (status.ok()) std::memcpy(out, id.internal, NCCL_UNIQUE_ID_BYTES);
  return Report(status, error, error_bytes);
}

// unique_ids: 128 bytes per id, the same on every rank of each communicator.
AMEM_EXPORT int amem_nccl_recover(const uint64_t* ids, const char* unique_ids, int count,
                                  double timeout_seconds, char* error, int error_bytes) {
  return Report(RecoverCommunicators(Ids(ids, count), unique_ids, timeout_seconds), error, error_bytes);
}

// -1: leave as is; 0/1: set. Returns whether communicators are kept suspendable.
AMEM_EXPORT int amem_nccl_keep_suspendable(int on) {
  if (on >= 0) SetKeepSuspendable(on == 1);
  return KeepSuspendable() ? 1 : 0;
}

AMEM_EXPORT uint64_t amem_nccl_keep_suspendable_rewrites() { return KeepSuspendableRewrites(); }

AMEM_EXPORT int amem_nccl_begin_resume(const uint64_t* ids, int count, char* error, int error_bytes) {
  return Report(BeginResume(Ids(ids, count)), error, error_bytes);
}

// rows: the resumed communicators' rows (JSON), valid until the next call on this thread.
AMEM_EXPORT int amem_nccl_resume(const uint64_t* ids, int count, double timeout_seconds,
                                 const char** rows, char* error, int error_bytes) {
  thread_local std::string text;
  std::vector<ProxyComm*> selected;
  const amem::Status status = ResumeCommunicators(Ids(ids, count), timeout_seconds, &selected);
  text = Registry::Get().RowsJson(selected);
  if (rows != nullptr) *rows = text.c_str();
  return Report(status, error, error_bytes);
}

// The message the interposer gave the last refused call on this thread.
AMEM_EXPORT const char* amem_nccl_last_error() {
  const char* message = LastError();
  return message == nullptr ? "" : message;
}
