"""predict_levels on synthetic worlds where the truth is known."""

import numpy as np
import pytest

from theory import bounds
from theory.errors import TheoryError
from theory.models.predict import MeasuredCurve, ProbeSummary, predict_levels, predicted_steps

BATCHES = tuple(2.0 ** np.arange(0, 14))
PROBES = (
    ProbeSummary(sparsity=0.0, L=2.0, sigma2=4.0, delta=2.3, b_simple=50.0),
    ProbeSummary(sparsity=0.5, L=3.0, sigma2=6.0, delta=2.3, b_simple=90.0),
    ProbeSummary(sparsity=0.9, L=8.0, sigma2=3.0, delta=2.2, b_simple=30.0),
)
EPS = 4 * 4.0 / 50.0  # what the reference probe implies
C_TRUE = 0.037


def world(form="asymptotic", l_factor=None, probes=PROBES):
    """Measured curves that follow the model with scale C_TRUE (optionally a wrong L per level)."""
    l_factor = l_factor or {}
    curves = []
    for p in probes:
        true = ProbeSummary(p.sparsity, p.L * l_factor.get(p.sparsity, 1.0), p.sigma2, p.delta, p.b_simple)
        curves.append(MeasuredCurve(p.sparsity, BATCHES, tuple(predicted_steps(true, EPS, BATCHES, C_TRUE, form))))
    return curves


@pytest.mark.parametrize("form", ["asymptotic", "exact"])
def test_a_world_that_follows_the_model_is_predicted_without_error(form):
    pred = predict_levels(PROBES, world(form), form=form, n_boot=20)
    assert pred.scale == pytest.approx(C_TRUE, rel=1e-9)
    assert pred.eps == pytest.approx(EPS) and pred.eps_source == "reference probe"
    assert pred.fitted == ("scale",)
    for lv in pred.levels:
        assert lv.is_reference == (lv.sparsity == 0.0)
        np.testing.assert_allclose(lv.predicted_steps, lv.measured_steps, rtol=1e-9)
        assert abs(lv.b_crit_error) < 1e-4
        np.testing.assert_allclose(lv.step_ratio_error, 0.0, atol=1e-9)
        assert lv.log_rmse < 1e-9
        sigma2 = {p.sparsity: p.sigma2 for p in PROBES}[lv.sparsity]
        assert lv.b_crit_formula == pytest.approx(4 * sigma2 / EPS)
    # asymptotic form: the fitted B_crit is the formula's 4 sigma^2 / eps
    if form == "asymptotic":
        lv = pred.level(0.5)
        assert lv.b_crit_predicted == pytest.approx(4 * 6.0 / EPS, rel=1e-5)
        assert lv.b_crit_measured == pytest.approx(4 * 6.0 / EPS, rel=1e-5)


def test_step_ratio_errors_expose_a_wrong_smoothness_estimate():
    # the sparse network really has twice the probed L: steps double at every B, B_crit is unchanged
    pred = predict_levels(PROBES, world(l_factor={0.9: 2.0}), n_boot=20)
    lv = pred.level(0.9)
    np.testing.assert_allclose(lv.step_ratio_error, -0.5, rtol=1e-9)
    np.testing.assert_allclose(lv.step_ratio_measured, 2.0 * lv.step_ratio_predicted, rtol=1e-9)
    assert abs(lv.b_crit_error) < 1e-4
    assert np.allclose(pred.level(0.5).step_ratio_error, 0.0, atol=1e-9)


def test_only_the_reference_curve_is_used_for_calibration():
    base = predict_levels(PROBES, world(), n_boot=20)
    other = predict_levels(PROBES, world(l_factor={0.5: 3.0, 0.9: 0.1}), n_boot=20)
    assert other.scale == base.scale
    # calibrating on another level changes the scale by exactly that level's L error
    moved = predict_levels(PROBES, world(l_factor={0.5: 3.0}), reference=0.5, eps=EPS, n_boot=20)
    assert moved.scale == pytest.approx(3.0 * C_TRUE)
    assert moved.level(0.5).is_reference and not moved.level(0.0).is_reference


def test_noise_scale_route_and_given_eps():
    pred = predict_levels(PROBES, world(), eps=0.5, n_boot=20)
    assert pred.eps == 0.5 and pred.eps_source == "given"
    lv = pred.level(0.5)
    # the measured curves were built with EPS, so B_crit measured = 4 sigma^2 / EPS
    assert lv.b_crit_measured == pytest.approx(4 * 6.0 / EPS, rel=1e-5)
    assert lv.b_crit_predicted == pytest.approx(4 * 6.0 / 0.5, rel=1e-5)
    assert lv.b_crit_noise_scale_error == pytest.approx(90.0 / (4 * 6.0 / EPS) - 1.0, rel=1e-5)
    rows = pred.rows()
    assert [r["role"] for r in rows] == ["calibrated", "predicted", "predicted"]
    assert rows[1]["b_crit_error"] == pytest.approx(lv.b_crit_error)


def test_replicate_seeds_are_averaged_in_log_space():
    p = PROBES[0]
    steps = predicted_steps(p, EPS, BATCHES, C_TRUE)
    b = BATCHES + BATCHES
    s = tuple(steps * 1.1) + tuple(steps / 1.1)
    curve = MeasuredCurve(0.0, b, s, seeds=(0,) * len(BATCHES) + (1,) * len(BATCHES))
    pred = predict_levels([p], [curve], n_boot=20)
    assert pred.scale == pytest.approx(C_TRUE, rel=1e-9)
    np.testing.assert_allclose(pred.levels[0].measured_steps, steps, rtol=1e-9)


