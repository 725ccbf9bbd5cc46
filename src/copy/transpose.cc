#include <algorithm>
#include <cstring>
#include <string>

#include "copy/transpose.h"
#include "copy/transpose_convert.h"

namespace amem::copy {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool Transposed(const TransposeRow& row) { return row.rows > 1 && row.cols > 1; }

Status RowError(int64_t index, const std::string& why) {
  return Status::Error("transpose row " + std::to_string(index) + ": " + why);
}

template <typename S, typename D, D (*Convert)(S)>
inline void Put(const char* source, int64_t from, char* destination, int64_t to) {
  S value;
  std::memcpy(&value, source + from * static_cast<int64_t>(sizeof(S)), sizeof(S));
  const D out = Convert(value);
  std::memcpy(destination + to * static_cast<int64_t>(sizeof(D)), &out, sizeof(D));
}

// View elements [begin, end) of a transposed row, to `out` (where view element row.first lands),
// element by element in blocks of 32 view rows by 32 view columns: the source lines a block
// reads stay in cache while its view rows are written. Used for the parts of view rows at the
// ends of a row (and rows of less than one view row).
template <typename S, typename D, D (*Convert)(S)>
void CopyElements(const char* source, char* out, const TransposeRow& row, int64_t begin, int64_t end) {
  if (begin >= end) return;
  constexpr int64_t kBlock = 32;
  const int64_t view_rows = row.cols, view_cols = row.rows, matrix = row.rows * row.cols;
  const int64_t g_first = begin / view_cols, g_last = (end - 1) / view_cols;  // global view rows
  for (int64_t gb = g_first; gb <= g_last; gb += kBlock) {
    const int64_t g_end = std::min(gb + kBlock, g_last + 1);
    for (int64_t ib = 0; ib < view_cols; ib += kBlock) {
      for (int64_t g = gb; g < g_end; ++g) {
        const int64_t b = g / view_rows, j = g % view_rows, at = g * view_cols;  // view element (g, 0)
        const int64_t lo = std::max(ib, begin - at), hi = std::min({ib + kBlock, view_cols, end - at});
        const int64_t base = b * matrix + j;
        for (int64_t i = lo; i < hi; ++i) Put<S, D, Convert>(source, base + i * view_rows, out, at + i - row.first);
      }
    }
  }
}

// Whole view rows j in [j0, j1) of matrix b (source columns j0..j1 of every source row), to
// `out` as above. In 8 x 8 tiles inside 64 x 64 blocks: a tile's 8 source rows are read as 8
// runs of 8 elements and its 8 view rows written as 8 runs, which the compiler moves in whole
// vectors; element by element (CopyElements) runs at a third of this speed (measured on the
// 2-core CPU machine: 0.9-1.3 against 2.7-3.3 GB/s for a 1024 x 3072 f32 kernel).
template <typename S, typename D, D (*Convert)(S)>
void CopyViewRows(const char* source, char* out, const TransposeRow& row, int64_t b, int64_t j0, int64_t j1) {
  constexpr int64_t kTile = 8, kBlock = 64;
  const int64_t view_rows = row.cols, view_cols = row.rows;
  const char* matrix = source + b * row.rows * row.cols * static_cast<int64_t>(sizeof(S));
  auto at = [&](int64_t j, int64_t i) {  // where view element (b, j, i) lands, in elements from out
    return (b * view_rows + j) * view_cols + i - row.first;
  };
  for (int64_t jb = j0; jb < j1; jb += kBlock) {
    const int64_t je = std::min(jb + kBlock, j1);
    for (int64_t ib = 0; ib < view_cols; ib += kBlock) {
      const int64_t ie = std::min(ib + kBlock, view_cols);
      for (int64_t j = jb; j < je; j += kTile) {
        for (int64_t i = ib; i < ie; i += kTile) {
          if (j + kTile <= je && i + kTile <= ie) {
            S tile[kTile][kTile];
            for (int64_t r = 0; r < kTile; ++r)
              std::memcpy(tile[r], matrix + ((i + r) * view_rows + j) * static_cast<int64_t>(sizeof(S)), sizeof(tile[r]));
            for (int64_t c = 0; c < kTile; ++c) {
              D line[kTile];
              for (int64_t r = 0; r < kTile; ++r) line[r] = Convert(tile[r][c]);
              std::memcpy(out + at(j + c, i) * static_cast<int64_t>(sizeof(D)), line, sizeof(line));
            }
            continue;
          }
          for (int64_t c = j; c < std::min(j + kTile, je); ++c)  // a tile cut by the block's edge
            for (int64_t r = i; r < std::min(i + kTile, ie); ++r) Put<S, D, Convert>(matrix, r * view_rows + c, out, at(c, r));
        }
      }
    }
  }
}

template <typename S, typename D, D (*Convert)(S)>
void CopyRow(const char* source, char* destination, const TransposeRow& row) {
  char* out = destination + row.dst_offset;
  if (!Transposed(row)) {
    for (int64_t n = 0; n < row.count; ++n) Put<S, D, Convert>(source, row.first + n, out, n);
    return;
  }
  // The whole view rows [g_first, g_end) in tiles, the parts of a view row before and after them
  // element by element.
  const int64_t view_rows = row.cols, view_cols = row.rows, end = row.first + row.count;
  const int64_t g_first = CeilDiv(row.first, view_cols), g_end = end / view_cols;
  if (g_first >= g_end) {
    CopyElements<S, D, Convert>(source, out, row, row.first, end);
    return;
  }
  CopyElements<S, D, Convert>(source, out, row, row.first, g_first * view_cols);
  for (int64_t g = g_first; g < g_end;) {
    const int64_t b = g / view_rows, j = g % view_rows, j_end = std::min(view_rows, j + g_end - g);
    CopyViewRows<S, D, Convert>(source, out, row, b, j, j_end);
    g += j_end - j;
  }
  CopyElements<S, D, Convert>(source, out, row, g_end * view_cols, end);
}

template <typename T>
T Same(T value) {
  return value;
}

}  // namespace

