"""The SQLite store: round trip, one transaction per group, refusal of a different study."""

import sqlite3

import pandas as pd
import pytest

from experiments.store.schema import COLUMNS, GroupRecord, StudyInfo, TrialRow
from experiments.spec.study import loads
from experiments.measures.probes.store import ProbeRow, write_probes
from experiments.measures.stage.store import StageRow
from experiments.measures.branching.store import (
    BranchRow, WarmupRow, branched, write_branching,
)
from experiments.store.database import StoreContentError, StoreError, open_store
from experiments.store.results import load_results

from ..conftest import TINY

SPEC = loads(TINY)
STUDY = StudyInfo(SPEC.name, SPEC.toml, SPEC.hash, SPEC.to_json())


def record(key="k1", status="done", trials=2):
    rows = tuple(TrialRow(trial=i, lr=0.1 * (i + 1), momentum=0.9, decay_steps=None if i else 50,
                          end_factor=1.0, status="reached" if i == 0 else "diverged",
                          hit_step=12 if i == 0 else None, final_metric=0.2 if i == 0 else None,
                          curve=((0, 2.3, 0.9), (10, 1.1, 0.35), (12, 0.9, 0.28)))
                 for i in range(trials))
    return GroupRecord(key=key, sparsity=0.5, batch_size=32, seed=0, status=status,
                       steps_to_result=12, best_trial=0, max_steps=100, wall_time=1.5,
                       trial_steps=24, config_json="{}", trials=rows)


def test_round_trip(tmp_path):
    with open_store(tmp_path, STUDY) as store:
        store.write_group(record())
        write_probes(store, 0.5, [ProbeRow(0.5, 0, 32, 0, 0.0, "b_simple", 3.5, 2.0),
                          ProbeRow(0.5, 1, 32, 10, 1.0, "hessian_top", 7.0, 2.5)])
    res = load_results(tmp_path)
    assert list(res.study.columns) == list(COLUMNS["study"]) and len(res.study) == 1
    assert res.spec == SPEC and res.spec.hash == SPEC.hash and res.spec.toml == TINY
    g = res.groups.iloc[0]
    assert (g.key, g.sparsity, g.batch_size, g.steps_to_result, g.n_trials, g.n_reached,
            g.n_diverged) == ("k1", 0.5, 32, 12, 2, 1, 1)
    assert g.lib_version and g.torch_version
    t = res.trials
    assert list(t.trial) == [0, 1] and list(t.status) == ["reached", "diverged"]
    assert t.effective_lr.tolist() == pytest.approx([0.1 / 0.1, 0.2 / 0.1])
    assert t.hit_step.tolist()[0] == 12 and pd.isna(t.hit_step.iloc[1])
    assert t.decay_steps.tolist()[0] == 50 and pd.isna(t.decay_steps.iloc[1])
    assert len(res.curves) == 6 and res.curves.metric.iloc[-1] == pytest.approx(0.28)
    p = res.probes
    assert list(p.columns[:7]) == ["sparsity", "seed", "batch_size", "step", "fraction", "quantity",
                                   "value"]
    assert p[["seed", "step", "fraction", "quantity", "value", "seconds"]].values.tolist() == [
        [0, 0, 0.0, "b_simple", 3.5, 2.0], [1, 10, 1.0, "hessian_top", 7.0, 2.5]]
    assert res.predictions.empty


def test_different_study_is_refused(tmp_path):
    open_store(tmp_path, STUDY).close()
    open_store(tmp_path, STUDY).close()   # same study: fine
    with pytest.raises(StoreError, match="different study"):
        open_store(tmp_path, StudyInfo("s", "a = 2\n", "hash-b", "{}"))


def test_a_stored_spec_that_no_longer_validates_is_a_clean_error(tmp_path):
    """The stored spec is validated again on loading: a spec naming a data set this version
    does not know, or one whose hash does not match, is refused with the reason."""
    open_store(tmp_path, STUDY).close()
    with sqlite3.connect(tmp_path / "results.sqlite") as conn:
        conn.execute("UPDATE study SET spec_json = replace(spec_json, '\"teacher\"', '\"gone\"')")
    with pytest.raises(StoreError, match="not a valid study spec.*workload.dataset: found 'gone'"):
        load_results(tmp_path)
    with sqlite3.connect(tmp_path / "results.sqlite") as conn:
        conn.execute("UPDATE study SET spec_json = ?, spec_hash = 'other'", (SPEC.to_json(),))
    with pytest.raises(StoreError, match="does not give its stored hash"):
        load_results(tmp_path)


def test_group_written_in_one_transaction(tmp_path):
    with open_store(tmp_path, STUDY) as store:
        bad = record(key="k2")
        # a trial status the schema rejects makes the LAST insert fail: nothing may remain
        broken = GroupRecord(**{**bad.__dict__, "trials": bad.trials + (
            TrialRow(9, 0.1, 0.0, None, 1.0, "exploded", None, None),)})
        with pytest.raises(sqlite3.IntegrityError):
            store.write_group(broken)
        assert store.done_keys() == set()
        for table in ("groups", "trials", "curves"):
            assert store.frame(table).empty
        store.write_group(record(key="k2", status="failed", trials=0))
        assert store.done_keys() == set()      # failed groups are retried
        store.write_group(record(key="k2"))    # a retry replaces the failed attempt
        assert store.done_keys() == {"k2"} and len(store.frame("trials")) == 2


