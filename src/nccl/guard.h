// How an intercepted call reaches the real communicator: translate the proxy,
// refuse while paused (an NCCL error, never a GPU fault), wait while resuming.
#pragma once

#include <string>

#include "nccl/comm_registry.h"
#include "nccl/first_use.h"
#include "nccl/real_nccl.h"

#define AMEM_EXPORT extern "C" __attribute__((visibility("default")))

namespace amem::nccl {

// Error for a function the loaded NCCL does not provide.
ncclResult_t Unsupported(const char* function);

// Error for a call on a paused or broken communicator (counted on the proxy).
ncclResult_t Refuse(const char* function, const ProxyComm& proxy);

// Blocks while `proxy` is being resumed asynchronously (bounded), so a program
// that runs right after resume(async_=True) waits instead of failing.
void WaitWhileResuming(const ProxyComm& proxy);

// `collective`: a call that moves data between ranks, whose first run after an
// initialisation is where NCCL connects (timed: first_use.h).
template <typename Call>
ncclResult_t Guarded(const char* function, bool available, ncclComm_t handle, Call&& call,
                     bool collective = false) {
  if (!available) return Unsupported(function);
  ProxyComm* proxy = Registry::Get().Find(handle);
  if (proxy == nullptr) return call(handle);  // not ours: untouched
  WaitWhileResuming(*proxy);
  std::shared_lock<std::shared_mutex> lock(Registry::Get().lock());
  if (proxy->state != CommState::kActive) return Refuse(function, *proxy);
  ClearLastError();
  if (collective) return TimeFirstUse(handle, *proxy, [&] { return call(proxy->real); });
  return call(proxy->real);
}

// Who called an init function: the library holding `return_address`.
std::string OwnerOf(const void* return_address);

}  // namespace amem::nccl
