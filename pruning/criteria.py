"""Pruning criteria: one score per prunable weight, in each paper's own convention.

Every function takes the model and its prunable parameters (name -> Parameter) and returns
name -> score tensor of the parameter's shape. None of them changes the model's weights or
``.grad`` (gradients come from ``torch.autograd.grad``). Which end of the scores is kept is stated
per criterion; each is registered below (:func:`pruning.register`) with a score function that
turns it into keep-priorities, and its rules.

- random: U(0, 1) scores from ``torch.Generator().manual_seed(seed)``, drawn per parameter in order.
- magnitude: |w| (Han et al. 2015). Keep the largest.
- SNIP (Lee, Ajanthan & Torr 2019): |dL/dw * w| on one mini-batch, model in eval mode. Keep the
  largest (normalising by the global sum, as the paper does, does not change the ranking).
  On the whole training split as Lee et al. (2021) ran it (``examples="all"``, their code's
  ``edps/prune.py`` and ``edps/model.py``): the gradient of the mean loss of each consecutive
  chunk of SNIP_CHUNK = 100 examples with respect to an all-ones mask c (w * c in the forward
  pass), summed over the chunks, then its absolute value: |sum_b dL_b/dc| = |w * sum_b dL_b/dw|
  (gradients summed before the absolute value, not |.| summed per chunk). With equal chunks this
  is |w * dL/dw| of the mean loss over the split times the number of chunks; a smaller last
  chunk weighs its examples more, as in their code. Lee et al. draw the chunks from a shuffled
  order, which changes only the floating-point order of the sum; here they follow the split.
- GraSP (Wang, Zhang & Grosse 2020): S = -w * (H g), g = dL_T/dw and H = d^2 L_T/dw^2 of the
  cross-entropy on logits / T (T = 200), over the prunable weights only, model in eval mode.
  Remove the LARGEST S, i.e. keep the smallest.
- Iterative SNIP (Verdenius et al. 2020; de Jorge et al. 2021's "Iter SNIP"): SNIP's score,
  recomputed every round on the network with the pruned weights zeroed; pruned weights stay pruned.
- FORCE (de Jorge et al. 2021, foresight connection sensitivity): |w0 * dL/dw| with the gradient
  taken at the PRUNED network w0 * c and multiplied by the ORIGINAL weights w0, so every weight,
  pruned or not, keeps a score (and can come back in a later round). Keep the largest; on the
  dense network (c = 1) it is SNIP's score.
- SynFlow (Tanaka et al. 2020): data-free. With every parameter replaced by its absolute value,
  R = sum(f(1)) for an all-ones input of batch 1; score |w * dR/dw|. Keep the largest. Computed
  in float64 because R is a product over layers.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

import torch
from torch import nn

from training.goal import loss_fn
from training.models import evaluation

from pruning.errors import PruningError
from pruning.iterative import default_train_fn, imp_score_fn
from pruning.registry import SNIP_CHUNK, Context, pruning_batch, register

__all__ = ["SNIP_CHUNK", "pruning_batch", "summed_gradients", "random_scores", "magnitude_scores", "snip_scores", "force_scores",
           "grasp_scores", "synflow_scores", "linearized_copy"]

Params = Mapping[str, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# Pruning batches (Synaptic-Flow's choices, Tanaka et al. 2020; Wang et al. 2020 for GraSP).
SNIP_PER_CLASS = 10
GRASP_PER_CLASS = 25
GRASP_TEMPERATURE = 200.0


def _eval_mode_grad(model: nn.Module, loss_of_output, x: torch.Tensor, params: Params,
                    create_graph: bool = False):
    with evaluation(model):  # eval mode, attention through a twice-differentiable backend
        loss = loss_of_output(model(x))
        return torch.autograd.grad(loss, list(params.values()), create_graph=create_graph)


def summed_gradients(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                     mean: LossFn, chunk: int) -> list[torch.Tensor]:
    """sum_b dL_b/dw over the consecutive chunks b of ``chunk`` examples of (x, y) (the last one
    may be smaller), L_b = ``mean`` loss of chunk b, model in eval mode; each chunk's gradient
    in the parameters' dtype, the sum in float64 (so that 540 float32 additions do not move a
    score), one chunk in memory at a time."""
    if chunk < 1:
        raise PruningError(f"chunk must be >= 1 examples, got {chunk}")
    total = [torch.zeros(p.shape, dtype=torch.float64, device=p.device) for p in params.values()]
    for a in range(0, x.shape[0], chunk):
        xb, yb = x[a:a + chunk], y[a:a + chunk].to(x.device)
        grads = _eval_mode_grad(model, lambda out: mean(out, yb), xb, params)
        torch._foreach_add_(total, [g.detach().double() for g in grads])
    return total


def random_scores(params: Params, seed: int) -> dict[str, torch.Tensor]:
    """U(0, 1) scores, reproducible from ``seed``."""
    g = torch.Generator().manual_seed(int(seed))
    return {k: torch.rand(p.shape, generator=g, dtype=torch.float64) for k, p in params.items()}


def magnitude_scores(params: Params) -> dict[str, torch.Tensor]:
    """|w|."""
    return {k: p.detach().abs() for k, p in params.items()}


def snip_scores(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                task: str = "classification", loss: LossFn | None = None,
                chunk: int | None = None) -> dict[str, torch.Tensor]:
    """SNIP connection sensitivity |dL/dw * w|, L the mean training loss on (x, y) (``loss``:
    the data set's own per-example loss, if any). ``chunk``: L is instead the sum of the mean
    losses of consecutive chunks of ``chunk`` examples (Lee et al. 2021's SNIP on the whole
    split, module docstring)."""
    return force_scores(model, params, x, y, params, task, loss, chunk)


def force_scores(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                 weights: Params, task: str = "classification", loss: LossFn | None = None,
                 chunk: int | None = None) -> dict[str, torch.Tensor]:
    """FORCE's foresight connection sensitivity |w0 * dL/dw|: the gradient of the mean training
    loss on (x, y) at ``model`` (whose ``params`` hold the pruned weights w0 * c) times
    ``weights`` (the original w0, by name). With ``weights=params`` it is SNIP's score.
    ``chunk``: the gradients of the chunks' mean losses summed (:func:`summed_gradients`)."""
    mean = loss_fn(task, loss)
    if chunk is None:
        grads = _eval_mode_grad(model, lambda out: mean(out, y.to(x.device)), x, params)
    else:
        grads = summed_gradients(model, params, x, y, mean, chunk)
    return {k: (g * weights[k].to(g)).detach().abs() for k, g in zip(params, grads)}


def grasp_scores(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                 task: str = "classification",
                 temperature: float = GRASP_TEMPERATURE, loss: LossFn | None = None
                 ) -> dict[str, torch.Tensor]:
    """GraSP scores -w * (H g) with a Hessian-vector product by double backward; the logits are
    divided by ``temperature`` (classification only; regression uses the plain loss)."""
    if temperature <= 0:
        raise PruningError(f"GraSP temperature must be > 0, got {temperature}")
    mean = loss_fn(task, loss)
    scale = temperature if task == "classification" and loss is None else 1.0
    tempered = lambda out: mean(out / scale, y.to(x.device))  # noqa: E731
    g = [t.detach() for t in _eval_mode_grad(model, tempered, x, params)]
    g_graph = _eval_mode_grad(model, tempered, x, params, create_graph=True)
    z = sum((a * b).sum() for a, b in zip(g_graph, g))
    hg = torch.autograd.grad(z, list(params.values()))
    return {k: (-p * h).detach() for (k, p), h in zip(params.items(), hg)}


def synflow_scores(model: nn.Module, params: Params,
                   input_shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """SynFlow scores |w * dR/dw| with R = sum(f(1)). ``model`` must already hold the absolute
    values of its parameters (see :func:`linearized_copy`); its dtype sets the input's."""
    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device
    ones = torch.ones((1, *input_shape), dtype=dtype, device=device)
    grads = _eval_mode_grad(model, lambda out: out.sum(), ones, params)
    return {k: (g * p).detach().abs() for (k, p), g in zip(params.items(), grads)}


@torch.no_grad()
def linearized_copy(model: nn.Module, dtype: torch.dtype = torch.float64) -> nn.Module:
    """A copy of ``model`` in ``dtype`` with every parameter replaced by its absolute value (the
    SynFlow network: with non-negative weights and input, ReLUs pass everything through)."""
    work = copy.deepcopy(model).to(dtype=dtype)
    for p in work.parameters():
        p.abs_()
    return work


# ----------------------------------------------------------------------------------------------
# the registered criteria: each formula as keep-priorities, with its rules


@register("random", summary="uniformly random weights kept (seeded)")
def _random(work: nn.Module, params: Params, context: Context) -> dict[str, torch.Tensor]:
    return random_scores(params, context.seed)


@register("magnitude", summary="largest |w| kept (Han et al. 2015)")
def _magnitude(work: nn.Module, params: Params, context: Context) -> dict[str, torch.Tensor]:
    return magnitude_scores(params)


def _snip(work: nn.Module, params: Params, context: Context) -> dict[str, torch.Tensor]:
    x, y = context.batch(work)
    return snip_scores(work, params, x, y, context.dataset.task, context.dataset.loss,
                       context.chunk)


register("snip", needs=("dataset",), per_class=SNIP_PER_CLASS, whole_split=True,
         summary="largest |dL/dw * w| on 10 examples per class kept (Lee et al. 2019)")(_snip)


@register("grasp", needs=("dataset",), per_class=GRASP_PER_CLASS,
          records=("temperature",),
          summary="smallest -w * (H g) on 25 examples per class, logits / 200, kept "
                  "(Wang et al. 2020)")
def _grasp(work: nn.Module, params: Params, context: Context) -> dict[str, torch.Tensor]:
    x, y = context.batch(work)
    scores = grasp_scores(work, params, x, y, context.dataset.task, context.temperature,
                          context.dataset.loss)
    return {k: -v for k, v in scores.items()}  # GraSP removes the largest scores


@register("synflow", needs=("input_shape",), rounds=100, work=linearized_copy,
          summary="largest |w * dR/dw|, R = sum f(1) on |w|, 100 rounds with the exponential "
                  "schedule (Tanaka et al. 2020)")
def _synflow(work: nn.Module, params: Params, context: Context) -> dict[str, torch.Tensor]:
    return synflow_scores(work, params, context.input_shape)


@register("imp", needs=("dataset|train_fn",), rounds=5,
          summary="iterative magnitude pruning with rewinding to init, trained between rounds "
                  "(Frankle & Carbin 2019)")
def _imp(work: nn.Module, params: Params, context: Context) -> dict[str, torch.Tensor]:
    train = context.train_fn or default_train_fn(context.dataset, context.seed)
    return imp_score_fn(train)(work, params, context.current)


register("iterative_snip", needs=("dataset",), rounds=5, per_class=SNIP_PER_CLASS,
         whole_split=True,
         summary="SNIP re-scored on the remaining weights every round, 5 rounds with the "
                 "exponential schedule (Verdenius et al. 2020)")(_snip)


@register("force", needs=("dataset",), rounds=10, per_class=SNIP_PER_CLASS, revives=True,
          whole_split=True,
          summary="largest |w0 * dL/dw| at the pruned network, pruned weights can return, 10 "
                  "rounds with the exponential schedule (de Jorge et al. 2021)")
def _force(work: nn.Module, params: Params, context: Context) -> dict[str, torch.Tensor]:
    x, y = context.batch(work)
    return force_scores(work, params, x, y, context.initial, context.dataset.task,
                        context.dataset.loss, context.chunk)
