// Fused training step of a stack of N trials of one nn.Sequential of Linear / Conv1d / ReLU
// layers (the mlp, linear and cnn1d models): per-trial mini-batch loss and parameter gradients.
//
// Each trial is worked through in chunks of `chunk` examples: the chunk's forward pass, loss,
// and backward pass run back to back, so its activations and im2col patches stay in the core's
// L2 cache, and weight gradients accumulate across chunks. Trials are spread over the intra-op
// threads (at::parallel_for); inside a thread every GEMM is a single-threaded BLAS call on
// in-cache operands. Convolutions are im2col (fused into the chunk: patches are built in a
// thread-local buffer right before their GEMM) and col2im (the patch gradient is added back onto
// the input gradient right after its GEMM). Activations of convolutions are channels-last per
// example ([L, C]); TRANSPOSE layers convert to and from the channel-major order of Flatten.
//
// Layer encoding (LAYER_FIELDS int64 per layer, built by training/stacked_fused.py):
//   kind, a, b, k, stride, pad, lin, lout, bias, param_index
//   LINEAR    a = in features, b = out features; k = C, lin = L when the input is a Flatten of a
//             channels-last [L, C] activation (the weight expects channel-major [C, L]), else 0
//   CONV1D    a = in channels, b = out channels, k = kernel, stride, pad, lin / lout = lengths
//   RELU      a = features per example
//   TRANSPOSE a x b matrix per example -> b x a
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,
            const float*, const int*, const float*, const int*, const float*, float*,
            const int*);
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*,
            const double*, const int*, const double*, const int*, const double*, double*,
            const int*);
}

namespace {

enum Kind : int64_t { LINEAR = 0, CONV1D = 1, RELU = 2, TRANSPOSE = 3 };
constexpr int64_t LAYER_FIELDS = 10;

struct Layer {
  int64_t kind, a, b, k, stride, pad, lin, lout;
  bool bias;
  int64_t param;      // index of the weight in the parameter list (bias: param + 1)
  int64_t in_size;    // values per example entering the layer
  int64_t out_size;   // values per example leaving it
};

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

std::vector<Layer> parse(const std::vector<int64_t>& enc, int64_t in_size) {
  TORCH_CHECK(enc.size() % LAYER_FIELDS == 0, "layer encoding: length not a multiple of ",
              LAYER_FIELDS);
  std::vector<Layer> layers;
  for (size_t i = 0; i < enc.size(); i += LAYER_FIELDS) {
    const int64_t* f = &enc[i];
    Layer l{f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8] != 0, f[9], in_size, 0};
    switch (l.kind) {
      case LINEAR: TORCH_CHECK(l.a == in_size, "linear input size"); l.out_size = l.b; break;
      case CONV1D:
        TORCH_CHECK(l.a * l.lin == in_size, "conv1d input size");
        l.out_size = l.b * l.lout;
        break;
      case RELU: l.out_size = in_size; break;
      case TRANSPOSE: TORCH_CHECK(l.a * l.b == in_size, "transpose size"); l.out_size = in_size;
        break;
      default: TORCH_CHECK(false, "unknown layer kind ", l.kind);
    }
    in_size = l.out_size;
    layers.push_back(l);
  }
  return layers;
}

template <typename T>
struct Trainer {
  const std::vector<Layer>& layers;
  const std::vector<const T*>& params;  // stacked [N, *shape], `sizes` values per trial
  const std::vector<T*>& grads;
  const std::vector<int64_t>& sizes;
  const T* x;          // [N, B, in_size]
  const int64_t* yi;   // [N, B] class labels (classification)
  const T* yf;         // [N, B] targets (regression)
  T* loss;             // [N]
  int64_t batch, chunk, in_size;
  int64_t first;       // first layer with parameters: no input gradient below it
  std::vector<bool> relu_after;  // a parameter layer followed by a ReLU: fused epilogues

  // per thread
  std::vector<std::vector<T>> act;   // act[l]: input of layer l, [chunk, in_size(l)]
  std::vector<std::vector<T>> cols;  // im2col patches of conv layers, [chunk * lout, k * a]
  std::vector<std::vector<T>> wp;    // permuted weights (conv: [b, k, a]; linear on
  std::vector<std::vector<T>> dwp;   // channels-last input: [b, lin * k]) and their gradients
  std::vector<T> g0, g1;             // ping-pong activation gradients
  std::vector<T*> ptrs;              // the current chunk's activations

