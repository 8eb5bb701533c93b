"""The training loss as a function of one flat parameter vector: the ground the probes stand on.

``flat_loss(model, dataset, mask=None, examples=None)`` fixes a finite example set (the training
split, or a seeded sample / given indices of it) and returns a :class:`FlatLoss`: the mean loss
``f(theta) = (1/n) sum_i l(theta; x_i, y_i)`` (``training.goal.loss_fn``: cross-entropy, or
``1/2 (f(x) - y)^2`` for regression) of the model with its parameters replaced by ``theta`` through
``torch.func.functional_call``; the model object itself is never modified.

What is measured: the network in eval mode. Every probe (noise, curvature, Lee's L, the
trajectory) evaluates ``l`` with the network as ``model.eval()`` runs it: batch normalization
normalizes with its running statistics (fixed buffers, not parameters: no gradient flows into
them and they are not updated), dropout and every other module that reads ``self.training`` act
as at inference. The loss is then a deterministic function of ``theta`` and a mean of
per-example terms, so the per-example gradients g_i, their mean G and covariance Sigma exist,
a mini-batch's gradient is the mean of its examples' g_i, and the estimators of
:mod:`theory.estimators.noise` and :mod:`theory.estimators.sampling` are exactly unbiased for McCandlish et al.
(2018)'s B_simple = tr(Sigma) / |G|^2 of this loss; the Hessian, its top eigenvalues and trace
and Lee et al. (2021)'s L are those of the same function. In train mode a batch-normalized
loss is not a sum of per-example terms (each output depends on its batch's mean and variance)
and dropout makes it random, so neither g_i nor Sigma is defined there; McCandlish et al.'s
two-batch estimator (their appendix A.1) applied to train-mode batch gradients would measure
another quantity, one that depends on how batches are formed and counts the dropout noise, and
it is not what is measured here (:func:`theory.estimators.noise.two_batch_noise` also runs eval mode).
:func:`probe_definition` states this for a given model, for a report to print.

The probes never change the model: module modes are restored after every evaluation, buffers
are copied (running statistics and ``num_batches_tracked`` untouched), and a network that still
draws random numbers in eval mode, or a batch normalization without running statistics (which
uses the batch's statistics even in eval mode), is refused with a :class:`TheoryError`, so the
caller's random number generator is never advanced. :func:`training.models.evaluation` is the one context every
evaluation runs in: eval mode, attention through the math backend of
``scaled_dot_product_attention`` (the fused CPU and GPU kernels have no second derivative, which
Hessian-vector products need), ``nn.MultiheadAttention``'s fused inference path off (so values
and derivatives come from the same computation), and for recurrent layers cuDNN off (its RNN
has no second derivative and refuses backward in eval mode).

Masks. ``theta`` holds only the *kept* (unpruned) coordinates, in the order of
``model.named_parameters()`` flattened and concatenated; pruned coordinates are fixed at zero.
Gradients and Hessians with respect to ``theta`` are therefore the full ones restricted to kept
coordinates, ``P g`` and ``P H P^T`` with ``P`` the selection by the mask.

Every full-set quantity (loss, gradient, Hessian-vector product) is summed over chunks of
``chunk`` examples, so memory is bounded by one chunk whatever the set size (Hessian products at
one point keep the gradient graphs of up to ``RETAINED_EXAMPLES`` examples between products, see
:meth:`FlatLoss.hessian`). Per-example gradients (``torch.func.vmap`` of ``grad``) use chunks
sized so that one chunk's gradients fit ``PER_EXAMPLE_BYTES``; networks with recurrent layers
(``nn.RNN``, ``nn.GRU``, ``nn.LSTM`` and their cells, whose kernels ``vmap`` cannot batch) get
them from a loop over examples instead, one ``grad`` each (:attr:`FlatLoss.vectorized`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

from training.data import Dataset, check_dataset
from training.models import RECURRENT, activation_floats, check_output, evaluation
from training.randomness import RandomOps
from training.goal import loss_fn
from training.masks import check_mask

from theory.errors import TheoryError, check_int

DEFAULT_CHUNK = 1024
# Activation floats of the chunks of several points' gradients computed at once
# (FlatLoss.gradients): 16 M floats, 128 MB in float64.
GRADIENTS_BUDGET = 1 << 24
# Memory of one chunk of per-example gradients (chunk x parameters): small chunks stay in cache
# (measured faster than 64 MB chunks for the MNIST-1D MLP).
PER_EXAMPLE_BYTES = 16 * 2**20
# Examples whose gradient graphs a Hessian operator keeps between products: their activations stay
# in memory (small for the probes' 512-example sets); chunks beyond it are rebuilt per product.
RETAINED_EXAMPLES = 2048
SPLITS = ("train", "val", "test")

Weights = Mapping[str, torch.Tensor] | torch.Tensor
# Recurrent layers: vmap of grad cannot batch their kernels (torch 2.13: nn.RNN, nn.GRU, nn.GRUCell
# fail with a broadcast error inside the kernel), so their per-example gradients come from a loop.


def changed_by_eval_mode(model: nn.Module) -> bool:
    """Whether eval mode changes ``model``'s function (batch normalization, dropout): then the
    probes' definition is worth stating beside their values."""
    return any(isinstance(m, (_BatchNorm, _DropoutNd))
               or (isinstance(m, nn.MultiheadAttention) and m.dropout > 0)
               for m in model.modules())


