"""Where :class:`theory.NoiseScaleMonitor` writes its readings: a CSV file (one row per step, a
header naming the fields) and TensorBoard scalars (``torch.utils.tensorboard.SummaryWriter``,
tag ``noise/<field>``). A reading's parts (:mod:`theory.monitor.parts`) add the columns and tags
``<field>[<part>]`` for their smoothed and per-step B_simple, |G|^2 and tr(Sigma)."""

from __future__ import annotations

import csv
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from theory.errors import TheoryError
from training.errors import SparsescaleIOError

# the numeric fields drawn as TensorBoard curves
SCALARS = ("b_simple", "g_sq", "trace_sigma", "b_simple_se", "g_sq_se", "trace_sigma_se",
           "step_b_simple", "step_g_sq", "step_trace_sigma")
# the fields of each part (theory.monitor.parts) written beside them
PART_FIELDS = ("b_simple", "g_sq", "trace_sigma", "step_b_simple", "step_g_sq",
               "step_trace_sigma")


def columns(reading: Any) -> dict[str, Any]:
    """A reading's fields, its parts' flattened into ``<field>[<part>]`` (the CSV row)."""
    row = asdict(reading)
    for part in row.pop("parts", ()):
        for name in PART_FIELDS:
            row[f"{name}[{part['name']}]"] = part[name]
    return row


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numbers of a row that are drawn as curves: the whole model's ``SCALARS`` and the
    parts' columns (TensorBoard's tags, where finite, and the framework callbacks' metrics,
    :mod:`theory.callbacks`)."""
    return {name: float(value) for name, value in row.items() if name in SCALARS or "[" in name}


class ReadingLog:
    """Appends readings (frozen dataclasses) to ``csv`` and/or a TensorBoard run in ``log_dir``;
    either may be None. Opening fails at once with one line naming the path."""

    def __init__(self, csv_path: str | os.PathLike | None, log_dir: str | os.PathLike | None
                 ) -> None:
        self._file: Any = None
        self._rows: Any = None
        self._writer: Any = None
        if csv_path is not None:
            path = Path(csv_path)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(path, "a", newline="")
            except OSError as exc:
                raise SparsescaleIOError(f"csv {str(path)!r}: cannot open for writing "
                                         f"({exc.strerror or exc})") from None
            self._header = self._file.tell() == 0
        if log_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise TheoryError("log_dir needs the tensorboard package: "
                                  "pip install 'sparsescale[tensorboard]'") from None
            try:
                self._writer = SummaryWriter(str(log_dir))
            except OSError as exc:
                raise SparsescaleIOError(f"log_dir {str(log_dir)!r}: cannot write there "
                                         f"({exc.strerror or exc})") from None

    def write(self, reading: Any) -> None:
        if self._file is None and self._writer is None:
            return
        row = columns(reading)
        if self._file is not None:
            if self._rows is None:
                self._rows = csv.DictWriter(self._file, fieldnames=list(row))
                if self._header:
                    self._rows.writeheader()
            self._rows.writerow(row)
            self._file.flush()
        if self._writer is not None:
            for name, value in scalars(row).items():
                if math.isfinite(value):
                    self._writer.add_scalar(f"noise/{name}", value, row["step"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
