"""A study of the user's own model and data set, named by import path beside its spec: run by the
command line with the process pool and with Dask, keyed by its source, refused in one line when
bad, before anything is written."""

import hashlib
import json
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import torch

import experiments
import training
from experiments.cli import main as cli
from experiments.run.runner import GroupTask, run_group
from experiments.run.workload import Workload
from experiments.spec.factories import FactoryError
from experiments.spec.plan import plan

from ..conftest import OWN, forget_imports, own_project_in
from .test_runner import assert_same_store

ROOT = Path(__file__).resolve().parents[3]


def study(folder, out, *options):
    """``sparsescale study`` of the project's spec in this process; its exit status."""
    return cli.main(["study", str(folder / "own.toml"), "--out", str(out), "--quiet",
                     "--no-report", *options])


@pytest.fixture(scope="module")
def pool_run(tmp_path_factory):
    """The project's study run by the command line with a spawned process pool."""
    folder = tmp_path_factory.mktemp("project")
    with own_project_in(folder):
        assert study(folder, folder / "pool", "--workers", "1") == 0
    return folder, folder / "pool"


def test_study_from_a_module_beside_its_spec(pool_run):
    folder, run_dir = pool_run
    res = experiments.load_results(run_dir)
    digest = hashlib.sha256((folder / "mymodels.py").read_bytes()).hexdigest()
    # provenance: the study row's spec names the factories and the module file's digest
    workload = json.loads(res.study.spec_json.iloc[0])["workload"]
    assert workload == {"dataset": "mymodels:blobs", "dataset_options": {},
                        "model": "mymodels:mlp", "model_options": {},
                        "dataset_digest": digest, "model_digest": digest}
    assert res.spec.model == "mymodels:mlp" and res.spec.digests == {"dataset": digest,
                                                                     "model": digest}
    assert len(res.groups) == 2 and set(res.groups.status) == {"done"}
    for g in res.groups.itertuples():
        assert json.loads(g.config_json)["workload"]["model_digest"] == digest
    # each group equals the public trainer on the factories called as documented: the model
    # under torch.manual_seed(seed), the data set from its options
    with own_project_in(folder / "again"):
        spec = experiments.load_spec(folder / "again" / "own.toml")   # puts its folder on sys.path
        import mymodels

        ds = mymodels.blobs()
        for p in plan(spec):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(p.seed)
                net = mymodels.mlp(ds)
            direct = training.train_trials(
                net, ds, list(p.trials),
                training.RunConfig(p.batch_size, "momentum", max_steps=p.max_steps,
                                   goal=training.Goal("error", 0.2, True),
                                   eval_schedule=training.EvalSchedule(every=5)))
            g = res.groups[res.groups.key == p.key].iloc[0]
            assert direct.steps_to_result is not None
            assert g.steps_to_result == direct.steps_to_result and g.best_trial == direct.best
            t = res.trials[res.trials.group_key == p.key]
            assert list(t.status) == direct.status
            assert [None if pd.isna(h) else int(h) for h in t.hit_step] == direct.hit_step


@pytest.mark.slow
def test_dask_gives_the_same_store_as_the_process_pool(pool_run):
    pytest.importorskip("distributed")
    folder, pool = pool_run
    with own_project_in(folder):
        assert study(folder, folder / "dask", "--dask", "local", "--workers", "1") == 0
    assert_same_store(pool, folder / "dask")


def group_rows(out: str, status: str) -> list[str]:
    """The dry run's group lines (sparsity, batch, max_steps, trial-steps, status) that end in
    ``status``."""
    return [line for line in out.splitlines()
            if len(line.split()) == 5 and line.split()[0] == "0" and line.endswith(status)]


def test_an_edit_of_the_model_makes_every_group_new(pool_run, capsys):
    folder, run_dir = pool_run
    with own_project_in(folder / "edit") as p:
        assert study(p, run_dir, "--dry-run") == 0
        out = capsys.readouterr().out
        assert len(group_rows(out, " stored")) == 2 and "0 new, 2 stored" in out   # reused
        forget_imports()   # a fresh process, after the edit
        (p / "mymodels.py").write_text((p / "mymodels.py").read_text()
                                       .replace("WIDTH = 16", "WIDTH = 16   # tried 32"))
        assert study(p, run_dir, "--dry-run") == 0
        out = capsys.readouterr().out
    assert len(group_rows(out, " new")) == 2 and not group_rows(out, " stored"), out
    assert "2 new, 0 stored" in out
    assert "differ in workload.dataset_digest, workload.model_digest" in out
    assert "the factory module's code changed since" in out


