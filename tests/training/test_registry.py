"""The one registry helper (training.registry): duplicates refused in one line, the same
definition again replacing its entry, unknown names answered with "did you mean", each kind's
own error class; and the four registries that use it."""

import pytest

import pruning
import training
from training.data import DATASETS
from training.engine.programs import PROGRAMS
from training.errors import ConfigError, DataError, ModelError
from training.models import MODELS
from training.registry import Registry, did_you_mean, origin
from pruning import PruningError


class Oops(ValueError):
    pass


def first(x):
    return 1


def second(x):
    return 2


def test_add_get_names_in_order_or_sorted():
    reg = Registry("thing", Oops)
    reg.add("zeta", first)
    reg.add("alpha", second)
    assert reg.names() == ["zeta", "alpha"] and list(reg) == ["zeta", "alpha"]
    assert reg.get("alpha") is second and "zeta" in reg and "beta" not in reg and len(reg) == 2
    assert Registry("thing", Oops, sort=True).names() == []
    s = Registry("thing", Oops, sort=True)
    s.add("zeta", first)
    s.add("alpha", second)
    assert s.names() == ["alpha", "zeta"] and s.items() == [("alpha", second), ("zeta", first)]


def test_a_duplicate_name_is_refused_in_one_line_naming_the_first_definition():
    reg = Registry("thing", Oops)
    reg.register("f")(first)
    with pytest.raises(Oops) as err:
        reg.register("f")(second)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("thing 'f' is already registered by ")
    assert message.split(" by ")[1].startswith(origin(first)) and "test_registry.py:first" in message
    assert reg.get("f") is first


def test_the_same_definition_again_replaces_its_entry():
    reg = Registry("thing", Oops)
    reg.add("f", first)
    reg.add("f", first)
    assert reg.get("f") is first and len(reg) == 1


def test_notebook_cells_run_again_are_one_origin():
    code = compile("def f(x):\n    return x\n", "<ipython-input-3-abc>", "exec")
    again = compile("def f(x):\n    return x + 1\n", "<ipython-input-4-def>", "exec")
    one, two = {}, {}
    exec(code, one)
    exec(again, two)
    reg = Registry("thing", Oops)
    reg.add("f", one["f"])
    reg.add("f", two["f"])
    assert reg.get("f") is two["f"]


def test_unknown_names_get_did_you_mean_and_the_names_allowed():
    reg = Registry("thing", Oops, sort=True, hint='"module:function"')
    reg.add("magnitude", first)
    reg.add("snip", second)
    with pytest.raises(Oops, match=r"^unknown thing 'snp' \(did you mean 'snip'\?\); "
                                   r"allowed: magnitude, snip, or \"module:function\"$"):
        reg.get("snp")
    with pytest.raises(Oops, match=r"^unknown thing 'zzz'; allowed: magnitude, snip"):
        reg.remove("zzz")
    assert did_you_mean("mlpp", ["mlp", "cnn1d"]) == " (did you mean 'mlp'?)"
    assert did_you_mean("xyz", ["mlp"]) == ""
    with pytest.raises(Oops, match="non-empty string"):
        reg.add("", first)


def test_remove_and_preserved():
    reg = Registry("thing", Oops)
    reg.add("f", first)
    with reg.preserved():
        reg.remove("f")
        reg.add("f", second)
        reg.add("g", second)
    assert reg.items() == [("f", first)]
    assert reg.remove("f") is first and len(reg) == 0


@pytest.mark.parametrize("registry, error, name, near", [
    (MODELS, ModelError, "mpl", "mlp"),
    (DATASETS, DataError, "mnist1", "mnist1d"),
    (PROGRAMS, ConfigError, "fusde", "fused"),
    (pruning.CRITERIA, PruningError, "magnitud", "magnitude"),
])
def test_every_named_kind_uses_the_helper(registry, error, name, near):
    assert isinstance(registry, Registry)
    with pytest.raises(error, match=rf"unknown .*{name!r} \(did you mean {near!r}\?\)"):
        registry.get(name)
    with registry.preserved():
        registry.add("own_entry_for_test", first)
        with pytest.raises(error, match="'own_entry_for_test' is already registered by"):
            registry.add("own_entry_for_test", second)
    assert "own_entry_for_test" not in registry


def test_the_public_entry_points_answer_through_the_registry():
    with pytest.raises(ModelError, match=r"unknown model 'mpl' \(did you mean 'mlp'\?\)"):
        training.models.build("mpl", training.data.load("teacher"))
    with pytest.raises(DataError, match=r"unknown data set 'techer' \(did you mean 'teacher'\?\)"):
        training.data.load("techer")
    with MODELS.preserved():
        training.models.register("mlp_twice_for_test")(first)
        with pytest.raises(ModelError, match="already registered"):
            training.models.register("mlp_twice_for_test")(second)
