// Giving the C library's free host memory back to the system after a recreate.
//
// Why: a recreate's teardown frees each communicator's host structures, and its
// re-initialisation allocates them again, on threads that come and go (one per
// teardown here, NCCL's own per init job). glibc keeps what such threads free in
// their arenas, where a later allocation of another size may not fit it, so the
// process's resident memory can climb cycle after cycle without any leak.
// malloc_trim(0) returns every free page of every arena. JAX_AMEM_NCCL_TRIM=0 turns
// it off (to measure what it changes: benchmarks/nccl_pause.py --rss).
#pragma once

namespace amem::nccl {

// Seconds spent (0 when turned off, or without glibc).
double ReturnFreeHostMemory();

}  // namespace amem::nccl
