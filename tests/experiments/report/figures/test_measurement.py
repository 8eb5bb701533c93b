"""What the figures draw, read back from the matplotlib objects (not from the PNG bytes); the
report test checks the theory figures of a store without probes."""

import numpy as np
import pytest

from experiments.report.figures import measurement as F
from experiments.measures.probes import figures as PF
from experiments.report.runs import load_runs

from experiments.report import analysis as A

from ...synthetic import FRACTIONS, PROBED_BATCHES, PROBES, WOBBLE


def test_b_simple_figure_draws_each_batch_size_against_the_fitted_band(full):
    """One panel per series, one line per probed batch size (B_simple along the run at the
    stored fractions), and the fitted B_crit as a line over its interval band."""
    runs = load_runs([full])
    order = list(runs.order)
    fits = A.fit_series(runs.groups, order)
    fig = PF.b_simple_figure(runs.probes, fits.table, order, F.colors(order))
    for ax, s, series in zip(fig.axes, (0.0, 0.9), order):
        lines = [line for line in ax.lines if line.get_label().startswith("B = ")]
        assert [line.get_label() for line in lines] == [f"B = {b}" for b in PROBED_BATCHES]
        for line in lines:
            np.testing.assert_allclose(line.get_xdata(), FRACTIONS, rtol=1e-12)
            np.testing.assert_allclose(line.get_ydata(), PROBES[s]["b_simple"] * WOBBLE, rtol=1e-12)
        (crit,) = [line for line in ax.lines if line.get_label() == "fitted B_crit"]
        assert crit.get_ydata()[0] == pytest.approx(fits.objects[series].b_crit)


def test_smoothness_figure_sets_dense_beside_sparse(full):
    """L(t) and lambda_max(t): one line per series and probed batch size (the median over
    seeds), never a median over batch sizes: with values that differ by batch size, each
    line holds its own batch size's values."""
    runs = load_runs([full])
    order = list(runs.order)
    probes = runs.probes.copy()
    probes["value"] = probes["value"] * probes["batch_size"]   # tell the batch sizes apart
    fig = PF.smoothness_figure(probes, order, F.colors(order))
    lipschitz, top = fig.axes
    for ax, quantity in ((lipschitz, "local_lipschitz"), (top, "hessian_top")):
        assert len(ax.lines) == len(order) * len(PROBED_BATCHES)
        labels = [f"{name}, B = {b}" for name in order for b in PROBED_BATCHES]
        assert [line.get_label() for line in ax.lines] == labels
        for line, (s, b) in zip(ax.lines, [(s, b) for s in (0.0, 0.9) for b in PROBED_BATCHES]):
            base = PROBES[s]["local_lipschitz"]
            want = base * WOBBLE if quantity == "local_lipschitz" else np.full(10, 1.5 * base)
            np.testing.assert_allclose(line.get_xdata(), FRACTIONS, rtol=1e-12)
            np.testing.assert_allclose(line.get_ydata(), want * b, rtol=1e-12)
