"""Process setup for training: the allocator tuning, subnormal flushing and who calls them."""

import platform
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import training


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_tuned_allocator_reuses_freed_activations():
    from training.process import tune_allocator

    assert tune_allocator()
    x = torch.ones(16, 512, 100)  # 3.3 MB, like one activation of a stack at B = 512

    def page_faults():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(20):
            a = torch.relu(x)
            b, c = a * 2, torch.ones(16, 100, 100)
            d = b + 1
            del a, b, c, d
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    page_faults()
    # without the tuning glibc trims and re-faults: about 51000 faults for this loop; other
    # tests in the same process leave a fragmented heap, so allow a tenth of that
    assert page_faults() < 5000


def test_library_calls_leave_the_process_alone():
    """Importing the packages and training a group does not tune the allocator: only a process
    owner (the CLI, a worker initializer, a benchmark) does."""
    code = ("import training, training.process as p; ds = training.data.load('teacher', n=100, "
            "dim=4, num_classes=2); net = training.models.build('linear', ds); "
            "training.train_trials(net, ds, [{'lr': 0.1}], training.RunConfig(8, max_steps=2)); "
            "import pruning, theory, torch; print(p._allocator_tuned, "
            "float(torch.tensor([1e-39]) * 1.0) > 0)")
    assert run_python(code) == "False True"  # allocator untouched, subnormals kept


def run_python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(training.__file__).resolve().parents[1])
    return out.stdout.strip()


FLUSHED_KERNEL = """
import torch, training
from training.process import setup_training_process
from training.engine.programs.fused import try_build
torch.set_num_threads(2)
net = torch.nn.Sequential(torch.nn.Linear(40, 3, bias=False))
program = try_build(net, (40,), torch.float32, "cpu", 8, 8)
# weights 1e-39 (subnormal), inputs 1: 40 products sum to 4e-38 (normal) unless the weights
# read as 0; 8 trials over 2 threads, so some run on the pool's thread, which exists (and has
# run the kernel) before the flags are set
w, x = torch.full((8, 3, 40), 1e-39), torch.ones(8, 5, 40)
before = "no kernel" if program is None else int((program.forward([w], x) == 0).sum())
print(bool(setup_training_process()), float(torch.tensor([1e-39]) * 1.0), before)
if program is not None:
    print(int((program.forward([w], x) == 0).sum()), x.shape[0] * x.shape[1] * 3)
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 FTZ / DAZ")
def test_training_processes_flush_subnormals_on_every_kernel_thread():
    """setup_training_process flushes subnormals (1e-39 * 1 is 0), and the compiled kernel
    computes every trial with its caller's flags, whichever thread runs it: all outputs of
    subnormal weights are 0, none is the 4e-38 that IEEE arithmetic gives."""
    lines = run_python(FLUSHED_KERNEL).splitlines()
    flushed, zero, before = lines[0].split(maxsplit=2)
    assert (flushed, zero) == ("True", "0.0")
    if before != "no kernel":
        assert before == "0"  # IEEE arithmetic before the setup: no output is 0
        assert lines[1] == "120 120"

