"""The t(B, k) cost model: closed forms, fit on synthetic measurements, JSON round trip."""

import json

import numpy as np
import pytest

from training.distributed.costmodel import (
    AllReduceTime, CostModel, CostModelError, CostModelIOError, Measurements, StepTime, fit,
    format_report, load_cost_model, load_measurements, ring_rounds, save_cost_model,
)

TRUE = CostModel(t_fixed=2e-4, t_example=3e-6, alpha=5e-5, beta=2e-10, n_params=50_000)


def synthetic(cost: CostModel, noise: float = 0.0, seed: int = 0, bare_alpha: float | None = None,
              workers=(1, 2, 4)) -> Measurements:
    """Times generated from the closed form written out here, independent of CostModel's code.
    ``bare_alpha``: latency of a bare all-reduce if it differs from the in-step one."""
    rng = np.random.default_rng(seed)
    jitter = lambda: 1.0 + noise * rng.standard_normal()  # noqa: E731
    bare = cost.alpha if bare_alpha is None else bare_alpha
    steps, reduces = [], []
    for k in workers:
        comm = 0.0 if k == 1 else (2 * (k - 1) * cost.alpha
                                   + 2 * (k - 1) / k * cost.beta * cost.n_params * 4)
        for b in (8, 32, 128, 512):
            steps.append(StepTime(k, b, (cost.t_fixed + cost.t_example * b + comm) * jitter()))
        if k > 1:
            for n in (4_000, 400_000, 4_000_000):
                reduces.append(AllReduceTime(k, n, (2 * (k - 1) * bare
                                                    + 2 * (k - 1) / k * cost.beta * n) * jitter()))
    return Measurements(tuple(steps), tuple(reduces), cost.n_params)


def test_ring_rounds():
    assert ring_rounds(1) == (0.0, 0.0)
    assert ring_rounds(2) == (2.0, 1.0)
    assert ring_rounds(4) == (6.0, 1.5)


def test_step_time_closed_form():
    # k = 4, B = 256: 2e-4 + 3e-6 * 64 + 6 * 5e-5 + 1.5 * 2e-10 * 200_000
    assert TRUE.step_time(256, 4) == pytest.approx(2e-4 + 1.92e-4 + 3e-4 + 6e-5, rel=1e-12)
    assert TRUE.step_time(64, 1) == pytest.approx(2e-4 + 1.92e-4, rel=1e-12)
    assert TRUE.allreduce_time(1) == 0.0


def test_fit_recovers_constants_exactly():
    got = fit(synthetic(TRUE), backend="gloo")
    for key in ("t_fixed", "t_example", "alpha", "beta"):
        assert getattr(got, key) == pytest.approx(getattr(TRUE, key), rel=1e-6), key
    assert got.meta["backend"] == "gloo"


def test_fit_takes_latency_from_steps_and_bandwidth_from_allreduce():
    """Steps that wait longer per round than a bare all-reduce (stragglers, DDP bookkeeping):
    alpha comes from the steps, the bare one is kept in meta, beta from the all-reduce sweep."""
    got = fit(synthetic(TRUE, bare_alpha=1e-5, workers=(1, 2)))
    assert got.alpha == pytest.approx(TRUE.alpha, rel=1e-6)
    assert got.meta["alpha_allreduce"] == pytest.approx(1e-5, rel=1e-6)
    assert got.beta == pytest.approx(TRUE.beta, rel=1e-6)
    assert got.t_fixed == pytest.approx(TRUE.t_fixed, rel=1e-6)


def test_fit_with_noise_stays_close():
    got = fit(synthetic(TRUE, noise=0.02, seed=1))
    assert got.t_example == pytest.approx(TRUE.t_example, rel=0.05)
    assert got.beta == pytest.approx(TRUE.beta, rel=0.05)


def test_fit_without_multiworker_data_has_no_communication_cost():
    meas = synthetic(TRUE)
    single = Measurements(tuple(s for s in meas.steps if s.workers == 1), (), meas.n_params)
    got = fit(single)
    assert got.alpha == got.beta == 0.0
    assert got.t_example == pytest.approx(TRUE.t_example, rel=1e-6)
    # all-reduce measured but steps only on one worker: the bare latency is used
    got = fit(Measurements(single.steps, meas.allreduce, meas.n_params))
    assert got.alpha == pytest.approx(TRUE.alpha, rel=1e-6)
    assert got.beta == pytest.approx(TRUE.beta, rel=1e-6)


def test_fit_needs_steps():
    with pytest.raises(CostModelError, match="no step times"):
        fit(Measurements((), (), 10))


def test_bad_constants_and_arguments():
    with pytest.raises(CostModelError, match="alpha"):
        CostModel(1e-3, 1e-6, -1.0, 0.0, 10)
    with pytest.raises(CostModelError, match="n_params"):
        CostModel(1e-3, 1e-6, 0.0, 0.0, 0)
    with pytest.raises(CostModelError, match="multiple of workers"):
        TRUE.step_time(6, 4)
    with pytest.raises(CostModelError, match="workers"):
        TRUE.step_time(8, 0)


def test_json_round_trip(tmp_path):
    meas = synthetic(TRUE)
    path = save_cost_model(fit(meas, device="cpu"), tmp_path, meas)
    assert path == tmp_path / "cost_model.json"
    doc = json.loads(path.read_text())
    assert doc["format"] == "sparsescale-cost-model" and doc["version"] == 1
    assert len(doc["measurements"]["steps"]) == len(meas.steps)
    back = load_cost_model(tmp_path)
    assert back.step_time(512, 4) == pytest.approx(TRUE.step_time(512, 4), rel=1e-6)
    assert back.meta["device"] == "cpu"
    assert load_measurements(path) == meas


@pytest.mark.parametrize("doc, match", [
    ({"format": "other"}, "'format'"),
    ({"format": "sparsescale-cost-model", "version": 9}, "'version'"),
    ({"format": "sparsescale-cost-model", "version": 1, "t_fixed": 0.0}, "missing keys"),
])
def test_load_rejects_bad_files(tmp_path, doc, match):
    path = tmp_path / "cost_model.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CostModelError, match=match):
        load_cost_model(path)
    with pytest.raises(CostModelIOError, match="missing.json: cannot read"):   # an OSError
        load_cost_model(tmp_path / "missing.json")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(CostModelError, match="binary.json: cannot read"):   # a ValueError
        load_cost_model(tmp_path / "binary.json")


def test_report_lists_every_measurement():
    meas = synthetic(TRUE)
    text = format_report(fit(meas), meas)
    assert text.count("| 1.00 |") == len(meas.steps)  # exact fit: model / measured = 1
    assert "t_example = 3.000 us" in text


def test_measurements_are_optional_and_checked(tmp_path):
    path = save_cost_model(TRUE, tmp_path / "c.json")
    assert load_measurements(path) is None
    doc = json.loads(path.read_text())
    doc["measurements"] = {"steps": [{"workers": 1}], "allreduce": []}
    path.write_text(json.dumps(doc))
    with pytest.raises(CostModelError, match="'measurements'"):
        load_measurements(path)
