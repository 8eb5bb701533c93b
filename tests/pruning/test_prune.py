"""Kept counts, layer collapse, IMP and masks in the trainers."""

import copy

import pytest
import torch

import pruning
import training
from pruning import Mask, prunable_parameters

# collapse at 99 % is expected here; tests/pruning/test_diagnostics.py tests the warning
pytestmark = pytest.mark.filterwarnings("ignore::pruning.LayerCollapseWarning")

LEVELS = (0.5, 0.7, 0.9, 0.99)


def scaled_train_fn(calls):
    """A deterministic stand-in for training: multiplies each weight by a fixed factor, and
    records what it was given."""
    def train(model, mask):
        calls.append((copy.deepcopy(model.state_dict()), mask))
        out = copy.deepcopy(model)
        with torch.no_grad():
            for k, p in out.named_parameters():
                g = torch.Generator().manual_seed(len(k))
                p.mul_(torch.rand(p.shape, generator=g, dtype=p.dtype) * 4)
        return out
    return train


@pytest.mark.parametrize("method", pruning.list_criteria())
@pytest.mark.parametrize("scope", ["global", "layer", "even"])
def test_exact_kept_counts(mnist1d, mlp, method, scope):
    n = sum(p.numel() for p in prunable_parameters(mlp).values())
    extra = {"train_fn": scaled_train_fn([])} if method == "imp" else {}
    for s in LEVELS:
        mask = pruning.prune(mlp, method, s, dataset=mnist1d, scope=scope, rounds=None, **extra)
        assert mask.kept() == round(n * (1 - s)), (method, s)
        assert mask.info["criterion"] == method and mask.info["sparsity"] == s
        if scope == "layer":
            for k, p in prunable_parameters(mlp).items():
                assert abs(mask.kept(k) - p.numel() * (1 - s)) < 1
        if scope == "even":   # 40-100-100-10: layers of 4000 / 10000 / 1000 weights
            assert [mask.kept(k) for k in mask] == pruning.select.even_quotas(
                [4000, 10000, 1000], s)


def test_exact_kept_counts_on_a_cnn(mnist1d):
    cnn = training.models.build("cnn1d", mnist1d, channels=6)
    n = sum(p.numel() for p in prunable_parameters(cnn).values())
    for method in ("snip", "grasp", "synflow"):
        for s in LEVELS:
            assert pruning.prune(cnn, method, s, dataset=mnist1d, rounds=5).kept() == \
                round(n * (1 - s))


def test_synflow_does_not_collapse_layers_at_99(mnist1d, mlp):
    mask = pruning.prune(mlp, "synflow", 0.99, dataset=mnist1d)
    assert mask.info["rounds"] == 100
    assert all(mask.kept(k) > 0 for k in mask), mask.to_dict()["layers"]
    # the pruned network still connects input to output: without biases, its synaptic flow
    # (sum of outputs of |w| on an all-ones input) is positive only through a kept path
    work = mask.apply(pruning.criteria.linearized_copy(mlp))
    with torch.no_grad():
        for name, p in work.named_parameters():
            if name.endswith("bias"):
                p.zero_()
        assert float(work(torch.ones(1, 40, dtype=torch.float64)).sum()) > 0
    # the check has teeth: global magnitude pruning does collapse this MLP at 99 %
    magnitude = pruning.prune(mlp, "magnitude", 0.99)
    assert min(magnitude.kept(k) for k in magnitude) == 0


def test_imp_rewinds_to_init_each_round(teacher, small_mlp):
    calls = []
    mask = pruning.prune(small_mlp, "imp", 0.75, rounds=2, train_fn=scaled_train_fn(calls))
    init = small_mlp.state_dict()
    assert len(calls) == 2
    for state, round_mask in calls:
        for k, v in init.items():  # initial weights with the current mask applied
            expected = v * round_mask[k] if k in round_mask else v
            assert torch.equal(state[k], expected)
    assert calls[0][1].sparsity() == 0.0
    assert calls[1][1].sparsity() == pytest.approx(0.5, abs=1e-3)
    # independent recomputation: magnitude of the "trained" weights, round by round
    trained = scaled_train_fn([])
    params = prunable_parameters(small_mlp)
    scores = {k: p.detach().abs() for k, p in prunable_parameters(trained(small_mlp, None)).items()}
    m1 = pruning.select.top_k_mask(scores, 0.5)
    scores2 = {k: torch.where(m1[k] > 0, scores[k].double(), torch.tensor(float("-inf"),
                              dtype=torch.float64)) for k in params}
    assert mask == pruning.select.top_k_mask(scores2, 0.75)


def test_imp_with_reference_training(teacher, small_mlp):
    train = pruning.iterative.default_train_fn(teacher, steps=40)
    mask = pruning.prune(small_mlp, "imp", 0.8, dataset=teacher, rounds=2, train_fn=train)
    n = sum(p.numel() for p in prunable_parameters(small_mlp).values())
    assert mask.kept() == round(n * 0.2)
    # the trained weights, not the initial ones, decide: differs from one-shot magnitude
    assert mask != pruning.prune(small_mlp, "magnitude", 0.8)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "nesterov"])
