// Fused training step of a stack of N trials of one nn.Sequential of Linear / Conv1d / ReLU
// layers (the mlp, linear and cnn1d models).
//
// Each trial is worked through in chunks of `chunk` examples: the chunk's inputs are gathered,
// its forward pass, loss and backward pass run back to back, so its activations and im2col
// patches stay in the core's L2 cache, and weight gradients accumulate across chunks. Trials
// are spread over the intra-op threads (at::parallel_for); inside a thread every GEMM is a
// single-threaded BLAS call on in-cache operands. Convolutions are im2col (fused into the
// chunk: patches are built in a thread-local buffer right before their GEMM) and col2im (the
// patch gradient is added back onto the input gradient right after its GEMM). Activations of
// convolutions are channels-last per example ([L, C]).
//
// train_steps also applies the update of each trial (the SGD rules, Adam or AdamW) right after
// its backward pass, while its gradients are in cache, unless its loss exceeds its limit
// (divergence: the trial stops there). It runs K consecutive steps of a trial before the next
// trial, so that the trial's weights and optimizer state stay in the core's L2 cache from one
// step to the next, and no Python runs between the steps.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <cmath>
#include <optional>
#include <vector>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "layers.h"

namespace fused {
namespace {

enum Optimizer : int64_t { SGD = 0, MOMENTUM = 1, NESTEROV = 2, ADAM = 3, ADAMW = 4 };

// Where a trial's examples and the parameters live; shared by all threads.
template <typename T>
struct Problem {
  std::vector<Layer> layers;
  std::vector<T*> params;        // stacked [N, *shape], sizes[i] values per trial
  std::vector<int64_t> sizes;
  const T* x = nullptr;          // example rows of in_size values
  // [K, N, batch] row of x per step, trial and example (null: row t * batch + b)
  const int64_t* rows = nullptr;
  const int64_t* labels = nullptr;  // per row of x (classification)
  const T* targets = nullptr;       // per row of x (regression)
  int64_t batch = 0, chunk = 1, in_size = 0, trials = 0;

  int64_t row(int64_t k, int64_t t, int64_t b) const {
    return rows ? rows[(k * trials + t) * batch + b] : t * batch + b;
  }
};

// at::parallel_for over trials, every thread computing with the caller's floating-point control
// (x86 MXCSR: flush-to-zero and denormals-are-zero, per thread, set by torch.set_flush_denormal),
// so that a trial's result does not depend on the thread it runs on.
template <typename F>
void for_trials(int64_t n, const F& body) {
#if defined(__SSE__)
  const unsigned int caller = _mm_getcsr();
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    const unsigned int own = _mm_getcsr();
    _mm_setcsr(caller);
    body(begin, end);
    _mm_setcsr(own);
  });
#else
  at::parallel_for(0, n, 1, body);
#endif
}

// The per-thread state: one trial at a time, chunk by chunk.
template <typename T>
struct Trainer {
  const Problem<T>& P;
  size_t n;                      // layers
  int64_t first;                 // first layer with parameters: no input gradient below it
  std::vector<bool> relu_after;  // a parameter layer followed by a ReLU: fused epilogues
  std::vector<std::vector<T>> act;   // act[l]: input of layer l, [chunk, in_size(l)]
  std::vector<std::vector<T>> cols;  // im2col patches of conv layers, [chunk * lout, k * a]
  std::vector<std::vector<T>> wp;    // permuted weights (conv: [b, k, a]; linear on a
  std::vector<std::vector<T>> dwp;   // channels-last input: [b, lin * k]) and their gradients
  std::vector<std::vector<T>> own;   // gradients when the caller does not keep them
  std::vector<T> g0, g1;             // ping-pong activation gradients
  std::vector<T*> ptrs;              // the current chunk's activations
  std::vector<T*> grads;             // where the current trial's gradients go
  int64_t step = 0;                  // the step of the call whose batch is read (train_steps)
  // the weights the gradient is taken at, one trial's per parameter, when not the current ones
  // (delayed gradients, training/delay.py)
  std::vector<const T*> from;

