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

// ---------------------------------------------------------------------------------------
// Grid sampling's lane primitives, shared by every ISA: the mask type of a vector, a masked
// gather of lanes at int64 element offsets (index[l] + add; masked-off lanes read 0 and
// touch no memory), and the mask of lanes whose byte in `bits` has `bit` set. For the
// plain scalars below; the vector sections give the same names.
// ---------------------------------------------------------------------------------------
namespace vs {

template <class V> using mask_of = decltype(V() < V());

template <class V> inline V load_(const scalar_of<V>* p) { return *p; }
template <class T> inline void store_(T* p, T v) { *p = v; }
inline float gather_(const float* base, const int64_t* index, int64_t add, bool m) {
  return m ? base[*index + add] : 0.0f;
}
inline double gather_(const double* base, const int64_t* index, int64_t add, bool m) {
  return m ? base[*index + add] : 0.0;
}
template <class V> struct bit_mask;
template <> struct bit_mask<float> {
  static bool of(const uint8_t* bits, unsigned bit) { return (*bits & bit) != 0; }
};
template <> struct bit_mask<double> {
  static bool of(const uint8_t* bits, unsigned bit) { return (*bits & bit) != 0; }
};

// The natural vector of T in the ISA being compiled (T itself in the scalar build).
template <class T> struct native { using type = T; };

}  // namespace vs

#if defined(VS_ISA_AVX2) || defined(VS_ISA_AVX512)
#include <immintrin.h>

#include <cstring>