  Trainer(const std::vector<Layer>& ls, const std::vector<const T*>& ps,
          const std::vector<T*>& gs, const std::vector<int64_t>& sz, const T* x_,
          const int64_t* yi_, const T* yf_, T* loss_, int64_t batch_, int64_t chunk_,
          int64_t in_size_)
      : layers(ls), params(ps), grads(gs), sizes(sz), x(x_), yi(yi_), yf(yf_), loss(loss_),
        batch(batch_), chunk(chunk_), in_size(in_size_) {
    size_t n = layers.size();
    first = n;
    for (size_t l = 0; l < n; ++l)
      if (has_params(layers[l])) { first = l; break; }
    relu_after.assign(n, false);
    for (size_t l = 0; l + 1 < n; ++l)
      relu_after[l] = has_params(layers[l]) && layers[l + 1].kind == RELU;
    size_t widest = in_size;
    act.resize(n + 1);
    ptrs.resize(n + 1);
    cols.resize(n);
    wp.resize(n);
    dwp.resize(n);
    for (size_t l = 0; l < n; ++l) {
      const Layer& L = layers[l];
      widest = std::max<size_t>(widest, L.out_size);
      // a ReLU works in place, except on the caller's input
      if (L.kind != RELU || l == 0) act[l + 1].resize(chunk * L.out_size);
      if (L.kind == CONV1D) cols[l].resize(chunk * L.lout * L.k * L.a);
      if (permuted(L)) {
        wp[l].resize(L.b * (L.kind == CONV1D ? L.k * L.a : L.a));
        dwp[l].resize(wp[l].size());
      }
    }
    g0.resize(chunk * widest);
    g1.resize(chunk * widest);
  }

  static bool has_params(const Layer& L) { return L.kind == LINEAR || L.kind == CONV1D; }
  static bool permuted(const Layer& L) { return L.kind == CONV1D || (L.kind == LINEAR && L.k); }

  const T* param(int64_t i, int64_t t) const { return params[i] + t * sizes[i]; }
  T* grad(int64_t i, int64_t t) const { return grads[i] + t * sizes[i]; }
  const T* weight(size_t l, int64_t t) const {
    return permuted(layers[l]) ? wp[l].data() : param(layers[l].param, t);
  }

  // The torch weight [rows, p, q] is used as [rows, q, p]: conv [b, a, k] as [b, k, a] (patches
  // are tap-major); a Linear after Flatten of a channels-last [L, C] activation, whose weight
  // [out, C * L] expects channel-major inputs, as [out, L * C].
  void permute_weights(int64_t t) {
    for (size_t l = 0; l < layers.size(); ++l) {
      const Layer& L = layers[l];
      if (!permuted(L)) continue;
      int64_t p = L.kind == CONV1D ? L.a : L.k, q = L.kind == CONV1D ? L.k : L.lin;
      const T* w = param(L.param, t);
      T* o = wp[l].data();
      for (int64_t r = 0; r < L.b; ++r)
        for (int64_t j = 0; j < q; ++j)
          for (int64_t i = 0; i < p; ++i) o[(r * q + j) * p + i] = w[(r * p + i) * q + j];
    }
  }

  void unpermute_grads(int64_t t) {
    for (size_t l = 0; l < layers.size(); ++l) {
      const Layer& L = layers[l];
      if (!permuted(L)) continue;
      int64_t p = L.kind == CONV1D ? L.a : L.k, q = L.kind == CONV1D ? L.k : L.lin;
      T* g = grad(L.param, t);
      const T* d = dwp[l].data();
      for (int64_t r = 0; r < L.b; ++r)
        for (int64_t i = 0; i < p; ++i)
          for (int64_t j = 0; j < q; ++j) g[(r * p + i) * q + j] = d[(r * q + j) * p + i];
    }
  }

  void run_trial(int64_t t) {
    permute_weights(t);
    double total = 0;
    for (int64_t b0 = 0; b0 < batch; b0 += chunk)
      total += chunk_step(t, b0, std::min(chunk, batch - b0), b0 == 0);
    loss[t] = (T)(total / batch);
    unpermute_grads(t);
  }

