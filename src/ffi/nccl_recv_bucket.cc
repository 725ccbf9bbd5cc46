// jax_amem_nccl_recv_bucket (CUDA only): the swap's NCCL receiver for JAX destinations
// receives one staging bucket from a peer and unpacks it into destination buffers
// (transport/bucket_pipe.h, PipeRecv), on XLA's stream.
//
// Operands: (after: u8 scalar token of the previous bucket; segments: uint32[n, 12]
// copy::BufferSegment rows, src_index 0 = the bucket, split into pieces; destinations...).
// Results: (token: u8 scalar, then one per destination, aliased to it with
// input_output_aliases, so the donated destinations are written in place). The token orders
// buckets that share no destination: NCCL matches a peer's receives to its sends in issue order.
// Attributes: pipe, comm (the communicator handle as an integer), peer, slot, bytes, drain
// (nonzero on a peer's last bucket: XLA's stream then waits for all of the pipe's work).
#include <string>

#include "copy/copy_cuda.h"
#include "ffi/buffers.h"
#include "ffi/rows.h"
#include "ffi/target.h"
#include "transport/bucket_pipe.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

constexpr char kWhat[] = "nccl_recv_bucket";

ffi::Error NcclRecvBucketCuda(CUstream stream, ffi::Buffer<ffi::U8> after,
                              ffi::Buffer<ffi::U32> segments, ffi::RemainingArgs args,
                              ffi::Result<ffi::BufferR0<ffi::U8>> token, ffi::RemainingRets rets,
                              int64_t pipe, int64_t comm, int64_t peer, int64_t slot, int64_t bytes,
                              int64_t drain) {
  (void)after;  // orders this call after the previous bucket; never read
  (void)token;
  ManyBuffers buffers;  // no sources: every operand after the table is a destination
  if (ffi::Error decoded = DecodeManyBuffers(args, rets, 0, kWhat, &buffers); decoded.failure()) {
    return decoded;
  }
  if (static_cast<int64_t>(buffers.outputs.size()) > copy::kMaxBuffersPerSide) {
    return ffi::Error::InvalidArgument(std::string(kWhat) + ": more than " +
                                       std::to_string(copy::kMaxBuffersPerSide) +
                                       " destinations in one bucket");
  }
  copy::BufferPointers pointers{};
  for (size_t d = 0; d < buffers.outputs.size(); ++d) {
    // XLA gives an aliased custom-call result the operand's buffer (copying the operand
    // first when it is still needed elsewhere); anything else would lose the bytes this
    // bucket does not write, so it is refused rather than patched over.
    if (buffers.outputs[d].untyped_data() != buffers.inputs[d].untyped_data()) {
      return ffi::Error::Internal(std::string(kWhat) + ": destination " + std::to_string(d) +
                                  " is not aliased to its result (input_output_aliases missing)");
    }
    pointers.destinations[d] = static_cast<char*>(buffers.outputs[d].untyped_data());
  }
  // The table is in device memory, validated against the bucket and every destination when
  // the swap built it; the kernel skips rows out of range.
  const auto rows = RowsOf<copy::BufferSegment>(segments);
  Status received = transport::PipeRecv(
      pipe, stream, static_cast<int>(slot), pointers, rows.data, rows.count, bytes,
      static_cast<int>(peer), reinterpret_cast<ncclComm_t>(static_cast<uintptr_t>(comm)));
  if (!received.ok()) return ToFfiError(received);
  return drain ? ToFfiError(transport::PipeDrain(pipe, stream)) : ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER(kNcclRecvBucketCuda, NcclRecvBucketCuda,
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

}  // namespace

AMEM_FFI_HANDLERS(nccl_recv_bucket, nullptr, kNcclRecvBucketCuda)

}  // namespace amem::ffi_adapter
