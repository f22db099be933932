// Designs of the trilinear backward's scatter into grad_input, timed side by side on the
// same corner offsets and terms (the kernel's per-point maths done beforehand, untimed), and
// checked bit for bit against the scalar order the kernel uses today.
//
//   g++ -O3 -march=native -ffp-contract=off -o /tmp/scatter_designs benchmarks/scatter_designs.cpp
//   /tmp/scatter_designs [repeats]
//
// The points are the `volsample bench` workload's: a 96x112x96 volume sampled on a smooth
// grid of as many points (the identity plus a smooth displacement of up to 3 voxels), 16
// points (one AVX-512 vector of float32) a block, corner by corner from 7 down to 0, which
// keeps every element's terms in point order along such rows (grid_backward.cpp).
//
// NCDHW, one channel (grad_input's element offsets differ per lane):
//   scalar     the kernel (kept): per corner, lane by lane, load-add-store;
//   rounds     per corner, gather the 16 lanes' elements, add, scatter; lanes whose element
//              an earlier lane also hits (vpconflictd) wait for a later round, so every
//              element still receives its terms in lane (point) order;
//   distinct   per corner, one gather-add-scatter when the 16 lanes' elements are distinct,
//              else the scalar loop;
//   pairs      the x0 and x1 corners of a lane together: a 64-bit load-add-store of the pair
//              (one rounding per float, as scalar), lane by lane;
//   avx2-gather what AVX2 can do (it has no scatter): per corner and half block of 8 lanes
//              with distinct elements, one gather and one vector add, then 8 scalar stores.
// Measured on AMD EPYC Zen 4 (AVX-512 on 256-bit units), a shared machine, medians of 9:
// scalar 25.5 ms, rounds 46.1, distinct 33.2, pairs 61.1; NDHWC C8 channels-major 372 ms,
// channels-scalar 164, channels-vector 92.5; C32 1961, 404, 325. AVX2's gather, two runs
// on the same machine (load average 4-7): scalar 18.4 and 17.6 ms, avx2-gather 18.6 and
// 17.7: the gather buys nothing, and AVX2 keeps the scalar loop.
// Runs (the AVX-512 kernel's scatter today), checked bit for bit against point order:
//   point-order  each point's corners, point by point (the bits every design must give);
//   runs         the kernel's: where half a block's lanes have consecutive low corners, run by
//                run, each corner row one masked read-add-write (the last lane's x1 term
//                added on its own); else point by point;
//   runs-carry   runs, with each corner row's last x1 term held in a register into the next
//                block, going in as its first run's lane-0 term where that run starts on its
//                element (no scalar store for the next masked load to wait on).
// Measured on AMD EPYC Zen 4, 2026-12-05 (load 1-3), medians of 15, three runs: point-order
// 8.3-8.7 ms, runs 6.4-6.8, runs-carry 6.7-7.2: the carry buys nothing, and is not kept.
// NDHWC, C channels contiguous (grad_output's too):
//   channels-major   the kernel before: channel by channel, each as the NCDHW scalar
//                    (always corner by corner here; where a block's taps do not move one
//                    way along the row the kernel goes point by point instead, so its bits
//                    differ from point order here on those blocks: "DIFFER" is expected);
//   channels-scalar  point by point, corner by corner, channel by channel (scalar);
//   channels-vector  the same order, the C channels as one vector read-add-write.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

