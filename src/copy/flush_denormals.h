// The floating-point mode XLA:CPU runs its programs and custom calls in: subnormal inputs read
// as zero, subnormal results flushed to zero. The affine CPU loop (affine.h) run from the
// direct launch, outside XLA, sets it for its own duration, so that it writes what the custom
// call writes and what JAX computes eagerly on the CPU, bit for bit.
#pragma once

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace amem::copy {

class ScopedFlushDenormals {
 public:
  ScopedFlushDenormals() {
#if defined(__x86_64__) || defined(__i386__)
    saved_ = _mm_getcsr();
    _mm_setcsr(static_cast<unsigned>(saved_) | kFlushToZero | kDenormalsAreZero);
#elif defined(__aarch64__)
    asm volatile("mrs %0, fpcr" : "=r"(saved_));
    const uint64_t flushing = saved_ | kFlushZero;
    asm volatile("msr fpcr, %0" : : "r"(flushing));
#endif
  }
  ~ScopedFlushDenormals() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(static_cast<unsigned>(saved_));
#elif defined(__aarch64__)
    asm volatile("msr fpcr, %0" : : "r"(saved_));
#endif
  }
  ScopedFlushDenormals(const ScopedFlushDenormals&) = delete;
  ScopedFlushDenormals& operator=(const ScopedFlushDenormals&) = delete;

 private:
  static constexpr unsigned kFlushToZero = 0x8000;     // MXCSR FTZ
  static constexpr unsigned kDenormalsAreZero = 0x40;  // MXCSR DAZ
  static constexpr uint64_t kFlushZero = uint64_t{1} << 24;  // FPCR FZ (inputs and results)
  uint64_t saved_ = 0;
};

}  // namespace amem::copy
