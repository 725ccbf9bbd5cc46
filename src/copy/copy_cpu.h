#pragma once

#include <cstdint>

#include "copy/segments.h"

namespace amem::copy {

// Copies every segment from `src` to `dst` on the calling thread. Segments
// must already be validated against both buffers.
void CopySegmentsOnHost(const char* src, char* dst, const Segment* segments, int64_t count);

// The same for rows between several buffers (pointers indexed by the rows).
void CopyBufferSegmentsOnHost(const char* const* sources, char* const* destinations,
                              const BufferSegment* segments, int64_t count);

}  // namespace amem::copy
