#include "nccl/guard.h"

#include <dlfcn.h>

#include <chrono>
#include <thread>

namespace amem::nccl {

ncclResult_t Unsupported(const char* function) {
  SetLastError(std::string(function) + " is not provided by the loaded NCCL (version " +
               std::to_string(Real().version) + ")");
  return ncclInvalidUsage;
}

ncclResult_t Refuse(const char* function, const ProxyComm& proxy) {
  const_cast<ProxyComm&>(proxy).refused_calls.fetch_add(1, std::memory_order_relaxed);
  if (proxy.state == CommState::kBroken) {
    SetLastError(std::string(function) + " on NCCL communicator " + proxy.key +
                 " which jax-amem could not restore: " + proxy.error +
                 ". Call jax_amem.nccl.recover() on every process of the job to initialise "
                 "it again behind the same handle (or restart the job).");
  } else {
    SetLastError(std::string(function) + " on NCCL communicator " + proxy.key +
                 " while it is paused by jax-amem: call jax_amem.nccl.resume() (or "
                 "jax_amem.resume()) before running collectives.");
  }
  return ncclInvalidUsage;
}

void WaitWhileResuming(const ProxyComm& proxy) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
  while (proxy.resuming.load(std::memory_order_acquire) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

std::string OwnerOf(const void* return_address) {
  Dl_info info{};
  if (return_address == nullptr || dladdr(return_address, &info) == 0 || info.dli_fname == nullptr) {
    return "other";
  }
  // Judged by the part of the path after site-packages/: the folders above it are the
  // environment's (a venv under /opt/torch/ would tag every library "torch"). Our own
  // communicators (the swap's NCCL link) are checked first.
  std::string file = info.dli_fname;
  const std::string packages = "site-packages/";
  if (const size_t at = file.rfind(packages); at != std::string::npos) {
    file = file.substr(at + packages.size());
  }
  if (file.find("jax_amem") != std::string::npos) return "jax_amem";
  if (file.find("xla") != std::string::npos || file.find("jaxlib") != std::string::npos ||
      file.find("jax_cuda") != std::string::npos || file.find("pjrt") != std::string::npos) {
    return "xla";
  }
  if (file.find("torch") != std::string::npos) return "torch";
  return "other";
}

}  // namespace amem::nccl
