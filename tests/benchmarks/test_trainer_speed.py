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
from torch import nn

import training
from training.bench import speed as bench_mod
from training.bench.speed import (
    VAL_EXAMPLES, Row, bench_dataset, format_table, plain_loop, vectorized,
)
from training.bench.measure import peak_rss_mib, reset_peak_rss, training_flops

from experiments.cli.bench import add_trainer_bench_parser as add_bench_parser

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


def run_bench(monkeypatch, *options):
    """``sparsescale bench`` on a small MLP cell (one thread) with ``options``: the rows it
    measured (the command's own ``bench`` calls, recorded)."""
    rows = []

    def recording(*args, **kwargs):
        rows.append(real(*args, **kwargs))
        return rows[-1]

    real = bench_mod.bench
    monkeypatch.setattr(bench_mod, "bench", recording)
    before = torch.get_num_threads()
    parser = argparse.ArgumentParser(prog="sparsescale")
    handler = add_bench_parser(parser.add_subparsers(required=True))
    args = parser.parse_args(["bench", "--models", "mlp", "--batch-sizes", "8", "--trials", "2",
                              "--seconds", "0.01", "--samples", "1000", "--threads", "1",
                              "--no-first-call", *options])
    assert args.fn is handler
    try:
        assert args.fn(args) == 0
    finally:
        torch.set_num_threads(before)
    return rows


def printed_row(out):
    row = next(line for line in out.splitlines() if line.startswith("| mlp | 8 | 2 |"))
    return [c.strip() for c in row.strip("|").split("|")]


def test_bench_command_prints_ratio_table(capsys, monkeypatch):
    [row] = run_bench(monkeypatch)
    out = capsys.readouterr().out
    assert "fp32 matmul peak" in out
    # the printed line is the measured row's, and its ratio that of the unrounded rates
    assert format_table([row]).splitlines()[-1] in out.splitlines()
    cells = printed_row(out)
    assert cells[3] == row.program and row.program in ("fused", "batched")
    assert cells[4] == row.choice == "ruled"   # the compiled kernel's rule covers the MLP
    assert row.plain_steps_per_s > 0 and row.trial_steps_per_s > 0
    def shown(x):   # two decimals below 10x, one above
        return f"{x:.2f}" if x < 10 else f"{x:.1f}"

    assert cells[7] == f"{shown(row.trial_steps_per_s / row.plain_steps_per_s)}x"
    # three interleaved rounds: the printed ratio is their median, beside their range
    assert len(row.ratio_rounds) == 3 and row.ratio == sorted(row.ratio_rounds)[1]
    assert cells[8] == f"{shown(min(row.ratio_rounds))}-{shown(max(row.ratio_rounds))}x"
    assert 50 < row.peak_rss_mib < 1 << 20  # peak resident MiB of the process


def test_bench_command_compares_adam_with_momentum(capsys, monkeypatch):
    [row] = run_bench(monkeypatch, "--optimizer", "adam")
    out = capsys.readouterr().out
    assert "optimizer adam" in out and "| slowdown vs momentum |" in out
    cells = printed_row(out)
    assert len(cells) == 14 and row.optimizer == "adam" and row.momentum_trial_steps_per_s > 0
    assert len(row.slowdown_rounds) == 3 and row.slowdown == sorted(row.slowdown_rounds)[1]
    assert cells[13] == f"{row.slowdown:.2f}x"


def test_bench_command_refuses_unknown_models(monkeypatch):
    with pytest.raises(training.ConfigError, match=r"unknown model\(s\) mpl; allowed: .*mlp"):
        run_bench(monkeypatch, "--models", "mlp,mpl")


def test_bench_command_takes_models_and_data_by_import_path(capsys, monkeypatch, tmp_path):
    """A model and a data set of the user's by import path: the row names the factory and the
    program chosen by measurement (no rule covers a GRU); the first call in a fresh process is
    timed and printed."""
    monkeypatch.setenv("SPARSESCALE_CACHE", str(tmp_path))
    monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", "measure")
    (tmp_path / "benchmodels.py").write_text(
        "import torch\n"
        "import training\n"
        "from training.bench.models import GRUClassifier\n"
        "def gru(ds):\n    return GRUClassifier(ds.input_shape[-1], ds.num_classes, hidden=4)\n"
        "def data():\n"
        "    x, y = torch.randn(200, 5, 3), torch.randint(0, 3, (200,))\n"
        "    return training.Dataset('seq', 'classification', x[:150], y[:150], x[150:], "
        "y[150:], 3, (5, 3))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = run_bench(monkeypatch, "--models", "benchmodels:gru", "--dataset", "benchmodels:data",
                     "--first-call")
    out = capsys.readouterr().out
    [row] = rows
    assert (row.model, row.choice) == ("gru", "measured")
    assert row.program in ("per_trial", "plain")
    assert row.gflops > 0   # the GRU's gates are counted
    assert "gru: first call in a fresh process" in out and "one-time cost" in out


