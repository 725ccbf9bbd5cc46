// The NCCL functions this process's callers reach: the library a bare
// dlopen("libnccl.so.2") returns. With jax_amem imported that is the interposer
// (src/nccl), so communicators made here are tracked, owner "jax_amem", and
// jax_amem.nccl.pause()/resume() pause them like XLA's and PyTorch's.
#pragma once

#include <string>

#include "common/status.h"
#include "nccl/nccl_types.h"

namespace amem::transport {

// Same X-macro list as the interposer's table of real functions (reused, not
// repeated); here every pointer comes from the front library instead.
struct NcclFront {
#define AMEM_NCCL_FN(ret, name, params) ret(*name) params = nullptr;
#include "nccl/real_nccl_functions.inc"
#undef AMEM_NCCL_FN
  bool interposed = false;  // the front is jax_amem's interposer (communicators pausable)
};

// The loaded table; null (with `why`) when no libnccl.so.2 is loaded in the process
// or it lacks a function the transport needs. Looked up again until it succeeds:
// PyTorch or jax_amem may load NCCL after the first call.
const NcclFront* Front(std::string* why);

// "<what>: <NCCL's error string> (<ncclGetLastError>)"; Ok for ncclSuccess.
Status CheckNccl(const NcclFront& nccl, ncclResult_t result, ncclComm_t comm, const std::string& what);

}  // namespace amem::transport
