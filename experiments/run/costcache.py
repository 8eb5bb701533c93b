"""This machine's DDP cost model for a study, measured once and cached.

``sparsescale study`` calls :func:`ensure_cost_model` after training: it copies the cost model of
this machine and the study's workload into the run folder as ``cost_model.json``, so the report's
time-to-result section (:mod:`experiments.measures.hardware.view`) needs no second command. The first study of
a workload on a machine measures it with a short protocol (:data:`QUICK_PROTOCOL`,
:func:`training.distributed.bench.measure`; seconds of work) and fits t(B, k) (:mod:`training.distributed.costmodel`);
later studies reuse the file cached under ``<cache>/cost-models/`` (``training.data.cache_dir``),
keyed by the host name, the CPU model and count, the torch version and the workload. A run folder
that already holds ``cost_model.json`` (e.g. from ``sparsescale bench ddp``) keeps it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from training.device import cpu_name
from training.distributed import costmodel
from training.data import cache_dir
from training.distributed.bench import BenchProtocol, measure
from training.distributed.trainer import backend_for

from experiments.run.workload import Workload

# Short: two per-worker batches fix t_fixed and t_example, two message sizes fix alpha and beta.
# the cost model's file in a run folder, which the report's time to result reads
# (experiments.measures.hardware)
COST_MODEL_FILE = "cost_model.json"
QUICK_PROTOCOL = BenchProtocol(per_worker_batches=(32, 256), allreduce_sizes=(30_000, 3_000_000),
                       warmup=3, repeats=8, rounds=2)


def _cpu_model() -> str:
    return cpu_name() or platform.machine()


def machine_key(workload: Workload) -> dict[str, Any]:
    """What a cached cost model is valid for: this machine, this torch, this workload (its data
    set and model with their options, and a factory's source digest; the pruning criterion does
    not change a dense step)."""
    return {"host": platform.node(), "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
            "torch": str(torch.__version__),
            "workload": {"dataset": workload.dataset, "dataset_options": workload.dataset_options,
                         "model": workload.model, "model_options": workload.model_options,
                         **{f"{kind}_digest": d for kind, d in workload.digests.items()
                            if kind != "criterion"}}}


def cache_path(workload: Workload) -> Path:
    """The cache file of ``workload``'s cost model on this machine."""
    text = json.dumps(machine_key(workload), sort_keys=True)
    # an import path's colon and dots are not wanted in a file name
    label = re.sub(r"[^A-Za-z0-9_-]", "_", f"{workload.dataset}-{workload.model}")
    name = f"{label}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    return cache_dir() / "cost-models" / f"{name}.json"


def measure_cost_model(workload: Workload, protocol: BenchProtocol = QUICK_PROTOCOL,
                       ) -> tuple[costmodel.CostModel, costmodel.Measurements]:
    """Measure DDP step times of ``workload``'s model (seed 0) on k = 1 and, with two or more
    CPUs, k = 2 workers (one thread each) and fit the cost model."""
    dataset = workload.load_dataset()
    model = workload.build_model(dataset, 0)
    workers = (1, 2) if (os.cpu_count() or 1) >= 2 else (1,)
    meas = measure(model, dataset, workers, protocol)
    fit = costmodel.fit(meas, backend=backend_for("cpu"), device="cpu", threads=1,
                        workload=f"{workload.dataset}/{workload.model}",
                        source="measured by sparsescale study, cached per machine")
    return fit, meas


def ensure_cost_model(run_dir: str | Path, workload: Workload,
                      quiet: bool = False) -> Path | None:
    """``run_dir/cost_model.json`` for ``workload`` on this machine: kept if present, else copied
    from the cache, measured into the cache first when the cache lacks it. A measurement that
    fails (e.g. no free port for the workers) prints one line and returns None: the study's
    results stand, and its report says how to add a cost model later."""
    dest = Path(run_dir) / COST_MODEL_FILE
    if dest.exists():
        return dest
    cached = cache_path(workload)
    if not cached.exists():
        if not quiet:
            print("measuring this machine's DDP cost model (once per machine and workload; "
                  "--no-cost-model skips it)")
        try:
            fit, meas = measure_cost_model(workload)
        except Exception as exc:  # noqa: BLE001 - any failure: the study itself is done
            print(f"warning: cost model not measured ({type(exc).__name__}: "
                  f"{str(exc).splitlines()[0] if str(exc) else ''}); the report has no "
                  f"time-to-result", file=sys.stderr)
            return None
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.tmp")
        costmodel.save_cost_model(fit, partial, meas)
        os.replace(partial, cached)   # concurrent studies never see half a file
    shutil.copyfile(cached, dest)
    return dest
