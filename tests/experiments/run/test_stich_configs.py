"""The bundled delay studies (stich_delay_mnist1d and its Fashion-MNIST twin) as tiny twins: the
same spec with its data, batch sizes, delays, trials and budget shrunk, run end to end (the
report's delay section is checked on the MNIST-1D twin: tests/experiments/report covers it)."""

import tomllib
from concurrent.futures import ThreadPoolExecutor

import pytest

import training
from experiments.report.write import write_report
from experiments.run.runner import run_study
from experiments.spec.study import resolve_config, validate
from experiments.store.results import load_results
from training.errors import SparsescaleError

SMALL_DATA = {"mnist1d": {"num_samples": 1200},
              "fashion_mnist": {"val_fraction": 0.2, "train_examples": 400, "standardize": True}}


def tiny_twin(name: str):
    raw = tomllib.loads(resolve_config(name).read_text())
    dataset = raw["workload"]["dataset"]
    try:
        training.data.load(dataset, **SMALL_DATA[dataset])
    except SparsescaleError as exc:   # Fashion-MNIST is installed separately
        pytest.skip(f"{dataset} not available: {exc}")
    raw |= {"batch_sizes": [16, 64], "workers": [1, 3], "trials": 2, "seeds": [0],
            "budget": {"max_steps": 80}, "eval": {"every": 10}, "probes": {"enabled": False},
            "executor": {"program_choice": "rules"}}   # no timing of candidate programs
    raw["workload"]["dataset_options"] = SMALL_DATA[dataset]
    raw["goal"]["target"] = 0.75
    return validate(raw, name)


@pytest.mark.parametrize("name", ["stich_delay_mnist1d", "stich_delay_fashion_mnist"])
def test_the_bundled_delay_study_runs_as_a_tiny_twin(name, tmp_path, monkeypatch):
    spec = tiny_twin(name)
    assert (spec.delays, spec.delay_kind, spec.sparsities) == ((0, 2), "round_robin", (0.0, 0.9))
    run = run_study(spec, out=tmp_path / "run", executor=ThreadPoolExecutor(1), quiet=True,
                    probes=False, report=False)
    g = load_results(run).groups
    assert len(g) == 2 * 2 * 2 and set(g.delay) == {0, 2} and (g.status == "done").all()
    if name != "stich_delay_mnist1d":
        return
    monkeypatch.setattr("experiments.measures.delay.view.N_BOOT", 5)
    write_report([run], out=tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Asynchronous updates: the gradient delay" in md
    assert "Figure 12. Critical delay against critical batch size" in md
