"""Batch-size policies: what sets B and the learning rate as a run goes.

- :mod:`~theory.policies.interface`: what a policy reads (:class:`Signal`, from the noise
  monitor's reading) and returns (:class:`Setting`), the lr rules (linear, sqrt, AdaScale), the
  predicted gain and the minimum-gain rule, the time model t(B).
- :mod:`~theory.policies.builtin`: fixed, goodput (Pollux), noise ramp (Gray et al.), CBS
  warmup (Merrill et al.), Seesaw (Meterez et al.); the registry; a policy by import path.
- :mod:`~theory.policies.train`: the vectorized trainer under a policy, segment by segment.
"""

from theory.policies.builtin import (
    POLICIES, CBSWarmup, Fixed, Goodput, NoiseRamp, Seesaw, make_policy,
)
from theory.policies.interface import (
    LR_RULES, LinearTime, Policy, Setting, Signal, efficiency, hold_unless_gain, predicted_gain,
    rate, scale_lr,
)
from theory.policies.train import Decision, PolicyTrial, read_noise, train_under_policy

__all__ = ["CBSWarmup", "Decision", "Fixed", "Goodput", "LR_RULES", "LinearTime", "NoiseRamp",
           "POLICIES", "Policy", "PolicyTrial", "Seesaw", "Setting", "Signal", "efficiency",
           "hold_unless_gain", "make_policy", "predicted_gain", "rate", "read_noise",
           "scale_lr", "train_under_policy"]
