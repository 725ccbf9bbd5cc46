// ncclResult_t -> amem::Status, with the real NCCL's error string.
#pragma once

#include <string>

#include "common/status.h"
#include "nccl/real_nccl.h"

namespace amem::nccl {

// ncclInProgress counts as success: nonblocking communicators finish later
// and the callers wait for them explicitly.
inline Status NcclCheck(ncclResult_t result, const std::string& what) {
  if (result == ncclSuccess || result == ncclInProgress) return Status::Ok();
  const char* text = Real().ncclGetErrorString ? Real().ncclGetErrorString(result) : "";
  return Status::Error(what + " failed: " + text);
}

}  // namespace amem::nccl
