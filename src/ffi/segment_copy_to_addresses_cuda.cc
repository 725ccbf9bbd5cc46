#include "copy/copy_cuda.h"
#include "cuda/driver_api.h"
#include "ffi/buffer_rows.h"
#include "ffi/segment_copy_to_addresses.h"
#include "ffi/status_adapter.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

// Bulk rows: one cuMemcpyAsync each (the driver's device copy runs at the copy ceiling);
// the table's rows: one kernel launch with every pointer passed by value. Both on XLA's
// stream, so the copy is ordered after whatever produced the sources.
ffi::Error SegmentCopyToAddressesCuda(CUstream stream, ffi::Buffer<ffi::U32> segments,
                                      ffi::RemainingArgs args, ffi::Span<const int64_t> addresses,
                                      ffi::Span<const int64_t> destination_bytes,
                                      ffi::Span<const int64_t> bulk,
                                      ffi::Result<ffi::BufferR0<ffi::U8>> token) {
  AddressCopy call;
  if (ffi::Error decoded = DecodeAddressCopy(args, addresses, destination_bytes, bulk, &call);
      decoded.failure()) {
    return decoded;
  }
  const BufferRows long_rows = RowsOf(bulk);
  if (long_rows.count > 0) {
    const cuda::DriverApi* api = cuda::Driver();
    if (api == nullptr) return ffi::Error::Internal("CUDA driver not loaded");
    for (int64_t i = 0; i < long_rows.count; ++i) {
      const copy::BufferSegment& row = long_rows.data[i];
      Status copied = cuda::Check(
          api->cuMemcpyAsync(
              reinterpret_cast<CUdeviceptr>(call.destinations[row.dst_index] + row.dst_offset),
              reinterpret_cast<CUdeviceptr>(call.sources[row.src_index] + row.src_offset),
              static_cast<size_t>(row.bytes), stream),
          "bulk copy to a destination address");
      if (!copied.ok()) return ToFfiError(copied);
    }
  }
  copy::BufferPointers pointers{};
  for (size_t s = 0; s < call.sources.size(); ++s) pointers.sources[s] = call.sources[s];
  for (size_t d = 0; d < call.destinations.size(); ++d) pointers.destinations[d] = call.destinations[d];
  (void)token;  // a token: its byte is never read
  const BufferRows rows = RowsOf(segments);
  return ToFfiError(copy::LaunchBufferSegmentCopy(stream, pointers, rows.data, rows.count));
}

}  // namespace
}  // namespace amem::ffi_adapter

XLA_FFI_DEFINE_HANDLER_SYMBOL(AmemSegmentCopyToAddressesCuda,
                              amem::ffi_adapter::SegmentCopyToAddressesCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<CUstream>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .RemainingArgs()
                                  .Attr<ffi::Span<const int64_t>>("addresses")
                                  .Attr<ffi::Span<const int64_t>>("destination_bytes")
                                  .Attr<ffi::Span<const int64_t>>("bulk")
                                  .Ret<ffi::BufferR0<ffi::U8>>());
