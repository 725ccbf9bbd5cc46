// The fused transpose-and-cast kernel (transpose.h): one launch for a table of rows. Each block
// takes work units in turn: a 64x64 tile of a transposed view (read from the source along its
// rows into shared memory, converted, written along the view's rows: both sides coalesced), or
// a run of a cast. The conversions are CUDA's round-to-nearest-even instructions, the ones
// XLA's convert compiles to on the GPU. Rows with a program of constant steps run in kernels of
// their own (one per dtype pair): each element goes through the affine kernel's arithmetic
// (affine_kernel.h: the same steps, roundings and conversions, the _rn intrinsics) where the
// plain kernels convert it, with the row's program in shared memory; a program of scalar
// steps and no division (a query scale) takes the short path, its constants read once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "copy/affine_kernel.h"
#include "copy/kernel_launch.h"
#include "copy/transpose.h"
#include "copy/transpose_tuning.h"

namespace amem::copy {
namespace {

// The kernel's shape, measured fastest on an H100 by scripts/tune_transpose.sh (the real-size
// swap's 310 rows at 102% of memcpy's rate, against 90% with 8 warps, 4 blocks, no row hint and
// no vector tiles; 56 registers, nothing spilled; docs/benchmarks.md): 64x64 tiles, blocks of 4
// warps (one warp spans a tile row, so that each access is coalesced), 8 blocks kept resident a
// multiprocessor (registers capped to fit: with 16 loads a thread in flight, enough bytes in
// flight to keep HBM busy) and 8 launched a multiprocessor, each looping over the units.
constexpr int kTile = static_cast<int>(kTransposeTile);
constexpr int kThreadsX = 32, kThreadsY = 4, kThreads = kThreadsX * kThreadsY;
constexpr int kBlocksPerMultiprocessor = 8;
constexpr int kGridPerMultiprocessor = kBlocksPerMultiprocessor;
// A kernel's resident blocks: the stepped ones' apart (transpose_tuning.h).
template <typename K>
constexpr int kResidentBlocks = K::kSteps ? AMEM_TRANSPOSE_STEPPED_BLOCKS_PER_SM : kBlocksPerMultiprocessor;
static_assert(kTile == 64, "the tile is 64 elements square");
static_assert(AMEM_TRANSPOSE_STEPPED_BLOCKS_PER_SM >= 1 && AMEM_TRANSPOSE_STEPPED_BLOCKS_PER_SM <= 16,
              "AMEM_TRANSPOSE_STEPPED_BLOCKS_PER_SM is 1 to 16 (blocks of 128 threads a multiprocessor)");
static_assert(AMEM_TRANSPOSE_STEPPED_VECTOR == 0 || AMEM_TRANSPOSE_STEPPED_VECTOR == 1,
              "AMEM_TRANSPOSE_STEPPED_VECTOR is 0 or 1");

struct Same2 {
  static constexpr bool kSteps = false;
  using Source = uint16_t;
  using Destination = uint16_t;
  __device__ static uint16_t Convert(uint16_t v) { return v; }
};
struct Same4 {
  static constexpr bool kSteps = false;
  using Source = uint32_t;
  using Destination = uint32_t;
  __device__ static uint32_t Convert(uint32_t v) { return v; }
};
struct F32ToBF16 {
  static constexpr bool kSteps = false;
  using Source = float;
  using Destination = __nv_bfloat16;
  __device__ static __nv_bfloat16 Convert(float v) { return __float2bfloat16_rn(v); }
};
struct F32ToF16 {
  static constexpr bool kSteps = false;
  using Source = float;
  using Destination = __half;
  __device__ static __half Convert(float v) { return __float2half_rn(v); }
};
struct BF16ToF32 {
  static constexpr bool kSteps = false;
  using Source = __nv_bfloat16;
  using Destination = float;
  __device__ static float Convert(__nv_bfloat16 v) { return __bfloat162float(v); }
};
struct F16ToF32 {
  static constexpr bool kSteps = false;
  using Source = __half;
  using Destination = float;
  __device__ static float Convert(__half v) { return __half2float(v); }
};

// A program's rows: the element types as the affine kernel has them (float, Bf16, F16).
template <typename S, typename D>
struct Stepped {
  static constexpr bool kSteps = true;
  using Source = S;
  using Destination = D;
};

// The row's program as the block holds it (shared memory), for kernels of Stepped rows.
struct Steps {
  const AffineProgram* program;
  const double* constants;
  const float* scalars;  // each step's constant, when `plain`
  bool plain;            // every step a scalar and none a division: no per-element lookup
  bool bf16_product;     // bfloat16 in and out, one exact scale: affine_math::MulBf16
};

// The general path (vector constants, a division): in a function of its own, so that its
// registers do not weigh on the tiles'.
__device__ __noinline__ float GeneralSteps(float x, const AffineProgram* program, const double* constants, int64_t n) {
  float v[1] = {x};
  affine_kernel::RunSteps<float, 1>(v, *program, constants, n);
  return v[0];
}

// The steps on a thread's N elements at once (as the affine kernel runs them: each step's
// operation and roundings chosen once for all N), `n(e)` the view element number of element e.
template <int N, typename Numbers>
__device__ __forceinline__ void RunProgram(float (&v)[N], const Steps& steps, Numbers n) {
  if (steps.plain) {
    const int count = static_cast<int>(steps.program->steps);
    for (int k = 0; k < count; ++k) {
      float c[N];
#pragma unroll
      for (int e = 0; e < N; ++e) c[e] = steps.scalars[k];
      affine_kernel::ApplyStep<float, N, false>(v, steps.program->step[k], c);
    }
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) v[e] = GeneralSteps(v[e], steps.program, steps.constants, n(e));
  }
}

// Source element `x`, view element `n`, as the destination holds it (one element: the cast runs'
// loop and the tiles of the plain conversions).
template <typename K>
__device__ __forceinline__ typename K::Destination Apply(const Steps& steps, typename K::Source x, int64_t n) {
  if constexpr (!K::kSteps) {
    return K::Convert(x);
  } else {
    float v[1] = {affine_math::Load<float>(x)};  // the pairs of this kernel all compute in float32
    RunProgram<1>(v, steps, [n](int) { return n; });
    return affine_math::Store<typename K::Destination, float>::Of(v[0]);
  }
}

// N source elements of a row with a program as the destination holds them: the program on all N
// at once, or, for a bfloat16 row times its exact scale, one bfloat16 multiply an element
// (affine_math.h). `n(e)` is element e's view element number, which vector
// constants look up. The element tiles and the vector tiles both convert through here.
template <typename K, int N, typename Numbers>
__device__ __forceinline__ void StepElements(const typename K::Source (&in)[N], typename K::Destination (&out)[N],
                                             const Steps& steps, Numbers n) {
  using S = typename K::Source;
  using D = typename K::Destination;
  if constexpr (std::is_same_v<S, affine_math::Bf16> && std::is_same_v<D, affine_math::Bf16>) {
    if (steps.bf16_product) {
#pragma unroll
      for (int e = 0; e < N; ++e) out[e] = affine_math::MulBf16(in[e], steps.scalars[0]);
      return;
    }
  }
  float v[N];  // the pairs of this kernel all compute in float32
#pragma unroll
  for (int e = 0; e < N; ++e) v[e] = affine_math::Load<float>(in[e]);
  RunProgram<N>(v, steps, n);
#pragma unroll
  for (int e = 0; e < N; ++e) out[e] = affine_math::Store<D, float>::Of(v[e]);
}

// Padding of a tile row, in elements: a word stride that is odd, so the threads of a warp reading
// down a column of the tile hit every bank once.
template <typename D>
__host__ __device__ constexpr int Pitch() { return sizeof(D) == 2 ? kTile + 2 : kTile + 1; }

constexpr int kRowsPerThread = kTile / kThreadsY;   // 8
constexpr int kColsPerThread = kTile / kThreadsX;   // 2
constexpr int kCastWordsAll = kCastUnit / (4 * kThreads);  // four-element words a thread per cast unit
// Of which a thread loads 8 before it stores them.
constexpr int kCastWords = kCastWordsAll < 8 ? kCastWordsAll : 8;
static_assert(kTile % kThreadsY == 0 && kTile % kThreadsX == 0 && kCastUnit % (4 * kThreads) == 0 &&
              kCastWords >= 1 && kCastWordsAll % kCastWords == 0,
              "tiles and cast units are whole multiples of the block");

// Where tile `unit` of a transposed row lies: matrix b, view rows [j0, +kTile), view columns
// [i0, +kTile). 32-bit division only (the host checked every index fits).
struct TilePlace {
  int64_t b, j0, i0;
};
__device__ __forceinline__ TilePlace PlaceTile(const TransposeRow& row, int64_t unit) {
  const auto u = static_cast<uint32_t>(unit), across_tiles = static_cast<uint32_t>(row.tiles_across);
  const auto down_tiles = static_cast<uint32_t>(row.tiles_down);
  const uint32_t tile_row = static_cast<uint32_t>(row.tile_first) + u / across_tiles;
  const uint32_t b32 = tile_row / down_tiles;
  const int64_t b = b32;
  const int64_t j0 = static_cast<int64_t>(tile_row - b32 * down_tiles) * kTile;
  const int64_t i0 = static_cast<int64_t>(u % across_tiles) * kTile;
  return {b, j0, i0};
}

// Tile `unit` of a transposed row: view rows [j0, j0 + 64) of matrix b, view columns [i0, i0 + 64).
// Every load of the tile is issued before the first is used (16 a thread in flight): one at a
// time would leave HBM mostly idle.
template <typename K>
__device__ void TransposeTile(const TransposeRow& row, int64_t unit, const char* source, char* destination,
                              unsigned char* shared, const Steps& steps) {
  using S = typename K::Source;
  using D = typename K::Destination;
  constexpr int kPitch = Pitch<D>();
  D* tile = reinterpret_cast<D*>(shared);
  const int64_t view_cols = row.rows, view_rows = row.cols, matrix = row.rows * row.cols;
  const auto [b, j0, i0] = PlaceTile(row, unit);
  const int tx = threadIdx.x, ty = threadIdx.y;
  // What is left of the tile past this thread's first row and column (a tile at the edge of the
  // view is cut), and this thread's first element on each side: 64-bit offsets once, then steps.
  const int64_t view_cols_left = view_cols - i0, view_rows_left = view_rows - j0;
  const int down = static_cast<int>(view_cols_left < kTile ? view_cols_left : kTile) - ty;
  const int across = static_cast<int>(view_rows_left < kTile ? view_rows_left : kTile) - tx;
  const S* src = reinterpret_cast<const S*>(source) + b * matrix + (i0 + ty) * view_rows + j0 + tx;
  const int64_t src_step = kThreadsY * view_rows;
  // Read: source rows i (the view's columns), along j (the view's rows): coalesced. This thread's
  // element (r, c), loaded[r * kColsPerThread + c], is view element (b, j0 + tx + c * 32, i0 + ty + r * 8).
  constexpr int kEach = kRowsPerThread * kColsPerThread;
  S loaded[kEach] = {};
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
#pragma unroll
    for (int c = 0; c < kColsPerThread; ++c) {
      if (r * kThreadsY < down && c * kThreadsX < across) {
        loaded[r * kColsPerThread + c] = src[r * src_step + c * kThreadsX];
      }
    }
  }
  if constexpr (K::kSteps) {
    // All of this thread's elements through the program at once (its steps chosen once for all).
    D converted[kEach];
    const int64_t n0 = b * matrix + (j0 + tx) * view_cols + i0 + ty;
    StepElements<K, kEach>(loaded, converted, steps, [&](int e) {
      return n0 + (e % kColsPerThread) * kThreadsX * view_cols + (e / kColsPerThread) * kThreadsY;
    });
#pragma unroll
    for (int e = 0; e < kEach; ++e) {
      const int r = e / kColsPerThread, c = e % kColsPerThread;
      if (r * kThreadsY < down && c * kThreadsX < across) {
        tile[(ty + r * kThreadsY) * kPitch + tx + c * kThreadsX] = converted[e];
      }
    }
  } else {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
#pragma unroll
      for (int c = 0; c < kColsPerThread; ++c) {
        if (r * kThreadsY < down && c * kThreadsX < across) {
          tile[(ty + r * kThreadsY) * kPitch + tx + c * kThreadsX] = K::Convert(loaded[r * kColsPerThread + c]);
        }
      }
    }
  }
  __syncthreads();
  // Write: view rows j, along i: coalesced; only the elements inside [first, first + count).
  // Here this thread's first element is view row j0 + ty, view column i0 + tx.
  const int rows_here = static_cast<int>(view_rows_left < kTile ? view_rows_left : kTile) - ty;
  const int cols_here = static_cast<int>(view_cols_left < kTile ? view_cols_left : kTile) - tx;
  const int64_t at = b * matrix + (j0 + ty) * view_cols + i0 + tx - row.first;  // in the row's elements
  D* dst = reinterpret_cast<D*>(destination + row.dst_offset) + at;
  const int64_t dst_step = kThreadsY * view_cols;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
