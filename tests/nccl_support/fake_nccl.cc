// A fake NCCL for the CPU tests of the interposer's bookkeeping. It keeps
// communicators in host memory, logs every call, treats buffers as host
// memory, and logs "FAULT" (instead of faulting a GPU) when a destroyed or
// suspended communicator is used. It is never the proof that pause works:
// that is the GPU tests' job, against the real NCCL.
//
// Build: g++ -shared -fPIC [-DFAKE_WITH_SUSPEND] fake_nccl.cc -o libfake_nccl.so
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

extern "C" {
typedef int ncclResult_t;
typedef struct FakeComm* ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef void* cudaStream_t;
}

struct FakeComm {
  int serial;
  int rank;
  int nranks;
  std::string id;
  bool suspended = false;
  // NCCL's rule, emulated: a child split from a parent whose config has
  // splitShare=1 holds the parent's memory manager; ncclCommSuspend refuses a
  // communicator whose manager another live communicator holds.
  int manager = 0;
  bool split_share = false;
  // NCCL connects a communicator's peers at its first collective (in the call, or at
  // the end of the group it ran in): FAKE_NCCL_CONNECT_MS of sleep each, emulated. With
  // FAKE_NCCL_NONBLOCKING=1 every communicator is nonblocking: the call returns
  // ncclInProgress and ncclCommGetAsyncError says so until the time has passed.
  bool connected = false;
  bool blocking = true;
  std::chrono::steady_clock::time_point connected_at{};
};

// The head of ncclConfig_t (nccl.h), enough to read splitShare.
struct FakeConfig {
  size_t size;
  unsigned int magic, version;
  int blocking, cgaClusterSize, minCTAs, maxCTAs;
  const char* netName;
  int splitShare;
};

namespace {
std::mutex mutex;
std::string log_text;
std::set<FakeComm*> live;
std::map<std::string, std::string> mailbox;  // broadcast payloads by communicator id
int next_serial = 1;
int next_id = 1;
int next_manager = 1;
int group_depth = 0;
std::vector<FakeComm*> connecting;  // first collectives inside the open group

// Connects `comms` (FAKE_NCCL_CONNECT_MS each, one after another): 0, or 7 (ncclInProgress)
// where they are nonblocking and connect in the background.
int ConnectNow(const std::vector<FakeComm*>& comms) {
  const char* text = std::getenv("FAKE_NCCL_CONNECT_MS");
  const auto took = std::chrono::milliseconds((text == nullptr ? 0 : std::atoi(text)) * comms.size());
  if (comms.empty() || took.count() <= 0) return 0;
  if (comms.front()->blocking) {
    std::this_thread::sleep_for(took);
    return 0;
  }
  for (FakeComm* comm : comms) comm->connected_at = std::chrono::steady_clock::now() + took;
  return 7;
}

int Connect(FakeComm* comm) {
  if (comm->connected) return 0;
  comm->connected = true;
  if (group_depth == 0) return ConnectNow({comm});
  connecting.push_back(comm);
  return 0;
}

void Log(const std::string& line) { log_text += line + "\n"; }

bool Usable(ncclComm_t comm, const char* function) {
  if (live.count(comm) == 0) {
    Log(std::string("FAULT ") + function + " on a destroyed or unknown communicator");
    return false;
  }
  if (comm->suspended) {
    Log(std::string("FAULT ") + function + " on suspended communicator " + std::to_string(comm->serial));
    return false;
  }
  return true;
}

ncclComm_t Make(int nranks, const ncclUniqueId& id, int rank) {
  auto* comm = new FakeComm{next_serial++, rank, nranks, std::string(id.internal, 128)};
  comm->manager = next_manager++;
  const char* nonblocking = std::getenv("FAKE_NCCL_NONBLOCKING");
  comm->blocking = nonblocking == nullptr || std::string(nonblocking) != "1";
  live.insert(comm);
  return comm;
}

std::string Name(ncclComm_t comm) { return "comm" + std::to_string(comm->serial) + ".r" + std::to_string(comm->rank); }
}  // namespace

#define FAKE extern "C" __attribute__((visibility("default")))

FAKE const char* fake_nccl_log() { return log_text.c_str(); }
FAKE void fake_nccl_clear_log() { std::lock_guard<std::mutex> g(mutex); log_text.clear(); }
FAKE int fake_nccl_live() { std::lock_guard<std::mutex> g(mutex); return static_cast<int>(live.size()); }