namespace vs {

// Element-wise arithmetic and per-lane std::fmod (exact, like the scalar path), written
// once per vector type by this macro; comparisons, select, floor and rint come per ISA.
#define VS_VECTOR_COMMON(NAME, REG, T, N, PRE, SUF)                                         \
  struct NAME {                                                                             \
    REG v;                                                                                  \
    NAME() = default;                                                                       \
    explicit NAME(REG x) : v(x) {}                                                          \
    explicit NAME(T s) : v(PRE##_set1_##SUF(s)) {}                                          \
  };                                                                                        \
  template <> struct lanes<NAME> { using scalar = T; static constexpr int count = N; };     \
  inline NAME operator+(NAME a, NAME b) { return NAME(PRE##_add_##SUF(a.v, b.v)); }         \
  inline NAME operator-(NAME a, NAME b) { return NAME(PRE##_sub_##SUF(a.v, b.v)); }         \
  inline NAME operator*(NAME a, NAME b) { return NAME(PRE##_mul_##SUF(a.v, b.v)); }         \
  inline NAME operator/(NAME a, NAME b) { return NAME(PRE##_div_##SUF(a.v, b.v)); }         \
  template <> inline NAME load_<NAME>(const T* p) { return NAME(PRE##_loadu_##SUF(p)); }    \
  inline void store_(T* p, NAME x) { PRE##_storeu_##SUF(p, x.v); }                          \
  inline NAME fmod_(NAME x, NAME y) {                                                       \
    alignas(64) T a[N], b[N];                                                               \
    store_(a, x);                                                                           \
    store_(b, y);                                                                           \
    for (int l = 0; l < N; ++l) a[l] = std::fmod(a[l], b[l]);                               \
    return load_<NAME>(a);                                                                  \
  }

}  // namespace vs
#endif

#if defined(VS_ISA_AVX512)
namespace vs {

// AVX-512: masks are k registers.
#define VS_VECTOR_AVX512(NAME, REG, T, N, SUF, KMASK)                                       \
  VS_VECTOR_COMMON(NAME, REG, T, N, _mm512, SUF)                                            \
  struct NAME##_mask { KMASK m; };                                                          \
  inline NAME##_mask operator|(NAME##_mask a, NAME##_mask b) { return {KMASK(a.m | b.m)}; } \
  inline NAME##_mask operator&(NAME##_mask a, NAME##_mask b) { return {KMASK(a.m & b.m)}; } \
  inline NAME##_mask operator<(NAME a, NAME b) { return {_mm512_cmp_##SUF##_mask(a.v, b.v, _CMP_LT_OQ)}; }  \
  inline NAME##_mask operator<=(NAME a, NAME b) { return {_mm512_cmp_##SUF##_mask(a.v, b.v, _CMP_LE_OQ)}; } \
  inline NAME##_mask operator>=(NAME a, NAME b) { return {_mm512_cmp_##SUF##_mask(a.v, b.v, _CMP_GE_OQ)}; } \
  inline NAME##_mask operator==(NAME a, NAME b) { return {_mm512_cmp_##SUF##_mask(a.v, b.v, _CMP_EQ_OQ)}; } \
  inline NAME select(NAME##_mask m, NAME a, NAME b) { return NAME(_mm512_mask_blend_##SUF(m.m, b.v, a.v)); } \
  inline NAME floor_(NAME x) {                                                              \
    return NAME(_mm512_roundscale_##SUF(x.v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));   \
  }                                                                                         \
  inline NAME rint_(NAME x) {                                                               \
    return NAME(_mm512_roundscale_##SUF(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); \
  }                                                                                         \
  inline NAME##_mask isfinite_(NAME x) { return (x - x) == NAME(T(0)); }

VS_VECTOR_AVX512(f32x16, __m512, float, 16, ps, __mmask16)
VS_VECTOR_AVX512(f64x8, __m512d, double, 8, pd, __mmask8)

inline f32x16 gather_(const float* base, const int64_t* index, int64_t add, f32x16_mask m) {
  const __m512i step = _mm512_set1_epi64(add);
  const __m512i i0 = _mm512_add_epi64(_mm512_loadu_si512(index), step);
  const __m512i i1 = _mm512_add_epi64(_mm512_loadu_si512(index + 8), step);
  const __m256 lo = _mm512_mask_i64gather_ps(_mm256_setzero_ps(), __mmask8(m.m), i0, base, 4);
  const __m256 hi = _mm512_mask_i64gather_ps(_mm256_setzero_ps(), __mmask8(m.m >> 8), i1, base, 4);
  return f32x16(_mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1));
}
inline f64x8 gather_(const double* base, const int64_t* index, int64_t add, f64x8_mask m) {
  const __m512i i = _mm512_add_epi64(_mm512_loadu_si512(index), _mm512_set1_epi64(add));
  return f64x8(_mm512_mask_i64gather_pd(_mm512_setzero_pd(), m.m, i, base, 8));
}
template <> struct bit_mask<f32x16> {
  static f32x16_mask of(const uint8_t* bits, unsigned bit) {
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits)));
    return {_mm512_test_epi32_mask(b, _mm512_set1_epi32(int(bit)))};
  }
};
template <> struct bit_mask<f64x8> {
  static f64x8_mask of(const uint8_t* bits, unsigned bit) {
    const __m512i b = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bits)));
    return {_mm512_test_epi64_mask(b, _mm512_set1_epi64(int64_t(bit)))};
  }
};
template <> struct native<float> { using type = f32x16; };
template <> struct native<double> { using type = f64x8; };

}  // namespace vs
#elif defined(VS_ISA_AVX2)
namespace vs {

// AVX2: masks are vectors of all-ones / all-zeros lanes.
#define VS_VECTOR_AVX2(NAME, REG, T, N, SUF)                                                 \
  VS_VECTOR_COMMON(NAME, REG, T, N, _mm256, SUF)                                            \
  struct NAME##_mask { REG m; };                                                            \
  inline NAME##_mask operator|(NAME##_mask a, NAME##_mask b) { return {_mm256_or_##SUF(a.m, b.m)}; }  \
  inline NAME##_mask operator&(NAME##_mask a, NAME##_mask b) { return {_mm256_and_##SUF(a.m, b.m)}; } \
  inline NAME##_mask operator<(NAME a, NAME b) { return {_mm256_cmp_##SUF(a.v, b.v, _CMP_LT_OQ)}; }  \
  inline NAME##_mask operator<=(NAME a, NAME b) { return {_mm256_cmp_##SUF(a.v, b.v, _CMP_LE_OQ)}; } \
  inline NAME##_mask operator>=(NAME a, NAME b) { return {_mm256_cmp_##SUF(a.v, b.v, _CMP_GE_OQ)}; } \
  inline NAME##_mask operator==(NAME a, NAME b) { return {_mm256_cmp_##SUF(a.v, b.v, _CMP_EQ_OQ)}; } \
  inline NAME select(NAME##_mask m, NAME a, NAME b) { return NAME(_mm256_blendv_##SUF(b.v, a.v, m.m)); } \
  inline NAME floor_(NAME x) { return NAME(_mm256_round_##SUF(x.v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)); } \
  inline NAME rint_(NAME x) { return NAME(_mm256_round_##SUF(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); } \
  inline NAME##_mask isfinite_(NAME x) { return (x - x) == NAME(T(0)); }

VS_VECTOR_AVX2(f32x8, __m256, float, 8, ps)
VS_VECTOR_AVX2(f64x4, __m256d, double, 4, pd)

inline f32x8 gather_(const float* base, const int64_t* index, int64_t add, f32x8_mask m) {
  const __m256i step = _mm256_set1_epi64x(add);
  const __m256i i0 = _mm256_add_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(index)), step);
  const __m256i i1 = _mm256_add_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(index + 4)), step);
  const __m128 lo = _mm256_mask_i64gather_ps(_mm_setzero_ps(), base, i0, _mm256_castps256_ps128(m.m), 4);
  const __m128 hi = _mm256_mask_i64gather_ps(_mm_setzero_ps(), base, i1, _mm256_extractf128_ps(m.m, 1), 4);
  return f32x8(_mm256_set_m128(hi, lo));
}
inline f64x4 gather_(const double* base, const int64_t* index, int64_t add, f64x4_mask m) {
  const __m256i i = _mm256_add_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(index)),
                                     _mm256_set1_epi64x(add));
  return f64x4(_mm256_mask_i64gather_pd(_mm256_setzero_pd(), base, i, m.m, 8));
}
template <> struct bit_mask<f32x8> {
  static f32x8_mask of(const uint8_t* bits, unsigned bit) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bits)));
    const __m256i want = _mm256_set1_epi32(int(bit));
    return {_mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(b, want), want))};
  }
};
template <> struct bit_mask<f64x4> {
  static f64x4_mask of(const uint8_t* bits, unsigned bit) {
    int32_t word;
    std::memcpy(&word, bits, 4);
    const __m256i b = _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(word));
    const __m256i want = _mm256_set1_epi64x(int64_t(bit));
    return {_mm256_castsi256_pd(_mm256_cmpeq_epi64(_mm256_and_si256(b, want), want))};
  }
};
template <> struct native<float> { using type = f32x8; };
template <> struct native<double> { using type = f64x4; };

}  // namespace vs
#endif
