"""training.device: the one check of a device string, the precisions' contexts and what a store
records of a device. CUDA's absence is simulated where a test needs it, so these run the same
on a machine with a GPU."""

import pytest
import torch

import training
from training import device as dev
from training.errors import SparsescaleError


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_cpu_resolves_everywhere():
    assert dev.resolve_device("cpu") == torch.device("cpu")
    assert dev.resolve_device(None) == torch.device("cpu")
    assert dev.resolve_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_gpu_is_one_line_of_bad_input(no_cuda, name):
    with pytest.raises(dev.DeviceError) as info:
        dev.resolve_device(name, "--device")
    assert str(info.value) == ('--device: no CUDA device was found (torch.cuda.is_available() '
                               'is False); use device = "cpu"')
    # bad input: a ValueError, so the command line exits 2
    assert isinstance(info.value, (SparsescaleError, ValueError, training.ConfigError))
    assert "\n" not in str(info.value)


def test_a_gpu_past_the_last_names_how_many_there_are(two_gpus):
    assert dev.resolve_device("cuda:1") == torch.device("cuda:1")
    assert dev.resolve_device("cuda") == torch.device("cuda")
    with pytest.raises(dev.DeviceError, match=r"found 'cuda:2' but this machine has 2 CUDA "
                                              r"device\(s\); allowed: cuda, cuda:0 \.\. cuda:1"):
        dev.resolve_device("cuda:2")


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "mps", "", 3, "cuda:-1"])
def test_malformed_devices_name_the_forms(name):
    with pytest.raises(dev.DeviceError, match="workload.device: found .*; allowed: cpu, cuda, "
                                              "cuda:N"):
        dev.check_device(name, "workload.device")


def test_run_config_refuses_cuda_without_a_gpu(no_cuda):
    with pytest.raises(dev.DeviceError, match="no CUDA device was found"):
        training.RunConfig(8, device="cuda")


def test_precision_is_checked():
    assert dev.check_precision("bf16") == "bf16"
    with pytest.raises(training.ConfigError, match="precision: found 'fp16'; allowed: fp32, "
                                                   "tf32, bf16"):
        dev.check_precision("fp16")


def test_tf32_flags_are_set_for_the_block_and_restored():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    for enabled in (True, False):
        with dev.tf32_flags(enabled):
            assert (torch.backends.cuda.matmul.allow_tf32,
                    torch.backends.cudnn.allow_tf32) == (enabled, enabled)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_precision_on_the_cpu_leaves_the_flags_alone():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    for name in dev.PRECISIONS:
        with dev.precision(name, "cpu"):
            assert (torch.backends.cuda.matmul.allow_tf32,
                    torch.backends.cudnn.allow_tf32) == before


def test_autocast_is_bfloat16_for_bf16_only():
    x, w = torch.randn(4, 3), torch.randn(5, 3)
    for name, dtype in (("fp32", torch.float32), ("tf32", torch.float32),
                        ("bf16", torch.bfloat16)):
        with dev.autocast(name, "cpu"):
            assert (x @ w.T).dtype == dtype, name
    assert dev.lowers("bf16") and not dev.lowers("tf32") and not dev.lowers("fp32")


def test_device_info_on_the_cpu_has_no_cuda_versions():
    info = dev.device_info("cpu")
    assert (info.device, info.cuda_version, info.driver_version) == ("cpu", None, None)
    assert info.name is None or isinstance(info.name, str) and info.name


def test_device_info_of_a_missing_gpu_is_the_same_line(no_cuda):
    with pytest.raises(dev.DeviceError, match="no CUDA device was found"):
        dev.device_info("cuda")


def test_driver_version_is_read_from_the_driver_file(monkeypatch, tmp_path):
    text = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
            "(dvs-builder@U22-I3-AE18-23-3)  Tue Oct 14 2025\nGCC version:  gcc version 12\n")
    real = dev.Path

    class Fake(type(real())):
        def read_text(self, *a, **k):
            if str(self) == "/proc/driver/nvidia/version":
                return text
            return real.read_text(self, *a, **k)

    monkeypatch.setattr(dev, "Path", Fake)
    dev.driver_version.cache_clear()
    try:
        assert dev.driver_version() == "580.159.04"
    finally:
        dev.driver_version.cache_clear()
