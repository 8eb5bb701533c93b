"""Golden spec hashes: the canonical JSON and hash of every bundled config, and the key of one
group of the quickstart plan, pinned in ``golden/``.

A spec's hash is what a run folder's store is checked against, and a group's key is what a
rerun skips; a change that moves either makes every existing run folder refuse the study, or
redo its groups. The rule (see :mod:`experiments.spec.study`): a new spec key's default must
leave existing hashes unchanged (omit the key from the canonical JSON when it has its default),
and a change that moves a hash must update the golden files in the same commit and say why.

The golden values equal what the code gave before the package reorganization (commit aaf4ad0).
To write them again after a deliberate change::

    python tests/experiments/spec/test_golden_hashes.py
"""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
HASHES = GOLDEN / "hashes.json"
GROUP = GOLDEN / "quickstart_group.json"
# the pinned group: a pruned level (its config holds the pruning table too), the smallest batch
GROUP_CELL = {"sparsity": 0.9, "batch_size": 8, "seed": 0}

RULE = ("A spec's canonical JSON or hash moved. Existing run folders would refuse this study "
        "(spec hash) or redo its groups (group keys). The rule (experiments/spec/study.py): a "
        "new spec key's default must leave existing hashes unchanged (omit the key from the "
        "canonical JSON when it has its default), and a change that moves a hash must update "
        "the golden files in the same commit and say why (write them with `python "
        "tests/experiments/spec/test_golden_hashes.py`).")


def configs() -> list[str]:
    from experiments.spec.study import list_configs

    return list_configs()


def current() -> dict:
    """What the code gives now: per config its canonical JSON, hash and its variants' hashes;
    the pinned group's key and canonical config."""
    from experiments.spec.plan import plan
    from experiments.spec.study import load, resolve_config

    specs = {name: load(resolve_config(name)) for name in configs()}
    [group] = [g for g in plan(specs["quickstart"])
               if (g.sparsity, g.batch_size, g.seed) == tuple(GROUP_CELL.values())]
    return {
        "canonical": {name: spec.to_json() for name, spec in specs.items()},
        "hashes": {name: {"hash": spec.hash,
                          "variants": {v.name: v.hash for v in spec.variants()}}
                   for name, spec in specs.items()},
        "group": {**GROUP_CELL, "key": group.key, "config_json": group.config_json},
    }


def write_golden() -> None:
    now = current()
    GOLDEN.mkdir(exist_ok=True)
    for name, text in now["canonical"].items():
        (GOLDEN / f"{name}.json").write_text(text + "\n")
    HASHES.write_text(json.dumps(now["hashes"], indent=1, sort_keys=True) + "\n")
    GROUP.write_text(json.dumps(now["group"], indent=1) + "\n")


def diff(golden: str, now: str) -> str:
    """The two canonical texts as an indented diff (a compact line says little)."""
    def pretty(text):
        return json.dumps(json.loads(text), indent=1, sort_keys=True).splitlines()

    return "\n".join(difflib.unified_diff(pretty(golden), pretty(now), "golden", "now",
                                          lineterm=""))


@pytest.fixture(scope="module")
def now():
    return current()


def test_every_bundled_config_has_golden_files():
    pinned = sorted(p.stem for p in GOLDEN.glob("*.json")
                    if p not in (HASHES, GROUP))
    assert pinned == configs(), (
        "every bundled config needs its golden canonical JSON and hash: " + RULE)
    assert sorted(json.loads(HASHES.read_text())) == configs(), RULE


@pytest.mark.parametrize("name", configs())
def test_canonical_json_is_pinned(now, name):
    golden = (GOLDEN / f"{name}.json").read_text().rstrip("\n")
    assert now["canonical"][name] == golden, (
        f"{name}: canonical JSON differs from golden/{name}.json:\n"
        f"{diff(golden, now['canonical'][name])}\n{RULE}")


@pytest.mark.parametrize("name", configs())
def test_hash_is_pinned(now, name):
    golden = json.loads(HASHES.read_text())[name]
    assert now["hashes"][name] == golden, f"{name}: spec hash moved. {RULE}"


def test_quickstart_group_key_is_pinned(now):
    golden = json.loads(GROUP.read_text())
    assert now["group"]["config_json"] == golden["config_json"], (
        f"the quickstart group {GROUP_CELL} has another canonical config:\n"
        f"{diff(golden['config_json'], now['group']['config_json'])}\n{RULE}")
    assert now["group"] == golden, f"the quickstart group {GROUP_CELL}'s key moved. {RULE}"


if __name__ == "__main__":   # write the golden files (after a deliberate, explained change)
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    write_golden()
    print(f"golden files written to {GOLDEN}")