@pytest.mark.parametrize("options, message", [
    (["--models", "nosuch.module:f"], "bench --models: nosuch.module:f: no module named"),
    (["--models", "training.bench.models:gru_classifier"], "needs --dataset"),
    (["--models", "mlp", "--dataset", "nope"], "bench --dataset: unknown data set 'nope'"),
    (["--models", "os:getcwd", "--dataset", "training.bench.models:sequences"],
     "bench --models: os:getcwd raised TypeError"),
])
def test_bench_command_bad_paths_are_one_line_and_status_2(capsys, options, message):
    from experiments.cli import main as cli
    assert cli.main(["bench", *options, "--batch-sizes", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_training_flops_of_recurrent_and_attention_layers():
    gru = nn.GRU(3, 4, batch_first=True)
    macs = 3 * 4 * (3 + 4) * 5   # three gates, input and hidden products, five steps
    assert training_flops(gru, (5, 3), 2) == 2 * (6 * macs - 2 * macs)
    mha = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    tokens = 5
    attention = 4 * 8 * 8 * tokens + 2 * tokens * 8 * tokens
    feed_forward = 2 * 8 * 16 * tokens
    assert training_flops(mha, (tokens, 8), 1) == 6 * (attention + feed_forward) - 2 * attention


def test_format_table_rows():
    table = format_table([Row("mlp", 8, 32, 1000.0, 25000.0, 50.0, 200.0, "fused", 512.4,
                              choice="ruled")])
    assert table.splitlines()[-1] == ("| mlp | 8 | 32 | fused | ruled | 1e+03 | 2.5e+04 | 25.0x "
                                      "| 25.0-25.0x | 50.0 | 25 % | 512 |")
    table = format_table([Row("mlp", 8, 32, 1000.0, 20000.0, 50.0, 200.0, "fused", 512.4,
                              "adam", 25000.0)])
    assert table.splitlines()[0].endswith("| % of peak | peak RSS MiB | vectorized momentum "
                                          "trial-steps/s | slowdown vs momentum |")
    assert table.splitlines()[-1].endswith("| 25 % | 512 | 2.5e+04 | 1.25x |")
    # a resnet8 cell at B = 4096 runs below one plain step per second: still shown
    table = format_table([Row("resnet8", 4096, 32, 0.123, 0.456, 10.0, 200.0, "per_trial")])
    assert "| 0.123 | 0.456 | 3.71x | 3.71-3.71x |" in table


def test_bench_trials_per_optimizer():
    from training.bench.speed import bench_trials

    adam, momentum = bench_trials("adamw", 3), bench_trials("momentum", 3)
    assert [t.lr for t in adam] == pytest.approx([1e-4, 1.1e-4, 1.21e-4])
    assert all(t.momentum == 0.9 for t in momentum) and momentum[0].lr == 1e-3


def test_image_models_get_synthetic_data_of_their_shape(monkeypatch):
    monkeypatch.delenv("SPARSESCALE_DATA", raising=False)
    for model, shape in (("simple_cnn", (1, 28, 28)), ("resnet8", (3, 32, 32))):
        ds = bench_dataset(model, 600)
        assert ds.input_shape == shape and ds.x_train.shape == (600 - VAL_EXAMPLES, *shape)
        assert ds.x_val.shape[0] == VAL_EXAMPLES and ds.name.startswith("synthetic")
        assert int(ds.y_train.max()) < ds.num_classes == 10
    assert bench_dataset("cnn1d", 1000).input_shape == (40,)


def test_peak_rss_follows_a_touched_block():
    if not reset_peak_rss():
        pytest.skip("no /proc/self/clear_refs here")
    before = peak_rss_mib()
    block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, touched
    assert peak_rss_mib() >= before + 60
    del block
    assert reset_peak_rss() and peak_rss_mib() < before + 32


@pytest.mark.parametrize("options, message", [
    (["--rounds", "0"], "bench --rounds: must be >= 1, got 0"),
    (["--seconds", "0"], "bench --seconds: must be > 0, got 0.0"),
])
def test_bench_command_refuses_no_rounds_or_no_time(capsys, options, message):
    from experiments.cli import main as cli
    assert cli.main(["bench", "--models", "mlp", "--batch-sizes", "8", *options]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
