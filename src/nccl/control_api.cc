// The interposer's own C API, called from Python (jax_amem/nccl/_control.py)
// through ctypes: the interposer is a separate shared object (it must carry the
// SONAME libnccl.so.2), so its control surface is a small C ABI. Reports
// travel as JSON text.
#include <dlfcn.h>

#include <cstring>
#include <string>

#include "nccl/guard.h"
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

// Bumped when this C API changes; Python checks it.
AMEM_EXPORT int amem_nccl_abi_version() { return 2; }

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

// What pause(strategy) would do to each selected communicator, touching
// nothing: {"plan": [...]} or {"error": "..."}. strategy: 0 auto, 1 suspend, 2 recreate.
// Valid until the next call on this thread.
AMEM_EXPORT const char* amem_nccl_plan(const uint64_t* ids, int count, int strategy) {
  thread_local std::string text;
  std::vector<PlanEntry> plan;
  std::shared_lock<std::shared_mutex> lock(Registry::Get().lock());
  amem::Status status = strategy < 0 || strategy > 2
                            ? amem::Status::Error("strategy must be 0 (auto), 1 (suspend) or 2 (recreate)")
                            : PlanPause(Ids(ids, count), static_cast<Strategy>(strategy), &plan);
  if (status.ok()) {
    text = "{\"plan\":" + PlanJson(plan) + "}";
  } else {
    std::string message;
    for (char c : status.message()) message += (c == '"' || c == '\\' || c < 0x20) ? ' ' : c;
    text = "{\"error\":\"" + message + "\"}";
  }
  return text.c_str();
}

// strategies: one per id, 1 suspend or 2 recreate (what every rank agreed on), or
// null to decide here with `strategy` (0 auto, 1 suspend, 2 recreate).
// teardown: 0 destroy, 1 abort, 2 parallel destroy.
AMEM_EXPORT int amem_nccl_pause(const uint64_t* ids, const int* strategies, int count, int strategy,
                                double timeout_seconds, int teardown, char* error, int error_bytes) {
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
  request.timeout_seconds = timeout_seconds;
  if (teardown < 0 || teardown > 2) {
    return Report(amem::Status::Error("teardown must be 0 (destroy), 1 (abort) or 2 (parallel destroy)"),
                  error, error_bytes);
  }
  request.teardown = static_cast<Teardown>(teardown);
  return Report(PauseCommunicators(request), error, error_bytes);
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

AMEM_EXPORT int amem_nccl_resume(const uint64_t* ids, int count, double timeout_seconds, char* error,
                                 int error_bytes) {
  return Report(ResumeCommunicators(Ids(ids, count), timeout_seconds), error, error_bytes);
}

// The message the interposer gave the last refused call on this thread.
AMEM_EXPORT const char* amem_nccl_last_error() {
  const char* message = LastError();
  return message == nullptr ? "" : message;
}
