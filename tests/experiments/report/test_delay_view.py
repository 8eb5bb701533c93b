"""The delay axis in the report, on synthetic stores whose truth is the delayed-SGD bound without
additive noise: S(B, tau) = S_min (1 + M / B + k tau), so tau_crit(B) = (1 + M / B) / k (found
exactly: S is linear in tau) and B_crit(tau) = M / (1 + k tau); the best trial's learning rate
follows the guideline times a factor."""

import hashlib
import json
import math

import numpy as np
import pytest

from experiments.measures.delay.view import critical_delay, delay_view, judge
from experiments.report.runs import load_runs, synchronous
from experiments.report.write import write_report
from experiments.spec.study import loads
from experiments.store.database import open_store
from experiments.store.schema import GroupRecord, StudyInfo, TrialRow
from theory.models.delay import lr_ratio

from ..synthetic import spec_text

S_MIN, M = {0.0: 100.0, 0.9: 220.0}, {0.0: 64.0, 0.9: 32.0}
DELAYS = (0, 1, 3, 7)


def delay_store(run_dir, seeds=(0, 1, 2, 3, 4), k=1.0, lr_factor=1.0, noise=0.02):
    """A synthetic study with delays ``DELAYS``: k scales the delay's cost, ``lr_factor`` the best
    trial's learning rate against the guideline's."""
    spec = loads(f"delays = {list(DELAYS)}\n" + spec_text("delayed", "sgd", seeds, "0.0"))
    info = StudyInfo(spec.name, spec.toml, spec.hash, spec.to_json())
    with open_store(run_dir, info) as store:
        for s in spec.sparsities:
            for b in spec.batch_sizes:
                for tau in spec.delays:
                    for seed in spec.seeds:
                        wobble = math.exp(np.random.default_rng([b, tau, seed, int(10 * s)])
                                          .normal(0, noise))
                        steps = int(round(S_MIN[s] * (1 + M[s] / b + k * tau) * wobble))
                        lr = 0.1 * (lr_factor if tau else 1.0) * float(lr_ratio(M[s], b, tau))
                        trials = (TrialRow(0, lr, 0.0, None, 1.0, "reached", steps, 0.1),
                                  TrialRow(1, 10 * lr, 0.0, None, 1.0, "diverged", None, None))
                        key = hashlib.sha256(f"{s}-{b}-{tau}-{seed}".encode()).hexdigest()[:16]
                        store.write_group(GroupRecord(
                            key, s, b, seed, "done", steps, 0, 20000, 1.0, 2 * steps,
                            json.dumps({"b": b}), trials, delay=tau))
    return run_dir


def test_critical_delay_interpolates_linearly_and_says_when_it_is_a_bound():
    assert critical_delay([0, 1, 3], [100, 150, 250], [999] * 3) == (2.0, "")
    # delay 3 did not reach the goal: counted at its budget 300, tau_crit <= 1 + 50 / 150
    tau, kind = critical_delay([0, 1, 3], [100, 150, math.nan], [300] * 3)
    assert kind == "<=" and tau == pytest.approx(1 + 2 * 50 / 150)
    assert critical_delay([0, 1, 3], [100, 120, 150], [999] * 3) == (3.0, ">=")
    assert critical_delay([0, 1], [math.nan, 100], [999] * 2)[1] == "none"


def test_judge_needs_the_whole_interval_on_one_side():
    assert judge(1.0, 0.8, 1.3, 5)[0] == "holds"
    assert judge(1.0, 0.4, 1.3, 5)[0] == "inconclusive"
    assert judge(5.0, 3.0, 7.0, 5)[0] == "does not hold"
    verdict, reason = judge(1.0, 1.0, 1.0, 1)
    assert verdict == "inconclusive" and "one seed" in reason


def test_fewer_than_five_seeds_carry_no_90_percent_interval():
    # [min, max] of k seeds covers a median with chance 1 - 2^(1 - k): 0.875 at k = 4
    for seeds in (2, 3, 4):
        verdict, reason = judge(1.0, 0.9, 1.1, seeds)
        assert verdict == "inconclusive" and f"over {seeds} seeds: too few" in reason
    assert judge(1.0, 0.9, 1.1, 5)[0] == "holds"


