"""Golden store digests: what the bundled studies measure, pinned as one SHA-256 per study
(:mod:`experiments.scripts.store_digest`) in ``golden_digests.json``. A change that moves no
computation (a refactor) must leave them equal: the same numbers before and after.

The digests are float32 results, so they hold on the machine they were measured on (torch's
version and the CPU instruction set, ``store_digest.machine``); elsewhere the slow tests skip
with that reason. Check a run folder by hand::

    sparsescale study lee_theory_mnist1d --workers 1 --no-report --out runs/lt
    python -m experiments.scripts.store_digest \
        --golden tests/experiments/store/golden_digests.json runs/lt
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from experiments.scripts import store_digest
from experiments.spec.study import load, resolve_config

GOLDEN_FILE = Path(__file__).with_name("golden_digests.json")
GOLDEN = json.loads(GOLDEN_FILE.read_text())


@pytest.mark.parametrize("name", sorted(GOLDEN["studies"]))
def test_each_digest_is_pinned_for_the_bundled_spec_of_today(name):
    # a spec change makes the digest not comparable: it shows here, on any CPU, not months later
    assert load(resolve_config(name)).hash == GOLDEN["studies"][name]["spec_hash"], (
        f"{name}'s spec moved: measure its store again and pin its digest and spec hash")


def _store(folder: Path, name: str, spec_hash: str, steps: int) -> Path:
    folder.mkdir()
    conn = sqlite3.connect(folder / "results.sqlite")
    conn.execute("CREATE TABLE study (id INTEGER PRIMARY KEY, name TEXT, spec_hash TEXT, "
                 "created TEXT)")
    conn.execute("INSERT INTO study VALUES (1, ?, ?, 'today')", (name, spec_hash))
    conn.execute("CREATE TABLE groups (batch_size INTEGER, steps INTEGER)")
    conn.execute("INSERT INTO groups VALUES (8, ?)", (steps,))
    conn.commit()
    conn.close()
    return folder


def test_compare_tells_equal_differs_and_not_comparable_apart(tmp_path, monkeypatch, capsys):
    here = {"torch": "9.9", "cpu_capability": "X", "python": "3.11.0"}
    monkeypatch.setattr(store_digest, "machine", lambda: dict(here))
    pinned = _store(tmp_path / "pinned", "toy", "h1", steps=120)
    golden = {"machine": here,
              "studies": {"toy": {"digest": store_digest.digest(pinned), "spec_hash": "h1"}}}
    assert store_digest.compare(pinned, golden) == "equal"
    moved = _store(tmp_path / "moved", "toy", "h1", steps=121)
    assert store_digest.compare(moved, golden).startswith("DIFFERS")
    other_spec = _store(tmp_path / "spec", "toy", "h2", steps=120)
    assert "spec changed" in store_digest.compare(other_spec, golden)
    unknown = _store(tmp_path / "unknown", "other", "h1", steps=120)
    assert "no golden digest for study 'other'" in store_digest.compare(unknown, golden)
    elsewhere = {**golden, "machine": {**here, "cpu_capability": "Y"}}
    assert store_digest.compare(pinned, elsewhere).startswith("not comparable: pinned on")

    path = tmp_path / "golden.json"
    path.write_text(json.dumps(golden))
    assert store_digest.main(["--golden", str(path), str(pinned)]) == 0
    assert store_digest.main(["--golden", str(path), str(pinned), str(moved)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"equal  {pinned}" and out[2].startswith("DIFFERS")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(GOLDEN["studies"]))
def test_bundled_study_measures_its_golden_digest(name, tmp_path):
    if GOLDEN["machine"] != store_digest.machine():
        pytest.skip(f"golden digests pinned on {GOLDEN['machine']}, this machine is "
                    f"{store_digest.machine()}")
    from experiments.cli import main as cli

    out = tmp_path / name
    assert cli.main(["study", name, "--workers", "1", "--no-report", "--quiet",
                     "--out", str(out)]) == 0
    assert store_digest.compare(out, GOLDEN) == "equal"