def test_mask_survives_reference_training(mnist1d, mlp, optimizer):
    mask = pruning.prune(mlp, "snip", 0.9, dataset=mnist1d)
    res = training.train_reference(mlp, mnist1d, training.Trial(lr=0.05, momentum=0.9),
                                   training.RunConfig(32, optimizer, max_steps=100), mask=mask)
    assert res.steps_run == 100 and not res.diverged
    init = dict(mlp.named_parameters())
    for k, m in mask.items():
        w = res.state[k]
        assert torch.all(w[m == 0] == 0)
        assert not torch.equal(w[m > 0], init[k].detach()[m > 0])  # kept weights trained


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "nesterov"])
def test_masks_survive_vectorized_training(mnist1d, mlp, optimizer):
    masks = [pruning.prune(mlp, "random", s, seed=i) for i, s in enumerate((0.5, 0.9))]
    trials = [{"lr": 0.05, "momentum": 0.9}] * 2
    run = training.RunConfig(32, optimizer, max_steps=100)
    per_trial = training.train_trials(mlp, mnist1d, trials, run, masks=Mask.stack(masks))
    shared = training.train_trials(mlp, mnist1d, trials, run, masks=masks[1])
    init = dict(mlp.named_parameters())
    for res, trial_masks in ((per_trial, masks), (shared, [masks[1]] * 2)):
        assert res.steps_run == 100
        for i, mask in enumerate(trial_masks):
            state = res.state(i)
            for k, m in mask.items():
                assert torch.all(state[k][m == 0] == 0)
                assert not torch.equal(state[k][m > 0], init[k].detach()[m > 0])


def test_rounds_never_revive_pruned_weights(small_mlp):
    calls = []

    def fresh_weights(model, mask):
        # ignores the mask on purpose: pruned weights come back non-zero
        calls.append(mask)
        out = copy.deepcopy(model)
        with torch.no_grad():
            for p in out.parameters():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(calls))))
        return out

    final = pruning.prune(small_mlp, "imp", 0.9, rounds=3, train_fn=fresh_weights)
    masks = calls[1:] + [final]
    for earlier, later in zip(masks, masks[1:]):
        for k in later:
            assert torch.all(later[k] <= earlier[k])
        assert later.kept() < earlier.kept()


def test_regression_data_sets():
    ds = training.data.load("linreg", n=200, dim=6)
    net = training.models.build("mlp", ds, hidden=(8,))
    x, y = pruning.criteria.pruning_batch(ds, 10)
    assert torch.equal(x, ds.x_train[:100]) and torch.equal(y, ds.y_train[:100])
    n = sum(p.numel() for p in prunable_parameters(net).values())
    for method in ("snip", "grasp", "synflow"):
        mask = pruning.prune(net, method, 0.5, dataset=ds, rounds=2)
        assert mask.kept() == round(n * 0.5)


def test_saved_prune_mask_keeps_its_recipe(tmp_path, teacher, small_mlp):
    mask = pruning.prune(small_mlp, "grasp", 0.9, dataset=teacher)
    back = Mask.load(mask.save(tmp_path / "grasp90"))
    assert back == mask
    assert back.info == {"criterion": "grasp", "sparsity": 0.9, "scope": "global", "rounds": 1,
                         "seed": 0, "prune_biases": False, "input_shape": [20], "per_class": 25,
                         "temperature": 200.0, "data": "teacher", "keep": "highest"}


def test_imp_train_fn_must_return_the_trained_model(small_mlp):
    with pytest.raises(pruning.PruningError, match="imp train_fn must return the trained "
                                                   "nn.Module, got NoneType"):
        pruning.prune(small_mlp, "imp", 0.5, rounds=1, train_fn=lambda model, mask: None)


@pytest.mark.parametrize("kind", ["TensorDataset", "tuple"])
def test_prune_refuses_what_is_not_a_dataset_naming_the_constructors(small_mlp, teacher, kind):
    pair = (teacher.x_train, teacher.y_train)
    bad = torch.utils.data.TensorDataset(*pair) if kind == "TensorDataset" else pair
    with pytest.raises(training.DataError) as info:
        pruning.prune(small_mlp, "snip", 0.5, dataset=bad)
    assert str(info.value) == (f"prune: dataset must be a training.Dataset, got {kind}; build one "
                               f"with training.Dataset.from_torch(...) or "
                               f"training.Dataset.from_tensors(x, y)")


def test_prune_checks_the_model_before_scoring(teacher):
    with pytest.raises(training.ModelError, match="prune: model must be a torch.nn.Module, got "
                                                  "dict"):
        pruning.prune({"w": torch.zeros(3)}, "magnitude", 0.5)
    net = torch.nn.Sequential(torch.nn.Linear(20, 7))  # teacher has 4 classes
    calls = []
    net.register_forward_pre_hook(lambda module, args: calls.append(tuple(args[0].shape)))
    with pytest.raises(training.ModelError) as info:
        pruning.prune(net, "snip", 0.5, dataset=teacher)
    assert str(info.value) == ("prune: model outputs [1, 7] for one example but the data set has "
                               "4 classes: the last layer must have 4 outputs")
    assert calls == [(1, 20)]  # the check's one example: nothing was scored


@pytest.mark.parametrize("name", ["mnist_example_cnn", "batchnorm_cnn", "transformer",
                                  "scaled_dot_product", "lstm"])
def test_every_criterion_prunes_models_with_state_randomness_attention_or_recurrence(name):
    """Every criterion on a model the library did not write: the mask keeps exactly its share,
    and the model is left as it was (weights, running statistics, train mode). GraSP's second
    derivative runs attention through the math backend."""
    from ..probe_models import build

    for method in pruning.list_criteria():
        net, ds = build(name)
        before = {k: v.clone() for k, v in net.state_dict().items()}
        rounds = {"rounds": 2} if method in ("imp", "synflow", "force", "iterative_snip") else {}
        mask = pruning.prune(net, method, 0.5, dataset=ds, **rounds)
        total = sum(m.numel() for m in mask.values())
        assert int(sum(m.sum() for m in mask.values())) == round(total * 0.5), method
        assert net.training and all(torch.equal(before[k], v) for k, v in net.state_dict().items())
