// Pointers to the real NCCL's functions, found with dlsym(RTLD_NEXT, ...): the
// interposer's own dependency (libnccl_real.so.2, a link to the real library)
// is next in its lookup scope, whether it was dlopen'ed or LD_PRELOAD'ed.
#pragma once

#include "nccl/nccl_types.h"

namespace amem::nccl {

struct RealNccl {
#define AMEM_NCCL_FN(ret, name, params) ret(*name) params = nullptr;
#include "nccl/real_nccl_functions.inc"
#undef AMEM_NCCL_FN
  void* library = nullptr;  // handle of the real library, for optional lookups
  int version = 0;          // ncclGetVersion(), e.g. 22809
};

// Loaded once; members are null where the real library lacks the function.
const RealNccl& Real();

}  // namespace amem::nccl
