// Element conversions of the CPU loop, on bit patterns, as XLA's convert on the CPU gives them
// (checked against it in tests/test_swap_transpose.py): round-to-nearest-even, subnormals kept,
// overflow to infinity; a NaN keeps its sign, bf16 gives the quiet NaN 0x7fc0, f16 keeps the
// payload's top bits with the quiet bit set.
#pragma once

#include <cstdint>

namespace amem::copy {

inline uint16_t F32BitsToBF16(uint32_t x) {
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7fc0u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline uint16_t F32BitsToF16(uint32_t x) {
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude & 0x7fffffu) >> 13));
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // halfway past 65504 and up
  if (magnitude < 0x38800000u) {  // below f16's smallest normal: a subnormal (units of 2^-24) or zero
    const uint32_t exponent = magnitude >> 23;
    if (exponent < 102) return static_cast<uint16_t>(sign);  // below 2^-25: rounds to zero
    const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;
    uint32_t result = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  const uint32_t rebiased = magnitude - 0x38000000u;  // exponent bias 127 -> 15
  uint32_t result = rebiased >> 13;
  const uint32_t rest = rebiased & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

inline uint32_t BF16BitsToF32(uint16_t x) { return static_cast<uint32_t>(x) << 16; }

inline uint32_t F16BitsToF32(uint16_t x) {
  const uint32_t sign = static_cast<uint32_t>(x & 0x8000u) << 16;
  const uint32_t exponent = (x >> 10) & 0x1fu, mantissa = x & 0x3ffu;
  if (exponent == 0x1f) return sign | 0x7f800000u | (mantissa << 13);  // inf, NaN (payload kept)
  if (exponent != 0) return sign | ((exponent + 112) << 23) | (mantissa << 13);
  if (mantissa == 0) return sign;
  uint32_t m = mantissa, e = 113;  // a subnormal: normalise
  while ((m & 0x400u) == 0) {
    m <<= 1;
    --e;
  }
  return sign | (e << 23) | ((m & 0x3ffu) << 13);
}

}  // namespace amem::copy
