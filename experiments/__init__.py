"""sparsescale.experiments: study specs, search, store, runner, reports and the CLI.

Public API::

    run_dir = experiments.run_study("experiments/configs/quickstart.toml", out="runs/quickstart")
    res = experiments.load_results(run_dir)     # pandas DataFrames: study, groups, trials, ...
    spec = experiments.load_spec("quickstart")  # validated Spec (raises SpecError)
    # your own model and data set: factories by import path, or the functions themselves
    run_dir = experiments.run_study("my/spec.toml", model="mymodels:mlp", dataset=mymodels.blobs)
    cbs = experiments.branch_critical_batch(net, ds, trial, run)   # CBS(t) by branching
    advice = experiments.advise(experiments.load_spec("quickstart"))  # a batch size, no sweep
    # a measurement of your own: a Measurement subclass, named in a spec by import path
    # (measures = ["mymeasures:WeightNorm"]; experiments.measurement)
"""

from experiments.run.advise import Advice, AdviceError, advise, write_advice
from experiments.run.branching import branch_critical_batch, warmup_comparison
from experiments.spec.factories import FactoryError
from experiments.spec.plan import plan
from experiments.run.runner import run_study
from experiments.spec.study import Spec, SpecError, SpecIOError
from experiments.spec.study import load as load_spec
from experiments.spec.study import loads as loads_spec
from experiments.store.database import StoreContentError, StoreError, StoreIOError
from experiments.store.results import Results, load_results
# every kind of measurement registers itself (experiments.measurement.MEASURES)
import experiments.measures  # noqa: E402,F401

__all__ = ["advise", "Advice", "AdviceError", "write_advice", "branch_critical_batch", "warmup_comparison", "FactoryError", "plan", "run_study", "Spec",
           "SpecError", "SpecIOError", "load_spec", "loads_spec", "Results", "StoreError",
           "StoreContentError", "StoreIOError", "load_results"]
