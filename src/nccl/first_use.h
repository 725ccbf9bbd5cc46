// Timing each communicator's first collective after an initialisation.
//
// Why: NCCL connects a communicator's peers at its first collective (runtime
// connect: the transport's buffers, pinned host memory over sockets), and a
// `recreate` makes it do so again after resume, where a suspend keeps the
// connections. Over sockets at 16 channels that is 0.2-0.8 s a communicator,
// more than a recreate saves on the pause. `auto` adds what the communicator's
// last first collective took to its cost of recreating it (auto_cost.h).
//
// Where the time is read: a collective outside a group connects in its own call;
// inside ncclGroupStart/End (as XLA issues them) NCCL connects at the group's end,
// which is timed and shared among the communicators whose first collective ran in
// it. A nonblocking communicator returns ncclInProgress and connects afterwards: its
// time runs until ncclCommGetAsyncError first answers ncclSuccess for it (XLA polls
// it so), shared among the communicators of that group likewise.
#pragma once

#include "nccl/clock.h"
#include "nccl/comm_registry.h"
#include "nccl/real_nccl.h"

namespace amem::nccl {

// Whether this thread is inside ncclGroupStart/End (the exported pair's depth).
bool InGroup();
// This thread's open group: `handle`'s first collective ran in it.
void NoteFirstUseInGroup(ncclComm_t handle);
// The exported ncclGroupStart / ncclGroupEnd, with this thread's depth kept.
ncclResult_t StartGroup();
ncclResult_t EndGroup();

// What the first collective's call (or its group's end), issued at `start` among
// `shared_by` communicators and `seconds` long, answered: its time (ncclSuccess), a
// connection still in flight (ncclInProgress: nonblocking), or that nothing ran (an
// error: the next collective is the first).
void FirstUseAnswered(ProxyComm& proxy, ncclResult_t result, Clock::time_point start, double seconds,
                      int shared_by);
// ncclCommGetAsyncError answered `state` for `proxy`: a connection in flight ends
// with ncclSuccess (timed) or an error (not timed).
void ConnectAnswered(ProxyComm& proxy, ncclResult_t state);

// Runs `call`, the collective on `proxy` (behind `handle`), timing it when it is the
// communicator's first since its initialisation.
template <typename Call>
ncclResult_t TimeFirstUse(ncclComm_t handle, ProxyComm& proxy, Call&& call) {
  // A plain read first: every collective passes here, and only the first needs the exchange.
  if (!proxy.awaiting_first_use.load(std::memory_order_relaxed) || !proxy.awaiting_first_use.exchange(false)) {
    return call();
  }
  if (InGroup()) {
    NoteFirstUseInGroup(handle);
    return call();
  }
  const auto start = Clock::now();
  const ncclResult_t result = call();
  FirstUseAnswered(proxy, result, start, Since(start), 1);
  return result;
}

}  // namespace amem::nccl
