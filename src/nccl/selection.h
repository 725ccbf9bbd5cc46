// Which tracked communicators a pause or resume acts on, in key order.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "nccl/comm_registry.h"

namespace amem::nccl {

// `ids` empty: every communicator in state `wanted`. Otherwise exactly those, sorted
// by key whatever the order given; a duplicate, an unknown id or one in another state
// fails with a message naming it, and `out` is then not to be used.
Status Select(const std::vector<uint64_t>& ids, CommState wanted, std::vector<ProxyComm*>* out);

}  // namespace amem::nccl
