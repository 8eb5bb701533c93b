"""Studies on a device: the store records where and in which arithmetic each group trained, a
missing GPU is refused before anything is written, and the local pool gives each worker its own
GPU (simulated: CUDA is absent here; tests/gpu/ runs the real thing)."""

import multiprocessing
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest
import torch

import experiments
import training
from experiments.run import executors
from experiments.run.workload import Workload
from experiments.spec.study import loads

from ..conftest import TINY

BF16 = TINY.replace('model = "mlp"\n', 'model = "mlp"\nprecision = "bf16"\n') \
           .replace("sparsities = [0.0, 0.5]", "sparsities = [0.0]") \
           .replace("batch_sizes = [8, 32, 128]", "batch_sizes = [32]")


def test_groups_record_device_versions_and_precision(tmp_path):
    toml = tmp_path / "bf16.toml"
    toml.write_text(BF16)
    run_dir = experiments.run_study(toml, out=tmp_path / "run", quiet=True, report=False,
                                    executor=ThreadPoolExecutor(1))
    g = experiments.load_results(run_dir).groups.iloc[0]
    info = training.device.device_info("cpu")
    assert g.status == "done", g.error
    assert (g.device, g.device_name, g.precision, g.program) == ("cpu", info.name, "bf16",
                                                                 "batched")
    assert pd.isna(g.cuda_version) and pd.isna(g.driver_version)
    from experiments.report.write import write_report

    text = (write_report([run_dir], run_dir).parent / "report.md").read_text()
    assert "| bf16 |" in text and f"{info.name} (cpu)" in text


def test_a_study_on_a_missing_gpu_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    spec = loads(TINY.replace('model = "mlp"\n', 'model = "mlp"\ndevice = "cuda"\n'))
    with pytest.raises(training.device.DeviceError,
                       match="workload.device: no CUDA device was found"):
        experiments.run_study(spec, out=tmp_path / "run", quiet=True, report=False)
    assert not (tmp_path / "run").exists()


def test_one_worker_per_visible_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert executors.default_workers("cuda") == 3
    assert executors.default_workers("cuda:1") == 1
    assert executors.default_workers("cpu") == executors.default_workers()
    counter = multiprocessing.get_context("spawn").Value("i", 0)
    # workers take the GPUs in turn as they start (and again after a pool is respawned)
    assert [executors.worker_gpu(counter) for _ in range(5)] == [0, 1, 2, 0, 1]


def test_the_pool_of_a_cuda_study_hands_its_workers_a_gpu_counter(monkeypatch):
    made = {}

    class Pool:
        def __init__(self, **kw):
            made.update(kw)

    monkeypatch.setattr(executors, "LocalPool", Pool)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    executors.local_pool(None, "cuda")
    assert made["max_workers"] == 2 and made["initargs"][0].value == 0
    executors.local_pool(4, "cuda:0")
    assert made["max_workers"] == 4 and made["initargs"] == (None,)


def test_a_worker_makes_its_gpu_current(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr("training.processes.setup.setup_training_process", lambda: True)
    import signal

    before = signal.getsignal(signal.SIGINT)
    threads = torch.get_num_threads()
    counter = multiprocessing.get_context("spawn").Value("i", 0)
    try:
        executors._init_worker(counter)
        executors._init_worker(counter)
        executors._init_worker(counter)
    finally:
        signal.signal(signal.SIGINT, before)
        torch.set_num_threads(threads)
    assert chosen == [0, 1, 0]


def test_the_data_set_is_copied_to_a_device_once_per_process(monkeypatch):
    """A worker's groups share one copy on its GPU (simulated by a CPU "device" that still
    copies: the cache, not the copy, is under test)."""
    from experiments.run import workload as module

    monkeypatch.setattr(training.device, "resolve_device", lambda d: torch.device("cpu"))
    module._dataset_on.cache_clear()
    workload = Workload.of(loads(TINY))
    assert workload.load_dataset("cpu") is workload.load_dataset()
    first = workload.load_dataset("cuda")
    assert first is workload.load_dataset("cuda") and first is not workload.load_dataset()
    assert torch.equal(first.x_train, workload.load_dataset().x_train)
    module._dataset_on.cache_clear()
