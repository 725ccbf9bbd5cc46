// Opt-in: keep every communicator suspendable by creating none that shares a
// memory manager. NCCL shares a parent's resources (and memory manager) with
// the children split from it when the parent's config says splitShare=1, which
// XLA's configs do; ncclCommSuspend then refuses the parent and the children.
// With this on, the interposer rewrites splitShare to 0 in every config given
// to a creation or a split, so that splits get their own resources (more
// device memory and a slower split: measured in benchmarks/nccl_pause.py).
#pragma once

#include <cstdint>
#include <vector>

#include "nccl/nccl_types.h"

namespace amem::nccl {

// JAX_AMEM_NCCL_KEEP_SUSPENDABLE=1 in the environment, or SetKeepSuspendable(true).
bool KeepSuspendable();
void SetKeepSuspendable(bool on);
// Configs rewritten so far (shown by `jax_amem.nccl.keep_suspendable()`).
uint64_t KeepSuspendableRewrites();

// The config to hand NCCL: `config` itself, or, when keeping communicators
// suspendable and `config` asks to share, a copy in `storage` with splitShare=0.
ncclConfig_t* WithoutSplitShare(ncclConfig_t* config, std::vector<char>* storage);

}  // namespace amem::nccl