def probe_definition(model: nn.Module) -> str:
    """One sentence stating what the probes of ``model`` measure (module docstring), naming the
    model's layers that eval mode changes, for a report to print beside the probe values."""
    norms = sum(isinstance(m, _BatchNorm) for m in model.modules())
    drops = sum(isinstance(m, _DropoutNd) or (isinstance(m, nn.MultiheadAttention) and m.dropout > 0)
                for m in model.modules())
    changed = []
    if norms:
        changed.append(f"{norms} batch-normalization layer{'s use' if norms > 1 else ' uses'} "
                       f"running statistics")
    if drops:
        changed.append(f"{drops} dropout layer{'s are' if drops > 1 else ' is'} the identity")
    return ("Noise and curvature are measured on the network in eval mode, whose loss is a mean of "
            "per-example losses (B_simple = tr(Sigma) / |G|^2 of that loss, McCandlish et al. 2018): "
            + ("; ".join(changed) if changed
               else "this network has no batch-normalization or dropout layer") + ".")


def _check_probeable(fl: FlatLoss) -> None:
    """Refuse a network whose eval-mode loss is not a deterministic mean of per-example terms
    (module docstring): a batch normalization without running statistics, or random numbers
    drawn in eval mode (seen in one example's forward pass, the caller's generator restored)."""
    for name, m in fl.model.named_modules():
        if isinstance(m, _BatchNorm) and (m.running_mean is None or m.running_var is None):
            raise TheoryError(
                f"module {name!r} ({type(m).__name__}) has no running statistics "
                f"(track_running_stats=False): it normalizes with the batch's statistics even in eval "
                f"mode, so its loss is not a sum of per-example terms and the probes are not defined; "
                f"allowed: batch normalization with track_running_stats=True")
    device = fl.theta.device
    with torch.random.fork_rng(devices=[device] if device.type != "cpu" else [],
                               device_type=device.type), RandomOps() as ops, torch.no_grad():
        fl.batch_loss(fl.theta, fl.x[:1], fl.y[:1])
    # the fused attention kernels carry the random tag whatever their dropout; evaluation's math
    # backend keeps them out, so a tag seen here is a real draw
    if ops.seen:
        raise TheoryError(
            f"the model draws random numbers in eval mode ({', '.join(sorted(ops.seen))}): the probes "
            f"measure the deterministic eval-mode loss; make the randomness depend on self.training "
            f"(as nn.Dropout does) or remove it")


