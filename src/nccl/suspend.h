// The `suspend` strategy: NCCL's own ncclCommSuspend / ncclCommResume (NCCL >= 2.29.7),
// the real communicator kept behind the proxy.
#pragma once

#include <vector>

#include "common/status.h"
#include "nccl/comm_registry.h"

namespace amem::nccl {

// Suspends every communicator (overlapped as JAX_AMEM_NCCL_OVERLAP says) and records,
// per communicator, NCCL's count of what was released and what stayed; the time per
// suspendable byte feeds `auto`'s cost model.
Status Suspend(const std::vector<ProxyComm*>& comms);

// Resumes them; the time per byte feeds the cost model.
Status ResumeSuspended(const std::vector<ProxyComm*>& comms);

}  // namespace amem::nccl
