"""From probes to verdicts: where to probe a study (:mod:`~theory.verdicts.probe_points`), the
probes along a run (:mod:`~theory.verdicts.trajectory`), their summaries per level
(:mod:`~theory.verdicts.summaries`), and the papers' claims judged against the measurements
(:mod:`~theory.verdicts.claims`)."""