namespace {

constexpr int L = 16;
constexpr int D = 96, H = 112, W = 96;

struct Points {
  int64_t count = 0;
  std::vector<int32_t> low;    // element offset of each point's lowest corner (x fastest)
  std::vector<float> term[8];  // each corner's term (grad_output * weight)
  std::vector<uint8_t> inside; // bit k: corner k inside the volume
};

// The smooth grid of bench.smooth_grid in voxel units: identity plus a displacement of
// smooth sines, up to `amplitude` voxels.
Points smooth_points(float amplitude) {
  Points p;
  p.count = int64_t(D) * H * W;
  p.low.resize(p.count);
  for (auto& t : p.term) t.resize(p.count);
  p.inside.resize(p.count);
  uint32_t seed = 12345;
  auto uniform = [&] {
    seed = seed * 1664525u + 1013904223u;
    return float(seed >> 8) / float(1 << 24);
  };
  int64_t i = 0;
  for (int d = 0; d < D; ++d)
    for (int h = 0; h < H; ++h)
      for (int w = 0; w < W; ++w, ++i) {
        const float c[3] = {
            w + amplitude * std::sin(0.11f * d + 0.07f * h + 0.05f * w),
            h + amplitude * std::sin(0.05f * d + 0.13f * w + 1.0f),
            d + amplitude * std::sin(0.09f * h + 0.06f * w + 2.0f)};
        const int size[3] = {W, H, D};
        int low[3];
        float frac[3];
        uint8_t in[3][2];
        for (int a = 0; a < 3; ++a) {
          const float f = std::floor(c[a]);
          low[a] = int(f);
          frac[a] = c[a] - f;
          in[a][0] = low[a] >= 0 && low[a] < size[a];
          in[a][1] = low[a] + 1 >= 0 && low[a] + 1 < size[a];
        }
        const int lx = std::clamp(low[0], 0, W - 1), ly = std::clamp(low[1], 0, H - 1),
                  lz = std::clamp(low[2], 0, D - 1);
        p.low[i] = (lz * H + ly) * W + lx;
        const float g = uniform() - 0.5f;
        uint8_t mask = 0;
        for (int k = 0; k < 8; ++k) {
          const int bx = k & 1, by = k >> 1 & 1, bz = k >> 2;
          const float wk = (bx ? frac[0] : 1 - frac[0]) * (by ? frac[1] : 1 - frac[1]) *
                           (bz ? frac[2] : 1 - frac[2]);
          p.term[k][i] = g * wk;
          // Clamped lows shift the corners: keep only corners whose true voxel is the
          // clamped one's (as the kernel's low = 0 where no tap lies inside would).
          const bool ok = in[0][bx] && in[1][by] && in[2][bz] && lx == low[0] && ly == low[1] &&
                          lz == low[2];
          if (ok) mask |= uint8_t(1 << k);
        }
        p.inside[i] = mask;
      }
  return p;
}

const int32_t kCorner[8] = {0, 1, W, W + 1, H * W, H * W + 1, H * W + W, H * W + W + 1};

__mmask16 lanes_of(const Points& p, int64_t b, int k) {
  const __m128i m = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&p.inside[b]));
  return _mm_test_epi8_mask(m, _mm_set1_epi8(char(1 << k)));
}

void scalar(const Points& p, float* gin) {
  for (int64_t b = 0; b < p.count; b += L) {
    for (int k = 7; k >= 0; --k) {
      float* at = gin + kCorner[k];
      const __mmask16 lanes = lanes_of(p, b, k);
      if (lanes == 0xFFFF) {  // every lane, without branches (as the kernel)
        for (int l = 0; l < L; ++l) at[p.low[b + l]] += p.term[k][b + l];
      } else {
        for (int l = 0; l < L; ++l)
          if (lanes >> l & 1) at[p.low[b + l]] += p.term[k][b + l];
      }
    }
  }
}

void rounds(const Points& p, float* gin) {
  for (int64_t b = 0; b < p.count; b += L) {
    const __m512i low = _mm512_loadu_si512(&p.low[b]);
    const __m512i conflicts = _mm512_conflict_epi32(low);  // the same for every corner
    for (int k = 7; k >= 0; --k) {
      float* at = gin + kCorner[k];
      const __m512 t = _mm512_loadu_ps(&p.term[k][b]);
      __mmask16 left = lanes_of(p, b, k);
      while (left) {
        // Lanes none of whose earlier equal lanes are still left.
        const __mmask16 ready =
            _mm512_mask_testn_epi32_mask(left, conflicts, _mm512_set1_epi32(int(left)));
        const __m512 g = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), ready, low, at, 4);
        _mm512_mask_i32scatter_ps(at, ready, low, _mm512_add_ps(g, t), 4);
        left &= __mmask16(~ready);
      }
    }
  }
}

