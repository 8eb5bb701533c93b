"""The research scripts run end to end on tiny settings, so they never rot."""

import math

import pytest

from experiments.scripts import fit_scaling_curve, noise_across_sparsity


def test_fit_scaling_curve_tiny(capsys):
    fit = fit_scaling_curve.main(tiny=True)
    out = capsys.readouterr().out
    assert "S_min" in out and "B_crit" in out
    assert fit.s_min > 0 and math.isfinite(fit.b_crit) and fit.b_crit > 0
    # the fitted curve decreases with the batch size, as S_min (1 + B_crit / B) must
    assert fit.predict(4) > fit.predict(256) >= fit.s_min


def test_noise_across_sparsity_tiny(capsys):
    rows = noise_across_sparsity.main(tiny=True)
    assert [r["sparsity"] for r in rows] == [0.0, 0.5, 0.8]
    for r in rows:
        # B_simple is tr(Sigma) / |G|^2 by definition
        assert r["b_simple"] == r["trace_sigma"] / r["g_sq"]
        assert r["hessian_top"] > 0 and r["loss"] > 0
    assert "L / L_dense" in capsys.readouterr().out


def test_best_trial_test_accuracy_trains_the_best_trial_on_the_whole_split(tmp_path, capsys):
    """On a synthetic store (teacher data, MLP): the best trial of the smallest batch size that
    met the goal trains on the whole training split and is scored on the test split."""
    from experiments.scripts import best_trial_test_accuracy as acc
    from experiments.store.results import load_results

    from .synthetic import make_store

    run = make_store(tmp_path / "run")
    b, trial = acc.best_trial(run)
    res = load_results(run)
    g = res.groups[(res.groups.sparsity == 0) & (res.groups.batch_size == b)].iloc[0]
    t = res.trials[(res.trials.group_key == g.key) & (res.trials.trial == g.best_trial)].iloc[0]
    assert b == 8 and trial.lr == t.lr and trial.momentum == t.momentum
    out = acc.main(run, epochs=1)
    import training

    ds = training.data.load("teacher", test=True)
    assert out.steps == math.ceil(ds.n_train / 8) and "test accuracy" in capsys.readouterr().out
    assert out.test_accuracy == pytest.approx(reference_accuracy(ds, out), abs=1.5 / len(ds.y_test))


def reference_accuracy(ds, out) -> float:
    """Test accuracy of the plain reference trainer on ``out``'s trial and budget (B = 8),
    scored by hand."""
    import torch
    import training

    net = training.models.build("mlp", ds, seed=0)
    ref = training.train_reference(net, ds, out.trial, training.RunConfig(8, "sgd",
                                                                          max_steps=out.steps))
    net.load_state_dict(ref.state)
    with torch.no_grad():
        return float((net(ds.x_test).argmax(1) == ds.y_test).float().mean())


def test_best_trial_test_accuracy_decay_to_decays_linearly_over_the_run(tmp_path, capsys):
    """``decay_to``: the same trial with a linear decay over the whole run to that factor, as
    the plain reference trainer runs it; a factor outside (0, 1] is refused."""
    from experiments.scripts import best_trial_test_accuracy as acc

    from .synthetic import make_store

    run = make_store(tmp_path / "run")
    out = acc.main(run, epochs=1, decay_to=0.01)
    assert out.trial.decay_steps == out.steps and out.trial.end_factor == 0.01
    assert "linear decay to 0.01 x" in capsys.readouterr().out
    import training

    ds = training.data.load("teacher", test=True)
    assert out.test_accuracy == pytest.approx(reference_accuracy(ds, out), abs=1.5 / len(ds.y_test))
    with pytest.raises(SystemExit, match="decay-to"):
        acc.main(run, epochs=1, decay_to=1.5)


