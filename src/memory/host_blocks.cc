#include "memory/host_blocks.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>

#include "cuda/driver_api.h"
#include "memory/numa.h"

namespace amem::memory {
namespace {

// Transparent huge pages are 2 MiB on x86-64 and the common arm64 kernels; a
// block aligned to that can be backed by huge pages from its first byte.
constexpr size_t kHugePage = size_t{2} << 20;
constexpr int kPrimaryDevice = 0;

// Anonymous memory aligned to kHugePage, asked to use huge pages; untouched
// (the kernel faults it in when the driver pins it, or on first use).
Status MapAligned(size_t size, char** base) {
  void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    return Status::Error("mmap of " + std::to_string(size) + " bytes for the host staging pool "
                         "failed (out of host memory?)");
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + size + kHugePage;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  *base = reinterpret_cast<char*>(aligned);
  // Best effort: without THP (madvise refused, or "never") the block still works.
  madvise(*base, size, MADV_HUGEPAGE);
  return Status::Ok();
}

}  // namespace

const char* HostBlockKindName(HostBlockKind kind) {
  switch (kind) {
    case HostBlockKind::kPlain: return "plain";
    case HostBlockKind::kRegistered: return "registered";
    case HostBlockKind::kHostAlloc: return "hostalloc";
  }
  return "unknown";
}

Status ParsePinnedKind(const std::string& name, HostBlockKind* kind) {
  // JAX_AMEM_PINNED_MEMORY is read in Python (jax_amem/settings.py), which passes it here.
  const std::string chosen = name.empty() ? "registered" : name;
  if (chosen == "registered") {
    *kind = HostBlockKind::kRegistered;
  } else if (chosen == "hostalloc") {
    *kind = HostBlockKind::kHostAlloc;
  } else {
    return Status::Error("unknown pinned memory method '" + chosen +
                         "' (method=): use 'registered' (mmap + huge "
                         "pages + cuMemHostRegister) or 'hostalloc' (cuMemHostAlloc)");
  }
  return Status::Ok();
}

HostBlocks::~HostBlocks() {
  // Blocks are freed by their owner; the context retain is left to process exit,
  // when the driver may already be going away.
}

Status HostBlocks::RetainContext() {
  if (context_retained_) return Status::Ok();
  std::string why;
  const cuda::DriverApi* api = cuda::Driver(&why);
  if (api == nullptr) return Status::Error(why);
  CUdevice device = 0;
  Status status = cuda::Check(api->cuDeviceGet(&device, kPrimaryDevice), "cuDeviceGet");
  if (!status.ok()) return status;
  CUcontext context = nullptr;
  status = cuda::Check(api->cuDevicePrimaryCtxRetain(&context, device),
                       "cuDevicePrimaryCtxRetain for the pinned staging pool");
  context_retained_ = status.ok();
  return status;
}

void HostBlocks::ReleaseContextIfUnused() {
  if (!context_retained_ || live_pinned_blocks_ != 0) return;
  const cuda::DriverApi* api = cuda::Driver();
  CUdevice device = 0;
  if (api != nullptr && api->cuDeviceGet(&device, kPrimaryDevice) == cuda::kSuccess) {
    api->cuDevicePrimaryCtxRelease(device);
  }
  context_retained_ = false;
}

// Runs on a worker thread; pinned kinds have device 0's context current there.
Status HostBlocks::MakeOne(size_t size, HostBlock* block) {
  block->size = size;
  if (kind_ == HostBlockKind::kHostAlloc) {
    void* base = nullptr;
    Status status = cuda::Check(
        cuda::Driver()->cuMemHostAlloc(&base, size, cuda::kMemHostAllocPortable),
        "cuMemHostAlloc for the pinned staging pool");
    if (!status.ok()) {
      return Status::Error(status.message() + " (asked for " + std::to_string(size) +
                           " bytes of pinned host memory)");
    }
    block->base = static_cast<char*>(base);
    return Status::Ok();
  }
  Status mapped = MapAligned(size, &block->base);
  if (!mapped.ok()) return mapped;
  // Before the first touch (the driver's pinning faults the pages in): where they land is decided then.
  if (numa_node_ >= 0 && !PreferNode(block->base, size, numa_node_).ok()) ++placement_failures_;
  if (kind_ == HostBlockKind::kPlain) return mapped;
  Status status = cuda::Check(
      cuda::Driver()->cuMemHostRegister(block->base, size, cuda::kMemHostRegisterPortable),
      "cuMemHostRegister for the pinned staging pool");
  if (!status.ok()) {
    munmap(block->base, size);
    block->base = nullptr;
    return Status::Error(status.message() + " (" + std::to_string(size) +
                         " bytes; is the locked-memory limit, ulimit -l, too low?)");
  }
  return Status::Ok();
}

Status HostBlocks::Allocate(const std::vector<size_t>& sizes, std::vector<HostBlock>* blocks,
                            int max_threads) {
  blocks->assign(sizes.size(), HostBlock{});
  if (sizes.empty()) return Status::Ok();
  if (pinned()) {
    std::string why;
    if (cuda::Driver(&why) == nullptr) return Status::Error(why);
    Status retained = RetainContext();
    if (!retained.ok()) return retained;
  }
  std::vector<Status> results(sizes.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    // The driver pins into the current context's address space bookkeeping.
    std::unique_ptr<cuda::ScopedDeviceContext> context;
    if (pinned()) {
      context = std::make_unique<cuda::ScopedDeviceContext>(kPrimaryDevice);
    }
    for (size_t i = next++; i < sizes.size(); i = next++) {
      results[i] = context && !context->status().ok() ? context->status()
                                                      : MakeOne(sizes[i], &(*blocks)[i]);
    }
  };
  const size_t threads = std::min<size_t>(sizes.size(), std::max(max_threads, 1));
  if (threads == 1) {
    work();
  } else {
    std::vector<std::thread> workers;
    for (size_t t = 0; t < threads; ++t) workers.emplace_back(work);
    for (std::thread& worker : workers) worker.join();
  }
  Status first_error;
  for (const Status& result : results) {
    if (!result.ok()) {
      first_error = result;
      break;
    }
  }
  if (pinned()) live_pinned_blocks_ += sizes.size();
  if (!first_error.ok()) {
    for (HostBlock& block : *blocks) Free(block);
    blocks->clear();
  }
  return first_error;
}

void HostBlocks::Free(HostBlock& block) {
  if (block.base != nullptr) {
    if (kind_ == HostBlockKind::kPlain) {
      munmap(block.base, block.size);
    } else {
      cuda::ScopedDeviceContext context(kPrimaryDevice);
      const cuda::DriverApi* api = cuda::Driver();
      if (kind_ == HostBlockKind::kHostAlloc) {
        api->cuMemFreeHost(block.base);
      } else {
        api->cuMemHostUnregister(block.base);
        munmap(block.base, block.size);
      }
    }
  }
  if (pinned() && live_pinned_blocks_ > 0) --live_pinned_blocks_;
  block = HostBlock{};
  ReleaseContextIfUnused();
}

}  // namespace amem::memory
