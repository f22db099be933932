// Warps (warp_3d): grid sampling where the grid affine_grid(theta) + displacement * scale
// would sample, that grid never stored. The grid kernels (grid_forward.cpp,
// grid_backward.cpp and the backward's plan) take where a row's coordinates come from and
// where a point's grid gradient goes as template parameters (grid_common.h: GridRows,
// GridGradientStore); a warp hands them the two below instead, so every interpolation mode
// of the grid kernels serves warps too.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "grid_common.h"

namespace vs {
namespace VS_ISA {
namespace grid {

// A warp's coordinate source: point (n, d, h, w) samples at
// c_k = t_k0 * bx + ((t_k1 * by + t_k2 * bz) + t_k3), plus u_k * s_k where a displacement u
// is given, in the compute type T (theta = t of batch n, the base grid b as affine_grid
// lays it out, s the displacement's scale to normalised units).
template <class G, class T>
struct WarpRows {
  const Strided& displacement;  // absent: 0
  std::vector<T> theta;         // N x 3 x 4
  std::vector<T> bx, by, bz;    // the base grid's coordinates along each axis
  T scale[3];

  // Normalised coordinate of index i of an axis of `size` points (_coords.base): float64
  // operations in that order, then rounded to T.
  static T base(int64_t i, int64_t size, bool align_corners) {
    if (size == 1) return T(0);
    if (align_corners) return T(2.0 * double(i) / double(size - 1) - 1.0);
    return T((2.0 * double(i) + 1.0) / double(size) - 1.0);
  }

  WarpRows(const WarpArgs& w, const Geometry& g)
      : displacement(w.displacement), theta(size_t(12 * g.N)), bx(size_t(g.Wo)),
        by(size_t(g.Ho)), bz(size_t(g.Do)) {
    const bool align = w.sample.align_corners;
    const int64_t* st = w.theta.stride;
    for (int64_t n = 0; n < g.N; ++n)
      for (int k = 0; k < 3; ++k)
        for (int j = 0; j < 4; ++j)
          theta[size_t(12 * n + 4 * k + j)] =
              load<G, T>(w.theta.ptr<G>() + n * st[0] + k * st[1] + j * st[2]);
    for (int64_t i = 0; i < g.Wo; ++i) bx[size_t(i)] = base(i, g.Wo, align);
    for (int64_t i = 0; i < g.Ho; ++i) by[size_t(i)] = base(i, g.Ho, align);
    for (int64_t i = 0; i < g.Do; ++i) bz[size_t(i)] = base(i, g.Do, align);
    for (int k = 0; k < 3; ++k) scale[k] = T(w.scale[k]);
  }

  void fill(const Row& row, const Geometry& g, RowCoords<T>& r) const {
    for (int k = 0; k < 3; ++k) {  // along a row only bx changes
      const T* t = theta.data() + 12 * row.n + 4 * k;
      const T slope = t[0], offset = (t[1] * by[size_t(row.h)] + t[2] * bz[size_t(row.d)]) + t[3];
      T* c = r.axis(k);
      for (int64_t w = 0; w < g.Wo; ++w) c[w] = slope * bx[size_t(w)] + offset;
    }
    if (displacement.empty()) return;
    const int64_t* s = displacement.stride;
    const G* p = displacement.ptr<G>() + row.n * s[0] + row.d * s[1] + row.h * s[2];
    T* cx = r.axis(0);
    T* cy = r.axis(1);
    T* cz = r.axis(2);
    const T sx = scale[0], sy = scale[1], sz = scale[2];
    auto add = [&](int64_t point, int64_t axis) {  // constants let the compiler vectorise
      for (int64_t w = 0; w < g.Wo; ++w) {
        const G* q = p + w * point;
        cx[w] = cx[w] + load<G, T>(q) * sx;
        cy[w] = cy[w] + load<G, T>(q + axis) * sy;
        cz[w] = cz[w] + load<G, T>(q + 2 * axis) * sz;
      }
    };
    if (s[3] == 3 && s[4] == 1) add(3, 1);  // a contiguous displacement
    else add(s[3], s[4]);
  }

