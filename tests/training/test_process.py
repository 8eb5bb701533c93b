"""Process setup for training: the allocator tuning and who calls it."""

import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import training


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_tuned_allocator_reuses_freed_activations():
    from training.process import setup_training_process

    assert setup_training_process()
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
            "import pruning, theory; print(p._allocator_tuned)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(training.__file__).resolve().parents[1])
    assert out.stdout.strip() == "False"