FAKE ncclResult_t ncclGetVersion(int* version) {
  const char* forced = std::getenv("FAKE_NCCL_VERSION");
  *version = forced ? std::atoi(forced) : 22809;
  return 0;
}
FAKE const char* ncclGetErrorString(ncclResult_t r) { return r == 0 ? "no error" : "fake error"; }
FAKE const char* ncclGetLastError(ncclComm_t) { return "fake last error"; }

FAKE ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::lock_guard<std::mutex> g(mutex);
  std::memset(id->internal, 0, 128);
  std::snprintf(id->internal, 128, "fake-id-%d", next_id++);
  Log(std::string("ncclGetUniqueId ") + id->internal);
  return 0;
}

FAKE ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  std::lock_guard<std::mutex> g(mutex);
  *comm = Make(nranks, id, rank);
  Log("ncclCommInitRank " + Name(*comm) + " id=" + id.internal);
  return 0;
}

FAKE ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, void* config) {
  std::lock_guard<std::mutex> g(mutex);
  *comm = Make(nranks, id, rank);
  const auto* head = static_cast<const FakeConfig*>(config);
  (*comm)->split_share = head != nullptr && head->splitShare == 1;
  Log("ncclCommInitRankConfig " + Name(*comm) + " id=" + id.internal +
      " splitShare=" + std::to_string(head ? head->splitShare : -1));
  return 0;
}

FAKE ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int*) {
  std::lock_guard<std::mutex> g(mutex);
  ncclUniqueId id{};
  std::snprintf(id.internal, 128, "fake-all-%d", next_id++);
  for (int i = 0; i < ndev; ++i) comms[i] = Make(ndev, id, i);
  Log("ncclCommInitAll n=" + std::to_string(ndev));
  return 0;
}

FAKE ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, void* config) {
  std::lock_guard<std::mutex> g(mutex);
  if (!Usable(comm, "ncclCommSplit")) return 5;
  if (color < 0) {
    *newcomm = nullptr;
    return 0;
  }
  ncclUniqueId id{};
  std::snprintf(id.internal, 128, "%s/split-c%d", comm->id.c_str(), color);
  *newcomm = Make(comm->nranks, id, key);
  const auto* head = static_cast<const FakeConfig*>(config);
  (*newcomm)->split_share = head != nullptr ? head->splitShare == 1 : comm->split_share;
  if (comm->split_share) (*newcomm)->manager = comm->manager;  // the parent's config decides
  Log("ncclCommSplit " + Name(comm) + " -> " + Name(*newcomm) +
      " splitShare=" + std::to_string(head ? head->splitShare : -1));
  return 0;
}

static ncclResult_t End(const char* what, ncclComm_t comm) {
  std::lock_guard<std::mutex> g(mutex);
  if (live.count(comm) == 0) {
    Log(std::string("FAULT ") + what + " on a destroyed or unknown communicator");
    return 5;
  }
  Log(std::string(what) + " " + Name(comm));
  live.erase(comm);
  delete comm;
  return 0;
}
FAKE ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (std::getenv("FAKE_FAIL_DESTROY") != nullptr) {  // a teardown that fails: broken
    std::lock_guard<std::mutex> g(mutex);
    Log("ncclCommDestroy failed (FAKE_FAIL_DESTROY)");
    return 3;
  }
  return End("ncclCommDestroy", comm);
}
FAKE ncclResult_t ncclCommAbort(ncclComm_t comm) { return End("ncclCommAbort", comm); }
FAKE ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  std::lock_guard<std::mutex> g(mutex);
  return Usable(comm, "ncclCommFinalize") ? 0 : 5;
}
FAKE ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  std::lock_guard<std::mutex> g(mutex);
  if (live.count(comm) == 0) return (Log("FAULT ncclCommGetAsyncError on a destroyed communicator"), 5);
  *error = std::chrono::steady_clock::now() < comm->connected_at ? 7 : 0;
  return 0;
}
FAKE ncclResult_t ncclCommCount(const ncclComm_t comm, int* n) {
  std::lock_guard<std::mutex> g(mutex);
  if (!Usable(comm, "ncclCommCount")) return 5;
  *n = comm->nranks;
  return 0;
}
FAKE ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* r) {
  std::lock_guard<std::mutex> g(mutex);
  if (!Usable(comm, "ncclCommUserRank")) return 5;
  *r = comm->rank;
  return 0;
}
FAKE ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* d) {
  std::lock_guard<std::mutex> g(mutex);
  if (!Usable(comm, "ncclCommCuDevice")) return 5;
  *d = 0;
  return 0;
}
FAKE ncclResult_t ncclCommRegister(const ncclComm_t comm, void*, size_t, void** handle) {
  std::lock_guard<std::mutex> g(mutex);
  if (!Usable(comm, "ncclCommRegister")) return 5;
  *handle = reinterpret_cast<void*>(0x1234);
  Log("ncclCommRegister " + Name(comm));
  return 0;
}
FAKE ncclResult_t ncclCommDeregister(const ncclComm_t comm, void*) {
  std::lock_guard<std::mutex> g(mutex);
  if (!Usable(comm, "ncclCommDeregister")) return 5;
  Log("ncclCommDeregister " + Name(comm));
  return 0;
}

