"""Results in and out: Shallue et al. (2019)'s ``batch_science`` archive read into stores
(:mod:`experiments.exchange.batch_science_tree` reads the tree,
:mod:`experiments.exchange.batch_science` writes the store), and a store's curves exported as
TensorBoard event files (:mod:`experiments.exchange.export`)."""

from experiments.exchange.batch_science import ArchiveError, ArchiveIOError, import_batch_science

__all__ = ["ArchiveError", "ArchiveIOError", "import_batch_science"]
