#include "nccl/comm_registry.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "nccl/json_text.h"

namespace amem::nccl {

const char* StateName(CommState state) {
  switch (state) {
    case CommState::kActive: return "active";
    case CommState::kPaused: return "paused";
    case CommState::kBroken: return "broken";
  }
  return "unknown";
}

const char* StrategyName(Strategy strategy) {
  switch (strategy) {
    case Strategy::kAuto: return "auto";
    case Strategy::kSuspend: return "suspend";
    case Strategy::kRecreate: return "recreate";
  }
  return "unknown";
}

Registry& Registry::Get() {
  static Registry* registry = new Registry();  // never destroyed: used until exit
  return *registry;
}

bool SplitShareDefault() {
  const char* value = std::getenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
  return value != nullptr && std::atoi(value) == 1;
}

bool SplitShareOf(const ncclConfig_t* config, bool inherited) {
  // NCCL_CONFIG_UNDEF_INT (INT_MIN) means "not set": NCCL then uses the default.
  constexpr size_t kNeeded = offsetof(ncclConfigHeader, splitShare) + sizeof(int);
  if (config == nullptr || config->size < kNeeded || config->splitShare == INT_MIN) return inherited;
  return config->splitShare == 1;
}

ProxyComm* Registry::Add(ncclComm_t real, int rank, int nranks, int device, std::string key,
                         std::string owner, std::string created_by, const ncclConfig_t* config,
                         const ProxyComm* parent, bool shares_parent) {
  auto* proxy = new ProxyComm();
  proxy->id = next_id_++;
  proxy->real = real;
  proxy->rank = rank;
  proxy->nranks = nranks;
  proxy->device = device;
  proxy->key = std::move(key);
  proxy->owner = std::move(owner);
  proxy->created_by = std::move(created_by);
  if (config != nullptr && config->size >= sizeof(ncclConfigHeader)) {
    const char* bytes = reinterpret_cast<const char*>(config);
    proxy->config.assign(bytes, bytes + config->size);
  } else if (config == nullptr && parent != nullptr) {
    proxy->config = parent->config;  // NCCL: a split without a config copies the parent's
  }
  // A child split without a config inherits the parent's splitShare.
  const bool inherited = (config == nullptr && parent != nullptr) ? parent->split_share
                                                                  : SplitShareDefault();
  proxy->split_share = SplitShareOf(config, inherited);
  proxy->parent_id = parent != nullptr ? parent->id : 0;
  proxy->manager = shares_parent && parent != nullptr ? parent->manager : NewManager();
  std::lock_guard<std::mutex> guard(map_mutex_);
  by_handle_[reinterpret_cast<ncclComm_t>(proxy)] = proxy;
  return proxy;
}

ProxyComm* Registry::Find(ncclComm_t handle) const {
  std::lock_guard<std::mutex> guard(map_mutex_);
  auto it = by_handle_.find(handle);
  return it == by_handle_.end() ? nullptr : it->second;
}

void Registry::Remove(ProxyComm* proxy) {
  {
    std::lock_guard<std::mutex> guard(map_mutex_);
    by_handle_.erase(reinterpret_cast<ncclComm_t>(proxy));
  }
  proxy->magic = 0;
  delete proxy;
}

std::vector<ProxyComm*> Registry::Sorted() const {
  std::vector<ProxyComm*> all;
  {
    std::lock_guard<std::mutex> guard(map_mutex_);
    for (const auto& entry : by_handle_) all.push_back(entry.second);
  }
  std::sort(all.begin(), all.end(), [](const ProxyComm* a, const ProxyComm* b) {
    if (a->key != b->key) return a->key < b->key;
    if (a->rank != b->rank) return a->rank < b->rank;
    return a->id < b->id;
  });
  return all;
}

int Registry::ManagerSharers(const ProxyComm& comm) const {
  std::lock_guard<std::mutex> guard(map_mutex_);
  int others = 0;
  for (const auto& entry : by_handle_) {
    const ProxyComm* other = entry.second;
    // A communicator paused by `recreate` or broken holds no NCCL resources.
    if (other != &comm && other->manager == comm.manager && other->real != nullptr) ++others;
  }
  return others;
}

std::string Registry::RowJson(const ProxyComm& p) const {
  std::ostringstream out;
  out << "{\"id\":" << p.id << ",\"key\":" << JsonString(p.key) << ",\"owner\":" << JsonString(p.owner)
      << ",\"created_by\":" << JsonString(p.created_by) << ",\"rank\":" << p.rank
      << ",\"nranks\":" << p.nranks << ",\"device\":" << p.device
      << ",\"state\":\"" << StateName(p.state) << "\",\"split_share\":"
      << (p.split_share ? "true" : "false") << ",\"parent_id\":" << p.parent_id
      << ",\"shares_memory_manager\":" << (ManagerSharers(p) > 0 ? "true" : "false")
      << ",\"registrations\":" << p.registrations << ",\"windows\":" << p.windows
      << ",\"device_comms\":" << p.device_comms << ",\"last_strategy\":" << JsonString(p.last_strategy)
      << ",\"why\":" << JsonString(p.strategy_why) << ",\"bytes_before_pause\":" << p.bytes_before_pause
      << ",\"bytes_freed\":" << p.bytes_freed << ",\"bytes_kept\":" << p.bytes_kept
      << ",\"suspendable_bytes\":" << p.suspendable_bytes
      << ",\"refused_calls\":" << p.refused_calls.load() << ",\"pause_seconds\":" << p.pause_seconds
      << ",\"teardown_seconds\":" << p.teardown_seconds
      << ",\"resume_seconds\":" << p.resume_seconds << ",\"connect_seconds\":" << p.connect_seconds.load()
      << ",\"error\":" << JsonString(p.error) << "}";
  return out.str();
}

std::string Registry::RowsJson(const std::vector<ProxyComm*>& comms) const {
  std::string out = "[";
  for (size_t i = 0; i < comms.size(); ++i) out += (i ? "," : "") + RowJson(*comms[i]);
  return out + "]";
}

std::string Registry::SnapshotJson() const { return RowsJson(Sorted()); }

std::string KeyFromUniqueIds(const ncclUniqueId* ids, int count, int nranks) {
  // FNV-1a over the id bytes: every rank received the same ids.
  uint64_t hash = 1469598103934665603ULL;
  for (int i = 0; i < count; ++i) {
    for (char c : ids[i].internal) {
      hash ^= static_cast<unsigned char>(c);
      hash *= 1099511628211ULL;
    }
  }
  char text[64];
  std::snprintf(text, sizeof(text), "%016llx.n%d", static_cast<unsigned long long>(hash), nranks);
  return text;
}

namespace {
thread_local std::string last_error;
}

void SetLastError(std::string message) { last_error = std::move(message); }
const char* LastError() { return last_error.empty() ? nullptr : last_error.c_str(); }
void ClearLastError() { last_error.clear(); }

}  // namespace amem::nccl