  // forward pass of m examples of trial t from `input` [m, in_size]; ptrs[l] = input of
  // layer l, ptrs[n] = the outputs
  void forward(int64_t t, const T* input, int64_t m) {
    size_t n = layers.size();
    std::vector<T*>& a = ptrs;
    a[0] = const_cast<T*>(input);  // read only
    for (size_t l = 0; l < n; ++l) {
      const Layer& L = layers[l];
      const T* in = a[l];
      if (L.kind == RELU) {
        T* out = l == 0 ? act[1].data() : a[l];
        if (l == 0 || !relu_after[l - 1]) relu(in, out, m * L.out_size);
        a[l + 1] = out;
        continue;
      }
      T* out = act[l + 1].data();
      a[l + 1] = out;
      if (L.kind == TRANSPOSE) {
        for (int64_t e = 0; e < m; ++e)
          transpose(in + e * L.in_size, out + e * L.in_size, L.a, L.b);
        continue;
      }
      int64_t rows = m, k = L.a;
      if (L.kind == CONV1D) {
        rows = m * L.lout, k = L.k * L.a;
        im2col(L, in, cols[l].data(), m);
        in = cols[l].data();
      }
      gemm(false, true, rows, L.b, k, T(1), in, k, weight(l, t), k, T(0), out, L.b);
      if (L.bias || relu_after[l])
        epilogue(out, rows, L.b, L.bias ? param(L.param + 1, t) : nullptr, relu_after[l]);
    }
  }

  // outputs [rows, out_size] of trial t for inputs [rows, in_size], chunk by chunk
  void predict(int64_t t, const T* input, int64_t rows, T* out) {
    int64_t k = layers.back().out_size;
    permute_weights(t);
    for (int64_t b0 = 0; b0 < rows; b0 += chunk) {
      int64_t m = std::min(chunk, rows - b0);
      forward(t, input + b0 * in_size, m);
      std::copy(ptrs.back(), ptrs.back() + m * k, out + b0 * k);
    }
  }

  // forward, loss and backward of examples [b0, b0 + m) of trial t; returns the summed loss
  double chunk_step(int64_t t, int64_t b0, int64_t m, bool start) {
    size_t n = layers.size();
    forward(t, x + (t * batch + b0) * in_size, m);
    std::vector<T*>& a = ptrs;
    T* dout = g0.data();
    double total = loss_grad(a[n], dout, t, b0, m, layers.back().out_size);
    T* other = g1.data();
    for (int64_t l = (int64_t)n - 1; l >= first; --l) {
      const Layer& L = layers[l];
      if (L.kind == RELU) {
        if (!relu_after[l - 1]) relu_backward(a[l + 1], dout, m, L.out_size, nullptr, false);
        continue;
      }
      if (L.kind == TRANSPOSE) {
        for (int64_t e = 0; e < m; ++e)
          transpose(dout + e * L.in_size, other + e * L.in_size, L.b, L.a);
        std::swap(dout, other);
        continue;
      }
      int64_t rows = L.kind == CONV1D ? m * L.lout : m, k = L.kind == CONV1D ? L.k * L.a : L.a;
      T* bias_grad = L.bias ? grad(L.param + 1, t) : nullptr;
      // the ReLU after this layer: mask the gradient and sum the bias gradient in one pass
      if (relu_after[l]) relu_backward(a[l + 2], dout, rows, L.b, bias_grad, start);
      else if (L.bias) col_sum(dout, rows, L.b, bias_grad, start);
      const T* in = L.kind == CONV1D ? cols[l].data() : a[l];
      T* dw = permuted(L) ? dwp[l].data() : grad(L.param, t);
      gemm(true, false, L.b, k, rows, T(1), dout, L.b, in, k, start ? T(0) : T(1), dw, k);
      if (l == first) continue;
      if (L.kind == CONV1D) {
        // the patches are no longer needed: their gradient overwrites them
        T* dcols = cols[l].data();
        gemm(false, false, rows, k, L.b, T(1), dout, L.b, weight(l, t), k, T(0), dcols, k);
        col2im(L, dcols, other, m);
      } else {
        gemm(false, false, rows, k, L.b, T(1), dout, L.b, weight(l, t), k, T(0), other, k);
      }
      std::swap(dout, other);
    }
    return total;
  }

  // summed loss of the chunk; d = its gradient with respect to the outputs z [m, k] (divided
  // by the batch size: the loss is a mean over the batch)
  double loss_grad(const T* z, T* d, int64_t t, int64_t b0, int64_t m, int64_t k) const {
    double total = 0;
    for (int64_t e = 0; e < m; ++e) {
      const T* ze = z + e * k;
      T* de = d + e * k;
      if (yi) {  // cross-entropy: logsumexp(z) - z[y]; softmax(z) - onehot(y)
        T mx = *std::max_element(ze, ze + k);
        T s = 0;
        for (int64_t c = 0; c < k; ++c) s += std::exp(ze[c] - mx);
        T lse = mx + std::log(s);
        int64_t y = yi[t * batch + b0 + e];
        total += lse - ze[y];
        for (int64_t c = 0; c < k; ++c) de[c] = std::exp(ze[c] - lse) / batch;
        de[y] -= T(1) / batch;
      } else {   // 1/2 (f - y)^2
        T diff = ze[0] - yf[t * batch + b0 + e];
        total += 0.5 * diff * diff;
        de[0] = diff / batch;
      }
    }
    return total;
  }

