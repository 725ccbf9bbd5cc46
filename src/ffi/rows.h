// Row tables as the FFI handlers receive them, and the checks memory safety needs.
//
// A table is int64 rows carried as uint32 pairs (JAX without x64 would narrow an int64
// operand): copy::BufferSegment rows (six int64) for the byte-copy and NCCL bucket targets,
// copy::AffineRow rows for the affine ones; the bulk rows of segment_copy_to_addresses come as
// an int64 attribute. Rows are validated once, where they are made (jax_amem.copy: bounds, positive
// sizes, no two rows writing one byte). A handler that reads a table on the host checks only
// what keeps the copy inside its buffers: whole rows, indices and byte ranges in bounds.
// Overlapping rows race but stay inside their buffers, so they are not checked again. A table
// in device memory is not read on the host at all: the kernels skip rows out of range.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "copy/affine.h"
#include "copy/segments.h"
#include "ffi/status_adapter.h"
#include "xla/ffi/api/ffi.h"

namespace amem::ffi_adapter {

template <typename Row>
struct Rows {
  const Row* data;
  int64_t count;
};

template <typename Row>
constexpr int64_t kWordsPerRow = sizeof(Row) / sizeof(uint32_t);

template <typename Row>
Rows<Row> RowsOf(const xla::ffi::Buffer<xla::ffi::U32>& table) {
  return {reinterpret_cast<const Row*>(table.untyped_data()),
          static_cast<int64_t>(table.element_count()) / kWordsPerRow<Row>};
}

inline Rows<copy::BufferSegment> RowsOf(xla::ffi::Span<const int64_t> attribute) {
  constexpr int64_t kInt64PerRow = sizeof(copy::BufferSegment) / sizeof(int64_t);
  return {reinterpret_cast<const copy::BufferSegment*>(attribute.begin()),
          static_cast<int64_t>(attribute.size()) / kInt64PerRow};
}

// A table must hold whole rows: a partial last row would be dropped silently.
template <typename Row>
xla::ffi::Error WholeRows(const xla::ffi::Buffer<xla::ffi::U32>& table, const std::string& target) {
  const auto words = static_cast<int64_t>(table.element_count());
  if (words % kWordsPerRow<Row> == 0) return xla::ffi::Error::Success();
  return xla::ffi::Error::InvalidArgument(
      target + ": the row table holds " + std::to_string(words) + " uint32, not a multiple of " +
      std::to_string(kWordsPerRow<Row>) + " (whole rows of int64 carried as uint32 pairs)");
}

// Host tables only: every row inside its buffers.
inline xla::ffi::Error InBounds(Rows<copy::BufferSegment> rows,
                                const std::vector<int64_t>& source_bytes,
                                const std::vector<int64_t>& destination_bytes) {
  return ToFfiError(copy::CheckBufferSegmentsInBounds(rows.data, rows.count, source_bytes,
                                                      destination_bytes));
}

// An affine table operand (uint32: `programs` programs, then float64 constants), in place.
inline copy::AffineTable AffineTableOf(const xla::ffi::Buffer<xla::ffi::U32>& table, int64_t programs) {
  return copy::AffineTableAt(table.untyped_data(), static_cast<int64_t>(table.size_bytes()), programs);
}

// Host tables only: whole affine rows, a sane table, every row inside its buffers.
inline xla::ffi::Error AffineInBounds(const xla::ffi::Buffer<xla::ffi::U32>& rows, const copy::AffineTable& table,
                                      const std::vector<int64_t>& source_bytes,
                                      const std::vector<int64_t>& destination_bytes, const std::string& target) {
  if (xla::ffi::Error whole = WholeRows<copy::AffineRow>(rows, target); whole.failure()) return whole;
  if (xla::ffi::Error checked = ToFfiError(copy::CheckAffineTable(table)); checked.failure()) return checked;
  const auto list = RowsOf<copy::AffineRow>(rows);
  return ToFfiError(copy::CheckAffineRowsInBounds(list.data, list.count, table, source_bytes, destination_bytes));
}

}  // namespace amem::ffi_adapter
