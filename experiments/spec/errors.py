"""The errors of a study spec: :class:`SpecError` for an invalid spec (one line per problem,
key path first), :class:`SpecIOError` for a spec file that cannot be read."""

from training.errors import SparsescaleError, SparsescaleIOError


class SpecError(SparsescaleError, ValueError):
    """A study spec is invalid. ``problems`` holds one line per problem (key path first)."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        super().__init__(head + f"{len(self.problems)} problem(s) in the study spec:\n"
                         + "\n".join(self.problems))


class SpecIOError(SparsescaleIOError):
    """A study spec file cannot be read (missing, unreadable, a folder): names the path."""
