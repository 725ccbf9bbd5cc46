// Runs this project's CUDA kernels (src/copy/*.cu) on the CPU, for the kernel emulation test
// (tests/test_kernels_emulated.py): each .cu file is compiled as C++ with this header included
// first. Every CUDA thread of a block is a std::thread; __syncthreads is a barrier of the block's
// threads (a thread that returns leaves it, as an exited CUDA thread no longer counts); the
// blocks of a launch run one after another, so a __shared__ variable (a function-local static
// here) is the running block's alone. "Device" pointers are host pointers.
//
// What this proves: the kernels' index arithmetic, tiling, bounds, work-unit search, shared-memory
// use and arithmetic give, element for element, what the CPU loops give (run with
// AddressSanitizer, any read or write outside the buffers fails). What it does not: timing,
// occupancy, memory coalescing, the _rn intrinsics (the kernels' host branch runs instead), or
// anything of the real hardware.
#pragma once

// Every header the kernels and their includes use, before the macros below: the standard
// library spells its own attributes with names such as __noinline__.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace amem::emulation {

struct Index {
  unsigned x = 0, y = 0, z = 0;
};

inline thread_local Index thread_index, block_index, block_dim, grid_dim;
inline thread_local std::barrier<>* block_barrier = nullptr;

// Multiprocessors the emulated device reports: few, so a launch has few blocks and the kernels'
// grid-stride loops run many units per block.
inline constexpr int kMultiprocessors = 2;

// Runs `body` once per thread of every block of the grid (the kernel's launch): one std::thread
// per thread of a block, which runs its part of each block in turn; the blocks one after another.
template <typename Body>
void RunGrid(dim3 grid, dim3 block, Body body) {
  const unsigned threads = block.x * block.y * block.z;
  const unsigned blocks = grid.x * grid.y * grid.z;
  std::vector<std::unique_ptr<std::barrier<>>> syncs;  // each block's __syncthreads
  for (unsigned b = 0; b < blocks; ++b) syncs.push_back(std::make_unique<std::barrier<>>(threads));
  std::barrier<> next_block(threads);
  std::vector<std::thread> running;
  running.reserve(threads);
  for (unsigned t = 0; t < threads; ++t) {
    running.emplace_back([&, t] {
      thread_index = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
      block_dim = {block.x, block.y, block.z};
      grid_dim = {grid.x, grid.y, grid.z};
      for (unsigned b = 0; b < blocks; ++b) {
        block_index = {b % grid.x, (b / grid.x) % grid.y, b / (grid.x * grid.y)};
        block_barrier = syncs[b].get();
        body();
        syncs[b]->arrive_and_drop();  // done with this block: its later __syncthreads wait for the others
        next_block.arrive_and_wait();
      }
    });
  }
  for (std::thread& thread : running) thread.join();
}

// AMEM_LAUNCH(kernel, grid, block, stream)(arguments...): the kernel run on the grid.
template <typename Kernel>
auto Launch(Kernel kernel, dim3 grid, dim3 block) {
  return [=](auto... arguments) { RunGrid(grid, block, [&] { kernel(arguments...); }); };
}

}  // namespace amem::emulation

#define AMEM_LAUNCH(kernel, grid, block, stream) ::amem::emulation::Launch(kernel, dim3(grid), dim3(block))

#define threadIdx (::amem::emulation::thread_index)
#define blockIdx (::amem::emulation::block_index)
#define blockDim (::amem::emulation::block_dim)
#define gridDim (::amem::emulation::grid_dim)
inline void __syncthreads() { ::amem::emulation::block_barrier->arrive_and_wait(); }

#undef __global__
#define __global__
#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __noinline__
#define __noinline__ __attribute__((noinline))
#undef __forceinline__
#define __forceinline__ inline

inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
