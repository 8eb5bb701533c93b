"""The report's gradient-delay axis: :mod:`experiments.report.delay.view` (S(B, tau), critical
delays, fits per delay and the claims' verdicts) and :mod:`experiments.report.delay.section` (the
section that shows them)."""