  explicit Trainer(const Problem<T>& p) : P(p), n(p.layers.size()) {
    first = n;
    for (size_t l = 0; l < n; ++l)
      if (has_params(P.layers[l])) { first = l; break; }
    relu_after.assign(n, false);
    for (size_t l = 0; l + 1 < n; ++l)
      relu_after[l] = has_params(P.layers[l]) && P.layers[l + 1].kind == RELU;
    size_t widest = P.in_size;
    act.resize(n + 1);
    act[0].resize(P.chunk * P.in_size);
    ptrs.resize(n + 1);
    cols.resize(n);
    wp.resize(n);
    dwp.resize(n);
    for (size_t l = 0; l < n; ++l) {
      const Layer& L = P.layers[l];
      widest = std::max<size_t>(widest, L.out_size);
      if (L.kind != RELU) act[l + 1].resize(P.chunk * L.out_size);  // a ReLU works in place
      if (L.kind == CONV1D) cols[l].resize(P.chunk * L.lout * L.k * L.a);
      if (permuted(L)) {
        wp[l].resize(L.b * (L.kind == CONV1D ? L.k * L.a : L.a));
        dwp[l].resize(wp[l].size());
      }
    }
    g0.resize(P.chunk * widest);
    g1.resize(P.chunk * widest);
    grads.resize(P.params.size());
  }

  const T* param(int64_t i, int64_t t) const {
    return from.empty() ? P.params[i] + t * P.sizes[i] : from[i];
  }
  const T* weight(size_t l, int64_t t) const {
    return permuted(P.layers[l]) ? wp[l].data() : param(P.layers[l].param, t);
  }

  // Gradients into thread-local buffers, for train_steps (they live only until the update).
  void own_grads() {
    own.resize(P.params.size());
    for (size_t i = 0; i < own.size(); ++i) {
      own[i].resize(P.sizes[i]);
      grads[i] = own[i].data();
    }
  }

  // The torch weight [rows, p, q] is read as [rows, q, p]: conv [b, a, k] as [b, k, a]
  // (patches are tap-major); a Linear after Flatten of a channels-last [L, C] activation, whose
  // weight [out, C * L] expects channel-major inputs, as [out, L * C].
  void permute_weights(int64_t t) {
    for (size_t l = 0; l < n; ++l) {
      const Layer& L = P.layers[l];
      if (!permuted(L)) continue;
      int64_t p = L.kind == CONV1D ? L.a : L.k, q = L.kind == CONV1D ? L.k : L.lin;
      const T* w = param(L.param, t);
      T* o = wp[l].data();
      for (int64_t r = 0; r < L.b; ++r)
        for (int64_t j = 0; j < q; ++j)
          for (int64_t i = 0; i < p; ++i) o[(r * q + j) * p + i] = w[(r * p + i) * q + j];
    }
  }

  void unpermute_grads() {
    for (size_t l = 0; l < n; ++l) {
      const Layer& L = P.layers[l];
      if (!permuted(L)) continue;
      int64_t p = L.kind == CONV1D ? L.a : L.k, q = L.kind == CONV1D ? L.k : L.lin;
      T* g = grads[L.param];
      const T* d = dwp[l].data();
      for (int64_t r = 0; r < L.b; ++r)
        for (int64_t i = 0; i < p; ++i)
          for (int64_t j = 0; j < q; ++j) g[(r * p + i) * q + j] = d[(r * q + j) * p + i];
    }
  }

  // mean loss of trial t over its batch; its gradients in grads
  T loss_and_grads(int64_t t) {
    permute_weights(t);
    double total = 0;
    for (int64_t b0 = 0; b0 < P.batch; b0 += P.chunk)
      total += chunk_step(t, b0, std::min(P.chunk, P.batch - b0), b0 == 0);
    unpermute_grads();
    return T(total / P.batch);
  }

  // outputs [count, out_size] of trial t for examples [0, count), chunk by chunk
  void predict(int64_t t, int64_t count, T* out) {
    int64_t k = P.layers.back().out_size;
    permute_weights(t);
    for (int64_t b0 = 0; b0 < count; b0 += P.chunk) {
      int64_t m = std::min(P.chunk, count - b0);
      forward(t, b0, m);
      std::copy(ptrs[n], ptrs[n] + m * k, out + b0 * k);
    }
  }

