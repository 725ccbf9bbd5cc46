// The one spelling of a kernel launch in this folder's .cu files: nvcc builds it as the <<<>>>
// launch. The kernel emulation test (tests/native/cuda_emulation.h) defines it first, to run
// the very same kernels on CPU threads, one per CUDA thread of each block.
#pragma once

#ifndef AMEM_LAUNCH
#define AMEM_LAUNCH(kernel, grid, block, stream) kernel<<<(grid), (block), 0, (stream)>>>
#endif