def test_missing_points_leave_nan_ratios():
    curves = world()
    short = MeasuredCurve(0.9, BATCHES[:5] + (1e6,), curves[2].steps[:5] + (curves[2].steps[-1],))
    pred = predict_levels(PROBES, [curves[0], short], n_boot=20)
    lv = pred.level(0.9)
    assert np.isnan(lv.step_ratio_error[-1]) and np.all(np.isfinite(lv.step_ratio_error[:-1]))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: predict_levels(PROBES, world(), reference=0.7), "reference sparsity"),
        (lambda: predict_levels(PROBES[:1], world()), "no probe estimates"),
        (lambda: predict_levels(PROBES + PROBES[:1], world()), "two entries"),
        (lambda: predict_levels([ProbeSummary(0.0, 1.0, 1.0, 1.0)], world()[:1]), "b_simple"),
        (lambda: predict_levels(PROBES, world(), form="linear"), "form"),
        (lambda: predict_levels(PROBES, world(), eps=-1.0), "eps"),
        (lambda: predict_levels(PROBES, [MeasuredCurve(0.0, (1.0, 2.0), (3.0,))]), "same length"),
        (lambda: predict_levels(PROBES, [MeasuredCurve(0.0, (1.0, 2.0, 4.0), (3.0, np.nan, 1.0))]), "positive"),
        (lambda: predict_levels(PROBES, [(0.0, BATCHES)]), "MeasuredCurve"),
        (lambda: ProbeSummary(0.0, L=-1.0, sigma2=1.0, delta=1.0), "L must be positive"),
        (lambda: ProbeSummary(1.0, L=1.0, sigma2=1.0, delta=1.0), "sparsity"),
        (lambda: predict_levels([], []), "empty"),
    ],
)
def test_bad_input_raises_a_clear_error(call, match):
    with pytest.raises(TheoryError, match=match):
        call()


def test_predicted_steps_use_the_bound_functions():
    p = PROBES[1]
    np.testing.assert_allclose(predicted_steps(p, EPS, BATCHES, 2.0, "exact"),
                               2.0 * bounds.sgd_steps(p.L, p.sigma2, p.delta, EPS, np.array(BATCHES)))
    np.testing.assert_allclose(predicted_steps(p, EPS, BATCHES),
                               2 * p.L * p.delta / EPS * (1 + 4 * p.sigma2 / EPS / np.array(BATCHES)))


def test_probe_summary_from_a_noise_estimate():
    from theory.estimators.noise import FiniteSetNoise, NoiseEstimate

    nan = float("nan")
    est = NoiseEstimate(g_sq=0.5, trace_sigma=4.0, b_simple=8.0, b_noise=nan, n=100, n_params=10,
                        loss=2.3, trace_h_sigma=nan, g_h_g=nan, hessian_examples=0, population=100,
                        g_sq_se=0.0, trace_sigma_se=0.0, b_simple_se=0.0,
                        finite=FiniteSetNoise(0.5, 4.0, 8.0, nan, nan, nan))
    p = ProbeSummary.from_noise(0.5, est, L=3.0)
    assert (p.sparsity, p.L, p.sigma2, p.delta, p.b_simple) == (0.5, 3.0, 4.0, 2.3, 8.0)
    assert ProbeSummary.from_noise(0.5, est, L=3.0, delta=1.0).delta == 1.0


def test_seed_sets_the_bootstrap():
    noisy = [MeasuredCurve(c.sparsity, c.batch_sizes,
                           tuple(np.asarray(c.steps) * np.exp(np.random.default_rng(1).normal(
                               0.0, 0.1, len(c.steps))))) for c in world()]
    pred = predict_levels(PROBES, noisy, n_boot=30, seed=3)
    again = predict_levels(PROBES, noisy, n_boot=30, seed=3)
    assert pred.level(0.5).b_crit_interval == again.level(0.5).b_crit_interval
    assert pred.level(0.5).b_crit_interval != predict_levels(
        PROBES, noisy, n_boot=30, seed=4).level(0.5).b_crit_interval


def test_given_fits_are_used_instead_of_refitting():
    """``fits=``: a caller's fit of a level (e.g. with more replicates) is the one reported."""
    from dataclasses import replace

    from theory.models.scaling import fit_scaling

    curves = world()
    own = fit_scaling(curves[1].batch_sizes, curves[1].steps, n_boot=20)
    given = replace(own, b_crit=2 * own.b_crit, intervals={**own.intervals, "b_crit": (1.0, 2.0)})
    pred = predict_levels(PROBES, curves, n_boot=20, fits={0.5: given})
    level = pred.level(0.5)
    assert level.b_crit_measured == given.b_crit and level.b_crit_interval == (1.0, 2.0)
    assert level.b_crit_error == pytest.approx(level.b_crit_predicted / given.b_crit - 1.0)
    # the other levels are fitted as before
    assert pred.level(0.9).b_crit_measured == predict_levels(PROBES, curves, n_boot=20).level(
        0.9).b_crit_measured