#pragma unroll
    for (int c = 0; c < kColsPerThread; ++c) {
      const int64_t n = at + r * dst_step + c * kThreadsX;
      if (r * kThreadsY < rows_here && c * kThreadsX < cols_here && n >= 0 && n < row.count) {
        dst[r * dst_step + c * kThreadsX] = tile[(tx + c * kThreadsX) * kPitch + ty + r * kThreadsY];
      }
    }
  }
  __syncthreads();  // the tile is the next unit's
}

// Unit `unit` of a cast row: elements [unit * kCastUnit, +kCastUnit) of the row.
template <typename K>
__device__ void CastRun(const TransposeRow& row, int64_t unit, const char* source, char* destination,
                        const Steps& steps) {
  using S = typename K::Source;
  using D = typename K::Destination;
  const S* src = reinterpret_cast<const S*>(source) + row.first;
  D* dst = reinterpret_cast<D*>(destination + row.dst_offset);
  const int64_t begin = unit * kCastUnit;
  const int64_t end = begin + kCastUnit < row.count ? begin + kCastUnit : row.count;
  const int thread = threadIdx.y * kThreadsX + threadIdx.x;
  // A whole unit with both ends aligned: four elements a thread per wide load and store, every
  // load issued before the first store (as the copy kernel's words).
  struct alignas(4 * sizeof(S)) Loaded { S v[4]; };
  struct alignas(4 * sizeof(D)) Stored { D v[4]; };
  // (Rows with a program take the element loop: the direct launch gives the fused copy only
  // transposed ones, the affine kernel runs the others.)
  if (!K::kSteps && end - begin == kCastUnit && reinterpret_cast<uintptr_t>(src) % sizeof(Loaded) == 0 &&
      reinterpret_cast<uintptr_t>(dst) % sizeof(Stored) == 0) {
    for (int pass = 0; pass < kCastWordsAll; pass += kCastWords) {
      const Loaded* in = reinterpret_cast<const Loaded*>(src + begin) + pass * kThreads;
      Stored* out = reinterpret_cast<Stored*>(dst + begin) + pass * kThreads;
      Loaded words[kCastWords];
#pragma unroll
      for (int w = 0; w < kCastWords; ++w) words[w] = in[thread + w * kThreads];
#pragma unroll
      for (int w = 0; w < kCastWords; ++w) {
        Stored converted;
#pragma unroll
        for (int k = 0; k < 4; ++k) converted.v[k] = Apply<K>(steps, words[w].v[k], 0);
        out[thread + w * kThreads] = converted;
      }
    }
    return;
  }
  for (int64_t n = begin + thread; n < end; n += kThreads) dst[n] = Apply<K>(steps, src[n], row.first + n);
}

