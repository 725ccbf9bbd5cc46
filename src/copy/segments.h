// A segment is one contiguous byte run copied from one of several source buffers into one of
// several destination buffers. Tables of segments are the unit every executor runs: the CPU
// loop, the CUDA kernel, the direct launch and the NCCL bucket pipes. A copy between two
// buffers is the case of one buffer a side (indices 0).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace amem::copy {

// Stored as six int64 per row so a table is also a plain (n, 6) int64 array that XLA can
// carry as an operand: one XLA custom call, one kernel launch, for a whole group of a model's
// weights.
struct BufferSegment {
  int64_t src_index;
  int64_t dst_index;
  int64_t src_offset;
  int64_t dst_offset;
  int64_t bytes;
  int64_t reserved;  // keeps rows 16-byte aligned; must be 0
};
static_assert(sizeof(BufferSegment) == 6 * sizeof(int64_t), "BufferSegment must be six packed int64");

// Largest piece one CUDA block copies. Splitting big segments into pieces of
// this size balances one kernel launch across all multiprocessors whatever the
// mix of segment sizes. A multiple of 16 so that split points keep alignment.
constexpr int64_t kMaxPieceBytes = 256 * 1024;

// Most buffers of each side one batched call may take: the CUDA kernel
// receives the pointers as a launch parameter (8 KiB), not through memory.
constexpr int64_t kMaxBuffersPerSide = 512;

// Destination addresses a copy by address accepts: below 64 KiB lies the null page and what
// Linux never maps (vm.mmap_min_addr), and user-space addresses of x86-64 and AArch64 (57-bit
// at most, negative values none) stay below 2^56. Anything else is not memory of this process.
constexpr int64_t kMinAddress = int64_t{1} << 16;
constexpr int64_t kAddressLimit = int64_t{1} << 56;

// The one check of a copy by address's destinations, run where the call is made (jax_amem.copy,
// through the binding core.copy.check_destinations) before any byte moves: sizes not negative,
// the address of every non-empty destination in [kMinAddress, kAddressLimit). The message
// names the first destination at fault, its address in hex, and what to give instead.
Status CheckDestinations(const int64_t* addresses, const int64_t* sizes, int64_t count);

// Checks what a copy needs to stay inside its memory: at most kMaxBuffersPerSide buffers a
// side, indices in range, the sixth column 0, every row of positive length inside its two
// buffers. The message names the first offending row.
Status CheckBufferSegmentsInBounds(const BufferSegment* segments, int64_t count,
                                   const std::vector<int64_t>& src_bytes,
                                   const std::vector<int64_t>& dst_bytes);

// CheckBufferSegmentsInBounds, and no two rows write the same byte of one destination buffer.
Status ValidateBufferSegments(const BufferSegment* segments, int64_t count,
                              const std::vector<int64_t>& src_bytes,
                              const std::vector<int64_t>& dst_bytes);

// Splits rows longer than `max_piece` into consecutive pieces; keeps order.
std::vector<BufferSegment> SplitBufferSegments(const BufferSegment* segments, int64_t count,
                                               int64_t max_piece = kMaxPieceBytes);

// The rows of a copy by address, validated as one table (ValidateBufferSegments) and split two
// ways, each in the rows' order: `bulk` the rows of at least `bulk_bytes`, whole (one driver copy
// each), `pieces` the others split into pieces of at most `max_piece` (one kernel launch).
Status PrepareAddressRows(const BufferSegment* segments, int64_t count, const std::vector<int64_t>& src_bytes,
                          const std::vector<int64_t>& dst_bytes, int64_t bulk_bytes, int64_t max_piece,
                          std::vector<BufferSegment>* bulk, std::vector<BufferSegment>* pieces);

}  // namespace amem::copy
