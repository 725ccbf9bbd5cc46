#include "nccl/real_nccl.h"

#include <dlfcn.h>

#include <mutex>

namespace amem::nccl {
namespace {

RealNccl Load() {
  RealNccl real;
#define AMEM_NCCL_FN(ret, name, params) \
  real.name = reinterpret_cast<ret(*) params>(dlsym(RTLD_NEXT, #name));
#include "nccl/real_nccl_functions.inc"
#undef AMEM_NCCL_FN
  if (real.ncclGetVersion != nullptr) real.ncclGetVersion(&real.version);
  return real;
}

}  // namespace

const RealNccl& Real() {
  static RealNccl* real = nullptr;
  static std::once_flag once;
  std::call_once(once, [] { real = new RealNccl(Load()); });
  return *real;
}

}  // namespace amem::nccl
