// Box sums and the local NCC with its gradient (local_ncc.h), separable and in place.
//
// A window sum is taken along D first (plane by plane, straight from the inputs), then
// within each (H, W) plane along W and H. Every sum adds its window's terms in increasing
// index order, whatever the ISA or thread count, so the results are the same bits for all.
// Threads share planes: each pass writes only its own planes of its output and reads
// planes that no task of that pass writes, so no pass races.
#include "local_ncc.h"
#include "team.h"

#include <omp.h>

#include <algorithm>
#include <vector>

namespace vs {
namespace VS_ISA {
namespace {

struct Shape {
  int64_t D, H, W;
  int64_t plane() const { return H * W; }
};

Shape shape_of(const Strided& s) { return {s.shape[0], s.shape[1], s.shape[2]}; }

int64_t first(int64_t i, int r) { return std::max<int64_t>(i - r, 0); }
int64_t last(int64_t i, int r, int64_t n) { return std::min<int64_t>(i + r, n - 1); }

// 1 / (the number of voxels of each window along an axis of n voxels).
template <class T>
std::vector<T> inverse_counts(int64_t n, int r) {
  std::vector<T> inverse(n);
  for (int64_t i = 0; i < n; ++i) inverse[i] = T(1) / T(last(i, r, n) - first(i, r) + 1);
  return inverse;
}

// One row's window sums along W, in -> out. The inner windows go shift by shift over the
// row (vectorisable), the ones cut by the ends one by one; both add in index order.
template <class T>
void box_row(const T* in, T* out, int64_t W, int r) {
  const int64_t inner_begin = std::min<int64_t>(r, W);
  const int64_t inner_end = std::max<int64_t>(W - r, inner_begin);
  for (int64_t x = inner_begin; x < inner_end; ++x) out[x] = in[x - r];
  for (int k = 1 - r; k <= r; ++k)
    for (int64_t x = inner_begin; x < inner_end; ++x) out[x] += in[x + k];
  auto cut = [&](int64_t begin, int64_t end) {
    for (int64_t x = begin; x < end; ++x) {
      T s = in[first(x, r)];
      for (int64_t k = first(x, r) + 1; k <= last(x, r, W); ++k) s += in[k];
      out[x] = s;
    }
  };
  cut(0, inner_begin);
  cut(inner_end, W);
}

// The window sums of one (H, W) plane, in place; scratch holds a plane.
template <class T>
void box_plane(T* plane, T* scratch, const Shape& s, int r) {
  for (int64_t y = 0; y < s.H; ++y) box_row(plane + y * s.W, scratch + y * s.W, s.W, r);
  for (int64_t y = 0; y < s.H; ++y) {
    T* out = plane + y * s.W;
    const T* top = scratch + first(y, r) * s.W;
    for (int64_t x = 0; x < s.W; ++x) out[x] = top[x];
    for (int64_t k = first(y, r) + 1; k <= last(y, r, s.H); ++k) {
      const T* row = scratch + k * s.W;
      for (int64_t x = 0; x < s.W; ++x) out[x] += row[x];
    }
  }
}

// out's plane z = the sum of planes first(z)..last(z) of term(plane k, point p).
template <class T, class Term>
void sum_along_d(T* out, int64_t z, const Shape& s, int r, Term term) {
  const int64_t n = s.plane();
  const int64_t k0 = first(z, r);
  for (int64_t p = 0; p < n; ++p) out[p] = term(k0 * n + p);
  for (int64_t k = k0 + 1; k <= last(z, r, s.D); ++k)
    for (int64_t p = 0; p < n; ++p) out[p] += term(k * n + p);
}

// Points per block of the fused sums along D below: their partial sums stay in L1 while
// the planes of the window stream past.
constexpr int64_t kBlock = 512;

// Plane z of the window sums along D of J, J^2 and F J, in one pass over the window's
// planes of J and F (each sum adds its terms in index order, as sum_along_d).
template <class T>
void sums_along_d(T* __restrict sum_J, T* __restrict sum_JJ, T* __restrict sum_FJ,
                  const T* __restrict F, const T* __restrict J, int64_t z, const Shape& s,
                  int r) {
  const int64_t n = s.plane(), k0 = first(z, r), k1 = last(z, r, s.D), o = z * n;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    const T* Jk = J + k0 * n;
    const T* Fk = F + k0 * n;
    for (int64_t p = b; p < e; ++p) {
      const T j = Jk[p];
      sum_J[o + p] = j;
      sum_JJ[o + p] = j * j;
      sum_FJ[o + p] = Fk[p] * j;
    }
    for (int64_t k = k0 + 1; k <= k1; ++k) {
      Jk = J + k * n;
      Fk = F + k * n;
      for (int64_t p = b; p < e; ++p) {
        const T j = Jk[p];
        sum_J[o + p] += j;
        sum_JJ[o + p] += j * j;
        sum_FJ[o + p] += Fk[p] * j;
      }
    }
  }
}

// Plane z of d(loss)/dJ = box(d_J_sum) + 2 J box(d_J_var) + F box(d_cross), the window
// sums along D of the three gradients taken in one pass over their planes.
template <class T>
void gradient_along_d(T* __restrict grad, const T* __restrict d_sum, const T* __restrict d_var,
                      const T* __restrict d_cross, const T* __restrict F,
                      const T* __restrict J, int64_t z, const Shape& s, int r) {
  const int64_t n = s.plane(), k0 = first(z, r), k1 = last(z, r, s.D), o = z * n;
  alignas(64) T var[kBlock];
  alignas(64) T cross[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    T* g = grad + o + b;
    const int64_t m = e - b;
    for (int64_t p = 0; p < m; ++p) {
      g[p] = d_sum[k0 * n + b + p];
      var[p] = d_var[k0 * n + b + p];
      cross[p] = d_cross[k0 * n + b + p];
    }
    for (int64_t k = k0 + 1; k <= k1; ++k) {
      const int64_t q = k * n + b;
      for (int64_t p = 0; p < m; ++p) {
        g[p] += d_sum[q + p];
        var[p] += d_var[q + p];
        cross[p] += d_cross[q + p];
      }
    }
    for (int64_t p = 0; p < m; ++p) g[p] += T(2) * J[o + b + p] * var[p];
    for (int64_t p = 0; p < m; ++p) g[p] += F[o + b + p] * cross[p];
  }
}

// One row's operands of the local NCC: the window sums, the fixed volume's, and the
// inverse window sizes (those along D and H folded into one factor).
template <class T>
struct Row {
  T* sum_J;
  T* sum_JJ;
  T* sum_FJ;
  const T* F_sum;
  const T* F_var;
  const T* inverse_w;
  T inverse_dh, eps, scale;
};

// One row's cc; with kGrad its window sums become d(loss)/d(those sums) in place. The
// pointers are the row's alone (restrict), so that the loop vectorises; every lane does
// the scalar operations, in their order.
template <class T, bool kGrad>
void cc_row(T* __restrict cc, const Row<T>& row, int64_t W) {
  T* __restrict sum_J = row.sum_J;
  T* __restrict sum_JJ = row.sum_JJ;
  T* __restrict sum_FJ = row.sum_FJ;
  const T* __restrict F_sum = row.F_sum;
  const T* __restrict F_var = row.F_var;
  const T* __restrict inverse_w = row.inverse_w;
  const T inverse_dh = row.inverse_dh, eps = row.eps, scale = row.scale;
  for (int64_t x = 0; x < W; ++x) {
    const T inverse = inverse_dh * inverse_w[x];
    const T mean_J = sum_J[x] * inverse;
    const T cross = sum_FJ[x] - F_sum[x] * mean_J;
    const T J_var = sum_JJ[x] - sum_J[x] * mean_J;
    const T reciprocal = T(1) / (F_var[x] * J_var + eps);
    const T value = cross * cross * reciprocal;
    cc[x] = value;
    if (kGrad) {
      const T d_cross = T(2) * scale * cross * reciprocal;
      const T d_J_var = -scale * value * reciprocal * F_var[x];
      sum_J[x] = -inverse * (d_cross * F_sum[x] + T(2) * d_J_var * sum_J[x]);
      sum_JJ[x] = d_J_var;
      sum_FJ[x] = d_cross;
    }
  }
}

// The sum of a plane's cc in float64: point p into slot p mod kSumSlots, then the slots
// in order. The slots are independent chains (they vectorise); the order is fixed.
constexpr int kSumSlots = 8;

template <class T>
double plane_sum(const T* cc, int64_t n) {
  double slot[kSumSlots] = {};
  int64_t p = 0;
  for (; p + kSumSlots <= n; p += kSumSlots)
    for (int k = 0; k < kSumSlots; ++k) slot[k] += double(cc[p + k]);
  for (int k = 0; p < n; ++p, ++k) slot[k] += double(cc[p]);
  double total = 0.0;
  for (double s : slot) total += s;
  return total;
}

template <class T>
void box_sum_of(const BoxSumArgs& a) {
  const Shape s = shape_of(a.volume);
  const T* in = a.volume.ptr<T>();
  T* out = a.out.ptr<T>();
  TeamCpus team(a.threads);
#pragma omp parallel num_threads(a.threads)
  {
    team.settle(omp_get_thread_num());
    std::vector<T> scratch(s.plane());
#pragma omp for schedule(dynamic, 1)
    for (int64_t z = 0; z < s.D; ++z) {
      T* plane = out + z * s.plane();
      sum_along_d(plane, z, s, a.radius, [in](int64_t i) { return in[i]; });
      box_plane(plane, scratch.data(), s, a.radius);
    }
  }
}

template <class T>
double local_ncc_of(const LocalNccArgs& a) {
  const Shape s = shape_of(a.fixed);
  const int64_t n = s.plane(), volume = s.D * n;
  const int r = a.radius;
  const T* F = a.fixed.ptr<T>();
  const T* F_sum = a.fixed_sum.ptr<T>();
  const T* F_var = a.fixed_var.ptr<T>();
  const T* J = a.warped.ptr<T>();
  // the window sums of J, J^2 and F J; where a gradient is wanted, each plane's then
  // become d(loss)/d(those sums) in the same place
  T* sum_J = a.work.ptr<T>();
  T* sum_JJ = sum_J + volume;
  T* sum_FJ = sum_JJ + volume;
  T* grad = a.grad.empty() ? nullptr : a.grad.ptr<T>();
  const std::vector<T> inverse_d = inverse_counts<T>(s.D, r), inverse_h = inverse_counts<T>(s.H, r),
                           inverse_w = inverse_counts<T>(s.W, r);
  const T eps = T(a.eps), scale = T(a.grad_scale);
  std::vector<double> plane_sums(s.D);
  TeamCpus team(a.threads);
#pragma omp parallel num_threads(a.threads)
  {
    team.settle(omp_get_thread_num());
    std::vector<T> scratch(n);
#pragma omp for schedule(dynamic, 1)
    for (int64_t z = 0; z < s.D; ++z) {
      const int64_t o = z * n;
      sums_along_d(sum_J, sum_JJ, sum_FJ, F, J, z, s, r);
      for (T* sums : {sum_J, sum_JJ, sum_FJ}) box_plane(sums + o, scratch.data(), s, r);
      T* cc = scratch.data();
      for (int64_t y = 0; y < s.H; ++y) {
        const int64_t i = o + y * s.W;
        const Row<T> row{sum_J + i, sum_JJ + i, sum_FJ + i, F_sum + i, F_var + i,
                         inverse_w.data(), inverse_d[z] * inverse_h[y], eps, scale};
        if (grad)
          cc_row<T, true>(cc + y * s.W, row, s.W);
        else
          cc_row<T, false>(cc + y * s.W, row, s.W);
      }
      plane_sums[z] = plane_sum(cc, n);
      // back through the window sums (a box sum is its own adjoint): first within the
      // plane, while it is in cache (it needs no other plane)...
      if (grad)
        for (T* sums : {sum_J, sum_JJ, sum_FJ}) box_plane(sums + o, scratch.data(), s, r);
    }
    if (grad) {
      // ...then along D, into d(loss)/dJ, once every plane is done
#pragma omp for schedule(dynamic, 1)
      for (int64_t z = 0; z < s.D; ++z)
        gradient_along_d(grad, sum_J, sum_JJ, sum_FJ, F, J, z, s, r);
    }
  }
  double total = 0.0;
  for (double plane : plane_sums) total += plane;
  return volume ? total / double(volume) : 0.0;
}

// Where the volume varies (local_ncc.h), plane by plane: each task writes its planes' rows
// and columns alone and only reads the volume.
template <class T>
void varying_of(const VaryingArgs& a) {
  const Shape s = shape_of(a.volume);
  const T* v = a.volume.ptr<T>();
  uint8_t* rows = a.rows.ptr<uint8_t>();
  uint8_t* columns = a.columns.ptr<uint8_t>();
  TeamCpus team(a.threads);
#pragma omp parallel num_threads(a.threads)
  {
    team.settle(omp_get_thread_num());
    // step[x]: voxels x and x + 1 of a row differ; varies[x]: voxel x differs from a
    // neighbour
    std::vector<uint8_t> step(s.W), varies(s.W);
#pragma omp for schedule(static)
    for (int64_t z = 0; z < s.D; ++z) {
      uint8_t* column = columns + z * s.W;
      std::fill(column, column + s.W, uint8_t(0));
      for (int64_t y = 0; y < s.H; ++y) {
        const T* p = v + (z * s.H + y) * s.W;
        uint8_t* d = varies.data();
        for (int64_t x = 0; x + 1 < s.W; ++x) step[x] = p[x] != p[x + 1];
        d[0] = s.W > 1 ? step[0] : 0;
        for (int64_t x = 1; x + 1 < s.W; ++x) d[x] = step[x - 1] | step[x];
        if (s.W > 1) d[s.W - 1] = step[s.W - 2];
        const T* neighbours[4] = {y > 0 ? p - s.W : nullptr, y + 1 < s.H ? p + s.W : nullptr,
                                  z > 0 ? p - s.plane() : nullptr,
                                  z + 1 < s.D ? p + s.plane() : nullptr};
        for (const T* q : neighbours)
          if (q)
            for (int64_t x = 0; x < s.W; ++x) d[x] |= uint8_t(p[x] != q[x]);
        uint8_t any = 0;
        for (int64_t x = 0; x < s.W; ++x) {
          any |= d[x];
          column[x] |= d[x];
        }
        rows[z * s.H + y] = any;
      }
    }
  }
}

}  // namespace

void varying(const VaryingArgs& a) {
  if (a.volume.dtype == DType::float64)
    varying_of<double>(a);
  else
    varying_of<float>(a);
}

void box_sum(const BoxSumArgs& a) {
  if (a.volume.dtype == DType::float64)
    box_sum_of<double>(a);
  else
    box_sum_of<float>(a);
}

double local_ncc(const LocalNccArgs& a) {
  return a.fixed.dtype == DType::float64 ? local_ncc_of<double>(a) : local_ncc_of<float>(a);
}

}  // namespace VS_ISA
}  // namespace vs
