"""Pruning series in study specs: validation, variants, masks of every sanity check, a tiny run."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

import experiments
import pruning
import training
from experiments.spec.series import REINIT_SEED_OFFSET, SANITY, load_masks, series_mask
from experiments.spec.study import SpecError, from_canonical, loads

from ..conftest import TINY

pytestmark = pytest.mark.filterwarnings("ignore::pruning.LayerCollapseWarning")


def with_pruning(lines: str, text: str = TINY) -> str:
    return text.replace("[goal]", f"[pruning]\n{lines}\n\n[goal]")


def problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as err:
        loads(text)
    return err.value.problems


def test_a_single_criterion_list_is_the_plain_spec():
    plain = loads(with_pruning('criterion = "snip"'))
    assert loads(with_pruning('criterion = ["snip"]\nsanity = []')).hash == plain.hash
    assert plain.variants() == [plain]


def test_variants_one_per_series_dense_only_in_the_first():
    spec = loads(with_pruning('criterion = ["snip", "force"]\nsanity = ["shuffle", "reinit"]'))
    got = [(v.name, v.subdir, v.sparsities, v.canonical()["pruning"]) for v in spec.variants()]
    assert got == [
        ("tiny-snip", "snip", (0.0, 0.5), {"method": "snip"}),
        ("tiny-snip-shuffle", "snip-shuffle", (0.5,), {"method": "snip", "sanity": "shuffle"}),
        ("tiny-snip-reinit", "snip-reinit", (0.5,), {"method": "snip", "sanity": "reinit"}),
        ("tiny-force", "force", (0.5,), {"method": "force"}),
        ("tiny-force-shuffle", "force-shuffle", (0.5,), {"method": "force", "sanity": "shuffle"}),
        ("tiny-force-reinit", "force-reinit", (0.5,), {"method": "force", "sanity": "reinit"})]
    assert len({v.hash for v in spec.variants()}) == 6
    for v in spec.variants():   # a store's spec comes back with its series (experiments.store.database)
        back = from_canonical(v.canonical())
        assert (back.hash, back.series, back.pruning_sanity) == (v.hash, v.series, v.pruning_sanity)
    both = loads(with_pruning('sanity = ["invert"]', TINY.replace(
        'optimizer = "momentum"', 'optimizer = ["sgd", "momentum"]')))
    assert [(v.subdir, v.sparsities) for v in both.variants()] == [
        ("sgd/snip", (0.0, 0.5)), ("sgd/snip-invert", (0.5,)),
        ("momentum/snip", (0.0, 0.5)), ("momentum/snip-invert", (0.5,))]


def test_bad_pruning_tables_name_the_key():
    assert problems(with_pruning('criterion = ["snip", "snp"]')) == [
        "pruning.criterion[1]: found 'snp' (did you mean 'snip'?); allowed: "
        + ", ".join(pruning.list_criteria()) + ', or a criterion "package.module:function"']
    assert problems(with_pruning("criterion = []"))[0].startswith(
        "pruning.criterion: found []; allowed: a name or a non-empty list of random, magnitude")
    assert problems(with_pruning('sanity = ["shufle"]')) == [
        "pruning.sanity[0]: found 'shufle' (did you mean 'shuffle'?); allowed: "
        + ", ".join(SANITY)]
    assert problems(with_pruning('sanity = "shuffle"')) == [
        "pruning.sanity: found 'shuffle'; allowed: a list of " + ", ".join(SANITY)]
    assert problems(with_pruning('sanity = ["invert", "invert"]')) == [
        "pruning.sanity: found duplicates in ['invert', 'invert']; allowed: distinct values"]
    assert problems(with_pruning('sanity = ["invert"]', TINY.replace(
        "sparsities = [0.0, 0.5]", "sparsities = [0.0]"))) == [
        "pruning: a list of criteria or sanity checks needs a sparsity level > 0; allowed: add "
        "one to sparsities"]
    assert problems(with_pruning('scope = "layer"'))[0].startswith("pruning.scope: unknown key")


@pytest.fixture(scope="module")
def teacher():
    return training.data.load("teacher", n=600, dim=8, num_classes=3, hidden=16)


def test_series_masks_equal_the_direct_pruning_calls(teacher):
    def build(seed):
        return training.models.build("mlp", teacher, seed=seed, hidden=[16])

    direct = pruning.prune(build(3), "snip", 0.8, dataset=teacher, seed=3)
    expected = {
        None: direct,
        "shuffle": pruning.shuffle_layers(direct, 3),
        "matched_random": pruning.matched_random(direct, 3),
        "invert": pruning.prune(build(3), "snip", 0.8, dataset=teacher, seed=3, keep="lowest"),
        "reinit": pruning.prune(build(3 + REINIT_SEED_OFFSET), "snip", 0.8, dataset=teacher, seed=3),
    }
    for check, mask in expected.items():
        got = series_mask("snip", check, 0.8, 3, teacher, build)
        assert got == mask and got.kept() == direct.kept(), check
        assert [got.kept(k) for k in got] == [direct.kept(k) for k in direct] \
            or check in ("invert", "reinit")
    assert expected["reinit"] != direct and expected["invert"] != direct
    with pytest.raises(pruning.PruningError, match="unknown sanity check 'flip'; allowed: shuffle"):
        series_mask("snip", "flip", 0.8, 3, teacher, build)


def test_tiny_sanity_study_runs_every_series(tmp_path):
    toml = tmp_path / "sanity.toml"
    toml.write_text(with_pruning('sanity = ["shuffle", "reinit"]',
                                 TINY.replace("batch_sizes = [8, 32, 128]", "batch_sizes = [32, 128]")))
    out = experiments.run_study(toml, out=tmp_path / "run", quiet=True, report=True,
                                executor=ThreadPoolExecutor(1))
    runs = {s: experiments.load_results(out / s) for s in ("snip", "snip-shuffle", "snip-reinit")}
    assert sorted(set(runs["snip"].groups.sparsity)) == [0.0, 0.5]
    assert set(runs["snip-shuffle"].groups.sparsity) == {0.5} == set(runs["snip-reinit"].groups.sparsity)
    masks = load_masks(out / "snip-shuffle")
    assert [(m["sparsity"], m["seed"], m["series"]) for m in masks] == [(0.5, 0, "snip-shuffle")]
    assert masks[0]["info"]["transform"] == "shuffle" and masks[0]["diagnosis"]["chain"]
    reinit = json.loads((out / "snip-reinit" / "masks.json").read_text())["masks"][0]
    assert reinit["info"]["mask_init_seed"] == REINIT_SEED_OFFSET
    md = (out / "report.md").read_text()
    assert "### Sanity checks: each series beside its criterion" in md
    assert "Figure 8. Per-layer density of the masks" in md and (out / "figures" /
                                                                 "fig8_layer_density.png").exists()
    assert "snip-shuffle (momentum), 0.5" not in md   # series are labelled "<series> (<optimizer>)"
    assert "snip-shuffle (momentum), 50 % sparse" in md


def test_bundled_sanity_config():
    spec = experiments.load_spec("pruning_sanity_mnist1d")
    variants = spec.variants()
    assert [(v.series, v.sparsities) for v in variants] == [
        ("snip", (0.0, 0.9)), ("snip-shuffle", (0.9,)), ("snip-matched_random", (0.9,)),
        ("snip-reinit", (0.9,))]
    assert spec.batch_sizes == tuple(2 ** k for k in range(3, 13)) and spec.model == "mlp"
    assert spec.dataset == "mnist1d"
