"""The runner: plan, store contents, rerun skipping, SIGKILL and SIGTERM recovery without
orphans, each cell's recorded program, Dask == local pool."""

import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

import experiments
from experiments.cli import main as cli
import training
from experiments.spec.plan import plan
from experiments.store.schema import VOLATILE
from experiments.run.workload import Workload

from ..conftest import TINY

# more groups than TINY, for the kill test: some never reach the goal and run their whole budget
KILL = TINY.replace("batch_sizes = [8, 32, 128]", "batch_sizes = [4, 8, 16, 32, 64, 128]") \
           .replace("seeds = [0]", "seeds = [0, 1]").replace("max = 200", "max = 300")


def run_tiny(toml_path, out, **kw):
    kw.setdefault("executor", ThreadPoolExecutor(1))
    return experiments.run_study(toml_path, out=out, quiet=True, report=False, **kw)


def comparable(run_dir) -> dict[str, pd.DataFrame]:
    res = experiments.load_results(run_dir)
    out = {}
    for table in ("study", "groups", "trials", "curves", "probes", "programs"):
        df = getattr(res, table)
        out[table] = df.drop(columns=list(VOLATILE.get(table, ())))
    return out


def assert_same_store(a, b):
    fa, fb = comparable(a), comparable(b)
    for table in fa:
        pd.testing.assert_frame_equal(fa[table], fb[table], check_exact=True, obj=table)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The tiny study run uninterrupted in-process (one thread)."""
    base = tmp_path_factory.mktemp("base")
    toml = base / "tiny.toml"
    toml.write_text(TINY)
    return toml, run_tiny(toml, base / "run")


def test_store_matches_an_independent_trainer_run(baseline):
    toml, run_dir = baseline
    res = experiments.load_results(run_dir)
    spec = experiments.load_spec(toml)
    assert len(res.groups) == 6 and set(res.groups.status) == {"done"}
    assert len(res.trials) == 6 * 4
    # recompute one dense group directly with the public trainer and compare the stored values
    g = res.groups[(res.groups.sparsity == 0.0) & (res.groups.batch_size == 32)].iloc[0]
    p = next(p for p in plan(spec) if p.key == g.key)
    ds = training.data.load("teacher", n=600, dim=8, num_classes=3, hidden=16)
    net = training.models.build("mlp", ds, seed=0, hidden=[16])
    direct = training.train_trials(
        net, ds, list(p.trials),
        training.RunConfig(32, "momentum", max_steps=p.max_steps,
                           goal=training.Goal("error", 0.3, True),
                           eval_schedule=training.EvalSchedule(every=10)))
    assert g.steps_to_result == direct.steps_to_result
    assert g.best_trial == direct.best
    t = res.trials[res.trials.group_key == g.key]
    assert list(t.status) == direct.status
    assert [None if pd.isna(h) else int(h) for h in t.hit_step] == direct.hit_step
    assert t.effective_lr.tolist() == pytest.approx(
        [x["lr"] / (1 - x["momentum"]) for x in p.trials])


def test_masks_have_the_requested_sparsity(baseline):
    import pruning

    toml, _ = baseline
    spec = experiments.load_spec(toml)
    ds = training.data.load("teacher", n=600, dim=8, num_classes=3, hidden=16)
    masks = Workload.of(spec).masks(ds, [(0.5, 0), (0.0, 0)])
    assert masks[(0.0, 0)] is None
    net = training.models.build("mlp", ds, seed=0, hidden=[16])
    weights = pruning.prunable_parameters(net)
    kept = sum(int(masks[(0.5, 0)][n].sum()) for n in weights)
    total = sum(p.numel() for p in weights.values())
    assert kept == round(total * 0.5)


class RefusingExecutor(Executor):
    def submit(self, fn, *args, **kwargs):
        raise AssertionError("a rerun of a finished study must not train anything")


def test_rerun_trains_nothing(baseline):
    toml, run_dir = baseline
    before = comparable(run_dir)
    run_tiny(toml, run_dir, executor=RefusingExecutor())
    after = comparable(run_dir)
    for table in before:
        pd.testing.assert_frame_equal(before[table], after[table])


def test_other_spec_in_same_folder_is_refused(baseline, tmp_path, capsys):
    _, run_dir = baseline
    other = tmp_path / "other.toml"
    other.write_text(TINY.replace("target = 0.3", "target = 0.25"))
    assert cli.main(["study", str(other), "--out", str(run_dir), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "holds a different study" in err and "Traceback" not in err


def test_sigkill_mid_run_then_rerun_equals_uninterrupted(tmp_path, done_groups):
    toml = tmp_path / "kill.toml"
    toml.write_text(KILL)
    total = len(plan(experiments.load_spec(toml)))
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "experiments.cli.main", "study", str(toml), "--out", str(killed),
           "--workers", "1", "--quiet", "--no-report"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    db = killed / "results.sqlite"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and done_groups(db) < 1:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)   # the driver and its worker processes
    proc.wait()
    landed = done_groups(db)
    assert 1 <= landed < total, f"kill landed after {landed} of {total} groups"

    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert done_groups(db) == total
    uninterrupted = run_tiny(toml, tmp_path / "whole")
    assert_same_store(killed, uninterrupted)


def test_dask_local_cluster_equals_local_pool(baseline, tmp_path):
    pytest.importorskip("distributed")
    toml, run_dir = baseline
    dask_dir = run_tiny(toml, tmp_path / "dask", executor=None, dask="local", workers=1)
    assert_same_store(run_dir, dask_dir)



def test_dry_run_prints_plan_and_cost(tiny_toml, capsys):
    assert cli.main(["study", str(tiny_toml), "--dry-run"]) == 0
    out = capsys.readouterr().out
    # budget: clamp(ceil(8000 / B), 20, 200) -> 200, 200, 63 steps; 4 trials; 2 sparsities
    assert "6 groups = 2 sparsities x 3 batch sizes x 1 seeds, 4 trials each" in out
    assert f"at most {2 * 4 * (200 + 200 + 63):,} trial-steps" in out


class FailingExecutor(Executor):
    """Every group's future fails, as when a worker process dies."""

    def submit(self, fn, *args, **kwargs):
        fut = Future()
        fut.set_exception(RuntimeError("worker lost"))
        return fut


