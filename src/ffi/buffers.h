// The buffers of the targets that write results aliased to their operands
// (input_output_aliases): decoding the variadic operands, keeping the bytes no row writes, and
// handing the buffers to the copy as pointers (on the host, or by value to a kernel).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "copy/copy_cuda.h"
#include "copy/segments.h"
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

// A kernel takes every pointer by value, kMaxBuffersPerSide a side: more is an error naming
// `what` ("buffers on one side", "destinations in one bucket").
inline xla::ffi::Error AtMostKernelBuffers(size_t count, const std::string& target, const std::string& what) {
  if (static_cast<int64_t>(count) <= copy::kMaxBuffersPerSide) return xla::ffi::Error::Success();
  return xla::ffi::Error::InvalidArgument(target + ": more than " + std::to_string(copy::kMaxBuffersPerSide) + " " +
                                          what + "; split the call");
}

// The host copy's pointers: the sources, and each result (holding its operand's bytes).
inline void HostPointers(ManyBuffers& buffers, std::vector<const char*>* from, std::vector<char*>* to) {
  for (const xla::ffi::AnyBuffer& source : buffers.sources) {
    from->push_back(static_cast<const char*>(source.untyped_data()));
  }
  for (size_t d = 0; d < buffers.outputs.size(); ++d) {
    KeepUnwrittenBytesOnHost(buffers.inputs[d], buffers.outputs[d]);
    to->push_back(static_cast<char*>(buffers.outputs[d].untyped_data()));
  }
}

// The kernel's pointers, on `stream`: the sources, and each result (holding its operand's bytes).
inline xla::ffi::Error DevicePointers(CUstream stream, ManyBuffers& buffers, const std::string& target,
                                      copy::BufferPointers* pointers) {
  for (size_t count : {buffers.sources.size(), buffers.outputs.size()}) {
    if (xla::ffi::Error many = AtMostKernelBuffers(count, target, "buffers on one side"); many.failure()) return many;
  }
  for (size_t s = 0; s < buffers.sources.size(); ++s) {
    pointers->sources[s] = static_cast<const char*>(buffers.sources[s].untyped_data());
  }
  for (size_t d = 0; d < buffers.outputs.size(); ++d) {
    if (xla::ffi::Error kept = KeepUnwrittenBytesOnDevice(stream, buffers.inputs[d], buffers.outputs[d]);
        kept.failure()) {
      return kept;
    }
    pointers->destinations[d] = static_cast<char*>(buffers.outputs[d].untyped_data());
  }
  return xla::ffi::Error::Success();
}

}  // namespace amem::ffi_adapter
