// jax_amem_affine_copy_to_addresses: affine rows (copy/affine.h) from source arrays into memory
// XLA does not own, given by address (PyTorch tensors, buffers opened through CUDA IPC), as
// segment_copy_to_addresses does for byte rows. Result: a token (u8 scalar, value meaningless).
//
// Operands: (rows: uint32[n * 12] copy::AffineRow rows as uint32 pairs, split into pieces;
// table: uint32, `programs` programs then float64 constants; sources...). Attributes:
// addresses, destination_bytes (int64, one per destination), programs.
// Caller: jax_amem.affine_copy.affine_copy_to_addresses (which checks addresses and rows).
#include <utility>

#include "copy/affine.h"
#include "copy/affine_cuda.h"
#include "ffi/addresses.h"
#include "ffi/rows.h"
#include "ffi/target.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

constexpr char kWhat[] = "affine_copy_to_addresses";

ffi::Error AffineToAddressesCpu(ffi::Buffer<ffi::U32> rows, ffi::Buffer<ffi::U32> table, ffi::RemainingArgs args,
                                ffi::Span<const int64_t> addresses, ffi::Span<const int64_t> destination_bytes,
                                int64_t programs, ffi::Result<ffi::BufferR0<ffi::U8>> token) {
  AddressBuffers call;
  if (ffi::Error decoded = DecodeAddresses(args, addresses, destination_bytes, kWhat, &call); decoded.failure()) {
    return decoded;
  }
  const copy::AffineTable affine = AffineTableOf(table, programs);
  if (ffi::Error bounded = AffineInBounds(rows, affine, call.source_bytes, call.destination_bytes, kWhat);
      bounded.failure()) {
    return bounded;
  }
  const auto list = RowsOf<copy::AffineRow>(rows);
  copy::AffineCopyOnHost(call.sources.data(), call.destinations.data(), list.data, list.count, affine);
  *token->typed_data() = 0;
  return ffi::Error::Success();
}

ffi::Error AffineToAddressesCuda(CUstream stream, ffi::Buffer<ffi::U32> rows, ffi::Buffer<ffi::U32> table,
                                 ffi::RemainingArgs args, ffi::Span<const int64_t> addresses,
                                 ffi::Span<const int64_t> destination_bytes, int64_t programs,
                                 ffi::Result<ffi::BufferR0<ffi::U8>> token) {
  (void)token;  // a token: its byte is never read
  AddressBuffers call;
  if (ffi::Error decoded = DecodeAddresses(args, addresses, destination_bytes, kWhat, &call); decoded.failure()) {
    return decoded;
  }
  const auto list = RowsOf<copy::AffineRow>(rows);
  return ToFfiError(
      copy::LaunchAffineCopy(stream, call.Pointers(), list.data, list.count, AffineTableOf(table, programs)));
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