def test_wal_and_missing_store(tmp_path):
    open_store(tmp_path, STUDY).close()
    mode = sqlite3.connect(tmp_path / "results.sqlite").execute("PRAGMA journal_mode").fetchone()
    assert mode[0] == "wal"
    with pytest.raises(StoreError, match="no results store"):
        load_results(tmp_path / "nowhere")


def branch_rows(sparsity=0.5, seed=0):

    rows = [BranchRow(sparsity, seed, step, cbs, cbs / 2, cbs, step * 8, 8, 70, 512, 64, 3, 0.01, 4321)
            for step, cbs in ((0, 8.0), (10, 64.0), (70, 256.0))]
    warm = [WarmupRow(sparsity, seed, kind, b, r, None if r == 2 else 30 + r, None if r == 2 else 240 + 8 * r,
                      90, 1120, "[[0, 8, 1.0], [10, 64, 8.0]]", 999)
            for kind, b in (("warmup", 64), ("fixed", 8)) for r in range(3)]
    return rows, warm


def test_branching_round_trip_and_one_transaction(tmp_path):

    rows, warm = branch_rows()
    with open_store(tmp_path, STUDY) as store:
        write_branching(store, 0.5, 0, rows, warm)
        write_branching(store, 0.0, 1, *branch_rows(0.0, 1))
        assert branched(store) == {(0.5, 0), (0.0, 1)}
        # a warmup kind the schema rejects fails the last insert: the old rows stay, whole
        bad = warm[:-1] + [WarmupRow(**{**warm[-1].__dict__, "kind": "other"})]
        with pytest.raises(sqlite3.IntegrityError):
            write_branching(store, 0.5, 0, rows[:1], bad)
    res = load_results(tmp_path)
    b = res.branching
    assert list(b.columns[:6]) == ["sparsity", "seed", "step", "critical_batch", "low", "high"]
    assert b[["sparsity", "seed", "step", "critical_batch", "low", "high"]].values.tolist() == [
        [0.0, 1, 0, 8.0, 4.0, 8.0], [0.0, 1, 10, 64.0, 32.0, 64.0], [0.0, 1, 70, 256.0, 128.0, 256.0],
        [0.5, 0, 0, 8.0, 4.0, 8.0], [0.5, 0, 10, 64.0, 32.0, 64.0], [0.5, 0, 70, 256.0, 128.0, 256.0]]
    assert b.trial_steps.tolist() == [4321] * 6 and b.lib_version.notna().all()
    w = res.warmup[res.warmup.sparsity == 0.5]
    assert w.kind.tolist() == ["fixed"] * 3 + ["warmup"] * 3
    assert w.steps_to_result.tolist()[:2] == [30, 31] and pd.isna(w.steps_to_result.iloc[2])
    assert str(w.examples_to_result.dtype) == "Int64"


def test_a_store_without_the_branching_tables_reads_them_empty(tmp_path):
    open_store(tmp_path, STUDY).close()
    with sqlite3.connect(tmp_path / "results.sqlite") as conn:
        conn.execute("DROP TABLE branching")
        conn.execute("DROP TABLE warmup")
    res = load_results(tmp_path)   # read-only: nothing is made
    assert res.branching.empty and list(res.branching.columns) == list(COLUMNS["branching"])
    assert res.warmup.empty and list(res.warmup.columns) == list(COLUMNS["warmup"])
    with open_store(tmp_path, STUDY) as store:   # opened for writing: the tables are made
        write_branching(store, 0.5, 0, *branch_rows())
    assert len(load_results(tmp_path).branching) == 3


def test_a_store_written_before_lee_stage_reads_it_empty_then_gains_it(tmp_path):
    """stage_probes is a table added later: an older store loads (read-only, nothing made)
    with it empty, and gains it when opened for writing; a level's rows go in with its probes."""
    open_store(tmp_path, STUDY).close()
    with sqlite3.connect(tmp_path / "results.sqlite") as conn:
        conn.execute("DROP TABLE stage_probes")
    res = load_results(tmp_path)
    assert res.stage_probes.empty
    assert list(res.stage_probes.columns) == list(COLUMNS["stage_probes"])
    stage = [StageRow(0.5, 0, 32, trial, step, 3100, "local_lipschitz", 2.0 + trial, 2000, 9.0)
             for trial in (0, 2) for step in (1000, 2000, 3000)]
    with open_store(tmp_path, STUDY) as store:
        write_probes(store, 0.5, [ProbeRow(0.5, 0, 32, 0, 0.0, "loss", 2.3, 9.0)],
                     stage + [StageRow(0.5, 0, 32, 0, 1000, 3100,
                                       "local_lipschitz_full", 2.1, None, 9.0)])
        with pytest.raises(StoreContentError, match="probe quantities \\['lambda'\\]"):
            write_probes(store, 0.5, [], [StageRow(0.5, 0, 32, 0, 1, 2, "lambda", 1.0)])
    s = load_results(tmp_path).stage_probes
    sample, full = s[s.quantity == "local_lipschitz"], s[s.quantity == "local_lipschitz_full"]
    assert len(s) == 7 and sample.examples.tolist() == [2000] * 6
    assert str(s.examples.dtype) == "Int64" and pd.isna(full.examples.iloc[0])
    assert s[s.quantity == "local_lipschitz"].groupby("trial").value.first().tolist() == [2.0, 4.0]
