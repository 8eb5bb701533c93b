"""The report's figures: the measurement's and the masks' per-layer density, with the figures'
shared style (:mod:`~experiments.report.figures.measurement`), the probes' and the noisy
quadratic model's (:mod:`~experiments.report.figures.theory`), and LaTeX formulas as inline SVG
(:mod:`~experiments.report.figures.mathsvg`)."""