def test_failed_groups_are_stored_then_retried(tiny_toml, tmp_path, capsys):
    run_dir = run_tiny(tiny_toml, tmp_path / "run", executor=FailingExecutor())
    groups = experiments.load_results(run_dir).groups
    assert set(groups.status) == {"failed"} and len(groups) == 6
    assert all(e == "RuntimeError: worker lost" for e in groups.error)
    assert cli._report_failures(run_dir) == 6
    assert "error: group sparsity=0 batch_size=8 seed=0 failed: RuntimeError: worker lost" \
        in capsys.readouterr().err
    run_tiny(tiny_toml, run_dir)
    groups = experiments.load_results(run_dir).groups
    assert set(groups.status) == {"done"} and groups.error.isna().all()


def test_bad_model_option_fails_before_training(tiny_toml, capsys):
    tiny_toml.write_text(TINY.replace("hidden = [16]", "hiden = [16]"))
    assert cli.main(["study", str(tiny_toml), "--out", str(tiny_toml.parent / "r"),
                     "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: bad options for model 'mlp'") and "Traceback" not in err


def test_optimizer_list_runs_one_store_per_optimizer(tmp_path):
    toml = tmp_path / "opts.toml"
    toml.write_text(TINY.replace('optimizer = "momentum"', 'optimizer = ["sgd", "nesterov"]')
                        .replace("sparsities = [0.0, 0.5]", "sparsities = [0.0]")
                        .replace("batch_sizes = [8, 32, 128]", "batch_sizes = [32]"))
    out = run_tiny(toml, tmp_path / "run")
    sgd, nesterov = (experiments.load_results(out / o) for o in ("sgd", "nesterov"))
    assert sgd.spec.optimizer == "sgd" and nesterov.spec.optimizer == "nesterov"
    assert sgd.spec.name == "tiny-sgd" and sgd.spec.optimizers == ("sgd",)
    assert (sgd.trials.momentum == 0).all() and (nesterov.trials.momentum > 0).all()
    assert (sgd.trials.effective_lr == sgd.trials.lr).all()


def test_a_missing_kernel_warns_once_and_trains_the_same_groups(baseline, tmp_path, monkeypatch):
    """The driver finds the compiled kernel unusable once (one warning), its workers do not try
    again, every group records the eager program, and the results equal those of a run with the
    kernel switched off."""
    from training.engine import compiled_kernel as kernels

    def broken(**kwargs):
        raise RuntimeError("Error building extension: c++: fatal error: no input files")

    toml, run_dir = baseline
    expected = "batched" if kernels.fused_sequential() is None else "fused"
    assert set(experiments.load_results(run_dir).groups.program) == {expected}
    monkeypatch.setenv(kernels.DISABLE_ENV, "0")
    run_tiny(toml, tmp_path / "off")
    monkeypatch.delenv(kernels.DISABLE_ENV)
    monkeypatch.delenv(kernels.REQUIRE_ENV, raising=False)   # the fallback, as for a user
    monkeypatch.setattr("torch.utils.cpp_extension.load", broken)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))   # no complete build
    kernels._build.cache_clear()
    try:
        with pytest.warns(kernels.KernelWarning) as record:
            run_tiny(toml, tmp_path / "run", executor=ThreadPoolExecutor(2))
    finally:
        kernels._build.cache_clear()
    assert len([w for w in record if issubclass(w.category, kernels.KernelWarning)]) == 1
    assert set(experiments.load_results(tmp_path / "run").groups.program) == {"batched"}
    assert_same_store(tmp_path / "off", tmp_path / "run")


