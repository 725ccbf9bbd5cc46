// Replica choice: which owner holding a source box sends each piece of it.
#pragma once

#include <cstdint>
#include <vector>

#include "reshard/problem.h"

namespace amem::reshard {

// One destination region read from one source box: piece p, destination box e,
// receiving owner q, the region (destination coordinates) and its bytes.
struct Item {
  int64_t piece, dst_box, receiver;
  Box region;
  int64_t bytes;
};

// A part of an item (the whole item or a band of its rows) and who sends it.
struct Part {
  const Item* item;
  Box region;
  int64_t sender;
};

// The replica rule of jax_amem/reshard/reference.py (module docstring, step 2):
// same device first, then an owner of the receiver's process, then any, each
// class's bytes cut evenly over its candidates. Depends only on (source, box)
// and its items, so every rank reaches the same choice alone.
void AssignReplicas(const Problem& problem, int64_t source, int64_t box, const std::vector<Item>& items,
                    std::vector<Part>* out);

uint64_t SplitMix64(uint64_t x);

}  // namespace amem::reshard