def test_a_worker_holding_other_code_fails_its_group(own_project):
    spec = experiments.load_spec(own_project / "own.toml")
    stale = Workload.of(spec)
    stale = Workload(**{**stale.__dict__, "digests": {**stale.digests, "model": "0" * 64}})
    rec = run_group(GroupTask(plan(spec)[0], stale, None))
    assert rec.status == "failed"
    assert rec.error.startswith("FactoryError: workload.model: mymodels:mlp: ")
    assert "has sha256" in rec.error and "study was made from sha256 000000000000" in rec.error


def test_a_fresh_process_imports_the_factory_by_its_path(own_project, tmp_path):
    """What a worker does, remote ones included: the task names the factory and the spec's
    folder, and the process imports it from there (its sys.path does not hold the folder)."""
    spec = experiments.load_spec(own_project / "own.toml")
    task = GroupTask(plan(spec)[1], Workload.of(spec), None)
    assert task.workload.folders == (str(own_project.resolve()),)
    (tmp_path / "task.pkl").write_bytes(pickle.dumps(task))
    code = ("import pickle, sys\n"
            f"assert not any('project' in p for p in sys.path), sys.path\n"
            "from experiments.run.runner import run_group\n"
            f"rec = run_group(pickle.load(open({str(tmp_path / 'task.pkl')!r}, 'rb')))\n"
            "print(rec.status, rec.steps_to_result, rec.error)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    here = run_group(task)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["done", str(here.steps_to_result), "None"]


# (what replaces a line of the spec or is added to mymodels.py, what the one line says)
BAD = [
    (('"mymodels:mlp"', '"nomodule:mlp"'), "workload.model: nomodule:mlp: no module named "
                                           "'nomodule' on sys.path or "),
    (('"mymodels:mlp"', '"mymodels:nothing"'), "has no attribute 'nothing'"),
    (('"mymodels:mlp"', '"mymodels:WIDTH"'), "mymodels:WIDTH is int 16, not callable"),
    (('"mymodels:mlp"', '"mymodels:"'), "workload.model: 'mymodels:' is not an import path"),
    (('"mymodels:mlp"', '":mlp"'), "workload.model: ':mlp' is not an import path"),
    (('"mymodels:mlp"', '"mymodels.mlp"'), "(did you mean 'mymodels:mlp'?)"),
    (('model = "mymodels:mlp"', 'model = "mymodels:mlp"\nmodel_options = {hidden = -1}'),
     "workload.model: mymodels:mlp raised RuntimeError: Trying to create tensor with negative "
     "dimension"),
    (('"mymodels:mlp"', '"mymodels:listed"'),
     "workload.model: mymodels:listed returned builtins.list; allowed: a torch.nn.Module"),
    (('"mymodels:blobs"', '"mymodels:broken"'),
     "workload.dataset: mymodels:broken raised ValueError: no such file: blobs.npz"),
    (('"mymodels:blobs"', '"mymodels:mlp"'),
     "workload.dataset: mymodels:mlp raised TypeError: mlp() missing 1 required positional "
     "argument: 'dataset'"),
    (('"mymodels:blobs"', '"mymodels:nested"'),
     "workload.dataset: mymodels:nested returned builtins.dict; allowed: a training.Dataset"),
]
EXTRA = '''

def listed(dataset):
    return [1, 2]


def broken():
    raise ValueError("no such file:\\n  blobs.npz")


def nested():
    return {"x": 1}
'''


def bad_project(folder, old_new):
    (folder / "mymodels.py").write_text((folder / "mymodels.py").read_text() + EXTRA)
    text = OWN.replace(*old_new)
    assert text != OWN
    (folder / "own.toml").write_text(text)


@pytest.mark.parametrize("old_new,line", BAD, ids=[b[0][1].split(":")[-1].strip('"\n')
                                                    for b in BAD])
def test_bad_factory_via_the_cli_is_one_line_and_writes_nothing(old_new, line, own_project,
                                                                capsys):
    bad_project(own_project, old_new)
    out = own_project / "run"
    assert study(own_project, out) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: workload."), captured.err
    assert line in lines[0]
    assert "Traceback" not in captured.err and captured.out == ""
    assert not out.exists()


@pytest.mark.parametrize("old_new,line", BAD[::2], ids=[b[0][1].split(":")[-1].strip('"\n')
                                                        for b in BAD[::2]])
def test_bad_factory_via_the_api_raises_one_line_and_writes_nothing(old_new, line, own_project):
    bad_project(own_project, old_new)
    out = own_project / "run"
    with pytest.raises(training.SparsescaleError) as info:
        experiments.run_study(own_project / "own.toml", out=out, quiet=True, report=False)
    exc = info.value
    message = exc.problems if isinstance(exc, experiments.SpecError) else [str(exc)]
    assert len(message) == 1 and "\n" not in message[0] and line in message[0]
    assert not out.exists()


def test_a_factory_given_as_a_callable(own_project, monkeypatch):
    monkeypatch.syspath_prepend(own_project)   # as a notebook beside the module has it
    import mymodels

    by_path = experiments.load_spec(own_project / "own.toml")
    given = experiments.load_spec(own_project / "own.toml", model=mymodels.mlp,
                                  dataset=mymodels.blobs)
    assert (given.model, given.dataset) == ("mymodels:mlp", "mymodels:blobs")
    assert given.hash == by_path.hash   # the callable is recorded by its import path
    assert experiments.load_spec(own_project / "own.toml", model="mlp").digests.keys() == {
        "dataset"}
    with pytest.raises(experiments.SpecError, match="a lambda has no name"):
        experiments.load_spec(own_project / "own.toml", model=lambda dataset: None)


def test_a_local_function_runs_only_in_this_process(own_project):
    def small(dataset, hidden=4):
        return torch.nn.Sequential(torch.nn.Linear(6, hidden), torch.nn.ReLU(),
                                   torch.nn.Linear(hidden, 3))

    spec = experiments.load_spec(own_project / "own.toml", model=small)
    assert spec.model.endswith(".<locals>.small")
    with pytest.raises(FactoryError, match="worker processes import a factory by its path"):
        experiments.run_study(spec, out=own_project / "pool", quiet=True, report=False)
    assert not (own_project / "pool").exists()
    run_dir = experiments.run_study(spec, out=own_project / "threads", quiet=True,
                                    report=False, executor=ThreadPoolExecutor(1))
    res = experiments.load_results(run_dir)
    assert set(res.groups.status) == {"done"}
    assert res.spec.model == spec.model and res.spec.digests == spec.digests


def test_a_file_edited_after_this_process_imported_it_is_refused(own_project):
    experiments.load_spec(own_project / "own.toml")
    (own_project / "mymodels.py").write_text(
        (own_project / "mymodels.py").read_text().replace("WIDTH = 16", "WIDTH = 12"))
    with pytest.raises(experiments.SpecError, match=r"changed since this process imported "
                                                    r"mymodels .*importlib.reload\(mymodels\)"):
        experiments.load_spec(own_project / "own.toml")



@pytest.mark.parametrize("layer, line", [
    ("torch.nn.Linear(6, 7)", "study: model outputs [1, 7] for one example but the data set has "
                              "3 classes: the last layer must have 3 outputs"),
    ("torch.nn.LazyLinear(3)", "error: LazyLinear has uninitialized (lazy) parameters"),
])
def test_a_factory_model_the_data_cannot_train_is_refused_before_anything_is_written(
        own_project, capsys, layer, line):
    """The driver builds the model once and checks it (one example's forward pass, after the
    modules no program can train): one line, exit 2, and no run folder."""
    (own_project / "mymodels.py").write_text(
        (own_project / "mymodels.py").read_text()
        + f"\n\ndef wrong(dataset, **options):\n    return {layer}\n")
    (own_project / "own.toml").write_text(OWN.replace('"mymodels:mlp"', '"mymodels:wrong"'))
    out = own_project / "run"
    assert study(own_project, out) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and line in lines[0], lines
    assert not out.exists()
