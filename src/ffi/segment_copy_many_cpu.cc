#include <cstring>

#include "copy/copy_cpu.h"
#include "ffi/buffer_rows.h"
#include "ffi/segment_copy_many.h"
#include "ffi/status_adapter.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

ffi::Error SegmentCopyManyCpu(ffi::Buffer<ffi::U32> segments, ffi::RemainingArgs args,
                              ffi::RemainingRets rets, int64_t sources) {
  ManyBuffers buffers;
  if (ffi::Error decoded = DecodeManyBuffers(args, rets, sources, &buffers); decoded.failure()) {
    return decoded;
  }
  const BufferRows rows = RowsOf(segments);
  Status valid = copy::ValidateBufferSegments(rows.data, rows.count, buffers.source_bytes,
                                              buffers.destination_bytes);
  if (!valid.ok()) return ToFfiError(valid);
  std::vector<const char*> from;
  std::vector<char*> to;
  for (const ffi::AnyBuffer& source : buffers.sources) {
    from.push_back(static_cast<const char*>(source.untyped_data()));
  }
  for (size_t d = 0; d < buffers.outputs.size(); ++d) {
    char* target = static_cast<char*>(buffers.outputs[d].untyped_data());
    // XLA honours the alias; if it ever does not, start from the destination's bytes.
    if (target != buffers.inputs[d].untyped_data() && buffers.destination_bytes[d] > 0) {
      std::memcpy(target, buffers.inputs[d].untyped_data(), buffers.destination_bytes[d]);
    }
    to.push_back(target);
  }
  copy::CopyBufferSegmentsOnHost(from.data(), to.data(), rows.data, rows.count);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace amem::ffi_adapter

XLA_FFI_DEFINE_HANDLER_SYMBOL(AmemSegmentCopyManyCpu, amem::ffi_adapter::SegmentCopyManyCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("sources"));
