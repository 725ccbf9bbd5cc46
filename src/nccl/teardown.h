// Ending the real communicators of a `recreate` pause, and what each one's end freed.
#pragma once

#include <vector>

#include "common/status.h"
#include "nccl/comm_registry.h"

namespace amem::nccl {

// How `recreate` ends the real communicators.
enum class Teardown {
  kDestroy = 0,          // ncclCommDestroy, one after another (graceful)
  kAbort = 1,            // ncclCommAbort, one after another
  kParallelDestroy = 2,  // ncclCommDestroy, all at once on their own threads
};

// NCCL's count of each communicator's device memory, read before it is ended
// (-1 when the NCCL has no ncclCommMemStats).
void RecordBeforeTeardown(const std::vector<ProxyComm*>& comms);

// Ends every real communicator as `teardown` says and marks each paused (or broken,
// naming why, when NCCL fails to end it). `exchange_share`: each one's part of the
// id exchange before, added to its pause time. The slowest single end feeds `auto`'s
// cost model. Then the freed host memory goes back to the system (host_memory.h).
Status TearDown(const std::vector<ProxyComm*>& comms, Teardown teardown, double exchange_share);

// The communicator could not be ended or restored: no real communicator behind the
// proxy any more; every call on it fails with `why` until recover().
Status MarkBroken(ProxyComm* comm, const Status& why);

}  // namespace amem::nccl