  // Elementwise loops are branch-free so that they vectorize (ReLU signs are random: a branch
  // would mispredict half the time).
  static void relu(const T* in, T* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = in[i] > T(0) ? in[i] : T(0);
  }

  // out = relu?(out + bias) over rows of n
  static void epilogue(T* __restrict__ out, int64_t rows, int64_t n, const T* __restrict__ bias,
                       bool relu_) {
    for (int64_t r = 0; r < rows; ++r) {
      T* o = out + r * n;
      if (bias)
        for (int64_t c = 0; c < n; ++c) o[c] += bias[c];
      if (relu_)
        for (int64_t c = 0; c < n; ++c) o[c] = o[c] > T(0) ? o[c] : T(0);
    }
  }

  // d = 0 where the ReLU output y is 0, over rows of n; bias_grad (+)= column sums of the
  // masked d
  static void relu_backward(const T* __restrict__ y, T* __restrict__ d, int64_t rows, int64_t n,
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

  static void col_sum(const T* __restrict__ d, int64_t rows, int64_t n, T* __restrict__ out,
                      bool start) {
    if (start) std::fill(out, out + n, T(0));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < n; ++c) out[c] += d[r * n + c];
  }

  static void transpose(const T* in, T* out, int64_t rows, int64_t cols_) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols_; ++c) out[c * rows + r] = in[r * cols_ + c];
  }

  // patches[(e, o), (j, ci)] = in[e, o * stride + j - pad, ci], zero outside the input; the k
  // taps of an output are k * a consecutive values of the channels-last input
  static void im2col(const Layer& L, const T* in, T* out, int64_t m) {
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

  // din[e, o * stride + j - pad, ci] += dpatches[(e, o), (j, ci)]
  static void col2im(const Layer& L, const T* __restrict__ dcols, T* __restrict__ din,
                     int64_t m) {
    std::fill(din, din + m * L.lin * L.a, T(0));
    int64_t width = L.k * L.a;
    for (int64_t e = 0; e < m; ++e) {
      T* de = din + e * L.lin * L.a;
      for (int64_t o = 0; o < L.lout; ++o) {
        const T* row = dcols + (e * L.lout + o) * width;
        // taps [lo, hi) fall inside the input
        int64_t lo = std::max<int64_t>(0, L.pad - o * L.stride);
        int64_t hi = std::min<int64_t>(L.k, L.lin + L.pad - o * L.stride);
        T* dst = de + (o * L.stride - L.pad + lo) * L.a;
        const T* src = row + lo * L.a;
        for (int64_t i = 0; i < (hi - lo) * L.a; ++i) dst[i] += src[i];
      }
    }
  }
};

struct Stacks {
  std::vector<torch::Tensor> tensors;  // contiguous
  std::vector<int64_t> sizes;          // values per trial
};

Stacks stacks(const std::vector<torch::Tensor>& params, const torch::Tensor& like) {
  TORCH_CHECK(!params.empty(), "no parameters");
  Stacks s;
  int64_t n = params[0].size(0);
  for (const auto& p : params) {
    TORCH_CHECK(p.device().is_cpu() && p.scalar_type() == like.scalar_type() && p.dim() >= 1 &&
                p.size(0) == n, "parameters must be [N, ...] CPU stacks of the inputs' dtype");
    s.tensors.push_back(p.contiguous());
    s.sizes.push_back(p.numel() / n);
  }
  return s;
}

template <typename T>
std::vector<const T*> pointers(const std::vector<torch::Tensor>& ts) {
  std::vector<const T*> out;
  for (const auto& t : ts) out.push_back(t.data_ptr<T>());
  return out;
}

template <typename T>
std::vector<torch::Tensor> train_impl(const Stacks& p, const torch::Tensor& x,
                                      const torch::Tensor& y, const std::vector<Layer>& layers,
                                      int64_t chunk) {
  int64_t n = x.size(0), batch = x.size(1), in_size = x[0][0].numel();
  std::vector<torch::Tensor> grads;
  std::vector<T*> gp;
  for (const auto& t : p.tensors) {
    grads.push_back(torch::empty_like(t));
    gp.push_back(grads.back().data_ptr<T>());
  }
  auto pp = pointers<T>(p.tensors);
  auto loss = torch::empty({n}, x.options());
  bool classify = y.scalar_type() == torch::kLong;
  const int64_t* yi = classify ? y.data_ptr<int64_t>() : nullptr;
  const T* yf = classify ? nullptr : y.data_ptr<T>();
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    Trainer<T> tr(layers, pp, gp, p.sizes, x.data_ptr<T>(), yi, yf, loss.data_ptr<T>(), batch,
                  std::min(chunk, batch), in_size);
    for (int64_t t = begin; t < end; ++t) tr.run_trial(t);
  });
  grads.insert(grads.begin(), loss);
  return grads;
}

