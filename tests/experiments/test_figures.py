"""What the figures draw, read back from the matplotlib objects (not from the PNG bytes); the
report test checks the probe figure of a store without probes."""

import numpy as np
import pytest

from experiments import figures as F
from experiments import theory_figures as TF
from experiments.runs import load_runs

from .synthetic import PROBES


def probes_figure(run_dir):
    runs = load_runs([run_dir])
    order = list(runs.order)
    return runs, TF.probes_figure(runs.probes, order, runs.labels, F.colors(order))


def test_probe_figure_draws_the_stored_medians_and_ranges(full):
    """Top row: per quantity and phase, the median over the stored snapshots at each sparsity
    with bars from the minimum to the maximum; bottom row: each series' trajectory values."""
    runs, fig = probes_figure(full)
    top, bottom = fig.axes[:3], fig.axes[3:]
    wobble = np.array([0.8, 1.0, 1.25])      # the synthetic trajectory's factors (median 1)
    for ax, (q, along) in zip(top, (("local_lipschitz", 1 / wobble), ("hessian_top", np.ones(3)),
                                    ("b_simple", wobble))):
        key = "local_lipschitz" if q != "b_simple" else "b_simple"
        scale = 1.5 if q == "hessian_top" else 1.0
        truth = np.array([scale * PROBES[s][key] for s in (0.0, 0.9)])
        drawn = {c.lines[0].get_marker(): c for c in ax.containers}
        x, y = drawn["s"].lines[0].get_data()          # squares: along training
        assert list(x) == [0.0, 90.0] and y == pytest.approx(truth)
        lo, hi = zip(*[(seg[0][1], seg[1][1]) for seg in drawn["s"].lines[2][0].get_segments()])
        assert lo == pytest.approx(truth * along.min()) and hi == pytest.approx(truth * along.max())
        if q != "local_lipschitz":                     # circles: at initialization
            assert drawn["o"].lines[0].get_data()[1] == pytest.approx(truth)
        else:
            assert "o" not in drawn                    # never measured at initialization
    steps = {tuple(line.get_xdata()) for ax in bottom for line in ax.lines if len(line.get_xdata())}
    assert steps == {(1, 10, 100)}
    lipschitz = np.array([line.get_ydata() for line in bottom[0].lines])
    expected = np.array([PROBES[s]["local_lipschitz"] / wobble for s in (0.0, 0.9)])
    np.testing.assert_allclose(lipschitz, expected, rtol=1e-12)

