// NUMA placement of host memory: which node a GPU's PCI slot hangs off (sysfs), and asking
// the kernel to place a range of memory on a node before it is first touched.
//
// Why: a copy between a GPU and pinned host memory on the other socket crosses the socket
// link; on a two-socket node of 8 GPUs each GPU's staging memory belongs on its own socket.
// Linux only (the mbind system call, no libnuma): elsewhere the placement is a no-op.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"

namespace amem::memory {

// Nodes the kernel lists as online (<sysfs>/devices/system/node/online, e.g. "0-1"); 1 where
// that file is missing or unreadable.
int NumaNodeCount(const std::string& sysfs = "/sys");

// The node of the PCI device with this bus id ("0000:3b:00.0"; the driver's
// cuDeviceGetPCIBusId, any case) from <sysfs>/bus/pci/devices/<id>/numa_node; -1 when the
// kernel does not say (single-node machines report -1) or the device is unknown.
int NumaNodeOfPciDevice(const std::string& bus_id, const std::string& sysfs = "/sys");

// Asks that the pages of [base, base + size) be placed on `node` when first touched
// (mbind, MPOL_PREFERRED: the kernel falls back to another node rather than fail when the
// node is full). The range must not be touched yet for the placement to hold.
Status PreferNode(void* base, size_t size, int node);

// The node of the page holding `address` (touched), or -1 when the kernel does not say.
int NodeOfAddress(const void* address);

}  // namespace amem::memory