int64_t TransposeSourceItem(int64_t kind) {
  switch (kind) {
    case kTransposeCopy2: case kTransposeBF16ToF32: case kTransposeF16ToF32: return 2;
    case kTransposeCopy4: case kTransposeF32ToBF16: case kTransposeF32ToF16: return 4;
    default: return 0;
  }
}

int64_t TransposeDestinationItem(int64_t kind) {
  switch (kind) {
    case kTransposeCopy2: case kTransposeF32ToBF16: case kTransposeF32ToF16: return 2;
    case kTransposeCopy4: case kTransposeBF16ToF32: case kTransposeF16ToF32: return 4;
    default: return 0;
  }
}

int64_t TransposeUnits(const TransposeRow& row) {
  if (row.count <= 0) return 0;
  if (!Transposed(row)) return CeilDiv(row.count, kCastUnit);
  // Tile rows of the view rows [first / rows, last / rows], counted per matrix, times the
  // tiles across a view row.
  const int64_t view_cols = row.rows, view_rows = row.cols;
  const int64_t tiles_down = CeilDiv(view_rows, kTransposeTile);
  const int64_t g0 = row.first / view_cols, g1 = (row.first + row.count - 1) / view_cols;
  const int64_t t0 = (g0 / view_rows) * tiles_down + (g0 % view_rows) / kTransposeTile;
  const int64_t t1 = (g1 / view_rows) * tiles_down + (g1 % view_rows) / kTransposeTile;
  return (t1 - t0 + 1) * CeilDiv(view_cols, kTransposeTile);
}

