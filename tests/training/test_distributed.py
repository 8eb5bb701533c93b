"""DistributedDataParallel trials against the single-process reference trainer.

k = 2 spawned on loopback checks the launcher and the sharding end to end (k = 4 and a spawned
k = 1 are slow); k = 1 and the loop's edge cases (divergence, stopping at the goal) run in-process
in a one-rank process group, which needs no spawn.
"""

import copy
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import training
from training import costmodel
from training.distributed import (BenchPlan, DistRun, _bench_rank, bench_main, check_world,
                                  forward_backward, train_distributed, train_rank, wrap_ddp)
from training.schedules import ConfigError

STEPS = 50


def relative_error(state, ref_state):
    return max(float((state[n] - ref_state[n]).norm() / ref_state[n].norm()) for n in ref_state)


# the optimizers' own settings; momentum and AdamW spawn k = 2 by default, Adam runs in-process
WORKLOADS = {
    "momentum": dict(lr=0.1, momentum=0.9, optimizer="momentum", target=0.81),
    "adam": dict(lr=1e-2, optimizer="adam", beta1=0.8, beta2=0.99, weight_decay=0.1,
                 target=0.84),
    "adamw": dict(lr=1e-2, optimizer="adamw", beta1=0.8, beta2=0.99, weight_decay=0.1,
                  target=0.84),
}


@pytest.fixture(scope="module", params=list(WORKLOADS))
def workload(request, mnist1d_small):
    net = training.models.build("mlp", mnist1d_small, seed=0)
    g = torch.Generator().manual_seed(1)
    mask = {"1.weight": (torch.rand(net[1].weight.shape, generator=g) > 0.5).float()}
    kwargs = dict(batch_size=32, steps=STEPS, seed=3, decay_steps=40, end_factor=0.1,
                  stop_at_goal=False, eval_schedule=training.EvalSchedule(every=5), mask=mask,
                  **WORKLOADS[request.param])
    ref = training.train_reference(net, mnist1d_small, **kwargs)
    # the comparison is only meaningful if the goal is met inside the run and masking bites
    assert ref.steps_to_result is not None and 0 < ref.steps_to_result < STEPS
    assert ref.steps_run == STEPS
    assert torch.all(ref.state["1.weight"][mask["1.weight"] == 0] == 0)
    return net, kwargs, ref


def check_equivalent(res, ref):
    assert res.steps_run == ref.steps_run == STEPS
    assert res.steps_to_result == ref.steps_to_result
    assert not res.diverged
    assert relative_error(res.state, ref.state) < 1e-5
    assert res.curve.step.tolist() == ref.curve.step.tolist()
    assert res.curve.metric.tolist() == ref.curve.metric.tolist()
    assert abs(res.curve.train_loss - ref.curve.train_loss).max() < 1e-5


@pytest.mark.parametrize("workload", ["momentum", pytest.param("adam", marks=pytest.mark.slow),
                                      "adamw"], indirect=True)
def test_ddp_two_workers_match_reference(workload, mnist1d_small):
    net, kwargs, ref = workload
    res = train_distributed(net, mnist1d_small, 2, **kwargs)
    check_equivalent(res, ref)
    mask = kwargs["mask"]["1.weight"]
    assert torch.all(res.state["1.weight"][mask == 0] == 0)


def test_ddp_one_worker_matches_reference(one_rank_group, workload, mnist1d_small):
    net, kwargs, ref = workload
    run_kwargs = {k: v for k, v in kwargs.items() if k != "mask"}
    res = train_rank(net, mnist1d_small, DistRun(world_size=1, **run_kwargs), 0,
                     torch.device("cpu"), kwargs["mask"])
    check_equivalent(res, ref)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 4])  # k = 1 in-process and k = 2 spawned run by default
def test_ddp_spawned_matches_reference(workload, mnist1d_small, world_size):
    net, kwargs, ref = workload
    check_equivalent(train_distributed(net, mnist1d_small, world_size, **kwargs), ref)


def test_differs_from_reference_at_other_seed(workload, mnist1d_small):
    """Guard against a test that cannot fail: a different data order moves the weights far more
    than the tolerance used above."""
    net, kwargs, ref = workload
    other = training.train_reference(net, mnist1d_small, **dict(kwargs, seed=4))
    assert relative_error(other.state, ref.state) > 1e-3


@pytest.mark.parametrize("world_size, batch_size, match", [
    (2, 33, "not divisible by world_size 2"),
    (0, 32, "world_size"),
    (2, 0, "batch_size"),
])
def test_bad_world_or_batch(world_size, batch_size, match):
    with pytest.raises(ConfigError, match=match):
        check_world(world_size, batch_size)


def test_bad_arguments_fail_before_spawning(mnist1d_small):
    net = training.models.build("mlp", mnist1d_small)
    with pytest.raises(ConfigError, match="not divisible"):
        train_distributed(net, mnist1d_small, 3, batch_size=32, lr=0.1)
    with pytest.raises(ConfigError, match="exceeds the training set size"):
        train_distributed(net, mnist1d_small, 1, batch_size=10_000, lr=0.1)
    with pytest.raises(ConfigError, match="optimizer"):
        DistRun(world_size=1, batch_size=8, lr=0.1, optimizer="adagrad")
    with pytest.raises(ConfigError, match="threads"):
        DistRun(world_size=1, batch_size=8, lr=0.1, threads=0)


@pytest.fixture
def one_rank_group():
    """A gloo process group of one rank inside the test process."""
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    yield
    dist.destroy_process_group()


