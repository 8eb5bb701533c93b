"""Running a study: :func:`experiments.run.runner.run_study`, its executors (local process pool,
Dask), the workload a spec names, the pruning series, the probes, branching, the DDP cost model
cache, and where the wall time went."""
