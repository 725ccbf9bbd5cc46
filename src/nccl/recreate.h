// The `recreate` strategy: end the real communicator at pause, initialise a new one
// behind the same proxy at resume (any NCCL; frees all of the communicator's memory).
#pragma once

#include <vector>

#include "common/status.h"
#include "nccl/comm_registry.h"
#include "nccl/teardown.h"

namespace amem::nccl {

// Makes sure every rank knows the replacement's unique id (agreed ids are in next_id
// already; the others are broadcast over the old communicator), then ends the real
// communicators. Peers that never join the broadcast leave their communicators broken.
Status Recreate(const std::vector<ProxyComm*>& comms, Teardown teardown, double timeout_seconds);

// Initialises every communicator again with its next_id, in one NCCL group, behind
// the same proxy; each then has a memory manager of its own. The time per
// communicator feeds `auto`'s cost model.
Status Reinitialise(const std::vector<ProxyComm*>& comms, double timeout_seconds);

}  // namespace amem::nccl