def test_divergence_matches_reference(one_rank_group, mnist1d_small):
    net = training.models.build("mlp", mnist1d_small)
    kwargs = dict(batch_size=32, lr=50.0, momentum=0.9, steps=20, seed=3)
    ref = training.train_reference(net, mnist1d_small, **kwargs)
    assert ref.diverged
    res = train_rank(net, mnist1d_small, DistRun(world_size=1, **kwargs), 0, torch.device("cpu"))
    assert res.diverged and res.diverged_step == ref.diverged_step
    assert res.steps_run == ref.steps_run
    assert relative_error(res.state, ref.state) < 1e-5


def test_stops_at_goal_like_reference(one_rank_group, mnist1d_small):
    net = training.models.build("mlp", mnist1d_small)
    kwargs = dict(batch_size=16, lr=0.1, momentum=0.9, steps=60, seed=5, target=0.85,
                  eval_schedule=training.EvalSchedule(every=4))
    ref = training.train_reference(net, mnist1d_small, **kwargs)
    assert ref.steps_to_result is not None and ref.steps_run == ref.steps_to_result < 60
    res = train_rank(net, mnist1d_small, DistRun(world_size=1, **kwargs), 0, torch.device("cpu"))
    assert (res.steps_to_result, res.steps_run) == (ref.steps_to_result, ref.steps_run)
    assert res.curve.metric.tolist() == ref.curve.metric.tolist()


@pytest.mark.parametrize("bucket_cap_mb", [25.0, 0.01])  # after the rebuild: 1 bucket; 2 buckets
def test_hook_gives_autograd_gradients_and_loss(one_rank_group, mnist1d_small, bucket_cap_mb):
    net = training.models.build("mlp", mnist1d_small)
    plain = copy.deepcopy(net)
    ddp, slot = wrap_ddp(net, torch.device("cpu"), 1, bucket_cap_mb)
    x, y = mnist1d_small.x_train[:64], mnist1d_small.y_train[:64]
    for _ in range(2):  # DDP rebuilds its buckets after the first iteration
        for p in net.parameters():
            p.grad = None
        value = forward_backward(ddp, slot, torch.nn.functional.cross_entropy, x, y)
    loss = torch.nn.functional.cross_entropy(plain(x), y)
    grads = torch.autograd.grad(loss, list(plain.parameters()))
    assert value == pytest.approx(float(loss.detach()), rel=1e-6)
    for g, p in zip(grads, net.parameters()):
        torch.testing.assert_close(p.grad, g, rtol=1e-6, atol=1e-7)


def test_bench_rank_times_every_batch(one_rank_group, mnist1d_small):
    net = training.models.build("mlp", mnist1d_small)
    plan = BenchPlan((4, 16), (100,), warmup=1, repeats=3, rounds=2)
    out = _bench_rank(0, 1, net, mnist1d_small, plan, "cpu")
    assert [b for b, _ in out["steps"]] == [4, 16]
    assert all(t > 0 for _, t in out["steps"])
    assert out["allreduce"] == []  # nothing to reduce on one worker


@pytest.mark.slow
def test_bench_main_writes_cost_model(tmp_path, capsys):
    out = tmp_path / "cost_model.json"
    assert bench_main(["--data-option", "num_samples=1000", "--workers", "1,2",
                       "--per-worker-batch", "4,32", "--allreduce-sizes", "1000,100000",
                       "--repeats", "5", "--warmup", "2", "--out", str(out)]) == 0
    cost = costmodel.load_cost_model(out)
    assert cost.n_params == training.models.count_parameters(
        training.models.build("mlp", training.data.load("mnist1d", num_samples=1000)))
    assert cost.t_fixed + cost.t_example > 0
    assert "t_example" in capsys.readouterr().out


@pytest.mark.slow
def test_torchrun_launch_matches_reference(tmp_path, mnist1d_small):
    """The cluster entry point under torchrun (2 processes, env:// rendezvous on loopback)."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "result.pt"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                    "--master-addr", "127.0.0.1", "--master-port", str(port),
                    "-m", "training.distributed", "train", "--data-option", "num_samples=1000",
                    "--data-option", "test=true", "--batch-size", "32", "--lr", "0.1",
                    "--momentum", "0.9", "--steps", "50", "--seed", "3", "--target", "0.85",
                    "--eval-every", "5", "--out", str(out)],
                   check=True, timeout=600, env=dict(os.environ),
                   cwd=Path(training.__file__).resolve().parents[1])
    res = torch.load(out, weights_only=False)
    net = training.models.build("mlp", mnist1d_small, seed=0)
    ref = training.train_reference(net, mnist1d_small, batch_size=32, lr=0.1, momentum=0.9,
                                   steps=50, seed=3, target=0.85,
                                   eval_schedule=training.EvalSchedule(every=5))
    assert res.steps_to_result == ref.steps_to_result is not None
    assert relative_error(res.state, ref.state) < 1e-5


def test_bench_refuses_an_unwritable_out_before_measuring(tmp_path, monkeypatch):
    import training.distributed as ddp

    monkeypatch.setattr(ddp, "measure", lambda *a, **k: pytest.fail("measured before checking --out"))
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"--out .*cannot create folder"):
        ddp.bench_main(["--out", str(blocker / "sub" / "cost_model.json")])
    # a missing folder is created
    monkeypatch.setattr(ddp, "_workload", lambda args: pytest.skip("folder created; stop here"))
    with pytest.raises(pytest.skip.Exception):
        ddp.bench_main(["--out", str(tmp_path / "new" / "cost_model.json")])
    assert (tmp_path / "new").is_dir()
