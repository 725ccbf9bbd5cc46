// Wall-clock helpers for the pause and resume steps (steady clock: immune to NTP steps).
#pragma once

#include <chrono>

namespace amem::nccl {

using Clock = std::chrono::steady_clock;

inline double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

inline Clock::time_point Deadline(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace amem::nccl
