#include "ffi/segment_copy_many.h"

namespace ffi = xla::ffi;

namespace amem::ffi_adapter {

ffi::Error DecodeManyBuffers(ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t sources,
                             ManyBuffers* out) {
  const auto operands = static_cast<int64_t>(args.size());
  const int64_t destinations = operands - sources;
  if (sources < 0 || destinations < 0 || static_cast<int64_t>(rets.size()) != destinations) {
    return ffi::Error::InvalidArgument(
        "jax_amem_segment_copy_many: " + std::to_string(operands) + " buffers after the table, " +
        std::to_string(sources) + " of them sources, and " + std::to_string(rets.size()) +
        " results: there must be one result per destination");
  }
  for (int64_t i = 0; i < operands; ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    (i < sources ? out->sources : out->inputs).push_back(*buffer);
    (i < sources ? out->source_bytes : out->destination_bytes)
        .push_back(static_cast<int64_t>(buffer->size_bytes()));
  }
  for (int64_t i = 0; i < destinations; ++i) {
    auto result = rets.get<ffi::AnyBuffer>(i);
    if (result.has_error()) return result.error();
    out->outputs.push_back(**result);
  }
  return ffi::Error::Success();
}

}  // namespace amem::ffi_adapter
