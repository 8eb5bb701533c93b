"""The research scripts run end to end on tiny settings, so they never rot."""

import math

from experiments.scripts import fit_scaling_curve, noise_across_sparsity


def test_fit_scaling_curve_tiny(capsys):
    fit = fit_scaling_curve.main(tiny=True)
    out = capsys.readouterr().out
    assert "S_min" in out and "B_crit" in out
    assert fit.s_min > 0 and math.isfinite(fit.b_crit) and fit.b_crit > 0
    # the fitted curve decreases with the batch size, as S_min (1 + B_crit / B) must
    assert fit.predict(4) > fit.predict(256) >= fit.s_min


def test_noise_across_sparsity_tiny(capsys):
    rows = noise_across_sparsity.main(tiny=True)
    assert [r["sparsity"] for r in rows] == [0.0, 0.5, 0.8]
    for r in rows:
        # B_simple is tr(Sigma) / |G|^2 by definition
        assert r["b_simple"] == r["trace_sigma"] / r["g_sq"]
        assert r["hessian_top"] > 0 and r["loss"] > 0
    assert "L / L_dense" in capsys.readouterr().out