void distinct(const Points& p, float* gin) {
  for (int64_t b = 0; b < p.count; b += L) {
    const __m512i low = _mm512_loadu_si512(&p.low[b]);
    const bool apart = _mm512_test_epi32_mask(_mm512_conflict_epi32(low), _mm512_set1_epi32(-1)) == 0;
    for (int k = 7; k >= 0; --k) {
      float* at = gin + kCorner[k];
      const __mmask16 lanes = lanes_of(p, b, k);
      if (apart) {
        const __m512 t = _mm512_loadu_ps(&p.term[k][b]);
        const __m512 g = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lanes, low, at, 4);
        _mm512_mask_i32scatter_ps(at, lanes, low, _mm512_add_ps(g, t), 4);
      } else {
        for (int l = 0; l < L; ++l)
          if (lanes >> l & 1) at[p.low[b + l]] += p.term[k][b + l];
      }
    }
  }
}

// AVX2 (no scatter, no conflict detection): a block's 16 lanes as two halves of 8, per
// corner; where a half's 8 elements are distinct (each lane compared with the 7 rotations
// of the others) and all inside, gather them, add the terms as one vector and store the 8
// sums lane by lane; else the scalar loop. Same order as scalar.
bool distinct8(const int32_t* offsets) {
  const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(offsets));
  const __m256i rotate = _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 0);
  __m256i same = _mm256_setzero_si256(), rotated = low;
  for (int r = 1; r < 8; ++r) {
    rotated = _mm256_permutevar8x32_epi32(rotated, rotate);
    same = _mm256_or_si256(same, _mm256_cmpeq_epi32(low, rotated));
  }
  return _mm256_testz_si256(same, same);
}

void avx2_gather(const Points& p, float* gin) {
  for (int64_t b = 0; b < p.count; b += L) {
    const bool apart[2] = {distinct8(&p.low[b]), distinct8(&p.low[b + 8])};
    for (int k = 7; k >= 0; --k) {
      float* at = gin + kCorner[k];
      const __mmask16 lanes = lanes_of(p, b, k);
      for (int h = 0; h < 2; ++h) {
        const int64_t first = b + 8 * h;
        const int half = lanes >> (8 * h) & 0xFF;
        if (apart[h] && half == 0xFF) {
          const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&p.low[first]));
          alignas(32) float sum[8];
          _mm256_store_ps(sum, _mm256_add_ps(_mm256_i32gather_ps(at, low, 4),
                                             _mm256_loadu_ps(&p.term[k][first])));
          for (int l = 0; l < 8; ++l) at[p.low[first + l]] = sum[l];
        } else {
          for (int l = 0; l < 8; ++l)
            if (half >> l & 1) at[p.low[first + l]] += p.term[k][first + l];
        }
      }
    }
  }
}

// x0 and x1 of each (y, z) corner row as one 64-bit read-add-write where both are inside.
void pairs(const Points& p, float* gin) {
  for (int64_t b = 0; b < p.count; b += L) {
    for (int row = 3; row >= 0; --row) {
      const int k0 = 2 * row, k1 = 2 * row + 1;
      float* at = gin + kCorner[k0];
      // Corner k1 before k0 for each lane would be the kernel's order; per lane both
      // corners of a row are distinct elements, and lanes stay in order, so a lane's pair
      // may go together only if no later lane reaches its x1 through its x0 (the next
      // lane's x0 == this x1): then k1 of lane l must precede k0 of lane l + 1, as here.
      for (int l = 0; l < L; ++l) {
        const uint8_t in = p.inside[b + l];
        float* e = at + p.low[b + l];
        const bool a = in >> k0 & 1, c = in >> k1 & 1;
        if (a && c) {
          __m128 v = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(e)));
          const __m128 t = _mm_setr_ps(p.term[k0][b + l], p.term[k1][b + l], 0, 0);
          _mm_store_sd(reinterpret_cast<double*>(e), _mm_castps_pd(_mm_add_ps(v, t)));
        } else {
          if (c) e[1] += p.term[k1][b + l];
          if (a) e[0] += p.term[k0][b + l];
        }
      }
    }
  }
}

