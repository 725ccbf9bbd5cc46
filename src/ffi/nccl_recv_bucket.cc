// jax_amem_nccl_recv_bucket (CUDA only): the swap's NCCL receiver for JAX destinations
// receives one staging bucket from a peer and unpacks it into destination buffers
// (transport/bucket_pipe.h, PipeRecv), on XLA's stream.
//
// Operands: (after: u8 scalar token of the previous bucket; segments: uint32[n, 12]
// copy::BufferSegment rows, src_index 0 = the bucket, split into pieces; destinations...).
// Results: (token: u8 scalar, then one per destination, aliased to it with
// input_output_aliases, so the donated destinations are written in place). The token orders
// buckets that share no destination: NCCL matches a peer's receives to its sends in issue order.
// Attributes: the bucket's (bucket.h: pipe, comm, peer, slot, bytes, drain).
#include <string>

#include "copy/copy_cuda.h"
#include "ffi/bucket.h"
#include "ffi/buffers.h"
#include "ffi/rows.h"
#include "ffi/target.h"

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
  const Bucket bucket{pipe, comm, peer, slot, bytes, drain};
  ManyBuffers buffers;  // no sources: every operand after the table is a destination
  if (ffi::Error decoded = DecodeManyBuffers(args, rets, 0, kWhat, &buffers); decoded.failure()) {
    return decoded;
  }
  if (ffi::Error many = AtMostKernelBuffers(buffers.outputs.size(), kWhat, "destinations in one bucket");
      many.failure()) {
    return many;
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
  return bucket.Finish(transport::PipeRecv(bucket.pipe, stream, static_cast<int>(bucket.slot), pointers, rows.data,
                                           rows.count, bucket.bytes, static_cast<int>(bucket.peer), bucket.Comm()),
                       stream);
}

XLA_FFI_DEFINE_HANDLER(kNcclRecvBucketCuda, NcclRecvBucketCuda,
                       BucketAttrs(ffi::Ffi::Bind()
                                       .Ctx<ffi::PlatformStream<CUstream>>()
                                       .Arg<ffi::Buffer<ffi::U8>>()
                                       .Arg<ffi::Buffer<ffi::U32>>()
                                       .RemainingArgs()
                                       .Ret<ffi::BufferR0<ffi::U8>>()
                                       .RemainingRets()));

}  // namespace

AMEM_FFI_HANDLERS(nccl_recv_bucket, nullptr, kNcclRecvBucketCuda)

}  // namespace amem::ffi_adapter
