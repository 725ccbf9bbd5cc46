// Two staging buckets between this rank and one peer, pipelined on the GPU.
//
// Sender: each bucket is gathered (segment rows from the source views, one
// LaunchBufferSegmentCopy) into a staging slot on the caller's stream (XLA's),
// then ncclSend'ed on the pipe's own stream, so gathering bucket k+1 overlaps
// sending bucket k. Receiver: ncclRecv into a slot on the pipe's stream, then
// the caller's stream (PyTorch's) unpacks it into the destination tensors,
// overlapping the receive of bucket k+1. Bucket k reuses slot k % 2 only after
// bucket k-2's send (unpack) finished: events, never a host wait.
//
// The pipe owns its two slots (2 x bucket_bytes of device memory, allocated
// outside XLA's and PyTorch's pools): that is the transport's staging.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "copy/affine.h"
#include "copy/copy_cuda.h"
#include "copy/segments.h"
#include "cuda/driver_types.h"
#include "nccl/nccl_types.h"

namespace amem::transport {

constexpr int kSlots = 2;

// A pipe on CUDA device `device` with slots of `bucket_bytes`; `*id` names it.
Status CreatePipe(int device, int64_t bucket_bytes, int64_t* id);
Status DestroyPipe(int64_t id);
// Device memory the pipe holds (kSlots x bucket_bytes), or -1 for an unknown id.
int64_t PipeStagingBytes(int64_t id);
int PipeDevice(int64_t id);

// Rows of a bucket whose elements go through constant steps as they are gathered (copy/affine.h;
// dst_index 0 = the slot), in device memory; none by default.
struct AffineGather {
  const copy::AffineRow* rows = nullptr;
  int64_t count = 0;
  copy::AffineTable table{};
};

// Gathers `count` rows (dst_index 0 = the slot) from `sources` into slot `slot` on
// `stream`, and the affine rows too, then sends the slot's first `bytes` bytes to `peer`.
Status PipeSend(int64_t id, CUstream stream, int slot, const copy::BufferPointers& sources,
                const copy::BufferSegment* device_rows, int64_t count, int64_t bytes, int peer,
                ncclComm_t comm, const AffineGather& affine = {});

// Receives `bytes` bytes from `peer` into slot `slot`, then unpacks `count` rows
// (src_index 0 = the slot) into `destinations` on `stream`.
Status PipeRecv(int64_t id, CUstream stream, int slot, const copy::BufferPointers& destinations,
                const copy::BufferSegment* device_rows, int64_t count, int64_t bytes, int peer,
                ncclComm_t comm);

// `stream` waits until every send/receive and unpack of the pipe issued so far is done.
Status PipeDrain(int64_t id, CUstream stream);

}  // namespace amem::transport
