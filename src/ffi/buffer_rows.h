// The rows of a many-buffer copy (copy::BufferSegment) as FFI handlers receive them: a uint32
// operand in device or host memory (six int64 per row carried as uint32 pairs, so JAX without
// x64 keeps every bit), or an int64 attribute on the host. One decoding for every handler.
#pragma once

#include <cstdint>

#include "copy/segments.h"
#include "xla/ffi/api/ffi.h"

namespace amem::ffi_adapter {

struct BufferRows {
  const copy::BufferSegment* data;
  int64_t count;
};

inline BufferRows RowsOf(const xla::ffi::Buffer<xla::ffi::U32>& table) {
  constexpr int64_t kWordsPerRow = sizeof(copy::BufferSegment) / sizeof(uint32_t);
  return {reinterpret_cast<const copy::BufferSegment*>(table.untyped_data()),
          static_cast<int64_t>(table.element_count()) / kWordsPerRow};
}

inline BufferRows RowsOf(xla::ffi::Span<const int64_t> attribute) {
  constexpr int64_t kWordsPerRow = sizeof(copy::BufferSegment) / sizeof(int64_t);
  return {reinterpret_cast<const copy::BufferSegment*>(attribute.begin()),
          static_cast<int64_t>(attribute.size()) / kWordsPerRow};
}

}  // namespace amem::ffi_adapter
