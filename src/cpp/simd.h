// The few element-wise primitives the shared maths (coords.h) is written in, for plain
// scalars. Vector types (one per ISA, in this header's ISA sections) provide the same
// names, so one template of the maths serves the scalar and every SIMD path, operation
// for operation: a lane of a vector computes exactly what the scalar code computes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace vs {
namespace VS_ISA {

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

}  // namespace VS_ISA
}  // namespace vs

// ---------------------------------------------------------------------------------------
// Grid sampling's lane primitives, shared by every ISA: the mask type of a vector, its
// lanes as bits and index vectors of element offsets. For the plain scalars below; the
// vector sections give the same names.
// ---------------------------------------------------------------------------------------
namespace vs {
namespace VS_ISA {

template <class V> using mask_of = decltype(V() < V());

template <class V> inline V load_(const scalar_of<V>* p) { return *p; }
template <class T> inline void store_(T* p, T v) { *p = v; }
inline unsigned bits_of(bool m) { return unsigned(m); }  // bit l: lane l is on

// A hint to fetch p's cache line (no-op where the compiler has neither). On x86 an asm
// statement the compiler must keep: GCC 12 judges a function that only prefetches (a
// source's prefetch member, say) to be const, and deletes the calls whose result, none,
// goes unused.
inline void prefetch_(const void* p) {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#elif defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p);
#else
  (void)p;
#endif
}

// Results of at least this many bytes are written past the caches (non-temporal stores)
// where a kernel can: they would not stay cached anyway, and their write-allocations would
// evict what the kernel reuses (its volume rows, its scratch).
constexpr int64_t kStreamedResultBytes = int64_t(8) << 20;

// A vector stored past the caches, at p aligned to its size (the scalar build stores
// plainly), and the fence that orders a thread's such stores before its later ones and
// before the end of the parallel region that publishes them. The bits are a plain store's.
template <class T> inline void stream_(T* p, T v) { *p = v; }
inline void stream_fence();

// Index vectors: L lanes of element offsets, int64 in the scalar build. The SIMD builds
// use int32 lanes (a whole vector's offsets in one register, one multiply per stride) and
// run only on volumes whose offsets fit in 31 bits; the kernels send larger ones to the
// scalar build.
template <class V> struct index_for { using type = int64_t; using lane = int64_t; };
template <class V> using index_of = typename index_for<V>::type;
template <class V> using index_lane_of = typename index_for<V>::lane;
inline int64_t to_index(float x) { return int64_t(x); }  // x: a whole number in range
inline int64_t to_index(double x) { return int64_t(x); }
// Lane l + 1's value in lane l (the last lane keeps its own).
template <class T> inline T next_lane_(T x) { return x; }

// Lane l's neighbours base[at[l]] and base[at[l] + 1] (all valid memory) as `first` and
// `second`: plain loads, which beat the hardware gathers of the CPUs we measured. The
// float vectors read each pair as one 64-bit load.
template <class V, class Lane>
inline void load_pairs_(const scalar_of<V>* base, const Lane* at, V& first, V& second) {
  using T = scalar_of<V>;
  constexpr int L = lanes<V>::count;
  alignas(64) T a[L], b[L];
  for (int l = 0; l < L; ++l) {
    a[l] = base[at[l]];
    b[l] = base[at[l] + 1];
  }
  first = load_<V>(a);
  second = load_<V>(b);
}

// Lane l's base[row[l] + column[l]] where `on` holds lane l, else 0 (a lane that is off
// may read any valid memory, or none). The vector builds gather with the hardware's
// masked gathers: for the cubic taps (16 rows of 4 per point) they beat L plain
// loads through the stack (measured on Zen 4 with AVX-512).
template <class V, class Lane>
inline V gather_(const scalar_of<V>* base, const Lane* row, const Lane* column, mask_of<V> on) {
  using T = scalar_of<V>;
  constexpr int L = lanes<V>::count;
  alignas(64) T v[L];
  for (int l = 0; l < L; ++l) v[l] = base[row[l] + column[l]];
  return select(on, load_<V>(v), V(T(0)));
}

// Windows, where has_window<V> holds (AVX2 float32, AVX-512 float32 and float64):
// load_window_ reads `count` (1 <= count <= 2L) consecutive values from p into two
// vectors (lo: the first L, hi: the next L; lanes past count are 0, their memory unread),
// and pick_(lo, hi, at) gives each lane l the window's value at index at[l] (< 2L): the
// taps of a row that a whole vector of points shares, from two loads and a permute.
template <class V> struct has_window : std::false_type {};

// Runs, where has_run_add<V> holds (AVX-512): add_run_pair_(p, on0, t0, on1, t1) adds to
// the consecutive elements p[0..L] the x1 and x0 corner terms of L points whose low corners
// are p[0..L): t1[l] into p[l + 1] (lanes in on1), then t0[l] into p[l] (lanes in on0), so
// that each element receives its terms in lane order, as lane-by-lane adds would, with the
// same roundings. Memory of lanes off is neither read nor written.
template <class V> struct has_run_add : std::false_type {};

// The natural vector of T in the ISA being compiled (T itself in the scalar build).
template <class T> struct native { using type = T; };

}  // namespace VS_ISA
}  // namespace vs

