"""Models of the kind researchers write, none designed for this library: a CNN with BatchNorm, a
CNN with Dropout, a transformer-encoder classifier, a GRU classifier. Every trainer trains them
as the plain ``torch.optim`` loop does (float64, the library's data order, the loop written out
here as a user would), with masks, momentum and AdamW; BatchNorm's running statistics and
Dropout's draws are per trial."""

import copy

import pytest
import torch
from torch import nn

import training
from training import EvalSchedule, RunConfig, Trial
from training.engine.programs.per_trial import PerTrialProgram
from training.schedules.order import BatchOrder, trial_seed
from training.randomness import randomness_seed

F64 = torch.float64
STEPS, BATCH = 12, 8
# max |w - w_ref| / max |w_ref| per tensor after the steps, as in test_trials_models (float64
# rounding of the same operations in another order)
TOL = {"momentum": 1e-12, "adamw": 1e-10}
# BatchNorm's shift under Adam: its gradient sums the batch in another order in each program
# (rounding 1e-16), and Adam's step g / sqrt(v) amplifies that by ~1e6 where the gradient is
# small: 9.8e-11 with each trial updated after its gradients, 1.5e-10 with the stacked update
# (measured on batchnorm_cnn's second trial); every other weight agrees to 1e-13
BN_SHIFT_ADAM_TOL = 1e-9
TRIALS = {
    "momentum": [Trial(lr=0.05, momentum=0.9), Trial(lr=0.1, momentum=0.5)],
    "adamw": [Trial(lr=3e-3, weight_decay=0.1), Trial(lr=1e-2, beta1=0.8, beta2=0.99,
                                                    weight_decay=0.01)],
}


