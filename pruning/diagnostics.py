"""Layer-collapse diagnostics of a mask: per-layer density, dead units, input-output paths.

A pruned network can lose a whole layer (global criteria at high sparsity; SynFlow's public code
has reports of pruned-away shortcut convolutions) or every path from its input to an output
(Tanaka et al. 2020 call both "layer collapse"). :func:`diagnose` measures, per masked weight:

- ``density`` = kept / total;
- dead units (output units of a Linear layer, output channels of a Conv layer):
  ``no_incoming`` = units whose incoming weights are all pruned (they only pass on their bias),
  ``no_outgoing`` = units whose outgoing weights in the next layer are all pruned;
- ``on_path`` = kept weights on at least one path from an input unit to an output unit.

Paths are traced for networks whose Linear / Conv layers form a chain (each fed only by the one
before it, through single-input operations such as activations, pooling and flatten: the MLP and
the 1-D/2-D CNNs; a residual network is not a chain and gets local counts only). Connectivity is
propagated at the level of units and channels: A_l[o, i] = 1 when any kept weight joins input
channel i to output channel o (over the kernel); unit o of layer l is reached when some reached
input i has A_l[o, i] = 1, and a Linear layer after a flatten sees each of the previous layer's
channels as a contiguous block of features (channel-major order). Spatial positions are not
traced, so on a CNN the reach is an upper bound (a kept kernel tap that only ever meets padding
counts as a path): a disconnection found here is certain. On an MLP it is exact.

:func:`check` warns with a :class:`LayerCollapseWarning` when a layer is >= 99 % pruned or an
output unit has no path from the input; ``pruning.prune`` calls it on every mask.
:func:`density_figure` draws the per-layer densities of several masks side by side.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch import nn

from training.errors import SparsescaleWarning
from training.masks import check_mask

from pruning.errors import PruningError
from pruning.mask import PRUNABLE_MODULES

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

# A layer with at least this fraction of its weights pruned counts as collapsed.
COLLAPSE_SPARSITY = 0.99
# torch.fx's tracer replaces nn.Module.__call__ for the whole process while it traces: another
# thread's forward pass in that window is recorded into the trace and fails ("module is not
# installed as a submodule"). Tracing holds this lock, and so does pruning (pruning.prune runs
# forward passes), so threads pruning models side by side never meet a trace.
FX_LOCK = threading.RLock()


class LayerCollapseWarning(SparsescaleWarning):
    """A mask (nearly) empties a layer or cuts every path from the input to an output unit (a
    ``training.SparsescaleWarning``, hence a ``UserWarning``)."""


@dataclass(frozen=True)
class LayerDiagnosis:
    """One masked parameter. Unit counts are None for a parameter outside Linear / Conv weights;
    ``no_outgoing`` and ``on_path`` are None when the network is not a chain."""

    name: str
    kept: int
    total: int
    density: float
    units: int | None
    no_incoming: int | None
    no_outgoing: int | None
    dead: int | None          # units with no incoming or no outgoing kept weight
    on_path: int | None


@dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose` found; ``outputs_reached`` / ``inputs_used`` are None when the
    network is not a chain (paths not traced)."""

    layers: tuple[LayerDiagnosis, ...]
    chain: bool
    outputs: int | None
    outputs_reached: int | None
    inputs: int | None
    inputs_used: int | None

    @property
    def connected(self) -> bool | None:
        """Every output unit has a path from the input (None: not a chain, not traced)."""
        return None if self.outputs_reached is None else self.outputs_reached == self.outputs

    def collapsed(self, threshold: float = COLLAPSE_SPARSITY) -> list[str]:
        """Masked Linear / Conv weights with at least ``threshold`` of their entries pruned (a
        pruned-away bias leaves its layer working)."""
        return [d.name for d in self.layers
                if d.units is not None and 1.0 - d.density >= threshold - 1e-12]

    def problems(self) -> list[str]:
        """One line per collapsed layer, and one if an output unit is cut off from the input."""
        out = [f"layer {d.name!r} is {100 * (1 - d.density):.4g} % pruned (kept {d.kept} of "
               f"{d.total})" for d in self.layers if d.name in self.collapsed()]
        if self.connected is False:
            out.append(f"the pruned network is disconnected: {self.outputs - self.outputs_reached}"
                       f" of {self.outputs} output units have no path from the input")
        return out

    def table(self) -> pd.DataFrame:
        """One row per masked parameter (the :class:`LayerDiagnosis` fields)."""
        import pandas as pd

        return pd.DataFrame([asdict(d) for d in self.layers],
                            columns=list(LayerDiagnosis.__dataclass_fields__))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the totals and ``layers`` as a list of dicts."""
        return {"chain": self.chain, "connected": self.connected, "outputs": self.outputs,
                "outputs_reached": self.outputs_reached, "inputs": self.inputs,
                "inputs_used": self.inputs_used, "layers": [asdict(d) for d in self.layers]}


def _chain(model: nn.Module) -> list[str] | None:
    """Module names of the Linear / Conv layers in call order when each is fed only by the one
    before it (the first by the input) and the output comes from the last; else None."""
    try:
        with FX_LOCK:
            graph = torch.fx.symbolic_trace(model).graph
    except Exception:  # noqa: BLE001 - any untraceable model is simply "not a chain"
        return None
    prunable = {n for n, m in model.named_modules() if isinstance(m, PRUNABLE_MODULES)}
    source: dict[torch.fx.Node, str | None] = {}   # the last layer (or "input") a value comes from
    order: list[str] = []
    for node in graph.nodes:
        if node.op == "placeholder":
            if "input" in source.values():
                return None
            source[node] = "input"
            continue
        deps = {source[a] for a in node.all_input_nodes} - {None}
        if len(deps) > 1:
            return None   # a merge (residual add, concatenation): not a chain
        dep = deps.pop() if deps else None
        if node.op == "call_module" and node.target in prunable:
            if dep != (order[-1] if order else "input") or node.target in order:
                return None
            order.append(str(node.target))
            dep = str(node.target)
        elif node.op == "output":
            return order if order and dep == order[-1] and set(order) == prunable else None
        source[node] = dep
    return None


def _adjacency(module: nn.Module, kept: torch.Tensor) -> torch.Tensor:
    """Bool [out units, in units]: some kept weight joins input unit i to output unit o."""
    return kept.reshape(kept.shape[0], kept.shape[1], -1).any(dim=-1)


def _units(module: nn.Module) -> tuple[int, int]:
    if isinstance(module, nn.Linear):
        return module.out_features, module.in_features
    return module.out_channels, module.in_channels


def _trace(modules: list[nn.Module], adj: list[torch.Tensor]) -> dict[str, Any] | None:
    """Forward reach, backward reach and the flatten factor of every layer of a chain, or None
    when the layer widths do not line up (or a convolution is grouped)."""
    factors = [1]
    for prev, mod in zip(modules, modules[1:]):
        out_prev, in_now = _units(prev)[0], _units(mod)[1]
        if in_now == out_prev:
            factors.append(1)
        elif isinstance(mod, nn.Linear) and in_now % out_prev == 0:
            factors.append(in_now // out_prev)   # flatten: channel c -> features c*f .. c*f+f-1
        else:
            return None
    if any(getattr(m, "groups", 1) != 1 for m in modules):
        return None
    fwd_in, reach = [], torch.ones(_units(modules[0])[1], dtype=torch.bool)
    for a, f in zip(adj, factors):
        r = reach.repeat_interleave(f)
        fwd_in.append(r)
        reach = (a & r[None, :]).any(dim=1)
    bwd_out, back = [None] * len(adj), torch.ones(adj[-1].shape[0], dtype=torch.bool)
    for i in range(len(adj) - 1, -1, -1):
        bwd_out[i] = back
        back_in = (adj[i] & back[:, None]).any(dim=0)
        back = back_in.reshape(-1, factors[i]).any(dim=1) if i > 0 else back_in
    return {"factors": factors, "fwd_in": fwd_in, "bwd_out": bwd_out, "outputs_reached": reach,
            "inputs_used": back}


def diagnose(model: nn.Module, mask: Mapping[str, torch.Tensor]) -> Diagnosis:
    """Per-layer density, dead units and input-output paths of ``model`` under ``mask`` (see
    the module docstring). Weights already zero in ``model`` do not count as pruned: only the
    mask does."""
    entries = check_mask(mask, model)
    owner = {f"{n}.weight" if n else "weight": (n, m) for n, m in model.named_modules()
             if isinstance(m, PRUNABLE_MODULES)}
    order = _chain(model)
    chain_names = [f"{n}.weight" if n else "weight" for n in order or []]
    kept = {k: entries.get(k, torch.ones(owner[k][1].weight.shape)) != 0 for k in chain_names}
    traced = None
    if order:
        mods = [owner[k][1] for k in chain_names]
        traced = _trace(mods, [_adjacency(m, kept[k]) for m, k in zip(mods, chain_names)])
    pos = {k: i for i, k in enumerate(chain_names)} if traced else {}
    layers = []
    for name, m in entries.items():
        k_, t_ = int(m.sum()), m.numel()
        units = no_in = no_out = dead = on_path = None
        if name in owner:
            adj = _adjacency(owner[name][1], m != 0)
            units = adj.shape[0]
            without_in = ~adj.any(dim=1)
            no_in = int(without_in.sum())
            if name in pos:
                i = pos[name]
                without_out = torch.zeros(units, dtype=torch.bool)
                if i + 1 < len(chain_names):
                    nxt = _adjacency(owner[chain_names[i + 1]][1], kept[chain_names[i + 1]])
                    f = traced["factors"][i + 1]
                    without_out = ~nxt.any(dim=0).reshape(units, f).any(dim=1)
                no_out, dead = int(without_out.sum()), int((without_in | without_out).sum())
                path = (traced["bwd_out"][i][:, None] & traced["fwd_in"][i][None, :])
                on_path = int(((m != 0).reshape(units, adj.shape[1], -1)
                               & path[:, :, None]).sum())
        layers.append(LayerDiagnosis(name, k_, t_, k_ / t_, units, no_in, no_out, dead, on_path))
    if traced is None:
        return Diagnosis(tuple(layers), False, None, None, None, None)
    return Diagnosis(tuple(layers), True, len(traced["outputs_reached"]),
                     int(traced["outputs_reached"].sum()), len(traced["inputs_used"]),
                     int(traced["inputs_used"].sum()))


def check(model: nn.Module, mask: Mapping[str, torch.Tensor], stacklevel: int = 1) -> Diagnosis:
    """:func:`diagnose`, and one :class:`LayerCollapseWarning` listing its problems, if any,
    attributed to the caller ``stacklevel`` frames up (1: the caller of ``check``)."""
    diagnosis = diagnose(model, mask)
    problems = diagnosis.problems()
    if problems:
        criterion = getattr(mask, "info", {}).get("criterion")
        head = f"mask by {criterion!r}: " if criterion else "mask: "
        warnings.warn(head + "; ".join(problems), LayerCollapseWarning, stacklevel=stacklevel + 1)
    return diagnosis


def density_figure(densities: pd.DataFrame | Mapping[str, Mapping[str, torch.Tensor]],
                   title: str = "Per-layer density") -> Figure:
    """Bars of every layer's density (kept / total, log axis), one colour per mask.

    ``densities``: a mapping label -> mask, or a DataFrame with columns ``series``, ``layer`` and
    ``density`` (one row per mask and layer, e.g. from a study's ``masks.json``). A layer with
    nothing kept is marked "0" at the bottom of the axis (a log axis cannot show it).
    """
    import pandas as pd
    import seaborn as sns
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    if not isinstance(densities, pd.DataFrame):
        densities = pd.DataFrame([
            {"series": label, "layer": k, "density": float((m != 0).sum()) / m.numel()}
            for label, mask in densities.items() for k, m in mask.items()])
    missing = {"series", "layer", "density"} - set(densities.columns)
    if missing or not len(densities):
        raise PruningError(f"densities needs rows with columns series, layer, density; got "
                           f"{len(densities)} rows, missing {sorted(missing)}")
    series = list(dict.fromkeys(densities["series"]))
    layers = list(dict.fromkeys(densities["layer"]))
    palette = sns.color_palette("colorblind", len(series))
    width = max(5.0, 0.9 * len(layers) * max(1, len(series)) ** 0.5 + 2)
    ncols = max(1, min(len(series), int(width * 14 // max(len(str(s)) + 6 for s in series))))
    fig = Figure(figsize=(width, 3.0 + 0.18 * -(-len(series) // ncols)), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(series)
    floor = max(min(densities.loc[densities["density"] > 0, "density"], default=1.0) / 3, 1e-6)
    for j, s in enumerate(series):
        d = densities[densities["series"] == s].set_index("layer")["density"]
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(layers))]
        ys = [float(d.get(layer, float("nan"))) for layer in layers]
        ax.bar(xs, [y if y > 0 else float("nan") for y in ys], width, color=palette[j], label=s)
        for x, y in zip(xs, ys):
            if y == 0:
                ax.text(x, floor, "0", ha="center", va="bottom", color="#b00", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(floor, 1.0)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xticks(range(len(layers)), layers, rotation=30 if len(layers) > 4 else 0, ha="right"
                  if len(layers) > 4 else "center")
    ax.set_xlabel("layer (masked parameter)")
    ax.set_ylabel("density (kept / total)")
    ax.set_title(title)
    fig.legend(loc="outside lower center", ncols=ncols, fontsize=7, frameon=False)
    return fig
