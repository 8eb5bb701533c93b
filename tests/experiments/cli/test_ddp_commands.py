"""The DDP commands: ``sparsescale ddp`` (one trial under torchrun) and ``sparsescale bench ddp``
(step times and the cost model)."""

import argparse

import pytest
import torch

import training
from training import ConfigError, RunConfig, Trial
from training.distributed import costmodel

from experiments.cli.bench import add_ddp_bench_parser
from experiments.cli.ddp import add_train_parser


def relative_error(state, ref_state):
    return max(float((state[n] - ref_state[n]).norm() / ref_state[n].norm()) for n in ref_state)


def parse(add_parser, argv):
    """``argv`` parsed by a parser holding only the subcommand ``add_parser`` adds."""
    parser = argparse.ArgumentParser(prog="sparsescale")
    handler = add_parser(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    assert args.fn is handler
    return args


@pytest.mark.slow
def test_bench_command_writes_cost_model(tmp_path, capsys):
    out = tmp_path / "cost_model.json"
    args = parse(add_ddp_bench_parser, ["ddp", "--data-option", "num_samples=1000", "--workers", "1,2",
                                    "--per-worker-batch", "4,32", "--allreduce-sizes",
                                    "1000,100000", "--repeats", "5", "--warmup", "2", "--out",
                                    str(out)])
    assert args.fn(args) == 0
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
                    "-m", "experiments.cli", "ddp", "--data-option", "num_samples=1000",
                    "--data-option", "test=true", "--batch-size", "32", "--lr", "0.1",
                    "--momentum", "0.9", "--steps", "50", "--seed", "3", "--target", "0.85",
                    "--eval-every", "5", "--out", str(out)],
                   check=True, timeout=600, env=dict(os.environ),
                   cwd=Path(training.__file__).resolve().parents[1])
    res = torch.load(out, weights_only=False)
    net = training.models.build("mlp", mnist1d_small, seed=0)
    ref = training.train_reference(net, mnist1d_small, Trial(lr=0.1, momentum=0.9),
                                   RunConfig(32, max_steps=50, seed=3, goal=0.85,
                                             eval_schedule=training.EvalSchedule(every=5)))
    assert res.steps_to_result == ref.steps_to_result is not None
    assert relative_error(res.state, ref.state) < 1e-5


def test_bench_refuses_an_unwritable_out_before_measuring(tmp_path, monkeypatch):
    import experiments.cli.bench as bench

    monkeypatch.setattr(bench, "measure",
                        lambda *a, **k: pytest.fail("measured before checking --out"))
    blocker = tmp_path / "file"
    blocker.write_text("")
    args = parse(add_ddp_bench_parser, ["ddp", "--out", str(blocker / "sub" / "cost_model.json")])
    with pytest.raises(costmodel.CostModelIOError, match=r"--out .*cannot create folder"):
        args.fn(args)
    # a missing folder is created
    monkeypatch.setattr(bench, "build_workload",
                        lambda args: pytest.skip("folder created; stop here"))
    args = parse(add_ddp_bench_parser, ["ddp", "--out", str(tmp_path / "new" / "cost_model.json")])
    with pytest.raises(pytest.skip.Exception):
        args.fn(args)
    assert (tmp_path / "new").is_dir()


def test_train_command_parses_a_trial_and_needs_torchrun(monkeypatch):
    args = parse(add_train_parser, ["ddp", "--batch-size", "32", "--lr", "0.1", "--momentum",
                                    "0.9", "--steps", "50", "--target", "0.85"])
    assert (args.batch_size, args.lr, args.momentum, args.steps, args.target) == (32, 0.1, 0.9,
                                                                                 50, 0.85)
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not "
                                          "set: launch with torchrun"):
        args.fn(args)