  // forward pass of examples [b0, b0 + m) of trial t: ptrs[l] = input of layer l
  void forward(int64_t t, int64_t b0, int64_t m) {
    T* in0 = act[0].data();
    for (int64_t e = 0; e < m; ++e) {
      const T* src = P.x + P.row(step, t, b0 + e) * P.in_size;
      std::copy(src, src + P.in_size, in0 + e * P.in_size);
    }
    ptrs[0] = in0;
    for (size_t l = 0; l < n; ++l) {
      const Layer& L = P.layers[l];
      const T* in = ptrs[l];
      if (L.kind == RELU) {
        if (l == 0 || !relu_after[l - 1]) relu(in, ptrs[l], m * L.out_size);
        ptrs[l + 1] = ptrs[l];
        continue;
      }
      T* out = act[l + 1].data();
      ptrs[l + 1] = out;
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

  // forward, loss and backward of examples [b0, b0 + m) of trial t; returns the summed loss
  double chunk_step(int64_t t, int64_t b0, int64_t m, bool start) {
    forward(t, b0, m);
    T* dout = g0.data();
    T* other = g1.data();
    int64_t k = P.layers.back().out_size;
    double total = 0;
    for (int64_t e = 0; e < m; ++e) {
      int64_t r = P.row(step, t, b0 + e);
      total += example_loss(ptrs[n] + e * k, dout + e * k, k, P.labels ? P.labels[r] : -1,
                            P.targets ? P.targets[r] : T(0), P.batch);
    }
    for (int64_t l = (int64_t)n - 1; l >= first; --l) {
      const Layer& L = P.layers[l];
      if (L.kind == RELU) {
        if (!relu_after[l - 1]) relu_backward(ptrs[l + 1], dout, m, L.out_size, (T*)nullptr, false);
        continue;
      }
      if (L.kind == TRANSPOSE) {
        for (int64_t e = 0; e < m; ++e)
          transpose(dout + e * L.in_size, other + e * L.in_size, L.b, L.a);
        std::swap(dout, other);
        continue;
      }
      int64_t rows = L.kind == CONV1D ? m * L.lout : m, k = L.kind == CONV1D ? L.k * L.a : L.a;
      T* bias_grad = L.bias ? grads[L.param + 1] : nullptr;
      // the ReLU after this layer: mask the gradient and sum the bias gradient in one pass
      if (relu_after[l]) relu_backward(ptrs[l + 2], dout, rows, L.b, bias_grad, start);
      else if (L.bias) col_sum(dout, rows, L.b, bias_grad, start);
      const T* in = L.kind == CONV1D ? cols[l].data() : ptrs[l];
      T* dw = permuted(L) ? dwp[l].data() : grads[L.param];
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
};

// One trial's metaparameters of one step, as the update loops read them. They are computed in
// float64 and rounded to T once, as torch.optim's kernels do with their scalars.
template <typename T>
struct Rule {
  int64_t optimizer;
  T neg_lr;        // SGD rules: -lr; Adam: -lr / (1 - beta1^t), the step on m
  T mu;            // momentum
  T beta1 = 0, beta2 = 0, eps = 0, one_b1 = 0, one_b2 = 0;  // one_b: 1 - beta
  T l2 = 0;        // adam: weight_decay, added as weight_decay * w to the gradient
  T decay = 1;     // adamw: 1 - lr * weight_decay, the factor on the weights
  T inv_bc2 = 1;   // 1 / sqrt(1 - beta2^t): a product, where torch divides (2x faster)

  // hyper: this trial's (beta1, beta2, eps, weight_decay), read by adam / adamw only; t = step + 1
  Rule(int64_t opt, double lr, double momentum, const double* hyper, int64_t step)
      : optimizer(opt), neg_lr(T(-lr)), mu(T(momentum)) {
    if (opt < ADAM) return;
    double t = double(step + 1);
    beta1 = T(hyper[0]), beta2 = T(hyper[1]), eps = T(hyper[2]);
    one_b1 = T(1 - hyper[0]), one_b2 = T(1 - hyper[1]);
    neg_lr = T(-lr / (1 - std::pow(hyper[0], t)));
    inv_bc2 = T(1 / std::sqrt(1 - std::pow(hyper[1], t)));
    l2 = T(opt == ADAM ? hyper[3] : 0.0);
    decay = T(opt == ADAMW ? 1 - lr * hyper[3] : 1.0);
  }
};

// One parameter of one trial: w, its gradient g (overwritten) and its mask (null: none); a and
// b are its optimizer state: the momentum buffer, or Adam's m and v.
//
// The gradient is masked first, so masked weights and their state stay exactly zero (Adam's
// update there is 0 / (0 + eps)). Then the update of torch.optim.SGD (dampening 0):
// sgd: w += neg_lr g; momentum: a = g + mu a, w += neg_lr a; nesterov: a = g + mu a,
// w += neg_lr (g + mu a); or of torch.optim.Adam / AdamW (Kingma & Ba 2015; Loshchilov &
// Hutter 2019), see training/engine/adam.py: adam: g += wd w; adamw: w *= 1 - lr wd; then
// m = beta1 m + (1 - beta1) g, v = beta2 v + (1 - beta2) g^2,
// w += -lr / (1 - beta1^t) m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
template <typename T>
void update(T* __restrict__ w, T* __restrict__ a, T* __restrict__ b, T* __restrict__ g,
            const T* __restrict__ mask, int64_t size, const Rule<T>& r) {
  if (mask)
    for (int64_t i = 0; i < size; ++i) g[i] *= mask[i];
  switch (r.optimizer) {
    case SGD:
      for (int64_t i = 0; i < size; ++i) w[i] += g[i] * r.neg_lr;
      break;
    case MOMENTUM:
      for (int64_t i = 0; i < size; ++i) {
        a[i] = g[i] + a[i] * r.mu;
        w[i] += a[i] * r.neg_lr;
      }
      break;
    case NESTEROV:
      for (int64_t i = 0; i < size; ++i) {
        a[i] = g[i] + a[i] * r.mu;
        w[i] += (g[i] + a[i] * r.mu) * r.neg_lr;
      }
      break;
    default: {  // ADAM, ADAMW: one pass; l2 is 0 for adamw and decay 1 for adam
      for (int64_t i = 0; i < size; ++i) {
        T gi = g[i] + r.l2 * w[i];
        a[i] = r.beta1 * a[i] + r.one_b1 * gi;
        b[i] = r.beta2 * b[i] + r.one_b2 * gi * gi;
        w[i] = w[i] * r.decay + r.neg_lr * a[i] / (std::sqrt(b[i]) * r.inv_bc2 + r.eps);
      }
    }
  }
}

template <typename T>
Problem<T> problem(const std::vector<torch::Tensor>& params, const torch::Tensor& x,
                   const std::vector<int64_t>& encoding, int64_t in_size, int64_t batch,
                   int64_t chunk) {
  Problem<T> P;
  P.layers = parse(encoding, in_size);
  int64_t n = params.at(0).size(0);
  for (const auto& p : params) {
    TORCH_CHECK(p.device().is_cpu() && p.scalar_type() == x.scalar_type() && p.dim() >= 1 &&
                p.size(0) == n && p.is_contiguous(),
                "parameters must be contiguous [N, ...] CPU stacks of the inputs' dtype");
    P.params.push_back(p.data_ptr<T>());
    P.sizes.push_back(p.numel() / n);
  }
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous(), "inputs must be contiguous, on the CPU");
  P.x = x.data_ptr<T>();
  P.in_size = in_size;
  P.batch = batch;
  P.chunk = std::max<int64_t>(1, std::min(chunk, std::max<int64_t>(batch, 1)));
  return P;
}

template <typename T>
void set_targets(Problem<T>& P, const torch::Tensor& y) {
  TORCH_CHECK(y.device().is_cpu() && y.is_contiguous(), "targets must be contiguous, on the CPU");
  if (y.scalar_type() == torch::kLong) {
    int64_t classes = P.layers.back().out_size;
    TORCH_CHECK(y.numel() == 0 || (y.min().item<int64_t>() >= 0 &&
                                   y.max().item<int64_t>() < classes),
                "class labels must lie in [0, ", classes, ")");
    P.labels = y.data_ptr<int64_t>();
  } else {
    TORCH_CHECK(P.layers.back().out_size == 1, "regression needs one output");
    P.targets = y.data_ptr<T>();
  }
}

template <typename T>
std::vector<torch::Tensor> loss_and_grads_impl(const std::vector<torch::Tensor>& params,
                                               torch::Tensor x, torch::Tensor y,
                                               const std::vector<int64_t>& encoding,
                                               int64_t chunk) {
  int64_t n = x.size(0), batch = x.size(1);
  auto P = problem<T>(params, x, encoding, batch ? x.numel() / (n * batch) : 0, batch, chunk);
  set_targets(P, y);
  std::vector<torch::Tensor> out{torch::empty({n}, x.options())};
  for (const auto& p : params) out.push_back(torch::empty_like(p));
  T* loss = out[0].data_ptr<T>();
  for_trials(n, [&](int64_t begin, int64_t end) {
    Trainer<T> tr(P);
    for (int64_t t = begin; t < end; ++t) {
      for (size_t i = 0; i < params.size(); ++i)
        tr.grads[i] = out[i + 1].data_ptr<T>() + t * P.sizes[i];
      loss[t] = tr.loss_and_grads(t);
    }
  });
  return out;
}

torch::Tensor as_double(const torch::Tensor& t) { return t.to(torch::kDouble).contiguous(); }

// Data pointers of optimizer-state stacks shaped like the parameters (empty: none).
template <typename T>
std::vector<T*> state_pointers(const std::vector<torch::Tensor>& state,
                               const std::vector<torch::Tensor>& params) {
  TORCH_CHECK(state.empty() || state.size() == params.size(), "one buffer per parameter");
  std::vector<T*> out;
  for (size_t i = 0; i < state.size(); ++i) {
    const auto& b = state[i];
    TORCH_CHECK(b.sizes() == params[i].sizes() && b.is_contiguous() &&
                b.scalar_type() == params[i].scalar_type(),
                "buffers must be shaped like the parameters");
    out.push_back(b.data_ptr<T>());
  }
  return out;
}

template <typename T>
std::vector<torch::Tensor> train_steps_impl(
    const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& bufs,
    const std::vector<torch::Tensor>& bufs2,
    const std::vector<std::optional<torch::Tensor>>& masks, const torch::Tensor& x,
    const torch::Tensor& y, const torch::Tensor& idx, const std::vector<int64_t>& encoding,
    int64_t chunk, const torch::Tensor& lr, const torch::Tensor& mu, const torch::Tensor& hyper,
    int64_t first_step, int64_t optimizer, const torch::Tensor& limit,
    const std::vector<torch::Tensor>& ring, const torch::Tensor& read,
    const torch::Tensor& write) {
  int64_t steps = idx.size(0), n = idx.size(1), batch = idx.size(2);
  auto P = problem<T>(params, x, encoding, x.size(0) ? x.numel() / x.size(0) : 0, batch, chunk);
  set_targets(P, y);
  TORCH_CHECK(idx.scalar_type() == torch::kLong && idx.is_contiguous() &&
              (idx.numel() == 0 || (idx.min().item<int64_t>() >= 0 &&
                                    idx.max().item<int64_t>() < x.size(0))),
              "batch indices must be int64 rows of the training inputs");
  P.rows = idx.data_ptr<int64_t>();
  P.trials = n;
  TORCH_CHECK(masks.size() == params.size(), "one mask entry per parameter");
  // momentum: bufs; adam / adamw: m in bufs, v in bufs2
  std::vector<T*> buf = state_pointers<T>(bufs, params), buf2 = state_pointers<T>(bufs2, params);
  TORCH_CHECK(optimizer == SGD || !buf.empty(), "one buffer per parameter");
  TORCH_CHECK(optimizer < ADAM || !buf2.empty(), "adam needs two moment buffers per parameter");
  // a mask is shared ([*shape]) or one per trial ([N, *shape])
  std::vector<const T*> mask(params.size(), nullptr);
  std::vector<int64_t> mask_stride(params.size(), 0);
  for (size_t i = 0; i < masks.size(); ++i) {
    if (!masks[i]) continue;
    const auto& m = *masks[i];
    TORCH_CHECK(m.is_contiguous() && m.scalar_type() == x.scalar_type() &&
                (m.numel() == P.sizes[i] || m.numel() == n * P.sizes[i]), "mask shape");
    mask[i] = m.data_ptr<T>();
    mask_stride[i] = m.numel() == P.sizes[i] ? 0 : P.sizes[i];
  }
  torch::Tensor lrs = as_double(lr), mus = as_double(mu), lim = as_double(limit),
                hyp = as_double(hyper);
  TORCH_CHECK(lrs.numel() == steps * n && mus.numel() == n && lim.numel() == n,
              "a learning rate per step and trial, a momentum and a limit per trial");
  TORCH_CHECK(optimizer < ADAM || hyp.numel() == 4 * n,
              "adam needs [N, 4] (beta1, beta2, eps, weight_decay) per trial");
  // losses of the steps a trial did not reach stay NaN
  auto loss = torch::full({steps, n}, NAN, x.options());
  auto taken = torch::empty({n}, torch::kLong);
  T* lossp = loss.data_ptr<T>();
  int64_t* takenp = taken.data_ptr<int64_t>();
  const double *lrp = lrs.data_ptr<double>(), *mup = mus.data_ptr<double>();
  const double *limp = lim.data_ptr<double>(), *hypp = hyp.data_ptr<double>();
  auto trial_of = [](const std::vector<T*>& b, size_t i, int64_t offset) {
    return b.empty() ? nullptr : b[i] + offset;
  };
  // delayed gradients: ring[i] [S, N, *shape] holds past weights; step k of trial t takes its
  // gradient at slot read[k, t] and leaves its updated weights in slot write[k]
  const bool delayed = !ring.empty();
  std::vector<T*> slots;
  const int64_t *readp = nullptr, *writep = nullptr;
  if (delayed) {
    TORCH_CHECK(ring.size() == params.size() && read.scalar_type() == torch::kLong &&
                    read.is_contiguous() && read.numel() == steps * n &&
                    write.scalar_type() == torch::kLong && write.is_contiguous() &&
                    write.numel() == steps,
                "delayed steps need one ring per parameter, read slots [K, N], write slots [K]");
    int64_t depth = ring[0].size(0);
    for (size_t i = 0; i < ring.size(); ++i) {
      TORCH_CHECK(ring[i].is_contiguous() && ring[i].scalar_type() == x.scalar_type() &&
                      ring[i].size(0) == depth && ring[i].numel() == depth * n * P.sizes[i],
                  "a ring must be [S, N, *shape] of the parameter's dtype, contiguous");
      slots.push_back(ring[i].data_ptr<T>());
    }
    readp = read.data_ptr<int64_t>();
    writep = write.data_ptr<int64_t>();
    for (int64_t j = 0; j < steps * n; ++j)
      TORCH_CHECK(readp[j] >= 0 && readp[j] < depth, "read slots must lie in [0, S)");
    for (int64_t j = 0; j < steps; ++j)
      TORCH_CHECK(writep[j] >= 0 && writep[j] < depth, "write slots must lie in [0, S)");
  }
  for_trials(n, [&](int64_t begin, int64_t end) {
    Trainer<T> tr(P);
    tr.own_grads();
    if (delayed) tr.from.resize(params.size());
    for (int64_t t = begin; t < end; ++t) {
      int64_t k = 0;
      for (; k < steps; ++k) {
        tr.step = k;
        for (size_t i = 0; delayed && i < params.size(); ++i)
          tr.from[i] = slots[i] + (readp[k * n + t] * n + t) * P.sizes[i];
        T l = lossp[k * n + t] = tr.loss_and_grads(t);
        if (!((double)l <= limp[t])) break;  // diverged: no update (NaN fails too), no more steps
        const Rule<T> rule(optimizer, lrp[k * n + t], mup[t],
                           optimizer < ADAM ? nullptr : hypp + 4 * t, first_step + k);
        for (size_t i = 0; i < params.size(); ++i) {
          int64_t offset = t * P.sizes[i];
          update(P.params[i] + offset, trial_of(buf, i, offset), trial_of(buf2, i, offset),
                 tr.grads[i], mask[i] ? mask[i] + t * mask_stride[i] : nullptr, P.sizes[i],
                 rule);
          if (delayed)  // the weights after the update, still in cache
            std::copy(P.params[i] + offset, P.params[i] + offset + P.sizes[i],
                      slots[i] + (writep[k] * n + t) * P.sizes[i]);
        }
      }
      takenp[t] = k;
    }
  });
  return {loss, taken};
}

template <typename T>
void update_trial_impl(const std::vector<torch::Tensor>& params,
                       const std::vector<torch::Tensor>& grads,
                       const std::vector<torch::Tensor>& bufs,
                       const std::vector<torch::Tensor>& bufs2,
                       const std::vector<std::optional<torch::Tensor>>& masks, double lr,
                       double mu, const std::vector<double>& hyper, int64_t step,
                       int64_t optimizer) {
  TORCH_CHECK(grads.size() == params.size() && masks.size() == params.size() &&
                  (bufs.empty() || bufs.size() == params.size()) &&
                  (bufs2.empty() || bufs2.size() == params.size()),
              "one gradient, mask entry and buffer per parameter");
  TORCH_CHECK(optimizer == SGD || !bufs.empty(), "one buffer per parameter");
  TORCH_CHECK(optimizer < ADAM || (!bufs2.empty() && hyper.size() == 4),
              "adam needs two moment buffers and (beta1, beta2, eps, weight_decay)");
  auto same = [](const torch::Tensor& t, const torch::Tensor& p) {
    return t.is_contiguous() && t.numel() == p.numel() && t.scalar_type() == p.scalar_type() &&
           t.device().is_cpu();
  };
  const Rule<T> rule(optimizer, lr, mu, hyper.data(), step);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    TORCH_CHECK(same(p, p) && same(grads[i], p) && (bufs.empty() || same(bufs[i], p)) &&
                    (bufs2.empty() || same(bufs2[i], p)) && (!masks[i] || same(*masks[i], p)),
                "parameters, gradients, buffers and masks must be contiguous CPU tensors of "
                "one shape and dtype");
    update(p.data_ptr<T>(), bufs.empty() ? nullptr : bufs[i].data_ptr<T>(),
           bufs2.empty() ? nullptr : bufs2[i].data_ptr<T>(), grads[i].data_ptr<T>(),
           masks[i] ? masks[i]->data_ptr<T>() : nullptr, p.numel(), rule);
  }
}

template <typename T>
torch::Tensor forward_impl(const std::vector<torch::Tensor>& params, torch::Tensor x,
                           const std::vector<int64_t>& encoding, int64_t chunk, bool shared) {
  int64_t n = params.at(0).size(0), count = x.size(shared ? 0 : 1);
  int64_t in_size = count ? x.numel() / (shared ? count : n * count) : 0;
  auto P = problem<T>(params, x, encoding, in_size, shared ? 0 : count, chunk);
  P.chunk = std::max<int64_t>(1, std::min(chunk, std::max<int64_t>(count, 1)));
  int64_t k = P.layers.back().out_size;
  auto out = torch::empty({n, count, k}, x.options());
  T* op = out.data_ptr<T>();
  for_trials(n, [&](int64_t begin, int64_t end) {
    Trainer<T> tr(P);
    for (int64_t t = begin; t < end; ++t) tr.predict(t, count, op + t * count * k);
  });
  return out;
}

}  // namespace
}  // namespace fused

