// XLA FFI handler of the swap's NCCL receiver for JAX destinations: receives one
// staging bucket from a peer and unpacks it into destination buffers
// (src/transport/bucket_pipe.h, PipeRecv), on XLA's stream.
//
// Operands: (after: u8 scalar token of the previous bucket; segments:
// uint32[n, 12] BufferSegment rows, src_index 0 = the bucket, split into
// pieces; destinations...). Results: (token: u8 scalar, then one per
// destination, aliased to it with input_output_aliases, so the donated
// destinations are written in place). The token orders buckets that share no
// destination: NCCL matches a peer's receives to its sends in issue order.
// Attributes: pipe, comm (the communicator handle as an integer), peer, slot,
// bytes, drain (nonzero on a peer's last bucket: XLA's stream then waits for
// all of the pipe's work).
#pragma once

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* AmemNcclRecvBucketCuda(XLA_FFI_CallFrame* call_frame);
}
