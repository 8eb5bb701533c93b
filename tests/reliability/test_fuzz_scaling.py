"""Fuzzing theory.fit_scaling: any input gives a finite fit or TheoryError, nothing else."""

import math
import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from theory import ScalingFit, TheoryError, fit_scaling

anything = st.one_of(st.floats(), st.integers(-10, 10**6), st.text(max_size=3), st.none(),
                     st.booleans())
curves = st.one_of(
    st.lists(st.floats(min_value=1e-6, max_value=1e9), min_size=0, max_size=8),   # plausible
    st.lists(st.floats(), max_size=8),                                             # any float
    st.lists(anything, max_size=5),
    st.lists(st.lists(st.floats(0.5, 100), max_size=3), max_size=3),
    anything,
)


@settings(max_examples=400, deadline=None)
@given(batch_sizes=curves, steps=curves,
       seeds=st.one_of(st.none(), st.lists(st.integers(0, 2), max_size=8), anything),
       level=st.one_of(st.floats(), st.just(0.9)),
       resample=st.one_of(st.sampled_from(["auto", "seeds", "residuals", "points"]),
                          st.text(max_size=4)),
       n_boot=st.one_of(st.integers(-2, 30), st.floats(), st.booleans()))
def test_fit_scaling_gives_a_finite_fit_or_theory_error(batch_sizes, steps, seeds, level,
                                                        resample, n_boot):
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # an overflow warning is a failure, not a fit
        try:
            fit = fit_scaling(batch_sizes, steps, seeds=seeds, n_boot=n_boot, level=level,
                              resample=resample, seed=0)
        except TheoryError as exc:
            assert str(exc) and "\n" not in str(exc)
            return
    assert isinstance(fit, ScalingFit)
    assert math.isfinite(fit.s_min) and fit.s_min > 0
    assert math.isfinite(fit.b_crit) and fit.b_crit > 0
    for low, high in fit.intervals.values():
        assert low <= high
    assert len(fit.regimes) == len(fit.batch_sizes) == len(np.unique(batch_sizes))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(min_value=1e-3, max_value=1e12), min_size=3, max_size=8, unique=True),
       st.floats(1.0, 1e6), st.floats(1e-3, 1e9))
def test_fit_of_any_exact_curve_in_range_recovers_it(batch_sizes, s_min, b_crit):
    # on S = S_min (1 + B_crit / B) the fit is exact whenever B_crit is resolved by the data
    b = np.array(batch_sizes)
    if not (b.min() <= b_crit <= b.max()) or b.max() / b.min() < 4:
        return
    fit = fit_scaling(b, s_min * (1 + b_crit / b), n_boot=20)
    assert math.isclose(fit.s_min, s_min, rel_tol=1e-4)
    assert math.isclose(fit.b_crit, b_crit, rel_tol=1e-3)
