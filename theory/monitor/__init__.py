"""The gradient noise scale inside any PyTorch training loop: :class:`NoiseScaleMonitor`
(:mod:`~theory.monitor.monitor`), the per-example norms of its layers
(:mod:`~theory.monitor.layer_norms`) and their compiled kernel (:mod:`~theory.monitor.kernel`),
its DDP hook (:mod:`~theory.monitor.ddp`), its log (:mod:`~theory.monitor.log`) and the noise
scales of parts of the model (:mod:`~theory.monitor.parts`)."""

from theory.monitor.monitor import NoiseReading, NoiseScaleMonitor
from theory.monitor.readings import PartReading

__all__ = ["NoiseReading", "NoiseScaleMonitor", "PartReading"]
