"""Faults during training: a learning rate that produces NaN, a worker process killed mid-group."""

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pandas as pd

import experiments
import training
from experiments.spec.plan import plan
from experiments.run.runner import ATTEMPTS, GroupTask, execute, study_info
from experiments.store.database import open_store
from experiments.run.workload import Workload

from .conftest import edit

# lr spans 1e-2 .. 1e12: the large ones overflow to inf / NaN within a few steps
WILD = edit('lr = {scale = "log", min = 0.01, max = 1.0}', 'lr = {scale = "log", min = 0.01, '
            'max = 1e12}').replace("trials = 2", "trials = 4")


def test_nan_learning_rate_marks_the_trial_diverged_and_the_study_goes_on(tmp_path):
    path = tmp_path / "wild.toml"
    path.write_text(WILD)
    run_dir = experiments.run_study(path, out=tmp_path / "run", executor=ThreadPoolExecutor(1),
                                    quiet=True, report=False)
    res = experiments.load_results(run_dir)
    assert list(res.groups.status) == ["done", "done"]
    statuses = set(res.trials.status)
    assert "diverged" in statuses and statuses - {"diverged"}, statuses
    # ground truth: the plain torch.optim loop diverges for exactly the same trials
    ds = training.data.load("teacher", n=300, dim=6, num_classes=3, hidden=8)
    net = training.models.build("mlp", ds, seed=0, hidden=[8])
    for t in res.trials.itertuples():
        ref = training.train_reference(net, ds, training.Trial(lr=t.lr, momentum=t.momentum),
                                       training.RunConfig(int(t.batch_size), max_steps=40,
                                                          stop="never"),
                                       trial_index=int(t.trial))
        assert (t.status == "diverged") == ref.diverged, (t.lr, t.status)
        if t.status == "diverged":
            assert pd.isna(t.hit_step)
    for g in res.groups.itertuples():
        trials = res.trials[res.trials.group_key == g.key]
        assert g.n_diverged == (trials.status == "diverged").sum()
        reached = trials[trials.status == "reached"]
        expected = None if reached.empty else int(reached.hit_step.min())
        assert (None if pd.isna(g.steps_to_result) else int(g.steps_to_result)) == expected


def _pool_workers(driver: int) -> list[int]:
    """Pids of the driver's process-pool workers (children started by multiprocessing spawn)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        ppid = int(next(line.split()[1] for line in status.splitlines()
                        if line.startswith("PPid:")))
        if ppid == driver and b"spawn_main" in cmdline:
            out.append(int(entry.name))
    return out


# four groups whose learning rate is too small to ever reach the goal: each runs its whole
# budget (about a second), so the kill lands inside a group
SLOW = (edit("batch_sizes = [8, 32]", "batch_sizes = [4, 8, 16, 32]")
        .replace("max_steps = 40", "max_steps = 1500")
        .replace('lr = {scale = "log", min = 0.01, max = 1.0}', "lr = 1e-6"))


def test_worker_killed_mid_group_is_retried_and_the_study_completes(tmp_path, done_groups):
    path = tmp_path / "slow.toml"
    path.write_text(SLOW)
    total = len(plan(experiments.load_spec(path)))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "experiments.cli.main", "study", str(path), "--out", str(out),
           "--workers", "1", "--quiet", "--no-report"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        db = out / "results.sqlite"
        while time.time() < deadline and proc.poll() is None and done_groups(db) < 1:
            time.sleep(0.02)
        workers = _pool_workers(proc.pid)
        assert proc.poll() is None and len(workers) == 1, (proc.poll(), workers)
        os.kill(workers[0], signal.SIGKILL)   # the worker is inside the second group
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "Traceback" not in stderr, stderr
    groups = experiments.load_results(out).groups
    assert len(groups) == total, groups
    failed = groups[groups.status == "failed"]
    # the killed group is retried on a fresh worker, or stored as failed with the reason; every
    # other group of the study is trained
    assert len(failed) <= 1, failed[["batch_size", "error"]]
    if len(failed):
        assert "worker" in failed.error.iloc[0] and proc.returncode == 1
        assert "failed:" in stderr and "rerun the same command" in stderr
    else:
        assert proc.returncode == 0, stderr


class BrokenPool(Executor):
    """Every submission fails as when the pool's worker process was killed; logs the groups."""

    def __init__(self, log: list[str]):
        self.log = log

    def submit(self, fn, task):
        self.log.append(task.plan.key)
        fut = Future()
        fut.set_exception(BrokenProcessPool("A process in the pool was terminated abruptly"))
        return fut


def test_group_whose_worker_keeps_dying_is_stored_failed_with_the_reason(spec_file, tmp_path):
    spec = experiments.load_spec(spec_file)
    tasks = [GroupTask(p, Workload.of(spec), None) for p in plan(spec)]
    log: list[str] = []
    with open_store(tmp_path / "run", study_info(spec)) as store:
        records = execute(tasks, BrokenPool(log), store, quiet=True,
                          respawn=lambda: BrokenPool(log))
    assert sorted(log) == sorted([t.plan.key for t in tasks] * ATTEMPTS)
    groups = experiments.load_results(tmp_path / "run").groups
    assert len(records) == len(groups) == len(tasks) and set(groups.status) == {"failed"}
    for error in groups.error:
        assert error.startswith(f"worker process died while running this group (killed, or out "
                                f"of memory; {ATTEMPTS} attempt(s)): BrokenProcessPool")