@dataclass(frozen=True, eq=False)
class FlatLoss:
    """Mean loss of ``model`` over a fixed example set, as a function of kept coordinates.

    ``theta`` is the model's current (masked) parameters in that parametrisation; every method
    taking ``theta=None`` evaluates there. ``vectorized``: per-example gradients by ``vmap``
    (False for networks with recurrent layers: a loop over examples).
    """

    model: nn.Module
    task: str
    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    buffers: dict[str, torch.Tensor]
    kept: torch.Tensor | None
    full_size: int
    x: torch.Tensor
    y: torch.Tensor
    theta: torch.Tensor
    chunk: int
    vectorized: bool = True
    own_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None  # the data set's

    @property
    def n(self) -> int:
        """Number of examples in the set."""
        return int(self.x.shape[0])

    @property
    def dim(self) -> int:
        """Number of kept coordinates (the dimension of ``theta``)."""
        return int(self.theta.numel())

    def embed(self, theta: torch.Tensor) -> torch.Tensor:
        """Full flat parameter vector with ``theta`` at kept coordinates and zeros elsewhere."""
        if self.kept is None:
            return theta
        return theta.new_zeros(self.full_size).index_copy(0, self.kept, theta)

    def restrict(self, full: torch.Tensor) -> torch.Tensor:
        """Kept coordinates of a full flat vector."""
        return full if self.kept is None else full[self.kept]

    def params(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        """Parameter (and buffer) dict for ``functional_call``."""
        pieces = torch.split(self.embed(theta), [s.numel() for s in self.shapes])
        out = {n: p.view(s) for n, p, s in zip(self.names, pieces, self.shapes)}
        out.update(self.buffers)
        return out

    def batch_loss(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean loss on the batch ``(x, y)``, the network run as :func:`evaluation` defines."""
        with evaluation(self.model):
            return loss_fn(self.task, self.own_loss)(
                functional_call(self.model, self.params(theta), (x,)), y)

    def example_loss(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Loss on one example (no batch dimension), the function ``vmap`` maps over."""
        return self.batch_loss(theta, x.unsqueeze(0), y.unsqueeze(0))

    def chunks(self, size: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor, float]]:
        """``(x, y, weight)`` per chunk; weights (chunk size / n) sum to one."""
        size = size or self.chunk
        for i in range(0, self.n, size):
            xc, yc = self.x[i:i + size], self.y[i:i + size]
            yield xc, yc, xc.shape[0] / self.n

    def _theta(self, theta: torch.Tensor | None) -> torch.Tensor:
        return self.theta if theta is None else theta

    def loss(self, theta: torch.Tensor | None = None) -> torch.Tensor:
        """``f(theta)``, the mean loss over the set."""
        t = self._theta(theta)
        with torch.no_grad():
            return sum(w * self.batch_loss(t, xc, yc) for xc, yc, w in self.chunks())

    def gradient(self, theta: torch.Tensor | None = None) -> torch.Tensor:
        """Full-set gradient ``grad f(theta)`` over kept coordinates."""
        t = self._theta(theta)
        g = grad(self.batch_loss)
        return sum(w * g(t, xc, yc) for xc, yc, w in self.chunks())

    def gradients(self, thetas: torch.Tensor) -> torch.Tensor:
        """Full-set gradients at ``m`` points at once, ``[m, dim]`` for ``thetas`` ``[m, dim]``:
        one pass over the examples computes all of them (``vmap`` over the points of the
        gradient of each chunk). A chunk holds up to ``chunk`` examples, fewer where the m
        points' activations would pass GRADIENTS_BUDGET floats. The same values as
        :meth:`gradient` at each point, up to the order of float sums. A network with
        recurrent layers (no batching rule) takes the points one after another.

        Why: Lee et al.'s local Lipschitz constant takes nine full-split gradients a point; on
        the quickstart's MLP (MNIST-1D, 7,200 examples, float32, one thread) ten gradients
        took 405 ms one after another and 225 ms at once."""
        if not self.vectorized or thetas.shape[0] == 1:
            return torch.stack([self.gradient(t) for t in thetas])
        g = torch.func.vmap(grad(self.batch_loss), in_dims=(0, None, None))
        m = thetas.shape[0]
        try:
            floats = activation_floats(self.model, tuple(self.x.shape[1:]))
            size = max(1, min(self.chunk, GRADIENTS_BUDGET // max(1, floats * m)))
        except Exception:  # noqa: BLE001 - a model a zero input cannot run (token ids): the
            size = max(1, self.chunk // m)   # activations of one gradient's chunk, m times
        return sum(w * g(thetas, xc, yc) for xc, yc, w in self.chunks(size))

    def hvp(self, v: torch.Tensor, theta: torch.Tensor | None = None) -> torch.Tensor:
        """Full-set Hessian-vector product ``H v`` over kept coordinates; ``v`` of shape
        ``[dim]`` or ``[m, dim]`` (one product per row). For many products at one point build
        :meth:`hessian` once instead."""
        return self.hessian(theta)(v)

    def hessian(self, theta: torch.Tensor | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
        """The full-set Hessian at ``theta`` as a function ``v -> H v`` (``v`` of shape ``[dim]``
        or ``[m, dim]``), by reverse-over-reverse differentiation (Pearlmutter 1994):
        ``H v = d/dtheta (grad f(theta) . v)``.

        The gradient graph (``create_graph``) of the first ``RETAINED_EXAMPLES`` examples is built
        once here and differentiated again by every product, so a product there costs one backward
        pass instead of a forward and two backward passes; graphs of further chunks are rebuilt
        per product. Rows are applied one by one: on CPU a loop over a retained graph is faster
        than ``is_grads_batched`` or ``vmap``.
        """
        t = self._theta(theta).detach().requires_grad_(True)

        def chunk_gradient(xc: torch.Tensor, yc: torch.Tensor, w: float) -> torch.Tensor:
            with torch.enable_grad():
                return w * torch.autograd.grad(self.batch_loss(t, xc, yc), t, create_graph=True)[0]

        retained, rebuilt, seen = None, [], 0
        for xc, yc, w in self.chunks():
            if seen + xc.shape[0] <= RETAINED_EXAMPLES or retained is None:
                g = chunk_gradient(xc, yc, w)
                retained = g if retained is None else retained + g
            else:
                rebuilt.append((xc, yc, w))
            seen += xc.shape[0]

        def rows(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = torch.empty_like(v)
            for i, u in enumerate(v):
                out[i] = torch.autograd.grad(g, t, u, retain_graph=True)[0]
            return out

        def product(v: torch.Tensor) -> torch.Tensor:
            if v.shape[-1:] != (self.dim,) or v.dim() > 2:
                raise TheoryError(f"v must have shape ({self.dim},) or (m, {self.dim}), "
                                  f"got {tuple(v.shape)}")
            m = v.reshape(-1, self.dim).to(t.dtype)
            total = rows(retained, m)
            for xc, yc, w in rebuilt:
                total += rows(chunk_gradient(xc, yc, w), m)
            return total.reshape(v.shape)

        return product

    def per_example_chunk(self, chunk: int | None = None) -> int:
        """Examples per chunk of per-example gradients: ``chunk``, else what fits
        ``PER_EXAMPLE_BYTES`` (at most ``self.chunk``)."""
        if chunk is not None:
            return check_int(chunk, "chunk")
        per_example = self.dim * self.theta.element_size()
        return max(1, min(self.chunk, PER_EXAMPLE_BYTES // per_example))

    def per_example_gradients(self, theta: torch.Tensor | None = None, chunk: int | None = None,
                              x: torch.Tensor | None = None,
                              y: torch.Tensor | None = None) -> Iterator[torch.Tensor]:
        """Per-example gradients ``g_i = grad l(theta; x_i, y_i)`` as ``[c, dim]`` chunks, over the
        set (or over ``x, y`` if given)."""
        t = self._theta(theta)
        x = self.x if x is None else x
        y = self.y if y is None else y
        size = self.per_example_chunk(chunk)
        for i in range(0, x.shape[0], size):
            yield self.mapped_gradients(self.example_loss, t, x[i:i + size], y[i:i + size])

    def mapped_gradients(self, loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                         theta: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        """``[grad loss(theta, xs[j], ys[j]) for each j]`` stacked: one ``vmap`` of ``grad``, or a
        loop of ``grad`` calls when the network is not :attr:`vectorized`."""
        g = grad(loss)
        if self.vectorized:
            return vmap(g, in_dims=(None, 0, 0))(theta, xs, ys)
        return torch.stack([g(theta, xj, yj) for xj, yj in zip(xs, ys)])


def parameter_vector(model: nn.Module, weights: Weights | None = None) -> torch.Tensor:
    """Flat vector of all parameters in ``model.named_parameters()`` order (as
    ``torch.nn.utils.parameters_to_vector``). ``weights`` may be a state dict (entries for every
    parameter; buffers and extra keys are ignored) or already such a flat vector; ``None`` reads
    the model's current parameters."""
    params = dict(model.named_parameters())
    total = sum(p.numel() for p in params.values())
    if weights is None:
        return torch.cat([p.detach().reshape(-1) for p in params.values()])
    if isinstance(weights, torch.Tensor):
        if weights.dim() != 1 or weights.numel() != total:
            raise TheoryError(f"flat weights must be a 1-D tensor of length {total} (all parameters "
                              f"in named_parameters() order), got shape {tuple(weights.shape)}")
        return weights.detach()
    if not isinstance(weights, Mapping):
        raise TheoryError(f"weights must be a state dict or a flat tensor, got {type(weights).__name__}")
    missing = [n for n in params if n not in weights]
    if missing:
        raise TheoryError(f"weights state dict lacks parameter(s) {', '.join(missing)}")
    for name, p in params.items():
        if tuple(weights[name].shape) != tuple(p.shape):
            raise TheoryError(f"weights entry {name!r} has shape {tuple(weights[name].shape)}, "
                              f"parameter has {tuple(p.shape)}")
    return torch.cat([weights[n].detach().reshape(-1) for n in params])


def split_size(dataset: Dataset, split: str = "train") -> int:
    """Number of examples in ``split`` of ``dataset``."""
    return int(select_examples(dataset, None, split=split)[0].shape[0])


def select_examples(dataset: Dataset, examples: int | Sequence[int] | torch.Tensor | None = None,
                    seed: int = 0, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of ``split``: all of them (``examples=None``), a sample without
    replacement of ``examples`` of them drawn with ``seed``, or the given indices."""
    check_dataset(dataset, "select_examples")
    if split not in SPLITS:
        raise TheoryError(f"split {split!r}; allowed: {', '.join(SPLITS)}")
    x, y = getattr(dataset, f"x_{split}"), getattr(dataset, f"y_{split}")
    if x is None:
        raise TheoryError(f"split {split!r} is not loaded (load the data set with test=True)")
    n = int(x.shape[0])
    if examples is None:
        return x, y
    if isinstance(examples, int) and not isinstance(examples, bool):
        if not 1 <= examples <= n:
            raise TheoryError(f"examples must be in [1, {n}] (size of the {split} split), got {examples}")
        if examples == n:
            return x, y
        idx = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))[:examples]
    else:
        idx = torch.as_tensor(examples, dtype=torch.long).reshape(-1)
        if idx.numel() == 0 or int(idx.min()) < 0 or int(idx.max()) >= n:
            raise TheoryError(f"examples indices must be non-empty and in [0, {n}) for the {split} split")
    return x[idx], y[idx]


def flat_loss(model: nn.Module, dataset: Dataset, mask: Mapping[str, torch.Tensor] | None = None,
              examples: int | Sequence[int] | torch.Tensor | None = None, seed: int = 0,
              split: str = "train", chunk: int | None = None, dtype: torch.dtype = torch.float64,
              weights: Weights | None = None) -> FlatLoss:
    """Build the :class:`FlatLoss` of ``model`` on ``dataset`` (see the module docstring).

    ``dtype``: precision of every computation (float64 by default: the probes are ground truths).
    ``weights``: evaluate at these parameters instead of the model's (state dict or flat vector,
    see :func:`parameter_vector`); the mask is applied to them. A state dict's buffers (batch
    normalization's running statistics at that point) replace the model's; a flat vector keeps
    the model's.
    """
    check_output(model, dataset, "flat_loss")
    chunk = DEFAULT_CHUNK if chunk is None else check_int(chunk, "chunk")
    if not dtype.is_floating_point:
        raise TheoryError(f"dtype must be a floating-point torch dtype, got {dtype}")
    params = dict(model.named_parameters())
    if not params:
        raise TheoryError("model has no parameters")
    device = next(iter(params.values())).device
    masks = check_mask(mask, model)
    full = parameter_vector(model, weights).to(device=device, dtype=dtype)
    keep = torch.cat([masks[n].reshape(-1).to(device) != 0 if n in masks
                      else torch.ones(p.numel(), dtype=torch.bool, device=device)
                      for n, p in params.items()])
    kept = None if bool(keep.all()) else torch.nonzero(keep).reshape(-1)
    if kept is not None and kept.numel() == 0:
        raise TheoryError("mask prunes every parameter: nothing left to differentiate")
    x, y = select_examples(dataset, examples, seed, split)
    # integer inputs (token ids) keep their dtype
    x = x.to(device=device, dtype=dtype if x.is_floating_point() else x.dtype)
    y = y.to(device=device, dtype=dtype if dataset.task == "regression" else y.dtype)
    given = weights if isinstance(weights, Mapping) else {}
    # copies: nothing a forward pass does can reach the model's own buffers
    buffers = {n: given.get(n, b).detach().to(device=device, dtype=dtype if b.is_floating_point()
                                               else b.dtype, copy=True)
               for n, b in model.named_buffers()}
    theta = full if kept is None else full[kept]
    fl = FlatLoss(model=model, task=dataset.task, names=tuple(params),
                  shapes=tuple(p.shape for p in params.values()), buffers=buffers, kept=kept,
                  full_size=int(full.numel()), x=x, y=y, theta=theta.clone(), chunk=chunk,
                  vectorized=not any(isinstance(m, RECURRENT) for m in model.modules()),
                  own_loss=dataset.loss)
    _check_probeable(fl)
    return fl
