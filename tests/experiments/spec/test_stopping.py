"""The ``[stopping]`` table: one line per problem naming the key (with "did you mean"), in the
hash only when present, back from a store's canonical JSON, and described for the report."""

import json

import pytest

from experiments.spec.plan import plan
from experiments.spec.study import SpecError, from_canonical, loads

from ..conftest import TINY

PAIRED = (TINY.replace("enabled = false", "enabled = true\nlipschitz_every = 1000")
          .replace("seeds = [0]", "seeds = [0, 1, 2, 3]"))
# a group-sequential rule looks after each round at L taken inside its runs
IN_RUN = PAIRED.replace("lipschitz_every = 1000",
                        'lipschitz_every = 1000\nlipschitz_in_run = true\nbatch_sizes = [8]')
SEQUENTIAL = IN_RUN + ('\n[stopping]\nrule = "group_sequential"\nsparsity = 0.5\nrounds = 2\n'
                       'boundary = "pocock"\nalpha = 0.05\n')
FIXED = PAIRED + '\n[stopping]\nrule = "fixed"\nsparsity = 0.5\npairs = 4\n'


def problems(text):
    with pytest.raises(SpecError) as err:
        loads(text)
    return err.value.problems


@pytest.mark.parametrize("old, new, key, word", [
    ('rule = "group_sequential"', 'rule = "group_sequentail"', "stopping.rule",
     "did you mean 'group_sequential'"),
    ('boundary = "pocock"', 'boundary = "pocok"', "stopping.boundary", "did you mean 'pocock'"),
    ("rounds = 2", "rouns = 2", "stopping.rouns", "did you mean 'rounds'"),
    ("rounds = 2", "rounds = 3", "stopping.rounds", "a divisor of the number of seeds"),
    ("sparsity = 0.5", "sparsity = 0.7", "stopping.sparsity", "the study's sparsities (0, 0.5)"),
    ("sparsity = 0.5", "sparsity = 0.0", "stopping.sparsity", "the reference too"),
    ("alpha = 0.05", "alpha = 0.6", "stopping.alpha", "(0.0, 0.5)"),
    ("rounds = 2", "rounds = 2\npairs = 4", "stopping.pairs", 'only used with rule = "fixed"'),
])
def test_bad_sequential_keys(old, new, key, word):
    lines = [p for p in problems(SEQUENTIAL.replace(old, new)) if p.startswith(f"{key}:")]
    assert lines and word in lines[0], lines


def test_bad_fixed_keys_and_a_study_without_pairs():
    line = problems(FIXED.replace("pairs = 4", "pairs = 5"))[0]
    assert line.startswith("stopping.pairs:") and "plans 4 pairs" in line
    line = problems(FIXED + "rounds = 2\n")[0]
    assert line.startswith("stopping.rounds:") and "only used with" in line
    unpaired = TINY + '\n[stopping]\nrule = "fixed"\nsparsity = 0.5\n'
    assert any(p.startswith("stopping:") and "lipschitz_every" in p for p in problems(unpaired))


@pytest.mark.parametrize("text, without", [(SEQUENTIAL, IN_RUN), (FIXED, PAIRED)])
def test_in_the_hash_when_set_and_back_from_a_store(text, without):
    spec, base = loads(text), loads(without)
    assert "stopping" not in base.to_json() and spec.hash != base.hash
    assert [g.key for g in plan(spec)] == [g.key for g in plan(base)]
    back = from_canonical(json.loads(spec.to_json()), spec.toml)
    assert back == spec and back.hash == spec.hash


def test_described():
    s = loads(SEQUENTIAL).stopping
    assert (s.rule, s.rounds, s.boundary, s.alpha, s.sparsity, s.reference, s.effect) == (
        "group_sequential", 2, "pocock", 0.05, 0.5, 0.0, 0.1)
    assert "2 looks with pocock boundaries" in s.describe()
    assert loads(FIXED).stopping.describe().startswith("fixed (4 pairs): one look")