constexpr int kVector = 4;

// A vector of source elements as the destination holds them: the plain conversion, or the row's
// program of scalar steps (Steps::plain: no element numbers to look up) as the element tiles run it.
template <typename K>
__device__ __forceinline__ void ConvertVector(const typename K::Source (&in)[kVector],
                                              typename K::Destination (&out)[kVector], const Steps& steps) {
  if constexpr (K::kSteps) {
    StepElements<K, kVector>(in, out, steps, [](int) { return int64_t{0}; });
  } else {
#pragma unroll
    for (int e = 0; e < kVector; ++e) out[e] = K::Convert(in[e]);
  }
}

// A tile four elements a thread per access. A warp spans 8 four-element chunks of 4 lines (one
// 128-byte segment of each of 4 f32 source rows; 64 bytes of each of 4 bf16 view rows): each
// access fills whole sectors. Shared memory holds one element a word, rows T + 1 words apart, so
// that the warp's 32 word accesses, (line + 4 * chunk + element) mod 32, meet 32 banks both when
// it writes a chunk of a source row and when it reads a chunk down a tile column. Rows with a
// program of scalar steps come here too where AMEM_TRANSPOSE_STEPPED_VECTOR is on (ConvertVector).
constexpr int kChunkGroups = kTile / kVector / 8;  // warps across a tile row
constexpr int kVectorLines = kThreads / 32 / kChunkGroups * 4;  // tile rows the block covers at once
constexpr int kVectorPasses = kTile / kVectorLines;
static_assert(kThreads / 32 % kChunkGroups == 0 && kTile % kVectorLines == 0, "the block covers the tile in passes");

