// Exported NCCL functions that create, query and end communicators. Each new
// real communicator is handed to the caller behind a proxy (comm_registry.h).
#include <string>
#include <vector>

#include "cuda/driver_api.h"
#include "nccl/guard.h"
#include "nccl/keep_suspendable.h"

namespace amem::nccl {
namespace {

#define RETURN_ADDRESS __builtin_return_address(0)

int CurrentDevice(ncclComm_t real) {
  int device = -1;
  if (real != nullptr && Real().ncclCommCuDevice != nullptr &&
      Real().ncclCommCuDevice(real, &device) == ncclSuccess) {
    return device;
  }
  return -1;
}

// Rank and size from NCCL itself, for communicators made by split/shrink/grow.
void QueryShape(ncclComm_t real, int* rank, int* nranks) {
  if (Real().ncclCommUserRank != nullptr) Real().ncclCommUserRank(real, rank);
  if (Real().ncclCommCount != nullptr) Real().ncclCommCount(real, nranks);
}

ncclComm_t Wrap(ncclResult_t result, ncclComm_t real, int rank, int nranks, std::string key,
                const void* caller, const char* created_by, const ncclConfig_t* config,
                const ProxyComm* parent = nullptr, bool shares_parent = false) {
  if ((result != ncclSuccess && result != ncclInProgress) || real == nullptr) return real;
  if (nranks <= 0) QueryShape(real, &rank, &nranks);
  ProxyComm* proxy = Registry::Get().Add(real, rank, nranks, CurrentDevice(real), std::move(key),
                                         OwnerOf(caller), created_by, config, parent,
                                         shares_parent);
  return reinterpret_cast<ncclComm_t>(proxy);
}

// The parent of a split/shrink/grow, resolved and checked; null result = refused.
ProxyComm* ActiveParent(const char* function, ncclComm_t handle, ncclComm_t* real,
                        ncclResult_t* refused) {
  ProxyComm* parent = Registry::Get().Find(handle);
  *real = handle;
  if (parent == nullptr) return nullptr;
  if (parent->state != CommState::kActive) {
    *refused = Refuse(function, *parent);
    return nullptr;
  }
  *real = parent->real;
  return parent;
}

}  // namespace
}  // namespace amem::nccl

using namespace amem::nccl;

AMEM_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (Real().ncclCommInitRank == nullptr) return Unsupported("ncclCommInitRank");
  ncclComm_t real = nullptr;
  ncclResult_t result = Real().ncclCommInitRank(&real, nranks, id, rank);
  *comm = Wrap(result, real, rank, nranks, KeyFromUniqueIds(&id, 1, nranks), RETURN_ADDRESS,
               "ncclCommInitRank", nullptr);
  return result;
}

AMEM_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                                int rank, ncclConfig_t* config) {
  if (Real().ncclCommInitRankConfig == nullptr) return Unsupported("ncclCommInitRankConfig");
  std::vector<char> rewritten;
  config = WithoutSplitShare(config, &rewritten);
  ncclComm_t real = nullptr;
  ncclResult_t result = Real().ncclCommInitRankConfig(&real, nranks, id, rank, config);
  *comm = Wrap(result, real, rank, nranks, KeyFromUniqueIds(&id, 1, nranks), RETURN_ADDRESS,
               "ncclCommInitRankConfig", config);
  return result;
}

AMEM_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int n_ids,
                                                  ncclUniqueId* ids, ncclConfig_t* config) {
  if (Real().ncclCommInitRankScalable == nullptr) return Unsupported("ncclCommInitRankScalable");
  std::vector<char> rewritten;
  config = WithoutSplitShare(config, &rewritten);
  ncclComm_t real = nullptr;
  ncclResult_t result = Real().ncclCommInitRankScalable(&real, nranks, rank, n_ids, ids, config);
  *comm = Wrap(result, real, rank, nranks, KeyFromUniqueIds(ids, n_ids, nranks), RETURN_ADDRESS,
               "ncclCommInitRankScalable", config);
  return result;
}

