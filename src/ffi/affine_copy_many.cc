// jax_amem_affine_copy_many: affine rows (copy/affine.h: elements read in the source's dtype,
// run through constant steps, written in the destination's) from source arrays into
// destination arrays, each aliased to its result (input_output_aliases), so written in place.
//
// Operands: (rows: uint32[n * 12], copy::AffineRow rows as uint32 pairs, split into pieces;
// table: uint32, `programs` copy::AffinePrograms then float64 constants; sources...;
// destinations...). Attributes: sources, programs. Caller: jax_amem.affine_copy.affine_copy_many.
#include <utility>
#include <vector>

#include "copy/affine.h"
#include "copy/affine_cuda.h"
#include "ffi/buffers.h"
#include "ffi/rows.h"
#include "ffi/target.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

constexpr char kWhat[] = "affine_copy_many";

ffi::Error AffineCopyManyCpu(ffi::Buffer<ffi::U32> rows, ffi::Buffer<ffi::U32> table, ffi::RemainingArgs args,
                             ffi::RemainingRets rets, int64_t sources, int64_t programs) {
  ManyBuffers buffers;
  if (ffi::Error decoded = DecodeManyBuffers(args, rets, sources, kWhat, &buffers); decoded.failure()) {
    return decoded;
  }
  const copy::AffineTable affine = AffineTableOf(table, programs);
  if (ffi::Error bounded = AffineInBounds(rows, affine, buffers.source_bytes, buffers.destination_bytes, kWhat);
      bounded.failure()) {
    return bounded;
  }
  std::vector<const char*> from;
  std::vector<char*> to;
  HostPointers(buffers, &from, &to);
  const auto list = RowsOf<copy::AffineRow>(rows);
  copy::AffineCopyOnHost(from.data(), to.data(), list.data, list.count, affine);
  return ffi::Error::Success();
}

// The rows and the table are in device memory: checked when they were built; the kernel skips
// rows naming what does not exist.
ffi::Error AffineCopyManyCuda(CUstream stream, ffi::Buffer<ffi::U32> rows, ffi::Buffer<ffi::U32> table,
                              ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t sources,
                              int64_t programs) {
  ManyBuffers buffers;
  if (ffi::Error decoded = DecodeManyBuffers(args, rets, sources, kWhat, &buffers); decoded.failure()) {
    return decoded;
  }
  copy::BufferPointers pointers{};
  if (ffi::Error placed = DevicePointers(stream, buffers, kWhat, &pointers); placed.failure()) return placed;
  const auto list = RowsOf<copy::AffineRow>(rows);
  return ToFfiError(copy::LaunchAffineCopy(stream, pointers, list.data, list.count, AffineTableOf(table, programs)));
}

template <typename Binding>
auto ManyCall(Binding binding) {
  return std::move(binding).template Arg<ffi::Buffer<ffi::U32>>()
      .template Arg<ffi::Buffer<ffi::U32>>()
      .RemainingArgs()
      .RemainingRets()
      .template Attr<int64_t>("sources")
      .template Attr<int64_t>("programs");
}

XLA_FFI_DEFINE_HANDLER(kAffineCopyManyCpu, AffineCopyManyCpu, ManyCall(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER(kAffineCopyManyCuda, AffineCopyManyCuda,
                       ManyCall(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream>>()));

}  // namespace

AMEM_FFI_HANDLERS(affine_copy_many, kAffineCopyManyCpu, kAffineCopyManyCuda)

}  // namespace amem::ffi_adapter
