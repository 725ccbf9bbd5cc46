// Rows that read a source through a transposed and/or cast view, written straight into the
// destination: the fused transpose-and-cast copy of the direct launch (direct_launch.h). A
// view XLA would make as a temporary (a Flax kernel (in, out) read as PyTorch's (out, in), cast
// from f32 to bf16) costs one read of the source and one write of the destination here,
// against XLA's read, temporary write, temporary read and write.
//
// A row's view is a batched 2-D transpose of a source read as (batch, rows, cols): view element
// (b, j, i) is source element (b, i, j), so the view is (batch, cols, rows). rows == 1 or
// cols == 1 is no transpose at all (a cast). The row copies view elements [first, first +
// count) to `dst_offset` of its destination, each converted as XLA's convert does
// (round-to-nearest-even; NaN quieted with its sign as the platform's XLA does).
//
// A row may also name a program of constant steps (affine.h: a query scale, a norm offset) in
// the launch's affine table: its elements then go through the program on the way, with the
// affine kernel's arithmetic (affine_kernel.h, one definition for both kernels), instead of the
// plain conversion. A vector step's constant is looked up by view element number, exactly as an
// affine row looks it up in the view XLA would have made (the numbering is the same), so the
// constants keep their source coordinates under the transpose.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "copy/affine.h"
#include "copy/copy_cuda.h"
#include "cuda/driver_types.h"

namespace amem::copy {

// Source -> destination element types a row may convert between.
enum TransposeKind : int64_t {
  kTransposeCopy2 = 0,     // 2-byte elements, same type (bf16, f16, int16)
  kTransposeCopy4 = 1,     // 4-byte elements, same type (f32, int32)
  kTransposeF32ToBF16 = 2,
  kTransposeF32ToF16 = 3,
  kTransposeBF16ToF32 = 4,
  kTransposeF16ToF32 = 5,
  kTransposeKinds = 6,
};

int64_t TransposeSourceItem(int64_t kind);       // bytes per source element
int64_t TransposeDestinationItem(int64_t kind);  // bytes per destination element

// Kernels a table's rows launch as: the plain conversions are kinds 0 .. kTransposeKinds - 1;
// a row with a program launches as kTransposeKinds + its (source, destination) dtype pair's
// number (TransposeSteppedPair): the seven pairs both kernels have (float32, bfloat16 and
// float16 each to itself, float32 to and from the two 16-bit types).
constexpr int64_t kTransposeSteppedPairs = 7;
constexpr int64_t kTransposeLaunches = kTransposeKinds + kTransposeSteppedPairs;
// The pair's number for a program from `src` to `dst` (AffineDtype codes) whose elements are
// `kind`'s sizes, or -1 where the transpose copy has no such conversion.
int64_t TransposeSteppedPair(int64_t kind, int64_t src, int64_t dst);

// A row: given as ten int64 (a plain (n, 10) int64 array from Python), six more filled here.
struct TransposeRow {
  int64_t src_index;   // into the launch's source pointers
  int64_t dst_index;   // into the launch's destination pointers
  int64_t dst_offset;  // bytes: where view element `first` lands
  int64_t first;       // view elements
  int64_t count;
  int64_t batch;       // the source read as (batch, rows, cols), from its first byte
  int64_t rows;
  int64_t cols;
  int64_t kind;        // TransposeKind
  int64_t program;     // -1: the plain conversion; else the program of the launch's affine table
                       // its elements go through (its dtypes are the kind's two types)
  // Set by CheckTransposeRows, so that the kernel divides only 32-bit numbers:
  int64_t units;         // work units of the rows before this one in its table
  int64_t tile_first;    // a transposed row's first tile row (counted over the whole view)
  int64_t tiles_down;    // tile rows per matrix of the view
  int64_t tiles_across;  // tiles across a view row
  int64_t launch;        // the kernel it runs in: its kind, or kTransposeKinds + its stepped pair
  int64_t reserved;      // keeps rows 16-byte aligned
};
// The first ten fields are what callers give (an (n, 10) int64 array from Python).
constexpr int kTransposeRowColumns = 10;
static_assert(sizeof(TransposeRow) == 16 * sizeof(int64_t), "TransposeRow must be sixteen packed int64");
// Most work units one table may have, and most tile rows one view: the kernel's 32-bit indices.
constexpr int64_t kMaxTransposeUnits = (int64_t{1} << 31) - 1;

// Square tile of the GPU kernel's shared-memory transpose (64: 32 ran the real-size swap at 71%
// of memcpy's rate on an H100, 64 at 102%; docs/benchmarks.md), and elements per unit of a cast row.
constexpr int64_t kTransposeTile = 64;
constexpr int64_t kCastUnit = 8192;

// Work units of one row on the GPU: tiles of the view rows it touches, or runs of a cast.
int64_t TransposeUnits(const TransposeRow& row);

// What a row needs to stay inside its memory (the message names the row): a known kind, a
// positive shape, [first, first + count) inside the view, the source at least the view's
// bytes, the destination run inside its buffer, indices in range, at most kMaxTransposeUnits
// units and tile rows; a program that `table` (checked before: CheckAffineTable) holds, whose
// dtypes are a stepped pair of the row's kind. Fills each row's `units` (the prefix the kernel
// searches), tile fields and launch, and returns the table's total in `total_units`.
Status CheckTransposeRows(TransposeRow* rows, int64_t count, const std::vector<int64_t>& src_bytes,
                          const std::vector<int64_t>& dst_bytes, const AffineTable& table, int64_t* total_units);

// Every row on the calling thread (rows checked; `table`: their programs). A row with a
// program computes, so the caller sets the floating-point mode it must match
// (flush_denormals.h); the file is compiled with -ffp-contract=off.
void CopyTransposeRowsOnHost(const char* const* sources, char* const* destinations, const TransposeRow* rows,
                             int64_t count, const AffineTable& table);

// Every row (checked, sorted by launch: SortTransposeRows), one kernel launch per launch kind:
// `device_rows` in device memory, `host_rows` the same rows on the host, `units` their total,
// `device_table` their programs and constants in device memory.
Status LaunchTransposeRows(CUstream stream, const BufferPointers& pointers, const TransposeRow* host_rows,
                           const TransposeRow* device_rows, int64_t count, int64_t units,
                           const AffineTable& device_table);

// Orders rows by launch, keeping their order within one (the rows write disjoint bytes).
void SortTransposeRows(std::vector<TransposeRow>* rows);

}  // namespace amem::copy
