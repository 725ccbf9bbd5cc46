// XLA FFI handlers for the batched segment copy.
//
// Operands: (src: any array, dst: any array, segments: uint32[n, 6]).
// The segment table is int64[n, 3] rows (src_offset, dst_offset, bytes) carried
// as uint32 pairs: JAX without x64 would silently narrow an int64 operand.
// Result: the destination, aliased to `dst` (input_output_aliases={1: 0}), so
// the copy writes in place. The handlers only decode buffers and call copy/.
#pragma once

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* AmemSegmentCopyCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* AmemSegmentCopyCuda(XLA_FFI_CallFrame* call_frame);
}
