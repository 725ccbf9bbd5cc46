#include "copy/copy_cpu.h"

#include <cstring>

namespace amem::copy {

void CopySegmentsOnHost(const char* src, char* dst, const Segment* segments, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(dst + segments[i].dst_offset, src + segments[i].src_offset, segments[i].bytes);
  }
}

void CopyBufferSegmentsOnHost(const char* const* sources, char* const* destinations,
                              const BufferSegment* segments, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const BufferSegment& s = segments[i];
    std::memcpy(destinations[s.dst_index] + s.dst_offset, sources[s.src_index] + s.src_offset, s.bytes);
  }
}

}  // namespace amem::copy
