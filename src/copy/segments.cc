#include "copy/segments.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <sstream>
#include <string>

namespace amem::copy {
namespace {

std::string BufferRow(int64_t index, const BufferSegment& s) {
  return "segment " + std::to_string(index) + " (src " + std::to_string(s.src_index) + " offset " +
         std::to_string(s.src_offset) + ", dst " + std::to_string(s.dst_index) + " offset " +
         std::to_string(s.dst_offset) + ", bytes " + std::to_string(s.bytes) + ")";
}

// `value` in hex as Python writes it (-0x8 for -8), so a message shows the address given.
std::string Hex(int64_t value) {
  const uint64_t magnitude = value < 0 ? 0 - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
  std::ostringstream out;
  out << (value < 0 ? "-0x" : "0x") << std::hex << magnitude;
  return out.str();
}

}  // namespace

Status CheckDestinations(const int64_t* addresses, const int64_t* sizes, int64_t count) {
  for (int64_t d = 0; d < count; ++d) {
    if (sizes[d] < 0) {
      return Status::Error("destination " + std::to_string(d) + " has a negative size (" +
                           std::to_string(sizes[d]) + " bytes)");
    }
    if (sizes[d] > 0 && (addresses[d] < kMinAddress || addresses[d] >= kAddressLimit)) {
      return Status::Error("destination " + std::to_string(d) + ": address " + Hex(addresses[d]) +
                           " cannot be memory of this process (user memory lies in [" + Hex(kMinAddress) +
                           ", " + Hex(kAddressLimit) + ")); give a tensor's data_ptr() or an address "
                           "an IPC handle was opened at");
    }
  }
  return Status::Ok();
}

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

Status PrepareAddressRows(const BufferSegment* segments, int64_t count, const std::vector<int64_t>& src_bytes,
                          const std::vector<int64_t>& dst_bytes, int64_t bulk_bytes, int64_t max_piece,
                          std::vector<BufferSegment>* bulk, std::vector<BufferSegment>* pieces) {
  if (Status valid = ValidateBufferSegments(segments, count, src_bytes, dst_bytes); !valid.ok()) return valid;
  std::vector<BufferSegment> short_rows;
  for (int64_t i = 0; i < count; ++i) {
    (segments[i].bytes >= bulk_bytes ? bulk : &short_rows)->push_back(segments[i]);
  }
  *pieces = SplitBufferSegments(short_rows.data(), static_cast<int64_t>(short_rows.size()), max_piece);
  return Status::Ok();
}

}  // namespace amem::copy
