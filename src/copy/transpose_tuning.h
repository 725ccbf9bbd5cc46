// The fused transpose-and-cast kernel's two options left to measure on a GPU (transpose_cuda.cu,
// docs/roadmap.md), both about the kernels of rows with a program of constant steps (the stepped
// pairs, a query scale). They are for scripts/tune_transpose.sh, which builds the library with
// them and times the scaled swaps; the library builds the defaults. Every other shape of the
// kernel (64x64 tiles, 4 warps, 8 blocks a multiprocessor, the row hint, four-element vector
// tiles, 8 cast words a thread) is fixed in transpose_cuda.cu: measured fastest on an H100
// (docs/benchmarks.md).
#pragma once

// 1: rows with a program of scalar steps and no division (a query scale, a norm offset) take the
// vector tiles too, the program run on each four-element vector (the same bits as the element
// path). Off until timed on a GPU: the scaled transposed swaps run 1.14-1.19x the plain ones on
// the element path (docs/limits.md).
#ifndef AMEM_TRANSPOSE_STEPPED_VECTOR
#define AMEM_TRANSPOSE_STEPPED_VECTOR 0
#endif

// Blocks each multiprocessor keeps resident for the stepped kernels (__launch_bounds__: registers
// capped to 65536 / (128 * this)); their grid is capped to as many a multiprocessor. They compute
// per element and spill at the plain kernels' cap of 8 (ptxas: 64 registers, 114-180 bytes of
// spill stores); 4 spills nothing but was slower on an H100 without the stepped vector tiles
// (docs/benchmarks.md), and is the second build to time with them.
#ifndef AMEM_TRANSPOSE_STEPPED_BLOCKS_PER_SM
#define AMEM_TRANSPOSE_STEPPED_BLOCKS_PER_SM 8
#endif
