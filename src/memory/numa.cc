#include "memory/numa.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace amem::memory {
namespace {

std::string ReadFirstLine(const std::string& path) {
  std::ifstream file(path);
  std::string line;
  if (file) std::getline(file, line);
  return line;
}

// Linux's mempolicy constants (the kernel's uapi mempolicy header), spelled out: no libnuma needed.
constexpr int kMpolPreferred = 1;
constexpr unsigned long kMpolFNode = 1UL << 0;
constexpr unsigned long kMpolFAddr = 1UL << 1;
constexpr unsigned long kMaxNodes = 1024;

}  // namespace

int NumaNodeCount(const std::string& sysfs) {
  // A list of ranges: "0", "0-1", "0,2-3".
  const std::string online = ReadFirstLine(sysfs + "/devices/system/node/online");
  if (online.empty()) return 1;
  int count = 0;
  std::stringstream ranges(online);
  std::string range;
  while (std::getline(ranges, range, ',')) {
    const size_t dash = range.find('-');
    try {
      if (dash == std::string::npos) {
        std::stoi(range);
        count += 1;
      } else {
        count += std::stoi(range.substr(dash + 1)) - std::stoi(range.substr(0, dash)) + 1;
      }
    } catch (const std::exception&) {
      return 1;  // a format this code does not know: say nothing rather than guess
    }
  }
  return std::max(count, 1);
}

int NumaNodeOfPciDevice(const std::string& bus_id, const std::string& sysfs) {
  std::string id = bus_id;
  std::transform(id.begin(), id.end(), id.begin(), [](unsigned char c) { return std::tolower(c); });
  // The driver's ids have an 8-digit domain ("00000000:3B:00.0"); sysfs writes 4 ("0000:3b:00.0").
  if (const size_t colon = id.find(':'); colon != std::string::npos && colon > 4) id = id.substr(colon - 4);
  const std::string text = ReadFirstLine(sysfs + "/bus/pci/devices/" + id + "/numa_node");
  if (text.empty()) return -1;
  try {
    return std::max(std::stoi(text), -1);
  } catch (const std::exception&) {
    return -1;
  }
}

Status PreferNode(void* base, size_t size, int node) {
  if (node < 0) return Status::Ok();
#if defined(__linux__) && defined(SYS_mbind)
  if (static_cast<unsigned long>(node) >= kMaxNodes) {
    return Status::Error("NUMA node " + std::to_string(node) + " is beyond the " + std::to_string(kMaxNodes) +
                         " nodes this build can name");
  }
  unsigned long mask[kMaxNodes / (8 * sizeof(unsigned long))] = {};
  mask[node / (8 * sizeof(unsigned long))] = 1UL << (node % (8 * sizeof(unsigned long)));
  if (syscall(SYS_mbind, base, size, kMpolPreferred, mask, kMaxNodes, 0) != 0) {
    return Status::Error("mbind of the staging pool's block to NUMA node " + std::to_string(node) + " failed");
  }
#else
  (void)base;
  (void)size;
#endif
  return Status::Ok();
}

int NodeOfAddress(const void* address) {
#if defined(__linux__) && defined(SYS_get_mempolicy)
  int node = -1;
  if (syscall(SYS_get_mempolicy, &node, nullptr, 0, address, kMpolFNode | kMpolFAddr) == 0) return node;
#else
  (void)address;
#endif
  return -1;
}

}  // namespace amem::memory