// [loss [N], gradient per parameter [N, *shape]] for inputs x [N, B, ...] and targets y [N, B]
// (int64 classes: mean cross-entropy; floating: 1/2 mean squared error).
std::vector<torch::Tensor> loss_and_grads(std::vector<torch::Tensor> params, torch::Tensor x,
                                          torch::Tensor y, std::vector<int64_t> encoding,
                                          int64_t chunk) {
  TORCH_CHECK(x.dim() >= 2 && y.dim() == 2 && x.size(0) == y.size(0) && x.size(1) == y.size(1),
              "x must be [N, B, ...] and y [N, B]");
  TORCH_CHECK(!params.empty() && params[0].size(0) == x.size(0),
              "parameters and inputs differ in trials");
  x = x.contiguous();
  y = (y.scalar_type() == torch::kLong ? y : y.to(x.scalar_type())).contiguous();
  if (x.scalar_type() == torch::kFloat)
    return fused::loss_and_grads_impl<float>(params, x, y, encoding, chunk);
  TORCH_CHECK(x.scalar_type() == torch::kDouble, "float32 or float64 only");
  return fused::loss_and_grads_impl<double>(params, x, y, encoding, chunk);
}

// K training steps of every trial: batch idx [K, N, B] of rows of x_train / y_train; params and
// their optimizer state updated in place, step after step, while the step's loss is <= limit;
// returns [losses [K, N] (NaN after a trial's last step), taken [N] (the updates each trial
// took: K, or the step whose loss exceeded its limit)]. Per step and trial: lr [K, N]; per
// trial: mu (momentum) and, for adam / adamw, hyper [N, 4] = (beta1, beta2, eps,
// weight_decay); bufs: momentum buffers, or Adam's m with v in bufs2; first_step: 0-based step
// of idx[0], shared (Adam's bias corrections). Delayed gradients (training/delay.py; ring
// empty: none): ring [S, N, *shape] per parameter, the gradient of step k of trial t taken at
// ring slot read[k, t], the weights after its update copied into slot write[k].
std::vector<torch::Tensor> train_steps(std::vector<torch::Tensor> params,
                                       std::vector<torch::Tensor> bufs,
                                       std::vector<torch::Tensor> bufs2,
                                       std::vector<std::optional<torch::Tensor>> masks,
                                       torch::Tensor x_train, torch::Tensor y_train,
                                       torch::Tensor idx, std::vector<int64_t> encoding,
                                       int64_t chunk, torch::Tensor lr, torch::Tensor mu,
                                       torch::Tensor hyper, int64_t first_step,
                                       int64_t optimizer, torch::Tensor limit,
                                       std::vector<torch::Tensor> ring, torch::Tensor read,
                                       torch::Tensor write) {
  TORCH_CHECK(idx.dim() == 3 && !params.empty() && params[0].size(0) == idx.size(1),
              "batch indices must be [K, N, B] for N trials");
  TORCH_CHECK(optimizer >= fused::SGD && optimizer <= fused::ADAMW,
              "optimizer 0 (sgd), 1 (momentum), 2 (nesterov), 3 (adam) or 4 (adamw)");
  TORCH_CHECK(first_step >= 0, "first_step must be >= 0");
  x_train = x_train.contiguous();
  y_train = (y_train.scalar_type() == torch::kLong ? y_train : y_train.to(x_train.scalar_type()))
                .contiguous();
  idx = idx.contiguous();
  if (x_train.scalar_type() == torch::kFloat)
    return fused::train_steps_impl<float>(params, bufs, bufs2, masks, x_train, y_train, idx,
                                          encoding, chunk, lr, mu, hyper, first_step, optimizer,
                                          limit, ring, read, write);
  TORCH_CHECK(x_train.scalar_type() == torch::kDouble, "float32 or float64 only");
  return fused::train_steps_impl<double>(params, bufs, bufs2, masks, x_train, y_train, idx,
                                         encoding, chunk, lr, mu, hyper, first_step, optimizer,
                                         limit, ring, read, write);
}

