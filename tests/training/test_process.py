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
    from training.processes.setup import tune_allocator

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
    code = ("import training, training.processes.setup as p; ds = training.data.load('teacher', n=100, "
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
from training.processes.setup import setup_training_process
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



# A driver that starts one process with multiprocessing's spawn, as a study's pool and the DDP
# launcher do; the child watches its parent, prints its pid, then sleeps as an idle worker would.
ORPHAN_DRIVER = """import multiprocessing, sys, time

def child():
    from training.processes.lifetime import exit_with_parent
    exit_with_parent(poll=0.1)
    print("child", multiprocessing.current_process().pid, flush=True)
    time.sleep(600)

if __name__ == "__main__":
    multiprocessing.get_context("spawn").Process(target=child).start()
    time.sleep(600)
"""


def test_a_child_exits_by_itself_when_its_parent_is_killed(tmp_path):
    """SIGKILL of the parent alone (the OOM killer's choice) runs none of its cleanup; the child
    sees its parent gone within ``poll`` seconds and exits (it would otherwise sleep on,
    reparented to init)."""
    import os
    import signal
    import time

    script = tmp_path / "driver.py"
    script.write_text(ORPHAN_DRIVER)
    env = {**os.environ, "PYTHONPATH": str(Path(training.__file__).parents[1])}
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        line = driver.stdout.readline()
        assert line.startswith("child "), line
        child = int(line.split()[1])
        driver.kill()
        driver.wait(timeout=30)
        deadline = time.time() + 10
        while time.time() < deadline and running(child):
            time.sleep(0.05)
        assert not running(child)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        if "child" in locals() and running(child):
            os.kill(child, signal.SIGKILL)


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting for its reaper has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
