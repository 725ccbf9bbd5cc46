// Every communicator created through the interposer, behind a proxy handle.
//
// Why proxies: the `recreate` strategy destroys the real communicator and
// initialises a new one; XLA keeps the handle it was given. A proxy owned by
// the interposer keeps that handle valid while the real one behind it changes.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "nccl/nccl_types.h"

namespace amem::nccl {

enum class CommState { kActive, kPaused, kBroken };
enum class Strategy { kAuto, kSuspend, kRecreate };

const char* StateName(CommState state);
const char* StrategyName(Strategy strategy);

struct ProxyComm {
  static constexpr uint64_t kMagic = 0x6a61782d616d656dULL;  // "jax-amem"
  uint64_t magic = kMagic;
  uint64_t id = 0;            // creation order in this process, from 1
  ncclComm_t real = nullptr;  // null while paused by `recreate`
  CommState state = CommState::kActive;
  std::atomic<bool> resuming{false};  // set while an asynchronous resume runs
  int rank = 0;
  int nranks = 0;
  int device = -1;
  // Identical on every rank of the communicator (hash of its unique id, or the
  // parent's key plus the split), so that every rank orders pauses the same way.
  std::string key;
  std::string owner;    // "xla", "torch", "jax_amem" or "other": who created it
  std::string created_by;
  std::vector<char> config;  // copy of the ncclConfig_t given at creation, if any
  // Whether children split from this communicator share its resources (NCCL
  // decides by the parent's config.splitShare, not the child's).
  bool split_share = false;
  // NCCL's memory manager, modelled: a root (or a communicator we recreated)
  // has its own; a child split/shrunk from a tracked parent whose resources it
  // shares holds the parent's. ncclCommSuspend refuses a communicator whose
  // manager another live communicator also holds (memManager->refCount > 1).
  uint64_t manager = 0;
  uint64_t parent_id = 0;  // the tracked communicator it was split from, 0 for none
  std::atomic<int> splits_made{0};
  int registrations = 0;
  int windows = 0;
  int device_comms = 0;
  // What the last pause/resume did.
  std::string last_strategy;
  ncclUniqueId next_id{};  // recreate: the id the new communicator will use
  bool next_id_made = false;   // rank 0 made next_id for the plan of the pause to come
  bool next_id_given = false;  // the pause was handed next_id (no exchange over the communicator)
  std::string strategy_why;  // why that strategy (why not suspend, for recreate)
  int64_t bytes_before_pause = -1;
  int64_t bytes_freed = -1;        // this communicator's own bytes; -1 unknown
  int64_t bytes_kept = -1;         // what stayed allocated while paused (ncclCommMemStats)
  int64_t suspendable_bytes = -1;  // ncclCommMemStats' suspendable bytes before the pause
  std::atomic<uint64_t> refused_calls{0};  // calls the guard turned away
  double pause_seconds = 0;     // what its pause took (its share of a shared step included)
  double teardown_seconds = 0;  // recreate: of that, ending the real communicator
  double resume_seconds = 0;
  // Its first collective since it was (re)initialised has not run yet (first_use.h).
  std::atomic<bool> awaiting_first_use{true};
  // What the last such first collective took, NCCL's connection included; -1 unknown.
  std::atomic<double> connect_seconds{-1.0};
  // A nonblocking communicator's first collective returned ncclInProgress: when it was
  // issued (steady clock, ns; 0: none in flight) and among how many it was issued
  // (one group), until ncclCommGetAsyncError first answers that it is done.
  std::atomic<int64_t> connect_since_ns{0};
  std::atomic<int> connect_shared_by{1};
  std::string error;  // why the communicator is broken, if it is
};

class Registry {
 public:
  static Registry& Get();

  // Creates and records a proxy for a real communicator just initialised.
  // `parent` (may be null) is the tracked communicator it was derived from;
  // `shares_parent` says whether it holds the parent's memory manager.
  ProxyComm* Add(ncclComm_t real, int rank, int nranks, int device, std::string key,
                 std::string owner, std::string created_by, const ncclConfig_t* config,
                 const ProxyComm* parent = nullptr, bool shares_parent = false);
  // The proxy behind `handle`, or null when the handle is not one of ours
  // (e.g. a communicator created before the interposer was loaded).
  ProxyComm* Find(ncclComm_t handle) const;
  void Remove(ProxyComm* proxy);
  std::vector<ProxyComm*> Sorted() const;  // by key, then rank, then id
  // Other live communicators holding `comm`'s memory manager (0: NCCL can suspend it).
  int ManagerSharers(const ProxyComm& comm) const;
  uint64_t NewManager() { return next_manager_++; }
  // Every tracked communicator as a JSON list (rows of communicators()), in key order.
  std::string SnapshotJson() const;
  // Only these, in the order given.
  std::string RowsJson(const std::vector<ProxyComm*>& comms) const;

  // Operations hold the lock shared; pause and resume hold it exclusively, so
  // the real communicator never changes under a running call.
  std::shared_mutex& lock() { return lock_; }

 private:
  std::string RowJson(const ProxyComm& comm) const;

  mutable std::mutex map_mutex_;
  std::unordered_map<ncclComm_t, ProxyComm*> by_handle_;
  std::shared_mutex lock_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<uint64_t> next_manager_{1};
};

// NCCL_COMM_SPLIT_SHARE_RESOURCES: the splitShare a config that leaves it unset gets.
bool SplitShareDefault();
// config->splitShare when the config sets it, else `inherited`.
bool SplitShareOf(const ncclConfig_t* config, bool inherited);

// Key helpers: deterministic across ranks.
std::string KeyFromUniqueIds(const ncclUniqueId* ids, int count, int nranks);

// Thread-local last error set by the interposer (returned by ncclGetLastError).
void SetLastError(std::string message);
const char* LastError();
void ClearLastError();

}  // namespace amem::nccl
