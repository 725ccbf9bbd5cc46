#include "copy/copy_cpu.h"
#include "ffi/buffer_rows.h"
#include "ffi/segment_copy_to_addresses.h"
#include "ffi/status_adapter.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

// On the CPU the table operand is host memory: both row sets are checked and copied here.
ffi::Error SegmentCopyToAddressesCpu(ffi::Buffer<ffi::U32> segments, ffi::RemainingArgs args,
                                     ffi::Span<const int64_t> addresses,
                                     ffi::Span<const int64_t> destination_bytes,
                                     ffi::Span<const int64_t> bulk,
                                     ffi::Result<ffi::BufferR0<ffi::U8>> token) {
  AddressCopy call;
  if (ffi::Error decoded = DecodeAddressCopy(args, addresses, destination_bytes, bulk, &call);
      decoded.failure()) {
    return decoded;
  }
  const BufferRows rows = RowsOf(segments);
  Status valid = copy::ValidateBufferSegments(rows.data, rows.count, call.source_bytes,
                                              call.destination_bytes);
  if (!valid.ok()) return ToFfiError(valid);
  const BufferRows long_rows = RowsOf(bulk);
  copy::CopyBufferSegmentsOnHost(call.sources.data(), call.destinations.data(), long_rows.data,
                                 long_rows.count);
  copy::CopyBufferSegmentsOnHost(call.sources.data(), call.destinations.data(), rows.data, rows.count);
  *token->typed_data() = 0;
  return ffi::Error::Success();
}

}  // namespace
}  // namespace amem::ffi_adapter

XLA_FFI_DEFINE_HANDLER_SYMBOL(AmemSegmentCopyToAddressesCpu,
                              amem::ffi_adapter::SegmentCopyToAddressesCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .RemainingArgs()
                                  .Attr<ffi::Span<const int64_t>>("addresses")
                                  .Attr<ffi::Span<const int64_t>>("destination_bytes")
                                  .Attr<ffi::Span<const int64_t>>("bulk")
                                  .Ret<ffi::BufferR0<ffi::U8>>());
