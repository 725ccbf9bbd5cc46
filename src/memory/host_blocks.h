// Large blocks of host memory for the staging pool, made on worker threads.
//
// Why: pinning host memory on one thread runs at ~2 GB/s (8 GiB took ~4.1 s on
// an H200 host), so the first pause of a 17 GiB trainer state spent ~10 s
// there. Separate blocks are
// faulted in and registered with the driver concurrently, and transparent huge
// pages make the kernel fault (and the driver walk) 512x fewer pages.
//
// Kinds:
//   plain       aligned host memory, no driver (machines where JAX has no GPU)
//   registered  mmap + madvise(MADV_HUGEPAGE) + cuMemHostRegister (the default)
//   hostalloc   cuMemHostAlloc (the driver's own allocation; kept as the fallback
//               and for the comparison in benchmarks/pause_resume.py)
// Pinned kinds are portable (valid for every context); the caller keeps device
// 0's primary context retained while pinned blocks exist (HostBlocks does).
#pragma once

#include <atomic>
#include <cstddef>
#include <string>
#include <vector>

#include "common/status.h"

namespace amem::memory {

enum class HostBlockKind { kPlain, kRegistered, kHostAlloc };

// "plain", "registered", "hostalloc".
const char* HostBlockKindName(HostBlockKind kind);
// Parses a name above; "" means the default pinned kind (registered; jax_amem passes
// JAX_AMEM_PINNED_MEMORY's value). Unknown names are an error naming the choices.
Status ParsePinnedKind(const std::string& name, HostBlockKind* kind);

struct HostBlock {
  char* base = nullptr;
  size_t size = 0;
};

// Makes and frees blocks of one kind, and holds device 0's primary context
// while any pinned block exists: freeing memory the driver pinned after its
// context died faults the process (seen as SIGSEGV on a GPU host with JAX on
// its CPU platform, where nothing else retains the context).
class HostBlocks {
 public:
  explicit HostBlocks(HostBlockKind kind) : kind_(kind) {}
  ~HostBlocks();
  HostBlocks(const HostBlocks&) = delete;
  HostBlocks& operator=(const HostBlocks&) = delete;

  HostBlockKind kind() const { return kind_; }
  // The NUMA node new blocks are placed on (memory/numa.h), -1 for the kernel's default;
  // a block made before keeps its pages where they are. Best effort: a refused placement
  // leaves the block where the kernel puts it and is counted (placement_failures()).
  void set_numa_node(int node) { numa_node_ = node; }
  int numa_node() const { return numa_node_; }
  size_t placement_failures() const { return placement_failures_; }
  bool pinned() const { return kind_ != HostBlockKind::kPlain; }

  // One block per size (each a multiple of 2 MiB), made concurrently on up to
  // `max_threads` threads; all or none: on error nothing stays allocated.
  Status Allocate(const std::vector<size_t>& sizes, std::vector<HostBlock>* blocks,
                  int max_threads = 8);
  void Free(HostBlock& block);

 private:
  Status MakeOne(size_t size, HostBlock* block);
  Status RetainContext();
  void ReleaseContextIfUnused();

  const HostBlockKind kind_;
  int numa_node_ = -1;
  std::atomic<size_t> placement_failures_{0};
  size_t live_pinned_blocks_ = 0;  // guarded by the owner's growth lock
  bool context_retained_ = false;
};

}  // namespace amem::memory