def test_the_bound_s_own_curves_give_its_critical_delay_and_batch_and_the_claims_hold(tmp_path):
    runs = load_runs([delay_store(tmp_path)])
    part = delay_view(runs.groups, runs.trials, n_boot=20)
    for r in part.critical.itertuples():
        truth = 1 + M[r.sparsity] / r.batch_size
        if truth < max(DELAYS) * 0.9:
            assert (r.kind, r.tau_crit) == ("", pytest.approx(truth, rel=0.1)), r
        elif truth > max(DELAYS) * 1.1:   # beyond the largest delay: a bound
            assert (r.kind, r.tau_crit) == (">=", max(DELAYS)), r
    fits = part.b_crit.set_index(["sparsity", "delay"])["b_crit"]
    for (s, tau), bc in fits.items():
        assert bc == pytest.approx(M[s] / (1 + tau), rel=0.25), (s, tau)
    assert part.m["dense"] == pytest.approx(M[0.0], rel=0.1)
    v = part.verdicts.set_index(["sparsity", "claim"])
    assert set(v.index) == {(0.0, "stich_one_parameter"), (0.9, "stich_one_parameter"),
                            (0.0, "stich_lr_guideline"), (0.9, "stich_lr_guideline"),
                            (0.9, "delay_sparsity")}
    assert (v["verdict"] == "holds").all(), v[["value", "low", "high"]]
    assert v["statistic"].str.endswith("seed bootstrap").all()
    assert v.loc[(0.0, "stich_lr_guideline"), "value"] == pytest.approx(1.0, rel=0.15)


def test_a_delay_ten_times_as_costly_and_an_unadjusted_lr_do_not_hold(tmp_path):
    runs = load_runs([delay_store(tmp_path, k=10.0, lr_factor=8.0)])
    v = delay_view(runs.groups, runs.trials, n_boot=20).verdicts.set_index(["sparsity", "claim"])
    assert v.loc[(0.0, "stich_one_parameter"), "value"] == pytest.approx(0.1, rel=0.3)
    assert v.loc[(0.0, "stich_one_parameter"), "verdict"] == "does not hold"
    assert v.loc[(0.0, "stich_lr_guideline"), "verdict"] == "does not hold"


def test_one_seed_is_inconclusive_and_the_rest_of_the_report_reads_delay_0_only(tmp_path):
    runs = load_runs([delay_store(tmp_path, seeds=(0,))])
    assert (runs.groups["delay"] > 0).any()
    sync = synchronous(runs)
    assert set(sync.groups["delay"]) == {0} and set(sync.planned["delay"]) == {0}
    assert len(sync.trials) == 2 * len(sync.groups)
    part = delay_view(runs.groups, runs.trials, n_boot=10)
    assert (part.verdicts["verdict"] == "inconclusive").all()


def test_the_report_renders_the_delay_section_and_its_verdicts(tmp_path, monkeypatch):
    monkeypatch.setattr("experiments.measures.delay.view.N_BOOT", 10)
    out = tmp_path / "report"
    html = write_report([delay_store(tmp_path / "run")], out=out)
    md = (out / "report.md").read_text()
    assert "## Asynchronous updates: the gradient delay" in md
    assert "Figure 11. Steps to result against batch size" in md
    assert "Figure 12. Critical delay against critical batch size" in md
    assert "one parameter explains both saturations" in md
    assert "no cost model, so no modelled time" in md
    assert (out / "figures" / "fig12_critical_delay.png").stat().st_size > 1000
    assert (out / "delays.csv").read_text().startswith("run,sparsity,series,batch_size,delay,steps")
    assert html.exists()
    # the rest of the report is the one of delay 0's groups: one summary row per (level, B)
    summary = (out / "summary.csv").read_text().splitlines()
    assert len(summary) == 1 + 2 * 6