// Tile `unit` as TransposeTile has it, if it is whole and both sides' rows start on a whole
// vector; false (nothing done) otherwise: the element path takes it.
template <typename K>
__device__ bool VectorTile(const TransposeRow& row, int64_t unit, const char* source, char* destination,
                           unsigned char* shared, const Steps& steps) {
  using S = typename K::Source;
  using D = typename K::Destination;
  struct alignas(kVector * sizeof(S)) Loaded { S v[kVector]; };
  struct alignas(kVector * sizeof(D)) Stored { D v[kVector]; };
  constexpr int kPitch = kTile + 1;                 // words
  constexpr int kSpread = 4 / static_cast<int>(sizeof(D));  // D elements a word
  D* tile = reinterpret_cast<D*>(shared);
  const int64_t view_cols = row.rows, view_rows = row.cols, matrix = row.rows * row.cols;
  const auto [b, j0, i0] = PlaceTile(row, unit);
  // Where view element 0 of the row would land, as an address: every view row starts a whole
  // vector from it when the view's rows are whole vectors (unsigned: it may lie before the buffer).
  const uintptr_t out0 = reinterpret_cast<uintptr_t>(destination + row.dst_offset) - row.first * sizeof(D);
  if (view_cols - i0 < kTile || view_rows - j0 < kTile || view_rows % kVector != 0 || view_cols % kVector != 0 ||
      reinterpret_cast<uintptr_t>(source) % sizeof(Loaded) != 0 || out0 % sizeof(Stored) != 0) {
    return false;  // the same for every thread of the block: the unit is
  }
  const int thread = threadIdx.y * kThreadsX + threadIdx.x, warp = thread / 32, lane = thread % 32;
  const int chunk = (warp % kChunkGroups) * 8 + lane % 8, line = (warp / kChunkGroups) * 4 + lane / 8;
  // Read: source rows i0 + line + p * kVectorLines, elements j0 + 4 * chunk on; all issued first.
  const S* src = reinterpret_cast<const S*>(source) + b * matrix + (i0 + line) * view_rows + j0 + chunk * kVector;
  Loaded loaded[kVectorPasses];
#pragma unroll
  for (int p = 0; p < kVectorPasses; ++p) {
    loaded[p] = *reinterpret_cast<const Loaded*>(src + p * kVectorLines * view_rows);
  }
#pragma unroll
  for (int p = 0; p < kVectorPasses; ++p) {
    D converted[kVector];
    ConvertVector<K>(loaded[p].v, converted, steps);
#pragma unroll
    for (int e = 0; e < kVector; ++e) {
      tile[((line + p * kVectorLines) * kPitch + chunk * kVector + e) * kSpread] = converted[e];
    }
  }
  __syncthreads();
  // Write: view rows j0 + line + p * kVectorLines, elements i0 + 4 * chunk on; only those inside
  // [first, first + count), a vector that straddles an end element by element.
  const int64_t at = b * matrix + (j0 + line) * view_cols + i0 + chunk * kVector - row.first;
  D* dst = reinterpret_cast<D*>(destination + row.dst_offset);
#pragma unroll
  for (int p = 0; p < kVectorPasses; ++p) {
    Stored out;
#pragma unroll
    for (int e = 0; e < kVector; ++e) {
      out.v[e] = tile[((chunk * kVector + e) * kPitch + line + p * kVectorLines) * kSpread];
    }
    const int64_t n = at + p * kVectorLines * view_cols;
    if (n >= 0 && n + kVector <= row.count) {
      *reinterpret_cast<Stored*>(dst + n) = out;
    } else {
#pragma unroll
      for (int e = 0; e < kVector; ++e) {
        if (n + e >= 0 && n + e < row.count) dst[n + e] = out.v[e];
      }
    }
  }
  __syncthreads();  // the tile is the next unit's
  return true;
}

