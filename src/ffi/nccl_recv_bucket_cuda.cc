#include "ffi/nccl_recv_bucket.h"

#include <string>

#include "copy/segments.h"
#include "ffi/buffer_rows.h"
#include "ffi/segment_copy_many.h"
#include "ffi/status_adapter.h"
#include "transport/bucket_pipe.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

ffi::Error NcclRecvBucketCuda(CUstream stream, ffi::Buffer<ffi::U8> after,
                              ffi::Buffer<ffi::U32> segments, ffi::RemainingArgs args,
                              ffi::Result<ffi::BufferR0<ffi::U8>> token, ffi::RemainingRets rets,
                              int64_t pipe, int64_t comm, int64_t peer, int64_t slot, int64_t bytes,
                              int64_t drain) {
  (void)after;  // orders this call after the previous bucket; never read
  (void)token;
  ManyBuffers buffers;  // no sources: every operand after the table is a destination
  if (ffi::Error decoded = DecodeManyBuffers(args, rets, 0, &buffers); decoded.failure()) {
    return decoded;
  }
  if (static_cast<int64_t>(buffers.outputs.size()) > copy::kMaxBuffersPerSide) {
    return ffi::Error::InvalidArgument("jax_amem_nccl_recv_bucket: more than " +
                                       std::to_string(copy::kMaxBuffersPerSide) +
                                       " destinations in one bucket");
  }
  copy::BufferPointers pointers{};
  for (size_t d = 0; d < buffers.outputs.size(); ++d) {
    // XLA gives an aliased custom-call result the operand's buffer (copying the operand
    // first when it is still needed elsewhere); anything else would lose the bytes this
    // bucket does not write, so it is refused rather than patched over.
    if (buffers.outputs[d].untyped_data() != buffers.inputs[d].untyped_data()) {
      return ffi::Error::Internal("jax_amem_nccl_recv_bucket: destination " + std::to_string(d) +
                                  " is not aliased to its result (input_output_aliases missing)");
    }
    pointers.destinations[d] = static_cast<char*>(buffers.outputs[d].untyped_data());
  }
  // The table was validated against the bucket and every destination when it was
  // built (jax_amem.swap.nccl_receiver.bucket_table); the kernel skips rows out of range.
  const BufferRows rows = RowsOf(segments);
  Status received = transport::PipeRecv(
      pipe, stream, static_cast<int>(slot), pointers, rows.data, rows.count, bytes,
      static_cast<int>(peer),
      reinterpret_cast<ncclComm_t>(static_cast<uintptr_t>(comm)));
  if (!received.ok()) return ToFfiError(received);
  return drain ? ToFfiError(transport::PipeDrain(pipe, stream)) : ffi::Error::Success();
}

}  // namespace
}  // namespace amem::ffi_adapter

XLA_FFI_DEFINE_HANDLER_SYMBOL(AmemNcclRecvBucketCuda, amem::ffi_adapter::NcclRecvBucketCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<CUstream>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .RemainingArgs()
                                  .Ret<ffi::BufferR0<ffi::U8>>()
                                  .RemainingRets()
                                  .Attr<int64_t>("pipe")
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("peer")
                                  .Attr<int64_t>("slot")
                                  .Attr<int64_t>("bytes")
                                  .Attr<int64_t>("drain"));
