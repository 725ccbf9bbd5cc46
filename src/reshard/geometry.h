// Boxes and the strided blocks that copy them between row-major buffers.
#pragma once

#include <cstdint>
#include <vector>

#include "reshard/problem.h"

namespace amem::reshard {

// Block columns: the executor's unit (documented in jax_amem/reshard/blocks.py).
enum BlockColumn { kSrc, kDst, kRun, kN1, kSs1, kDs1, kN0, kSs0, kDs0 };
struct Block {
  int64_t v[kBlockColumns];
};

// a ∩ b into *out; false when empty.
bool Intersect(const Box& a, const Box& b, Box* out);
int64_t Volume(const Box& box);

// Blocks copying `extent` from `src_rel` in a buffer of `src_shape` to `dst_rel`
// in a buffer of `dst_shape`: axes merged while contiguous in both, innermost
// contiguous run, up to two counted strides per block (more become several blocks).
void BoxBlocks(const int64_t* src_shape, const int64_t* src_rel, const int64_t* dst_shape,
               const int64_t* dst_rel, const int64_t* extent, int64_t itemsize,
               std::vector<Block>* out);

// Merges blocks (sorted by destination offset) that continue one another, in place.
void Coalesce(std::vector<Block>* blocks);

}  // namespace amem::reshard
