"""Trial-steps per second of train_trials against the plain PyTorch loop (pytest-benchmark).

With the default ``--benchmark-disable`` each runs once as a quick test; run
``pytest tests/benchmarks --benchmark-enable`` to time them (``python -m training.bench`` prints
the full table with ratios and GFLOP/s).
"""

import math

import pytest
import torch

import training
from training.bench import (VAL_EXAMPLES, Row, _rate, bench_dataset, format_table, main,
                            peak_rss_mib, plain_loop, reset_peak_rss, training_flops, vectorized)

STEPS, TRIALS = 20, 32


@pytest.mark.parametrize("model", ["mlp", "cnn1d"])
@pytest.mark.parametrize("batch_size", [8, 64])
def test_vectorized_trainer(benchmark, mnist1d_small, model, batch_size):
    net = training.models.build(model, mnist1d_small, seed=0)
    res = benchmark(vectorized, net, mnist1d_small, batch_size, TRIALS, STEPS)
    assert res.steps_run == STEPS and res.steps_taken == [STEPS] * TRIALS
    assert all(math.isfinite(c.train_loss[-1]) for c in res.curves)


@pytest.mark.parametrize("model", ["mlp", "cnn1d"])
@pytest.mark.parametrize("batch_size", [8, 64])
def test_plain_loop(benchmark, mnist1d_small, model, batch_size):
    net = training.models.build(model, mnist1d_small, seed=0)
    loss = benchmark(plain_loop, net, mnist1d_small, batch_size, STEPS)
    assert math.isfinite(loss) and 0 < loss < 10


def test_training_flops_closed_form(mnist1d_small):
    mlp = training.models.build("mlp", mnist1d_small)  # 40-100-100-10
    macs = 40 * 100 + 100 * 100 + 100 * 10
    assert training_flops(mlp, (40,), 8) == 8 * (6 * macs - 2 * 40 * 100)
    cnn = training.models.build("cnn1d", mnist1d_small)  # lengths 40 -> 19 -> 10 -> 5
    macs = 25 * 5 * 19 + 25 * 25 * 3 * 10 + 25 * 25 * 3 * 5 + 125 * 10
    assert training_flops(cnn, (40,), 2) == 2 * (6 * macs - 2 * 25 * 5 * 19)


def test_bench_command_prints_ratio_table(capsys):
    before = torch.get_num_threads()
    try:
        assert main(["--models", "mlp", "--batch-sizes", "8", "--trials", "2", "--seconds",
                     "0.01", "--samples", "1000", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(before)
    out = capsys.readouterr().out
    assert "fp32 matmul peak" in out
    row = next(line for line in out.splitlines() if line.startswith("| mlp | 8 | 2 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] in ("fused", "batched")
    assert float(cells[4]) > 0 and float(cells[5]) > 0
    assert cells[6].endswith("x") and float(cells[6][:-1]) == pytest.approx(
        float(cells[5]) / float(cells[4]), rel=0.06)
    assert 50 < float(cells[9]) < 1 << 20  # peak resident MiB of the process


def test_format_table_rows():
    table = format_table([Row("mlp", 8, 32, 1000.0, 25000.0, 50.0, 200.0, "fused", 512.4)])
    assert table.splitlines()[-1] == ("| mlp | 8 | 32 | fused | 1e+03 | 2.5e+04 | 25.0x | 50.0 "
                                      "| 25 % | 512 |")


def test_image_models_get_synthetic_data_of_their_shape(monkeypatch):
    monkeypatch.delenv("SPARSESCALE_DATA", raising=False)
    for model, shape in (("simple_cnn", (1, 28, 28)), ("resnet8", (3, 32, 32))):
        ds = bench_dataset(model, 600)
        assert ds.input_shape == shape and ds.x_train.shape == (600 - VAL_EXAMPLES, *shape)
        assert ds.x_val.shape[0] == VAL_EXAMPLES and ds.name.startswith("synthetic")
        assert int(ds.y_train.max()) < ds.num_classes == 10
    assert bench_dataset("cnn1d", 1000).input_shape == (40,)


def test_marginal_rate_cancels_once_per_run_costs():
    """A run of s steps costing 5 + 2 s clock units: 0.5 steps per unit, not s / (5 + 2 s)."""
    now = [0.0]

    def run(steps):
        now[0] += 5 + 2 * steps

    assert _rate(run, 40.0, lambda: now[0]) == pytest.approx(0.5)


def test_peak_rss_follows_a_touched_block():
    if not reset_peak_rss():
        pytest.skip("no /proc/self/clear_refs here")
    before = peak_rss_mib()
    block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, touched
    assert peak_rss_mib() >= before + 60
    del block
    assert reset_peak_rss() and peak_rss_mib() < before + 32
