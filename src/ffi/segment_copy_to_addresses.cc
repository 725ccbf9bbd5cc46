// jax_amem_segment_copy_to_addresses: rows from source arrays into memory XLA does not own,
// given by address (a PyTorch tensor's storage in this process, a rollout worker's buffer
// opened through CUDA IPC). Nothing is donated, so a call costs XLA no output buffers: its one
// result is a token (uint8 scalar whose value means nothing) that orders later work after it.
//
// Operands: (segments: uint32[n, 12], sources...). Rows are copy::BufferSegment as uint32
// pairs, already split into pieces; on CUDA they run as one kernel launch. Attributes:
// `addresses` and `destination_bytes` (int64, one per destination), `bulk` (int64 rows of six,
// like the table): long rows that each run as one cuMemcpyAsync on CUDA, the driver's own
// device copy. Caller: jax_amem.copy.segment_copy_to_addresses, which also bounds each
// destination by its allocation on CUDA when the program is built.
#include <string>
#include <utility>
#include <vector>

#include "copy/direct_launch.h"
#include "ffi/addresses.h"
#include "ffi/rows.h"
#include "ffi/target.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

constexpr char kWhat[] = "segment_copy_to_addresses";  // in messages: the Python function

// The sources and destinations (addresses.h), and the bulk rows (host memory) in bounds of them.
ffi::Error DecodeAddressCopy(ffi::RemainingArgs args, ffi::Span<const int64_t> addresses,
                             ffi::Span<const int64_t> destination_bytes, ffi::Span<const int64_t> bulk,
                             AddressBuffers* out) {
  if (ffi::Error decoded = DecodeAddresses(args, addresses, destination_bytes, kWhat, out); decoded.failure()) {
    return decoded;
  }
  if (bulk.size() % 6 != 0) {
    return ffi::Error::InvalidArgument(std::string(kWhat) + ": the bulk rows hold " + std::to_string(bulk.size()) +
                                       " int64, not a multiple of six");
  }
  return InBounds(RowsOf(bulk), out->source_bytes, out->destination_bytes);
}

// On the CPU the table operand is host memory: its rows are checked too, then both row sets
// are copied. Whether an address is memory of this process cannot be known here (see the
// Python docstring).
ffi::Error SegmentCopyToAddressesCpu(ffi::Buffer<ffi::U32> segments, ffi::RemainingArgs args,
                                     ffi::Span<const int64_t> addresses,
                                     ffi::Span<const int64_t> destination_bytes,
                                     ffi::Span<const int64_t> bulk,
                                     ffi::Result<ffi::BufferR0<ffi::U8>> token) {
  AddressBuffers call;
  if (ffi::Error decoded = DecodeAddressCopy(args, addresses, destination_bytes, bulk, &call);
      decoded.failure()) {
    return decoded;
  }
  if (ffi::Error whole = WholeRows<copy::BufferSegment>(segments, kWhat); whole.failure()) return whole;
  const auto rows = RowsOf<copy::BufferSegment>(segments);
  if (ffi::Error bounded = InBounds(rows, call.source_bytes, call.destination_bytes);
      bounded.failure()) {
    return bounded;
  }
  const auto long_rows = RowsOf(bulk);
  copy::CopyAddressRowsOnHost(call.Pointers(), long_rows.data, long_rows.count, rows.data, rows.count);
  *token->typed_data() = 0;
  return ffi::Error::Success();
}

// Bulk rows: one cuMemcpyAsync each (the driver's device copy runs at the copy ceiling); the
// table's rows: one kernel launch with every pointer passed by value (copy::LaunchAddressCopy).
// Both on XLA's stream, so the copy is ordered after whatever produced the sources.
ffi::Error SegmentCopyToAddressesCuda(CUstream stream, ffi::Buffer<ffi::U32> segments,
                                      ffi::RemainingArgs args, ffi::Span<const int64_t> addresses,
                                      ffi::Span<const int64_t> destination_bytes,
                                      ffi::Span<const int64_t> bulk,
                                      ffi::Result<ffi::BufferR0<ffi::U8>> token) {
  (void)token;  // a token: its byte is never read
  AddressBuffers call;
  if (ffi::Error decoded = DecodeAddressCopy(args, addresses, destination_bytes, bulk, &call);
      decoded.failure()) {
    return decoded;
  }
  const auto long_rows = RowsOf(bulk);
  const auto rows = RowsOf<copy::BufferSegment>(segments);
  return ToFfiError(copy::LaunchAddressCopy(stream, call.Pointers(), long_rows.data, long_rows.count, rows.data,
                                            rows.count));
}

// The operands, attributes and result both handlers take, after what precedes them (CUDA: the stream).
template <typename Binding>
auto AddressCall(Binding binding) {
  return std::move(binding).template Arg<ffi::Buffer<ffi::U32>>()
      .RemainingArgs()
      .template Attr<ffi::Span<const int64_t>>("addresses")
      .template Attr<ffi::Span<const int64_t>>("destination_bytes")
      .template Attr<ffi::Span<const int64_t>>("bulk")
      .template Ret<ffi::BufferR0<ffi::U8>>();
}

XLA_FFI_DEFINE_HANDLER(kSegmentCopyToAddressesCpu, SegmentCopyToAddressesCpu,
                       AddressCall(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER(kSegmentCopyToAddressesCuda, SegmentCopyToAddressesCuda,
                       AddressCall(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream>>()));

}  // namespace

AMEM_FFI_HANDLERS(segment_copy_to_addresses, kSegmentCopyToAddressesCpu, kSegmentCopyToAddressesCuda)

}  // namespace amem::ffi_adapter
