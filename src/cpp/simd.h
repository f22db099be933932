// The few element-wise primitives the shared maths (coords.h) is written in, for plain
// scalars. Vector types (one per ISA, in this header's ISA sections) provide the same
// names, so one template of the maths serves the scalar and every SIMD path, operation
// for operation: a lane of a vector computes exactly what the scalar code computes.
#pragma once

#include <cmath>
#include <cstdint>

namespace vs {

template <class V> struct lanes { using scalar = V; static constexpr int count = 1; };
template <class V> using scalar_of = typename lanes<V>::scalar;

inline float floor_(float x) { return std::floor(x); }
inline double floor_(double x) { return std::floor(x); }
// Round half to even in the default rounding mode, as std::nearbyint.
inline float rint_(float x) { return std::nearbyint(x); }
inline double rint_(double x) { return std::nearbyint(x); }
inline float fmod_(float x, float y) { return std::fmod(x, y); }
inline double fmod_(double x, double y) { return std::fmod(x, y); }
inline bool isfinite_(float x) { return std::isfinite(x); }
inline bool isfinite_(double x) { return std::isfinite(x); }
template <class T> inline T select(bool mask, T if_true, T if_false) {
  return mask ? if_true : if_false;
}

}  // namespace vs
