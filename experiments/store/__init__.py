"""The results store: its tables and rows (:mod:`experiments.store.schema`) and the SQLite
database with its guarantees and the reader :func:`~experiments.store.results.load_results`
(:mod:`experiments.store.database`)."""