// The update of one trial in place, as train_steps applies it, for gradients computed elsewhere
// (training/engine/programs/per_trial.py): params, their gradients (overwritten), optimizer state (bufs:
// momentum buffers or Adam's m, bufs2: Adam's v; empty when there is none) and masks (None:
// unmasked), one trial's tensors each; hyper: (beta1, beta2, eps, weight_decay) for adam / adamw.
void update_trial(std::vector<torch::Tensor> params, std::vector<torch::Tensor> grads,
                  std::vector<torch::Tensor> bufs, std::vector<torch::Tensor> bufs2,
                  std::vector<std::optional<torch::Tensor>> masks, double lr, double mu,
                  std::vector<double> hyper, int64_t step, int64_t optimizer) {
  TORCH_CHECK(!params.empty(), "no parameters");
  TORCH_CHECK(optimizer >= fused::SGD && optimizer <= fused::ADAMW,
              "optimizer 0 (sgd), 1 (momentum), 2 (nesterov), 3 (adam) or 4 (adamw)");
  TORCH_CHECK(step >= 0, "step must be >= 0");
  if (params[0].scalar_type() == torch::kFloat)
    return fused::update_trial_impl<float>(params, grads, bufs, bufs2, masks, lr, mu, hyper,
                                           step, optimizer);
  TORCH_CHECK(params[0].scalar_type() == torch::kDouble, "float32 or float64 only");
  fused::update_trial_impl<double>(params, grads, bufs, bufs2, masks, lr, mu, hyper, step,
                                   optimizer);
}

