"""sparsescale.theory"""
from theory import bounds, branching, nqm, nqm_branching, predict, scaling
from theory.errors import TheoryError
from theory.scaling import ScalingFit, fit_scaling
from theory.predict import MeasuredCurve, Prediction, ProbeSummary, predict_levels
from theory import curvature, functional, noise
from theory.curvature import (
    LocalLipschitz, TraceEstimate, hessian_top_eigenvalues, hessian_trace, lanczos_top,
    local_lipschitz,
)
from theory.noise import (
    NoiseEstimate, NoiseStream, gradient_noise, two_batch_estimates, two_batch_noise,
)
from theory import claims, probe_plan, sampling, summaries, trajectory
from theory.claims import Verdict, judge_claims
from theory.probe_plan import probe_batch_sizes, probe_steps, schedule_steps
from theory.sampling import SplitEstimate
from theory.summaries import Summary, summarize
from theory.trajectory import probe_trajectory, replay_states
from theory import layer_norms, monitor
from theory.monitor import NoiseReading, NoiseScaleMonitor