template <typename T>
torch::Tensor predict_impl(const Stacks& p, const torch::Tensor& x,
                           const std::vector<Layer>& layers, int64_t chunk, bool shared) {
  int64_t n = p.tensors[0].size(0), rows = x.size(shared ? 0 : 1);
  int64_t in_size = x.numel() / (shared ? rows : n * rows), k = layers.back().out_size;
  auto out = torch::empty({n, rows, k}, x.options());
  auto pp = pointers<T>(p.tensors);
  std::vector<T*> no_grads;
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    Trainer<T> tr(layers, pp, no_grads, p.sizes, nullptr, nullptr, nullptr, nullptr, rows,
                  std::min(chunk, std::max<int64_t>(rows, 1)), in_size);
    for (int64_t t = begin; t < end; ++t)
      tr.predict(t, shared ? xp : xp + t * rows * in_size, rows, op + t * rows * k);
  });
  return out;
}

}  // namespace

// [loss [N], grad per parameter [N, *shape]] for inputs x [N, B, ...] and targets y [N, B]
// (int64 classes: mean cross-entropy; floating: 1/2 mean squared error).
std::vector<torch::Tensor> loss_and_grads(std::vector<torch::Tensor> params, torch::Tensor x,
                                          torch::Tensor y, std::vector<int64_t> encoding,
                                          int64_t chunk) {
  TORCH_CHECK(x.dim() >= 2 && y.dim() == 2 && x.size(0) == y.size(0) && x.size(1) == y.size(1),
              "x must be [N, B, ...] and y [N, B]");
  TORCH_CHECK(x.device().is_cpu() && y.device().is_cpu(), "the fused kernel runs on the CPU");
  x = x.contiguous();
  auto p = stacks(params, x);
  TORCH_CHECK(p.tensors[0].size(0) == x.size(0), "parameters and inputs differ in trials");
  auto layers = parse(encoding, x[0][0].numel());
  if (y.scalar_type() == torch::kLong) {
    int64_t classes = layers.back().out_size;
    TORCH_CHECK(y.numel() == 0 || (y.min().item<int64_t>() >= 0 &&
                                   y.max().item<int64_t>() < classes),
                "class labels must lie in [0, ", classes, ")");
  } else {
    TORCH_CHECK(layers.back().out_size == 1, "regression needs one output");
  }
  y = y.scalar_type() == torch::kLong ? y.contiguous() : y.to(x.scalar_type()).contiguous();
  chunk = std::max<int64_t>(1, chunk);
  if (x.scalar_type() == torch::kFloat) return train_impl<float>(p, x, y, layers, chunk);
  TORCH_CHECK(x.scalar_type() == torch::kDouble, "float32 or float64 only");
  return train_impl<double>(p, x, y, layers, chunk);
}

// outputs [N, B, out] of every trial for inputs x [N, B, ...], or x [B, ...] shared by all
// trials when `shared`
torch::Tensor forward(std::vector<torch::Tensor> params, torch::Tensor x,
                      std::vector<int64_t> encoding, int64_t chunk, bool shared) {
  TORCH_CHECK(x.dim() >= (shared ? 1 : 2), "x must be [N, B, ...], or [B, ...] when shared");
  TORCH_CHECK(x.device().is_cpu(), "the fused kernel runs on the CPU");
  x = x.contiguous();
  auto p = stacks(params, x);
  TORCH_CHECK(shared || p.tensors[0].size(0) == x.size(0),
              "parameters and inputs differ in trials");
  int64_t rows = x.size(shared ? 0 : 1);
  int64_t per_example = rows ? x.numel() / (shared ? rows : x.size(0) * rows) : 0;
  auto layers = parse(encoding, per_example);
  chunk = std::max<int64_t>(1, chunk);
  if (x.scalar_type() == torch::kFloat) return predict_impl<float>(p, x, layers, chunk, shared);
  TORCH_CHECK(x.scalar_type() == torch::kDouble, "float32 or float64 only");
  return predict_impl<double>(p, x, layers, chunk, shared);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("loss_and_grads", &loss_and_grads,
        "per-trial loss and parameter gradients of a stacked nn.Sequential");
  m.def("forward", &forward, "per-trial outputs of a stacked nn.Sequential");
}
