#include "copy/copy_cuda.h"
#include "cuda/driver_api.h"
#include "ffi/segment_copy.h"
#include "ffi/status_adapter.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

// Segment tables are validated on the host when they are built (Python side,
// through the same ValidateSegments); here they live in device memory.
ffi::Error SegmentCopyCuda(CUstream stream, ffi::AnyBuffer src, ffi::AnyBuffer dst,
                           ffi::Buffer<ffi::U32> segments, ffi::Result<ffi::AnyBuffer> out) {
  const int64_t count = static_cast<int64_t>(segments.element_count() / 6);
  const int64_t dst_bytes = static_cast<int64_t>(out->size_bytes());
  char* target = static_cast<char*>(out->untyped_data());
  if (target != dst.untyped_data() && dst_bytes > 0) {
    const cuda::DriverApi* api = cuda::Driver();
    if (api == nullptr) return ffi::Error::Internal("CUDA driver not loaded");
    Status copied = cuda::Check(
        api->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(target),
                           reinterpret_cast<CUdeviceptr>(dst.untyped_data()), dst_bytes, stream),
        "copy of the destination before the segment copy");
    if (!copied.ok()) return ToFfiError(copied);
  }
  return ToFfiError(copy::LaunchSegmentCopy(
      stream, static_cast<const char*>(src.untyped_data()), static_cast<int64_t>(src.size_bytes()),
      target, dst_bytes, reinterpret_cast<const copy::Segment*>(segments.untyped_data()), count));
}

}  // namespace
}  // namespace amem::ffi_adapter

XLA_FFI_DEFINE_HANDLER_SYMBOL(AmemSegmentCopyCuda, amem::ffi_adapter::SegmentCopyCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<CUstream>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Ret<ffi::AnyBuffer>());
