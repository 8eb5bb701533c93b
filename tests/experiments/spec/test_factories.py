"""Factories by import path: where the module is found, what the digest covers, and a stored
spec read back without importing anything."""

import hashlib
import json
import sys

import pytest

from experiments.spec import factories
from experiments.spec.study import SpecError, from_canonical, load, loads

from ..conftest import OWN, forget_imports


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_digest_is_the_named_module_files_bytes(own_project):
    spec = load(own_project / "own.toml")
    assert spec.digests == {"model": sha256(own_project / "mymodels.py"),
                            "dataset": sha256(own_project / "mymodels.py")}
    assert json.loads(spec.to_json())["workload"]["model_digest"] == spec.digests["model"]


def test_a_package_module_is_keyed_by_its_own_file(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))   # the spec's folder is appended to it
    pkg = tmp_path / "ownpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("VERSION = 1\n")
    (pkg / "nets.py").write_text("from torch import nn\n\n\ndef net(dataset):\n"
                                 "    return nn.Linear(6, 3)\n")
    (tmp_path / "pkg.toml").write_text(OWN.replace('"mymodels:mlp"', '"ownpkg.nets:net"')
                                       .replace('"mymodels:blobs"', '"teacher"'))
    try:
        spec = load(tmp_path / "pkg.toml")
        assert spec.digests == {"model": sha256(pkg / "nets.py")}   # not __init__.py
        forget_imports(("ownpkg", "ownpkg.nets"))
        (pkg / "__init__.py").write_text("VERSION = 2\n")
        assert load(tmp_path / "pkg.toml").hash == spec.hash
        forget_imports(("ownpkg", "ownpkg.nets"))
        (pkg / "nets.py").write_text((pkg / "nets.py").read_text() + "# bigger\n")
        assert load(tmp_path / "pkg.toml").hash != spec.hash
    finally:
        forget_imports(("ownpkg", "ownpkg.nets"))


def test_sys_path_comes_before_the_spec_folder(own_project, tmp_path, monkeypatch):
    installed = tmp_path / "site"
    installed.mkdir()
    (installed / "mymodels.py").write_text((own_project / "mymodels.py").read_text()
                                           + "# the installed copy\n")
    monkeypatch.syspath_prepend(installed)
    spec = load(own_project / "own.toml")
    assert spec.digests["model"] == sha256(installed / "mymodels.py")


def test_a_spec_without_a_file_searches_sys_path_only(own_project):
    with pytest.raises(SpecError) as info:
        loads((own_project / "own.toml").read_text())
    assert info.value.problems == [
        "workload.dataset: mymodels:blobs: no module named 'mymodels' on sys.path",
        "workload.model: mymodels:mlp: no module named 'mymodels' on sys.path"]


def test_a_second_module_of_the_same_name_in_one_process_is_refused(own_project, tmp_path):
    load(own_project / "own.toml")
    other = tmp_path / "other"
    other.mkdir()
    (other / "mymodels.py").write_text((own_project / "mymodels.py").read_text())
    (other / "own.toml").write_text(OWN)
    with pytest.raises(SpecError, match="already imported a module 'mymodels' from "):
        load(other / "own.toml")


def test_a_stored_spec_is_read_back_without_importing(own_project):
    spec = load(own_project / "own.toml")
    forget_imports()
    (own_project / "mymodels.py").unlink()   # the report of a store needs no model code
    again = from_canonical(spec.canonical())
    assert again.hash == spec.hash and again.digests == spec.digests
    bad = spec.canonical()
    bad["workload"]["model_digest"] = "abc"
    with pytest.raises(SpecError, match="workload.model_digest: found 'abc'; allowed: the 64 hex"):
        from_canonical(bad)


@pytest.mark.parametrize("path", ["mymodels:", ":mlp", "my models:mlp", "a:b:c", "a..b:c",
                                  "mymodels:mlp.", "x.<locals>:f"])
def test_malformed_paths(path):
    with pytest.raises(factories.FactoryError, match=r"is not an import path; allowed"):
        factories.split("model", path)
