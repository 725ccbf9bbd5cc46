// XLA FFI handlers for the batched copy between many buffers.
//
// Operands: (segments: uint32[n, 12], sources..., destinations...); attribute
// `sources` says how many operands after the table are sources. Results: one
// per destination, aliased to it (input_output_aliases), so every destination
// is written in place. Rows are int64 (src_index, dst_index, src_offset,
// dst_offset, bytes, 0) carried as uint32 pairs. One kernel launch on CUDA.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

extern "C" {
XLA_FFI_Error* AmemSegmentCopyManyCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* AmemSegmentCopyManyCuda(XLA_FFI_CallFrame* call_frame);
}

namespace amem::ffi_adapter {

// The buffers of one call, split into sources and destinations (results).
struct ManyBuffers {
  std::vector<xla::ffi::AnyBuffer> sources;
  std::vector<xla::ffi::AnyBuffer> inputs;   // destinations as passed in
  std::vector<xla::ffi::AnyBuffer> outputs;  // the aliased results
  std::vector<int64_t> source_bytes;
  std::vector<int64_t> destination_bytes;
};

// Decodes the operands; an error names what does not fit.
xla::ffi::Error DecodeManyBuffers(xla::ffi::RemainingArgs args, xla::ffi::RemainingRets rets,
                                  int64_t sources, ManyBuffers* out);

}  // namespace amem::ffi_adapter
