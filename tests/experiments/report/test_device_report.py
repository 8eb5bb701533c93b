"""The report states the device(s) and the precision each run's groups trained with (its cost
and versions table), from the store's device columns."""

import pandas as pd

from experiments.report import analysis as A
from experiments.report import tables as T

RUN = "r"
STUDY = pd.DataFrame([{"run": RUN, "created": "2026-01-01", "lib_version": "1",
                       "torch_version": "2", "python_version": "3"}])
EMPTY = pd.DataFrame(columns=["run", "state"])


def groups(**columns):
    base = {"run": [RUN, RUN], "status": ["done", "done"], "n_trials": [4, 4],
            "trial_steps": [10, 20], "wall_time": [1.0, 2.0]}
    return pd.DataFrame({**base, **columns})


def test_devices_and_precision_of_the_groups():
    g = groups(device=["cuda:0", "cuda:1"], device_name=["NVIDIA H100 80GB HBM3"] * 2,
               cuda_version=["13.0"] * 2, driver_version=["580.159.04"] * 2,
               precision=["bf16", "bf16"])
    cost = A.cost_table(g, STUDY, EMPTY, EMPTY).iloc[0]
    assert cost.device == ("NVIDIA H100 80GB HBM3 (cuda:0, CUDA 13.0, driver 580.159.04); "
                           "NVIDIA H100 80GB HBM3 (cuda:1, CUDA 13.0, driver 580.159.04)")
    assert cost.precision == "bf16"
    shown = T.cost_table(A.cost_table(g, STUDY, EMPTY, EMPTY)).iloc[0]
    assert shown["precision"] == "bf16" and shown["device"].startswith("NVIDIA H100")


def test_a_cpu_run_names_its_cpu_without_cuda_versions():
    g = groups(device=["cpu", "cpu"], device_name=["Some CPU", "Some CPU"],
               cuda_version=[None, None], driver_version=[None, None], precision=["fp32", None])
    cost = A.cost_table(g, STUDY, EMPTY, EMPTY).iloc[0]
    assert (cost.device, cost.precision) == ("Some CPU (cpu)", "fp32")


def test_a_store_from_before_the_columns_says_not_recorded():
    cost = A.cost_table(groups(), STUDY, EMPTY, EMPTY).iloc[0]
    assert (cost.device, cost.precision) == ("not recorded", "not recorded")
    nulls = groups(device=[None, None], device_name=[None, None], cuda_version=[None, None],
                   driver_version=[None, None], precision=[None, None])
    cost = A.cost_table(nulls, STUDY, EMPTY, EMPTY).iloc[0]
    assert (cost.device, cost.precision) == ("not recorded", "not recorded")
