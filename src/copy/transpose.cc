#include <algorithm>
#include <cstring>
#include <string>

#include "copy/affine_kernel.h"
#include "copy/transpose.h"
#include "copy/transpose_convert.h"

namespace amem::copy {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool Transposed(const TransposeRow& row) { return row.rows > 1 && row.cols > 1; }

Status RowError(int64_t index, const std::string& why) {
  return Status::Error("transpose row " + std::to_string(index) + ": " + why);
}

// How a row's elements become the destination's: N consecutive view elements, the first
// being view element `n` (what a vector step's constants are looked up by).
// The plain conversions (transpose_convert.h), on bit patterns.
template <typename S, typename D, D (*F)(S)>
struct Plain {
  using Source = S;
  using Destination = D;
  template <int N>
  void Line(const S (&in)[N], D (&out)[N], int64_t) const {
    for (int u = 0; u < N; ++u) out[u] = F(in[u]);
  }
};

// A program of constant steps: the affine kernel's own per-element work (affine_kernel.h).
template <typename S, typename D>
struct Stepped {
  using Source = S;
  using Destination = D;
  const AffineProgram* program;
  const double* constants;
  template <int N>
  void Line(const S (&in)[N], D (&out)[N], int64_t n) const {
    using C = typename affine_kernel::ComputeOf<S, D>::type;
    C v[N];
    for (int u = 0; u < N; ++u) v[u] = affine_math::Load<C>(in[u]);
    affine_kernel::RunSteps<C, N>(v, *program, constants, n);
    for (int u = 0; u < N; ++u) out[u] = affine_math::Store<D, C>::Of(v[u]);
  }
};

// Source element `from` to destination element `to`, which is view element `n`.
template <typename K>
inline void Put(const K& k, const char* source, int64_t from, char* destination, int64_t to, int64_t n) {
  using S = typename K::Source;
  using D = typename K::Destination;
  S value[1];
  std::memcpy(value, source + from * static_cast<int64_t>(sizeof(S)), sizeof(S));
  D out[1];
  k.template Line<1>(value, out, n);
  std::memcpy(destination + to * static_cast<int64_t>(sizeof(D)), out, sizeof(D));
}

// View elements [begin, end) of a transposed row, to `out` (where view element row.first lands),
// element by element in blocks of 32 view rows by 32 view columns: the source lines a block
// reads stay in cache while its view rows are written. Used for the parts of view rows at the
// ends of a row (and rows of less than one view row).
template <typename K>
void CopyElements(const K& k, const char* source, char* out, const TransposeRow& row, int64_t begin, int64_t end) {
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
        for (int64_t i = lo; i < hi; ++i) Put(k, source, base + i * view_rows, out, at + i - row.first, at + i);
      }
    }
  }
}

// Whole view rows j in [j0, j1) of matrix b (source columns j0..j1 of every source row), to
// `out` as above. In 8 x 8 tiles inside 64 x 64 blocks: a tile's 8 source rows are read as 8
// runs of 8 elements and its 8 view rows written as 8 runs, which the compiler moves in whole
// vectors; element by element (CopyElements) runs at a third of this speed (measured on the
// 2-core CPU machine: 0.9-1.3 against 2.7-3.3 GB/s for a 1024 x 3072 f32 kernel).
template <typename K>
void CopyViewRows(const K& k, const char* source, char* out, const TransposeRow& row, int64_t b, int64_t j0,
                  int64_t j1) {
  using S = typename K::Source;
  using D = typename K::Destination;
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
              S column[kTile];
              for (int64_t r = 0; r < kTile; ++r) column[r] = tile[r][c];
              D line[kTile];
              k.template Line<kTile>(column, line, at(j + c, i) + row.first);
              std::memcpy(out + at(j + c, i) * static_cast<int64_t>(sizeof(D)), line, sizeof(line));
            }
            continue;
          }
          for (int64_t c = j; c < std::min(j + kTile, je); ++c)  // a tile cut by the block's edge
            for (int64_t r = i; r < std::min(i + kTile, ie); ++r)
              Put(k, matrix, r * view_rows + c, out, at(c, r), at(c, r) + row.first);
        }
      }
    }
  }
}

template <typename K>
void CopyRow(const K& k, const char* source, char* destination, const TransposeRow& row) {
  char* out = destination + row.dst_offset;
  if (!Transposed(row)) {
    for (int64_t n = 0; n < row.count; ++n) Put(k, source, row.first + n, out, n, row.first + n);
    return;
  }
  // The whole view rows [g_first, g_end) in tiles, the parts of a view row before and after them
  // element by element.
  const int64_t view_rows = row.cols, view_cols = row.rows, end = row.first + row.count;
  const int64_t g_first = CeilDiv(row.first, view_cols), g_end = end / view_cols;
  if (g_first >= g_end) {
    CopyElements(k, source, out, row, row.first, end);
    return;
  }
  CopyElements(k, source, out, row, row.first, g_first * view_cols);
  for (int64_t g = g_first; g < g_end;) {
    const int64_t b = g / view_rows, j = g % view_rows, j_end = std::min(view_rows, j + g_end - g);
    CopyViewRows(k, source, out, row, b, j, j_end);
    g += j_end - j;
  }
  CopyElements(k, source, out, row, g_end * view_cols, end);
}

