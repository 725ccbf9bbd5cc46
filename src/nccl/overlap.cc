#include "nccl/overlap.h"

#include <cstdlib>
#include <cstring>

namespace amem::nccl {

Overlap OverlapMode() {
  const char* value = std::getenv("JAX_AMEM_NCCL_OVERLAP");
  if (value != nullptr && std::strcmp(value, "serial") == 0) return Overlap::kSerial;
  if (value != nullptr && std::strcmp(value, "group") == 0) return Overlap::kGroup;
  return Overlap::kThreads;
}

bool GroupedSuspendSupported() { return Real().version >= 23003; }

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

}  // namespace amem::nccl
