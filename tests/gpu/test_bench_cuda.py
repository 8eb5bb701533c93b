"""``sparsescale bench --device cuda``'s pieces on a GPU: the matmul peak per precision, one
benchmark row of each trainer, and the command itself."""

import math

import pytest
import torch

from experiments.cli import main as cli
from training.bench import cuda as cuda_bench
from training.bench import speed


def test_the_matmul_peak_rises_with_lower_precision():
    peaks = {p: cuda_bench.matmul_peak("cuda", p, size=4096, seconds=0.2)
             for p in ("fp32", "tf32", "bf16")}
    print({p: f"{v / 1e3:.1f} TFLOP/s" for p, v in peaks.items()})
    assert all(math.isfinite(v) and v > 0 for v in peaks.values())
    assert peaks["bf16"] > peaks["fp32"]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_bench_row_on_cuda(mnist1d_small, precision):
    peak = cuda_bench.matmul_peak("cuda", precision, size=4096, seconds=0.2)
    row = speed.bench("mlp", 64, 8, mnist1d_small, peak, seconds=0.2, device="cuda",
                      precision=precision)
    assert (row.device, row.precision, row.program) == ("cuda", precision, "batched")
    assert row.plain_steps_per_s > 0 and row.trial_steps_per_s > 0
    assert 0 < row.peak_gpu_mib < torch.cuda.get_device_properties(0).total_memory / 2 ** 20
    table = speed.format_table([row])
    assert "| cuda |" in table and "peak GPU MiB" in table


def test_the_bench_command_on_cuda(capsys):
    assert cli.main(["bench", "--device", "cuda", "--models", "mlp", "--batch-sizes", "8",
                     "--trials", "4", "--seconds", "0.2", "--samples", "2000"]) == 0
    out = capsys.readouterr().out
    assert "matmul peak" in out and "| mlp | 8 | 4 | cuda | fp32 | batched |" in out
