// Building blocks of the fused kernel (fused_sequential.cpp): the layer encoding, a row-major
// GEMM on the BLAS that torch links (MKL here), and the element-wise loops of one chunk.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,
            const float*, const int*, const float*, const int*, const float*, float*,
            const int*);
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*,
            const double*, const int*, const double*, const int*, const double*, double*,
            const int*);
}

namespace fused {

// Layer encoding (LAYER_FIELDS int64 per layer, built by training/engine/programs/fused.py):
//   kind, a, b, k, stride, pad, lin, lout, bias, param_index
//   LINEAR    a = in features, b = out features; k = C, lin = L when the input is a Flatten of a
//             channels-last [L, C] activation (the weight expects channel-major [C, L]), else 0
//   CONV1D    a = in channels, b = out channels, k = kernel, stride, pad, lin / lout = lengths
//   RELU      a = features per example
//   TRANSPOSE a x b matrix per example -> b x a
enum Kind : int64_t { LINEAR = 0, CONV1D = 1, RELU = 2, TRANSPOSE = 3 };
constexpr int64_t LAYER_FIELDS = 10;

struct Layer {
  int64_t kind, a, b, k, stride, pad, lin, lout;
  bool bias;
  int64_t param;      // index of the weight in the parameter list (bias: param + 1)
  int64_t in_size;    // values per example entering the layer
  int64_t out_size;   // values per example leaving it
};

inline bool has_params(const Layer& L) { return L.kind == LINEAR || L.kind == CONV1D; }
// the kernel reads the weight in another order than torch stores it (see permute_weights)
inline bool permuted(const Layer& L) { return L.kind == CONV1D || (L.kind == LINEAR && L.k); }

inline std::vector<Layer> parse(const std::vector<int64_t>& enc, int64_t in_size) {
  TORCH_CHECK(!enc.empty() && enc.size() % LAYER_FIELDS == 0,
              "layer encoding: a non-empty multiple of ", LAYER_FIELDS, " values");
  std::vector<Layer> layers;
  for (size_t i = 0; i < enc.size(); i += LAYER_FIELDS) {
    const int64_t* f = &enc[i];
    Layer l{f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8] != 0, f[9], in_size, in_size};
    switch (l.kind) {
      case LINEAR: TORCH_CHECK(l.a == in_size, "linear input size"); l.out_size = l.b; break;
      case CONV1D:
        TORCH_CHECK(l.a * l.lin == in_size && l.stride > 0, "conv1d input size");
        l.out_size = l.b * l.lout;
        break;
      case RELU: break;
      case TRANSPOSE: TORCH_CHECK(l.a * l.b == in_size, "transpose size"); break;
      default: TORCH_CHECK(false, "unknown layer kind ", l.kind);
    }
    in_size = l.out_size;
    layers.push_back(l);
  }
  return layers;
}

// Row-major C[m, n] = alpha op(A)[m, k] op(B)[k, n] + beta C through column-major BLAS:
// C^T = op(B)^T op(A)^T.
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  int mi = m, ni = n, ki = k, la = lda, lb = ldb, lc = ldc;
  sgemm_(tb ? "T" : "N", ta ? "T" : "N", &ni, &mi, &ki, &alpha, b, &lb, a, &la, &beta, c, &lc);
}
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                 const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                 double* c, int64_t ldc) {
  int mi = m, ni = n, ki = k, la = lda, lb = ldb, lc = ldc;
  dgemm_(tb ? "T" : "N", ta ? "T" : "N", &ni, &mi, &ki, &alpha, b, &lb, a, &la, &beta, c, &lc);
}

// Element-wise loops are branch-free so that they vectorize (ReLU signs are random: a branch
// would mispredict half the time).
template <typename T>
void relu(const T* in, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] > T(0) ? in[i] : T(0);
}

// out = relu?(out + bias) over rows of n
template <typename T>
void epilogue(T* __restrict__ out, int64_t rows, int64_t n, const T* __restrict__ bias,
              bool relu_) {
  for (int64_t r = 0; r < rows; ++r) {
    T* o = out + r * n;
    if (bias)
      for (int64_t c = 0; c < n; ++c) o[c] += bias[c];
    if (relu_)
      for (int64_t c = 0; c < n; ++c) o[c] = o[c] > T(0) ? o[c] : T(0);
  }
}

