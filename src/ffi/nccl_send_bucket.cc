// jax_amem_nccl_send_bucket (CUDA only: NCCL has no CPU path): the swap's NCCL sender gathers
// one staging bucket from source views and ncclSend's it to a peer (transport/bucket_pipe.h).
//
// Operands: (after: u8 scalar token of the previous bucket, which orders the calls; segments:
// uint32[n, 12] copy::BufferSegment rows, dst_index 0 = the bucket, split into pieces;
// affine_rows: uint32[m * 12] copy::AffineRow rows gathered through constant steps, and
// affine_table: their programs (`programs` of them) and constants (copy/affine.h);
// sources...). Attributes: the bucket's (bucket.h: pipe, comm, peer, slot, bytes, drain), then
// programs. Result: a u8 scalar token.
#include <string>

#include "copy/affine.h"
#include "copy/copy_cuda.h"
#include "ffi/bucket.h"
#include "ffi/buffers.h"
#include "ffi/rows.h"
#include "ffi/target.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

constexpr char kWhat[] = "nccl_send_bucket";

ffi::Error NcclSendBucketCuda(CUstream stream, ffi::Buffer<ffi::U8> after,
                              ffi::Buffer<ffi::U32> segments, ffi::Buffer<ffi::U32> affine_rows,
                              ffi::Buffer<ffi::U32> affine_table, ffi::RemainingArgs args, int64_t pipe,
                              int64_t comm, int64_t peer, int64_t slot, int64_t bytes, int64_t drain,
                              int64_t programs, ffi::Result<ffi::BufferR0<ffi::U8>> token) {
  (void)after;  // orders this call after the previous bucket; never read
  (void)token;
  const Bucket bucket{pipe, comm, peer, slot, bytes, drain};
  if (ffi::Error many = AtMostKernelBuffers(args.size(), kWhat, "source views in one bucket"); many.failure()) {
    return many;
  }
  copy::BufferPointers pointers{};
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    pointers.sources[i] = static_cast<const char*>(buffer->untyped_data());
  }
  // The table is in device memory, validated against every view and the bucket when the
  // swap packed the bucket; the kernel skips rows out of range.
  const auto rows = RowsOf<copy::BufferSegment>(segments);
  const auto affine = RowsOf<copy::AffineRow>(affine_rows);
  const transport::AffineGather gather{affine.data, affine.count, AffineTableOf(affine_table, programs)};
  return bucket.Finish(transport::PipeSend(bucket.pipe, stream, static_cast<int>(bucket.slot), pointers, rows.data,
                                           rows.count, bucket.bytes, static_cast<int>(bucket.peer), bucket.Comm(),
                                           gather),
                       stream);
}

XLA_FFI_DEFINE_HANDLER(kNcclSendBucketCuda, NcclSendBucketCuda,
                       BucketAttrs(ffi::Ffi::Bind()
                                       .Ctx<ffi::PlatformStream<CUstream>>()
                                       .Arg<ffi::Buffer<ffi::U8>>()
                                       .Arg<ffi::Buffer<ffi::U32>>()
                                       .Arg<ffi::Buffer<ffi::U32>>()
                                       .Arg<ffi::Buffer<ffi::U32>>()
                                       .RemainingArgs())
                           .Attr<int64_t>("programs")
                           .Ret<ffi::BufferR0<ffi::U8>>());

}  // namespace

AMEM_FFI_HANDLERS(nccl_send_bucket, nullptr, kNcclSendBucketCuda)

}  // namespace amem::ffi_adapter
