"""Spec validation: every problem reported at once, one line each naming the key."""

import subprocess
import sys

import pytest

from experiments.cli import main as cli
from experiments.spec.errors import SpecError
from experiments.spec.study import load, loads, resolve_config
from experiments.spec.tables.budget import Budget

from ..conftest import TINY


def edit(old: str, new: str) -> str:
    assert old in TINY, old
    return TINY.replace(old, new)


# (spec text, the key path the message must name, a word the message must contain)
BAD_SPECS = [
    (edit("trials = 4", "trails = 4"), "trails", "did you mean 'trials'"),
    (edit('optimizer = "momentum"', 'optimizer = "adagrad"'), "optimizer", "adamw"),
    (edit("[budget]", "beta1 = 0.8\n[budget]"), "search.beta1", "adam, adamw only"),
    (edit('optimizer = "momentum"', 'optimizer = "adam"').replace(
        "[budget]", 'beta2 = {scale = "reverse-log", min = 0.9, max = 1.0}\n[budget]'),
     "search.beta2.max", "[0.0, 1.0)"),
    (edit('optimizer = "momentum"', 'optimizer = "adamw"').replace("[budget]", "eps = 0\n[budget]"),
     "search.eps", "(0.0, inf]"),
    (edit("[budget]", "[search.optimizers.adamw]\nlr = 0.1\n[budget]"), "search.optimizers.adamw",
     "allowed: momentum"),
    (edit("target = 0.3", 'target = 0.3\ncomparison = "=="'), "goal.comparison", "<="),
    (edit("target = 0.3", ""), "goal.target", "missing"),
    (edit("batch_sizes = [8, 32, 128]", "batch_sizes = {min = 3, max = 64}"),
     "batch_sizes.min", "power of two"),
    (edit("batch_sizes = [8, 32, 128]", "batch_sizes = []"), "batch_sizes", "non-empty"),
    (edit("sparsities = [0.0, 0.5]", "sparsities = [0.0, 1.0]"), "sparsities[1]", "[0.0, 1.0)"),
    (edit("sparsities = [0.0, 0.5]", "sparsities = [0.5, 0.5]"), "sparsities", "duplicates"),
    (edit('scale = "log", min = 0.01', 'scale = "cubic", min = 0.01'), "search.lr.scale",
     "reverse-log"),
    (edit("min = 0.01, max = 1.0", "min = 1.0, max = 0.01"), "search.lr", "min <= max"),
    (edit("min = 0.01, max = 1.0", "min = 0.0, max = 1.0"), "search.lr.min", "allowed"),
    (edit("min = 0.5, max = 0.99", "min = 0.5, max = 1.5"), "search.momentum.max", "[0.0, 1.0)"),
    (edit("momentum = {", "momentm = {"), "search.momentm", "did you mean 'momentum'"),
    (edit("trials = 4", "trials = 0"), "trials", "in [1, 65536]"),
    (edit("trials = 4", "trials = 1_000_000_000_000"), "trials", "in [1, 65536]"),
    (edit("examples = 8000", "examples = 8000\nmax_steps = 10"), "budget", "one of them"),
    (edit("every = 10", "every = 0"), "eval.every", ">= 1"),
    (edit('dataset = "teacher"', 'dataset = "mnist2d"'), "workload.dataset", "mnist1d"),
    (edit('model = "mlp"', 'model = "resnet99"'), "workload.model", "resnet8"),
    (edit("enabled = false", 'enabled = "yes"'), "probes.enabled", "true or false"),
    (edit("[probes]", "[executor]\nworkers = 0\n[probes]"), "executor.workers", ">= 1"),
    (edit("seeds = [0]", "seeds = [-1]"), "seeds[0]", ">= 0"),
    (edit("enabled = false", "batch_sizes = [64]"), "probes.batch_sizes", "8, 32, 128"),
    (edit("enabled = false", "batch_sizes = [\"median\"]"), "probes.batch_sizes", "'b_crit'"),
    (edit('metric = "error"', 'metric = "accuracy"'), "goal.metric", "error, loss"),
    (edit("[workload]", "[workload]\ndata = 1"), "workload.data", "did you mean 'dataset'"),
    (TINY + "\n[pruning]\ncriterion = \"snipp\"\n", "pruning.criterion", "did you mean 'snip'"),
    (edit('name = "tiny"', 'name = "tiny'), "(toml)", "not valid TOML"),
    (TINY + "\n[branching]\nk_mx = 8\n", "branching.k_mx", "did you mean 'k_max'"),
    (TINY + "\n[branchng]\nenabled = true\n", "branchng", "did you mean 'branching'"),
    (TINY + "\n[branching]\nk_max = 12\n", "branching.k_max", "power of two"),
    (TINY + "\n[branching]\nseeds = 2\n", "branching.seeds", ">= 3"),
    (TINY + "\n[branching]\nbatch_size = 64\n", "branching.batch_size", "8, 32, 128"),
    (TINY + "\n[branching]\nmultipliers = [0.5, 2.0]\n", "branching.multipliers", "includes 1"),
    (TINY + "\n[branching]\neps = -0.1\n", "branching.eps", "[0, inf]"),
    (TINY + "\n[branching]\nwindow_fraction = 0\n", "branching.window_fraction", "(0, 1]"),
    (TINY + "\n[branching]\nenabled = 1\n", "branching.enabled", "true or false"),
    (TINY + "\n[branching]\nwindow = 64\nwindow_fraction = 0.2\n", "branching", "one of them"),
]


