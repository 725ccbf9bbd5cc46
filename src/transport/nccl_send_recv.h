// Point-to-point NCCL for the swap's cross-host transport: communicators
// between trainer and rollout ranks, and byte sends/receives on a stream.
// Every call goes through the front library (nccl_front.h), so with jax_amem
// imported the communicators are the interposer's proxies: pausable, and a
// call on a paused one fails with the interposer's message instead of hanging.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "cuda/driver_types.h"
#include "nccl/nccl_types.h"

namespace amem::transport {

// A new unique id (128 bytes) for rank 0 to publish.
Status NewUniqueId(std::string* id);

// Joins communicator `id` as `rank` of `nranks` on CUDA device `device` (its
// primary context, the one XLA and PyTorch use). Blocks until every rank joined.
Status InitCommunicator(const std::string& id, int nranks, int rank, int device, ncclComm_t* comm);

Status DestroyCommunicator(ncclComm_t comm);

// ncclCommGetAsyncError: Ok, or the asynchronous error NCCL recorded.
Status CommunicatorHealth(ncclComm_t comm);

// Enqueue `bytes` bytes (as ncclUint8) to/from `peer` on `stream`.
Status SendBytes(const void* data, int64_t bytes, int peer, ncclComm_t comm, CUstream stream);
Status RecvBytes(void* data, int64_t bytes, int peer, ncclComm_t comm, CUstream stream);

// True when the front NCCL is jax_amem's interposer.
bool FrontIsInterposer();

}  // namespace amem::transport
