"""sparsescale.experiments: study specs, search, store, runner, reports and the CLI."""