// NDHWC: grad_input (D, H, W, C), grad_output terms per point and channel.
template <int C>
void channels_scalar(const Points& p, const float* go, float* gin) {
  for (int64_t i = 0; i < p.count; ++i) {
    for (int k = 7; k >= 0; --k) {
      if (!(p.inside[i] >> k & 1)) continue;
      float* e = gin + int64_t(p.low[i] + kCorner[k]) * C;
      const float w = p.term[k][i];
      for (int c = 0; c < C; ++c) e[c] += go[i * C + c] * w;
    }
  }
}

// The kernel's order before channel vectors: channel by channel, each over the points (a block of 16,
// corner by corner from 7 down to 0, lane by lane), the elements C apart.
template <int C>
void channels_major(const Points& p, const float* go, float* gin) {
  constexpr int64_t kBlocks = 6;  // a row of 96 points
  for (int64_t first = 0; first < p.count; first += kBlocks * L)
    for (int c = 0; c < C; ++c)
      for (int64_t b = first; b < first + kBlocks * L && b < p.count; b += L)
        for (int k = 7; k >= 0; --k)
          for (int l = 0; l < L; ++l)
            if (p.inside[b + l] >> k & 1)
              gin[int64_t(p.low[b + l] + kCorner[k]) * C + c] += go[(b + l) * C + c] * p.term[k][b + l];
}

template <int C>
void channels_vector(const Points& p, const float* go, float* gin) {
  static_assert(C % 8 == 0);
  for (int64_t i = 0; i < p.count; ++i) {
    __m256 g[C / 8];
    for (int v = 0; v < C / 8; ++v) g[v] = _mm256_loadu_ps(go + i * C + 8 * v);
    for (int k = 7; k >= 0; --k) {
      if (!(p.inside[i] >> k & 1)) continue;
      float* e = gin + int64_t(p.low[i] + kCorner[k]) * C;
      const __m256 w = _mm256_set1_ps(p.term[k][i]);
      for (int v = 0; v < C / 8; ++v)
        _mm256_storeu_ps(e + 8 * v, _mm256_add_ps(_mm256_loadu_ps(e + 8 * v),
                                                  _mm256_mul_ps(g[v], w)));
    }
  }
}

// NCDHW with C channels: grad_input (C, D, H, W), grad_output (C, points); the terms are
// grad_output * weight, each product rounded, then added.
//   planes      the kernel's order: a block of 16 points, channel by channel, corner by
//               corner from 7 down to 0, lane by lane (grad_output read as one vector per
//               channel);
//   transposed  the block's grad_output transposed to (point, channel) first, then point
//               by point, corner by corner, K channels at a time (the elements a plane apart).
// Here transposed (K = 4) took 0.6-0.7x planes' time at C = 3, 8 and 16 (load average 4-7,
// noisy). In the kernel it lost: scatter_channels taking NCDHW too (point by point, K planes
// at a time, same bits), against the kernel's corner-major sweep of a row's blocks with
// prefetching, one process alternating the two (2 threads, load average 3-7): K = 4
// 0.81-0.94x on grid.bwd smooth C8, video C3, oasis field C3 and feature N2 C16; K = 1,
// 2, 8, 16 0.27-0.96x. Adjacent points share corners, so point by point each add waits on
// the previous point's store; the kernel keeps its sweep.
template <int C>
void planes(const Points& p, const float* go, float* gin) {
  const int64_t plane = int64_t(D) * H * W;
  for (int64_t b = 0; b < p.count; b += L)
    for (int c = 0; c < C; ++c) {
      const __m512 g = _mm512_loadu_ps(go + c * p.count + b);
      float* gin_c = gin + c * plane;
      for (int k = 7; k >= 0; --k) {
        alignas(64) float t[L];
        _mm512_store_ps(t, _mm512_mul_ps(g, _mm512_loadu_ps(&p.term[k][b])));
        const __mmask16 lanes = lanes_of(p, b, k);
        for (int l = 0; l < L; ++l)
          if (lanes >> l & 1) gin_c[p.low[b + l] + kCorner[k]] += t[l];
      }
    }
}

