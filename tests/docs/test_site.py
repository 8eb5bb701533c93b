"""The documentation site builds with warnings as errors (``mkdocs build --strict``, as
``make docs``): a broken link or anchor, a page missing from the navigation or a navigation
entry without a page fails it. The API reference of the four packages and the guide are in the
built site."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
pytest.importorskip("material", reason="the docs extra is not installed")
pytest.importorskip("mkdocstrings", reason="the docs extra is not installed")
yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ["install", "studies", "spec", "reports", "data-models", "training", "adam", "pruning",
         "theory", "branching", "ddp", "exchange", "own-model"]
# one public name per package whose API entry must be rendered
API = {
    "training": ["training.trials.train_trials", "training.config.RunConfig",
                 "training.models.registry.register", "training.data.registry.register",
                 "training.data.dataset.Dataset.from_tensors", "training.data.dataset.Dataset.from_torch"],
    "pruning": ["pruning.apply.prune", "pruning.mask.Mask"],
    "theory": ["theory.models.scaling.fit_scaling", "theory.estimators.noise.gradient_noise"],
    "experiments": ["experiments.run.runner.run_study", "experiments.store.results.load_results",
                    "experiments.spec.study.Spec", "experiments.report.write.write_report",
                    "experiments.spec.factories.FactoryError"],
}


def build(config: Path, site: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d",
         str(site)], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})


def test_site_builds_strict_with_every_page(tmp_path):
    site = tmp_path / "site"
    proc = build(ROOT / "mkdocs.yml", site, ROOT)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    for page in GUIDE:
        assert (site / "guide" / page / "index.html").is_file(), page
    for page in ("architecture", "protocols", "guarantees", "benchmarks/log", "design/strategy",
                 "design/compiled-kernel", "design/measured-choices"):
        assert (site / page / "index.html").is_file(), page
    for package, names in API.items():
        html = (site / "reference" / package / "index.html").read_text()
        for name in names:
            assert f'id="{name}"' in html, f"{name} is missing from the {package} API page"


def test_broken_links_and_missing_pages_fail_the_build(tmp_path):
    """The project's ``validation`` settings turn a broken link, a missing anchor, a page left out
    of the navigation and a navigation entry without a page into errors under --strict."""
    validation = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["validation"]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](gone.md) and [nowhere](#nowhere)\n")
    (docs / "orphan.md").write_text("# Not in the nav\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(yaml.safe_dump({
        "site_name": "t", "docs_dir": str(docs), "validation": validation,
        "nav": [{"Home": "index.md"}, {"Missing": "missing.md"}]}))
    proc = build(config, tmp_path / "site", tmp_path)
    assert proc.returncode != 0
    log = proc.stdout + proc.stderr
    for words in ("gone.md", "nowhere", "orphan.md", "missing.md"):
        assert words in log, f"no warning names {words!r}:\n{log}"
    shutil.rmtree(tmp_path / "site", ignore_errors=True)
