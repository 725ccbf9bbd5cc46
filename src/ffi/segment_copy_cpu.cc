#include <cstring>

#include "copy/copy_cpu.h"
#include "ffi/segment_copy.h"
#include "ffi/status_adapter.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

ffi::Error SegmentCopyCpu(ffi::AnyBuffer src, ffi::AnyBuffer dst,
                          ffi::Buffer<ffi::U32> segments, ffi::Result<ffi::AnyBuffer> out) {
  const auto* table = reinterpret_cast<const copy::Segment*>(segments.untyped_data());
  const int64_t count = static_cast<int64_t>(segments.element_count() / 6);
  const int64_t src_bytes = static_cast<int64_t>(src.size_bytes());
  const int64_t dst_bytes = static_cast<int64_t>(out->size_bytes());
  Status valid = copy::ValidateSegments(table, count, src_bytes, dst_bytes);
  if (!valid.ok()) return ToFfiError(valid);
  char* target = static_cast<char*>(out->untyped_data());
  // XLA honours the alias, so `out` is `dst`; if it ever is not, start from dst.
  if (target != dst.untyped_data() && dst_bytes > 0) {
    std::memcpy(target, dst.untyped_data(), dst_bytes);
  }
  copy::CopySegmentsOnHost(static_cast<const char*>(src.untyped_data()), target, table, count);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace amem::ffi_adapter

XLA_FFI_DEFINE_HANDLER_SYMBOL(AmemSegmentCopyCpu, amem::ffi_adapter::SegmentCopyCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Ret<ffi::AnyBuffer>());
