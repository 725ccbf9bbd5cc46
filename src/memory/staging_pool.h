// A reusable host staging pool for offloaded device buffers.
//
// Why a pool: pinning host memory runs at ~2 GB/s while copies into memory that
// is already pinned run at ~55 GB/s (FACTS.md), so pinned memory is allocated
// once, grown only when a pause needs more than it holds, and reused by every
// later pause. On machines without a GPU the same pool hands out plain host
// memory, so the bookkeeping and the copies are exercised there too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "common/status.h"

namespace amem::memory {

// Every placement starts on this boundary (the DMA engines' preferred alignment).
constexpr size_t kPlacementAlignment = 256;
// New chunks are rounded up to this, so small pauses do not pin tiny chunks.
constexpr size_t kChunkGranularity = size_t{2} << 20;

struct PoolStats {
  bool pinned = false;
  size_t reserved_bytes = 0;    // held from the OS / driver (all chunks)
  size_t in_use_bytes = 0;      // handed out by Place(), alignment included
  size_t high_water_bytes = 0;  // the most ever in use at once
  size_t chunk_count = 0;
  size_t chunk_allocations = 0;  // chunks ever allocated: stays flat while reused
};

class StagingPool {
 public:
  // pinned: page-locked memory from the CUDA driver (needs a GPU); else malloc.
  explicit StagingPool(bool pinned);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // Places buffers of the given sizes, all or none: on success `addresses`
  // holds one host address per size. Existing chunks are filled first; what
  // does not fit goes into one new chunk sized for exactly the rest.
  Status Place(const std::vector<size_t>& sizes, std::vector<uintptr_t>* addresses);

  // Every placement is returned; the chunks stay reserved for the next pause.
  void ReleaseAll();

  // Returns every chunk to the OS / driver. Refused while placements are in use.
  Status Free();

  PoolStats Stats() const;

 private:
  struct Chunk {
    char* base = nullptr;
    size_t size = 0;
    size_t used = 0;
  };
  Status AllocateChunk(size_t bytes, Chunk* chunk);
  void FreeChunk(Chunk& chunk);

  const bool pinned_;
  mutable std::mutex mutex_;
  std::vector<Chunk> chunks_;
  size_t high_water_ = 0;
  size_t chunk_allocations_ = 0;
};

}  // namespace amem::memory
