"""Probes along a replayed run against direct computations on a tiny MLP: per-example autograd
loops, a dense autograd Hessian, Lee et al.'s formula written out, and the vectorized trainer's
own weights for the replay."""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import pruning
import training
from theory import TheoryError
from theory.verdicts.summaries import PROBE_COLUMNS
from theory.verdicts.trajectory import QUANTITIES, probe_trajectory, replay_states, window

TRIAL = training.Trial(lr=0.3, momentum=0.9)
RUN = training.RunConfig(batch_size=8, optimizer="momentum", seed=3)
EXACT = dict(dtype=torch.float64, lanczos=100)   # float64, Lanczos to the full dimension
HIDDEN = 6


@pytest.fixture(scope="module")
def tiny():
    """A 4-6-3 MLP (51 parameters) on 96 teacher examples."""
    ds = training.data.load("teacher", n=120, dim=4, num_classes=3)
    return ds, training.models.build("mlp", ds, hidden=(HIDDEN,), seed=2)


def loss_of(w, x, y):
    """Mean cross-entropy of Linear(4, 6) -> ReLU -> Linear(6, 3) from a flat vector."""
    w1, b1, w2, b2 = torch.split(w, [HIDDEN * 4, HIDDEN, 3 * HIDDEN, 3])
    return F.cross_entropy(torch.relu(x @ w1.view(HIDDEN, 4).T + b1) @ w2.view(3, HIDDEN).T + b2, y)


def direct(ds, state, keep):
    """|G|^2, tr(Sigma), B_noise, G^T H G, top eigenvalue and loss over kept coordinates."""
    w = parameter_vector_of(state)
    x, y = ds.x_train.double(), ds.y_train
    g = torch.stack([torch.autograd.grad(loss_of(w.requires_grad_(True), xi[None], yi[None]), w)[0]
                     for xi, yi in zip(x, y)])[:, keep]
    h = torch.autograd.functional.hessian(lambda v: loss_of(v, x, y), w.detach())[keep][:, keep]
    mean = g.mean(0)
    d = g - mean
    return dict(g_sq=float(mean @ mean), trace_sigma=float(d.pow(2).sum(1).mean()),
                b_noise=float(torch.trace(h @ d.T @ d) / len(g) / (mean @ h @ mean)),
                g_h_g=float(mean @ h @ mean), hessian_top=float(torch.linalg.eigvalsh(h)[-1]),
                loss=float(loss_of(w.detach(), x, y)))


def parameter_vector_of(state):
    return torch.cat([state[k].reshape(-1) for k in ("1.weight", "1.bias", "3.weight", "3.bias")]).double()


def lee_direct(ds, w_prev, w_next, keep):
    x, y = ds.x_train.double(), ds.y_train

    def gradient(w):
        w = w.clone().requires_grad_(True)
        return torch.autograd.grad(loss_of(w, x, y), w)[0][keep]

    step = (w_next - w_prev)[keep]
    g0 = gradient(w_prev)
    return max(float((gradient(w_prev + gamma * (w_next - w_prev)) - g0).norm()) / (gamma * float(step.norm()))
               for gamma in np.arange(1, 10) / 10)


def check_rows(ds, net, rows, steps, horizon, average, keep, mask=None):
    states = replay_states(net, ds, TRIAL, RUN, range(horizon + 1), mask, trial_index=1)
    table = rows.set_index(["step", "quantity"]).value
    for t in steps:
        w = window(t, horizon, max(2, average))
        exact = [direct(ds, states[s], keep) for s in w[:average]]
        g_sq = np.mean([e["g_sq"] for e in exact])
        trace = np.mean([e["trace_sigma"] for e in exact])
        assert table[(t, "g_sq")] == pytest.approx(g_sq, rel=1e-8)
        assert table[(t, "trace_sigma")] == pytest.approx(trace, rel=1e-8)
        assert table[(t, "b_simple")] == pytest.approx(trace / g_sq, rel=1e-8)
        for q in ("b_noise", "g_h_g", "hessian_top", "loss"):
            assert table[(t, q)] == pytest.approx(exact[0][q], rel=1e-7), (t, q)
        lee = lee_direct(ds, parameter_vector_of(states[w[0]]), parameter_vector_of(states[w[1]]), keep)
        assert table[(t, "local_lipschitz")] == pytest.approx(lee, rel=1e-7)


