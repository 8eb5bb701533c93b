"""Importers: measurements published by others, read into this library's results store.

``batch_science``: Shallue et al. (2019)'s archive of steps-to-result studies
(:func:`experiments.importers.batch_science.import_batch_science`).
"""

from .batch_science import ArchiveError, import_batch_science

__all__ = ["ArchiveError", "import_batch_science"]
