"""sparsescale.theory: predictions from gradient noise and smoothness, by job.

- :mod:`theory.estimators`: measurements of a network on a split: the flat loss, gradient noise,
  curvature, their sampling, the MLP passes, the critical batch by branching.
- :mod:`theory.monitor`: the noise scale inside any training loop (``NoiseScaleMonitor``).
- :mod:`theory.policies`: batch-size policies that set B and the lr as a run goes, and the
  trainer that follows one.
- :mod:`theory.models`: models and bounds: the SGD bound, the delayed-SGD bound, the noisy
  quadratic model (with delay too), the scaling-curve fit, predictions per level, wall time.
- :mod:`theory.verdicts`: where to probe a run and the probes along it, their summaries, and the
  papers' claims judged against the measurements.

Every public name is importable from ``theory`` itself, and so is each module by its name
(``theory.estimators.noise``, ``theory.models.bounds``, ...).
"""
from training.errors import renamed_names

from theory.errors import TheoryError
from theory.estimators import branching, curvature, example_norms, functional, mlp_passes, noise
from theory.estimators import sampling
from theory.estimators.curvature import (
    LocalLipschitz, TraceEstimate, hessian_top_eigenvalues, hessian_trace, lanczos_top,
    local_lipschitz,
)
from theory.estimators.noise import (
    NoiseEstimate, NoiseStream, gradient_noise, two_batch_estimates, two_batch_noise,
)
from theory.estimators.sampling import SplitEstimate
from theory.models import bounds, delay, nqm, nqm_branching, nqm_delay, predict, scaling
from theory.models.predict import MeasuredCurve, Prediction, ProbeSummary, predict_levels
from theory.models.scaling import ScalingFit, fit_scaling
from theory.monitor import layer_norms
from theory.monitor.monitor import NoiseReading, NoiseScaleMonitor
from theory.monitor.readings import PartReading
from theory import policies
from theory.policies import Policy, Setting, Signal, make_policy, train_under_policy
from theory.verdicts import claims, noise_along, probe_points, step_ratio, summaries, trajectory
from theory.verdicts.claims import Verdict, judge_claims
from theory.verdicts.probe_points import probe_batch_sizes, probe_steps, stage_steps
from theory.verdicts.noise_along import NoiseScale, b_simple_along, b_simple_at_goal
from theory.verdicts.step_ratio import StepRatio, censored_step_ratio, km_median
from theory.verdicts.summaries import Summary, summarize
from theory.verdicts.trajectory import probe_trajectory, replay_states

# names renamed to the glossary's words, kept as deprecated aliases for a while
__getattr__ = renamed_names("theory", {"schedule_steps": stage_steps})
