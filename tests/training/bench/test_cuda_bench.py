"""The GPU parts of the trainer benchmark that the CPU can check: the GPU table, and the CPU
paths they must leave alone."""

import math

import pytest
import torch

from training.bench import cuda as cuda_bench
from training.bench.speed import Row, format_table


def test_gpu_rows_get_tflops_against_the_precisions_peak_and_gpu_memory():
    row = Row("mlp", 64, 32, 2000.0, 200_000.0, 51_200.0, 512_000.0, "batched", 900.0,
              device="cuda", precision="bf16", peak_gpu_mib=123.4)
    lines = format_table([row]).splitlines()
    assert lines[0] == ("| model | B | trials | device | precision | program | plain loop "
                        "steps/s | vectorized trial-steps/s | median ratio | ratio range | "
                        "TFLOP/s | % of peak | peak GPU MiB |")
    assert lines[2] == ("| mlp | 64 | 32 | cuda | bf16 | batched | 2e+03 | 2e+05 | 100.0x | "
                        "100.0-100.0x | 51.20 | 10.0 % | 123 |")


def test_cpu_rows_keep_their_table():
    row = Row("mlp", 8, 32, 1000.0, 25000.0, 50.0, 200.0, "fused", 512.4)
    assert format_table([row]).splitlines()[0].startswith("| model | B | trials | program |")
    assert (row.device, row.precision) == ("cpu", "fp32") and math.isnan(row.peak_gpu_mib)


def test_gpu_memory_is_nan_on_the_cpu_and_the_gpu_peak_refuses_it():
    cuda_bench.reset_peak_memory("cpu")
    assert math.isnan(cuda_bench.peak_memory_mib("cpu"))
    with pytest.raises(ValueError, match="measures a CUDA device"):
        cuda_bench.matmul_peak("cpu")


def test_the_gpu_peak_without_a_gpu_is_the_device_line(monkeypatch):
    from training.device import DeviceError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="no CUDA device was found"):
        cuda_bench.matmul_peak("cuda")
