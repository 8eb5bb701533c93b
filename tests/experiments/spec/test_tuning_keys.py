"""Issue 47's spec keys: ``[tuning]`` (search, then repeat the best point), ``[pruning]
bias_controls`` (the bias control's sub-studies) and ``[probes] lipschitz_until`` (one window of
L in every run): one line per problem naming the key (with "did you mean"), in the hash only
when present, back from a store's canonical JSON, and the plan and variants they make."""

import json
from dataclasses import replace

import pytest

from experiments.spec.plan import PENDING, plan
from experiments.spec.study import SpecError, from_canonical, loads

from ..conftest import TINY

TUNED = (TINY.replace("seeds = [0]", 'seeds = [0]\nstop = "all"')
         + "\n[tuning]\npoints = 3\nseed = 7\n")
LEE = (TINY.replace("seeds = [0]", 'seeds = [0]\nstop = "all"')
       .replace("[search]", "[pruning]\nprune_biases = true\nmask_per_trial = true\n"
                            'bias_controls = ["no_bias", "dense_biases"]\n\n[search]'))
UNTIL = TINY.replace("enabled = false", "enabled = true\nlipschitz_every = 5\n"
                                        "lipschitz_start = 10\nlipschitz_until = 40")


def problems(text):
    with pytest.raises(SpecError) as err:
        loads(text)
    return err.value.problems


@pytest.mark.parametrize("text, key, word", [
    (TUNED.replace("points = 3", "pionts = 3"), "tuning.pionts", "did you mean 'points'"),
    (TUNED.replace("points = 3", "points = 0"), "tuning.points", "an integer >= 1"),
    (TUNED.replace("seed = 7", "seed = 0"), "tuning.seed", "not in seeds"),
    (TUNED.replace("seed = 7\n", ""), "tuning.seed", "missing"),
    (LEE.replace('"dense_biases"]', '"dense_bias"]'), "pruning.bias_controls[1]",
     "did you mean 'dense_biases'"),
    (LEE.replace("prune_biases = true", "prune_biases = false"), "pruning.bias_controls",
     "needs prune_biases = true"),
    (LEE.replace("sparsities = [0.0, 0.5]", "sparsities = [0.5]"), "pruning.bias_controls",
     "the dense level 0"),
    (UNTIL.replace("lipschitz_until = 40", "lipschitz_until = 9"), "probes.lipschitz_until",
     "an integer >= 10"),
    (UNTIL.replace("lipschitz_every = 5\n", ""), "probes.lipschitz_until",
     "only used with probes.lipschitz_every"),
])
def test_bad_keys_name_the_key(text, key, word):
    lines = [p for p in problems(text) if p.startswith(f"{key}:")]
    assert lines and word in lines[0], problems(text)


@pytest.mark.parametrize("text, table", [(TUNED, '"tuning"'), (LEE, '"bias_controls"'),
                                         (UNTIL, '"lipschitz_until"')])
def test_in_the_hash_only_when_set_and_back_from_a_store(text, table):
    spec = loads(text)
    assert table in spec.to_json() and table not in loads(TINY).to_json()
    back = from_canonical(json.loads(spec.to_json()), spec.toml)
    assert back == spec and back.hash == spec.hash


def test_a_tuned_plan_repeats_each_cells_best_point():
    """Before the search: placeholder points (never a stored key); after it, each cell's own
    point, ``trials`` times, in the group's key."""
    spec = loads(TUNED)
    assert all(g.trials == (PENDING,) * 4 for g in plan(spec))
    point = {"lr": 0.1, "momentum": 0.9, "decay_steps": None, "end_factor": 1.0}
    tuned = {(s, b): {**point, "lr": 0.01 * b * (1 + s)} for s in (0.0, 0.5)
             for b in (8, 32, 128)}
    groups = plan(replace(spec, tuned=tuned))
    for g in groups:
        assert g.trials == (tuned[(g.sparsity, g.batch_size)],) * 4
    assert len({g.key for g in groups}) == len(groups)


def test_bias_controls_make_two_paired_sub_studies():
    """The study without the key, the dense network without biases, the sparse levels with
    their biases kept: the same seeds, trials and search (so trial i pairs across them)."""
    spec = loads(LEE)
    main, bare, kept = spec.variants()
    assert (main.subdir, bare.subdir, kept.subdir) == ("", "no_bias", "dense_biases")
    assert main.pruning_options.bias_controls == () and main.sparsities == (0.0, 0.5)
    assert bare.model_options == {"hidden": [16], "bias": False} and bare.sparsities == (0.0,)
    assert kept.sparsities == (0.5,) and not kept.pruning_options.prune_biases
    assert {(v.seeds, v.trials, v.search_seed) for v in (main, bare, kept)} == {((0,), 4, 0)}
    assert [v.variants() for v in (main, bare, kept)] == [[main], [bare], [kept]]
