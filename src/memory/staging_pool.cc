#include "memory/staging_pool.h"

#include <chrono>
#include <string>

namespace amem::memory {
namespace {

size_t RoundUp(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

HostBlockKind ChooseKind(bool pinned, const std::string& method, Status* status) {
  if (!pinned) return HostBlockKind::kPlain;
  HostBlockKind kind = HostBlockKind::kRegistered;
  *status = ParsePinnedKind(method, &kind);
  return kind;
}

}  // namespace

StagingPool::StagingPool(bool pinned, const std::string& method, int numa_node)
    : pinned_(pinned), blocks_(ChooseKind(pinned, method, &method_status_)) {
  blocks_.set_numa_node(numa_node);
}

StagingPool::~StagingPool() {
  std::lock_guard<std::mutex> growth(growth_mutex_);
  std::lock_guard<std::mutex> lock(mutex_);
  for (Chunk& chunk : chunks_) {
    HostBlock block{chunk.base, chunk.size};
    blocks_.Free(block);
  }
}

StagingPool::Layout StagingPool::Plan(const std::vector<size_t>& sizes) const {
  Layout layout;
  layout.slots.resize(sizes.size());
  std::vector<size_t> cursors;
  for (const Chunk& chunk : chunks_) cursors.push_back(chunk.used);
  size_t current = 0;
  // New blocks: one open block of up to kBlockBytes filled in order; a buffer
  // larger than that gets a block of its own and closes the open one. Blocks
  // are thus filled in the order of `sizes`, which is what lets a later Plan of
  // the same sizes, walking the chunks forward only, find room for each in
  // what this one made (a small buffer placed back into a block opened before
  // a large one would not be found there, and Place after Reserve would pin
  // again: 0.3 s of the first pause of the Qwen3-1.7B preset on the H200).
  size_t open = SIZE_MAX, open_used = 0;
  std::vector<size_t> new_used;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t need = RoundUp(sizes[i], kPlacementAlignment);
    while (current < chunks_.size() && cursors[current] + need > chunks_[current].size) ++current;
    if (current < chunks_.size()) {
      layout.slots[i] = {current, cursors[current]};
      cursors[current] += need;
    } else if (need >= kBlockBytes) {
      layout.slots[i] = {chunks_.size() + new_used.size(), 0};
      new_used.push_back(need);
      open = SIZE_MAX;
    } else {
      if (open == SIZE_MAX || open_used + need > kBlockBytes) {
        open = new_used.size();
        new_used.push_back(0);
        open_used = 0;
      }
      layout.slots[i] = {chunks_.size() + open, open_used};
      open_used += need;
      new_used[open] = open_used;
    }
  }
  for (size_t used : new_used) layout.new_blocks.push_back(RoundUp(used, kChunkGranularity));
  return layout;
}

Status StagingPool::Grow(const std::vector<size_t>& block_sizes) {
  if (block_sizes.empty()) return Status::Ok();
  if (!method_status_.ok()) return method_status_;
  const auto start = std::chrono::steady_clock::now();
  std::vector<HostBlock> made;
  Status status = blocks_.Allocate(block_sizes, &made);
  if (!status.ok()) return status;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard<std::mutex> lock(mutex_);
  for (const HostBlock& block : made) chunks_.push_back(Chunk{block.base, block.size, 0});
  chunk_allocations_ += made.size();
  grow_seconds_ += seconds;
  return Status::Ok();
}

Status StagingPool::Place(const std::vector<size_t>& sizes, std::vector<uintptr_t>* addresses) {
  std::lock_guard<std::mutex> growth(growth_mutex_);
  Layout layout;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    layout = Plan(sizes);
  }
  // Nothing changes if the new blocks cannot be had.
  Status grown = Grow(layout.new_blocks);
  if (!grown.ok()) return grown;
  std::lock_guard<std::mutex> lock(mutex_);
  addresses->assign(sizes.size(), 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto [chunk, offset] = layout.slots[i];
    (*addresses)[i] = reinterpret_cast<uintptr_t>(chunks_[chunk].base + offset);
    const size_t end = offset + RoundUp(sizes[i], kPlacementAlignment);
    if (end > chunks_[chunk].used) chunks_[chunk].used = end;
  }
  size_t in_use = 0;
  for (const Chunk& chunk : chunks_) in_use += chunk.used;
  if (in_use > high_water_) high_water_ = in_use;
  return Status::Ok();
}

Status StagingPool::Reserve(const std::vector<size_t>& sizes) {
  std::lock_guard<std::mutex> growth(growth_mutex_);
  Layout layout;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    layout = Plan(sizes);
  }
  return Grow(layout.new_blocks);
}

void StagingPool::ReleaseAll() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Chunk& chunk : chunks_) chunk.used = 0;
}

Status StagingPool::Free() {
  std::lock_guard<std::mutex> growth(growth_mutex_);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Chunk& chunk : chunks_) {
    if (chunk.used != 0) {
      return Status::Error(
          "the staging pool holds offloaded arrays (a pause is in progress): call "
          "jax_amem.resume() before releasing it");
    }
  }
  for (Chunk& chunk : chunks_) {
    HostBlock block{chunk.base, chunk.size};
    blocks_.Free(block);
  }
  chunks_.clear();
  return Status::Ok();
}

PoolStats StagingPool::Stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  PoolStats stats;
  stats.pinned = pinned_;
  stats.method = HostBlockKindName(blocks_.kind());
  for (const Chunk& chunk : chunks_) {
    stats.reserved_bytes += chunk.size;
    stats.in_use_bytes += chunk.used;
  }
  stats.high_water_bytes = high_water_;
  stats.chunk_count = chunks_.size();
  stats.chunk_allocations = chunk_allocations_;
  stats.grow_seconds = grow_seconds_;
  stats.numa_node = blocks_.numa_node();
  stats.placement_failures = blocks_.placement_failures();
  return stats;
}

}  // namespace amem::memory
