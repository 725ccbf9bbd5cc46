#pragma once

#include <cstdint>

#include "copy/segments.h"

namespace amem::copy {

// Copies every row on the calling thread, between the buffers the rows index. Rows must
// already be checked against the buffers.
void CopyBufferSegmentsOnHost(const char* const* sources, char* const* destinations,
                              const BufferSegment* segments, int64_t count);

}  // namespace amem::copy