// float32 sum over one rank: recv = send (enough to see data flow through).
FAKE ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, int, int, ncclComm_t comm, cudaStream_t) {
  std::lock_guard<std::mutex> g(mutex);
  if (!Usable(comm, "ncclAllReduce")) return 5;
  const int connected = Connect(comm);
  std::memmove(recv, send, count * 4);
  Log("ncclAllReduce " + Name(comm) + " n=" + std::to_string(count));
  return connected;
}

FAKE ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, int, int root, ncclComm_t comm, cudaStream_t) {
  std::lock_guard<std::mutex> g(mutex);
  if (!Usable(comm, "ncclBroadcast")) return 5;
  // Ranks of one communicator live in this process in the tests: the root's
  // payload waits in a mailbox for the others.
  if (comm->rank == root) {
    mailbox[comm->id] = std::string(static_cast<const char*>(send), count);
  } else if (mailbox.count(comm->id)) {
    std::memcpy(recv, mailbox[comm->id].data(), count);
  } else {
    Log("FAULT ncclBroadcast " + Name(comm) + " before its root");
    return 5;
  }
  Log("ncclBroadcast " + Name(comm) + " root=" + std::to_string(root));
  return 0;
}

FAKE ncclResult_t ncclGroupStart() {
  std::lock_guard<std::mutex> g(mutex);
  ++group_depth;
  Log("ncclGroupStart");
  return 0;
}
FAKE ncclResult_t ncclGroupEnd() {
  std::lock_guard<std::mutex> g(mutex);
  int result = 0;
  if (group_depth > 0 && --group_depth == 0) {
    result = ConnectNow(connecting);
    connecting.clear();
  }
  Log("ncclGroupEnd");
  return result;
}

#ifdef FAKE_WITH_SUSPEND
FAKE ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  std::lock_guard<std::mutex> g(mutex);
  if (!Usable(comm, "ncclCommSuspend")) return 5;
  for (FakeComm* other : live) {
    if (other != comm && other->manager == comm->manager) {
      Log("REFUSED ncclCommSuspend " + Name(comm) + ": shared memory manager");
      return 5;
    }
  }
  comm->suspended = true;
  Log("ncclCommSuspend " + Name(comm) + " flags=" + std::to_string(flags));
  return 0;
}
FAKE ncclResult_t ncclCommResume(ncclComm_t comm) {
  std::lock_guard<std::mutex> g(mutex);
  if (live.count(comm) == 0 || !comm->suspended) {
    Log("FAULT ncclCommResume on a communicator that is not suspended");
    return 5;
  }
  comm->suspended = false;
  Log("ncclCommResume " + Name(comm));
  return 0;
}
// Per communicator: 1000 x serial suspendable bytes, 500 persistent.
FAKE ncclResult_t ncclCommMemStats(ncclComm_t comm, int stat, uint64_t* value) {
  std::lock_guard<std::mutex> g(mutex);
  if (live.count(comm) == 0) return 5;
  const uint64_t suspendable = 1000ull * comm->serial, persistent = 500;
  switch (stat) {
    case 0: *value = suspendable; return 0;
    case 1: *value = comm->suspended ? 1 : 0; return 0;
    case 2: *value = persistent; return 0;
    case 3: *value = suspendable + persistent; return 0;
  }
  return 4;
}
#endif
