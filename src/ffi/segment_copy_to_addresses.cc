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
#include "ffi/rows.h"
#include "ffi/target.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

constexpr char kWhat[] = "segment_copy_to_addresses";  // in messages: the Python function

struct AddressCopy {
  std::vector<const char*> sources;
  std::vector<int64_t> source_bytes;
  std::vector<char*> destinations;
  std::vector<int64_t> destination_bytes;
};

// Decodes the sources and destinations and checks what both platforms need: as many sizes as
// addresses, the buffers' count, the bulk rows (host memory) in bounds of the sizes given. The
// addresses and sizes themselves were checked once where the call was made (jax_amem.copy,
// through copy::CheckDestinations), before the program was built; like the table, they are
// part of the program and trusted here.
ffi::Error DecodeAddressCopy(ffi::RemainingArgs args, ffi::Span<const int64_t> addresses,
                             ffi::Span<const int64_t> destination_bytes,
                             ffi::Span<const int64_t> bulk, AddressCopy* out) {
  const std::string name = std::string(kWhat) + ": ";
  if (addresses.size() != destination_bytes.size()) {
    return ffi::Error::InvalidArgument(name + std::to_string(addresses.size()) + " addresses but " +
                                       std::to_string(destination_bytes.size()) +
                                       " destination sizes; give one of each per destination");
  }
  if (static_cast<int64_t>(args.size()) > copy::kMaxBuffersPerSide ||
      static_cast<int64_t>(addresses.size()) > copy::kMaxBuffersPerSide) {
    return ffi::Error::InvalidArgument(name + "more than " +
                                       std::to_string(copy::kMaxBuffersPerSide) +
                                       " buffers on one side; split the call");
  }
  if (bulk.size() % 6 != 0) {
    return ffi::Error::InvalidArgument(name + "the bulk rows hold " + std::to_string(bulk.size()) +
                                       " int64, not a multiple of six");
  }
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    out->sources.push_back(static_cast<const char*>(buffer->untyped_data()));
    out->source_bytes.push_back(static_cast<int64_t>(buffer->size_bytes()));
  }
  for (size_t d = 0; d < addresses.size(); ++d) {
    out->destinations.push_back(reinterpret_cast<char*>(static_cast<uintptr_t>(addresses[d])));
    out->destination_bytes.push_back(destination_bytes[d]);
  }
  return InBounds(RowsOf(bulk), out->source_bytes, out->destination_bytes);
}

// The call's buffers as the copy takes them (src/copy/direct_launch.h, which the direct launch
// of an eager swap runs too).
copy::BufferPointers Pointers(const AddressCopy& call) {
  copy::BufferPointers pointers{};
  for (size_t s = 0; s < call.sources.size(); ++s) pointers.sources[s] = call.sources[s];
  for (size_t d = 0; d < call.destinations.size(); ++d) pointers.destinations[d] = call.destinations[d];
  return pointers;
}

// On the CPU the table operand is host memory: its rows are checked too, then both row sets
// are copied. Whether an address is memory of this process cannot be known here (see the
// Python docstring).
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
  if (ffi::Error whole = WholeRows<copy::BufferSegment>(segments, kWhat); whole.failure()) return whole;
  const auto rows = RowsOf<copy::BufferSegment>(segments);
  if (ffi::Error bounded = InBounds(rows, call.source_bytes, call.destination_bytes);
      bounded.failure()) {
    return bounded;
  }
  const auto long_rows = RowsOf(bulk);
  copy::CopyAddressRowsOnHost(Pointers(call), long_rows.data, long_rows.count, rows.data, rows.count);
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
  AddressCopy call;
  if (ffi::Error decoded = DecodeAddressCopy(args, addresses, destination_bytes, bulk, &call);
      decoded.failure()) {
    return decoded;
  }
  const auto long_rows = RowsOf(bulk);
  const auto rows = RowsOf<copy::BufferSegment>(segments);
  return ToFfiError(copy::LaunchAddressCopy(stream, Pointers(call), long_rows.data, long_rows.count, rows.data,
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
