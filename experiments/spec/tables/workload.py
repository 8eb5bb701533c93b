"""The ``[workload]`` table: the data set and the model (registered names, or a study's own by
import path, ``"package.module:factory"``: :mod:`experiments.spec.factories`), their options,
and where and how the groups train (``device``, ``precision``, ``init``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.device import PRECISIONS, DeviceError, check_device
from training.models.initialization import INITS

from experiments.spec.checks import Checker, did_you_mean, registry
from experiments.spec.factories import DIGEST, FactoryError, is_path, path_of, resolve, split


def workload_table(ck: Checker, raw: Mapping[str, Any], folders: tuple[str, ...] = (),
                   digests: Mapping[str, str] | None = None
                   ) -> tuple[str | None, str | None, dict[str, Any] | None,
                              dict[str, Any] | None, dict[str, str]]:
    """The ``[workload]`` table: (dataset, model, dataset_options, model_options, digests).
    ``dataset`` and ``model`` are names from the data set and model registries, or factories by
    import path (a ``"module:factory"`` string, or from Python the callable itself), imported
    from ``sys.path``, then ``folders``; the digests of their sources by kind. ``digests`` given:
    a stored spec's, taken as recorded (nothing is imported). Options must be JSON-able (they
    are hashed into the spec)."""
    wl = ck.table(raw, "workload", "workload", required=True)
    names: dict[str, str | None] = {"dataset": None, "model": None}
    found: dict[str, str] = {}
    dataset_options: dict[str, Any] | None = {}
    model_options: dict[str, Any] | None = {}
    if wl is not None:
        ck.keys(wl, "workload", ("dataset", "dataset_options", "model", "model_options",
                                 "device", "precision",   # these two: device_keys
                                 "init"))                  # init_key
        for kind in names:
            names[kind] = _name(ck, wl.get(kind), kind, folders, digests, found)
        dataset_options = ck.table(wl, "dataset_options", "workload.dataset_options")
        model_options = ck.table(wl, "model_options", "workload.model_options")
        for options, path in ((dataset_options, "workload.dataset_options"),
                              (model_options, "workload.model_options")):
            if options is not None:
                ck.plain(options, path)
    return names["dataset"], names["model"], dataset_options, model_options, found


def _name(ck: Checker, value: Any, kind: str, folders: tuple[str, ...],
          digests: Mapping[str, str] | None, found: dict[str, str]) -> str | None:
    """One ``[workload]`` name: a registered name, or a factory's import path whose digest goes
    into ``found`` (computed from its source, or for a stored spec taken from ``digests``)."""
    path = f"workload.{kind}"
    allowed = registry(kind)
    try:
        if callable(value) and digests is None:
            value = path_of(kind, value)
        if not isinstance(value, str) or not is_path(value):
            if isinstance(value, str) and value in allowed:
                return value
            if value is None:   # TOML has no null: None means the key is missing
                ck.add(path, f"missing; allowed: {', '.join(allowed)}, or a factory "
                             f"\"package.module:factory\"")
                return None
            # "mymodels.mlp" is most likely "mymodels:mlp"
            near = (f" (did you mean {':'.join(value.rpartition('.')[::2])!r}?)"
                    if isinstance(value, str) and "." in value[1:-1]
                    else did_you_mean(str(value), allowed))
            ck.add(path, f"found {value!r}{near}; allowed: {', '.join(allowed)}, or a factory "
                         f"\"package.module:factory\"")
            return None
        if digests is None:
            found[kind] = resolve(kind, value, folders).digest
            return value
        split(kind, value)
    except FactoryError as exc:
        ck.add(path, exc.detail)
        return None
    digest = digests.get(kind)
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        ck.add(f"workload.{kind}_digest", f"found {digest!r}; allowed: the 64 hex digits of the "
                                          f"SHA-256 of the factory's source")
        return None
    found[kind] = digest
    return value


def stored(workload: Any) -> tuple[Any, dict[str, str]]:
    """A stored spec's ``workload`` table without its digests, and the digests by kind."""
    if not isinstance(workload, dict):
        return workload, {}
    return ({k: v for k, v in workload.items() if not k.endswith("_digest")},
            {k.removesuffix("_digest"): v for k, v in workload.items()
             if k.endswith("_digest")})


# The keys of ``[workload]`` that say where and in which arithmetic the groups train.
DEVICE_KEYS = ("device", "precision")


def device_keys(ck: Checker, raw: Mapping[str, Any]) -> tuple[str, str]:
    """``[workload] device`` (``"cpu"`` default, ``"cuda"``, ``"cuda:N"``; checked for its form
    only: a spec stays valid on a machine without the GPU, and the runner checks the machine)
    and ``[workload] precision`` (:data:`training.device.PRECISIONS`, ``"fp32"`` default)."""
    wl = raw.get("workload")
    wl = wl if isinstance(wl, Mapping) else {}
    device, precision = wl.get("device", "cpu"), wl.get("precision", "fp32")
    try:
        device = check_device(device, "workload.device")
    except DeviceError as exc:
        ck.problems.append(str(exc))
        device = "cpu"
    if precision not in PRECISIONS:
        ck.add("workload.precision", f"found {precision!r}"
                                     f"{did_you_mean(str(precision), PRECISIONS)}; "
                                     f"allowed: {', '.join(PRECISIONS)}")
        precision = "fp32"
    return device, precision


def init_key(ck: Checker, raw: Mapping[str, Any]) -> str:
    """``[workload] init``: how the model's weights are initialized,
    :data:`training.models.initialization.INITS` (``"torch"`` default: as the model's builder makes
    them; ``"lee"``: Lee et al. 2021's, TensorFlow's variance scaling with zero biases)."""
    wl = raw.get("workload")
    init = wl.get("init", "torch") if isinstance(wl, Mapping) else "torch"
    if init not in INITS:
        ck.add("workload.init", f"found {init!r}{did_you_mean(str(init), INITS)}; allowed: "
                                f"{', '.join(INITS)}")
        return "torch"
    return init
