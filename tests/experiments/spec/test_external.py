"""Specs of imported workloads: checked for what the report reads, never against the registries,
and recognised by the store through their ``source``."""

from __future__ import annotations

import json

import pytest

import experiments
from experiments.spec.external import ExternalSpec, external_spec, is_external
from experiments.store.schema import StudyInfo
from experiments.spec.search import Dimension
from experiments.spec.errors import SpecError
from experiments.spec.tables.budget import Budget
from experiments.store.database import StoreError, open_store

CANONICAL = {
    "name": "mnist/simple_cnn",
    "source": {"format": "batch_science", "workload": "mnist/simple_cnn", "incomplete_counted": False},
    "workload": {"dataset": "mnist", "dataset_options": {}, "model": "simple_cnn", "model_options": {}},
    "optimizer": "nesterov",
    "goal": {"metric": "val/classification_error", "target": 0.01, "strict": True},
    "batch_sizes": [16, 64, 256], "sparsities": [0.0], "seeds": [0],
    "trials": "98–100",
    "search": {"lr": {"scale": "log", "min": 1e-4, "max": 10.0, "relative": False}},
    "budget": {"max_steps": "train_steps of each study.json (3000–40000; 0 = a time budget)"},
    "probes": {"enabled": False},
}


def test_an_imported_spec_reads_back_with_the_fields_the_report_uses():
    spec = external_spec(CANONICAL, toml_text="# imported")
    assert is_external(CANONICAL) and isinstance(spec, ExternalSpec)
    assert (spec.dataset, spec.model, spec.optimizer, spec.metric) == (
        "mnist", "simple_cnn", "nesterov", "val/classification_error")
    assert spec.batch_sizes == (16, 64, 256) and spec.trials == "98–100"
    assert spec.search == {"lr": Dimension("log", 1e-4, 10.0)}
    assert spec.budget.startswith("train_steps") and not spec.probes.enabled
    assert spec.cells() == [(0.0, 16, 0), (0.0, 64, 0), (0.0, 256, 0)]
    assert spec.canonical() == CANONICAL and external_spec(spec.canonical()).hash == spec.hash
    uniform = external_spec(CANONICAL | {"trials": 100, "budget": {"max_steps": 5000}})
    assert uniform.trials == 100 and uniform.budget == Budget(max_steps=5000)


def test_every_problem_is_named_by_its_key():
    bad = CANONICAL | {"source": {"format": "other"}, "optimizer": "adagrad", "batch_sizes": [0],
                       "goal": {"metric": "", "target": "x", "strict": True},
                       "probes": {"enabled": True}, "extra": 1}
    with pytest.raises(SpecError) as info:
        external_spec(bad)
    keys = [p.split(":")[0] for p in info.value.problems]
    assert keys == ["extra", "source.format", "optimizer", "goal.metric", "goal.target",
                    "batch_sizes[0]", "probes.enabled"]


def test_the_store_returns_an_import_and_refuses_an_unknown_source(tmp_path):
    spec = external_spec(CANONICAL)
    with open_store(tmp_path / "ok", StudyInfo(spec.name, "", spec.hash, spec.to_json())):
        pass
    assert experiments.load_results(tmp_path / "ok").spec == spec
    text = json.dumps(CANONICAL | {"source": {"format": "other"}})
    with open_store(tmp_path / "bad", StudyInfo("x", "", "h", text)):
        pass
    with pytest.raises(StoreError, match="source.format: found 'other'"):
        experiments.load_results(tmp_path / "bad")
