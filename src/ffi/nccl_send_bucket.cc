// jax_amem_nccl_send_bucket (CUDA only: NCCL has no CPU path): the swap's NCCL sender gathers
// one staging bucket from source views and ncclSend's it to a peer (transport/bucket_pipe.h).
//
// Operands: (after: u8 scalar token of the previous bucket, which orders the calls; segments:
// uint32[n, 12] copy::BufferSegment rows, dst_index 0 = the bucket, split into pieces;
// affine_rows: uint32[m * 12] copy::AffineRow rows gathered through constant steps, and
// affine_table: their programs (`programs` of them) and constants (copy/affine.h);
// sources...). Attributes: pipe, comm (the communicator handle as an integer), peer, slot,
// bytes, drain (nonzero on a peer's last bucket: XLA's stream then waits until the pipe's sends
// are done, so the call's completion means the data left). Result: a u8 scalar token.
#include <string>

#include "copy/affine.h"
#include "copy/copy_cuda.h"
#include "ffi/rows.h"
#include "ffi/target.h"
#include "transport/bucket_pipe.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

ffi::Error NcclSendBucketCuda(CUstream stream, ffi::Buffer<ffi::U8> after,
                              ffi::Buffer<ffi::U32> segments, ffi::Buffer<ffi::U32> affine_rows,
                              ffi::Buffer<ffi::U32> affine_table, ffi::RemainingArgs args, int64_t pipe,
                              int64_t comm, int64_t peer, int64_t slot, int64_t bytes, int64_t drain,
                              int64_t programs, ffi::Result<ffi::BufferR0<ffi::U8>> token) {
  (void)after;  // orders this call after the previous bucket; never read
  (void)token;
  if (static_cast<int64_t>(args.size()) > copy::kMaxBuffersPerSide) {
    return ffi::Error::InvalidArgument("nccl_send_bucket: more than " +
                                       std::to_string(copy::kMaxBuffersPerSide) +
                                       " source views in one bucket");
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
  transport::AffineGather gather{affine.data, affine.count,
                                 copy::AffineTableAt(affine_table.untyped_data(),
                                                     static_cast<int64_t>(affine_table.size_bytes()), programs)};
  Status sent = transport::PipeSend(pipe, stream, static_cast<int>(slot), pointers, rows.data,
                                    rows.count, bytes, static_cast<int>(peer),
                                    reinterpret_cast<ncclComm_t>(static_cast<uintptr_t>(comm)), gather);
  if (!sent.ok()) return ToFfiError(sent);
  return drain ? ToFfiError(transport::PipeDrain(pipe, stream)) : ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER(kNcclSendBucketCuda, NcclSendBucketCuda,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<CUstream>>()
                           .Arg<ffi::Buffer<ffi::U8>>()
                           .Arg<ffi::Buffer<ffi::U32>>()
                           .Arg<ffi::Buffer<ffi::U32>>()
                           .Arg<ffi::Buffer<ffi::U32>>()
                           .RemainingArgs()
                           .Attr<int64_t>("pipe")
                           .Attr<int64_t>("comm")
                           .Attr<int64_t>("peer")
                           .Attr<int64_t>("slot")
                           .Attr<int64_t>("bytes")
                           .Attr<int64_t>("drain")
                           .Attr<int64_t>("programs")
                           .Ret<ffi::BufferR0<ffi::U8>>());

}  // namespace

AMEM_FFI_HANDLERS(nccl_send_bucket, nullptr, kNcclSendBucketCuda)

}  // namespace amem::ffi_adapter