class CountingExecutor(Executor):
    """Runs each task at once in this thread; records what it was asked to run."""

    def __init__(self):
        self.calls = []

    def submit(self, fn, *args, **kwargs):
        self.calls.append((fn.__name__, args[0].plan.batch_size))
        fut = Future()
        fut.set_result(fn(*args, **kwargs))
        return fut


def test_each_cells_program_is_recorded_first_and_every_later_group_runs_it(tiny_toml, tmp_path,
                                                                            monkeypatch):
    """Without the compiled kernel the tiny MLP's cells have candidates (batched, per_trial,
    plain). A worker chooses each cell's program once, before any group trains, and the store
    records it; a rerun whose machine would choose otherwise (here: a setting forcing another
    candidate, as another cache or another load would) trains the missing groups with the
    recorded program, and the store ends bit for bit as the uninterrupted run's."""
    import sqlite3

    monkeypatch.setenv("SPARSESCALE_KERNELS", "0")
    monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", "plain")
    counting = CountingExecutor()
    whole = run_tiny(tiny_toml, tmp_path / "whole", executor=counting)
    assert counting.calls[:3] == [("choose_group_program", b) for b in (8, 32, 128)]
    assert {name for name, _ in counting.calls[3:]} == {"run_group"}
    res = experiments.load_results(whole)
    assert res.programs[["batch_size", "program", "choice"]].values.tolist() == [
        [8, "plain", "forced"], [32, "plain", "forced"], [128, "plain", "forced"]]
    assert set(res.groups.program) == {"plain"}
    resumed, older = tmp_path / "resumed", tmp_path / "older"
    for out in (resumed, older):
        shutil.copytree(whole, out)
        with sqlite3.connect(out / "results.sqlite") as conn:   # a kill lost two groups
            lost = [k for (k,) in conn.execute("SELECT key FROM groups WHERE batch_size = 32")]
            for table, column in (("curves", "group_key"), ("trials", "group_key"),
                                  ("groups", "key")):
                conn.executemany(f"DELETE FROM {table} WHERE {column} = ?", [(k,) for k in lost])
            if out == older:   # a store written before the programs table
                conn.execute("DELETE FROM programs")
    monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", "per_trial")
    counting = CountingExecutor()
    run_tiny(tiny_toml, resumed, executor=counting)
    assert counting.calls == [("run_group", 32), ("run_group", 32)]   # nothing chosen again
    assert_same_store(whole, resumed)
    # without a record, a cell keeps the program its stored groups ran; only the cell none of
    # whose groups is stored is chosen again
    counting = CountingExecutor()
    run_tiny(tiny_toml, older, executor=counting)
    assert counting.calls == [("choose_group_program", 32), ("run_group", 32), ("run_group", 32)]
    programs = experiments.load_results(older).programs
    assert programs[["batch_size", "program", "choice"]].values.tolist() == [
        [8, "plain", "groups"], [32, "per_trial", "forced"], [128, "plain", "groups"]]
    fresh = experiments.load_results(run_tiny(tiny_toml, tmp_path / "fresh"))
    assert set(fresh.programs.program) == set(fresh.groups.program) == {"per_trial"}


