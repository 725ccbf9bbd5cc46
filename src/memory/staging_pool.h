// A reusable host staging pool for offloaded device buffers.
//
// Why a pool: pinning host memory runs at ~2 GB/s while copies into memory that
// is already pinned run at ~55 GB/s (both measured on an H200 host: 8 GiB
// pinned in ~4.1 s; D2H 54.9, H2D 55.2 GB/s), so pinned memory is allocated
// once, grown only when a pause needs more than it holds, and reused by every
// later pause. It grows in blocks of up to 1 GiB made concurrently
// (host_blocks.h), and Reserve() grows it ahead of a pause, off the critical
// path. On machines where JAX has no GPU the same pool hands out plain host
// memory, so the bookkeeping and the copies are exercised there too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "memory/host_blocks.h"

namespace amem::memory {

// Every placement starts on this boundary (the DMA engines' preferred alignment).
constexpr size_t kPlacementAlignment = 256;
// Blocks are rounded up to this (the huge page size), so small pauses do not pin 1 GiB.
constexpr size_t kChunkGranularity = size_t{2} << 20;
// The pool grows by blocks of at most this (a larger buffer gets a block of its
// own size): large enough that a block's placement waste is small, small enough
// that a 17 GiB growth spreads over the worker threads.
constexpr size_t kBlockBytes = size_t{1} << 30;

struct PoolStats {
  bool pinned = false;
  std::string method;           // host_blocks.h kind: plain, registered, hostalloc
  size_t reserved_bytes = 0;    // held from the OS / driver (all chunks)
  size_t in_use_bytes = 0;      // handed out by Place(), alignment included
  size_t high_water_bytes = 0;  // the most ever in use at once
  size_t chunk_count = 0;
  size_t chunk_allocations = 0;  // chunks ever allocated: stays flat while reused
  double grow_seconds = 0;       // total time spent making chunks (Place and Reserve)
  int numa_node = -1;            // where new blocks are placed (-1: the kernel's default)
  size_t placement_failures = 0;  // blocks the kernel would not place there
};

class StagingPool {
 public:
  // pinned: page-locked memory (needs a GPU), made by `method` ("" = the
  // default, see ParsePinnedKind); else plain host memory. Throws nothing: a bad
  // method is reported by the first call that needs memory. numa_node: the NUMA node its
  // blocks are placed on (memory/numa.h; -1 the kernel's default; not for 'hostalloc', whose
  // memory the driver places).
  explicit StagingPool(bool pinned, const std::string& method = "", int numa_node = -1);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // Places buffers of the given sizes, all or none: on success `addresses`
  // holds one host address per size. Existing chunks are filled first (in
  // order); what does not fit goes into new blocks, made concurrently.
  Status Place(const std::vector<size_t>& sizes, std::vector<uintptr_t>* addresses);

  // Grows the pool so that a later Place(sizes) needs no new memory. Places
  // nothing. A Place() that starts meanwhile waits for it.
  Status Reserve(const std::vector<size_t>& sizes);

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
  // Where each size would go: (chunk index, offset), chunk indexes past the
  // existing ones naming `new_blocks`.
  struct Layout {
    std::vector<std::pair<size_t, size_t>> slots;
    std::vector<size_t> new_blocks;
  };
  Layout Plan(const std::vector<size_t>& sizes) const;  // mutex_ held
  Status Grow(const std::vector<size_t>& block_sizes);  // growth_mutex_ held

  const bool pinned_;
  Status method_status_;
  HostBlocks blocks_;
  std::mutex growth_mutex_;  // one growth (Place, Reserve, Free) at a time
  mutable std::mutex mutex_;  // the chunk table; never held while memory is made
  std::vector<Chunk> chunks_;
  size_t high_water_ = 0;
  size_t chunk_allocations_ = 0;
  double grow_seconds_ = 0;
};

}  // namespace amem::memory