@pytest.mark.parametrize("text,key,word", BAD_SPECS, ids=[b[1] for b in BAD_SPECS])
def test_bad_spec_via_cli(text, key, word, tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    status = cli.main(["study", str(path), "--dry-run", "--out", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert status == 2
    lines = err.strip().splitlines()
    assert lines and all(line.startswith("error: ") for line in lines), err
    hit = [line for line in lines if line.startswith(f"error: {key}")]
    assert hit, f"no line names {key!r}: {err}"
    assert word in hit[0], hit[0]
    assert "Traceback" not in err and out == ""
    assert not (tmp_path / "run").exists()


def test_every_problem_is_reported_at_once():
    text = edit("trials = 4", "trials = -2").replace('optimizer = "momentum"', 'optimizer = "x"')
    text = text.replace("every = 10", "every = 0")
    with pytest.raises(SpecError) as info:
        loads(text)
    keys = sorted(p.split(":")[0] for p in info.value.problems)
    assert keys == ["eval.every", "optimizer", "trials"]


def test_batch_size_larger_than_training_set(tiny_toml, capsys):
    # teacher n=600 with val_fraction 0.2 leaves 480 training examples
    tiny_toml.write_text(TINY.replace("[8, 32, 128]", "[8, 1024]"))
    assert cli.main(["study", str(tiny_toml), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("error: batch_sizes: found 1024 > 480 (the training set size); "
                           "allowed: 1..480")


@pytest.mark.parametrize("text", [BAD_SPECS[0][0], BAD_SPECS[5][0]])
def test_bad_spec_subprocess(text, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "experiments.cli.main", "study", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert all(line.startswith("error: ") for line in proc.stderr.strip().splitlines())


def test_valid_spec_values(tiny_toml):
    spec = load(tiny_toml)
    assert spec.batch_sizes == (8, 32, 128) and spec.sparsities == (0.0, 0.5)
    assert spec.strict is True and spec.target == 0.3 and spec.optimizer == "momentum"
    assert spec.search["lr"].scale == "log" and spec.search["end_factor"].fixed
    assert spec.budget.steps(8) == 200 and spec.budget.steps(128) == 63
    assert spec.budget.steps(4096) == 20


def test_powers_of_two_range_and_lee_comparison():
    spec = loads(edit("batch_sizes = [8, 32, 128]", "batch_sizes = {min = 2, max = 32}")
                 .replace("target = 0.3", 'target = 0.3\ncomparison = "<="'))
    assert spec.batch_sizes == (2, 4, 8, 16, 32)
    assert spec.strict is False


def test_hash_ignores_formatting_but_not_values():
    a = loads(TINY)
    b = loads("# a comment\n" + TINY)
    c = loads(TINY.replace("target = 0.3", "target = 0.31"))
    assert a.hash == b.hash != c.hash


def test_optimizer_list_splits_into_variants():
    spec = loads(edit('optimizer = "momentum"', 'optimizer = ["sgd", "nesterov"]'))
    names = [(v.optimizer, v.name) for v in spec.variants()]
    assert names == [("sgd", "tiny-sgd"), ("nesterov", "tiny-nesterov")]
    assert len({v.hash for v in spec.variants()}) == 2


ADAM_LIST = edit('optimizer = "momentum"', 'optimizer = ["momentum", "adamw"]').replace(
    "[budget]", 'beta1 = {scale = "reverse-log", min = 0.8, max = 0.99}\nweight_decay = 0.01\n'
                '[search.optimizers.adamw]\nlr = {scale = "log", min = 1e-4, max = 1e-2}\n[budget]')


def test_each_optimizer_gets_its_own_search_space():
    """Adam-type variants drop momentum and take torch's defaults for unset Adam keys, the
    momentum variant drops the Adam keys; ``[search.optimizers.<name>]`` overrides one of them."""
    spec = loads(ADAM_LIST)
    momentum, adamw = spec.variants()
    assert set(momentum.search) == {"lr", "momentum", "end_factor"}
    assert momentum.search["lr"].max == 1.0 and momentum.search["momentum"].scale == "reverse-log"
    assert set(adamw.search) == {"lr", "end_factor", "beta1", "beta2", "eps", "weight_decay"}
    assert (adamw.search["lr"].min, adamw.search["lr"].max) == (1e-4, 1e-2)
    assert adamw.search["beta1"].scale == "reverse-log" and adamw.search["weight_decay"].min == 0.01
    assert (adamw.search["beta2"].min, adamw.search["eps"].min) == (0.999, 1e-8)
    assert momentum.search_overrides == adamw.search_overrides == {}
    # the momentum half is the momentum-only study: same hash, hence the same groups
    alone = loads(TINY)
    assert momentum.canonical() | {"name": "tiny"} == alone.canonical()
    assert "search_overrides" in spec.canonical() and "search_overrides" not in adamw.canonical()
    single = loads(edit('optimizer = "momentum"', 'optimizer = "adam"'))
    assert "momentum" not in single.search and single.search["beta2"].max == 0.999


def test_budget_rule():
    assert Budget(examples=1000, min=5, max=50).steps(8) == 50
    assert Budget(examples=1000, min=5, max=50).steps(64) == 16
    assert Budget(examples=1000, min=5, max=50).steps(1024) == 5
    assert Budget(max_steps=7).steps(3) == 7


def test_bundled_configs_validate():
    from experiments.spec.study import list_configs

    names = list_configs()
    assert {"quickstart", "shallue_mnist1d", "lee_sparsity_mnist1d"} <= set(names)
    for name in names:
        spec = load(resolve_config(name))
        assert spec.trials >= 1 and spec.batch_sizes


def test_every_shallue_config_counts_complete_trials():
    """Shallue et al. (2019) count the first N complete trials at each batch size: every bundled
    study of theirs sets complete_trials, so a diverged trial never counts toward ``trials``."""
    from experiments.spec.study import list_configs

    shallue = [name for name in list_configs() if name.startswith("shallue_")]
    assert len(shallue) >= 5
    assert [n for n in shallue if not load(resolve_config(n)).complete_trials] == []


def test_unknown_eval_key_is_one_problem_on_one_line(tiny_toml):
    import tomllib

    from experiments.spec.study import SpecError, validate

    raw = tomllib.loads(tiny_toml.read_text())
    raw["eval"]["\n"] = 1  # found by Hypothesis: it used to reach EvalSchedule(**...) as well
    with pytest.raises(SpecError) as info:
        validate(raw)
    assert info.value.problems == ['eval."\\n": unknown key; allowed: kind, every, first, ratio, max_gap']



# every optional table away from its default, a relative decay and a non-default pruning criterion
NON_DEFAULT = (edit("[budget]\nexamples = 8000\nmin = 20\nmax = 200", "[budget]\nmax_steps = 50")
               .replace("[eval]\nevery = 10",
                        '[eval]\nkind = "geometric"\nfirst = 2\nratio = 1.5\nmax_gap = 9')
               .replace("[probes]\nenabled = false", "[probes]\nbatch_sizes = [32, \"b_crit\"]\npoints = 3\n"
                                                                  "examples = 64\nlanczos = 5")
               .replace("[search]", '[search]\nseed = 3\nend_factor = {scale = "log", min = 1e-4, '
                        'max = 0.1}\ndecay_steps = {scale = "linear", min = 0.5, max = 1.0, '
                        'relative = true}')
               .replace("[goal]", '[pruning]\ncriterion = "magnitude"\n\n[goal]')
               .replace("target = 0.3", 'target = 0.3\ncomparison = "<="'))


def assert_round_trip(spec):
    """A store keeps ``spec.canonical()``; ``from_canonical`` validates it back into an equal
    Spec with the same hash (``workers`` is not stored)."""
    from dataclasses import replace

    from experiments.spec.study import from_canonical

    for variant in spec.variants():
        again = from_canonical(variant.canonical(), toml_text=variant.toml)
        assert again == replace(variant, workers=None)
        assert again.hash == variant.hash and again.toml == variant.toml


@pytest.mark.parametrize("text", [TINY, NON_DEFAULT,
                                  edit('optimizer = "momentum"', 'optimizer = ["sgd", "nesterov"]'),
                                  ADAM_LIST, edit('optimizer = "momentum"', 'optimizer = "adamw"')])
def test_canonical_form_gives_back_the_same_spec(text):
    spec = loads(text)
    assert_round_trip(spec)
    if text == NON_DEFAULT:   # the edits took: nothing fell back to a default
        assert (spec.budget.max_steps, spec.eval.kind, spec.probes.batch_sizes, spec.search_seed,
                spec.search["decay_steps"].relative, spec.pruning_criterion, spec.strict) == \
            (50, "geometric", (32, "b_crit"), 3, True, "magnitude", False)
        assert (spec.probes.points, spec.probes.examples, spec.probes.lanczos) == (3, 64, 5)


BRANCHING = TINY + ("\n[branching]\nenabled = true\nbatch_size = 32\ncheckpoints = 4\nk_max = 2\nwindow = 640\n"
                    "eps = 0.02\nseeds = 1\nmultipliers = [1, 3]\nlevel = 0.8\nwarmup = false\n"
                    "warmup_replicates = 5\nwarmup_examples = 9000\n")


def test_branching_table_is_read_hashed_and_round_trips():
    from experiments.spec.tables.branching import Branching

    spec = loads(BRANCHING)
    assert spec.branching == Branching(True, 32, 4, 2, 0.1, 640, 0.02, 1, (1.0, 3.0), 0.8, False, 5, 9000)
    assert_round_trip(spec)
    assert spec.hash != loads(TINY).hash
    # a disabled table stores nothing: the hash of a spec without one
    off = loads(TINY + "\n[branching]\nenabled = false\nk_max = 8\n")
    assert off.hash == loads(TINY).hash and off.branching.k_max == 8
    assert loads(TINY).branching == Branching()


def test_bundled_configs_round_trip():
    from experiments.spec.study import list_configs

    for name in list_configs():
        assert_round_trip(load(resolve_config(name)))
