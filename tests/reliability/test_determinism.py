"""Determinism and provenance: the same spec gives the same store whatever the executor and the
order groups finish in, and the store records what was run and with what."""

import hashlib
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import torch

import experiments
import training
from experiments.spec.plan import plan
from experiments.store.schema import VOLATILE
from experiments.store.database import lib_version

from .conftest import SPEC, edit

# four groups, so two threads finish them in a different order than one thread
FOUR = edit("batch_sizes = [8, 32]", "batch_sizes = [4, 8, 16, 32]")


def test_same_spec_gives_the_same_store_whatever_the_executor(tmp_path):
    path = tmp_path / "four.toml"
    path.write_text(FOUR)
    runs = [experiments.run_study(path, out=tmp_path / f"run{n}", executor=ThreadPoolExecutor(n),
                                  quiet=True, report=False) for n in (1, 2)]
    a, b = (experiments.load_results(r) for r in runs)
    for table in ("study", "groups", "trials", "curves", "probes"):
        drop = list(VOLATILE.get(table, ()))
        pd.testing.assert_frame_equal(getattr(a, table).drop(columns=drop),
                                      getattr(b, table).drop(columns=drop), check_exact=True,
                                      obj=table)
    assert len(a.groups) == 4 and len(a.trials) == 4 * 2


def test_store_records_the_spec_versions_and_group_configs(tmp_path, spec_file):
    run_dir = experiments.run_study(spec_file, out=tmp_path / "run", executor=ThreadPoolExecutor(1),
                                    quiet=True, report=False)
    res = experiments.load_results(run_dir)
    study = res.study.iloc[0]
    spec = experiments.load_spec(spec_file)
    assert study.spec_toml == SPEC                       # the file exactly as written
    assert study.spec_hash == spec.hash == hashlib.sha256(study.spec_json.encode()).hexdigest()
    assert (study.lib_version, study.torch_version) == (lib_version(), str(torch.__version__))
    assert study.python_version == sys.version.split()[0]
    keys = {p.key: p for p in plan(spec)}
    for g in res.groups.itertuples():
        # a group's key is the hash of everything that determines its results
        assert hashlib.sha256(g.config_json.encode()).hexdigest()[:20] == g.key
        cfg = json.loads(g.config_json)
        assert (cfg["batch_size"], cfg["sparsity"], cfg["seed"]) == (g.batch_size, g.sparsity,
                                                                     g.seed)
        assert cfg["trials"] == list(keys[g.key].trials)
        assert g.status == "done" and pd.isna(g.error)
        assert (g.lib_version, g.torch_version) == (study.lib_version, study.torch_version)


def test_models_built_by_concurrent_threads_get_their_own_seeds_weights():
    # training.models.build seeds torch's process-wide RNG; groups run by threads must not mix
    ds = training.data.load("teacher", n=50, dim=40, num_classes=3, hidden=8)

    def weights(seed):
        net = training.models.build("mlp", ds, seed=seed, hidden=[256, 256])
        return torch.cat([p.detach().flatten() for p in net.parameters()])

    seeds = list(range(24))
    serial = [weights(s) for s in seeds]
    with ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(weights, seeds))
    assert all(torch.equal(a, b) for a, b in zip(serial, threaded))
