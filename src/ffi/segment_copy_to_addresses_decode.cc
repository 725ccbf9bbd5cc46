#include <string>

#include "copy/segments.h"
#include "ffi/buffer_rows.h"
#include "ffi/segment_copy_to_addresses.h"
#include "ffi/status_adapter.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {

ffi::Error DecodeAddressCopy(ffi::RemainingArgs args, ffi::Span<const int64_t> addresses,
                             ffi::Span<const int64_t> destination_bytes,
                             ffi::Span<const int64_t> bulk, AddressCopy* out) {
  const std::string name = "jax_amem_segment_copy_to_addresses: ";
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
    if ((addresses[d] == 0 && destination_bytes[d] > 0) || destination_bytes[d] < 0) {
      return ffi::Error::InvalidArgument(name + "destination " + std::to_string(d) +
                                         " has no address or a negative size");
    }
    out->destinations.push_back(reinterpret_cast<char*>(static_cast<uintptr_t>(addresses[d])));
    out->destination_bytes.push_back(destination_bytes[d]);
  }
  // Bulk rows are on the host here, so they are checked at every call; the kernel's table
  // was checked when it was built (jax_amem.copy) and the kernel skips rows out of range.
  const BufferRows rows = RowsOf(bulk);
  return ToFfiError(copy::ValidateBufferSegments(rows.data, rows.count, out->source_bytes,
                                                 out->destination_bytes));
}

}  // namespace amem::ffi_adapter
