#include "copy/affine.h"

#include <string>

namespace amem::copy {

AffineTable AffineTableAt(const void* data, int64_t bytes, int64_t programs) {
  const auto* base = static_cast<const char*>(data);
  const int64_t program_bytes = programs * static_cast<int64_t>(sizeof(AffineProgram));
  if (programs < 0 || program_bytes > bytes) return AffineTable{nullptr, 0, nullptr, 0};
  return AffineTable{reinterpret_cast<const AffineProgram*>(base), programs,
                     reinterpret_cast<const double*>(base + program_bytes),
                     (bytes - program_bytes) / static_cast<int64_t>(sizeof(double))};
}

int64_t AffineDtypeBytes(int64_t dtype) {
  switch (dtype) {
    case kAffineF32: return 4;
    case kAffineBf16: return 2;
    case kAffineF16: return 2;
    case kAffineF64: return 8;
    default: return 0;
  }
}

std::vector<AffineRow> SplitAffineRows(const AffineRow* rows, int64_t count, int64_t max_piece) {
  std::vector<AffineRow> out;
  for (int64_t i = 0; i < count; ++i) {
    const AffineRow& r = rows[i];
    const BufferSegment whole{r.src_index, r.dst_index, r.src_element, r.dst_element, r.count, 0};
    for (const BufferSegment& piece : SplitBufferSegments(&whole, 1, max_piece)) {
      out.push_back({piece.src_index, piece.dst_index, piece.src_offset, piece.dst_offset, piece.bytes, r.program});
    }
  }
  return out;
}

Status CheckAffineTable(const AffineTable& table) {
  if (table.programs == nullptr && table.program_count != 0) {
    return Status::Error("affine copy: the program table is shorter than its programs");
  }
  for (int64_t p = 0; p < table.program_count; ++p) {
    const AffineProgram& program = table.programs[p];
    const std::string where = "affine copy: program " + std::to_string(p);
    if (AffineDtypeBytes(program.src_dtype) == 0 || AffineDtypeBytes(program.dst_dtype) == 0) {
      return Status::Error(where + ": unknown source or destination dtype code");
    }
    if (program.steps < 1 || program.steps > kMaxAffineSteps) {
      return Status::Error(where + ": " + std::to_string(program.steps) + " steps (1 to " +
                           std::to_string(kMaxAffineSteps) + ")");
    }
    const bool wide = program.src_dtype == kAffineF64 || program.dst_dtype == kAffineF64;
    if (program.wide != (wide ? 1 : 0)) {
      return Status::Error(where + ": computed in float64 exactly when its source or destination is (wide)");
    }
    for (int64_t k = 0; k < program.steps; ++k) {
      const AffineStep& step = program.step[k];
      if (step.dtype == kAffineF64 && !wide) {
        return Status::Error(where + ", step " + std::to_string(k) + ": a float64 step between narrower ends");
      }
      if (step.op < kAffineMul || step.op > kAffineRsub || AffineDtypeBytes(step.dtype) == 0) {
        return Status::Error(where + ", step " + std::to_string(k) + ": unknown operation or dtype code");
      }
      const int64_t length = step.stride > 0 ? step.extent : 1;
      if (step.rounding < 0 || step.rounding > (kRoundInput | kRoundResult)) {
        return Status::Error(where + ", step " + std::to_string(k) + ": unknown rounding flags");
      }
      if (step.stride < 0 || length < 1 || step.constant < 0 || step.constant > table.constant_count - length) {
        return Status::Error(where + ", step " + std::to_string(k) + ": its constants lie outside the " +
                             std::to_string(table.constant_count) + " the table holds");
      }
    }
  }
  return Status::Ok();
}

Status CheckAffineRowsInBounds(const AffineRow* rows, int64_t count, const AffineTable& table,
                               const std::vector<int64_t>& source_bytes,
                               const std::vector<int64_t>& destination_bytes) {
  const auto sources = static_cast<int64_t>(source_bytes.size());
  const auto destinations = static_cast<int64_t>(destination_bytes.size());
  for (int64_t i = 0; i < count; ++i) {
    const AffineRow& r = rows[i];
    const std::string row = "affine row " + std::to_string(i);
    if (r.src_index < 0 || r.src_index >= sources || r.dst_index < 0 || r.dst_index >= destinations ||
        r.program < 0 || r.program >= table.program_count) {
      return Status::Error(row + ": buffer or program index out of range");
    }
    const AffineProgram& program = table.programs[r.program];
    const int64_t in = AffineDtypeBytes(program.src_dtype);
    const int64_t out = AffineDtypeBytes(program.dst_dtype);
    if (r.count <= 0 || r.src_element < 0 || r.dst_element < 0 ||
        r.src_element > source_bytes[r.src_index] / in - r.count ||
        r.dst_element > destination_bytes[r.dst_index] / out - r.count) {
      return Status::Error(row + " (" + std::to_string(r.count) + " elements from " +
                           std::to_string(r.src_element) + " to " + std::to_string(r.dst_element) +
                           "): outside its buffers");
    }
  }
  return Status::Ok();
}

}  // namespace amem::copy
