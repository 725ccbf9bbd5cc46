// The buffers of the targets that write results aliased to their operands
// (input_output_aliases): decoding the variadic operands, and keeping the bytes no row writes.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/driver_api.h"
#include "ffi/status_adapter.h"
#include "xla/ffi/api/ffi.h"

namespace amem::ffi_adapter {

// One call's buffers: `sources` operands, then one operand per destination and its result.
struct ManyBuffers {
  std::vector<xla::ffi::AnyBuffer> sources;
  std::vector<xla::ffi::AnyBuffer> inputs;   // destinations as passed in
  std::vector<xla::ffi::AnyBuffer> outputs;  // the aliased results
  std::vector<int64_t> source_bytes;
  std::vector<int64_t> destination_bytes;
};

inline xla::ffi::Error DecodeManyBuffers(xla::ffi::RemainingArgs args, xla::ffi::RemainingRets rets,
                                         int64_t sources, const std::string& target,
                                         ManyBuffers* out) {
  const auto operands = static_cast<int64_t>(args.size());
  const int64_t destinations = operands - sources;
  if (sources < 0 || destinations < 0 || static_cast<int64_t>(rets.size()) != destinations) {
    return xla::ffi::Error::InvalidArgument(
        target + ": " + std::to_string(operands) + " buffers after the table, " +
        std::to_string(sources) + " of them sources, and " + std::to_string(rets.size()) +
        " results: there must be one result per destination");
  }
  for (int64_t i = 0; i < operands; ++i) {
    auto buffer = args.get<xla::ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    (i < sources ? out->sources : out->inputs).push_back(*buffer);
    (i < sources ? out->source_bytes : out->destination_bytes)
        .push_back(static_cast<int64_t>(buffer->size_bytes()));
  }
  for (int64_t i = 0; i < destinations; ++i) {
    auto result = rets.get<xla::ffi::AnyBuffer>(i);
    if (result.has_error()) return result.error();
    out->outputs.push_back(**result);
  }
  return xla::ffi::Error::Success();
}

// XLA honours the alias, so a result is its operand's buffer. If it ever is not, the result
// first gets the operand's bytes, so that the bytes no row writes are the destination's.
inline void KeepUnwrittenBytesOnHost(const xla::ffi::AnyBuffer& operand, xla::ffi::AnyBuffer& result) {
  if (result.untyped_data() != operand.untyped_data() && operand.size_bytes() > 0) {
    std::memcpy(result.untyped_data(), operand.untyped_data(), operand.size_bytes());
  }
}

inline xla::ffi::Error KeepUnwrittenBytesOnDevice(CUstream stream, const xla::ffi::AnyBuffer& operand,
                                                  xla::ffi::AnyBuffer& result) {
  if (result.untyped_data() == operand.untyped_data() || operand.size_bytes() == 0) {
    return xla::ffi::Error::Success();
  }
  std::string why;
  const cuda::DriverApi* api = cuda::Driver(&why);
  if (api == nullptr) return xla::ffi::Error::Internal(why);
  return ToFfiError(cuda::Check(
      api->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(result.untyped_data()),
                         reinterpret_cast<CUdeviceptr>(operand.untyped_data()), operand.size_bytes(),
                         stream),
      "copy of a destination into its result before the segment copy"));
}

}  // namespace amem::ffi_adapter