class BatchNormCNN(nn.Module):
    """Convolutions without bias before BatchNorm, as usually written: a bias there has a zero
    gradient (the normalization removes it), which Adam turns into steps of size lr from
    rounding noise alone."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False),
                                      nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(4, 6, 3, bias=False), nn.BatchNorm2d(6),
                                      nn.ReLU())
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(6 * 2 * 2, 3))

    def forward(self, x):
        return self.head(self.features(x))


class DropoutCNN(nn.Module):
    """PyTorch's MNIST example's shape, small: conv, max-pool, Dropout, Linear, Dropout."""

    def __init__(self, p=0.25):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.drop1, self.drop2 = nn.Dropout(p), nn.Dropout(2 * p)
        self.fc1, self.fc2 = nn.Linear(4 * 3 * 3, 16), nn.Linear(16, 3)

    def forward(self, x):
        x = self.drop1(torch.max_pool2d(torch.relu(self.conv(x)), 2)).flatten(1)
        return self.fc2(self.drop2(torch.relu(self.fc1(x))))


class TransformerClassifier(nn.Module):
    def __init__(self, features=4, width=8, dropout=0.0):
        super().__init__()
        self.embed = nn.Linear(features, width)
        self.encoder = nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=16,
                                                  dropout=dropout, batch_first=True)
        self.norm, self.out = nn.LayerNorm(width), nn.Linear(width, 3)

    def forward(self, x):
        return self.out(self.norm(self.encoder(self.embed(x)).mean(1)))


class GRUClassifier(nn.Module):
    def __init__(self, features=4, hidden=8):
        super().__init__()
        self.gru, self.out = nn.GRU(features, hidden, batch_first=True), nn.Linear(hidden, 3)

    def forward(self, x):
        h, _ = self.gru(x)
        return self.out(h[:, -1])


def dataset(shape, n=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, *shape, generator=g), torch.randint(0, 3, (n,), generator=g)
    return training.Dataset("user-data", "classification", x[:64], y[:64], x[64:], y[64:], 3,
                            tuple(shape))


IMAGES, SEQUENCES = (1, 8, 8), (6, 4)
MODELS = {"batchnorm_cnn": (BatchNormCNN, IMAGES), "dropout_cnn": (DropoutCNN, IMAGES),
          "transformer": (TransformerClassifier, SEQUENCES), "gru": (GRUClassifier, SEQUENCES)}


def build(name, seed=1):
    torch.manual_seed(seed)
    cls, shape = MODELS[name]
    return cls(), dataset(shape)


def masks_for(net, n):
    """A per-trial mask on the first weight matrix, a shared one on the second."""
    g = torch.Generator().manual_seed(3)
    weights = [(k, p) for k, p in net.named_parameters() if p.dim() > 1][:2]
    return {k: (torch.rand(*((n,) if j == 0 else ()), *p.shape, generator=g) > 0.3).double()
            for j, (k, p) in enumerate(weights)}


def trial_mask(masks, net, i):
    return {k: m[i] if m.dim() > net.get_parameter(k).dim() else m for k, m in masks.items()}


def plain_loop(model, ds, trial, optimizer, i, mask, seed=0):
    """The loop a user writes, in the library's data order and with trial i's generator."""
    net = copy.deepcopy(model).double().train()
    with torch.no_grad():
        for k, m in mask.items():
            net.get_parameter(k).mul_(m)
    if optimizer == "adamw":
        opt = torch.optim.AdamW(net.parameters(), lr=trial.lr, betas=(trial.beta1, trial.beta2),
                                eps=trial.eps, weight_decay=trial.weight_decay)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=trial.lr, momentum=trial.momentum)
    order = BatchOrder(trial_seed(seed, i), ds.n_train, BATCH)
    x, y = ds.x_train.double(), ds.y_train
    torch.manual_seed(randomness_seed(seed, i))
    for t in range(STEPS):
        idx = order.batch(t)
        loss = nn.functional.cross_entropy(net(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        for k, m in mask.items():
            net.get_parameter(k).grad.mul_(m)
        opt.step()
    return net


def close(got, want, tol):
    return float((got - want).abs().max() / want.abs().max().clamp(min=1e-30)) <= tol


def is_batch_norm_shift(net, name):
    owner, _, leaf = name.rpartition(".")
    return leaf == "bias" and isinstance(net.get_submodule(owner), nn.modules.batchnorm._BatchNorm)


def noise_only(name, p):
    """Entries whose gradient is zero in exact arithmetic: the attention key projection's bias
    (softmax over the keys ignores a shift shared by all of them). They move only by rounding
    noise (1e-19 to 1e-12 here, from 0), which Adam normalizes by sqrt(v) into steps of its
    own: two correct programs agree there to about 1e-10 of the tensor's scale (measured),
    where every other entry agrees to 1e-15."""
    if not name.endswith("in_proj_bias"):
        return torch.zeros_like(p, dtype=torch.bool)
    d = p.shape[0] // 3
    return torch.arange(p.shape[0]).ge(d) & torch.arange(p.shape[0]).lt(2 * d)


@pytest.mark.parametrize("update", ["per_trial", "stacked"])
@pytest.mark.parametrize("program", ["per_trial", "plain"])
@pytest.mark.parametrize("optimizer", ["momentum", "adamw"])
@pytest.mark.parametrize("name", list(MODELS))
def test_trials_match_the_reference_and_the_plain_loop(name, optimizer, program, update,
                                                       monkeypatch):
    """Whichever candidate the measured choice picks (training.engine.choice) trains each trial
    as the plain loop does; each trial updated after its own gradients (the CPU's way) or all
    trials' gradients first and one stacked update ("stacked", CUDA's way:
    PerTrialProgram.updates_in_step)."""
    monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", program)
    if update == "stacked":
        monkeypatch.setattr(PerTrialProgram, "updates_in_step", lambda *args: False)
    net, ds = build(name)
    trials = TRIALS[optimizer]
    masks = masks_for(net, len(trials))
    run = RunConfig(BATCH, optimizer, max_steps=STEPS, dtype=F64,
                    eval_schedule=EvalSchedule(every=STEPS // 2))
    before = torch.get_rng_state()
    res = training.train_trials(net, ds, trials, run, masks=masks)
    assert torch.equal(torch.get_rng_state(), before)  # the caller's generator is untouched
    assert (res.program, res.program_choice) == (program, "forced")
    for i, trial in enumerate(trials):
        mask = trial_mask(masks, net, i)
        ref = training.train_reference(net, ds, trial, run, mask=mask, trial_index=i)
        plain = plain_loop(net, ds, trial, optimizer, i, mask)
        assert res.curves[i].step.tolist() == ref.curve.step.tolist() == [0, 6, 12]
        torch.testing.assert_close(torch.as_tensor(res.curves[i].metric),
                                   torch.as_tensor(ref.curve.metric), rtol=1e-9, atol=0)
        for k, p in plain.named_parameters():
            p, noise = p.detach(), noise_only(k, p)
            assert close(ref.state[k], p, TOL[optimizer]), (k, "reference vs plain")
            tol = (BN_SHIFT_ADAM_TOL if optimizer == "adamw" and is_batch_norm_shift(net, k)
                   else TOL[optimizer])
            assert close(res.state(i)[k][~noise], p[~noise], tol), (k, "trials")
            # (they start at 0 and stay at rounding-noise size: compared with the tensor's scale)
            assert float((res.state(i)[k] - p)[noise].abs().sum()) <= 1e-8 * float(p.abs().max())
            if k in mask:
                assert torch.all(res.state(i)[k][mask[k] == 0] == 0)
        for k, b in plain.named_buffers():  # running statistics, after training
            if not b.is_floating_point():  # BatchNorm's count of batches
                assert ref.buffers[k] == res.buffers[k][i] == b == STEPS
                continue
            assert close(ref.buffers[k], b, TOL[optimizer]), (k, "reference vs plain")
            assert close(res.buffers[k][i], b, TOL[optimizer]), (k, "trials vs plain")
        moved = max(float((p.detach() - q.detach().double()).abs().max())
                    for p, q in zip(plain.parameters(), net.parameters()))
        assert moved > 1e-4  # training moved the weights far beyond the tolerance


def test_batchnorm_running_statistics_are_per_trial_and_used_in_evaluation():
    """Two trials at different learning rates end with different running statistics; the
    evaluation uses them (eval mode), not the batch's."""
    net, ds = build("batchnorm_cnn")
    run = RunConfig(BATCH, max_steps=STEPS, dtype=F64, eval_schedule=EvalSchedule(every=STEPS))
    res = training.train_trials(net, ds, TRIALS["momentum"], run)
    mean = res.buffers["features.1.running_mean"]
    assert mean.shape == (2, 4) and not torch.equal(mean[0], mean[1])
    assert res.buffers["features.1.num_batches_tracked"].tolist() == [STEPS, STEPS]
    trained = copy.deepcopy(net).double()
    trained.load_state_dict({**res.state(0), **{k: v[0] for k, v in res.buffers.items()}})
    error = training.reference.evaluate(trained, ds.x_val.double(), ds.y_val, "error",
                                        "classification")
    assert res.curves[0].metric[-1] == pytest.approx(error, abs=1e-12)