// A row with a program, by its stepped pair (TransposeSteppedPair).
void CopySteppedRow(const char* from, char* to, const TransposeRow& row, const AffineTable& table) {
  using affine_math::Bf16;
  using affine_math::F16;
  const AffineProgram* program = &table.programs[row.program];
  const double* constants = table.constants;
  switch (row.launch - kTransposeKinds) {
    case 0: CopyRow(Stepped<float, float>{program, constants}, from, to, row); break;
    case 1: CopyRow(Stepped<Bf16, Bf16>{program, constants}, from, to, row); break;
    case 2: CopyRow(Stepped<F16, F16>{program, constants}, from, to, row); break;
    case 3: CopyRow(Stepped<float, Bf16>{program, constants}, from, to, row); break;
    case 4: CopyRow(Stepped<float, F16>{program, constants}, from, to, row); break;
    case 5: CopyRow(Stepped<Bf16, float>{program, constants}, from, to, row); break;
    case 6: CopyRow(Stepped<F16, float>{program, constants}, from, to, row); break;
    default: break;  // checked: never here
  }
}

template <typename T>
T Same(T value) {
  return value;
}

}  // namespace

int64_t TransposeSteppedPair(int64_t kind, int64_t src, int64_t dst) {
  // The pairs in launch order, each with the kind whose element sizes it has.
  static constexpr int64_t kPairs[kTransposeSteppedPairs][3] = {
      {kAffineF32, kAffineF32, kTransposeCopy4},          {kAffineBf16, kAffineBf16, kTransposeCopy2},
      {kAffineF16, kAffineF16, kTransposeCopy2},          {kAffineF32, kAffineBf16, kTransposeF32ToBF16},
      {kAffineF32, kAffineF16, kTransposeF32ToF16},       {kAffineBf16, kAffineF32, kTransposeBF16ToF32},
      {kAffineF16, kAffineF32, kTransposeF16ToF32}};
  for (int64_t p = 0; p < kTransposeSteppedPairs; ++p) {
    if (kPairs[p][0] == src && kPairs[p][1] == dst && kPairs[p][2] == kind) return p;
  }
  return -1;
}

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
                          const std::vector<int64_t>& dst_bytes, const AffineTable& table, int64_t* total_units) {
  constexpr int64_t kLimit = int64_t{1} << 56;  // no size of this process's memory is larger
  int64_t units = 0;
  for (int64_t k = 0; k < count; ++k) {
    TransposeRow& row = rows[k];
    const int64_t sitem = TransposeSourceItem(row.kind), ditem = TransposeDestinationItem(row.kind);
    if (sitem == 0) return RowError(k, "kind " + std::to_string(row.kind) + " is not a known conversion");
    row.launch = row.kind;
    if (row.program != -1) {
      if (row.program < 0 || row.program >= table.program_count) {
        return RowError(k, "program " + std::to_string(row.program) + " is not one of the " +
                               std::to_string(table.program_count) + " programs of its affine table (-1: none)");
      }
      const AffineProgram& program = table.programs[row.program];
      const int64_t pair = TransposeSteppedPair(row.kind, program.src_dtype, program.dst_dtype);
      if (pair < 0) {
        return RowError(k, "program " + std::to_string(row.program) + " converts dtype code " +
                               std::to_string(program.src_dtype) + " to " + std::to_string(program.dst_dtype) +
                               ", which is not kind " + std::to_string(row.kind) + "'s conversion");
      }
      row.launch = kTransposeKinds + pair;
    }
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
    if (row.dst_offset % ditem != 0) {  // the kernels' element stores there would fault
      return RowError(k, "writes at offset " + std::to_string(row.dst_offset) + ", not a multiple of its " +
                             std::to_string(ditem) + "-byte elements");
    }
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
                   [](const TransposeRow& a, const TransposeRow& b) { return a.launch < b.launch; });
}

void CopyTransposeRowsOnHost(const char* const* sources, char* const* destinations, const TransposeRow* rows,
                             int64_t count, const AffineTable& table) {
  for (int64_t k = 0; k < count; ++k) {
    const TransposeRow& row = rows[k];
    const char* from = sources[row.src_index];
    char* to = destinations[row.dst_index];
    if (row.program >= 0) {
      CopySteppedRow(from, to, row, table);
      continue;
    }
    switch (row.kind) {
      case kTransposeCopy2: CopyRow(Plain<uint16_t, uint16_t, Same<uint16_t>>{}, from, to, row); break;
      case kTransposeCopy4: CopyRow(Plain<uint32_t, uint32_t, Same<uint32_t>>{}, from, to, row); break;
      case kTransposeF32ToBF16: CopyRow(Plain<uint32_t, uint16_t, F32BitsToBF16>{}, from, to, row); break;
      case kTransposeF32ToF16: CopyRow(Plain<uint32_t, uint16_t, F32BitsToF16>{}, from, to, row); break;
      case kTransposeBF16ToF32: CopyRow(Plain<uint16_t, uint32_t, BF16BitsToF32>{}, from, to, row); break;
      case kTransposeF16ToF32: CopyRow(Plain<uint16_t, uint32_t, F16BitsToF32>{}, from, to, row); break;
      default: break;  // checked: never here
    }
  }
}

}  // namespace amem::copy
