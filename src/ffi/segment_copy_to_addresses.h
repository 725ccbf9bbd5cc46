// XLA FFI handlers that copy rows from source buffers (operands) into destination memory
// given by address: memory XLA does not own, such as a PyTorch tensor's storage in this
// process or a rollout worker's buffer opened through CUDA IPC. Nothing is donated, so a
// call costs XLA no output buffers: its one result is a token (uint8 scalar whose value
// means nothing) that orders later work after the copy.
//
// Operands: (segments: uint32[n, 12], sources...). Rows are BufferSegment (src_index,
// dst_index, src_offset, dst_offset, bytes, 0) as uint32 pairs, already split into pieces;
// on CUDA they run as one kernel launch. Attributes: `addresses` and `destination_bytes`
// (int64, one per destination), `bulk` (int64 rows of six, like the table): long rows that
// each run as one cuMemcpyAsync on CUDA, the driver's own device copy.
#pragma once

#include <cstdint>
#include <vector>

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

extern "C" {
XLA_FFI_Error* AmemSegmentCopyToAddressesCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* AmemSegmentCopyToAddressesCuda(XLA_FFI_CallFrame* call_frame);
}

namespace amem::ffi_adapter {

// One call's buffers, decoded and checked: source pointers and sizes, destination
// addresses and sizes, and the bulk rows validated against all of them.
struct AddressCopy {
  std::vector<const char*> sources;
  std::vector<int64_t> source_bytes;
  std::vector<char*> destinations;
  std::vector<int64_t> destination_bytes;
};

xla::ffi::Error DecodeAddressCopy(xla::ffi::RemainingArgs args,
                                  xla::ffi::Span<const int64_t> addresses,
                                  xla::ffi::Span<const int64_t> destination_bytes,
                                  xla::ffi::Span<const int64_t> bulk, AddressCopy* out);

}  // namespace amem::ffi_adapter
