"""Compiled C++ extensions for the rest of the project, built by the trainer's machinery.

:func:`load_kernel` builds ``<sources>/<name>.cpp`` with :mod:`training.engine.compiled_kernel`
(torch's extension cache outside the source tree under a name that digests the sources, the
CPU and the Python and torch versions; ``-O3 -march=native``, OpenMP; a build lock that dies
with its holder), or returns None with one :class:`KernelWarning` saying why and what runs
instead.
The same switches hold for every kernel: ``SPARSESCALE_KERNELS=0`` or :func:`disabled` skips
them silently, ``SPARSESCALE_REQUIRE_KERNEL=1`` makes a failed build a :class:`KernelError`.
The noise monitor's per-example norms (:mod:`theory.monitor.kernel`) use it; the trainer's own
kernel stays private to the engine.

A study's driver asks :func:`kernels_ready` before its workers start (built now if need be, so
that they neither build nor warn), and a worker told that the driver's build failed trains
within :func:`disabled`.

Why this module re-exports the engine's machinery rather than living in it: the engine is
private to the trainers (``tests/reliability/test_import_graph.py``: no package but ``training``
imports ``training.engine``), and the noise monitor (``theory``) and the study runner
(``experiments``) need it; nor can it live in ``training/processes/``, which the engine's kernel
cache imports (``training.processes.lifetime``): that would close a circle between the two
sub-packages. It is the one door through which the other packages reach it.
"""

from training.engine.strategy import kernels_ready
from training.engine.compiled_kernel import (
    DISABLE_ENV, REQUIRE_ENV, KernelError, KernelWarning, disabled, enabled, load_kernel, required,
)

__all__ = ["DISABLE_ENV", "REQUIRE_ENV", "KernelError", "KernelWarning", "disabled", "enabled",
           "kernels_ready", "load_kernel", "required"]