def test_dropout_same_seed_same_results_and_trials_differ():
    net, ds = build("dropout_cnn")
    run = RunConfig(BATCH, max_steps=STEPS, dtype=F64, seed=4,
                    eval_schedule=EvalSchedule(every=STEPS))
    same = [Trial(lr=0.05, momentum=0.9)] * 2
    a = training.train_trials(net, ds, same, run)
    b = training.train_trials(net, ds, same, run)
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    # same metaparameters, other indices: other data order and other dropout draws
    assert not torch.equal(a.params["fc1.weight"][0], a.params["fc1.weight"][1])
    # the draws alone: both trials given one data order still differ
    c = training.train_trials(net, ds, same, run, data_seeds=[7, 7])
    assert not torch.equal(c.params["fc1.weight"][0], c.params["fc1.weight"][1])
    # a trial's result does not depend on the trials beside it
    alone = training.train_trials(net, ds, same[1:], run, first_index=1)
    assert all(torch.equal(alone.params[k][0], a.params[k][1]) for k in a.params)


def test_dropout_zero_equals_the_model_without_dropout():
    torch.manual_seed(1)
    with_dropout = DropoutCNN(p=0.0)
    without = copy.deepcopy(with_dropout)
    without.drop1 = without.drop2 = nn.Identity()
    ds = dataset(IMAGES)
    run = RunConfig(BATCH, max_steps=STEPS, dtype=F64, eval_schedule=EvalSchedule(every=6))
    a = training.train_trials(with_dropout, ds, TRIALS["momentum"], run)
    b = training.train_trials(without, ds, TRIALS["momentum"], run)
    for k in a.params:
        assert close(a.params[k], b.params[k], 1e-12), k
    for ca, cb in zip(a.curves, b.curves):
        assert ca.metric.tolist() == pytest.approx(cb.metric.tolist(), abs=1e-12)


