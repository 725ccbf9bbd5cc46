#include "nccl/host_memory.h"

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "nccl/clock.h"

namespace amem::nccl {

double ReturnFreeHostMemory() {
  const char* value = std::getenv("JAX_AMEM_NCCL_TRIM");
  if (value != nullptr && std::strcmp(value, "0") == 0) return 0;
#if defined(__GLIBC__)
  const auto start = Clock::now();
  malloc_trim(0);
  return Since(start);
#else
  return 0;
#endif
}

}  // namespace amem::nccl
