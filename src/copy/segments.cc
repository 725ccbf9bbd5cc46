#include "copy/segments.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>

namespace amem::copy {
namespace {

std::string Row(int64_t index, const Segment& s) {
  return "segment " + std::to_string(index) + " (src_offset=" + std::to_string(s.src_offset) +
         ", dst_offset=" + std::to_string(s.dst_offset) + ", bytes=" + std::to_string(s.bytes) +
         ")";
}

}  // namespace

Status CheckSegmentsInBounds(const Segment* segments, int64_t count, int64_t src_bytes,
                             int64_t dst_bytes) {
  for (int64_t i = 0; i < count; ++i) {
    const Segment& s = segments[i];
    if (s.bytes <= 0) return Status::Error(Row(i, s) + ": bytes must be positive");
    if (s.src_offset < 0 || s.src_offset > src_bytes - s.bytes) {
      return Status::Error(Row(i, s) + ": reads outside the source buffer of " +
                           std::to_string(src_bytes) + " bytes");
    }
    if (s.dst_offset < 0 || s.dst_offset > dst_bytes - s.bytes) {
      return Status::Error(Row(i, s) + ": writes outside the destination buffer of " +
                           std::to_string(dst_bytes) + " bytes");
    }
  }
  return Status::Ok();
}

Status ValidateSegments(const Segment* segments, int64_t count, int64_t src_bytes,
                        int64_t dst_bytes) {
  if (Status bounded = CheckSegmentsInBounds(segments, count, src_bytes, dst_bytes); !bounded.ok()) {
    return bounded;
  }
  std::vector<int64_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return segments[a].dst_offset < segments[b].dst_offset;
  });
  for (int64_t k = 1; k < count; ++k) {
    const Segment& before = segments[order[k - 1]];
    const Segment& after = segments[order[k]];
    if (before.dst_offset + before.bytes > after.dst_offset) {
      return Status::Error(Row(order[k - 1], before) + " and " + Row(order[k], after) +
                           " write overlapping destination bytes");
    }
  }
  return Status::Ok();
}

namespace {

std::string BufferRow(int64_t index, const BufferSegment& s) {
  return "segment " + std::to_string(index) + " (src " + std::to_string(s.src_index) + " offset " +
         std::to_string(s.src_offset) + ", dst " + std::to_string(s.dst_index) + " offset " +
         std::to_string(s.dst_offset) + ", bytes " + std::to_string(s.bytes) + ")";
}

}  // namespace

Status CheckBufferSegmentsInBounds(const BufferSegment* segments, int64_t count,
                                   const std::vector<int64_t>& src_bytes,
                                   const std::vector<int64_t>& dst_bytes) {
  const auto sources = static_cast<int64_t>(src_bytes.size());
  const auto destinations = static_cast<int64_t>(dst_bytes.size());
  if (sources > kMaxBuffersPerSide || destinations > kMaxBuffersPerSide) {
    return Status::Error("a batched copy takes at most " + std::to_string(kMaxBuffersPerSide) +
                         " source and destination buffers; got " + std::to_string(sources) +
                         " and " + std::to_string(destinations) + ": split it into several calls");
  }
  for (int64_t i = 0; i < count; ++i) {
    const BufferSegment& s = segments[i];
    if (s.src_index < 0 || s.src_index >= sources || s.dst_index < 0 || s.dst_index >= destinations) {
      return Status::Error(BufferRow(i, s) + ": buffer index out of range (" +
                           std::to_string(sources) + " sources, " + std::to_string(destinations) +
                           " destinations)");
    }
    if (s.reserved != 0) return Status::Error(BufferRow(i, s) + ": the sixth column must be 0");
    if (s.bytes <= 0) return Status::Error(BufferRow(i, s) + ": bytes must be positive");
    if (s.src_offset < 0 || s.src_offset > src_bytes[s.src_index] - s.bytes) {
      return Status::Error(BufferRow(i, s) + ": reads outside source buffer " +
                           std::to_string(s.src_index) + " of " +
                           std::to_string(src_bytes[s.src_index]) + " bytes");
    }
    if (s.dst_offset < 0 || s.dst_offset > dst_bytes[s.dst_index] - s.bytes) {
      return Status::Error(BufferRow(i, s) + ": writes outside destination buffer " +
                           std::to_string(s.dst_index) + " of " +
                           std::to_string(dst_bytes[s.dst_index]) + " bytes");
    }
  }
  return Status::Ok();
}

Status ValidateBufferSegments(const BufferSegment* segments, int64_t count,
                              const std::vector<int64_t>& src_bytes,
                              const std::vector<int64_t>& dst_bytes) {
  if (Status bounded = CheckBufferSegmentsInBounds(segments, count, src_bytes, dst_bytes);
      !bounded.ok()) {
    return bounded;
  }
  std::vector<int64_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const BufferSegment& x = segments[a];
    const BufferSegment& y = segments[b];
    return x.dst_index != y.dst_index ? x.dst_index < y.dst_index : x.dst_offset < y.dst_offset;
  });
  for (int64_t k = 1; k < count; ++k) {
    const BufferSegment& before = segments[order[k - 1]];
    const BufferSegment& after = segments[order[k]];
    if (before.dst_index == after.dst_index && before.dst_offset + before.bytes > after.dst_offset) {
      return Status::Error(BufferRow(order[k - 1], before) + " and " + BufferRow(order[k], after) +
                           " write overlapping destination bytes");
    }
  }
  return Status::Ok();
}

std::vector<BufferSegment> SplitBufferSegments(const BufferSegment* segments, int64_t count,
                                               int64_t max_piece) {
  std::vector<BufferSegment> pieces;
  pieces.reserve(count);
  for (int64_t i = 0; i < count; ++i) {
    BufferSegment piece = segments[i];
    for (int64_t done = 0; done < segments[i].bytes; done += max_piece) {
      piece.src_offset = segments[i].src_offset + done;
      piece.dst_offset = segments[i].dst_offset + done;
      piece.bytes = std::min(max_piece, segments[i].bytes - done);
      pieces.push_back(piece);
    }
  }
  return pieces;
}

std::vector<Segment> SplitIntoPieces(const Segment* segments, int64_t count, int64_t max_piece) {
  std::vector<Segment> pieces;
  pieces.reserve(count);
  for (int64_t i = 0; i < count; ++i) {
    const Segment& s = segments[i];
    for (int64_t done = 0; done < s.bytes; done += max_piece) {
      pieces.push_back({s.src_offset + done, s.dst_offset + done, std::min(max_piece, s.bytes - done)});
    }
  }
  return pieces;
}

}  // namespace amem::copy
