// jax_amem_segment_copy: rows (src_offset, dst_offset, bytes) from one array into another.
//
// Operands: (src: any array, dst: any array, segments: uint32[n, 6], copy::Segment rows as
// uint32 pairs). Result: the destination, aliased to `dst` (input_output_aliases={1: 0}), so
// the copy writes in place. Caller: jax_amem.copy.segment_copy.
#include <utility>

#include "copy/copy_cpu.h"
#include "copy/copy_cuda.h"
#include "ffi/buffers.h"
#include "ffi/rows.h"
#include "ffi/target.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

constexpr char kWhat[] = "segment_copy";  // in messages: the Python function that calls it

ffi::Error SegmentCopyCpu(ffi::AnyBuffer src, ffi::AnyBuffer dst, ffi::Buffer<ffi::U32> segments,
                          ffi::Result<ffi::AnyBuffer> out) {
  if (ffi::Error whole = WholeRows<copy::Segment>(segments, kWhat); whole.failure()) return whole;
  const auto rows = RowsOf<copy::Segment>(segments);
  if (ffi::Error bounded = InBounds(rows, src.size_bytes(), out->size_bytes()); bounded.failure()) {
    return bounded;
  }
  KeepUnwrittenBytesOnHost(dst, *out);
  copy::CopySegmentsOnHost(static_cast<const char*>(src.untyped_data()),
                           static_cast<char*>(out->untyped_data()), rows.data, rows.count);
  return ffi::Error::Success();
}

// The table is in device memory: the kernel skips rows outside the buffers.
ffi::Error SegmentCopyCuda(CUstream stream, ffi::AnyBuffer src, ffi::AnyBuffer dst,
                           ffi::Buffer<ffi::U32> segments, ffi::Result<ffi::AnyBuffer> out) {
  if (ffi::Error kept = KeepUnwrittenBytesOnDevice(stream, dst, *out); kept.failure()) return kept;
  const auto rows = RowsOf<copy::Segment>(segments);
  return ToFfiError(copy::LaunchSegmentCopy(
      stream, static_cast<const char*>(src.untyped_data()), static_cast<int64_t>(src.size_bytes()),
      static_cast<char*>(out->untyped_data()), static_cast<int64_t>(out->size_bytes()), rows.data,
      rows.count));
}

// The operands and result both handlers take, after what precedes them (CUDA: the stream).
template <typename Binding>
auto CopyCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::Buffer<ffi::U32>>()
      .template Ret<ffi::AnyBuffer>();
}

XLA_FFI_DEFINE_HANDLER(kSegmentCopyCpu, SegmentCopyCpu, CopyCall(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER(kSegmentCopyCuda, SegmentCopyCuda,
                       CopyCall(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream>>()));

}  // namespace

AMEM_FFI_HANDLERS(segment_copy, kSegmentCopyCpu, kSegmentCopyCuda)

}  // namespace amem::ffi_adapter