#if defined(VS_ISA_AVX2) || defined(VS_ISA_AVX512)
#include <immintrin.h>

namespace vs {
namespace VS_ISA {

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
  inline NAME operator-(NAME a) { return NAME(PRE##_xor_##SUF(a.v, PRE##_set1_##SUF(T(-0.0)))); } \
  template <> inline NAME load_<NAME>(const T* p) { return NAME(PRE##_loadu_##SUF(p)); }    \
  inline void store_(T* p, NAME x) { PRE##_storeu_##SUF(p, x.v); }                          \
  inline void stream_(T* p, NAME x) { PRE##_stream_##SUF(p, x.v); }                         \
  inline NAME fmod_(NAME x, NAME y) {                                                       \
    alignas(64) T a[N], b[N];                                                               \
    store_(a, x);                                                                           \
    store_(b, y);                                                                           \
    for (int l = 0; l < N; ++l) a[l] = std::fmod(a[l], b[l]);                               \
    return load_<NAME>(a);                                                                  \
  }

// int32 index vectors (see index_for): sums and products of offsets and strides.
#define VS_INDEX_VECTOR(NAME, REG, N, PRE, SI)                                              \
  struct NAME {                                                                             \
    REG v;                                                                                  \
    NAME() = default;                                                                       \
    explicit NAME(REG x) : v(x) {}                                                          \
    explicit NAME(int64_t s) : v(PRE##_set1_epi32(int32_t(s))) {}                           \
  };                                                                                        \
  inline NAME operator+(NAME a, NAME b) { return NAME(PRE##_add_epi32(a.v, b.v)); }         \
  inline NAME operator*(NAME a, NAME b) { return NAME(PRE##_mullo_epi32(a.v, b.v)); }       \
  inline void store_(int32_t* p, NAME x) { PRE##_storeu_##SI(reinterpret_cast<REG*>(p), x.v); }

inline void stream_fence() { _mm_sfence(); }

VS_INDEX_VECTOR(i32x4, __m128i, 4, _mm, si128)
VS_INDEX_VECTOR(i32x8, __m256i, 8, _mm256, si256)

// Four float pairs base[at[0..3]], base[at[0..3] + 1] as (a0 b0 a1 b1 | a2 b2 a3 b3).
inline __m256 load_four_pairs(const float* base, const int32_t* at) {
  auto pair = [&](int l) { return reinterpret_cast<const double*>(base + at[l]); };
  const __m128d lo = _mm_loadh_pd(_mm_load_sd(pair(0)), pair(1));
  const __m128d hi = _mm_loadh_pd(_mm_load_sd(pair(2)), pair(3));
  return _mm256_castpd_ps(_mm256_insertf128_pd(_mm256_castpd128_pd256(lo), hi, 1));
}

}  // namespace VS_ISA
}  // namespace vs
#else
namespace vs {
namespace VS_ISA {
inline void stream_fence() {}  // the scalar build streams nothing
}  // namespace VS_ISA
}  // namespace vs
#endif

#if defined(VS_ISA_AVX512)
namespace vs {
namespace VS_ISA {

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

VS_INDEX_VECTOR(i32x16, __m512i, 16, _mm512, si512)

template <> struct index_for<f32x16> { using type = i32x16; using lane = int32_t; };
template <> struct index_for<f64x8> { using type = i32x8; using lane = int32_t; };
inline i32x16 to_index(f32x16 x) { return i32x16(_mm512_cvttps_epi32(x.v)); }
inline i32x8 to_index(f64x8 x) { return i32x8(_mm512_cvttpd_epi32(x.v)); }
template <>
inline void load_pairs_<f32x16, int32_t>(const float* base, const int32_t* at, f32x16& first,
                                        f32x16& second) {
  const __m512 lo = _mm512_insertf32x8(_mm512_castps256_ps512(load_four_pairs(base, at)),
                                       load_four_pairs(base, at + 4), 1);
  const __m512 hi = _mm512_insertf32x8(_mm512_castps256_ps512(load_four_pairs(base, at + 8)),
                                       load_four_pairs(base, at + 12), 1);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  first = f32x16(_mm512_permutex2var_ps(lo, even, hi));
  second = f32x16(_mm512_permutex2var_ps(lo, _mm512_add_epi32(even, _mm512_set1_epi32(1)), hi));
}
inline f32x16 next_lane_(f32x16 x) {
  return f32x16(_mm512_permutexvar_ps(
      _mm512_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 15), x.v));
}
inline f64x8 next_lane_(f64x8 x) {
  return f64x8(_mm512_permutexvar_pd(_mm512_setr_epi64(1, 2, 3, 4, 5, 6, 7, 7), x.v));
}
template <>
inline f32x16 gather_<f32x16, int32_t>(const float* base, const int32_t* row,
                                       const int32_t* column, f32x16_mask on) {
  const __m512i at = _mm512_add_epi32(_mm512_loadu_si512(row), _mm512_loadu_si512(column));
  return f32x16(_mm512_mask_i32gather_ps(_mm512_setzero_ps(), on.m, at, base, 4));
}
template <>
inline f64x8 gather_<f64x8, int32_t>(const double* base, const int32_t* row,
                                     const int32_t* column, f64x8_mask on) {
  const __m256i at = _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)),
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(column)));
  return f64x8(_mm512_mask_i32gather_pd(_mm512_setzero_pd(), on.m, at, base, 8));
}
template <> struct has_window<f32x16> : std::true_type {};
template <> struct has_window<f64x8> : std::true_type {};
// The first n of N <= 16 lanes as mask bits, n clamped to [0, N].
inline unsigned first_lanes(int64_t n, int N) {
  return (1u << std::min<int64_t>(std::max<int64_t>(n, 0), N)) - 1;
}
inline void load_window_(const float* p, int64_t count, f32x16& lo, f32x16& hi) {
  lo = f32x16(_mm512_maskz_loadu_ps(__mmask16(first_lanes(count, 16)), p));
  hi = f32x16(_mm512_maskz_loadu_ps(__mmask16(first_lanes(count - 16, 16)), p + 16));
}
inline void load_window_(const double* p, int64_t count, f64x8& lo, f64x8& hi) {
  lo = f64x8(_mm512_maskz_loadu_pd(__mmask8(first_lanes(count, 8)), p));
  hi = f64x8(_mm512_maskz_loadu_pd(__mmask8(first_lanes(count - 8, 8)), p + 8));
}
inline f32x16 pick_(f32x16 lo, f32x16 hi, i32x16 at) {
  return f32x16(_mm512_permutex2var_ps(lo.v, at.v, hi.v));
}
inline f64x8 pick_(f64x8 lo, f64x8 hi, i32x8 at) {
  return f64x8(_mm512_permutex2var_pd(lo.v, _mm512_cvtepi32_epi64(at.v), hi.v));
}
inline unsigned bits_of(f32x16_mask m) { return m.m; }
inline unsigned bits_of(f64x8_mask m) { return m.m; }
template <> struct has_run_add<f32x16> : std::true_type {};
template <> struct has_run_add<f64x8> : std::true_type {};
#define VS_RUN_ADD(NAME, T, N, SUF, KMASK, FIRST)                                           \
  inline void add_run_pair_(T* p, unsigned on0, NAME t0, unsigned on1, NAME t1) {           \
    const KMASK up = KMASK(on1 << 1), own = KMASK(on0), touched = up | own;                 \
    /* t1 rotated up a lane: lane l - 1's term in lane l, and the last lane's in lane 0 */  \
    const __m512i t1_bits = _mm512_cast##SUF##_si512(t1.v);                                 \
    const auto t1_up = _mm512_castsi512_##SUF(                                              \
        _mm512_alignr_epi32(t1_bits, t1_bits, 16 - int(sizeof(T)) / 4));                    \
    auto sum = _mm512_maskz_loadu_##SUF(touched, p);                                        \
    sum = _mm512_mask_add_##SUF(sum, up, sum, t1_up);                                       \
    sum = _mm512_mask_add_##SUF(sum, own, sum, t0.v);                                       \
    _mm512_mask_storeu_##SUF(p, touched, sum);                                              \
    if (on1 >> (N - 1) & 1) p[N] += FIRST(t1_up); /* the last lane's, past the vector */   \
  }
VS_RUN_ADD(f32x16, float, 16, ps, __mmask16, _mm512_cvtss_f32)
VS_RUN_ADD(f64x8, double, 8, pd, __mmask8, _mm512_cvtsd_f64)
// The lanes l >= 1 whose offset is lane l - 1's plus one (the links of runs), from the
// register: the offsets were just computed, and reading them back through memory waits.
inline unsigned run_links_(i32x16 at) {
  const __m512i previous = _mm512_alignr_epi32(at.v, _mm512_setzero_si512(), 15);
  return _mm512_cmpeq_epi32_mask(at.v, _mm512_add_epi32(previous, _mm512_set1_epi32(1))) & ~1u;
}
inline unsigned run_links_(i32x8 at) {
  const __m256i previous = _mm256_alignr_epi32(at.v, _mm256_setzero_si256(), 7);
  return _mm256_cmpeq_epi32_mask(at.v, _mm256_add_epi32(previous, _mm256_set1_epi32(1))) & ~1u;
}

template <> struct native<float> { using type = f32x16; };
template <> struct native<double> { using type = f64x8; };

}  // namespace VS_ISA
}  // namespace vs
#elif defined(VS_ISA_AVX2)
namespace vs {
namespace VS_ISA {

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

template <> struct index_for<f32x8> { using type = i32x8; using lane = int32_t; };
template <> struct index_for<f64x4> { using type = i32x4; using lane = int32_t; };
inline i32x8 to_index(f32x8 x) { return i32x8(_mm256_cvttps_epi32(x.v)); }
inline i32x4 to_index(f64x4 x) { return i32x4(_mm256_cvttpd_epi32(x.v)); }
template <>
inline void load_pairs_<f32x8, int32_t>(const float* base, const int32_t* at, f32x8& first,
                                       f32x8& second) {
  const __m256 lo = load_four_pairs(base, at), hi = load_four_pairs(base, at + 4);
  // (a0 b0 a1 b1 | a2 b2 a3 b3), (a4 b4 a5 b5 | a6 b6 a7 b7) -> a0..a7, b0..b7
  auto order = [](__m256 x) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(x), _MM_SHUFFLE(3, 1, 2, 0)));
  };
  first = f32x8(order(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0))));
  second = f32x8(order(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1))));
}
inline f32x8 next_lane_(f32x8 x) {
  return f32x8(_mm256_permutevar8x32_ps(x.v, _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 7)));
}
inline f64x4 next_lane_(f64x4 x) { return f64x4(_mm256_permute4x64_pd(x.v, _MM_SHUFFLE(3, 3, 2, 1))); }
template <>
inline f32x8 gather_<f32x8, int32_t>(const float* base, const int32_t* row, const int32_t* column,
                                     f32x8_mask on) {
  const __m256i at = _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)),
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(column)));
  return f32x8(_mm256_mask_i32gather_ps(_mm256_setzero_ps(), base, at, on.m, 4));
}
template <>
inline f64x4 gather_<f64x4, int32_t>(const double* base, const int32_t* row,
                                     const int32_t* column, f64x4_mask on) {
  const __m128i at = _mm_add_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)),
                                   _mm_loadu_si128(reinterpret_cast<const __m128i*>(column)));
  return f64x4(_mm256_mask_i32gather_pd(_mm256_setzero_pd(), base, at, on.m, 8));
}
template <> struct has_window<f32x8> : std::true_type {};
inline void load_window_(const float* p, int64_t count, f32x8& lo, f32x8& hi) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int32_t n = int32_t(std::min<int64_t>(count, 16));
  lo = f32x8(_mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane)));
  hi = f32x8(_mm256_maskload_ps(p + 8, _mm256_cmpgt_epi32(_mm256_set1_epi32(n - 8), lane)));
}
inline f32x8 pick_(f32x8 lo, f32x8 hi, i32x8 at) {  // permutevar reads at's low 3 bits
  const __m256 from_hi = _mm256_castsi256_ps(_mm256_cmpgt_epi32(at.v, _mm256_set1_epi32(7)));
  return f32x8(_mm256_blendv_ps(_mm256_permutevar8x32_ps(lo.v, at.v),
                                _mm256_permutevar8x32_ps(hi.v, at.v), from_hi));
}
inline unsigned bits_of(f32x8_mask m) { return unsigned(_mm256_movemask_ps(m.m)); }
inline unsigned bits_of(f64x4_mask m) { return unsigned(_mm256_movemask_pd(m.m)); }
template <> struct native<float> { using type = f32x8; };
template <> struct native<double> { using type = f64x4; };

}  // namespace VS_ISA
}  // namespace vs
#endif