def test_resuming_a_batchnorm_dropout_run_continues_it_exactly():
    """A state saved mid-run holds the running statistics and the generators: resuming from
    it gives the uninterrupted run."""
    torch.manual_seed(2)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(),
                        nn.Dropout(0.3), nn.Linear(16, 3))
    ds = dataset(IMAGES)
    trials = TRIALS["momentum"]
    whole = training.train_trials(net, ds, trials, RunConfig(BATCH, max_steps=STEPS, dtype=F64))
    half = training.train_trials(net, ds, trials, RunConfig(BATCH, max_steps=STEPS // 2,
                                                            dtype=F64), return_state=True)
    rest = training.train_trials(net, ds, trials, RunConfig(BATCH, max_steps=STEPS, dtype=F64),
                                 start=half.end_state)
    assert all(torch.equal(whole.params[k], rest.params[k]) for k in whole.params)
    assert all(torch.equal(whole.buffers[k], rest.buffers[k]) for k in whole.buffers)
    # the reference loop resumes the same state's trial 1 to the same weights
    ref = training.reference.train_schedule_reference(
        net, ds, trials[1], RunConfig(BATCH, max_steps=STEPS, dtype=F64),
        start=half.end_state.trial(1), trial_index=1).result
    for k, v in ref.state.items():
        assert close(rest.state(1)[k], v, 1e-12), k


@pytest.mark.parametrize("make, match", [
    (lambda: nn.Sequential(nn.Flatten(), nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, 3)),
     r"layer '1' \(LazyLinear\) has uninitialized \(lazy\) parameters: call the model once"),
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.SyncBatchNorm(8), nn.Linear(8, 3)),
     r"layer '2' \(SyncBatchNorm\) needs a distributed process group: use nn.BatchNorm"),
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 8).requires_grad_(False), nn.Linear(8, 3)),
     r"parameter '1.weight' does not require grad \(2 frozen in all\)"),
])
def test_a_module_no_program_can_train_is_refused_in_one_line(make, match):
    net, ds = make(), dataset(IMAGES)
    with pytest.raises(training.ModelError, match=match) as info:
        training.train_trials(net, ds, TRIALS["momentum"], RunConfig(BATCH, max_steps=2))
    assert "\n" not in str(info.value)


def test_batch_size_schedule_trainers_keep_the_running_statistics():
    """Under a batch-size schedule (segment after segment from the previous one's state) the
    vectorized trainer and the reference loop end with the same weights and statistics."""
    from training.schedules.batch_schedule import BatchSchedule, BatchSegment
    from training.reference import train_schedule_reference
    from training.schedule_trials import train_schedule_trials

    net, ds = build("batchnorm_cnn")
    schedule = BatchSchedule((BatchSegment(0, 4), BatchSegment(6, 8)))
    run = RunConfig(BATCH, max_steps=STEPS, dtype=F64, eval_schedule=EvalSchedule(every=6))
    res = train_schedule_trials(net, ds, TRIALS["momentum"], run, schedule=schedule)
    for i, trial in enumerate(TRIALS["momentum"]):
        ref = train_schedule_reference(net, ds, trial, run, schedule=schedule,
                                       trial_index=i).result
        for k, v in ref.state.items():
            assert close(res.state(i)[k], v, 1e-12), k
        assert close(res.buffers["features.1.running_var"][i],
                     ref.buffers["features.1.running_var"], 1e-12)


class FunctionalDropoutAttention(nn.Module):
    """Randomness no layer type declares: F.scaled_dot_product_attention's dropout_p and
    F.dropout called in forward, as hand-written attention blocks do."""

    def __init__(self, features=4, width=8, p=0.2):
        super().__init__()
        self.qkv, self.out, self.p = nn.Linear(features, 3 * width), nn.Linear(width, 3), p

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        p = self.p if self.training else 0.0
        h = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return self.out(nn.functional.dropout(h.mean(1), p, self.training))


def test_randomness_no_layer_declares_is_found_and_trained_per_trial(monkeypatch):
    monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", "per_trial")
    torch.manual_seed(3)
    net, ds = FunctionalDropoutAttention(), dataset(SEQUENCES)
    run = RunConfig(BATCH, max_steps=STEPS, dtype=F64, eval_schedule=EvalSchedule(every=STEPS))
    res = training.train_trials(net, ds, TRIALS["momentum"], run)
    assert res.program == "per_trial"
    for i, trial in enumerate(TRIALS["momentum"]):
        plain = plain_loop(net, ds, trial, "momentum", i, {})
        for k, p in plain.named_parameters():
            assert close(res.state(i)[k], p.detach(), TOL["momentum"]), k
    again = training.train_trials(net, ds, TRIALS["momentum"], run)
    assert all(torch.equal(res.params[k], again.params[k]) for k in res.params)
