// Gives every rank of each communicator the unique id that its replacement
// will be initialised with, by broadcasting it from rank 0 over the old
// communicator before that one is destroyed. No side channel is needed, so it
// works the same for XLA's, PyTorch's and our own communicators, in one
// process or many.
#pragma once

#include <vector>

#include "common/status.h"
#include "nccl/comm_registry.h"

namespace amem::nccl {

// On success each proxy's next_id holds the same id on every rank. On timeout
// the message names the communicators whose broadcast did not finish (a rank
// that did not call pause) and `stuck` lists them.
Status ExchangeNextIds(const std::vector<ProxyComm*>& comms, double timeout_seconds,
                       std::vector<ProxyComm*>* stuck);

// Host memory instead of device memory for the broadcast buffers: only for
// the CPU tests, whose fake NCCL copies host memory (JAX_AMEM_NCCL_HOST_EXCHANGE=1).
bool HostExchange();

}  // namespace amem::nccl