def test_probes_match_direct_computations(tiny):
    ds, net = tiny
    rows = probe_trajectory(net, ds, TRIAL, RUN, steps=[0, 5, 12], horizon=12, sparsity=0.0, average=2,
                            hessian_examples=None, trial_index=1, **EXACT)
    assert list(rows.columns) == list(PROBE_COLUMNS)
    assert len(rows) == 3 * len(QUANTITIES)
    assert set(rows.seed) == {3} and set(rows.batch_size) == {8}
    assert sorted(set(rows.fraction)) == pytest.approx([0, 5 / 12, 1])
    check_rows(ds, net, rows, [0, 5, 12], 12, 2, slice(None))


def test_masked_probes_use_kept_weights_only(tiny):
    ds, net = tiny
    mask = pruning.prune(net, "random", 0.5, seed=1)
    keep = torch.cat([mask[n].reshape(-1) != 0 if n in mask else torch.ones(p.numel(), dtype=torch.bool)
                      for n, p in net.named_parameters()])
    rows = probe_trajectory(net, ds, TRIAL, RUN, steps=[4], horizon=10, mask=mask, sparsity=0.5,
                            average=3, hessian_examples=None, trial_index=1, **EXACT)
    assert set(rows.sparsity) == {0.5}
    check_rows(ds, net, rows, [4], 10, 3, keep, mask)


def test_replay_reproduces_the_trial(tiny):
    ds, net = tiny
    res = training.train_trials(net, ds, [training.Trial(lr=0.5), TRIAL],
                                training.RunConfig(batch_size=8, optimizer="momentum",
                                                   max_steps=12, seed=3))
    state = replay_states(net, ds, TRIAL, RUN, [12], trial_index=1)[12]
    for name, p in res.state(1).items():
        assert torch.allclose(state[name], p, atol=1e-6), name


def test_one_replay_snapshots_what_separate_replays_give(tiny):
    ds, net = tiny
    once = replay_states(net, ds, TRIAL, RUN, [0, 3, 7, 12], trial_index=1)
    for t in (0, 3, 7, 12):
        alone = training.train_reference(net, ds, TRIAL, training.RunConfig(
            batch_size=8, optimizer="momentum", seed=3, max_steps=t, stop="never"), trial_index=1)
        for name, p in alone.state.items():
            assert torch.equal(once[t][name], p), (t, name)


def test_window_stays_inside_the_run():
    assert window(0, 100, 3) == (0, 1, 2) and window(50, 100, 3) == (50, 51, 52)
    assert window(100, 100, 3) == (98, 99, 100) and window(1, 1, 3) == (0, 1)


def test_bad_arguments_are_named(tiny):
    ds, net = tiny
    with pytest.raises(TheoryError, match="steps must be"):
        probe_trajectory(net, ds, TRIAL, RUN, steps=[20], horizon=10)
    with pytest.raises(TheoryError, match="run must be a training.RunConfig"):
        probe_trajectory(net, ds, TRIAL, {"batch_size": 8}, steps=[0], horizon=10)
    with pytest.raises(TheoryError, match="horizon"):
        probe_trajectory(net, ds, TRIAL, RUN, steps=[0], horizon=0)
    with pytest.raises(TheoryError, match=r"the replayed run diverged at step \d+ before reaching step 30"):
        replay_states(net, ds, training.Trial(lr=1e5, momentum=0.9), RUN, [0, 1, 30])


def test_replayed_states_carry_the_running_statistics():
    """A BatchNorm network's probed states hold the running statistics the run had at that step
    (the reference run to the same step), not the initial ones."""
    from torch import nn

    ds = training.data.load("teacher", n=200, dim=8, num_classes=3, seed=1)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    run = training.RunConfig(16, max_steps=7, seed=2)
    states = replay_states(net, ds, TRIAL, run, [3, 7], trial_index=1)
    ref = training.train_reference(net, ds, TRIAL, run, trial_index=1)
    assert torch.equal(states[7]["1.running_mean"], ref.buffers["1.running_mean"])
    assert int(states[3]["1.num_batches_tracked"]) == 3
    assert not torch.equal(states[3]["1.running_var"], torch.ones(16))


def test_one_replay_is_bit_identical_with_batch_norm_and_dropout():
    """The one-pass replay on a network whose steps update running statistics and draw dropout
    masks: every snapshot equals a reference run stopped at that step, bit for bit."""
    from torch import nn

    ds = training.data.load("teacher", n=200, dim=8, num_classes=3, seed=1)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2),
                        nn.Linear(16, 3))
    run = training.RunConfig(16, optimizer="momentum", seed=2)
    states = replay_states(net, ds, TRIAL, run, [9, 0, 4, 5], trial_index=1)
    assert list(states) == [0, 4, 5, 9]
    for t, state in states.items():
        alone = training.train_reference(net, ds, TRIAL, dataclasses.replace(
            run, max_steps=t, stop="never"), trial_index=1)
        assert state.keys() == {**alone.state, **alone.buffers}.keys()
        for name, v in {**alone.state, **alone.buffers}.items():
            assert torch.equal(state[name], v), (t, name)


