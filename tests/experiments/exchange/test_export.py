"""TensorBoard export: event files read back with tensorboard's EventAccumulator give the curves
and group summaries the store holds."""

from __future__ import annotations

import math

import numpy as np
import pytest

import experiments
from experiments.cli import main as cli
from experiments.exchange.export import export_tensorboard, summary_run, trial_run
from experiments.store.schema import GroupRecord, StudyInfo, TrialRow
from experiments.spec.study import loads
from experiments.store.database import open_store

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


SPEC = loads("""
name = "tb"
optimizer = "momentum"
batch_sizes = [8, 64, 512]
sparsities = [0.0, 0.5]

[workload]
dataset = "teacher"
model = "mlp"

[goal]
target = 0.2

[search]
lr = {scale = "log", min = 1e-3, max = 1.0}
""")


def _curve(rng: np.random.Generator, n: int, diverge: bool) -> tuple:
    steps = np.cumsum(rng.integers(1, 40, n))   # unevenly spaced evaluations
    loss = 2.0 * np.exp(-steps / 300) + rng.uniform(0, 0.01, n)
    metric = 0.9 * np.exp(-steps / 500)
    if diverge:
        loss[n // 2:], metric[n // 2:] = math.nan, math.inf
    return tuple((int(s), float(l), float(m)) for s, l, m in zip(steps, loss, metric))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    run = tmp_path_factory.mktemp("tb") / "run"
    rng = np.random.default_rng(0)
    with open_store(run, StudyInfo(SPEC.name, SPEC.toml, SPEC.hash, SPEC.to_json())) as s:
        for sparsity in (0.0, 0.5):
            for b in (8, 64, 512):
                trials = []
                for t in range(3):
                    diverged = t == 2
                    curve = _curve(rng, 25, diverged)
                    hit = None if diverged else int(curve[10 + t][0])
                    trials.append(TrialRow(t, 0.1 * (t + 1), 0.9, None, 1.0,
                                           "diverged" if diverged else "reached", hit, None, curve))
                best = min((tr for tr in trials if tr.hit_step), key=lambda tr: tr.hit_step)
                s.write_group(GroupRecord(f"{sparsity}-{b}", sparsity, b, 0, "done", best.hit_step,
                                          best.trial, 1000, 0.0, 100, "{}", tuple(trials)))
    return run


def _scalars(folder, tag) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_event_files_give_back_every_curve(store, tmp_path):
    out = tmp_path / "tb"
    assert export_tensorboard(store, out) == 2 * 3 * 3 + 2   # a run per trial, one per series
    res = experiments.load_results(store)
    groups = res.groups.set_index("key")
    for (key, trial), c in res.curves.groupby(["group_key", "trial"]):
        g = groups.loc[key]
        folder = out / trial_run(g["sparsity"], g["batch_size"], g["seed"], trial)
        for tag, column in (("curve/train_loss", "train_loss"), ("curve/metric", "metric")):
            kept = c.dropna(subset=[column])
            # event files hold float32 values (inf too); missing values (NaN) are left out
            assert _scalars(folder, tag) == [(int(s), float(np.float32(v)))
                                             for s, v in zip(kept["step"], kept[column])]
        if trial == 2:   # the diverged trial: its NaN losses are left out, its inf errors kept
            assert c["train_loss"].isna().sum() == 13 and np.isinf(c["metric"]).sum() == 13


def test_event_files_give_back_every_group_summary(store, tmp_path):
    out = tmp_path / "tb"
    export_tensorboard(store, out)
    res = experiments.load_results(store)
    for sparsity, g in res.groups.groupby("sparsity"):
        folder = out / summary_run(sparsity, 0)
        assert _scalars(folder, "group/steps_to_result") == [
            (int(b), float(s)) for b, s in zip(g["batch_size"], g["steps_to_result"])]
        assert _scalars(folder, "group/diverged") == [(int(b), 1.0) for b in g["batch_size"]]
        best = res.trials.merge(g[["key", "best_trial"]], left_on=["group_key", "trial"],
                                right_on=["key", "best_trial"]).sort_values("batch_size")
        assert _scalars(folder, "group/best_lr") == [
            (int(b), float(np.float32(v))) for b, v in zip(best["batch_size"], best["lr"])]


def test_cli_export(store, tmp_path, capsys):
    assert cli.main(["export", str(store), "--tensorboard", str(tmp_path / "tb")]) == 0
    assert "20 TensorBoard runs written" in capsys.readouterr().out
    assert cli.main(["export", str(tmp_path / "nothing"), "--tensorboard", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_without_tensorboard_the_error_says_how_to_install_it(store, tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)   # import fails
    assert cli.main(["export", str(store), "--tensorboard", str(tmp_path / "tb")]) == 2
    err = capsys.readouterr().err
    assert err == ("error: --tensorboard needs the tensorboard package: "
                   "pip install 'sparsescale[tensorboard]'\n")
