#include "ffi/nccl_send_bucket.h"

#include <string>

#include "copy/segments.h"
#include "ffi/buffer_rows.h"
#include "ffi/status_adapter.h"
#include "transport/bucket_pipe.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

ffi::Error NcclSendBucketCuda(CUstream stream, ffi::Buffer<ffi::U8> after,
                              ffi::Buffer<ffi::U32> segments, ffi::RemainingArgs args, int64_t pipe,
                              int64_t comm, int64_t peer, int64_t slot, int64_t bytes, int64_t drain,
                              ffi::Result<ffi::BufferR0<ffi::U8>> token) {
  (void)after;  // orders this call after the previous bucket; never read
  (void)token;
  if (static_cast<int64_t>(args.size()) > copy::kMaxBuffersPerSide) {
    return ffi::Error::InvalidArgument("jax_amem_nccl_send_bucket: more than " +
                                       std::to_string(copy::kMaxBuffersPerSide) +
                                       " source views in one bucket");
  }
  copy::BufferPointers pointers{};
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    pointers.sources[i] = static_cast<const char*>(buffer->untyped_data());
  }
  // The table was validated against every view and the bucket when it was built
  // (jax_amem.swap.nccl_packing); the kernel skips rows out of range.
  const BufferRows rows = RowsOf(segments);
  Status sent = transport::PipeSend(
      pipe, stream, static_cast<int>(slot), pointers, rows.data, rows.count, bytes,
      static_cast<int>(peer),
      reinterpret_cast<ncclComm_t>(static_cast<uintptr_t>(comm)));
  if (!sent.ok()) return ToFfiError(sent);
  return drain ? ToFfiError(transport::PipeDrain(pipe, stream)) : ffi::Error::Success();
}

}  // namespace
}  // namespace amem::ffi_adapter

XLA_FFI_DEFINE_HANDLER_SYMBOL(AmemNcclSendBucketCuda, amem::ffi_adapter::NcclSendBucketCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<CUstream>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .RemainingArgs()
                                  .Attr<int64_t>("pipe")
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("peer")
                                  .Attr<int64_t>("slot")
                                  .Attr<int64_t>("bytes")
                                  .Attr<int64_t>("drain")
                                  .Ret<ffi::BufferR0<ffi::U8>>());
