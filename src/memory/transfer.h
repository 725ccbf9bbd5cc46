// Copies between device buffers (of JAX arrays) and host staging memory.
//
// A batch holds the copies of one pause (or one resume) for every device of
// the process. On a GPU each device's copies go on one stream of ours, all
// devices at once, and the call returns when every copy has finished: the
// caller has already waited for XLA's work on the source buffers (offload), or
// owns destination buffers nothing else reads yet (reload). A device ordinal of
// -1 means a host (XLA CPU) buffer: a plain memcpy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace amem::memory {

constexpr int kHostDevice = -1;

struct Transfer {
  int device_ordinal = kHostDevice;  // CUDA ordinal (the driver's), or kHostDevice
  uintptr_t device_address = 0;      // the array's buffer on that device
  uintptr_t host_address = 0;        // the staging memory
  size_t bytes = 0;
};

enum class Direction { kToHost, kToDevice };

Status CopyBatch(const std::vector<Transfer>& transfers, Direction direction);

// CopyBatch in two halves, so the caller can do host work while the copies run:
// StartBatch enqueues (host rows are copied at once) and lists the devices it
// enqueued on, also when it fails part-way; WaitBatch(those) must follow, always.
Status StartBatch(const std::vector<Transfer>& transfers, Direction direction,
                  std::vector<int>* started);
Status WaitBatch(const std::vector<int>& ordinals);

}  // namespace amem::memory
