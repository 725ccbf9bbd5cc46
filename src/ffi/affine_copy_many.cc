// jax_amem_affine_copy_many: affine rows (copy/affine.h: elements read in the source's dtype,
// run through constant steps, written in the destination's) from source arrays into
// destination arrays, each aliased to its result (input_output_aliases), so written in place.
//
// Operands: (rows: uint32[n * 12], copy::AffineRow rows as uint32 pairs, split into pieces;
// table: uint32, `programs` copy::AffinePrograms then float64 constants; sources...;
// destinations...). Attributes: sources, programs. Caller: jax_amem.affine_copy.affine_copy_many.
#include <string>
#include <utility>

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
  if (ffi::Error whole = WholeRows<copy::AffineRow>(rows, kWhat); whole.failure()) return whole;
  const auto affine = copy::AffineTableAt(table.untyped_data(), static_cast<int64_t>(table.size_bytes()), programs);
  const auto list = RowsOf<copy::AffineRow>(rows);
  if (ffi::Error checked = ToFfiError(copy::CheckAffineTable(affine)); checked.failure()) return checked;
  if (ffi::Error bounded = ToFfiError(copy::CheckAffineRowsInBounds(list.data, list.count, affine,
                                                                     buffers.source_bytes, buffers.destination_bytes));
      bounded.failure()) {
    return bounded;
  }
  std::vector<const char*> from;
  std::vector<char*> to;
  for (auto& s : buffers.sources) from.push_back(static_cast<const char*>(s.untyped_data()));
  for (size_t d = 0; d < buffers.outputs.size(); ++d) {
    KeepUnwrittenBytesOnHost(buffers.inputs[d], buffers.outputs[d]);
    to.push_back(static_cast<char*>(buffers.outputs[d].untyped_data()));
  }
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
  if (static_cast<int64_t>(buffers.sources.size()) > copy::kMaxBuffersPerSide ||
      static_cast<int64_t>(buffers.outputs.size()) > copy::kMaxBuffersPerSide) {
    return ffi::Error::InvalidArgument(std::string(kWhat) + ": more than " +
                                       std::to_string(copy::kMaxBuffersPerSide) + " buffers on one side");
  }
  copy::BufferPointers pointers{};
  for (size_t s = 0; s < buffers.sources.size(); ++s) {
    pointers.sources[s] = static_cast<const char*>(buffers.sources[s].untyped_data());
  }
  for (size_t d = 0; d < buffers.outputs.size(); ++d) {
    if (ffi::Error kept = KeepUnwrittenBytesOnDevice(stream, buffers.inputs[d], buffers.outputs[d]); kept.failure()) {
      return kept;
    }
    pointers.destinations[d] = static_cast<char*>(buffers.outputs[d].untyped_data());
  }
  const auto list = RowsOf<copy::AffineRow>(rows);
  return ToFfiError(copy::LaunchAffineCopy(
      stream, pointers, list.data, list.count,
      copy::AffineTableAt(table.untyped_data(), static_cast<int64_t>(table.size_bytes()), programs)));
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