  // A hint to fetch the row's displacement ahead of fill() (GridRows::prefetch).
  void prefetch(const Row& row, const Geometry& g) const {
    const int64_t* s = displacement.stride;
    if (displacement.empty() || s[3] != 3 || s[4] != 1) return;
    prefetch_span(displacement.ptr<G>() + row.n * s[0] + row.d * s[1] + row.h * s[2],
                  3 * g.Wo * int64_t(sizeof(G)));
  }
};

// A warp's grid-gradient sink. The displacement's gradient is the coordinates' times the
// scales. Theta's is grad_theta[n, k, j] = the sum over batch n's points of g_k * b_j,
// (b_j) = (bx, by, bz, 1); along a row by and bz are constant, so a row needs only
// sum g_k and sum g_k * bx. Each row keeps them in float64 in kSlots slots, slot s summing
// the points w = s mod kSlots in increasing w (the order in which one task hands a row's
// points over, grid_common.h): the same additions whatever the vector width, and slots
// that vectorise. finish() sums each row's slots, then each batch's rows, in order in
// float64 and rounds once. The bits depend on neither the thread count nor the ISA.
template <class G, class T>
struct WarpGradientStore {
  static constexpr int kSlots = 4;
  static constexpr int kRowSums = 6 * kSlots;  // per row: [sum g_k; sum g_k * bx][slot]
  const WarpRows<G, T>& points;
  const Strided& grad_displacement;  // absent: not wanted
  const Strided& grad_theta;         // absent: not wanted
  double* row_sums;                  // kRowSums per output row, zeroed

  bool wanted() const { return !grad_displacement.empty() || !grad_theta.empty(); }

  template <int L>
  void store(const Row& row, int64_t w, int64_t valid, const T* gx, const T* gy,
             const T* gz) const {
    if (!grad_displacement.empty()) {
      alignas(64) T g[3][L];
      for (int64_t l = 0; l < L; ++l) {
        g[0][l] = gx[l] * points.scale[0];
        g[1][l] = gy[l] * points.scale[1];
        g[2][l] = gz[l] * points.scale[2];
      }
      GridGradientStore<G>{grad_displacement}.template store<L>(row, w, valid, g[0], g[1], g[2]);
    }
    if (grad_theta.empty()) return;
    double sum[6][kSlots];
    double* out = row_sums + kRowSums * row.index;
    std::copy(out, out + kRowSums, &sum[0][0]);
    const T* g[3] = {gx, gy, gz};
    auto add = [&](int64_t l, int slot) {
      const double bx = double(points.bx[size_t(w + l)]);
      for (int k = 0; k < 3; ++k) {
        sum[k][slot] += double(g[k][l]);
        sum[3 + k][slot] += double(g[k][l]) * bx;  // exact for float32
      }
    };
    if (L % kSlots == 0 && valid == L) {  // w is a multiple of L: slot = lane mod kSlots
      for (int64_t l = 0; l < L; l += kSlots)
        for (int slot = 0; slot < kSlots; ++slot) add(l + slot, slot);
    } else {
      for (int64_t l = 0; l < valid; ++l) add(l, int((w + l) % kSlots));
    }
    std::copy(&sum[0][0], &sum[0][0] + kRowSums, out);
  }

  // Points that do not touch the volume: theirs is 0, which the row sums need not add.
  template <int L>
  void zero(const Row& row, int64_t w, int64_t valid) const {
    if (!grad_displacement.empty())
      GridGradientStore<G>{grad_displacement}.template zero<L>(row, w, valid);
  }

  // grad_theta from the rows' sums, after every row (one thread).
  void finish(const Geometry& g) const {
    if (grad_theta.empty()) return;
    const int64_t* s = grad_theta.stride;
    for (int64_t n = 0; n < g.N; ++n) {
      double sum[3][4] = {};
      for (int64_t d = 0; d < g.Do; ++d)
        for (int64_t h = 0; h < g.Ho; ++h) {
          const double* slots = row_sums + kRowSums * ((n * g.Do + d) * g.Ho + h);
          double r[6] = {};
          for (int q = 0; q < 6; ++q)
            for (int slot = 0; slot < kSlots; ++slot) r[q] += slots[q * kSlots + slot];
          const double by = double(points.by[size_t(h)]), bz = double(points.bz[size_t(d)]);
          for (int k = 0; k < 3; ++k) {
            sum[k][0] += r[3 + k];
            sum[k][1] += by * r[k];
            sum[k][2] += bz * r[k];
            sum[k][3] += r[k];
          }
        }
      for (int k = 0; k < 3; ++k)
        for (int j = 0; j < 4; ++j)
          storage<G>::template store<double>(grad_theta.ptr<G>() + n * s[0] + k * s[1] + j * s[2],
                                             sum[k][j]);
    }
  }
};

}  // namespace grid
}  // namespace VS_ISA
}  // namespace vs
