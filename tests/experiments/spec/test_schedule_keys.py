"""The spec keys of L at Lee et al.'s stage and of the trial rules: one line per problem naming
the key, in the hash (and group keys) only when set, and back from a store's canonical JSON."""

import json

import pytest

from experiments.spec.plan import plan
from experiments.spec.study import SpecError, from_canonical, loads

from ..conftest import TINY

STAGE = TINY.replace("enabled = false", "enabled = true\nlipschitz_every = 1000")


def edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


@pytest.mark.parametrize("text, key, word", [
    (edit(STAGE, "lipschitz_every = 1000", "lipschitz_every = 0"), "probes.lipschitz_every",
     "integer >= 1"),
    (edit(TINY, "enabled = false", "lipschitz_trials = 2"), "probes.lipschitz_trials",
     "only used with probes.lipschitz_every"),
    (edit(STAGE, "lipschitz_every = 1000", "lipschitz_every = 1000\nlipschitz_examples = 1"),
     "probes.lipschitz_examples", "integer >= 2"),
    (edit(STAGE, "lipschitz_every = 1000", "lipschitz_every = 1000\nlipschitz_trials = 3"),
     "probes.lipschitz_trials", 'stop = "all"'),
    (edit(STAGE, "lipschitz_every = 1000", "lipschitz_every = 1000\nlipschitz_trials = 5")
     .replace("seeds = [0]", 'seeds = [0]\nstop = "all"'), "probes.lipschitz_trials",
     "in [1, 4]"),
    (edit(STAGE, "lipschitz_every = 1000",
          "lipschitz_every = 1000\nlipschitz_examples = 100\nlipschitz_check = [0.3]"),
     "probes.lipschitz_check", "the study's sparsities (0, 0.5)"),
    (edit(STAGE, "lipschitz_every = 1000", "lipschitz_every = 1000\nlipschitz_check = [0.0]"),
     "probes.lipschitz_check", "whole split already"),
    (edit(STAGE, "lipschitz_every = 1000", "lipschitz_every = 1000\nlipschitz_start = 0"),
     "probes.lipschitz_start", "an integer >= 1"),
    (edit(TINY, "enabled = false", "enabled = true\nlipschitz_start = 1000"),
     "probes.lipschitz_start", "only used with probes.lipschitz_every"),
    (edit(STAGE, "lipschitz_every = 1000", "lipschitz_evry = 1000"), "probes.lipschitz_evry",
     "did you mean 'lipschitz_every'"),
    (edit(TINY, "seeds = [0]", 'seeds = [0]\nstop = "al"'), "stop", "did you mean 'all'"),
    (edit(TINY, "seeds = [0]", "seeds = [0]\ncomplete_trials = 1"), "complete_trials",
     "true or false"),
])
def test_a_bad_key_is_one_line_naming_it(text, key, word):
    with pytest.raises(SpecError) as err:
        loads(text)
    line = next(p for p in err.value.problems if p.startswith(f"{key}:"))
    assert word in line, line


FULL = (edit(STAGE, "lipschitz_every = 1000",
             "lipschitz_every = 1000\nlipschitz_start = 2000\nlipschitz_examples = 8000\n"
             "lipschitz_trials = 3\n"
             "lipschitz_check = [0.5, 0.0]")
        .replace("seeds = [0]", 'seeds = [0]\nstop = "all"\ncomplete_trials = true'))


def test_set_keys_enter_the_hash_and_come_back_from_a_store():
    base, full = loads(TINY.replace("enabled = false", "enabled = true")), loads(FULL)
    assert full.probes.lipschitz_every == 1000 and full.probes.lipschitz_check == (0.0, 0.5)
    assert (full.stop, full.complete_trials) == ("all", True)
    c = full.canonical()
    assert {k: c["probes"][k] for k in c["probes"] if k.startswith("lipschitz")} == {
        "lipschitz_every": 1000, "lipschitz_start": 2000, "lipschitz_examples": 8000,
        "lipschitz_trials": 3,
        "lipschitz_check": [0.0, 0.5]}
    assert (c["stop"], c["complete_trials"]) == ("all", True)
    # unset: nothing of them in the canonical JSON, so earlier hashes stand
    assert "lipschitz" not in base.to_json() and '"stop"' not in base.to_json()
    assert "complete_trials" not in base.to_json()
    back = from_canonical(json.loads(full.to_json()), full.toml)
    assert back == full and back.hash == full.hash


def test_the_trial_rules_change_group_keys_and_the_probe_schedule_does_not():
    keys = lambda text: [g.key for g in plan(loads(text))]   # noqa: E731
    base = keys(TINY)
    assert keys(STAGE.replace("enabled = true", "enabled = false")) == base
    assert set(keys(edit(TINY, "seeds = [0]", 'seeds = [0]\nstop = "all"'))).isdisjoint(base)
    complete = plan(loads(edit(TINY, "seeds = [0]", "seeds = [0]\ncomplete_trials = true")))
    assert set(g.key for g in complete).isdisjoint(base)
    # the reserve continues the same Sobol sequence: the first points are unchanged
    first = plan(loads(TINY))[0]
    assert complete[0].trials == first.trials and len(complete[0].reserve) == len(first.trials)
    assert first.reserve == ()
