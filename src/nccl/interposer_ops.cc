// Exported NCCL functions that use a communicator: each goes through Guarded()
// (proxy -> real, refused while paused). AMEM_OP(name, (params), (args)) where
// `args` names the communicator `real`; AMEM_COLLECTIVE for the calls that move
// data between ranks (the first after an initialisation is timed: first_use.h).
#include "nccl/guard.h"

using namespace amem::nccl;

#define AMEM_GUARDED(name, params, args, collective)                                   \
  AMEM_EXPORT ncclResult_t name params {                                               \
    return Guarded(                                                                    \
        #name, Real().name != nullptr, comm,                                           \
        [&](ncclComm_t real) { return Real().name args; }, collective);                \
  }
#define AMEM_OP(name, params, args) AMEM_GUARDED(name, params, args, false)
#define AMEM_COLLECTIVE(name, params, args) AMEM_GUARDED(name, params, args, true)

typedef const void* In;
typedef void* Out;
typedef ncclDataType_t T;
typedef ncclRedOp_t Op;
typedef cudaStream_t S;
typedef const ncclCollConfig_t* CC;

AMEM_COLLECTIVE(ncclAllReduce, (In s, Out r, size_t n, T t, Op op, ncclComm_t comm, S st), (s, r, n, t, op, real, st))
AMEM_COLLECTIVE(ncclBroadcast, (In s, Out r, size_t n, T t, int root, ncclComm_t comm, S st), (s, r, n, t, root, real, st))
AMEM_COLLECTIVE(ncclBcast, (Out b, size_t n, T t, int root, ncclComm_t comm, S st), (b, n, t, root, real, st))
AMEM_COLLECTIVE(ncclReduce, (In s, Out r, size_t n, T t, Op op, int root, ncclComm_t comm, S st), (s, r, n, t, op, root, real, st))
AMEM_COLLECTIVE(ncclAllGather, (In s, Out r, size_t n, T t, ncclComm_t comm, S st), (s, r, n, t, real, st))
AMEM_COLLECTIVE(ncclReduceScatter, (In s, Out r, size_t n, T t, Op op, ncclComm_t comm, S st), (s, r, n, t, op, real, st))
AMEM_COLLECTIVE(ncclAlltoAll, (In s, Out r, size_t n, T t, ncclComm_t comm, S st), (s, r, n, t, real, st))
AMEM_COLLECTIVE(ncclGather, (In s, Out r, size_t n, T t, int root, ncclComm_t comm, S st), (s, r, n, t, root, real, st))
AMEM_COLLECTIVE(ncclScatter, (In s, Out r, size_t n, T t, int root, ncclComm_t comm, S st), (s, r, n, t, root, real, st))
AMEM_COLLECTIVE(ncclSend, (In s, size_t n, T t, int peer, ncclComm_t comm, S st), (s, n, t, peer, real, st))
AMEM_COLLECTIVE(ncclRecv, (Out r, size_t n, T t, int peer, ncclComm_t comm, S st), (r, n, t, peer, real, st))

AMEM_COLLECTIVE(ncclAllReduceConfig, (In s, Out r, size_t n, T t, Op op, ncclComm_t comm, S st, CC c), (s, r, n, t, op, real, st, c))
AMEM_COLLECTIVE(ncclBroadcastConfig, (In s, Out r, size_t n, T t, int root, ncclComm_t comm, S st, CC c), (s, r, n, t, root, real, st, c))
AMEM_COLLECTIVE(ncclReduceConfig, (In s, Out r, size_t n, T t, Op op, int root, ncclComm_t comm, S st, CC c), (s, r, n, t, op, root, real, st, c))
AMEM_COLLECTIVE(ncclAllGatherConfig, (In s, Out r, size_t n, T t, ncclComm_t comm, S st, CC c), (s, r, n, t, real, st, c))
AMEM_COLLECTIVE(ncclReduceScatterConfig, (In s, Out r, size_t n, T t, Op op, ncclComm_t comm, S st, CC c), (s, r, n, t, op, real, st, c))
AMEM_COLLECTIVE(ncclAlltoAllConfig, (In s, Out r, size_t n, T t, ncclComm_t comm, S st, CC c), (s, r, n, t, real, st, c))
AMEM_COLLECTIVE(ncclGatherConfig, (In s, Out r, size_t n, T t, int root, ncclComm_t comm, S st, CC c), (s, r, n, t, root, real, st, c))
AMEM_COLLECTIVE(ncclScatterConfig, (In s, Out r, size_t n, T t, int root, ncclComm_t comm, S st, CC c), (s, r, n, t, root, real, st, c))