// d = 0 where the ReLU output y is 0, over rows of n; bias_grad (+)= column sums of the masked d
template <typename T>
void relu_backward(const T* __restrict__ y, T* __restrict__ d, int64_t rows, int64_t n,
                   T* __restrict__ bias_grad, bool start) {
  if (bias_grad && start) std::fill(bias_grad, bias_grad + n, T(0));
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * n;
    T* dr = d + r * n;
    for (int64_t c = 0; c < n; ++c) dr[c] = yr[c] > T(0) ? dr[c] : T(0);
    if (bias_grad)
      for (int64_t c = 0; c < n; ++c) bias_grad[c] += dr[c];
  }
}

template <typename T>
void col_sum(const T* __restrict__ d, int64_t rows, int64_t n, T* __restrict__ out, bool start) {
  if (start) std::fill(out, out + n, T(0));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c) out[c] += d[r * n + c];
}

template <typename T>
void transpose(const T* in, T* out, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

// patches[(e, o), (j, ci)] = in[e, o * stride + j - pad, ci], zero outside the input; the k
// taps of an output are k * a consecutive values of the channels-last input
template <typename T>
void im2col(const Layer& L, const T* in, T* out, int64_t m) {
  int64_t width = L.k * L.a;
  for (int64_t e = 0; e < m; ++e) {
    const T* ie = in + e * L.lin * L.a;
    for (int64_t o = 0; o < L.lout; ++o) {
      T* row = out + (e * L.lout + o) * width;
      int64_t pos = o * L.stride - L.pad;
      if (pos >= 0 && pos + L.k <= L.lin) {
        std::copy(ie + pos * L.a, ie + pos * L.a + width, row);
        continue;
      }
      for (int64_t j = 0; j < L.k; ++j, ++pos) {
        if (pos < 0 || pos >= L.lin) std::fill(row + j * L.a, row + (j + 1) * L.a, T(0));
        else std::copy(ie + pos * L.a, ie + (pos + 1) * L.a, row + j * L.a);
      }
    }
  }
}

// din[e, o * stride + j - pad, ci] = sum of dpatches[(e, o), (j, ci)]
template <typename T>
void col2im(const Layer& L, const T* __restrict__ dcols, T* __restrict__ din, int64_t m) {
  std::fill(din, din + m * L.lin * L.a, T(0));
  int64_t width = L.k * L.a;
  for (int64_t e = 0; e < m; ++e) {
    T* de = din + e * L.lin * L.a;
    for (int64_t o = 0; o < L.lout; ++o) {
      // taps [lo, hi) fall inside the input
      int64_t lo = std::max<int64_t>(0, L.pad - o * L.stride);
      int64_t hi = std::min<int64_t>(L.k, L.lin + L.pad - o * L.stride);
      T* dst = de + (o * L.stride - L.pad + lo) * L.a;
      const T* src = dcols + (e * L.lout + o) * width + lo * L.a;
      for (int64_t i = 0; i < (hi - lo) * L.a; ++i) dst[i] += src[i];
    }
  }
}

// Loss of one example with outputs z [k] and its gradient d = dloss/dz / batch:
// cross-entropy (label y >= 0): logsumexp(z) - z[y], d = (softmax(z) - onehot(y)) / batch;
// regression (target t): 1/2 (z - t)^2, d = (z - t) / batch.
template <typename T>
double example_loss(const T* z, T* d, int64_t k, int64_t y, T target, int64_t batch) {
  if (y < 0) {
    T diff = z[0] - target;
    d[0] = diff / batch;
    return 0.5 * diff * diff;
  }
  T mx = *std::max_element(z, z + k), s = 0;
  for (int64_t c = 0; c < k; ++c) s += (d[c] = std::exp(z[c] - mx));
  for (int64_t c = 0; c < k; ++c) d[c] = d[c] / s / batch;
  d[y] -= T(1) / batch;
  return mx + std::log(s) - z[y];
}

}  // namespace fused
