"""The checks of a model before anything is trained, and the context it is evaluated in.

:func:`check_output` is the check every trainer, probe and ``pruning.prune`` makes of a model
against its data set; :func:`check_runnable` refuses what no program can train as the plain loop
would; :func:`evaluation` is the context the probes and the pruning criteria differentiate it in.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from training import randomness
from training.data.dataset import Dataset, check_dataset
from training.errors import DataError
from training.errors import ModelError


# layers whose batching over examples needs a loop (no vmap rule), and cuDNN off for double backward
RECURRENT = (nn.RNNBase, nn.RNNCellBase)


@contextmanager
def evaluation(model: nn.Module) -> Iterator[None]:
    """The context the probes (``theory``) and the pruning criteria evaluate and differentiate
    ``model`` in: eval mode (BatchNorm's running statistics, no Dropout), the math attention
    backend and ``nn.MultiheadAttention``'s fused path off (the fused kernels have no second
    derivative) and, for a network with recurrent layers, cuDNN off; each module's mode and
    every setting restored on exit. The settings are torch's process-wide ones: evaluations in
    several threads of one process share them (a study probes in worker processes, one thread
    each)."""
    modes = [(m, m.training) for m in model.modules()]
    fastpath, cudnn = torch.backends.mha.get_fastpath_enabled(), torch.backends.cudnn.enabled
    try:
        model.eval()
        torch.backends.mha.set_fastpath_enabled(False)
        if any(isinstance(m, RECURRENT) for m, _ in modes):
            torch.backends.cudnn.enabled = False
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.backends.cudnn.enabled = cudnn
        torch.backends.mha.set_fastpath_enabled(fastpath)
        for m, mode in modes:
            m.training = mode

def check_model(model: object, who: str) -> nn.Module:
    """``model`` if it is an ``nn.Module``, else one :class:`ModelError` from ``who``."""
    if not isinstance(model, nn.Module):
        raise ModelError(f"{who}: model must be a torch.nn.Module, got {type(model).__name__}")
    return model


def check_runnable(model: nn.Module) -> None:
    """Refuse, in one line naming the layer and what to do, a module no program can train as
    the plain loop would (so that nothing is trained and nothing is written). Not a module at
    all: left to :func:`training.models.check_output`, which names the type."""
    if not isinstance(model, nn.Module):
        return
    for name, m in model.named_modules():
        where = f"layer {name!r} ({type(m).__name__})" if name else type(m).__name__
        if isinstance(m, nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params():
            raise ModelError(f"{where} has uninitialized (lazy) parameters: call the model once "
                              f"on an example batch before training it")
        if isinstance(m, nn.SyncBatchNorm):
            raise ModelError(f"{where} needs a distributed process group: use nn.BatchNorm*d "
                              f"(each trial keeps its own running statistics)")
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        raise ModelError(f"parameter {frozen[0]!r} does not require grad ({len(frozen)} frozen "
                          f"in all): the trainers update every parameter; unfreeze them, or hold "
                          f"fixed tensors as buffers (register_buffer)")


def expected_output(dataset: Dataset) -> tuple[int, ...]:
    """The output shape the trainers' loss needs for ONE example (a batch of one):
    classification: the label's shape + (num_classes,), e.g. [1, 10] for labels [n], or
    [1, T, 256] for per-token labels [n, T]; regression: the target's shape, [1] for targets [n]
    (an output [B, 1] against targets [B] would broadcast the squared error to [B, B])."""
    target = tuple(dataset.y_train[:1].shape)
    return target + (dataset.num_classes,) if dataset.task == "classification" else target


def check_output(model: object, dataset: object, who: str) -> None:
    """Check, before anything is trained, that ``model`` (an ``nn.Module``) can run on
    ``dataset`` (a :class:`training.Dataset`, :func:`training.data.dataset.check_dataset`) and gives
    the output shape of :func:`expected_output`.

    ``model`` runs once, in eval mode under ``no_grad`` with the global RNG state restored after,
    on ``x_train[:1]`` cast to the model's dtype and device; each submodule's train/eval mode is
    restored. A forward pass that raises becomes one :class:`ModelError` naming the input shape
    and the error's first line; a wrong output shape one naming both shapes (``who``, the entry
    point, leads the line).
    """
    check_model(model, who)
    check_dataset(dataset, who)
    if dataset.n_train == 0:
        raise DataError(f"{who}: the data set has no training examples")
    x = dataset.x_train[:1]
    like = next((t for t in itertools.chain(model.parameters(), model.buffers())
                 if t.is_floating_point()), None)
    if like is not None:
        x = x.to(device=like.device, dtype=like.dtype)
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        # a forward pass that draws random numbers must not move the stream training uses
        with torch.no_grad(), randomness.preserved(x.device):
            out = model(x)
    except Exception as exc:  # the user's model may raise anything on inputs it cannot take
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{who}: model cannot take this data set's inputs of shape "
                         f"{dataset.input_shape}: {reason}") from None
    finally:
        for m, mode in modes:
            m.training = mode
    if not isinstance(out, torch.Tensor):
        raise ModelError(f"{who}: model returned a {type(out).__name__}, not a tensor; "
                         f"forward(x) must return the outputs as one tensor")
    if not out.is_floating_point():
        raise ModelError(f"{who}: model outputs {out.dtype}; the losses need floating-point "
                         f"outputs (logits or values)")
    if dataset.loss is None:
        _check_output_shape(tuple(out.shape), dataset, who)
    else:
        _check_own_loss(out, dataset, who)


def _check_own_loss(out: torch.Tensor, dataset: Dataset, who: str) -> None:
    """The data set's own loss takes the model's output for one example and gives one loss for
    it (the output's shape is the loss's business, not the task's)."""
    y = dataset.y_train[:1].to(out.device)
    try:
        with torch.no_grad():
            value = dataset.loss(out, y)
    except Exception as exc:  # the user's loss may raise anything
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{who}: the data set's loss cannot take the model's outputs "
                         f"{list(out.shape)} and targets {list(y.shape)}: {reason}") from None
    if not isinstance(value, torch.Tensor) or value.dim() < 1 or value.shape[0] != 1:
        got = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ModelError(f"{who}: the data set's loss must return one loss per example (shape "
                         f"[B]); for one example it returned {got}")


def _check_output_shape(got: tuple[int, ...], dataset: Dataset, who: str) -> None:
    want = expected_output(dataset)
    if got == want:
        return
    if dataset.task == "classification":
        c = dataset.num_classes
        if got[:-1] == want[:-1]:
            raise ModelError(f"{who}: model outputs {list(got)} for one example but the data set "
                             f"has {c} classes: the last layer must have {c} outputs")
        raise ModelError(f"{who}: model outputs {list(got)} for one example but labels of shape "
                         f"{list(want[:-1])} with {c} classes need {list(want)}")
    hint = " (end the model with training.models.Flatten1dOutput())" if got == want + (1,) else ""
    raise ModelError(f"{who}: model outputs {list(got)} for one example but the regression "
                     f"targets have shape {list(want)}: the model must output {list(want)}, one "
                     f"value per example{hint}")
