// Contiguous runs between storage and compute types, for the upsampling kernels:
// float16 and bfloat16 widened to float32 on load and rounded once (to nearest even) on
// store. The scalar forms are dtypes.h's; the F16C / AVX-512 forms give the same bits
// (IEEE conversions, NaN quieted the same way) and the bfloat16 forms are the same
// integer operations on whole vectors.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "dtypes.h"
#include "simd.h"

namespace vs {
namespace VS_ISA {

// out[j] = in[j * stride] widened, j < n.
template <class S, class C>
inline void load_run(C* out, const S* in, int64_t stride, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = storage<S>::template load<C>(in + j * stride);
}

inline void load_run(float* out, const float16_bits* in, int64_t stride, int64_t n) {
  int64_t j = 0;
  if (stride == 1) {
#if defined(__AVX512F__)
    for (; j + 16 <= n; j += 16)
      _mm512_storeu_ps(out + j, _mm512_cvtph_ps(_mm256_loadu_si256(
                                    reinterpret_cast<const __m256i*>(in + j))));
#endif
#if defined(__F16C__)
    for (; j + 8 <= n; j += 8)
      _mm256_storeu_ps(out + j,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + j))));
#endif
  }
  for (; j < n; ++j) out[j] = half_to_float(in[j * stride].bits);
}

inline void load_run(float* out, const bfloat16_bits* in, int64_t stride, int64_t n) {
  if (stride == 1) {
    uint16_t bits[256];
    for (int64_t j0 = 0; j0 < n; j0 += 256) {  // the copy lets the loop below vectorise
      const int64_t m = n - j0 < 256 ? n - j0 : 256;
      std::memcpy(bits, in + j0, m * 2);
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) out[j0 + j] = bits_to_float(uint32_t(bits[j]) << 16);
    }
    return;
  }
  for (int64_t j = 0; j < n; ++j) out[j] = bfloat16_to_float(in[j * stride].bits);
}

// out[j] = in[j] rounded to S, j < n (out contiguous).
template <class S, class C>
inline void store_run(S* out, const C* in, int64_t n) {
  for (int64_t j = 0; j < n; ++j) storage<S>::template store<C>(out + j, in[j]);
}

inline void store_run(float16_bits* out, const float* in, int64_t n) {
  int64_t j = 0;
#if defined(__AVX512F__)
  for (; j + 16 <= n; j += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j),
                        _mm512_cvtps_ph(_mm512_loadu_ps(in + j),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
#if defined(__F16C__)
  for (; j + 8 <= n; j += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + j),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; j < n; ++j) out[j].bits = float_to_half(in[j]);
}

inline void store_run(bfloat16_bits* out, const float* in, int64_t n) {
  uint16_t bits[256];
  for (int64_t j0 = 0; j0 < n; j0 += 256) {
    const int64_t m = n - j0 < 256 ? n - j0 : 256;
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) {  // float_to_bfloat16, branch free
      const uint32_t u = float_to_bits(in[j0 + j]);
      const uint16_t nan = uint16_t((u >> 16) | 0x40u);
      const uint16_t rounded = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      bits[j] = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
    }
    std::memcpy(out + j0, bits, m * 2);
  }
}

// out[j] = in[j], j < n, with non-temporal stores where the ISA has them: a result too
// large for the caches is then written without first reading each line (and without
// evicting the scratch the kernel reuses). The same bits either way; callers fence
// (stream_fence) before the data is read elsewhere.
template <class T>
inline void stream_run(T* out, const T* in, int64_t n) {
  int64_t j = 0;
#if defined(__AVX512F__) || defined(__AVX2__)
#if defined(__AVX512F__)
  constexpr int64_t bytes = 64;
#else
  constexpr int64_t bytes = 32;
#endif
  constexpr int64_t lanes = bytes / int64_t(sizeof(T));
  if (reinterpret_cast<uintptr_t>(out) % sizeof(T) == 0) {
    for (; j < n && reinterpret_cast<uintptr_t>(out + j) % bytes != 0; ++j) out[j] = in[j];
    for (; j + lanes <= n; j += lanes) {
#if defined(__AVX512F__)
      const __m512i v = _mm512_loadu_si512(in + j);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out + j), v);
#else
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + j));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(out + j), v);
#endif
    }
  }
#endif
  for (; j < n; ++j) out[j] = in[j];
}

}  // namespace VS_ISA
}  // namespace vs
