#include "memory/staging_pool.h"

#include <cstdlib>
#include <string>

#include "cuda/driver_api.h"

namespace amem::memory {
namespace {

size_t RoundUp(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

}  // namespace

StagingPool::StagingPool(bool pinned) : pinned_(pinned) {}

StagingPool::~StagingPool() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Chunk& chunk : chunks_) FreeChunk(chunk);
}

Status StagingPool::AllocateChunk(size_t bytes, Chunk* chunk) {
  chunk->size = RoundUp(bytes, kChunkGranularity);
  chunk->used = 0;
  if (!pinned_) {
    chunk->base = static_cast<char*>(std::aligned_alloc(kPlacementAlignment, chunk->size));
    if (chunk->base == nullptr) {
      return Status::Error("the host staging pool could not allocate " +
                           std::to_string(chunk->size) + " bytes of host memory");
    }
    return Status::Ok();
  }
  std::string why;
  const cuda::DriverApi* api = cuda::Driver(&why);
  if (api == nullptr) return Status::Error(why);
  // Portable: the pages count as pinned for every context, so one pool serves all GPUs.
  cuda::ScopedDeviceContext context(0);
  if (!context.status().ok()) return context.status();
  void* base = nullptr;
  Status status = cuda::Check(api->cuMemHostAlloc(&base, chunk->size, cuda::kMemHostAllocPortable),
                              "cuMemHostAlloc for the pinned staging pool");
  if (!status.ok()) {
    return Status::Error(status.message() + " (asked for " + std::to_string(chunk->size) +
                         " bytes of pinned host memory)");
  }
  chunk->base = static_cast<char*>(base);
  return Status::Ok();
}

void StagingPool::FreeChunk(Chunk& chunk) {
  if (chunk.base == nullptr) return;
  if (pinned_) {
    const cuda::DriverApi* api = cuda::Driver();
    if (api != nullptr) api->cuMemFreeHost(chunk.base);
  } else {
    std::free(chunk.base);
  }
  chunk.base = nullptr;
}

Status StagingPool::Place(const std::vector<size_t>& sizes, std::vector<uintptr_t>* addresses) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<size_t> cursors;
  for (const Chunk& chunk : chunks_) cursors.push_back(chunk.used);
  addresses->assign(sizes.size(), 0);
  // First pass: bump-place into the existing chunks; remember what did not fit.
  std::vector<size_t> leftovers;
  size_t leftover_bytes = 0;
  size_t current = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t need = RoundUp(sizes[i], kPlacementAlignment);
    while (current < chunks_.size() && cursors[current] + need > chunks_[current].size) ++current;
    if (current < chunks_.size()) {
      (*addresses)[i] = reinterpret_cast<uintptr_t>(chunks_[current].base + cursors[current]);
      cursors[current] += need;
    } else {
      leftovers.push_back(i);
      leftover_bytes += need;
    }
  }
  // Second pass: one new chunk for the rest. Nothing changes if it cannot be had.
  Chunk fresh;
  if (!leftovers.empty()) {
    Status allocated = AllocateChunk(leftover_bytes, &fresh);
    if (!allocated.ok()) return allocated;
    ++chunk_allocations_;
    for (size_t i : leftovers) {
      (*addresses)[i] = reinterpret_cast<uintptr_t>(fresh.base + fresh.used);
      fresh.used += RoundUp(sizes[i], kPlacementAlignment);
    }
  }
  for (size_t c = 0; c < chunks_.size(); ++c) chunks_[c].used = cursors[c];
  if (fresh.base != nullptr) chunks_.push_back(fresh);
  size_t in_use = 0;
  for (const Chunk& chunk : chunks_) in_use += chunk.used;
  if (in_use > high_water_) high_water_ = in_use;
  return Status::Ok();
}

void StagingPool::ReleaseAll() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Chunk& chunk : chunks_) chunk.used = 0;
}

Status StagingPool::Free() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Chunk& chunk : chunks_) {
    if (chunk.used != 0) {
      return Status::Error(
          "the staging pool holds offloaded arrays (a pause is in progress): call "
          "jax_amem.resume() before releasing it");
    }
  }
  for (Chunk& chunk : chunks_) FreeChunk(chunk);
  chunks_.clear();
  return Status::Ok();
}

PoolStats StagingPool::Stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  PoolStats stats;
  stats.pinned = pinned_;
  for (const Chunk& chunk : chunks_) {
    stats.reserved_bytes += chunk.size;
    stats.in_use_bytes += chunk.used;
  }
  stats.high_water_bytes = high_water_;
  stats.chunk_count = chunks_.size();
  stats.chunk_allocations = chunk_allocations_;
  return stats;
}

}  // namespace amem::memory
