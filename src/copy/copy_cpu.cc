#include "copy/copy_cpu.h"

#include <cstring>

namespace amem::copy {

void CopyBufferSegmentsOnHost(const char* const* sources, char* const* destinations,
                              const BufferSegment* segments, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const BufferSegment& s = segments[i];
    std::memcpy(destinations[s.dst_index] + s.dst_offset, sources[s.src_index] + s.src_offset, s.bytes);
  }
}

}  // namespace amem::copy