AMEM_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (Real().ncclCommInitAll == nullptr) return Unsupported("ncclCommInitAll");
  ncclResult_t result = Real().ncclCommInitAll(comms, ndev, devlist);
  if (result != ncclSuccess) return result;
  // One process holds every rank: a process-local sequence number is a key
  // every rank shares.
  static std::atomic<int> sequence{0};
  const std::string key = "initall." + std::to_string(sequence++) + ".n" + std::to_string(ndev);
  for (int i = 0; i < ndev; ++i) {
    comms[i] = Wrap(result, comms[i], i, ndev, key, RETURN_ADDRESS, "ncclCommInitAll", nullptr);
  }
  return result;
}

namespace amem::nccl {
namespace {

// A communicator derived from a parent (split, shrink): the parent must be
// active; the child's key extends the parent's, so every rank derives the same.
// `name_child(n)` names the parent's n-th derived communicator. `shares(parent)`
// says whether NCCL gives the child the parent's resources (memory manager).
template <typename NameChild, typename Shares, typename Derive>
ncclResult_t DeriveChild(const char* function, ncclComm_t comm, NameChild name_child,
                         Shares shares, const void* caller, ncclConfig_t* config,
                         ncclComm_t* newcomm, Derive derive) {
  ncclComm_t real_parent = nullptr;
  ncclResult_t refused = ncclSuccess;
  ProxyComm* parent = ActiveParent(function, comm, &real_parent, &refused);
  if (refused != ncclSuccess) return refused;
  std::string child_key;
  if (parent != nullptr) {
    child_key = parent->key + "/" + name_child(parent->splits_made++);
  }
  std::vector<char> rewritten;
  config = WithoutSplitShare(config, &rewritten);
  ncclComm_t real_child = nullptr;
  ncclResult_t result = derive(real_parent, config, &real_child);
  *newcomm = parent == nullptr ? real_child
                               : Wrap(result, real_child, -1, -1, child_key, caller, function,
                                      config, parent, shares(*parent));
  return result;
}

}  // namespace
}  // namespace amem::nccl

AMEM_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                       ncclConfig_t* config) {
  if (Real().ncclCommSplit == nullptr) return Unsupported("ncclCommSplit");
  auto name = [&](int n) { return "split" + std::to_string(n) + ".c" + std::to_string(color); };
  // NCCL: the child shares when the parent's config.splitShare is set.
  auto shares = [](const ProxyComm& parent) { return parent.split_share; };
  return DeriveChild("ncclCommSplit", comm, name, shares, RETURN_ADDRESS, config, newcomm,
                     [&](ncclComm_t parent, ncclConfig_t* given, ncclComm_t* child) {
                       return Real().ncclCommSplit(parent, color, key, child, given);
                     });
}

AMEM_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* exclude, int exclude_count,
                                        ncclComm_t* newcomm, ncclConfig_t* config, int flags) {
  if (Real().ncclCommShrink == nullptr) return Unsupported("ncclCommShrink");
  auto name = [](int n) { return "shrink" + std::to_string(n); };
  // NCCL shares on shrink by the parent's config.shrinkShare, unless aborting. The
  // interposer does not read shrinkShare (its offset moved between versions), so a
  // shrunk child is taken to share: refusing suspend is safe, a wrong suspend is not.
  auto shares = [flags](const ProxyComm&) { return (flags & kNcclShrinkAbort) == 0; };
  return DeriveChild("ncclCommShrink", comm, name, shares, RETURN_ADDRESS, config, newcomm,
                     [&](ncclComm_t parent, ncclConfig_t* given, ncclComm_t* child) {
                       return Real().ncclCommShrink(parent, exclude, exclude_count, child, given,
                                                    flags);
                     });
}

AMEM_EXPORT ncclResult_t ncclCommGrow(ncclComm_t comm, int nranks, const ncclUniqueId* id, int rank,
                                      ncclComm_t* newcomm, ncclConfig_t* config) {
  if (Real().ncclCommGrow == nullptr) return Unsupported("ncclCommGrow");
  ncclComm_t real_parent = nullptr;
  ncclResult_t refused = ncclSuccess;
  ActiveParent("ncclCommGrow", comm, &real_parent, &refused);
  if (refused != ncclSuccess) return refused;
  ncclComm_t real_child = nullptr;
  ncclResult_t result = Real().ncclCommGrow(real_parent, nranks, id, rank, &real_child, config);
  *newcomm = Wrap(result, real_child, rank, nranks, KeyFromUniqueIds(id, 1, nranks),
                  RETURN_ADDRESS, "ncclCommGrow", config);
  return result;
}

