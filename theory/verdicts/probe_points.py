"""Where to probe a study: which batch sizes, and which steps along each run.

Noise and smoothness change along training (B_simple grows as the loss falls, McCandlish et al.
2018, sec. 3; Lee et al. 2021 track L every 1000 steps of the run), so a probe must cover the
whole run, not its first steps: :func:`probe_steps` spaces K points evenly over [0, H], H the
run's steps-to-result; :func:`stage_steps` gives the steps of Lee et al.'s stage instead, every N
steps of the run (N, 2N, ... up to H; never step 0). The batch sizes should span the fitted
regimes: :func:`probe_batch_sizes`
picks, by default, the smallest batch size that reached the goal, the one nearest the fitted
B_crit, and the largest that reached it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from theory.errors import TheoryError, check_int

DEFAULT_POINTS = 10
BATCH_RULES = ("smallest", "b_crit", "largest")
DEFAULT_BATCH_CHOICE = BATCH_RULES


def probe_steps(horizon: int, points: int = DEFAULT_POINTS) -> tuple[int, ...]:
    """``points`` evenly spaced steps of [0, ``horizon``], both ends included:
    round(k H / (K - 1)) for k = 0..K-1 (distinct, so fewer when H < K - 1; one point, step 0,
    when K = 1 or H = 0)."""
    check_int(horizon, "horizon", minimum=0)
    check_int(points, "points")
    if points == 1:
        return (0,)
    return tuple(sorted({int(s) for s in np.rint(np.linspace(0, horizon, points))}))


def stage_steps(horizon: int, every: int, start: int | None = None) -> tuple[int, ...]:
    """The steps k ``every`` >= ``start`` (default ``every``) for k = 1, 2, ... up to
    ``horizon`` (H, the run's goal step or budget), where Lee et al. (2021) measure L: their
    ``edps/train.py`` logs it at iteration k ``lipschitz_interval`` (default 1,000) while the
    run goes on, until the goal or the budget ends it; never at initialization. Empty when
    H < ``every``."""
    check_int(horizon, "horizon", minimum=0)
    check_int(every, "every")
    first = every if start is None else max(every, every * -(-check_int(start, "start") // every))
    return tuple(range(first, horizon + 1, every))


def probe_batch_sizes(reached: Sequence[int], b_crit: float | None,
                      choose: Sequence[str | int] = DEFAULT_BATCH_CHOICE) -> tuple[int, ...]:
    """Batch sizes to probe, ascending and distinct, from those that ``reached`` the goal.

    ``choose`` lists rules and explicit batch sizes: ``"smallest"`` / ``"largest"`` reached,
    ``"b_crit"`` the reached batch size nearest the fitted ``b_crit`` in log distance among
    those strictly between the smallest and the largest when there are any (ties: the smaller; the geometric middle of ``reached`` when ``b_crit`` is None, i.e. no fit), or an
    integer, which must be one of ``reached`` (a run that never met the goal has no
    steps-to-result to probe up to).
    """
    sizes = sorted({check_int(b, "reached batch size") for b in reached})
    if not sizes:
        raise TheoryError("reached is empty: no batch size met the goal, nothing to probe")
    if b_crit is not None and not (math.isfinite(b_crit) and b_crit > 0):
        raise TheoryError(f"b_crit must be positive and finite or None, got {b_crit!r}")
    target = math.sqrt(sizes[0] * sizes[-1]) if b_crit is None else b_crit
    out = set()
    for rule in choose:
        if rule == "smallest":
            out.add(sizes[0])
        elif rule == "largest":
            out.add(sizes[-1])
        elif rule == "b_crit":
            # between the smallest and the largest when there is room, so the default rules
            # give three batch sizes even when the fit puts B_crit at an edge of the sweep
            inner = sizes[1:-1] or sizes
            out.add(min(inner, key=lambda b: (abs(math.log(b / target)), b)))
        elif isinstance(rule, (int, np.integer)) and not isinstance(rule, bool):
            if int(rule) not in sizes:
                raise TheoryError(f"probe batch size {rule} did not reach the goal; "
                                  f"allowed: {', '.join(map(str, sizes))} or {', '.join(BATCH_RULES)}")
            out.add(int(rule))
        else:
            raise TheoryError(f"probe batch choice {rule!r}; allowed: {', '.join(BATCH_RULES)} "
                              f"or a batch size that reached the goal")
    return tuple(sorted(out))
