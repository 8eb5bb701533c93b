"""Trial-steps per second of train_trials against the plain PyTorch loop (pytest-benchmark).

With the default ``--benchmark-disable`` each runs once as a quick test; run
``pytest tests/benchmarks --benchmark-enable`` to time them (``sparsescale bench`` prints the
full table with ratios and GFLOP/s; ``--optimizer adam`` adds Adam's slowdown against momentum,
measured in the same run).
"""

import argparse
import math

import pytest
import torch

import training
from training.bench import (add_bench_parser, format_table, plain_loop, training_flops,
                            vectorized)

STEPS, TRIALS = 20, 32


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
@pytest.mark.parametrize("model", ["mlp", "cnn1d"])
@pytest.mark.parametrize("batch_size", [8, 64])
def test_vectorized_trainer(benchmark, mnist1d_small, model, batch_size, optimizer):
    net = training.models.build(model, mnist1d_small, seed=0)
    res = benchmark(vectorized, net, mnist1d_small, batch_size, TRIALS, STEPS,
                    optimizer=optimizer)
    assert res.steps_run == STEPS and res.steps_taken == [STEPS] * TRIALS
    assert all(math.isfinite(c.train_loss[-1]) for c in res.curves)


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
@pytest.mark.parametrize("model", ["mlp", "cnn1d"])
@pytest.mark.parametrize("batch_size", [8, 64])
def test_plain_loop(benchmark, mnist1d_small, model, batch_size, optimizer):
    net = training.models.build(model, mnist1d_small, seed=0)
    loss = benchmark(plain_loop, net, mnist1d_small, batch_size, STEPS, optimizer)
    assert math.isfinite(loss) and 0 < loss < 10


def test_training_flops_closed_form(mnist1d_small):
    mlp = training.models.build("mlp", mnist1d_small)  # 40-100-100-10
    macs = 40 * 100 + 100 * 100 + 100 * 10
    assert training_flops(mlp, (40,), 8) == 8 * (6 * macs - 2 * 40 * 100)
    cnn = training.models.build("cnn1d", mnist1d_small)  # lengths 40 -> 19 -> 10 -> 5
    macs = 25 * 5 * 19 + 25 * 25 * 3 * 10 + 25 * 25 * 3 * 5 + 125 * 10
    assert training_flops(cnn, (40,), 2) == 2 * (6 * macs - 2 * 25 * 5 * 19)


def run_bench(*options):
    """Output of ``sparsescale bench`` on a small MLP cell (one thread) with ``options``."""
    before = torch.get_num_threads()
    parser = argparse.ArgumentParser(prog="sparsescale")
    handler = add_bench_parser(parser.add_subparsers(required=True))
    args = parser.parse_args(["bench", "--models", "mlp", "--batch-sizes", "8", "--trials", "2",
                              "--seconds", "0.01", "--samples", "1000", "--threads", "1",
                              *options])
    assert args.fn is handler
    try:
        assert args.fn(args) == 0
    finally:
        torch.set_num_threads(before)


def test_bench_command_prints_ratio_table(capsys):
    run_bench()
    out = capsys.readouterr().out
    assert "fp32 matmul peak" in out
    row = next(line for line in out.splitlines() if line.startswith("| mlp | 8 | 2 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[3]) > 0 and float(cells[4]) > 0
    assert cells[5].endswith("x") and float(cells[5][:-1]) == pytest.approx(
        float(cells[4]) / float(cells[3]), rel=0.06)


def test_bench_command_compares_adam_with_momentum(capsys):
    run_bench("--optimizer", "adam")
    out = capsys.readouterr().out
    assert "optimizer adam" in out and "| slowdown vs momentum |" in out
    row = next(line for line in out.splitlines() if line.startswith("| mlp | 8 | 2 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 10 and float(cells[8]) > 0
    assert float(cells[9][:-1]) == pytest.approx(float(cells[8]) / float(cells[4]), rel=0.06)


def test_format_table_rows():
    from training.bench import Row

    table = format_table([Row("mlp", 8, 32, 1000.0, 25000.0, 50.0, 200.0)])
    assert table.splitlines()[-1] == "| mlp | 8 | 32 | 1000 | 25000 | 25.0x | 50.0 | 25 % |"
    table = format_table([Row("mlp", 8, 32, 1000.0, 20000.0, 50.0, 200.0, "adam", 25000.0)])
    assert table.splitlines()[0].endswith("| % of peak | vectorized momentum trial-steps/s | "
                                          "slowdown vs momentum |")
    assert table.splitlines()[-1].endswith("| 25 % | 25000 | 1.25x |")


def test_bench_trials_per_optimizer():
    from training.bench import bench_trials

    adam, momentum = bench_trials("adamw", 3), bench_trials("momentum", 3)
    assert [t.lr for t in adam] == pytest.approx([1e-4, 1.1e-4, 1.21e-4])
    assert all(t.momentum == 0.9 for t in momentum) and momentum[0].lr == 1e-3