// Ending a communicator: a paused one has no real communicator left to end.
namespace {
ncclResult_t End(const char* function, ncclResult_t (*real_end)(ncclComm_t), ncclComm_t comm) {
  if (real_end == nullptr) return Unsupported(function);
  ProxyComm* proxy = Registry::Get().Find(comm);
  if (proxy == nullptr) return real_end(comm);
  WaitWhileResuming(*proxy);
  ncclResult_t result = ncclSuccess;
  {
    std::unique_lock<std::shared_mutex> lock(Registry::Get().lock());
    if (proxy->real != nullptr) result = real_end(proxy->real);
  }
  if (result == ncclSuccess || result == ncclInProgress) Registry::Get().Remove(proxy);
  return result;
}
}  // namespace

AMEM_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return End("ncclCommDestroy", Real().ncclCommDestroy, comm);
}

AMEM_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return End("ncclCommAbort", Real().ncclCommAbort, comm);
}

AMEM_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (Real().ncclCommFinalize == nullptr) return Unsupported("ncclCommFinalize");
  ProxyComm* proxy = Registry::Get().Find(comm);
  if (proxy == nullptr) return Real().ncclCommFinalize(comm);
  std::shared_lock<std::shared_mutex> lock(Registry::Get().lock());
  // Paused (recreated or suspended) or broken: nothing in flight to flush, and a
  // suspended communicator must not be reached.
  if (proxy->state != CommState::kActive) return ncclSuccess;
  return Real().ncclCommFinalize(proxy->real);
}

// Queries answer from the proxy while paused, so XLA's health checks pass.
AMEM_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (Real().ncclCommGetAsyncError == nullptr) return Unsupported("ncclCommGetAsyncError");
  ProxyComm* proxy = Registry::Get().Find(comm);
  if (proxy == nullptr) return Real().ncclCommGetAsyncError(comm, error);
  std::shared_lock<std::shared_mutex> lock(Registry::Get().lock());
  if (proxy->state == CommState::kPaused) {
    *error = ncclSuccess;
    return ncclSuccess;
  }
  if (proxy->state == CommState::kBroken || proxy->real == nullptr) {
    *error = ncclInvalidUsage;
    return ncclSuccess;
  }
  const ncclResult_t result = Real().ncclCommGetAsyncError(proxy->real, error);
  if (result == ncclSuccess) ConnectAnswered(*proxy, *error);  // a nonblocking first collective
  return result;
}

namespace {
ncclResult_t QueryInt(const char* function, ncclResult_t (*real_query)(const ncclComm_t, int*),
                      ncclComm_t comm, int* value, int ProxyComm::*field) {
  if (real_query == nullptr) return Unsupported(function);
  ProxyComm* proxy = Registry::Get().Find(comm);
  if (proxy == nullptr) return real_query(comm, value);
  std::shared_lock<std::shared_mutex> lock(Registry::Get().lock());
  // Answered by the proxy unless active: NCCL refuses queries on a suspended
  // communicator with "invalid usage" (seen on the H200 through XLA).
  if (proxy->state != CommState::kActive) {
    *value = proxy->*field;
    return ncclSuccess;
  }
  return real_query(proxy->real, value);
}
}  // namespace

AMEM_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return QueryInt("ncclCommCount", Real().ncclCommCount, comm, count, &ProxyComm::nranks);
}

AMEM_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return QueryInt("ncclCommCuDevice", Real().ncclCommCuDevice, comm, device, &ProxyComm::device);
}

AMEM_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return QueryInt("ncclCommUserRank", Real().ncclCommUserRank, comm, rank, &ProxyComm::rank);
}

AMEM_EXPORT const char* ncclGetLastError(ncclComm_t comm) {
  if (const char* ours = LastError()) return ours;
  if (Real().ncclGetLastError == nullptr) return "";
  ProxyComm* proxy = Registry::Get().Find(comm);
  if (proxy == nullptr) return Real().ncclGetLastError(comm);
  std::shared_lock<std::shared_mutex> lock(Registry::Get().lock());
  if (proxy->state != CommState::kActive) return "";
  return Real().ncclGetLastError(proxy->real);
}