def test_float32_probes_on_a_curvature_sample_match_float64_loops(tiny):
    """The study's protocol (float32 measurements, lambda_max and B_noise on a sample of the
    split, Lee's L and the noise on all of it) against float64 loops written out here: the
    probes' shared passes (the noise pass's loss, B_noise and Lanczos on one Hessian graph of
    the sample) change no value beyond float32 rounding (1e-5 relative)."""
    ds, net = tiny
    sample, horizon, steps = 40, 12, [0, 6, 12]
    rows = probe_trajectory(net, ds, TRIAL, RUN, steps=steps, horizon=horizon, average=3,
                            curvature_examples=sample, hessian_examples=None, lanczos=100,
                            trial_index=1, sample_seed=5)
    table = rows.set_index(["step", "quantity"]).value
    states = replay_states(net, ds, TRIAL, RUN, range(horizon + 1), trial_index=1)
    n = ds.x_train.shape[0]
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(5))[:sample]
    part = dataclasses.replace(ds, x_train=ds.x_train[idx], y_train=ds.y_train[idx])
    everything = slice(None)
    for t in steps:
        w = window(t, horizon, 3)
        full = [direct(ds, states[s], everything) for s in w]
        g_sq, trace = np.mean([e["g_sq"] for e in full]), np.mean([e["trace_sigma"] for e in full])
        on_sample = direct(part, states[w[0]], everything)
        # the sample's own statistics corrected to the split (without replacement, n of N):
        # G^T H G ~ m^T H m - (1 - n/N) / (n - 1) T, tr(H Sigma) ~ (N - 1)/N n/(n - 1) T
        trace_h = on_sample["b_noise"] * on_sample["g_h_g"]
        g_h_g = on_sample["g_h_g"] - (1 - sample / n) / (sample - 1) * trace_h
        trace_h_split = (n - 1) / n * sample / (sample - 1) * trace_h
        expected = {"g_sq": g_sq, "trace_sigma": trace, "b_simple": trace / g_sq,
                    "loss": full[0]["loss"], "hessian_top": on_sample["hessian_top"],
                    "g_h_g": g_h_g, "b_noise": trace_h_split / g_h_g,
                    "local_lipschitz": lee_direct(ds, parameter_vector_of(states[w[0]]),
                                                  parameter_vector_of(states[w[1]]), everything)}
        for q, value in expected.items():
            assert table[(t, q)] == pytest.approx(value, rel=1e-5), (t, q)


@pytest.mark.parametrize("sparse", [False, True])
def test_plain_mlp_passes_give_the_separate_passes_values(monkeypatch, sparse):
    """The study's float32 protocol on a plain ReLU MLP: the joint pass (noise and Lee's L) and
    the R-operator Hessian products (theory.estimators.mlp_passes) against the separate passes every other
    network takes (gradient_noise, local_lipschitz, the autograd Hessian): every value within
    float32 rounding (1e-5 relative), both within 1e-4 of the float64 protocol."""
    import theory.verdicts.trajectory as trajectory

    ds = training.data.load("teacher", n=400, dim=10, num_classes=4, seed=2)
    net = training.models.build("mlp", ds, hidden=(24, 16), seed=1)
    mask = pruning.prune(net, "random", 0.5, seed=0) if sparse else None
    args = dict(steps=[0, 9, 20], horizon=20, mask=mask, average=3, curvature_examples=64,
                trial_index=1)
    joint = probe_trajectory(net, ds, TRIAL, RUN, **args).value.to_numpy()
    exact = probe_trajectory(net, ds, TRIAL, RUN, dtype=torch.float64, **args).value.to_numpy()
    monkeypatch.setattr(trajectory, "plain_mlp", lambda fl: None)
    separate = probe_trajectory(net, ds, TRIAL, RUN, **args).value.to_numpy()
    assert not np.array_equal(joint, separate)   # two computations, not one
    np.testing.assert_allclose(joint, separate, rtol=1e-5)
    np.testing.assert_allclose(joint, exact, rtol=1e-4)
    np.testing.assert_allclose(separate, exact, rtol=1e-4)
