#include "copy/segments.h"

#include <algorithm>
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

Status ValidateSegments(const Segment* segments, int64_t count, int64_t src_bytes,
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
