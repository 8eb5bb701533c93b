"""sparsescale.theory"""
from . import bounds, branching, nqm, nqm_branching, predict, scaling
from .errors import TheoryError
from .scaling import ScalingFit, fit_scaling
from .predict import MeasuredCurve, Prediction, ProbeSummary, predict_levels
from . import curvature, functional, noise
from .curvature import (LocalLipschitz, TraceEstimate, hessian_top_eigenvalues, hessian_trace,
                        lanczos_top, local_lipschitz)
from .noise import NoiseEstimate, NoiseStream, gradient_noise, two_batch_estimates, two_batch_noise
from . import claims, probe_plan, sampling, summaries, trajectory
from .claims import Verdict, judge_claims
from .probe_plan import probe_batch_sizes, probe_steps
from .sampling import SplitEstimate
from .summaries import Summary, summarize
from .trajectory import probe_trajectory