// outputs [N, B, out] of every trial for inputs x [N, B, ...], or x [B, ...] shared by all
// trials when `shared`
torch::Tensor forward(std::vector<torch::Tensor> params, torch::Tensor x,
                      std::vector<int64_t> encoding, int64_t chunk, bool shared) {
  TORCH_CHECK(x.dim() >= (shared ? 1 : 2), "x must be [N, B, ...], or [B, ...] when shared");
  TORCH_CHECK(!params.empty() && (shared || params[0].size(0) == x.size(0)),
              "parameters and inputs differ in trials");
  x = x.contiguous();
  if (x.scalar_type() == torch::kFloat)
    return fused::forward_impl<float>(params, x, encoding, chunk, shared);
  TORCH_CHECK(x.scalar_type() == torch::kDouble, "float32 or float64 only");
  return fused::forward_impl<double>(params, x, encoding, chunk, shared);
}

// Every entry point runs without the GIL (it touches no Python object): the per_trial program
// calls update_trial from several threads at once, and one holding the GIL through a
// memory-bound update of millions of weights stalled every other thread's Python.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using no_gil = py::call_guard<py::gil_scoped_release>;
  m.def("loss_and_grads", &loss_and_grads, "per-trial losses and parameter gradients", no_gil());
  m.def("train_steps", &train_steps, "K training steps of every trial, in place", no_gil());
  m.def("forward", &forward, "per-trial outputs", no_gil());
  m.def("update_trial", &update_trial, "one trial's update, in place", no_gil());
}
