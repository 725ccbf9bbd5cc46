// jax_amem_affine_copy_to_addresses: affine rows (copy/affine.h) from source arrays into memory
// XLA does not own, given by address (PyTorch tensors, buffers opened through CUDA IPC), as
// segment_copy_to_addresses does for byte rows. Result: a token (u8 scalar, value meaningless).
//
// Operands: (rows: uint32[n * 12] copy::AffineRow rows as uint32 pairs, split into pieces;
// table: uint32, `programs` programs then float64 constants; sources...). Attributes:
// addresses, destination_bytes (int64, one per destination), programs.
// Caller: jax_amem.affine_copy.affine_copy_to_addresses (which checks addresses and rows).
#include <string>
#include <utility>
#include <vector>

#include "copy/affine.h"
#include "copy/affine_cuda.h"
#include "ffi/rows.h"
#include "ffi/target.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

constexpr char kWhat[] = "affine_copy_to_addresses";

struct Decoded {
  copy::BufferPointers pointers{};
  std::vector<const char*> sources;
  std::vector<char*> destinations;
  std::vector<int64_t> source_bytes;
  std::vector<int64_t> destination_bytes;
};

ffi::Error Decode(ffi::RemainingArgs args, ffi::Span<const int64_t> addresses,
                  ffi::Span<const int64_t> destination_bytes, Decoded* out) {
  const std::string name = std::string(kWhat) + ": ";
  if (addresses.size() != destination_bytes.size()) {
    return ffi::Error::InvalidArgument(name + "one size per address");
  }
  if (static_cast<int64_t>(args.size()) > copy::kMaxBuffersPerSide ||
      static_cast<int64_t>(addresses.size()) > copy::kMaxBuffersPerSide) {
    return ffi::Error::InvalidArgument(name + "more than " + std::to_string(copy::kMaxBuffersPerSide) +
                                       " buffers on one side; split the call");
  }
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    out->sources.push_back(static_cast<const char*>(buffer->untyped_data()));
    out->source_bytes.push_back(static_cast<int64_t>(buffer->size_bytes()));
    out->pointers.sources[i] = out->sources.back();
  }
  // Addresses and sizes: checked once where the call was made (copy::CheckDestinations).
  for (size_t d = 0; d < addresses.size(); ++d) {
    out->destinations.push_back(reinterpret_cast<char*>(static_cast<uintptr_t>(addresses[d])));
    out->destination_bytes.push_back(destination_bytes[d]);
    out->pointers.destinations[d] = out->destinations.back();
  }
  return ffi::Error::Success();
}

ffi::Error AffineToAddressesCpu(ffi::Buffer<ffi::U32> rows, ffi::Buffer<ffi::U32> table, ffi::RemainingArgs args,
                                ffi::Span<const int64_t> addresses, ffi::Span<const int64_t> destination_bytes,
                                int64_t programs, ffi::Result<ffi::BufferR0<ffi::U8>> token) {
  Decoded call;
  if (ffi::Error decoded = Decode(args, addresses, destination_bytes, &call); decoded.failure()) return decoded;
  if (ffi::Error whole = WholeRows<copy::AffineRow>(rows, kWhat); whole.failure()) return whole;
  const auto affine = copy::AffineTableAt(table.untyped_data(), static_cast<int64_t>(table.size_bytes()), programs);
  const auto list = RowsOf<copy::AffineRow>(rows);
  if (ffi::Error checked = ToFfiError(copy::CheckAffineTable(affine)); checked.failure()) return checked;
  if (ffi::Error bounded = ToFfiError(copy::CheckAffineRowsInBounds(list.data, list.count, affine,
                                                                     call.source_bytes, call.destination_bytes));
      bounded.failure()) {
    return bounded;
  }
  copy::AffineCopyOnHost(call.sources.data(), call.destinations.data(), list.data, list.count, affine);
  *token->typed_data() = 0;
  return ffi::Error::Success();
}

ffi::Error AffineToAddressesCuda(CUstream stream, ffi::Buffer<ffi::U32> rows, ffi::Buffer<ffi::U32> table,
                                 ffi::RemainingArgs args, ffi::Span<const int64_t> addresses,
                                 ffi::Span<const int64_t> destination_bytes, int64_t programs,
                                 ffi::Result<ffi::BufferR0<ffi::U8>> token) {
  (void)token;
  Decoded call;
  if (ffi::Error decoded = Decode(args, addresses, destination_bytes, &call); decoded.failure()) return decoded;
  const auto list = RowsOf<copy::AffineRow>(rows);
  return ToFfiError(copy::LaunchAffineCopy(
      stream, call.pointers, list.data, list.count,
      copy::AffineTableAt(table.untyped_data(), static_cast<int64_t>(table.size_bytes()), programs)));
}

template <typename Binding>
auto AddressCall(Binding binding) {
  return std::move(binding).template Arg<ffi::Buffer<ffi::U32>>()
      .template Arg<ffi::Buffer<ffi::U32>>()
      .RemainingArgs()
      .template Attr<ffi::Span<const int64_t>>("addresses")
      .template Attr<ffi::Span<const int64_t>>("destination_bytes")
      .template Attr<int64_t>("programs")
      .template Ret<ffi::BufferR0<ffi::U8>>();
}

XLA_FFI_DEFINE_HANDLER(kAffineToAddressesCpu, AffineToAddressesCpu, AddressCall(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER(kAffineToAddressesCuda, AffineToAddressesCuda,
                       AddressCall(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream>>()));

}  // namespace

AMEM_FFI_HANDLERS(affine_copy_to_addresses, kAffineToAddressesCpu, kAffineToAddressesCuda)

}  // namespace amem::ffi_adapter
