"""The gradient noise scale inside any PyTorch training loop: :class:`NoiseScaleMonitor`
(:mod:`~theory.monitor.monitor`), the per-example norms of its layers
(:mod:`~theory.monitor.layer_norms`) and their compiled kernel (:mod:`~theory.monitor.kernel`),
its DDP hook (:mod:`~theory.monitor.ddp`) and its log (:mod:`~theory.monitor.log`)."""

from theory.monitor.monitor import NoiseReading, NoiseScaleMonitor

__all__ = ["NoiseReading", "NoiseScaleMonitor"]