AMEM_COLLECTIVE(ncclPutSignal, (In s, size_t n, T t, int peer, ncclWindow_t w, size_t off, int sig, int ctx, unsigned flags, ncclComm_t comm, S st), (s, n, t, peer, w, off, sig, ctx, flags, real, st))
AMEM_COLLECTIVE(ncclSignal, (int peer, int sig, int ctx, unsigned flags, ncclComm_t comm, S st), (peer, sig, ctx, flags, real, st))
AMEM_COLLECTIVE(ncclWaitSignal, (int n, ncclWaitSignalDesc_t* descs, ncclComm_t comm, S st), (n, descs, real, st))

AMEM_OP(ncclRedOpCreatePreMulSum, (Op* op, void* scalar, T t, ncclScalarResidence_t where, ncclComm_t comm), (op, scalar, t, where, real))
AMEM_OP(ncclRedOpDestroy, (Op op, ncclComm_t comm), (op, real))
AMEM_OP(ncclCommGetUniqueId, (ncclComm_t comm, ncclUniqueId* id), (real, id))
AMEM_OP(ncclCommQueryProperties, (ncclComm_t comm, ncclCommProperties_t* props), (real, props))
AMEM_OP(ncclWinGetUserPtr, (ncclComm_t comm, ncclWindow_t w, void** out), (real, w, out))
AMEM_OP(ncclCommRevoke, (ncclComm_t comm, int flags), (real, flags))
AMEM_OP(ncclCommMemStats, (ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value), (real, stat, value))
AMEM_OP(ncclCommSuspend, (ncclComm_t comm, int flags), (real, flags))
AMEM_OP(ncclCommResume, (ncclComm_t comm), (real))

// Objects tied to a communicator: counted, because `recreate` would leave them
// pointing at a destroyed communicator (it refuses while any is alive).
#define AMEM_COUNTED_OP(name, params, args, field, delta)                              \
  AMEM_EXPORT ncclResult_t name params {                                               \
    ncclResult_t result = Guarded(#name, Real().name != nullptr, comm,                 \
                                  [&](ncclComm_t real) { return Real().name args; });  \
    if (result == ncclSuccess) {                                                       \
      if (ProxyComm* proxy = Registry::Get().Find(comm)) proxy->field += (delta);      \
    }                                                                                  \
    return result;                                                                     \
  }

AMEM_COUNTED_OP(ncclCommRegister, (const ncclComm_t comm, void* b, size_t n, void** h), (real, b, n, h), registrations, 1)
AMEM_COUNTED_OP(ncclCommDeregister, (const ncclComm_t comm, void* h), (real, h), registrations, -1)
AMEM_COUNTED_OP(ncclCommWindowRegister, (ncclComm_t comm, void* b, size_t n, ncclWindow_t* w, int f), (real, b, n, w, f), windows, 1)
AMEM_COUNTED_OP(ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t w), (real, w), windows, -1)
AMEM_COUNTED_OP(ncclDevCommCreate, (ncclComm_t comm, const ncclDevCommRequirements_t* q, ncclDevComm_t* d), (real, q, d), device_comms, 1)
AMEM_COUNTED_OP(ncclDevCommDestroy, (ncclComm_t comm, const ncclDevComm_t* d), (real, d), device_comms, -1)
