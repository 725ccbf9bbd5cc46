// jax_amem_segment_copy_many: rows between many arrays, one call (one kernel launch on CUDA).
//
// Operands: (segments: uint32[n, 12], sources..., destinations...); attribute `sources` says
// how many operands after the table are sources. Rows are copy::BufferSegment (src_index,
// dst_index, src_offset, dst_offset, bytes, 0) as uint32 pairs. Results: one per destination,
// aliased to it (input_output_aliases), so every destination is written in place.
// Caller: jax_amem.copy.segment_copy_many.
#include <utility>
#include <vector>

#include "copy/copy_cpu.h"
#include "copy/copy_cuda.h"
#include "ffi/buffers.h"
#include "ffi/rows.h"
#include "ffi/target.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

constexpr char kWhat[] = "segment_copy_many";  // in messages: the Python function that calls it

ffi::Error SegmentCopyManyCpu(ffi::Buffer<ffi::U32> segments, ffi::RemainingArgs args,
                              ffi::RemainingRets rets, int64_t sources) {
  ManyBuffers buffers;
  if (ffi::Error decoded = DecodeManyBuffers(args, rets, sources, kWhat, &buffers); decoded.failure()) {
    return decoded;
  }
  if (ffi::Error whole = WholeRows<copy::BufferSegment>(segments, kWhat); whole.failure()) return whole;
  const auto rows = RowsOf<copy::BufferSegment>(segments);
  if (ffi::Error bounded = InBounds(rows, buffers.source_bytes, buffers.destination_bytes);
      bounded.failure()) {
    return bounded;
  }
  std::vector<const char*> from;
  std::vector<char*> to;
  HostPointers(buffers, &from, &to);
  copy::CopyBufferSegmentsOnHost(from.data(), to.data(), rows.data, rows.count);
  return ffi::Error::Success();
}

// The table is in device memory: the kernel skips rows outside the buffers. The number of
// buffers is still checked: the kernel takes their pointers by value, kMaxBuffersPerSide a side.
ffi::Error SegmentCopyManyCuda(CUstream stream, ffi::Buffer<ffi::U32> segments,
                               ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t sources) {
  ManyBuffers buffers;
  if (ffi::Error decoded = DecodeManyBuffers(args, rets, sources, kWhat, &buffers); decoded.failure()) {
    return decoded;
  }
  copy::BufferPointers pointers{};
  if (ffi::Error placed = DevicePointers(stream, buffers, kWhat, &pointers); placed.failure()) return placed;
  const auto rows = RowsOf<copy::BufferSegment>(segments);
  return ToFfiError(copy::LaunchBufferSegmentCopy(stream, pointers, rows.data, rows.count));
}

// The operands, results and attribute both handlers take, after what precedes them (CUDA: the stream).
template <typename Binding>
auto ManyCall(Binding binding) {
  return std::move(binding).template Arg<ffi::Buffer<ffi::U32>>().RemainingArgs().RemainingRets().template Attr<int64_t>(
      "sources");
}

XLA_FFI_DEFINE_HANDLER(kSegmentCopyManyCpu, SegmentCopyManyCpu, ManyCall(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER(kSegmentCopyManyCuda, SegmentCopyManyCuda,
                       ManyCall(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream>>()));

}  // namespace

AMEM_FFI_HANDLERS(segment_copy_many, kSegmentCopyManyCpu, kSegmentCopyManyCuda)

}  // namespace amem::ffi_adapter
