"""A tiny study with ``[workload] device = "cuda"``: the local pool's workers on the GPU(s), the
store's device columns, and the same steps-to-result as the same study on the CPU up to float32
rounding (a goal met at an evaluation on one device may be met one evaluation later on the
other when a trial's metric sits on the target)."""

from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import torch

import experiments
from experiments.spec.study import loads
from tests.experiments.conftest import TINY as CPU_TINY

# the CPU tests' tiny study, on cuda, with its probes on
TINY = (CPU_TINY.replace("model_options = {hidden = [16]}\n",
                         'model_options = {hidden = [16]}\ndevice = "cuda"\n')
        .replace("enabled = false", 'enabled = true\nbatch_sizes = ["smallest"]\npoints = 3\n'
                                    "examples = 128\ncurvature_examples = 128"))


def test_a_study_on_cuda_runs_records_its_device_and_agrees_with_the_cpu(tmp_path):
    gpu = experiments.run_study(loads(TINY), out=tmp_path / "gpu", quiet=True, report=True)
    res = experiments.load_results(gpu)
    g = res.groups
    assert set(g.status) == {"done"}, g.error.tolist()
    assert set(g.device) <= {f"cuda:{i}" for i in range(torch.cuda.device_count())}
    assert set(g.device_name) == {torch.cuda.get_device_name(0)}
    assert g.cuda_version.notna().all() and set(g.precision) == {"fp32"}
    assert set(g.program) == {"batched"}
    assert len(res.probes) > 0 and res.probes.value.notna().all()
    assert "cuda:" in (gpu / "report.md").read_text()
    cpu_spec = loads(TINY.replace('device = "cuda"\n', ""))
    assert cpu_spec.hash == loads(TINY).hash   # the device is not part of the study
    cpu = experiments.run_study(cpu_spec, out=tmp_path / "cpu", quiet=True, report=False,
                                probes=False, executor=ThreadPoolExecutor(1))
    a = g.set_index("key").steps_to_result
    b = experiments.load_results(cpu).groups.set_index("key").steps_to_result
    assert set(a.index) == set(b.index)

    def same(x, y) -> bool:   # equal, or one evaluation apart
        if pd.isna(x) or pd.isna(y):
            return bool(pd.isna(x) and pd.isna(y))
        return abs(int(x) - int(y)) <= 10

    differ = [k for k in a.index if not same(a[k], b[k])]
    assert len(differ) <= 1, (a.to_dict(), b.to_dict())
