// Storage types versus compute types. float16 and bfloat16 are read straight from the
// caller's memory into float32, computed and accumulated there, and rounded once when
// stored (round to nearest even); float32 and float64 compute in their own precision.
#pragma once

#include <cstdint>
#include <cmath>
#include <cstring>

namespace vs {
namespace VS_ISA {

struct float16_bits { uint16_t bits; };   // IEEE binary16, as stored
struct bfloat16_bits { uint16_t bits; };  // bfloat16 (the top half of a float32), as stored

inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// float16 <-> float32, exact one way and round-to-nearest-even the other, in portable
// integer arithmetic (the F16C instructions give the same bits; the SIMD paths use them).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return bits_to_float(sign);
  // Subnormal: exactly mantissa * 2^-24.
  const float magnitude = float(mantissa) * bits_to_float(0x33800000u);
  return bits_to_float(sign | float_to_bits(magnitude));
}

inline uint16_t float_to_half(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude >= 0x7f800000u)  // inf stays inf; NaN stays a (quiet) NaN with its top bits
    return sign | (magnitude > 0x7f800000u ? uint16_t(0x7e00u | ((magnitude >> 13) & 0x3ffu))
                                           : uint16_t(0x7c00u));
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // rounds to beyond 65504: inf
  if (magnitude < 0x38800000u) {  // below 2^-14: a float16 subnormal (or zero)
    // Adding 0.5 (2^-1) lines the float16 subnormal grid up with float32's last bit, so
    // the hardware's own round-to-nearest-even does the rounding.
    const float shifted = bits_to_float(magnitude) + 0.5f;
    return sign | uint16_t(float_to_bits(shifted) - 0x3f000000u);
  }
  const uint32_t odd = (magnitude >> 13) & 1u;
  const uint32_t rounded = magnitude + 0xc8000fffu + odd;  // rebias by -112 and round
  return sign | uint16_t(rounded >> 13);
}

// bfloat16 <-> float32. NaN stays a quiet NaN; everything else rounds to nearest even.
inline float bfloat16_to_float(uint16_t b) { return bits_to_float(uint32_t(b) << 16); }

inline uint16_t float_to_bfloat16(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Load a stored element into its compute type C, and store a computed value, rounding
// once. A double result bound for 16 bits (a float64 grid beside a 16-bit volume) goes
// through float32 for bfloat16, as ml_dtypes casts; float16 rounds from double directly.
template <class S> struct storage;
template <> struct storage<float> {
  template <class C> static C load(const float* p) { return C(*p); }
  template <class C> static void store(float* p, C v) { *p = float(v); }
};
template <> struct storage<double> {
  template <class C> static C load(const double* p) { return C(*p); }
  template <class C> static void store(double* p, C v) { *p = double(v); }
};
template <> struct storage<float16_bits> {
  template <class C> static C load(const float16_bits* p) { return C(half_to_float(p->bits)); }
  template <class C> static void store(float16_bits* p, C v);
};
template <> struct storage<bfloat16_bits> {
  template <class C> static C load(const bfloat16_bits* p) { return C(bfloat16_to_float(p->bits)); }
  template <class C> static void store(bfloat16_bits* p, C v) { p->bits = float_to_bfloat16(float(v)); }
};

uint16_t double_to_half(double d);  // defined below: one rounding from double

template <> inline void storage<float16_bits>::store<float>(float16_bits* p, float v) {
  p->bits = float_to_half(v);
}
template <> inline void storage<float16_bits>::store<double>(float16_bits* p, double v) {
  p->bits = double_to_half(v);
}

inline uint16_t double_to_half(double d) {
  // Round to float32 towards zero, then set the sticky bit if anything was lost: the one
  // float32 -> float16 rounding that follows is then the correct rounding of d.
  float f = float(d);
  if (std::fabs(double(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  if (double(f) != d && f == f) f = bits_to_float(float_to_bits(f) | 1u);
  return float_to_half(f);
}

}  // namespace VS_ISA
}  // namespace vs
