"""What the figures draw, read back from the matplotlib objects (not from the PNG bytes); the
report test checks the theory figures of a store without probes."""

import numpy as np
import pytest

from experiments.report import figures as F
from experiments.report import theory_figures as TF
from experiments.report.runs import load_runs

from experiments.report import analysis as A

from ..synthetic import FRACTIONS, PROBED_BATCHES, PROBES, WOBBLE


def test_b_simple_figure_draws_each_batch_size_against_the_fitted_band(full):
    """One panel per series, one line per probed batch size (B_simple along the run at the
    stored fractions), and the fitted B_crit as a line over its interval band."""
    runs = load_runs([full])
    order = list(runs.order)
    fits = A.fit_series(runs.groups, order)
    fig = TF.b_simple_figure(runs.probes, fits.table, order, F.colors(order))
    for ax, s, series in zip(fig.axes, (0.0, 0.9), order):
        lines = [line for line in ax.lines if line.get_label().startswith("B = ")]
        assert [line.get_label() for line in lines] == [f"B = {b}" for b in PROBED_BATCHES]
        for line in lines:
            np.testing.assert_allclose(line.get_xdata(), FRACTIONS, rtol=1e-12)
            np.testing.assert_allclose(line.get_ydata(), PROBES[s]["b_simple"] * WOBBLE, rtol=1e-12)
        (crit,) = [line for line in ax.lines if line.get_label() == "fitted B_crit"]
        assert crit.get_ydata()[0] == pytest.approx(fits.objects[series].b_crit)


def test_smoothness_figure_sets_dense_beside_sparse(full):
    """L(t) and lambda_max(t), one line per series, medians over seeds and batch sizes."""
    runs = load_runs([full])
    order = list(runs.order)
    fig = TF.smoothness_figure(runs.probes, order, F.colors(order))
    lipschitz, top = fig.axes
    for s, line in zip((0.0, 0.9), lipschitz.lines):
        np.testing.assert_allclose(line.get_ydata(), PROBES[s]["local_lipschitz"] * WOBBLE, rtol=1e-12)
    for s, line in zip((0.0, 0.9), top.lines):
        np.testing.assert_allclose(line.get_ydata(), 1.5 * PROBES[s]["local_lipschitz"], rtol=1e-12)
