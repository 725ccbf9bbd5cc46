// What the two NCCL bucket targets (nccl_send_bucket.cc, nccl_recv_bucket.cc) share: the
// attributes naming the transfer, and the end of a call. Each handler decodes its own buffers
// (the sender's sources, the receiver's aliased destinations) and calls transport/bucket_pipe.h.
#pragma once

#include <cstdint>
#include <utility>

#include "ffi/status_adapter.h"
#include "transport/bucket_pipe.h"
#include "xla/ffi/api/ffi.h"

namespace amem::ffi_adapter {

// The transfer of one bucket: the pipe (transport/bucket_pipe.h), the communicator (its handle
// as an integer), the peer, the pipe's staging slot, the bucket's bytes, and whether it is the
// peer's last bucket (drain: XLA's stream then waits until the pipe's work is done, so the
// call's completion means the data left or landed).
struct Bucket {
  int64_t pipe, comm, peer, slot, bytes, drain;

  ncclComm_t Comm() const { return reinterpret_cast<ncclComm_t>(static_cast<uintptr_t>(comm)); }

  // The call's error: the transfer's, else the drain's.
  xla::ffi::Error Finish(const Status& transfer, CUstream stream) const {
    if (!transfer.ok()) return ToFfiError(transfer);
    return drain ? ToFfiError(transport::PipeDrain(pipe, stream)) : xla::ffi::Error::Success();
  }
};

// The attributes of Bucket, in its order, after what a handler binds before them.
template <typename Binding>
auto BucketAttrs(Binding binding) {
  return std::move(binding)
      .template Attr<int64_t>("pipe")
      .template Attr<int64_t>("comm")
      .template Attr<int64_t>("peer")
      .template Attr<int64_t>("slot")
      .template Attr<int64_t>("bytes")
      .template Attr<int64_t>("drain");
}

}  // namespace amem::ffi_adapter