Status CheckTransposeRows(TransposeRow* rows, int64_t count, const std::vector<int64_t>& src_bytes,
                          const std::vector<int64_t>& dst_bytes, int64_t* total_units) {
  constexpr int64_t kLimit = int64_t{1} << 56;  // no size of this process's memory is larger
  int64_t units = 0;
  for (int64_t k = 0; k < count; ++k) {
    TransposeRow& row = rows[k];
    const int64_t sitem = TransposeSourceItem(row.kind), ditem = TransposeDestinationItem(row.kind);
    if (sitem == 0) return RowError(k, "kind " + std::to_string(row.kind) + " is not a known conversion");
    if (row.src_index < 0 || row.src_index >= static_cast<int64_t>(src_bytes.size())) {
      return RowError(k, "source " + std::to_string(row.src_index) + " is not one of the " +
                             std::to_string(src_bytes.size()) + " sources");
    }
    if (row.dst_index < 0 || row.dst_index >= static_cast<int64_t>(dst_bytes.size())) {
      return RowError(k, "destination " + std::to_string(row.dst_index) + " is not one of the " +
                             std::to_string(dst_bytes.size()) + " destinations");
    }
    if (row.batch < 1 || row.rows < 1 || row.cols < 1 || row.batch >= kLimit || row.rows >= kLimit ||
        row.cols >= kLimit || row.batch > kLimit / row.rows || row.batch * row.rows > kLimit / row.cols) {
      return RowError(k, "shape (" + std::to_string(row.batch) + ", " + std::to_string(row.rows) + ", " +
                             std::to_string(row.cols) + ") is not a shape of memory");
    }
    const int64_t elements = row.batch * row.rows * row.cols;
    if (elements > src_bytes[row.src_index] / sitem) {
      return RowError(k, "its view reads " + std::to_string(elements) + " elements of " + std::to_string(sitem) +
                             " bytes, past the " + std::to_string(src_bytes[row.src_index]) + " bytes of source " +
                             std::to_string(row.src_index));
    }
    if (row.first < 0 || row.count < 0 || row.first > elements || row.count > elements - row.first) {
      return RowError(k, "view elements [" + std::to_string(row.first) + ", +" + std::to_string(row.count) +
                             ") are outside its " + std::to_string(elements));
    }
    const int64_t bytes = dst_bytes[row.dst_index];
    if (row.dst_offset < 0 || row.dst_offset > bytes || row.count > (bytes - row.dst_offset) / ditem) {
      return RowError(k, "writes " + std::to_string(row.count) + " elements of " + std::to_string(ditem) +
                             " bytes at offset " + std::to_string(row.dst_offset) + ", past the " +
                             std::to_string(bytes) + " bytes of destination " + std::to_string(row.dst_index));
    }
    row.units = units;
    row.tiles_down = CeilDiv(row.cols, kTransposeTile);
    row.tiles_across = CeilDiv(row.rows, kTransposeTile);
    row.tile_first = 0;
    if (Transposed(row) && row.count > 0) {
      const int64_t g0 = row.first / row.rows;  // the first view row
      row.tile_first = (g0 / row.cols) * row.tiles_down + (g0 % row.cols) / kTransposeTile;
    }
    row.reserved = 0;
    units += TransposeUnits(row);
    if (units > kMaxTransposeUnits || (Transposed(row) && row.batch > kMaxTransposeUnits / row.tiles_down)) {
      return RowError(k, "too many tiles for one launch (" + std::to_string(units) + " units so far): split the "
                             "swap's destinations into several");
    }
  }
  *total_units = units;
  return Status::Ok();
}

void SortTransposeRows(std::vector<TransposeRow>* rows) {
  std::stable_sort(rows->begin(), rows->end(),
                   [](const TransposeRow& a, const TransposeRow& b) { return a.kind < b.kind; });
}

void CopyTransposeRowsOnHost(const char* const* sources, char* const* destinations, const TransposeRow* rows,
                             int64_t count) {
  for (int64_t k = 0; k < count; ++k) {
    const TransposeRow& row = rows[k];
    const char* from = sources[row.src_index];
    char* to = destinations[row.dst_index];
    switch (row.kind) {
      case kTransposeCopy2: CopyRow<uint16_t, uint16_t, Same<uint16_t>>(from, to, row); break;
      case kTransposeCopy4: CopyRow<uint32_t, uint32_t, Same<uint32_t>>(from, to, row); break;
      case kTransposeF32ToBF16: CopyRow<uint32_t, uint16_t, F32BitsToBF16>(from, to, row); break;
      case kTransposeF32ToF16: CopyRow<uint32_t, uint16_t, F32BitsToF16>(from, to, row); break;
      case kTransposeBF16ToF32: CopyRow<uint16_t, uint32_t, BF16BitsToF32>(from, to, row); break;
      case kTransposeF16ToF32: CopyRow<uint16_t, uint32_t, F16BitsToF32>(from, to, row); break;
      default: break;  // checked: never here
    }
  }
}

}  // namespace amem::copy
