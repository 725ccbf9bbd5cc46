#include "copy/copy_cuda.h"
#include "cuda/driver_api.h"
#include "ffi/buffer_rows.h"
#include "ffi/segment_copy_many.h"
#include "ffi/status_adapter.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {
namespace {

// The table was validated on the host when it was built (jax_amem.copy); here
// it lives in device memory. Buffer sizes are still checked against the limit
// of pointers one launch carries.
ffi::Error SegmentCopyManyCuda(CUstream stream, ffi::Buffer<ffi::U32> segments,
                               ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t sources) {
  ManyBuffers buffers;
  if (ffi::Error decoded = DecodeManyBuffers(args, rets, sources, &buffers); decoded.failure()) {
    return decoded;
  }
  if (static_cast<int64_t>(buffers.sources.size()) > copy::kMaxBuffersPerSide ||
      static_cast<int64_t>(buffers.outputs.size()) > copy::kMaxBuffersPerSide) {
    return ffi::Error::InvalidArgument("jax_amem_segment_copy_many: more than " +
                                       std::to_string(copy::kMaxBuffersPerSide) +
                                       " buffers on one side; split the call");
  }
  copy::BufferPointers pointers{};
  for (size_t s = 0; s < buffers.sources.size(); ++s) {
    pointers.sources[s] = static_cast<const char*>(buffers.sources[s].untyped_data());
  }
  const cuda::DriverApi* api = nullptr;
  for (size_t d = 0; d < buffers.outputs.size(); ++d) {
    char* target = static_cast<char*>(buffers.outputs[d].untyped_data());
    if (target != buffers.inputs[d].untyped_data() && buffers.destination_bytes[d] > 0) {
      if (api == nullptr && (api = cuda::Driver()) == nullptr) {
        return ffi::Error::Internal("CUDA driver not loaded");
      }
      Status copied = cuda::Check(
          api->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(target),
                             reinterpret_cast<CUdeviceptr>(buffers.inputs[d].untyped_data()),
                             buffers.destination_bytes[d], stream),
          "copy of a destination before the batched segment copy");
      if (!copied.ok()) return ToFfiError(copied);
    }
    pointers.destinations[d] = target;
  }
  return ToFfiError(copy::LaunchBufferSegmentCopy(
      stream, pointers, RowsOf(segments).data, RowsOf(segments).count));
}

}  // namespace
}  // namespace amem::ffi_adapter

XLA_FFI_DEFINE_HANDLER_SYMBOL(AmemSegmentCopyManyCuda, amem::ffi_adapter::SegmentCopyManyCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<CUstream>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("sources"));