template <typename K>
__device__ void RunUnit(const TransposeRow& row, int64_t unit, const char* source, char* destination,
                        unsigned char* shared, const Steps& steps) {
  if (row.rows > 1 && row.cols > 1) {
    if constexpr (!K::kSteps || AMEM_TRANSPOSE_STEPPED_VECTOR) {
      // A program with vector constants or a division looks up element numbers: the element path.
      if (!K::kSteps || steps.plain) {
        if (VectorTile<K>(row, unit, source, destination, shared, steps)) return;
      }
    }
    TransposeTile<K>(row, unit, source, destination, shared, steps);
  } else {
    CastRun<K>(row, unit, source, destination, steps);
  }
}

// Kernels of Stepped rows: the row's program into shared memory, with its scalars, when it is
// not there yet (the same in every thread of the block: the unit is). Whether the program can
// run: false for one the table does not hold, or whose constants lie outside it (checked on
// the host: never fault on a bad row).
struct LoadedProgram {
  int64_t index = -1;
  bool runs = false;
};
__device__ bool LoadProgram(int64_t index, const AffineTable& table, AffineProgram* program, float* scalars,
                            LoadedProgram* loaded, Steps* steps) {
  if (index < 0 || index >= table.program_count) return false;
  if (index == loaded->index) return loaded->runs;
  __syncthreads();  // every thread is done with the previous program and scalars
  const int thread = threadIdx.y * kThreadsX + threadIdx.x;
  const auto* words = reinterpret_cast<const int64_t*>(&table.programs[index]);
  for (int w = thread; w < static_cast<int>(sizeof(AffineProgram) / sizeof(int64_t)); w += kThreads) {
    reinterpret_cast<int64_t*>(program)[w] = words[w];
  }
  __syncthreads();
  bool sane = program->steps >= 1 && program->steps <= kMaxAffineSteps && program->wide == 0;
  bool scalar_steps = true;
  for (int64_t s = 0; sane && s < program->steps; ++s) {
    const AffineStep& step = program->step[s];
    const int64_t length = step.stride > 0 ? step.extent : 1;
    sane = step.constant >= 0 && length >= 1 && step.constant <= table.constant_count - length;
    scalar_steps = scalar_steps && step.stride <= 0 && step.op != kAffineDiv;
  }
  if (sane && scalar_steps && thread < program->steps) {
    scalars[thread] = static_cast<float>(table.constants[program->step[thread].constant]);
  }
  __syncthreads();
  steps->plain = scalar_steps;
  steps->bf16_product = sane && scalar_steps && affine_math::IsBf16Product(*program, scalars[0]);
  loaded->index = index;
  loaded->runs = sane;
  return sane;
}

