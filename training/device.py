"""Where a run computes and in which arithmetic: the one place a device string is checked and
resolved, a precision applied, and a device described for the store.

- :func:`resolve_device`: ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` as a ``torch.device``, or one
  :class:`DeviceError` line; with no CUDA device, ``"cuda"`` gets
  :data:`NO_CUDA`. Every command (``sparsescale study``, ``branch``, ``bench``, ``advise``) and
  every trainer calls it, so the message is the same everywhere and the command line exits 2.
- :func:`check_device`: the same string checked for its form only (a study spec read on a
  machine without CUDA, for its report, is still valid).
- :data:`PRECISIONS` and :func:`precision`: the arithmetic of a run, as a context manager that
  the trainers enter around every forward pass and loss:

  - ``fp32`` (default): float32 everywhere. On CUDA this also turns TF32 off for matmuls and
    cuDNN convolutions within the run (cuDNN's default lets convolutions use TF32), so fp32
    means IEEE float32 products on every device.
  - ``tf32``: on CUDA (Ampere and later) matmuls and cuDNN convolutions take TF32 inputs (10-bit
    mantissa) and accumulate in float32 (``torch.backends.cuda.matmul.allow_tf32``,
    ``torch.backends.cudnn.allow_tf32``). On the CPU it changes nothing: no CPU kernel of torch
    reads those flags, so a ``tf32`` run on the CPU is an ``fp32`` run.
  - ``bf16``: ``torch.autocast(device_type, dtype=torch.bfloat16)`` around the forward pass and
    the loss (mixed precision, Micikevicius et al. 2018 with bfloat16 in place of float16, so no
    loss scaling): matmuls and convolutions read bfloat16 copies of float32 weights and
    activations; the weights ("master weights"), their gradients and the optimizer state stay
    float32, and so do the loss and softmax (autocast's float32 list). Works on the CPU too
    (``torch.autocast("cpu", ...)``), where it is slower than fp32 but tests the same code.

  A precision other than fp32 needs float32 weights (``RunConfig.dtype``): autocast leaves
  float64 tensors alone, and the TF32 flags do not touch float64 either.
- :func:`device_info`: the device's name, and its CUDA runtime and NVIDIA driver versions
  (None on the CPU), which a study's store records with every group.

Imports only torch and :mod:`training.errors`, so every package (and a later ``advise``
command) can use it.
"""

from __future__ import annotations

import contextlib
import functools
import platform
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from training.errors import ConfigError

PRECISIONS = ("fp32", "tf32", "bf16")
DEVICE_FORMS = 'cpu, cuda, cuda:N'
NO_CUDA = ('no CUDA device was found (torch.cuda.is_available() is False); use device = "cpu"')


class DeviceError(ConfigError):
    """A device string is malformed, or names a device this machine does not have (a
    ``ValueError``: bad input, exit status 2 on the command line)."""


def check_device(device: str | torch.device, key: str = "device") -> str:
    """``device`` as a canonical string (``"cpu"``, ``"cuda"``, ``"cuda:1"``), checked for its
    form only; ``key`` names the setting in the message (``workload.device``, ``--device``)."""
    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", device.strip()):
        raise DeviceError(f"{key}: found {device!r}; allowed: {DEVICE_FORMS}")
    return device.strip()


def resolve_device(device: str | torch.device | None = "cpu", key: str = "device"
                   ) -> torch.device:
    """The ``torch.device`` of ``device`` (None: the CPU), after checking that this machine has
    it: ``"cuda"`` without a CUDA device raises :class:`DeviceError` with :data:`NO_CUDA`, and
    ``"cuda:N"`` past the last visible GPU names how many there are."""
    text = check_device("cpu" if device is None else device, key)
    dev = torch.device(text)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"{key}: {NO_CUDA}")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise DeviceError(f"{key}: found {text!r} but this machine has {count} CUDA "
                              f"device(s); allowed: cuda, cuda:0 .. cuda:{count - 1}")
    return dev


def check_precision(precision: str, key: str = "precision") -> str:
    """``precision`` if it is one of :data:`PRECISIONS`, else a :class:`ConfigError` line."""
    if precision not in PRECISIONS:
        raise ConfigError(f"{key}: found {precision!r}; allowed: {', '.join(PRECISIONS)}")
    return precision


@contextlib.contextmanager
def tf32_flags(enabled: bool) -> Iterator[None]:
    """Within the block, CUDA matmuls and cuDNN convolutions may use TF32 (``enabled``) or not;
    the previous flags come back after. Process-wide flags: a process trains one group at a
    time (the study's workers), so no other run sees them."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def autocast(precision: str, device: str | torch.device) -> contextlib.AbstractContextManager:
    """The autocast context of ``precision`` on ``device``'s type: bfloat16 for ``bf16``, none
    (a null context) for ``fp32`` and ``tf32``. The trainers enter it around forward passes and
    losses only, never around the update."""
    if precision == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def precision(name: str, device: str | torch.device) -> Iterator[None]:
    """The arithmetic of a whole run (module docstring): the TF32 flags for the run (on for
    ``tf32``, off otherwise; no effect on the CPU). The trainers enter :func:`autocast` inside it
    around each forward pass and loss."""
    check_precision(name)
    if torch.device(device).type != "cuda":
        yield
        return
    with tf32_flags(name == "tf32"):
        yield


def lowers(name: str) -> bool:
    """Whether ``name`` computes some products below float32 on the CPU (only ``bf16``; ``tf32``
    is fp32 there): a program that cannot (the compiled kernel) must not run it."""
    return name == "bf16"


@dataclass(frozen=True)
class DeviceInfo:
    """What a store records of the device a group trained on: ``device`` (``cpu``, ``cuda:0``),
    ``name`` (the GPU's, or the CPU's model name), ``cuda_version`` (torch's CUDA runtime) and
    ``driver_version`` (the NVIDIA driver), both None on the CPU."""

    device: str
    name: str | None
    cuda_version: str | None = None
    driver_version: str | None = None


def device_info(device: str | torch.device = "cpu") -> DeviceInfo:
    """The :class:`DeviceInfo` of ``device`` (resolved: a missing GPU is a
    :class:`DeviceError`). ``"cuda"`` is the current CUDA device, recorded as ``cuda:N``."""
    dev = resolve_device(device)
    if dev.type != "cuda":
        return DeviceInfo("cpu", cpu_name())
    index = torch.cuda.current_device() if dev.index is None else dev.index
    return DeviceInfo(f"cuda:{index}", torch.cuda.get_device_name(index), torch.version.cuda,
                      driver_version())


@functools.cache
def cpu_name() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere), or None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


@functools.cache
def driver_version() -> str | None:
    """The NVIDIA driver's version: from ``/proc/driver/nvidia/version``, else ``nvidia-smi``;
    None when neither answers (torch reports only the CUDA runtime's version)."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        found = re.search(r"Kernel Module(?: for [\w-]+)?\s+(\d+(?:\.\d+)+)", text)
        if found:
            return found.group(1)
    except OSError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.stdout.strip().splitlines()[:1]
    return first[0].strip() if out.returncode == 0 and first else None


def synchronize(device: str | torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA); nothing on the CPU. For timing only: the
    trainers never call it inside their step loops."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
