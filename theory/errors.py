"""The error raised for invalid input to the theory functions (fits, bounds, models)."""


class TheoryError(ValueError):
    """Bad input to a theory function: names the argument and what is allowed."""