// The device's multiprocessors (read once).
int Multiprocessors() {
  static const int multiprocessors = [] {
    int device = 0, count = 0;
    cudaGetDevice(&device);
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) count = 132;
    return count;
  }();
  return multiprocessors;
}

// Blocks of one launch of kernel K: kGridPerMultiprocessor a multiprocessor, a stepped kernel's
// no more than it keeps resident (it may keep fewer: transpose_tuning.h).
template <typename K>
int Blocks(int64_t units) {
  constexpr int kPerMultiprocessor = K::kSteps && kResidentBlocks<K> < kGridPerMultiprocessor
                                         ? kResidentBlocks<K>
                                         : kGridPerMultiprocessor;
  const int64_t count = int64_t{Multiprocessors()} * kPerMultiprocessor;
  return static_cast<int>(units < count ? units : count);
}

// Rows [0, count) of one conversion; work units [first_unit, first_unit + units) of the table
// they belong to. One kernel per conversion: a kernel holding all six needed twice the
// registers of one (ptxas: 145 against 64), and half the blocks per multiprocessor.
template <typename K>
__global__ void __launch_bounds__(kThreads, kResidentBlocks<K>)
    TransposeKernel(const BufferPointers pointers, const TransposeRow* __restrict__ rows, int64_t count,
                    int64_t first_unit, int64_t units, const AffineTable table) {
  __shared__ __align__(16) unsigned char shared[kTile * (kTile + 1) * 4];  // the largest tile: 4-byte elements
  __shared__ AffineProgram program;  // Stepped rows: the row's program
  __shared__ float scalars[kMaxAffineSteps];
  LoadedProgram loaded;  // the program in `program` (the same in every thread)
  Steps steps{&program, table.constants, scalars, false, false};
  int64_t lo = 0;  // the row of the block's last unit (rows[0] starts at first_unit)
  for (int64_t v = blockIdx.x; v < units; v += gridDim.x) {
    const int64_t u = first_unit + v;
    // The last row whose first unit is at most u. The block's units only grow, so with the hint
    // it is the last unit's row unless the next row starts at or before u.
    int64_t hi = count - 1;
    if (lo == hi || rows[lo + 1].units > u) {
      hi = lo;
    } else {
      ++lo;
    }
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (rows[mid].units <= u) lo = mid; else hi = mid - 1;
    }
    const TransposeRow& row = rows[lo];
    if (row.src_index < 0 || row.dst_index < 0 || row.src_index >= kMaxBuffersPerSide ||
        row.dst_index >= kMaxBuffersPerSide) {
      continue;  // checked on the host; never fault on a bad row
    }
    const char* source = pointers.sources[row.src_index];
    char* destination = pointers.destinations[row.dst_index];
    if (source == nullptr || destination == nullptr) continue;
    if constexpr (K::kSteps) {
      if (!LoadProgram(row.program, table, &program, scalars, &loaded, &steps)) continue;
    }
    RunUnit<K>(row, u - row.units, source, destination, shared, steps);
  }
}

