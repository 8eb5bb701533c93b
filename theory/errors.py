"""The error raised for invalid input to the theory functions (fits, bounds, models), and the
integer check they share."""

import numpy as np
from training.errors import SparsescaleError


class TheoryError(SparsescaleError, ValueError):
    """Bad input to a theory function: names the argument and what is allowed."""


def check_int(value: object, name: str, minimum: int = 1) -> int:
    """``value`` as an ``int`` if it is an integer (Python or numpy, not a bool) >= ``minimum``;
    otherwise a :class:`TheoryError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise TheoryError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)
