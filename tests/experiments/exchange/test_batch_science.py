"""Importing Shallue et al. (2019)'s batch_science archive, on a generated tree in its documented
layout with a known answer.

The best trial at batch size B crosses the target right after S(B) = S_MIN (1 + B_CRIT / B) steps;
the other counted trials are slower (or never cross), and trials that cross earlier are
INFEASIBLE or INCOMPLETE, which the archive's rule does not count. Evaluations are unevenly
spaced: about every 2 % of the step count, jittered, so no two trials share their steps.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import experiments
from experiments.cli import main as cli
from experiments.exchange import ArchiveError, import_batch_science
from theory import fit_scaling

S_MIN, B_CRIT = 1000.0, 256.0
BATCH_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
METRIC = "val/classification_error"
TARGET = 0.1
COLUMNS = ("step", "train/cross_entropy_error", "train/classification_error",
           "val/cross_entropy_error", METRIC)
# (status, speed factor: crosses the target after factor * S(B) steps; inf: never)
TRIALS = (("COMPLETE", 1.0), ("COMPLETE", 1.3), ("COMPLETE", 2.0), ("COMPLETE", math.inf),
          ("INFEASIBLE", 0.5), ("INCOMPLETE", 0.7), ("INFEASIBLE", None))


def true_steps(b: float) -> float:
    return S_MIN * (1.0 + B_CRIT / b)


def eval_steps(rng: np.random.Generator, last: int) -> list[int]:
    steps = {0}
    s = 10.0
    while s < last:
        steps.add(int(round(s * rng.uniform(0.995, 1.005))))
        s *= 1.02
    return sorted(steps | {last})


def metric_at(step: int, crossing: float) -> float:
    """2 x target at step 0, falling; below the target exactly when step > crossing."""
    if math.isinf(crossing):
        return 1.5 * TARGET + 0.5 * TARGET * math.exp(-step / 1000.0)
    return TARGET * 2.0 ** ((crossing - step) / crossing)


def write_study(folder: Path, b: int, optimizer: str, rng: np.random.Generator,
                trials=TRIALS, dataset="synthetic_mnist", model="simple_cnn",
                shuffle: bool = True) -> None:
    s = true_steps(b)
    train_steps = int(math.ceil(2.5 * s))
    folder.mkdir(parents=True)
    study = {"batch_size": b, "dataset": dataset, "early_stopping": False, "model": model,
             "optimizer": optimizer, "train_steps": train_steps,
             "parameter_configs": {
                 "learning_rate": {"min_value": 1e-4, "max_value": 10.0, "scale": "LOG_SCALE",
                                   "type": "DOUBLE"},
                 "momentum": {"min_value": 0.9, "max_value": 0.9999, "scale": "REVERSE_LOG_SCALE",
                              "type": "DOUBLE"},
                 "label_smoothing": {"feasible_points": [0.0, 0.1], "type": "DISCRETE"}}}
    (folder / "study.json").write_text(json.dumps(study, indent=2))
    # the best trial's id differs between batch sizes (without shuffle: ids in ``trials`` order)
    order = rng.permutation(len(trials)) if shuffle else range(len(trials))
    for tid, i in enumerate(order, start=1):
        status, factor = trials[i]
        crossing = math.inf if factor is None else factor * s
        last = int(0.9 * s) if status != "COMPLETE" else train_steps
        steps = eval_steps(rng, last) if factor is not None else []
        params = {"learning_rate": float(10 ** rng.uniform(-3, 0)),
                  "momentum": float(1 - 10 ** rng.uniform(-3, -1)),
                  "learning_rate_decay_steps": int(0.9 * train_steps),
                  "end_learning_rate_factor": 0.01, "label_smoothing": 0.1}
        if optimizer == "sgd":
            del params["momentum"]
        trial = folder / str(tid)
        trial.mkdir()
        (trial / "metadata.json").write_text(json.dumps(
            {"_internal_study_name": "x", "_internal_trial_id": tid, "parameters": params,
             "status": status, "steps": steps[-1] if steps else 0, "trial_id": tid}, indent=2))
        with open(trial / "measurements.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(COLUMNS)
            for step in steps:
                # an infeasible trial crosses the target at 0.5 S(B), then diverges
                m = metric_at(step, crossing) if status != "INFEASIBLE" or step < 0.6 * s else math.nan
                w.writerow([step, 2 * m, m, 2 * m, m])


def write_workload(folder: Path, optimizer: str = "nesterov_momentum",
                   batch_sizes=BATCH_SIZES, seed: int = 0, **kw) -> Path:
    rng = np.random.default_rng(seed)
    for b in batch_sizes:
        write_study(folder / str(b), b, optimizer, rng, **kw)
    return folder


# ---------------------------------------------------------------------------------------------
# batch_science's rule, restated from its documentation: load the COMPLETE trials' measurements,
# keep the rows within the step budget, take the first row (by step, then trial id) whose metric
# is below the target.


def archive_rule(study_dir: Path, max_steps: int | None = None,
                 statuses=("COMPLETE",), first: int | None = None) -> tuple[int, int] | None:
    """``first``: only the first N counted trials by trial id (Shallue et al.'s 100)."""
    frames = []
    for trial in sorted((d for d in study_dir.iterdir() if d.is_dir()), key=lambda d: int(d.name)):
        if json.loads((trial / "metadata.json").read_text())["status"] in statuses:
            frames.append(pd.read_csv(trial / "measurements.csv").assign(trial_id=int(trial.name)))
    frames = frames[:first]
    table = pd.concat(frames)
    if max_steps is not None:
        table = table[table["step"] <= max_steps]
    good = table[table[METRIC] < TARGET].sort_values(["step", "trial_id"])
    return None if good.empty else (int(good["step"].iloc[0]), int(good["trial_id"].iloc[0]))


def stored_points(run_dir: Path) -> dict[int, tuple[int, int] | None]:
    g = experiments.load_results(run_dir).groups
    return {int(r.batch_size): None if pd.isna(r.steps_to_result) else
            (int(r.steps_to_result), int(r.best_trial)) for r in g.itertuples()}


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return write_workload(tmp_path_factory.mktemp("archive") / "synthetic_mnist" / "simple_cnn"
                          / "nesterov_momentum")


@pytest.fixture(scope="module")
def imported(tree, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("imported") / "run"
    done = import_batch_science(tree, out, METRIC, TARGET)
    assert [(d.run_dir, d.name, d.batch_sizes, d.reached) for d in done] == [
        (out, "synthetic_mnist/simple_cnn", len(BATCH_SIZES), len(BATCH_SIZES))]
    return out


def test_steps_to_result_follow_the_archive_rule_at_every_batch_size(tree, imported):
    points = stored_points(imported)
    assert sorted(points) == list(BATCH_SIZES)
    for b in BATCH_SIZES:
        assert points[b] == archive_rule(tree / str(b)), b
        # the left-out trials matter: counted, they would have hit earlier
        for status in ("INFEASIBLE", "INCOMPLETE"):
            assert archive_rule(tree / str(b), statuses=("COMPLETE", status))[0] < points[b][0]
        # the earliest counted crossing is the S(B) trial's first evaluation after S(B)
        assert true_steps(b) < points[b][0] <= 1.03 * true_steps(b), b


def test_fit_recovers_the_critical_batch(imported):
    g = experiments.load_results(imported).groups
    fit = fit_scaling(g["batch_size"].to_numpy(float), g["steps_to_result"].to_numpy(float))
    assert abs(fit.b_crit / B_CRIT - 1) < 0.10 and abs(fit.s_min / S_MIN - 1) < 0.10


def test_trials_keep_parameters_status_and_uneven_curves(tree, imported):
    res = experiments.load_results(imported)
    for b in BATCH_SIZES:
        group = res.groups[res.groups["batch_size"] == b].iloc[0]
        trials = res.trials[res.trials["group_key"] == group["key"]].set_index("trial")
        config = json.loads(group["config_json"])
        for folder in sorted((tree / str(b)).iterdir()):
            if not folder.is_dir():
                continue
            meta = json.loads((folder / "metadata.json").read_text())
            tid = int(folder.name)
            assert config["trials"][folder.name]["parameters"]["label_smoothing"] == 0.1
            if meta["status"] == "INCOMPLETE":   # left out, as the archive's loader does
                assert tid not in trials.index
                continue
            t = trials.loc[tid]
            assert t["lr"] == meta["parameters"]["learning_rate"]
            assert t["momentum"] == meta["parameters"]["momentum"]
            assert t["decay_steps"] == meta["parameters"]["learning_rate_decay_steps"]
            assert t["end_factor"] == 0.01
            csv_rows = pd.read_csv(folder / "measurements.csv")
            curve = res.curves[(res.curves["group_key"] == group["key"]) & (res.curves["trial"] == tid)]
            assert curve["step"].tolist() == csv_rows["step"].tolist()
            np.testing.assert_array_equal(curve["metric"].to_numpy(float), csv_rows[METRIC].to_numpy(float))
            np.testing.assert_array_equal(curve["train_loss"].to_numpy(float),
                                          csv_rows["train/cross_entropy_error"].to_numpy(float))
            if meta["status"] == "INFEASIBLE":
                assert t["status"] == "diverged" and pd.isna(t["hit_step"])
            else:
                hit = next((s for s, m in zip(csv_rows["step"], csv_rows[METRIC]) if m < TARGET), None)
                assert t["status"] == ("reached" if hit is not None else "not_reached")
                assert (pd.isna(t["hit_step"]) and hit is None) or t["hit_step"] == hit
                assert len(set(np.diff(csv_rows["step"]))) > 10   # unevenly spaced evaluations
        assert group["n_diverged"] == 2 and group["n_trials"] == 6


def test_step_budget_drops_later_evaluations(tree, tmp_path):
    budget = 20_000
    import_batch_science(tree, tmp_path / "run", METRIC, TARGET, max_steps=budget)
    points = stored_points(tmp_path / "run")
    assert points == {b: archive_rule(tree / str(b), budget) for b in BATCH_SIZES}
    assert points[8] is None and points[16] is not None   # S(8) = 33 000 steps > the budget
    assert set(experiments.load_results(tmp_path / "run").groups["max_steps"]) == {budget}


def test_incomplete_trials_count_when_asked(tree, tmp_path):
    import_batch_science(tree, tmp_path / "run", METRIC, TARGET, incomplete=True)
    points = stored_points(tmp_path / "run")
    assert points == {b: archive_rule(tree / str(b), statuses=("COMPLETE", "INCOMPLETE"))
                      for b in BATCH_SIZES}
    assert all(p[0] < true_steps(b) for b, p in points.items())   # the 0.7 S(B) trial


def test_the_first_complete_trials_by_id_count(tree, tmp_path):
    """--first 2: the two lowest-id COMPLETE trials of each batch size, and the INFEASIBLE
    trials drawn before the second; later trials are left out of the group."""
    assert cli.main(["import", "batch-science", str(tree), "--out", str(tmp_path / "run"),
                     "--metric", METRIC, "--target", str(TARGET), "--first", "2"]) == 0
    assert stored_points(tmp_path / "run") == {b: archive_rule(tree / str(b), first=2)
                                               for b in BATCH_SIZES}
    res = experiments.load_results(tmp_path / "run")
    for b in BATCH_SIZES:
        meta = {int(d.name): json.loads((d / "metadata.json").read_text())["status"]
                for d in (tree / str(b)).iterdir() if d.is_dir()}
        second = sorted(i for i, s in meta.items() if s == "COMPLETE")[1]
        key = res.groups.loc[res.groups["batch_size"] == b, "key"].iloc[0]
        kept = set(res.trials.loc[res.trials["group_key"] == key, "trial"])
        assert kept == {i for i, s in meta.items() if i <= second and s != "INCOMPLETE"}, b
    assert res.spec.source["first_complete"] == 2


def test_shallue_counts_the_first_100_complete_trials(tmp_path):
    """A batch size with 103 COMPLETE trials whose fastest is trial 103: the default leaves it
    out, as Shallue et al.'s first 100 do; every_trial counts it."""
    slow = (("COMPLETE", 1.5),) * 102
    folder = tmp_path / "w" / "m" / "nesterov_momentum"
    write_study(folder / "64", 64, "nesterov_momentum", np.random.default_rng(3),
                trials=slow + (("COMPLETE", 1.0),), shuffle=False)
    first = import_batch_science(folder, tmp_path / "first", METRIC, TARGET)
    assert cli.main(["import", "batch-science", str(folder), "--out", str(tmp_path / "every"),
                     "--metric", METRIC, "--target", str(TARGET), "--every-trial"]) == 0
    assert first[0].reached == 1
    [(steps, best)] = stored_points(tmp_path / "first").values()
    assert (steps, best) == archive_rule(folder / "64", first=100) and best <= 100
    assert stored_points(tmp_path / "every") == {64: archive_rule(folder / "64")}
    assert stored_points(tmp_path / "every")[64] == (archive_rule(folder / "64")[0], 103)
    assert steps > stored_points(tmp_path / "every")[64][0]
    assert len(experiments.load_results(tmp_path / "first").trials) == 100
    with pytest.raises(ArchiveError, match="first must be an integer >= 1"):
        import_batch_science(folder, tmp_path / "bad", METRIC, TARGET, first=0)


def test_all_imports_every_workload_below_the_archive_root(tmp_path):
    root = tmp_path / "batch_science"
    write_workload(root / "mnist" / "cnn" / "nesterov_momentum", batch_sizes=(16, 64, 256))
    write_workload(root / "subsets" / "mnist_1k" / "cnn" / "sgd", optimizer="sgd",
                   batch_sizes=(32, 128), seed=1, dataset="mnist_1k")
    status = cli.main(["import", "batch-science", str(root), "--out", str(tmp_path / "runs"),
                       "--metric", METRIC, "--target", str(TARGET), "--all"])
    assert status == 0
    nesterov = experiments.load_results(tmp_path / "runs" / "mnist" / "cnn" / "nesterov_momentum")
    sgd = experiments.load_results(tmp_path / "runs" / "subsets" / "mnist_1k" / "cnn" / "sgd")
    assert nesterov.spec.optimizer == "nesterov" and nesterov.spec.batch_sizes == (16, 64, 256)
    assert sgd.spec.name == "subsets/mnist_1k/cnn" and sgd.spec.optimizer == "sgd"
    assert set(sgd.trials["momentum"]) == {0.0}
    for res, path in ((nesterov, root / "mnist" / "cnn" / "nesterov_momentum"),
                      (sgd, root / "subsets" / "mnist_1k" / "cnn" / "sgd")):
        assert stored_points(res.run_dir) == {int(b.name): archive_rule(b) for b in path.iterdir()}


# ---------------------------------------------------------------------------------------------
# bad trees: one line naming the file, exit status 2, nothing written


def _unlink(path: Path) -> None:
    path.unlink()


BAD_TREES = [
    ("missing study.json", lambda w: _unlink(w / "64" / "study.json"), {},
     "64/study.json: missing"),
    ("trial without measurements.csv", lambda w: _unlink(w / "256" / "3" / "measurements.csv"), {},
     "256/3/measurements.csv: missing"),
    ("unknown metric column", lambda w: None, {"--metric": "val/accuracy"},
     "16/1/measurements.csv: no column 'val/accuracy'; columns: step, train/cross_entropy_error"),
    ("non-integer batch-size folder", lambda w: (w / "bs_32").mkdir(), {},
     "bs_32: folder name 'bs_32' is not an integer batch size"),
    ("non-integer trial folder", lambda w: (w / "256" / "best").mkdir(), {},
     "256/best: folder name 'best' is not an integer trial id"),
    ("batch size differs from its folder", lambda w: (w / "256" / "study.json").write_text(
        (w / "256" / "study.json").read_text().replace('"batch_size": 256', '"batch_size": 512')), {},
     "256/study.json: batch_size is 512 but the folder is 256"),
    ("unknown status", lambda w: (w / "16" / "2" / "metadata.json").write_text(
        (w / "16" / "2" / "metadata.json").read_text().replace('"status": "', '"status": "X')), {},
     "16/2/metadata.json: status is 'X"),
    ("a step that is not an integer", lambda w: (w / "64" / "4" / "measurements.csv").write_text(
        (w / "64" / "4" / "measurements.csv").read_text().replace("\n0,", "\nzero,", 1)), {},
     "64/4/measurements.csv: line 2: step is 'zero'"),
    ("a study folder instead of a workload", None, {}, "is one study (one batch size)"),
]


@pytest.mark.parametrize("case,mutate,options,expected", BAD_TREES, ids=[c[0] for c in BAD_TREES])
def test_bad_tree_gives_one_line_and_writes_nothing(case, mutate, options, expected, tmp_path, capsys):
    workload = write_workload(tmp_path / "tree" / "mnist" / "cnn" / "nesterov_momentum",
                              batch_sizes=(16, 64, 256))
    path = workload / "64" if mutate is None else workload
    if mutate is not None:
        mutate(workload)
    out = tmp_path / "runs" / "run"
    argv = {"--out": str(out), "--metric": METRIC, "--target": str(TARGET)} | options
    status = cli.main(["import", "batch-science", str(path), *(x for kv in argv.items() for x in kv)])
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("error: ") and expected in err, err
    assert not out.exists() and list((tmp_path / "runs").iterdir()) == []   # no staging left


def test_out_folder_holding_anything_is_refused(tmp_path):
    workload = write_workload(tmp_path / "w" / "mnist" / "cnn" / "sgd", optimizer="sgd", batch_sizes=(16,))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises(ArchiveError, match="already exists and is not empty"):
        import_batch_science(workload, tmp_path / "run", METRIC, TARGET)
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("kwargs,match", [
    ({"metric": ""}, "metric must be"), ({"target": math.nan}, "target must be a finite number"),
    ({"target": "0.1"}, "target must be"), ({"max_steps": 0}, "max_steps must be an integer >= 1"),
    ({"path": "nowhere"}, "nowhere: not a folder"),
])
def test_bad_arguments_name_the_argument(kwargs, match, tmp_path):
    args = {"path": tmp_path, "out": tmp_path / "run", "metric": METRIC, "target": TARGET} | kwargs
    with pytest.raises(ArchiveError, match=match) as info:
        import_batch_science(args.pop("path"), args.pop("out"), args.pop("metric"), args.pop("target"), **args)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


def test_bad_tree_in_a_subprocess_exits_2(tmp_path):
    import subprocess
    import sys

    workload = write_workload(tmp_path / "w" / "mnist" / "cnn" / "sgd", optimizer="sgd", batch_sizes=(16,))
    (workload / "16" / "study.json").unlink()
    proc = subprocess.run([sys.executable, "-m", "experiments.cli.main", "import", "batch-science",
                           str(workload), "--out", str(tmp_path / "run"), "--metric", METRIC,
                           "--target", "0.1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1
    assert "16/study.json: missing" in proc.stderr


# ---------------------------------------------------------------------------------------------
# the report of an imported workload, alone and beside a study of this library's


def test_report_of_an_imported_workload(tree, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["import", "batch-science", str(tree), "--out", str(out), "--metric", METRIC,
                     "--target", str(TARGET), "--report"]) == 0
    assert f"synthetic_mnist/simple_cnn: 10 batch sizes, 10 reached the goal -> {out}" in capsys.readouterr().out
    summary = pd.read_csv(out / "summary.csv")
    assert summary["regime"].iloc[0] == "perfect scaling" and summary["regime"].iloc[-1] == "maximal data parallelism"
    assert abs(summary["fit_b_crit"].iloc[0] / B_CRIT - 1) < 0.10
    page = (out / "report.html").read_text()
    for text in ("synthetic_mnist/simple_cnn (nesterov)", "val/classification_error &lt; 0.1",
                 "Scaling fits", "batch_science archive", "fig3_metaparameters"):
        assert text in page, text


def test_report_sets_an_imported_workload_beside_a_study(imported, tiny_toml, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    study = experiments.run_study(tiny_toml, out=tmp_path / "tiny", executor=ThreadPoolExecutor(1),
                                  quiet=True, report=False)
    assert cli.main(["report", str(imported), str(study), "--out", str(tmp_path / "both")]) == 0
    summary = pd.read_csv(tmp_path / "both" / "summary.csv")
    assert list(dict.fromkeys(summary["study"])) == ["synthetic_mnist/simple_cnn", "tiny"]
    imported_rows = summary[summary["study"] == "synthetic_mnist/simple_cnn"]
    assert imported_rows["steps_to_result"].tolist() == [p[0] for p in stored_points(imported).values()]
    page = (tmp_path / "both" / "report.html").read_text()
    assert "synthetic_mnist/simple_cnn (nesterov), dense" in page and "tiny (momentum), dense" in page
