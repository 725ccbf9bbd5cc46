// A segment is one contiguous byte run copied from a source buffer into a
// destination buffer. Tables of segments are the unit every executor runs:
// the CPU loop, the CUDA kernel, and (later) the cross-process transports.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace amem::copy {

// Stored as three int64 per row so a table is also a plain (n, 3) int64 array
// that XLA can carry as an operand.
struct Segment {
  int64_t src_offset;
  int64_t dst_offset;
  int64_t bytes;
};
static_assert(sizeof(Segment) == 3 * sizeof(int64_t), "Segment must be three packed int64");

// Largest piece one CUDA block copies. Splitting big segments into pieces of
// this size balances one kernel launch across all multiprocessors whatever the
// mix of segment sizes. A multiple of 16 so that split points keep alignment.
constexpr int64_t kMaxPieceBytes = 256 * 1024;

// Checks that every segment is inside both buffers and has positive length: what a copy
// needs to stay inside its memory. The message names the first offending row.
Status CheckSegmentsInBounds(const Segment* segments, int64_t count, int64_t src_bytes,
                             int64_t dst_bytes);

// CheckSegmentsInBounds, and no two segments write the same destination byte
// (parallel writers would race). The message names the first offending row.
Status ValidateSegments(const Segment* segments, int64_t count, int64_t src_bytes,
                        int64_t dst_bytes);

// Splits segments longer than `max_piece` into consecutive pieces; keeps order.
std::vector<Segment> SplitIntoPieces(const Segment* segments, int64_t count,
                                     int64_t max_piece = kMaxPieceBytes);

// A segment between one of several source buffers and one of several
// destination buffers: the rows of a batched copy over many tensors (one XLA
// custom call, one kernel launch, for a whole group of a model's weights).
struct BufferSegment {
  int64_t src_index;
  int64_t dst_index;
  int64_t src_offset;
  int64_t dst_offset;
  int64_t bytes;
  int64_t reserved;  // keeps rows 16-byte aligned; must be 0
};
static_assert(sizeof(BufferSegment) == 6 * sizeof(int64_t), "BufferSegment must be six packed int64");

// Most buffers of each side one batched call may take: the CUDA kernel
// receives the pointers as a launch parameter (8 KiB), not through memory.
constexpr int64_t kMaxBuffersPerSide = 512;

// Destination addresses a copy by address accepts: below 64 KiB lies the null page and what
// Linux never maps (vm.mmap_min_addr), and user-space addresses of x86-64 and AArch64 (57-bit
// at most, negative values none) stay below 2^56. Anything else is not memory of this process.
constexpr int64_t kMinAddress = int64_t{1} << 16;
constexpr int64_t kAddressLimit = int64_t{1} << 56;

// As CheckSegmentsInBounds, per buffer: at most kMaxBuffersPerSide buffers a side, indices
// in range, the sixth column 0, every row inside its two buffers.
Status CheckBufferSegmentsInBounds(const BufferSegment* segments, int64_t count,
                                   const std::vector<int64_t>& src_bytes,
                                   const std::vector<int64_t>& dst_bytes);

// CheckBufferSegmentsInBounds, and no two rows write the same byte of one destination buffer.
Status ValidateBufferSegments(const BufferSegment* segments, int64_t count,
                              const std::vector<int64_t>& src_bytes,
                              const std::vector<int64_t>& dst_bytes);

std::vector<BufferSegment> SplitBufferSegments(const BufferSegment* segments, int64_t count,
                                               int64_t max_piece = kMaxPieceBytes);

}  // namespace amem::copy
