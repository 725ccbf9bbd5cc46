#include "nccl/keep_suspendable.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "nccl/comm_registry.h"

namespace amem::nccl {
namespace {

std::atomic<int> forced{-1};  // -1: follow the environment
std::atomic<uint64_t> rewrites{0};

}  // namespace

bool KeepSuspendable() {
  const int value = forced.load(std::memory_order_acquire);
  if (value >= 0) return value == 1;
  const char* text = std::getenv("JAX_AMEM_NCCL_KEEP_SUSPENDABLE");
  return text != nullptr && std::strcmp(text, "1") == 0;
}

void SetKeepSuspendable(bool on) { forced.store(on ? 1 : 0, std::memory_order_release); }

uint64_t KeepSuspendableRewrites() { return rewrites.load(); }

ncclConfig_t* WithoutSplitShare(ncclConfig_t* config, std::vector<char>* storage) {
  if (!KeepSuspendable() || !SplitShareOf(config, false)) return config;
  const char* bytes = reinterpret_cast<const char*>(config);
  storage->assign(bytes, bytes + config->size);
  auto* copy = reinterpret_cast<ncclConfig_t*>(storage->data());
  copy->splitShare = 0;
  ++rewrites;
  return copy;
}

}  // namespace amem::nccl
