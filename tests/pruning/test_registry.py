"""The registry of pruning criteria: a researcher's criterion registered by name or named by
import path, its rules (what it needs, the scopes it allows, its rounds) applied as the built-in
criteria's are."""

import sys
import textwrap

import pytest
import torch

import pruning
from pruning import PruningError
from pruning.registry import CRITERIA, criterion


@pytest.fixture
def registered():
    """Registers criteria in a test, and forgets them after it."""
    with CRITERIA.preserved():
        yield pruning.register


def test_the_built_in_criteria_are_registered_in_order():
    assert pruning.list_criteria() == ["random", "magnitude", "snip", "grasp", "synflow", "imp",
                                       "iterative_snip", "force"]
    rules = {name: (c.needs, c.rounds, c.per_class, c.revives)
             for name, c in ((n, criterion(n)) for n in pruning.list_criteria())}
    assert rules["synflow"] == (("input_shape",), 100, None, False)
    assert rules["force"] == (("dataset",), 10, 10, True)
    assert rules["imp"] == (("dataset|train_fn",), 5, None, False)


def test_a_registered_criterion_prunes_by_its_name(registered, teacher, small_mlp):
    seen = []

    @registered("first_layers", needs=("dataset",), per_class=3)
    def first_layers(model, params, context):
        seen.append((len(params), context.per_class, len(context.batch(model)[0])))
        return {k: torch.full_like(p, -i, dtype=torch.float64)
                for i, (k, p) in enumerate(params.items())}

    assert "first_layers" in pruning.list_criteria()
    with pytest.warns(pruning.LayerCollapseWarning, match="'3.weight' is 100 % pruned"):
        mask = pruning.prune(small_mlp, "first_layers", 0.6, dataset=teacher)
    assert seen == [(3, 3, 12)]    # 3 weight matrices; 3 examples of each of the 4 classes
    # keeps the earliest layers first, exactly round(N * 0.4) weights
    sizes = [p.numel() for k, p in small_mlp.named_parameters() if k.endswith("weight")]
    assert mask.kept() == round(sum(sizes) * 0.4)
    assert mask.info["criterion"] == "first_layers" and mask.info["per_class"] == 3
    assert first_layers is not None   # the decorator returns the function itself


def test_rules_are_enforced(registered, teacher, small_mlp):
    registered("layerwise", scopes=("layer",), needs=("dataset",), rounds=3)(
        lambda model, params, context: {k: p.detach().abs() for k, p in params.items()})
    with pytest.raises(PruningError, match="'layerwise' needs dataset=training.Dataset"):
        pruning.prune(small_mlp, "layerwise", 0.5, scope="layer")
    with pytest.raises(PruningError, match="'layerwise' allows scope layer; got 'global'"):
        pruning.prune(small_mlp, "layerwise", 0.5, dataset=teacher)
    mask = pruning.prune(small_mlp, "layerwise", 0.5, dataset=teacher, scope="layer")
    assert mask.info["rounds"] == 3 and mask.info["scope"] == "layer"


def test_bad_registrations_are_refused(registered):
    def score(model, params, context):
        return {}

    with pytest.raises(PruningError, match="already registered by"):
        registered("snip")(score)
    with pytest.raises(PruningError, match="must be a Python identifier"):
        registered("my criterion")
    with pytest.raises(PruningError, match="scopes \\['all'\\]; allowed: a non-empty subset"):
        registered("x", scopes=("all",))
    with pytest.raises(PruningError, match="needs 'data'; allowed: dataset, input_shape"):
        registered("x", needs=("data",))


def test_a_criterion_by_import_path(tmp_path, teacher, small_mlp, monkeypatch):
    """A plain score function in a module is a criterion with the default rules; a registered
    one keeps its rules; either is recorded by its path."""
    (tmp_path / "owncrit.py").write_text(textwrap.dedent('''\
        import pruning

        def plain(model, params, context):
            return {k: p.detach().abs() for k, p in params.items()}

        @pruning.register("own_registered", rounds=2)
        def registered(model, params, context):
            return {k: -p.detach().abs() for k, p in params.items()}
        '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        plain = pruning.prune(small_mlp, "owncrit:plain", 0.5, dataset=teacher)
        assert plain.info["criterion"] == "owncrit:plain" and plain.info["rounds"] == 1
        magnitude = pruning.prune(small_mlp, "magnitude", 0.5, dataset=teacher)
        assert all(torch.equal(plain[k], magnitude[k]) for k in plain)
        own = pruning.prune(small_mlp, "owncrit:registered", 0.5, dataset=teacher)
        assert own.info["criterion"] == "owncrit:registered" and own.info["rounds"] == 2
        with pytest.raises(PruningError, match="owncrit has no attribute 'missing'"):
            pruning.prune(small_mlp, "owncrit:missing", 0.5)
        with pytest.raises(PruningError, match="cannot import nosuchmodule"):
            pruning.prune(small_mlp, "nosuchmodule:f", 0.5)
    finally:
        for name in ("own_registered",):
            if name in CRITERIA:
                CRITERIA.remove(name)
        sys.modules.pop("owncrit", None)


def test_the_old_names_of_criterion_are_deprecated_aliases(teacher, small_mlp):
    """``method=`` (before 2026-12) is ``criterion=`` with a DeprecationWarning naming it, as is
    ``pruning.list_methods``; a mask saved with ``info["method"]`` loads as ``criterion``."""
    new = pruning.prune(small_mlp, criterion="magnitude", sparsity=0.5)
    with pytest.warns(DeprecationWarning, match="'method' is deprecated, use 'criterion'"):
        old = pruning.prune(small_mlp, method="magnitude", sparsity=0.5)
    assert old == new and old.info == new.info
    with pytest.warns(DeprecationWarning, match="'method' is deprecated, use 'criterion'"):
        [level] = pruning.prune_levels(small_mlp, method="snip", sparsities=[0.5], dataset=teacher)
    assert level == pruning.prune(small_mlp, "snip", 0.5, dataset=teacher)
    with pytest.raises(TypeError, match="give 'criterion' only"):
        pruning.prune(small_mlp, criterion="snip", method="snip", sparsity=0.5)
    with pytest.warns(DeprecationWarning, match="'list_methods' is deprecated, use 'list_criteria'"):
        assert pruning.list_methods() == pruning.list_criteria()
    with pytest.raises(AttributeError, match="no attribute 'list_method'"):
        pruning.list_method


def test_a_mask_saved_before_the_rename_loads_its_criterion(tmp_path, small_mlp):
    mask = pruning.prune(small_mlp, "magnitude", 0.5)
    torch.save({"entries": {k: v.bool() for k, v in mask.items()},
                "info": {"method": "magnitude", "sparsity": 0.5}},
               tmp_path / "old.pt")
    back = pruning.Mask.load(tmp_path / "old.pt")
    assert back == mask and back.info == {"criterion": "magnitude", "sparsity": 0.5}
