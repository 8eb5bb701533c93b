"""A study whose pruning criterion is the user's own, registered in a module beside its spec and
named there by import path: the same store from the process pool and from Dask, keyed by the
module's source."""

import hashlib
import json
import sys
import textwrap

import pytest

import experiments
import pruning
import training
from experiments.cli import main as cli
from pruning.registry import CRITERIA

from ..conftest import OWN, forget_imports, own_project_in
from .test_runner import assert_same_store

MYCRITERIA = textwrap.dedent('''\
    """A pruning criterion of the user's own."""
    import torch

    import pruning


    @pruning.register("gradient_magnitude", needs=("dataset",), per_class=8)
    def gradient_magnitude(model, params, context):
        """|dL/dw| on the scoring batch: the weights with the largest gradients are kept."""
        x, y = context.batch(model)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        grads = torch.autograd.grad(loss, list(params.values()))
        return {k: g.abs() for k, g in zip(params, grads)}
    ''')

def project(folder):
    """``folder`` holding the user's project (``mymodels.py``, ``own.toml``) with a criterion of
    their own beside it, ``mycriteria.py``, named by the spec; this process forgets the modules
    (a fresh process would not have them)."""
    with own_project_in(folder):
        pass
    (folder / "mycriteria.py").write_text(MYCRITERIA)
    (folder / "own.toml").write_text(OWN.replace("sparsities = [0.0]", "sparsities = [0.0, 0.6]")
                                     + '\n[pruning]\ncriterion = "mycriteria:gradient_magnitude"\n')
    forget()
    return folder


def forget():
    """What a fresh process would see: the modules not imported, the criterion not registered."""
    forget_imports(("mymodels", "mycriteria"))
    for name, entry in CRITERIA.items():
        if entry.score.__module__ == "mycriteria":
            CRITERIA.remove(name)


def study(folder, out, *options):
    return cli.main(["study", str(folder / "own.toml"), "--out", str(out), "--quiet",
                     "--no-report", "--workers", "1", *options])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The study run by the command line with the spawned process pool."""
    folder = project(tmp_path_factory.mktemp("criterion"))
    path = list(sys.path)
    try:
        assert study(folder, folder / "pool") == 0
    finally:
        forget()
        sys.path[:] = path
    return folder


@pytest.mark.slow
def test_pool_and_dask_give_the_same_store(runs):
    """A local Dask cluster's workers import the criterion from the spec's folder as the pool's
    do: the stores are equal, cell for cell."""
    pytest.importorskip("distributed")
    path = list(sys.path)
    try:
        assert study(runs, runs / "dask", "--dask", "local") == 0
    finally:
        forget()
        sys.path[:] = path
    assert_same_store(runs / "pool", runs / "dask")


def test_the_store_names_the_criterion_and_its_source(runs):
    res = experiments.load_results(runs / "pool")
    digest = hashlib.sha256((runs / "mycriteria.py").read_bytes()).hexdigest()
    table = json.loads(res.study.spec_json.iloc[0])["pruning"]
    assert table == {"method": "mycriteria:gradient_magnitude", "method_digest": digest}
    assert res.spec.criterion_digests == {"mycriteria:gradient_magnitude": digest}
    assert set(res.groups.status) == {"done"} and len(res.groups) == 4
    sparse = res.groups[res.groups.sparsity > 0]
    assert all(json.loads(c)["pruning"]["method_digest"] == digest for c in sparse.config_json)


def test_the_masks_are_the_criterions_own(runs, tmp_path):
    """The mask a sparse group trained is ``pruning.prune`` with the user's criterion on the
    seed's initialization, recorded under the criterion's import path."""
    recorded = json.loads((runs / "pool" / "masks.json").read_text())["masks"]
    assert [(m["sparsity"], m["info"]["criterion"], m["info"]["per_class"]) for m in recorded] == [
        (0.6, "mycriteria:gradient_magnitude", 8)]
    path = list(sys.path)
    try:
        sys.path.append(str(runs))
        import mymodels

        ds = mymodels.blobs()
        with training.models.seeded(0):
            net = mymodels.mlp(ds)
        mask = pruning.prune(net, "mycriteria:gradient_magnitude", 0.6, dataset=ds, seed=0)
        assert mask.info["criterion"] == "mycriteria:gradient_magnitude"
        assert abs(mask.sparsity() - 0.6) < 1e-2
        assert "gradient_magnitude" in pruning.list_criteria()   # registered by the import
    finally:
        forget()
        sys.path[:] = path


def test_an_edit_of_the_criterion_makes_its_groups_new(runs, capsys):
    folder = project(runs / "edit")
    (folder / "mycriteria.py").write_text(MYCRITERIA.replace("kept.", "kept (edited)."))
    path = list(sys.path)
    try:
        assert study(folder, runs / "pool", "--dry-run") == 0
    finally:
        forget()
        sys.path[:] = path
    out = capsys.readouterr().out
    assert "pruning criterion mycriteria:gradient_magnitude: source sha256" in out
    assert "differ in pruning.method_digest" in out