def descendants(pid: int) -> set[int]:
    """The live descendants of process ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (a zombie has ended)."""
    running = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.add(pid)
    return running


def start_driver_with_its_pool(toml, out, done_groups):
    """A study driver (the command line) with two pool workers, once a group is stored; its
    descendants then (the workers, multiprocessing's resource tracker)."""
    cmd = [sys.executable, "-m", "experiments.cli.main", "study", str(toml), "--out", str(out),
           "--workers", "2", "--quiet", "--no-report"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and (
            done_groups(out / "results.sqlite") < 1 or len(descendants(proc.pid)) < 3):
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()
    return cmd, proc, descendants(proc.pid)


def gone_within(pids: set[int], seconds: float) -> set[int]:
    """Those of ``pids`` still alive after ``seconds`` (empty as soon as none is)."""
    deadline = time.time() + seconds
    while alive(pids) and time.time() < deadline:
        time.sleep(0.05)
    return alive(pids)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_killed_driver_leaves_no_process_and_a_rerun_completes_the_store(tmp_path, done_groups,
                                                                           sig):
    """SIGTERM (kill, systemd, SLURM) to the driver alone, with its pool started: the driver
    stores what finished, ends its workers, says so in one line and exits 143. SIGKILL of the
    driver alone runs none of that: the workers see their parent die and exit by themselves
    (training.processes.lifetime). Either way no descendant is left, and a rerun
    completes the store as an uninterrupted run writes it."""
    toml = tmp_path / "kill.toml"
    toml.write_text(KILL)
    total = len(plan(experiments.load_spec(toml)))
    killed = tmp_path / "killed"
    cmd, proc, family = start_driver_with_its_pool(toml, killed, done_groups)
    os.kill(proc.pid, sig)
    code = proc.wait(timeout=60)
    err = proc.stderr.read()
    assert gone_within(family, 15) == set()
    if sig == signal.SIGTERM:
        assert code == 143 and err.strip().splitlines()[-1] == (
            "terminated (SIGTERM): finished groups are stored; rerun the same command to "
            "continue"), err
    else:
        assert code == -signal.SIGKILL
    assert 1 <= done_groups(killed / "results.sqlite") < total
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert_same_store(killed, run_tiny(toml, tmp_path / "whole"))


def test_the_watches_of_two_measurements_are_joined_into_one(monkeypatch):
    """Each measurement's watch is called at its own steps, with the call's first trial."""
    from experiments.run import runner

    calls = []

    class Watcher:
        def __init__(self, name, steps):
            self.name, self.steps = name, steps

        def watch(self, first_index):
            return training.Watch(self.steps, lambda t, ids, before, after:
                                  calls.append((self.name, first_index, t)))

    seen = {}
    monkeypatch.setattr(training, "train_trials",
                        lambda *args, watch, first_index, **kwargs: seen.setdefault("w", watch))
    runner._watched(watchers=[Watcher("a", (2, 4)), Watcher("b", (4, 6))], first_index=3)
    joined = seen["w"]
    assert list(joined.steps) == [2, 4, 6]
    for t in joined.steps:
        joined.callback(t, [0], {}, {})
    assert calls == [("a", 3, 2), ("a", 3, 4), ("b", 3, 4), ("b", 3, 6)]
