"""The gradient-delay axis of a study spec: ``delays`` / ``workers`` and ``delay_kind``
validated with one line per problem, hashes and group keys unchanged without the axis, one
group per (level, B, delay, seed) with the delay in every trial."""

import json

import pytest

from experiments.spec.errors import SpecError
from experiments.spec.plan import format_plan, plan
from experiments.spec.study import from_canonical, loads

BASE = """
name = "d"
batch_sizes = [8, 32]
sparsities = [0.0, 0.9]
trials = 3
seeds = [0, 1]
[workload]
dataset = "mnist1d"
model = "mlp"
[goal]
metric = "error"
target = 0.5
[search]
lr = {scale = "log", min = 0.01, max = 1.0}
[budget]
max_steps = 50
[probes]
enabled = false
"""


def spec(extra: str = ""):
    return loads(extra + BASE)


def problems(extra: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        spec(extra)
    return info.value.problems


def test_no_axis_and_delays_0_leave_the_hash_and_every_group_key_unchanged():
    plain = spec()
    for extra in ("delays = [0]\n", "delays = [0]\ndelay_kind = \"uniform\"\n", "workers = [1]\n"):
        s = spec(extra)
        assert s.hash == plain.hash and s.delays == (0,)
        assert [g.key for g in plan(s)] == [g.key for g in plan(plain)]
    assert "delays" not in plain.canonical()


def test_a_delay_axis_plans_a_group_per_level_batch_delay_and_seed():
    s = spec("delays = [0, 2, 1]\n")
    assert s.delays == (0, 1, 2) and s.hash != spec().hash
    groups = plan(s)
    assert len(groups) == 2 * 2 * 3 * 2
    assert [(g.sparsity, g.batch_size, g.delay, g.seed) for g in groups[:6]] == [
        (0.0, 8, 0, 0), (0.0, 8, 0, 1), (0.0, 8, 1, 0), (0.0, 8, 1, 1), (0.0, 8, 2, 0),
        (0.0, 8, 2, 1)]
    sync = {(g.sparsity, g.batch_size, g.seed): g.key for g in plan(spec())}
    for g in groups:
        # every trial carries the group's delay; the same metaparameter points at every delay,
        # so the learning rate is tuned per (B, tau) as per B
        assert all(t.get("delay", 0) == g.delay for t in g.trials)
        base = [{k: v for k, v in t.items() if k != "delay"} for t in g.trials]
        assert base == [dict(t) for t in next(
            p for p in groups if (p.sparsity, p.batch_size, p.seed, p.delay)
            == (g.sparsity, g.batch_size, g.seed, 0)).trials]
        # delay 0's groups are the groups of the study without the axis
        assert (g.key == sync[(g.sparsity, g.batch_size, g.seed)]) == (g.delay == 0)
    assert len({g.key for g in groups}) == len(groups)
    text = format_plan(s, groups)
    assert "3 delays (fixed)" in text and " delay " in text.splitlines()[2]


def test_workers_give_round_robin_delays_and_uniform_its_kind():
    s = spec("workers = [1, 2, 5]\n")
    assert (s.delays, s.delay_kind) == ((0, 1, 4), "round_robin")
    late = [g for g in plan(s) if g.delay == 4][0]
    assert late.trials[0]["workers"] == 5 and late.trials[0]["delay_kind"] == "round_robin"
    u = spec("delays = [0, 3]\ndelay_kind = \"uniform\"\n")
    assert [g for g in plan(u) if g.delay][0].trials[0]["delay_kind"] == "uniform"
    assert u.hash != spec("delays = [0, 3]\n").hash


@pytest.mark.parametrize("extra", ["delays = [0, 4]\n", "workers = [1, 3]\n",
                                   "delays = [0, 2]\ndelay_kind = \"uniform\"\n"])
def test_the_stored_spec_round_trips(extra):
    s = spec(extra)
    back = from_canonical(json.loads(s.to_json()), s.toml)
    assert (back.hash, back.delays, back.delay_kind) == (s.hash, s.delays, s.delay_kind)


@pytest.mark.parametrize("extra, expected", [
    ("delay = [0, 1]\n", "delay: unknown key (did you mean 'delays'?)"),
    ("delays = [1, 2]\n", "delays: found [1, 2]; allowed: a list holding 0"),
    ("delays = [0, -1]\n", "delays[1]: found -1; allowed: an integer in [0, 1024]"),
    ("delays = [0, 2, 2]\n", "delays: found duplicates in [0, 2, 2]"),
    ("delays = 4\n", "delays: found 4; allowed: a non-empty list of delays"),
    ("workers = 4\n", "workers: found 4; allowed: a non-empty list of round-robin worker"),
    ("workers = [0, 1]\n", "workers[0]: found 0; allowed: an integer in [1, 1024]"),
    ("delays = [0, 1]\nworkers = [1, 2]\n", "workers: given with delays"),
    ("delays = [0, 1]\ndelay_kind = \"uniformm\"\n",
     "delay_kind: found 'uniformm' (did you mean 'uniform'?)"),
    ("delays = [0, 1]\ndelay_kind = \"round_robin\"\n", "delay_kind: found 'round_robin' with delays"),
    ("workers = [1, 2]\ndelay_kind = \"fixed\"\n", "delay_kind: found 'fixed' with workers"),
    ("delay_kind = \"fixed\"\n", "delay_kind: given without delays or workers"),
])
def test_bad_delay_keys_fail_with_one_line_naming_the_key(extra, expected):
    found = problems(extra)
    assert len(found) == 1 and found[0].startswith(expected), found