template <typename K>
Status Launch(CUstream stream, const BufferPointers& pointers, const TransposeRow* device_rows, int64_t count,
              int64_t first_unit, int64_t units, const AffineTable& table) {
  if (units == 0) return Status::Ok();
  AMEM_LAUNCH(TransposeKernel<K>, Blocks<K>(units), dim3(kThreadsX, kThreadsY), reinterpret_cast<cudaStream_t>(stream))(
      pointers, device_rows, count, first_unit, units, table);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    return Status::Error(std::string("transpose copy kernel launch failed: ") + cudaGetErrorString(error));
  }
  return Status::Ok();
}

}  // namespace

Status LaunchTransposeRows(CUstream stream, const BufferPointers& pointers, const TransposeRow* host_rows,
                           const TransposeRow* device_rows, int64_t count, int64_t units,
                           const AffineTable& device_table) {
  using affine_math::Bf16;
  using affine_math::F16;
  // One launch per run of rows of one conversion (the rows come sorted by launch).
  for (int64_t a = 0, b = 0; a < count; a = b) {
    while (b < count && host_rows[b].launch == host_rows[a].launch) ++b;
    const int64_t first_unit = host_rows[a].units;
    const int64_t run_units = (b < count ? host_rows[b].units : units) - first_unit;
    const TransposeRow* rows = device_rows + a;
    // The kernels, by launch (transpose.h): the TransposeKinds, then the stepped pairs.
    using Launcher = Status (*)(CUstream, const BufferPointers&, const TransposeRow*, int64_t, int64_t, int64_t,
                                const AffineTable&);
    static constexpr Launcher kLaunchers[kTransposeLaunches] = {
        Launch<Same2>, Launch<Same4>, Launch<F32ToBF16>, Launch<F32ToF16>, Launch<BF16ToF32>, Launch<F16ToF32>,
        Launch<Stepped<float, float>>, Launch<Stepped<Bf16, Bf16>>, Launch<Stepped<F16, F16>>,
        Launch<Stepped<float, Bf16>>, Launch<Stepped<float, F16>>, Launch<Stepped<Bf16, float>>,
        Launch<Stepped<F16, float>>};
    const int64_t launch = host_rows[a].launch;
    if (launch < 0 || launch >= kTransposeLaunches) {
      return Status::Error("transpose copy: a row of unknown kind (rows not checked)");
    }
    const Status launched = kLaunchers[launch](stream, pointers, rows, b - a, first_unit, run_units, device_table);
    if (!launched.ok()) return launched;
  }
  return Status::Ok();
}

}  // namespace amem::copy
