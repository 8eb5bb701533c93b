"""Lee et al. (2021)'s protocol as spec keys: ``[workload] init`` and ``[pruning] examples,
prune_biases, mask_per_trial``. Left out or at their defaults they leave every hash and group
key as it was; set, they are in the spec hash and in the keys of the groups they change."""

import pytest

from experiments.spec.plan import plan
from experiments.spec.tables.pruning import PruningOptions
from experiments.spec.study import SpecError, from_canonical, loads

from ..conftest import TINY

LEE = {"workload": 'init = "lee"', "pruning": 'examples = "all"\nprune_biases = true\n'
                                              'mask_per_trial = true'}


def with_keys(workload: str = "", pruning: str = "") -> str:
    text = TINY.replace('model_options = {hidden = [16]}\n',
                        f'model_options = {{hidden = [16]}}\n{workload}\n')
    return text.replace("[goal]", f'[pruning]\ncriterion = "snip"\n{pruning}\n\n[goal]')


def keys(spec) -> dict[tuple[float, int], str]:
    return {(g.sparsity, g.batch_size): g.key for g in plan(spec)}


def test_defaults_written_out_keep_the_hash_and_the_group_keys():
    base = loads(with_keys())
    explicit = loads(with_keys('init = "torch"', "prune_biases = false\nmask_per_trial = false"))
    assert explicit.hash == base.hash and keys(explicit) == keys(base)
    assert explicit.init == "torch" and explicit.pruning_options == PruningOptions()
    assert "init" not in base.canonical()["workload"]
    assert base.canonical()["pruning"] == {"method": "snip"}


def test_lee_keys_are_in_the_hash_and_survive_the_store():
    spec = loads(with_keys(LEE["workload"], LEE["pruning"]))
    c = spec.canonical()
    assert c["workload"]["init"] == "lee"
    assert c["pruning"] == {"method": "snip", "examples": "all", "prune_biases": True,
                            "mask_per_trial": True}
    back = from_canonical(c)
    assert back.hash == spec.hash and back.init == "lee"
    assert back.pruning_options == PruningOptions("all", True, True)


@pytest.mark.parametrize("workload, pruning, dense_changes", [
    ('init = "lee"', "", True),                 # every network starts elsewhere
    ("", 'examples = "all"', False),            # only the masks change
    ("", "prune_biases = true", False),
    ("", "mask_per_trial = true", True),        # dense trials get their own inits too
])
def test_each_key_moves_the_groups_it_changes(workload, pruning, dense_changes):
    base, spec = loads(with_keys()), loads(with_keys(workload, pruning))
    assert spec.hash != base.hash
    old, new = keys(base), keys(spec)
    for (sparsity, b), key in new.items():
        assert (key != old[(sparsity, b)]) == (sparsity > 0 or dense_changes), (sparsity, b)


@pytest.mark.parametrize("workload, pruning, criterion, problem", [
    ('init = "tf"', "", "snip", "workload.init: found 'tf'; allowed: torch, lee"),
    ('init = "le"', "", "snip", "workload.init: found 'le' (did you mean 'lee'?); allowed: "
                                "torch, lee"),
    ("", 'examples = "al"', "snip", "pruning.examples: found 'al' (did you mean 'all'?); "
                                    "allowed: 'all' (the whole training split, in chunks of "
                                    "100), or leave it out (the criterion's own batch)"),
    ("", 'examples = "all"', "magnitude", "pruning.examples: 'all' does not apply to criterion "
                                          "'magnitude'; allowed with: snip, iterative_snip, "
                                          "force"),
    ("", 'prune_biases = "yes"', "snip", "pruning.prune_biases: found 'yes'; allowed: true or "
                                         "false"),
    ("", "mask_per_trial = 1", "snip", "pruning.mask_per_trial: found 1; allowed: true or false"),
    ("", "prune_bias = true", "snip", "pruning.prune_bias: unknown key (did you mean "
                                      "'prune_biases'?); allowed: criterion, sanity, examples, "
                                      "prune_biases, mask_per_trial, bias_controls"),
])
def test_bad_values_are_one_line_naming_the_key_and_what_is_allowed(workload, pruning, criterion,
                                                                     problem):
    text = with_keys(workload, pruning).replace('criterion = "snip"', f'criterion = "{criterion}"')
    with pytest.raises(SpecError) as err:
        loads(text)
    assert err.value.problems == [problem]


def test_the_plan_names_the_protocol_only_when_set():
    from experiments.spec.plan import format_plan

    lee = loads(with_keys(LEE["workload"], LEE["pruning"]))
    lines = format_plan(lee, plan(lee)).splitlines()
    assert lines[1:3] == ["init lee", "pruning snip: examples = 'all', prune_biases = true, "
                                      "mask_per_trial = true"]
    base = loads(with_keys())
    assert not any(line.startswith(("init", "pruning")) for line in
                   format_plan(base, plan(base)).splitlines())


def test_a_model_by_import_path_gets_lees_initialization(own_project):
    """The user's factory (Linear, LayerNorm, Linear) through the workload: weights by their
    fan-in's rule, LayerNorm weight one, every bias zero; ``init = "torch"`` leaves it as the
    factory made it."""
    import torch

    from experiments.run.workload import Workload
    from experiments.spec.study import load
    from training.models.initialization import TF_TRUNCATED_STD

    text = (own_project / "own.toml").read_text()
    (own_project / "lee.toml").write_text(text.replace('model = "mymodels:mlp"',
                                                      'model = "mymodels:mlp"\ninit = "lee"'))
    lee, torch_spec = load(own_project / "lee.toml"), load(own_project / "own.toml")
    assert lee.init == "lee" and lee.digests == torch_spec.digests and lee.hash != torch_spec.hash
    w = Workload.of(lee)
    ds = w.load_dataset()
    net = w.build_model(ds, 0)
    params = {k: p.detach() for k, p in net.named_parameters()}
    for name, fan_in in (("0.weight", 6), ("3.weight", 16)):
        bound = 2 * (1 / fan_in) ** 0.5 / TF_TRUNCATED_STD
        assert float(params[name].abs().max()) <= bound * (1 + 1e-6)
    assert torch.equal(params["1.weight"], torch.ones(16))
    assert all(torch.count_nonzero(p) == 0 for k, p in params.items() if k.endswith("bias"))
    made = Workload.of(torch_spec).build_model(ds, 0)
    assert any(torch.count_nonzero(p) for k, p in made.named_parameters() if k == "0.bias")


def test_complete_trials_with_a_mask_per_trial_is_one_line():
    text = "complete_trials = true\n" + with_keys("", "mask_per_trial = true")
    with pytest.raises(SpecError, match="complete_trials: cannot be combined with "
                                        r"\[pruning\] mask_per_trial"):
        loads(text)


@pytest.mark.parametrize("control", ["no_bias", "dense_biases"])
def test_a_bias_control_checks_l_at_its_own_levels_and_survives_the_store(control):
    """A control's spec is read back from its store (validated again): the study's whole-split
    check of L at a level the control lacks would make it invalid there."""
    from experiments.spec.series import control_variants

    spec = loads(with_keys(LEE["workload"], LEE["pruning"] + f'\nbias_controls = ["{control}"]')
                 .replace("[probes]\nenabled = false", "[probes]\nenabled = true\n"
                          "lipschitz_every = 10\nlipschitz_examples = 20\n"
                          "lipschitz_check = [0.0, 0.5]"))
    variant = control_variants(spec)[1]
    assert variant.probes.lipschitz_check == tuple(variant.sparsities)
    back = from_canonical(variant.canonical(), variant.toml)
    assert back.hash == variant.hash
