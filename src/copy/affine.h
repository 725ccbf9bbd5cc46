// Constant steps applied while copying (jax_amem/reshard/affine.py): rows of elements read in
// the source's dtype, run through a program of at most kMaxAffineSteps steps (multiply, divide,
// add, subtract by a constant: a scalar, or a vector along one axis of the source view), each
// rounded to its dtype, and written in the destination's dtype. Computed in float32, or float64
// where the source or the destination is float64. One interface, two implementations: the CPU loop (affine_cpu.cc)
// and the CUDA kernel (affine_cuda.cu); the FFI handlers and the NCCL sender call them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "copy/segments.h"

namespace amem::copy {

enum AffineDtype : int64_t { kAffineF32 = 0, kAffineBf16 = 1, kAffineF16 = 2, kAffineF64 = 3 };
enum AffineOp : int64_t { kAffineMul = 0, kAffineDiv = 1, kAffineAdd = 2, kAffineSub = 3, kAffineRsub = 4 };
constexpr int64_t kMaxAffineSteps = 8;

struct AffineStep {
  int64_t op;        // AffineOp
  int64_t dtype;     // AffineDtype the step runs in: its input and result are rounded to it
  int64_t constant;  // index of the step's first value in the constants
  int64_t stride;    // a vector: elements of the view between its coordinates; 0: a scalar
  int64_t extent;    // a vector: its length (coordinates of the view's axis); a scalar: 1
  int64_t rounding;  // kRoundInput | kRoundResult: the roundings that are not no-ops (the host
                     // leaves out rounding a value its dtype already holds exactly)
};
constexpr int64_t kRoundInput = 1;
constexpr int64_t kRoundResult = 2;

struct AffineProgram {
  int64_t src_dtype;  // AffineDtype of the source elements
  int64_t dst_dtype;  // AffineDtype written
  int64_t wide;       // 1: compute in float64 (the source or the destination is), 0: in float32
  int64_t steps;      // 1 .. kMaxAffineSteps
  AffineStep step[kMaxAffineSteps];
};
static_assert(sizeof(AffineProgram) == 52 * sizeof(int64_t), "AffineProgram must be 52 packed int64");

// A row: `count` elements from source `src_index` at element `src_element` (of the source
// view, in its dtype; also the element number vectors are indexed by) into destination
// `dst_index` at element `dst_element` (in its dtype), through program `program`.
struct AffineRow {
  int64_t src_index;
  int64_t dst_index;
  int64_t src_element;
  int64_t dst_element;
  int64_t count;
  int64_t program;
};
static_assert(sizeof(AffineRow) == 6 * sizeof(int64_t), "AffineRow must be six packed int64");

// Programs, then the float64 constants they index, as one table (an operand).
struct AffineTable {
  const AffineProgram* programs;
  int64_t program_count;
  const double* constants;
  int64_t constant_count;
};

// The table laid out in `bytes` bytes at `data` holding `programs` programs.
AffineTable AffineTableAt(const void* data, int64_t bytes, int64_t programs);

// Elements one CUDA block takes at most (a multiple of 8: pieces keep the vector alignment).
constexpr int64_t kMaxPieceElements = 64 * 1024;

int64_t AffineDtypeBytes(int64_t dtype);  // 0 for an unknown code

// Rows split into consecutive pieces of at most `max_piece` elements, in order: the split
// jax_amem.affine_copy.prepare_rows makes before a call, for C++ callers (the kernel's benchmark
// and tests); by the byte rows' splitter, since an affine row's element columns split alike.
std::vector<AffineRow> SplitAffineRows(const AffineRow* rows, int64_t count, int64_t max_piece = kMaxPieceElements);

// Host checks (the CPU handlers; the Python side checks the same before building a call):
// every program well formed (dtypes, ops, step count, constants inside the table), every row
// naming a program and buffers that exist, in bounds of both buffers by their dtypes.
Status CheckAffineTable(const AffineTable& table);
Status CheckAffineRowsInBounds(const AffineRow* rows, int64_t count, const AffineTable& table,
                               const std::vector<int64_t>& source_bytes,
                               const std::vector<int64_t>& destination_bytes);

// The CPU loop: rows checked above.
void AffineCopyOnHost(const char* const* sources, char* const* destinations, const AffineRow* rows,
                      int64_t count, const AffineTable& table);

}  // namespace amem::copy