def test_docs_verdicts_writes_the_reports_verdicts_and_the_pages_tables(full, tmp_path):
    """From a store: the same rows as the report's verdicts.csv (plus where they came from), each
    with its statistic; then a page's table block written from them."""
    import pandas as pd

    from experiments.scripts import docs_verdicts
    from theory.verdicts.step_ratio import STATISTIC

    path = docs_verdicts.write_verdicts(full, tmp_path / "assets")
    got = pd.read_csv(path)
    report = pd.read_csv(full / "verdicts.csv")
    pd.testing.assert_frame_equal(got.drop(columns="source"), report)
    assert set(got["source"]) == {f"generated from the store in {full.name}/ by "
                                  "experiments/scripts/docs_verdicts.py"}
    steps = report[report["claim"] == "lee_sparsity (median step ratio)"]
    assert len(steps) and set(steps["statistic"]) == {STATISTIC}
    page = tmp_path / "page.md"
    study = path.parent.name
    page.write_text(f"Before.\n\n<!-- verdicts-table {study} -->\nstale\n<!-- /verdicts-table -->\n")
    assert docs_verdicts.main(["--assets", str(tmp_path / "assets"), "--page", str(page)]) == 0
    table = docs_verdicts.render_table(docs_verdicts.stored(tmp_path / "assets", study))
    assert page.read_text() == (f"Before.\n\n<!-- verdicts-table {study} -->\n{table}"
                                "<!-- /verdicts-table -->\n")
    assert table.count("\n") == len(report) + 2 and "stale" not in page.read_text()


def test_calibration_tiny(capsys):
    """The calibration table's twin (teacher data, a small MLP, Adam): one row per checkpoint,
    B_simple along the run, the preconditioned one from the run's own Adam moments after the
    first update (none at initialization), no normalization layer, CBS(t) on the branching grid."""
    from experiments.scripts import calibration

    rows = calibration.main(tiny=True)
    work = calibration.TINY
    assert len(rows) == work.checkpoints and rows[0]["step"] == 0
    for r in rows:
        assert math.isfinite(r["b_simple"]) and math.isnan(r["b_norm"])
        assert r["cbs"] in {0} | {k * work.base_batch for k in (1, 2, 4)}
        assert r["cbs_low"] <= r["cbs"] <= r["cbs_high"]
    assert math.isnan(rows[0]["b_pre"]) and all(math.isfinite(r["b_pre"]) for r in rows[1:])
    assert "| tiny (B0 = 8) |" in capsys.readouterr().out


def _store(folder, table, rows):
    """A store holding ``groups`` (``wall_time`` volatile) and Lee's stage under ``table``."""
    import sqlite3
    folder.mkdir()
    conn = sqlite3.connect(folder / "results.sqlite")
    conn.execute("CREATE TABLE groups (batch_size INTEGER, steps INTEGER, wall_time REAL, "
                 "lib_version TEXT)")
    conn.execute(f"CREATE TABLE {table} (step INTEGER, value REAL, seconds REAL)")
    conn.execute("CREATE TABLE looks (look INTEGER)")   # empty: as if absent
    conn.executemany("INSERT INTO groups VALUES (?, ?, ?, ?)", rows)
    conn.execute(f"INSERT INTO {table} VALUES (1000, 2.5, 0.3)")
    conn.commit()
    conn.close()
    return folder


def test_store_digest_ignores_what_differs_between_runs_of_one_spec(tmp_path):
    from experiments.scripts.store_digest import digest

    old = _store(tmp_path / "old", "schedule_probes", [(8, 120, 1.5, "0.1"), (16, 70, 0.9, "0.1")])
    # the table under its new name, rows in another order, other wall times and versions
    new = _store(tmp_path / "new", "stage_probes", [(16, 70, 3.0, "0.2"), (8, 120, 2.0, "0.2")])
    moved = _store(tmp_path / "moved", "stage_probes", [(8, 121, 1.5, "0.1"), (16, 70, 0.9, "0.1")])
    assert digest(old) == digest(new)
    assert digest(moved) != digest(old)   # one measured step differs
