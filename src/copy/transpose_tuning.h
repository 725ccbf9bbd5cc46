// The fused transpose-and-cast kernel's tunables (transpose_cuda.cu), as macros so that the
// kernel benchmark (benchmarks/transpose_kernel.cu, scripts/tune_transpose.sh) can build and time
// several configurations in one run. Each default is what the library builds; a build that
// sets one must give the same -D flags to every file of the copy (transpose.cc plans the tiles
// the kernel runs). Every configuration writes the same bits: they change only which thread
// moves which element, and when, never the conversion. The defaults are the configuration
// scripts/tune_transpose.sh measured fastest on an H100 (vector_y4_b8: the real-size swap's 310
// rows at 102% of memcpy's rate, against 90% with 8 warps, 4 blocks, no hint, no vectors; 56
// registers, nothing spilled; docs/benchmarks.md).
#pragma once

// Edge of the square tile (transpose.h's kTransposeTile): 32 or 64 (the tile's shared memory,
// 4 * T * (T + 1) bytes, must stay under the static 48 KB).
#ifndef AMEM_TRANSPOSE_TILE
#define AMEM_TRANSPOSE_TILE 64
#endif

// Warps of a block (threads are 32 x this): one warp spans a tile row, so that each access is
// coalesced; fewer warps give each thread more of the tile to keep in flight.
#ifndef AMEM_TRANSPOSE_THREADS_Y
#define AMEM_TRANSPOSE_THREADS_Y 4
#endif

// Blocks each multiprocessor must keep resident (__launch_bounds__: registers are capped to
// 65536 / (threads * this)); more blocks keep more loads in flight if the cap spills nothing.
#ifndef AMEM_TRANSPOSE_BLOCKS_PER_SM
#define AMEM_TRANSPOSE_BLOCKS_PER_SM 8
#endif

// The same for the kernels of rows with a program of constant steps (the stepped pairs): they
// compute per element and spill at the plain kernels' cap (ptxas: 64 registers, 136 bytes of
// spill stores at 8 blocks); fewer blocks give them more registers, and their grid is capped to
// as many. Measured by benchmarks/swap_scale.py on a library built with it (scripts/gpu_test.sh
// build, CUDAFLAGS).
#ifndef AMEM_TRANSPOSE_STEPPED_BLOCKS_PER_SM
#define AMEM_TRANSPOSE_STEPPED_BLOCKS_PER_SM AMEM_TRANSPOSE_BLOCKS_PER_SM
#endif

// Blocks launched per multiprocessor (each loops over the units); 0: one block per unit, the
// hardware's block scheduler balancing them.
#ifndef AMEM_TRANSPOSE_GRID_PER_SM
#define AMEM_TRANSPOSE_GRID_PER_SM AMEM_TRANSPOSE_BLOCKS_PER_SM
#endif

// Four-element words a thread of a cast unit loads before it stores them (capped at the unit's
// 8192 / (4 * threads)): fewer where a low register cap would spill them.
#ifndef AMEM_TRANSPOSE_CAST_WORDS
#define AMEM_TRANSPOSE_CAST_WORDS 8
#endif

// 1: a block starts the search for its next unit's row at its last unit's row (one load, where a
// table of 310 rows costs nine dependent loads a unit); the same row is found either way.
#ifndef AMEM_TRANSPOSE_ROW_HINT
#define AMEM_TRANSPOSE_ROW_HINT 1
#endif

// 1: whole, aligned tiles of the plain conversions move four elements a thread per access
// (16-byte loads of f32 rows, 8-byte stores of bf16 ones) through shared memory of one word an
// element; cut or misaligned tiles, and rows with programs, stay on the element path.
#ifndef AMEM_TRANSPOSE_VECTOR
#define AMEM_TRANSPOSE_VECTOR 1
#endif

// 1 (with AMEM_TRANSPOSE_VECTOR): rows with a program of scalar steps and no division (a query
// scale, a norm offset) take the vector tiles too, the program run on each four-element vector
// (same bits as the element path). Off until timed on a GPU: the scaled transposed swaps run
// 1.14-1.19x the plain ones on the element path (docs/limits.md); measure with
// F=-DAMEM_TRANSPOSE_STEPPED_VECTOR=1; CUDAFLAGS="$F" CXXFLAGS="$F" bash scripts/gpu_test.sh build swap_scale
#ifndef AMEM_TRANSPOSE_STEPPED_VECTOR
#define AMEM_TRANSPOSE_STEPPED_VECTOR 0
#endif
