// The noise monitor's step in one call: the sum over a batch's examples of their squared
// per-example gradient norms, layer by layer (theory/monitor/layer_norms.py states the formulas), and
// the squared norm of the accumulated gradient, all accumulated in double precision.
//
// theory.NoiseScaleMonitor calls `sums` once per measured step with every layer's captured
// (input, output gradient) pair instead of issuing a few torch operators per layer from Python:
// on millisecond steps each operator call costs 10-25 us of Python and dispatch, which is what
// the monitor's overhead was made of. Layers whose terms are elementwise (a Linear layer on one
// position, Embedding, LayerNorm / RMSNorm, the gradients' squares) are plain loops here;
// sequence and convolution layers take batched matrix products (at::bmm_out) over chunks of
// examples whose products fit in the cache, reduced right after. CPU tensors only: the monitor
// keeps its torch path for other devices and where this extension cannot be built.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

namespace example_norms {
namespace {

enum Kind : int64_t { LINEAR = 0, CONV = 1, EMBEDDING = 2, NORM = 3 };
enum Flag : int64_t { WEIGHT = 1, BIAS = 2, RMS = 4 };

// Elements of a chunk's per-example products (materialized sums or Gram matrices): about
// 256 KiB of float32, so that a product is still in cache when it is reduced.
constexpr int64_t CHUNK_ELEMENTS = 1 << 16;

// (pass, kind, input, output gradient, flags, n, eps): n is the groups of a convolution, the
// padding index of an embedding (-1: none), the normalized elements of a norm layer.
using Job = std::tuple<int64_t, int64_t, at::Tensor, at::Tensor, int64_t, int64_t, double>;

at::ScalarType compute_type(const at::Tensor& g) {
  const auto t = g.scalar_type();
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

// t in dtype `type`, contiguous (without an operator call when it already is: a call through
// the dispatcher costs about a microsecond, which is what a small layer's whole job costs)
at::Tensor as(const at::Tensor& t, at::ScalarType type) {
  if (t.scalar_type() == type && t.is_contiguous()) return t;
  return t.to(type).contiguous();
}

// sum over [0, n) of f(begin, end) over ranges of examples, in double, over torch's intra-op
// threads (f gets a range so that its scratch buffers are allocated once per range)
template <typename F>
double parallel_sum(int64_t n, int64_t grain, const F& f) {
  if (n <= grain) return f(0, n);
  return at::parallel_reduce(
      0, n, grain, 0.0,
      [&](int64_t begin, int64_t end, double acc) { return acc + f(begin, end); },
      std::plus<double>());
}

// Lanes of the accumulations below: separate partial sums, so that the loops are not bound by
// the latency of one running sum (they are 4-8x faster, and vectorized)
constexpr int64_t LANES = 16;

// sum of f(i) over i < n, in double
template <typename F>
double accumulate(int64_t n, const F& f) {
  double acc[LANES] = {};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES) {
    for (int64_t j = 0; j < LANES; ++j) acc[j] += f(i + j);
  }
  for (int64_t j = 0; i < n; ++i, ++j) acc[j] += f(i);
  // a tree of vector adds, not a chain of LANES dependent ones (which would cost more than
  // the loop itself on a row of 100)
  for (int64_t w = LANES / 2; w > 0; w /= 2) {
    for (int64_t j = 0; j < w; ++j) acc[j] += acc[j + w];
  }
  return acc[0];
}

template <typename T>
double dot(const T* x, const T* y, int64_t n) {
  return accumulate(n, [=](int64_t i) { return static_cast<double>(x[i]) * y[i]; });
}

template <typename T>
double sum_sq(const T* x, int64_t n) {
  return dot(x, x, n);
}

template <typename T>
double sum(const T* x, int64_t n) {
  return accumulate(n, [=](int64_t i) { return static_cast<double>(x[i]); });
}

template <typename T>
double total_sq(const at::Tensor& t) {
  const T* x = t.data_ptr<T>();
  const int64_t n = t.numel(), grain = 1 << 15;
  return at::parallel_reduce(
      0, n, grain, 0.0,
      [&](int64_t begin, int64_t end, double acc) { return acc + sum_sq(x + begin, end - begin); },
      std::plus<double>());
}

double squared(const at::Tensor& t) {
  if (t.numel() == 0) return 0.0;
  if (t.scalar_type() == at::kDouble) return total_sq<double>(t.contiguous());
  return total_sq<float>(as(t, at::kFloat));
}

// sum_i |sum_p d_ip|^2 for d [B, P, O]
template <typename T>
double position_sum_sq(const at::Tensor& d) {
  const int64_t b = d.size(0), p = d.size(1), o = d.size(2);
  const T* base = d.data_ptr<T>();
  return parallel_sum(b, 4, [&](int64_t begin, int64_t end) {
    std::vector<double> acc(o);
    double s = 0.0;
    for (int64_t i = begin; i < end; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t q = 0; q < p; ++q) {
        const T* row = base + (i * p + q) * o;
        double* __restrict out = acc.data();
#pragma omp simd
        for (int64_t k = 0; k < o; ++k) out[k] += row[k];
      }
      s += sum_sq(acc.data(), o);
    }
    return s;
  });
}

// A per-example product of at most this many elements is summed by the loops below
constexpr int64_t SMALL_PRODUCT = 4096;

// Register blocks of the small products: ROWS rows of COLS columns of the [O, K] sum are
// accumulated over the positions in registers, then squared (no buffer: only the sum of the
// squares is needed)
constexpr int64_t ROWS = 4, COLS = 16;

// sum over the [O, K] entries of one example's sum_p d_p a_p^T of their squares, the block of
// rows [r0, r0 + rn) and columns [c0, c0 + cn) (RN, CN: the block's size when it is known at
// compile time, 0 otherwise)
template <typename T, int64_t RN, int64_t CN>
double block_sq(const T* d, const T* a, int64_t p, int64_t o, int64_t k, int64_t r0, int64_t c0,
                int64_t rn, int64_t cn) {
  const int64_t nr = RN ? RN : rn, nc = CN ? CN : cn;
  T acc[ROWS][COLS] = {};
  for (int64_t q = 0; q < p; ++q) {
    const T* dq = d + q * o + r0;
    const T* aq = a + q * k + c0;
    for (int64_t r = 0; r < nr; ++r) {
      const T dr = dq[r];
#pragma omp simd
      for (int64_t c = 0; c < nc; ++c) acc[r][c] += dr * aq[c];
    }
  }
  double s = 0.0;
  for (int64_t r = 0; r < nr; ++r) s += sum_sq(acc[r], nc);
  return s;
}

// sum_i |sum_p d_ip a_ip^T|_F^2 by plain loops over register blocks (T accumulators, as a
// matrix product's); on short sequences batched BLAS products of a few thousand elements each
// cost several times their multiplications
template <typename T>
double small_outer(const T* d, const T* a, int64_t b, int64_t p, int64_t o, int64_t k) {
  return parallel_sum(b, 4, [&](int64_t begin, int64_t end) {
    double s = 0.0;
    for (int64_t i = begin; i < end; ++i) {
      const T* di = d + i * p * o;
      const T* ai = a + i * p * k;
      for (int64_t r0 = 0; r0 < o; r0 += ROWS) {
        const int64_t rn = std::min(ROWS, o - r0);
        for (int64_t c0 = 0; c0 < k; c0 += COLS) {
          const int64_t cn = std::min(COLS, k - c0);
          s += rn == ROWS && cn == COLS
                   ? block_sq<T, ROWS, COLS>(di, ai, p, o, k, r0, c0, rn, cn)
                   : block_sq<T, 0, 0>(di, ai, p, o, k, r0, c0, rn, cn);
        }
      }
    }
    return s;
  });
}

// sum_i |sum_p d_ip a_ip^T|_F^2 (+ |sum_p d_ip|^2 with bias) for d [B, P, O], a [B, P, K]:
// the Gram form sum_pq (d_p . d_q)(a_p . a_q) where gram_advantage P (O + K) < O K, else the
// materialized [O, K] sums; chunks of examples through preallocated products.
template <typename T>
double outer(const at::Tensor& d, const at::Tensor& a, bool bias, double gram_advantage) {
  const int64_t b = d.size(0), p = d.size(1), o = d.size(2), k = a.size(2);
  double total = 0.0;
  if (gram_advantage * p * (o + k) < static_cast<double>(o) * k) {
    const int64_t chunk = std::max<int64_t>(1, CHUNK_ELEMENTS / (p * p));
    at::Tensor gd = at::empty({std::min(chunk, b), p, p}, d.options());
    at::Tensor ga = at::empty_like(gd);
    for (int64_t s = 0; s < b; s += chunk) {
      const int64_t c = std::min(chunk, b - s);
      at::Tensor dc = d.narrow(0, s, c), ac = a.narrow(0, s, c);
      at::Tensor gdc = gd.narrow(0, 0, c), gac = ga.narrow(0, 0, c);
      at::bmm_out(gdc, dc, dc.transpose(1, 2));
      at::bmm_out(gac, ac, ac.transpose(1, 2));
      const T* x = gdc.data_ptr<T>();
      const T* y = gac.data_ptr<T>();
      const int64_t n = c * p * p;
      total += dot(x, y, n);
      if (bias) total += sum(x, n);   // a column of ones appended to a adds 1 to its Gram

    }
    return total;
  }
  if (o * k <= SMALL_PRODUCT && d.is_contiguous() && a.is_contiguous()) {
    return small_outer(d.data_ptr<T>(), a.data_ptr<T>(), b, p, o, k) +
           (bias ? position_sum_sq<T>(d) : 0.0);
  }
  const int64_t chunk = std::max<int64_t>(1, CHUNK_ELEMENTS / (o * k));
  at::Tensor prod = at::empty({std::min(chunk, b), o, k}, d.options());
  for (int64_t s = 0; s < b; s += chunk) {
    const int64_t c = std::min(chunk, b - s);
    at::Tensor pc = prod.narrow(0, 0, c);
    at::bmm_out(pc, d.narrow(0, s, c).transpose(1, 2), a.narrow(0, s, c));
    total += sum_sq(pc.data_ptr<T>(), c * o * k);
  }
  if (bias) total += position_sum_sq<T>(d);
  return total;
}

template <typename T>
double linear(const at::Tensor& x, const at::Tensor& g, int64_t flags, double gram_advantage) {
  const int64_t b = g.size(0), o = g.size(-1), k = x.size(-1);
  const bool weight = flags & WEIGHT, bias = flags & BIAS;
  if (g.numel() == b * o) {
    // one position: |g_i(W)|^2 = |d_i|^2 |a_i|^2, |g_i(b)|^2 = |d_i|^2
    const T* dp = g.data_ptr<T>();
    const T* ap = x.data_ptr<T>();
    return parallel_sum(b, 64, [&](int64_t begin, int64_t end) {
      double s = 0.0;
      for (int64_t i = begin; i < end; ++i) {
        s += sum_sq(dp + i * o, o) * ((weight ? sum_sq(ap + i * k, k) : 0.0) + (bias ? 1.0 : 0.0));
      }
      return s;
    });
  }
  const at::Tensor d = g.view({b, -1, o});
  if (weight) return outer<T>(d, x.view({b, -1, k}), bias, gram_advantage);
  return bias ? position_sum_sq<T>(d) : 0.0;
}

// a convolution as a Linear layer on its unfolded windows, one group at a time: windows
// [B, groups x in/groups x kernel, P], d [B, out, P]
template <typename T>
double conv(const at::Tensor& windows, const at::Tensor& g, int64_t flags, int64_t groups,
            double gram_advantage) {
  const int64_t b = g.size(0), p = windows.size(2);
  const at::Tensor d = g.reshape({b, g.size(1), -1});
  double total = 0.0;
  if (flags & WEIGHT) {
    const auto rows = [&](const at::Tensor& t) {
      return t.view({b, groups, -1, p}).transpose(2, 3).reshape({b * groups, p, -1});
    };
    total += outer<T>(rows(d), rows(windows), false, gram_advantage);
  }
  if (flags & BIAS) total += position_sum_sq<T>(d.transpose(1, 2).contiguous());
  return total;
}

// sum_i sum over the distinct tokens k of example i of |sum_{p: k_ip = k} d_ip|^2, padding
// positions left out
template <typename T>
double embedding(const at::Tensor& ids, const at::Tensor& g, int64_t padding) {
  const int64_t b = g.size(0), dim = g.size(-1);
  const at::Tensor idx = as(ids, at::kLong);
  const int64_t p = idx.numel() / b;
  const int64_t* tok = idx.data_ptr<int64_t>();
  const T* base = g.data_ptr<T>();
  return parallel_sum(b, 4, [&](int64_t begin, int64_t end) {
    std::vector<std::pair<int64_t, int64_t>> order;
    order.reserve(p);
    std::vector<double> acc(dim);
    double s = 0.0;
    for (int64_t i = begin; i < end; ++i) {
      order.clear();
      for (int64_t q = 0; q < p; ++q) {
        const int64_t t = tok[i * p + q];
        if (t != padding) order.emplace_back(t, q);
      }
      std::sort(order.begin(), order.end());
      for (size_t u = 0; u < order.size();) {
        std::fill(acc.begin(), acc.end(), 0.0);
        size_t v = u;
        for (; v < order.size() && order[v].first == order[u].first; ++v) {
          const T* row = base + (i * p + order[v].second) * dim;
          double* __restrict out = acc.data();
#pragma omp simd
          for (int64_t k = 0; k < dim; ++k) out[k] += row[k];
        }
        s += sum_sq(acc.data(), dim);
        u = v;
      }
    }
    return s;
  });
}

// LayerNorm / RMSNorm: g_i(weight) = sum_p d_ip o xhat_ip, g_i(bias) = sum_p d_ip, with xhat
// the normalized input (mean and variance, or root mean square, over the n normalized elements)
template <typename T>
double norm(const at::Tensor& x, const at::Tensor& g, int64_t flags, int64_t n, double eps) {
  const int64_t b = g.size(0);
  const int64_t p = g.numel() / (b * n);
  const T* xs = x.data_ptr<T>();
  const T* gs = g.data_ptr<T>();
  const bool weight = flags & WEIGHT, bias = flags & BIAS, rms = flags & RMS;
  return parallel_sum(b, 4, [&](int64_t begin, int64_t end) {
    std::vector<double> gw(weight ? n : 0), gb(bias ? n : 0), mean(p), rstd(p);
    double s = 0.0;
    for (int64_t i = begin; i < end; ++i) {
      std::fill(gw.begin(), gw.end(), 0.0);
      std::fill(gb.begin(), gb.end(), 0.0);
      if (weight) {
        // the rows' statistics first: independent rows, whose reductions overlap
        for (int64_t q = 0; q < p; ++q) {
          const T* xr = xs + (i * p + q) * n;
          const double m = rms ? 0.0 : sum(xr, n) / n;
          const double var = accumulate(n, [=](int64_t k) { return (xr[k] - m) * (xr[k] - m); });
          mean[q] = m;
          rstd[q] = 1.0 / std::sqrt(var / n + eps);
        }
      }
      for (int64_t q = 0; q < p; ++q) {
        const T* xr = xs + (i * p + q) * n;
        const T* gr = gs + (i * p + q) * n;
        if (weight) {
          const double m = mean[q], r = rstd[q];
          double* __restrict out = gw.data();
#pragma omp simd
          for (int64_t k = 0; k < n; ++k) out[k] += gr[k] * ((xr[k] - m) * r);
        }
        if (bias) {
          double* __restrict out = gb.data();
#pragma omp simd
          for (int64_t k = 0; k < n; ++k) out[k] += gr[k];
        }
      }
      s += sum_sq(gw.data(), gw.size()) + sum_sq(gb.data(), gb.size());
    }
    return s;
  });
}

template <typename T>
double job_sum(int64_t kind, const at::Tensor& x, const at::Tensor& g, int64_t flags, int64_t n,
               double eps, double gram_advantage) {
  switch (kind) {
    case LINEAR: return linear<T>(x, g, flags, gram_advantage);
    case CONV: return conv<T>(x, g, flags, n, gram_advantage);
    case EMBEDDING: return embedding<T>(x, g, n);
    case NORM: return norm<T>(x, g, flags, n, eps);
    default: TORCH_CHECK(false, "example_norms: unknown layer kind ", kind);
  }
}

// [the passes' sums of their examples' squared gradient norms..., the gradients' squared norm]
std::vector<double> sums(int64_t passes, const std::vector<Job>& jobs,
                         const std::vector<at::Tensor>& grads, double gram_advantage) {
  at::NoGradGuard no_grad;
  std::vector<double> out(passes + 1, 0.0);
  for (const auto& [pass, kind, x, g, flags, n, eps] : jobs) {
    TORCH_CHECK(pass >= 0 && pass < passes, "example_norms: pass ", pass, " of ", passes);
    TORCH_CHECK(x.is_cpu() && g.is_cpu() && !x.is_sparse() && !g.is_sparse(),
                "example_norms: dense CPU tensors only");
    const auto type = compute_type(g);
    const at::Tensor gc = as(g, type);
    const at::Tensor xc = kind == EMBEDDING ? x : as(x, type);
    out[pass] += type == at::kDouble
                     ? job_sum<double>(kind, xc, gc, flags, n, eps, gram_advantage)
                     : job_sum<float>(kind, xc, gc, flags, n, eps, gram_advantage);
  }
  for (const auto& t : grads) {
    TORCH_CHECK(t.is_cpu() && !t.is_sparse(), "example_norms: dense CPU gradients only");
    out[passes] += squared(t);
  }
  return out;
}

}  // namespace
}  // namespace example_norms

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("sums", &example_norms::sums,
        "per pass, the sum of its examples' squared gradient norms; then the gradients' squared "
        "norm");
}