template <int C, int K = C>
void transposed(const Points& p, const float* go, float* gin) {
  const int64_t plane = int64_t(D) * H * W;
  for (int64_t b = 0; b < p.count; b += L) {
    alignas(64) float tile[L][C];
    for (int c = 0; c < C; ++c)
      for (int l = 0; l < L; ++l) tile[l][c] = go[c * p.count + b + l];
    for (int c0 = 0; c0 < C; c0 += K)  // K channels (planes) at a time
      for (int l = 0; l < L; ++l)
        for (int k = 7; k >= 0; --k) {
          if (!(p.inside[b + l] >> k & 1)) continue;
          const float w = p.term[k][b + l];
          float* e = gin + p.low[b + l] + kCorner[k];
          for (int c = c0; c < c0 + K && c < C; ++c) e[c * plane] += tile[l][c] * w;
        }
  }
}

double median_ms(const std::function<void()>& f, int repeats) {
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto s = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Point order, the bits every design must give: each point's corners, point by point.
void point_order(const Points& p, float* gin) {
  for (int64_t i = 0; i < p.count; ++i)
    for (int k = 0; k < 8; ++k)
      if (p.inside[i] >> k & 1) gin[p.low[i] + kCorner[k]] += p.term[k][i];
}

// The lanes l >= 1 whose low corner is lane l - 1's next element.
__mmask16 run_links(__m512i low) {
  const __m512i previous = _mm512_alignr_epi32(low, _mm512_setzero_si512(), 15);
  return _mm512_cmpeq_epi32_mask(low, _mm512_add_epi32(previous, _mm512_set1_epi32(1))) &
         __mmask16(~1u);
}

// x1 terms of `on1` lanes into p[l + 1] (lane 0 taking `carried` where `carry_in`), then
// x0 terms of `on0` lanes into p[l], one masked read-add-write of p[0..L).
inline void add_run_pair(float* p, __mmask16 on0, __m512 t0, __mmask16 on1, __m512 t1,
                         bool carry_in, float carried) {
  __m512 up_terms = _mm512_castsi512_ps(
      _mm512_alignr_epi32(_mm512_castps_si512(t1), _mm512_setzero_si512(), 15));
  __mmask16 up = __mmask16(on1 << 1);
  if (carry_in) {
    up_terms = _mm512_mask_mov_ps(up_terms, 1, _mm512_set1_ps(carried));
    up |= 1;
  }
  const __mmask16 touched = up | on0;
  __m512 sum = _mm512_maskz_loadu_ps(touched, p);
  sum = _mm512_mask_add_ps(sum, up, sum, up_terms);
  sum = _mm512_mask_add_ps(sum, on0, sum, t0);
  _mm512_mask_storeu_ps(p, touched, sum);
}

// The kernel's runs (grid_backward.cpp, scatter_runs): where at least half a block's lanes
// link into runs, run by run, each corner row one masked read-add-write plus a scalar add
// for the last lane's x1 term; else the scalar corner-major loop. With CARRY, the last
// lane's x1 term of each corner row waits in a register for the next block: where that
// block's first run starts on its element, it goes in as lane 0's carried x1 term (no
// scalar store for the vector load to wait on); else it is added before anything else.
template <bool CARRY>
void runs(const Points& p, float* gin) {
  struct Pending { float* at = nullptr; float value = 0; } pending[4];
  auto flush = [&](int j) {
    if (pending[j].at) *pending[j].at += pending[j].value;
    pending[j].at = nullptr;
  };
  for (int64_t b = 0; b < p.count; b += L) {
    const __m512i low = _mm512_loadu_si512(&p.low[b]);
    const __mmask16 links = run_links(low);
    __mmask16 lanes[8];
    for (int k = 0; k < 8; ++k) lanes[k] = lanes_of(p, b, k);
    const bool by_runs = 2 * _mm_popcnt_u32(links) >= L;
    // Where the carried terms go in: this block's first run, if it starts at lane 0.
    const bool first_run = by_runs && (links >> 1 & 1);
    for (int j = 0; j < 4; ++j)
      if (pending[j].at && !(first_run && pending[j].at == gin + p.low[b] + kCorner[2 * j]))
        flush(j);
    if (!by_runs) {  // point by point
      for (int l = 0; l < L; ++l)
        for (int k = 0; k < 8; ++k)
          if (lanes[k] >> l & 1) gin[p.low[b + l] + kCorner[k]] += p.term[k][b + l];
      continue;
    }
    for (int first = 0, end; first < L; first = end) {
      for (end = first + 1; end < L && (links >> end & 1); ++end) {
      }
      if (end - first == 1) {
        for (int k = 0; k < 8; ++k)
          if (lanes[k] >> first & 1) gin[p.low[b + first] + kCorner[k]] += p.term[k][b + first];
        continue;
      }
      const __mmask16 run = __mmask16((1u << end) - (1u << first));
      float* base = gin + (p.low[b + first] - first);
      for (int j = 0; j < 4; ++j) {
        const __mmask16 on0 = lanes[2 * j] & run, on1 = lanes[2 * j + 1] & run;
        const __m512 t0 = _mm512_loadu_ps(&p.term[2 * j][b]);
        const __m512 t1 = _mm512_loadu_ps(&p.term[2 * j + 1][b]);
        const bool carry_in = first == 0 && pending[j].at;
        add_run_pair(base + kCorner[2 * j], on0, t0, on1, t1, carry_in, pending[j].value);
        if (carry_in) pending[j].at = nullptr;
        if (on1 >> (L - 1) & 1) {  // the last lane's x1 term, past the vector
          float* at = base + kCorner[2 * j] + L;
          const float value = _mm512_cvtss_f32(_mm512_permutexvar_ps(_mm512_set1_epi32(L - 1), t1));
          if (CARRY) pending[j] = {at, value};
          else *at += value;
        }
      }
    }
  }
  for (int j = 0; j < 4; ++j) flush(j);
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 7;
  const Points p = smooth_points(3.0f);
  const int64_t volume = int64_t(D) * H * W;
  std::vector<float> reference(volume, 0.0f), out(volume);
  scalar(p, reference.data());
  struct Design { const char* name; void (*fn)(const Points&, float*); };
  const Design designs[] = {{"scalar", scalar}, {"rounds", rounds}, {"distinct", distinct},
                            {"pairs", pairs}, {"avx2-gather", avx2_gather}};
  int64_t collide = 0;
  for (int64_t b = 0; b < p.count; b += L) {
    const __m512i low = _mm512_loadu_si512(&p.low[b]);
    collide += _mm512_test_epi32_mask(_mm512_conflict_epi32(low), _mm512_set1_epi32(-1)) != 0;
  }
  std::printf("NCDHW C1, %lld points, %.1f%% of blocks with lanes sharing a corner\n",
              (long long)p.count, 100.0 * double(collide) / double(p.count / L));
  // Each design timed, and its bits compared with `expected` (named by `against`).
  auto time_designs = [&](const auto& list, const std::vector<float>& expected,
                          const char* against) {
    for (const Design& d : list) {
      std::fill(out.begin(), out.end(), 0.0f);
      d.fn(p, out.data());
      const bool same = std::memcmp(out.data(), expected.data(), volume * sizeof(float)) == 0;
      const double ms = median_ms([&] { d.fn(p, out.data()); }, repeats);
      std::printf("  %-16s %8.2f ms  bits %s%s\n", d.name, ms, same ? "equal" : "DIFFER", against);
    }
  };
  // The runs designs, against point order (the kernel's bits); the others, against scalar.
  std::vector<float> ordered(volume, 0.0f);
  point_order(p, ordered.data());
  const Design run_designs[] = {{"point-order", point_order}, {"runs", runs<false>},
                                {"runs-carry", runs<true>}};
  time_designs(run_designs, ordered, " (point order)");
  time_designs(designs, reference, "");
  // NDHWC, C = 8 and 32.
  auto channels = [&](auto tag) {
    constexpr int C = decltype(tag)::value;
    std::vector<float> go(p.count * C), ref(volume * C, 0.0f), got(volume * C, 0.0f);
    std::printf("NDHWC C%d\n", C);
    for (int64_t i = 0; i < p.count * C; ++i) go[i] = float((i * 7919) % 1000) / 1000.0f - 0.5f;
    channels_scalar<C>(p, go.data(), ref.data());
    channels_vector<C>(p, go.data(), got.data());
    const bool same = std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)) == 0;
    std::fill(got.begin(), got.end(), 0.0f);
    channels_major<C>(p, go.data(), got.data());
    const bool major_same = std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)) == 0;
    const double m_ms = median_ms([&] { channels_major<C>(p, go.data(), got.data()); }, repeats);
    std::printf("  %-16s %8.2f ms  bits %s\n", "channels-major", m_ms,
                major_same ? "equal" : "DIFFER");
    const double s_ms = median_ms([&] { channels_scalar<C>(p, go.data(), got.data()); }, repeats);
    const double v_ms = median_ms([&] { channels_vector<C>(p, go.data(), got.data()); }, repeats);
    std::printf("  %-16s %8.2f ms\n  %-16s %8.2f ms  bits %s\n",
                "channels-scalar", s_ms, "channels-vector", v_ms, same ? "equal" : "DIFFER");
  };
  // NCDHW, C = 3, 8 and 16: bits against point order (PyTorch's; transposed keeps it, planes
  // only where a block's taps move one way, where the kernel takes it).
  auto ncdhw = [&](auto tag) {
    constexpr int C = decltype(tag)::value;
    std::vector<float> go(p.count * C), ref(volume * C, 0.0f), got(volume * C, 0.0f);
    for (int64_t i = 0; i < p.count * C; ++i) go[i] = float((i * 7919) % 1000) / 1000.0f - 0.5f;
    transposed<C>(p, go.data(), ref.data());
    planes<C>(p, go.data(), got.data());
    const bool same = std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)) == 0;
    std::printf("NCDHW C%d\n", C);
    const double p_ms = median_ms([&] { planes<C>(p, go.data(), got.data()); }, repeats);
    const double t_ms = median_ms([&] { transposed<C>(p, go.data(), got.data()); }, repeats);
    const double t4_ms = median_ms([&] { transposed<C, 4>(p, go.data(), got.data()); }, repeats);
    const double t2_ms = median_ms([&] { transposed<C, 2>(p, go.data(), got.data()); }, repeats);
    std::printf("  %-16s %8.2f ms  bits %s\n  %-16s %8.2f ms\n  %-16s %8.2f ms\n  %-16s %8.2f ms\n",
                "planes", p_ms, same ? "equal" : "DIFFER", "transposed", t_ms,
                "transposed-4", t4_ms, "transposed-2", t2_ms);
  };
  ncdhw(std::integral_constant<int, 3>{});
  ncdhw(std::integral_constant<int, 8>{});
  ncdhw(std::integral_constant<int, 16>{});
  channels(std::integral_constant<int, 8>{});
  channels(std::integral_constant<int, 32>{});
  return 0;
}
