// XLA FFI handler of the swap's NCCL sender: gathers one staging bucket from
// source views and ncclSend's it to a peer (src/transport/bucket_pipe.h).
//
// Operands: (after: u8 scalar token of the previous bucket, which orders the
// calls; segments: uint32[n, 12] BufferSegment rows, dst_index 0 = the bucket,
// split into pieces; sources...). Attributes: pipe, comm (the communicator
// handle as an integer), peer, slot, bytes, drain (nonzero on a peer's last
// bucket: XLA's stream then waits until the pipe's sends are done, so the
// call's completion means the data left). Result: a u8 scalar token.
#pragma once

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* AmemNcclSendBucketCuda(XLA_FFI_CallFrame* call_frame);
}
