"""Command-line options several commands share: ``--device`` (``study``, ``branch``, ``bench``,
and any later command that trains or probes, such as ``advise``) and ``--precision``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from training.device import DEVICE_FORMS, PRECISIONS, resolve_device


def add_device_argument(p: argparse.ArgumentParser, default: str | None = None,
                        what: str = "train") -> None:
    """Add ``--device`` to ``p`` (``default`` None: the study's ``[workload] device``)."""
    p.add_argument("--device", default=default, metavar="DEVICE",
                   help=f"where to {what}: {DEVICE_FORMS} (default: "
                        + ("the study's [workload] device, else cpu)" if default is None
                           else f"{default})")
                        + "; without a CUDA device, cuda is refused in one line (exit 2)")


def add_precision_argument(p: argparse.ArgumentParser, default: str | None = "fp32") -> None:
    """Add ``--precision`` to ``p`` (:data:`training.device.PRECISIONS`)."""
    p.add_argument("--precision", choices=PRECISIONS, default=default,
                   help="arithmetic of forward passes and losses: fp32, tf32 (CUDA matmuls and "
                        "convolutions in TF32; fp32 on the CPU) or bf16 (bfloat16 autocast, "
                        f"float32 weights and optimizer state); default {default or 'the spec'}")


def device_of(args: argparse.Namespace, spec: Any = None) -> Any:
    """``spec`` with ``--device`` in place of its ``[workload] device`` (the spec's hash does not
    change: the device is not part of it), or the checked device string when ``spec`` is None;
    a device this machine lacks raises :class:`training.device.DeviceError` (exit 2)."""
    from dataclasses import replace

    device = getattr(args, "device", None)
    if spec is None:
        resolve_device(device or "cpu", "--device")
        return device or "cpu"
    if device is None:
        return spec
    resolve_device(device, "--device")
    return replace(spec, device=device)


class Renamed(argparse.Action):
    """An option's old name, still accepted: its value goes to the new option's ``dest``, with
    one line on stderr naming the new option (the CLI's form of a ``DeprecationWarning``, which
    a command line would not show)."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "", **kwargs: Any):
        self.new = new
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"{parser.prog}: warning: {option_string} is deprecated, use {self.new}",
              file=sys.stderr)
        setattr(namespace, self.dest, values)
