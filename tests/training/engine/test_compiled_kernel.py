"""The compiled kernel's fallback: without a compiler, without ninja or when the build fails,
training runs the eager program with the same results, one warning naming why, and records the
kernel that ran; under SPARSESCALE_REQUIRE_KERNEL=1 (CI) the same failures are errors, in the
library and in the test suite."""

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path

import pytest
import torch

import training
from training import EvalSchedule, RunConfig, Trial
from training.engine import compiled_kernel as kernels
from training.engine import kernel_cache
from training.engine.strategy import ruled_strategy

from tests.reliability.driver_kills import TINY_SOURCE


@pytest.fixture
def fresh_build(monkeypatch):
    """A process that has not tried to build the kernel yet (and one that tries again after)."""
    monkeypatch.delenv(kernels.DISABLE_ENV, raising=False)
    kernels._build.cache_clear()
    yield
    kernels._build.cache_clear()


@pytest.fixture
def empty_cache(monkeypatch, tmp_path):
    """An extension cache without a complete build: a broken builder is called."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))


@pytest.fixture
def fallback_allowed(monkeypatch):
    """SPARSESCALE_REQUIRE_KERNEL unset, as for a user (CI sets it): the tests of the fallback
    test it on every machine."""
    monkeypatch.delenv(kernels.REQUIRE_ENV, raising=False)


def train(net, ds):
    run = RunConfig(16, "momentum", max_steps=12, seed=1, dtype=torch.float64,
                    eval_schedule=EvalSchedule(every=4))
    return training.train_trials(net, ds, [Trial(lr=0.05, momentum=0.9), Trial(lr=0.1)], run)


def kernel_warnings(record):
    return [w for w in record if issubclass(w.category, kernels.KernelWarning)]


def test_a_failing_build_falls_back_with_one_warning(fresh_build, fallback_allowed, monkeypatch,
                                                     mnist1d_small, empty_cache):
    def broken(**kwargs):
        raise RuntimeError("Error building extension 'x':\n[1/2] c++ -c a.cpp\n"
                           "a.cpp:1:10: fatal error: Python.h: No such file or directory\n")

    monkeypatch.setattr("torch.utils.cpp_extension.load", broken)
    net = training.models.build("mlp", mnist1d_small, hidden=[16], seed=0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        res = train(net, mnist1d_small)
        again = train(net, mnist1d_small)
    [w] = kernel_warnings(record)
    message = str(w.message)
    assert "'fused_sequential' is unavailable" in message and "'batched'" in message
    assert "fatal error: Python.h: No such file or directory" in message
    assert res.program == again.program == "batched"
    # the same numbers as the eager program chosen on purpose
    with kernels.disabled():
        assert ruled_strategy(net, "classification", (40,), 16, 2).name == "batched"
        eager = train(net, mnist1d_small)
    for name, p in eager.params.items():
        assert torch.equal(res.params[name], p)


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_without_a_compiler_adam_gives_the_kernels_results(fresh_build, monkeypatch,
                                                           mnist1d_small, optimizer,
                                                           kernel_or_skip):
    """Adam / AdamW inside the kernel and in the eager fallback (no compiler): the same weights
    to 1e-10 relative in float64 (Adam's tolerance of the equivalence tests), masks included."""
    kernel_or_skip()   # the kernel's side: skipped without it, failed under the variable
    monkeypatch.delenv(kernels.REQUIRE_ENV, raising=False)   # the fallback's side
    net = training.models.build("mlp", mnist1d_small, hidden=[16], seed=0)
    masks = {"1.weight": (torch.rand(16, 40, generator=torch.Generator().manual_seed(0))
                          > 0.5).double()}
    run = RunConfig(16, optimizer, max_steps=12, seed=1, dtype=torch.float64,
                    eval_schedule=EvalSchedule(every=4))
    trials = [Trial(lr=0.01, beta1=0.8, weight_decay=0.1), Trial(lr=0.003, beta2=0.99, eps=1e-6)]
    fused = training.train_trials(net, mnist1d_small, trials, run, masks=masks)
    kernels._build.cache_clear()
    monkeypatch.setenv("CXX", "no-such-compiler-x9")
    with pytest.warns(kernels.KernelWarning, match="no C\\+\\+ compiler"):
        eager = training.train_trials(net, mnist1d_small, trials, run, masks=masks)
    assert (fused.program, eager.program) == ("fused", "batched")
    for name, p in eager.params.items():
        torch.testing.assert_close(fused.params[name], p, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("require", [None, "0", ""])
def test_no_compiler_is_named(fresh_build, fallback_allowed, monkeypatch, require):
    """Without SPARSESCALE_REQUIRE_KERNEL (unset, 0 or empty): the warning and the fallback."""
    if require is not None:
        monkeypatch.setenv(kernels.REQUIRE_ENV, require)
    monkeypatch.setenv("CXX", "no-such-compiler-x9")
    with pytest.warns(kernels.KernelWarning, match=r"no C\+\+ compiler \('no-such-compiler-x9' "
                                                   r"not found; install one, e\.g\. g\+\+, or "
                                                   r"set CXX\)"):
        assert kernels.fused_sequential() is None


def test_a_required_kernel_without_a_compiler_is_an_error(fresh_build, monkeypatch,
                                                          mnist1d_small):
    """SPARSESCALE_REQUIRE_KERNEL=1: no fallback and no warning, but a KernelError (an OSError)
    naming why, from the kernel and from the trainer that would have used it."""
    monkeypatch.setenv(kernels.REQUIRE_ENV, "1")
    monkeypatch.setenv("CXX", "no-such-compiler-x9")
    net = training.models.build("mlp", mnist1d_small, hidden=[16], seed=0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with pytest.raises(kernels.KernelError) as info:
            kernels.fused_sequential()
        with pytest.raises(kernels.KernelError):
            train(net, mnist1d_small)
    assert kernel_warnings(record) == []
    message = str(info.value)
    assert "'fused_sequential' cannot be built" in message and "no-such-compiler-x9" in message
    assert kernels.REQUIRE_ENV in message and str(kernels.build_directory("fused_sequential")) \
        in message
    assert isinstance(info.value, OSError) and isinstance(info.value, training.SparsescaleError)
    # switched off on purpose, the kernel is not built, so nothing fails
    monkeypatch.setenv(kernels.DISABLE_ENV, "0")
    assert kernels.fused_sequential() is None


def test_a_required_kernel_whose_build_fails_is_an_error(fresh_build, monkeypatch, empty_cache):
    def broken(**kwargs):
        raise RuntimeError("Error building extension 'x':\n"
                           "a.cpp:1:10: fatal error: Python.h: No such file or directory\n")

    monkeypatch.setattr("torch.utils.cpp_extension.load", broken)
    monkeypatch.setenv(kernels.REQUIRE_ENV, "1")
    with pytest.raises(kernels.KernelError, match="fatal error: Python.h"):
        kernels.fused_sequential()
    monkeypatch.delenv(kernels.REQUIRE_ENV)   # unset: the warning and the fallback again
    with pytest.warns(kernels.KernelWarning, match="fatal error: Python.h"):
        assert kernels.fused_sequential() is None


def test_the_suite_fails_a_kernel_test_under_require_and_skips_it_otherwise(
        fresh_build, fallback_allowed, monkeypatch, kernel_or_skip):
    """tests/conftest.py's compiled_kernel_or_skip: where the kernel cannot be built, a test that
    needs it is skipped, unless SPARSESCALE_REQUIRE_KERNEL=1 (CI): then it fails."""
    monkeypatch.setenv("CXX", "no-such-compiler-x9")
    with pytest.warns(kernels.KernelWarning), pytest.raises(pytest.skip.Exception):
        kernel_or_skip()
    kernels._build.cache_clear()
    monkeypatch.setenv(kernels.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="no C\\+\\+ compiler"):
        kernel_or_skip()
    monkeypatch.setenv(kernels.DISABLE_ENV, "0")   # switched off while required: a failure too
    with pytest.raises(pytest.fail.Exception, match="switched off"):
        kernel_or_skip()


def test_no_ninja_is_named(fresh_build, fallback_allowed, monkeypatch):
    which = kernels.shutil.which
    monkeypatch.setattr(kernels.shutil, "which", lambda cmd: None if cmd == "ninja" else which(cmd))
    monkeypatch.setattr(kernels, "_ninja_dir", lambda: None)
    with pytest.warns(kernels.KernelWarning, match=r"ninja not found \(pip install ninja\)"):
        assert kernels.fused_sequential() is None


def test_ninja_of_the_package_is_used_when_not_on_path(monkeypatch):
    ninja = pytest.importorskip("ninja")
    monkeypatch.setattr(kernels.shutil, "which", lambda cmd: None if cmd == "ninja" else "/x")
    assert kernels._ninja_dir() == str(ninja.BIN_DIR) and kernels.missing_tool() is None


def test_disabled_skips_the_kernel_without_a_warning(fresh_build, monkeypatch, mnist1d_small):
    net = training.models.build("cnn1d", mnist1d_small, channels=4, seed=0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        monkeypatch.setenv(kernels.DISABLE_ENV, "0")
        assert kernels.fused_sequential() is None and train(net, mnist1d_small).program == "batched"
        monkeypatch.delenv(kernels.DISABLE_ENV)
        with kernels.disabled():
            assert not kernels.enabled() and train(net, mnist1d_small).program == "batched"
        assert kernels.enabled()
    assert kernel_warnings(record) == []


def test_failure_reason_prefers_the_compiler_error():
    exc = RuntimeError("Error building extension 'x':\nstep 1\nb.cpp:3: error: bad thing\n")
    assert kernels.failure_reason(exc) == "RuntimeError: b.cpp:3: error: bad thing"
    assert kernels.failure_reason(OSError("disk full")) == "OSError: disk full"


def test_build_name_tracks_sources_cpu_and_versions(monkeypatch):
    name = kernels.build_name("fused_sequential")
    assert name.startswith("sparsescale_fused_sequential_") and name == kernels.build_name(
        "fused_sequential")
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    assert kernels.build_name("fused_sequential") != name


def test_the_build_lives_outside_the_source_tree(compiled_kernel):
    module = compiled_kernel
    repo = Path(training.__file__).resolve().parents[1]
    assert not Path(module.__file__).resolve().is_relative_to(repo)


def test_build_directory_follows_torch_extensions_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert kernels.build_directory("fused_sequential") == tmp_path / kernels.build_name(
        "fused_sequential")


def test_what_a_dead_builder_left_is_discarded_under_the_build_lock(
        fresh_build, fallback_allowed, monkeypatch, tmp_path):
    """A process killed while building leaves torch's ``lock`` file (on which torch's loader
    waits for ever), objects and perhaps a half-written library, but no completion record:
    whoever then holds the build lock empties the folder (but the lock) before it builds, from
    a copy of the sources inside the folder."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = kernels.build_directory("fused_sequential")
    folder.mkdir(parents=True)
    for left in ("lock", "fused_sequential.o", f"{folder.name}.so"):
        (folder / left).write_bytes(b"half")
    seen = {}

    def load(**kwargs):
        seen.update(kwargs, left=sorted(p.name for p in folder.iterdir()),
                    holder=(folder / kernel_cache.LOCK_NAME).read_text())
        raise RuntimeError("stop here")

    monkeypatch.setattr("torch.utils.cpp_extension.load", load)
    with pytest.warns(kernels.KernelWarning, match="stop here"):
        assert kernels.fused_sequential() is None
    assert seen["build_directory"] == str(folder) and seen["holder"] == f"{os.getpid()}\n"
    assert seen["left"] == [kernel_cache.LOCK_NAME, kernel_cache.SOURCE_DIR]
    assert seen["sources"] == [str(folder / "src" / "fused_sequential.cpp")]
    assert seen["extra_include_paths"] == [str(folder / "src")]
    assert sorted(p.name for p in (folder / "src").iterdir()) == sorted(
        p.name for p in kernels.SOURCES.iterdir() if p.is_file())


def test_build_name_covers_the_build_but_not_the_checkouts_path(monkeypatch, tmp_path):
    """The folder's name follows the sources' content, the compiler, the flags and torch, never
    the path of the sources: a copy elsewhere (another checkout) names the same folder."""
    name = kernels.build_name("fused_sequential")
    copy = tmp_path / "checkout" / "csrc"
    shutil.copytree(kernels.SOURCES, copy)
    assert kernels.build_name("fused_sequential", copy) == name
    (copy / "fused_sequential.cpp").write_text((copy / "fused_sequential.cpp").read_text() + " ")
    assert kernels.build_name("fused_sequential", copy) != name
    monkeypatch.setenv("CXX", "clang++")
    assert kernels.build_name("fused_sequential") != name
    monkeypatch.delenv("CXX")
    monkeypatch.setattr(kernels, "CFLAGS", (*kernels.CFLAGS, "-g"))
    assert kernels.build_name("fused_sequential") != name


# A builder that never finishes: it takes torch's lock as torch's loader does, then "compiles".
STUCK_BUILDER = """import os, sys, time
from pathlib import Path
import torch.utils.cpp_extension
from training.engine import compiled_kernel

def compiling(**kwargs):
    os.close(os.open(Path(kwargs["build_directory"]) / "lock", os.O_CREAT | os.O_EXCL))
    print("compiling", flush=True)
    time.sleep(600)

torch.utils.cpp_extension.load = compiling
compiled_kernel.load_kernel("tiny", Path(sys.argv[1]), "test", "nothing")
"""
NEXT_BUILDER = """import sys
from pathlib import Path
from training.engine import compiled_kernel
module = compiled_kernel.load_kernel("tiny", Path(sys.argv[1]), "test", "nothing")
print("loaded", module.__name__)
"""


def wait_for(path, text, timeout, proc=None):
    """Wait until file ``path`` holds ``text`` (False after ``timeout`` s or if ``proc`` ended)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and text in path.read_text():
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def tiny(tmp_path, checkout="src"):
    """The tiny kernel's sources in ``tmp_path/checkout`` and an environment whose extension
    cache is ``tmp_path/ext`` (skipped without a compiler or ninja)."""
    if (reason := kernels.missing_tool()) is not None:
        pytest.skip(reason)
    sources = tmp_path / checkout
    sources.mkdir(parents=True)
    (sources / "tiny.cpp").write_text(TINY_SOURCE)
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"),
           kernels.REQUIRE_ENV: "1", "PYTHONPATH": str(Path(training.__file__).parents[1])}
    env.pop(kernels.DISABLE_ENV, None)
    return sources, env


def load_tiny(sources, env) -> subprocess.CompletedProcess:
    """A fresh process that loads (building if need be) the tiny kernel of ``sources``."""
    return subprocess.run([sys.executable, "-c", NEXT_BUILDER, str(sources)], env=env,
                          capture_output=True, text=True, timeout=240)


def test_two_checkouts_of_one_version_share_one_build(tmp_path):
    """Two copies of one kernel's sources at different paths (two checkouts of one commit
    sharing an environment and the cache), each loaded in turn twice: one build in all (one
    line in ninja's log, one "compiling"), where a build command naming the sources' path made
    torch rebuild at every change of checkout."""
    a, env = tiny(tmp_path, "a/csrc")
    b, _ = tiny(tmp_path, "b/csrc")
    runs = [load_tiny(src, env) for src in (a, b, a, b)]
    folder = tmp_path / "ext" / kernels.build_name("tiny", a)
    assert [r.returncode for r in runs] == [0] * 4, [r.stderr for r in runs]
    assert {r.stdout for r in runs} == {f"loaded {folder.name}\n"}
    assert sum(r.stderr.count("compiling the test kernel") for r in runs) == 1
    log = (folder / ".ninja_log").read_text().splitlines()
    assert len([line for line in log if not line.startswith("#")]) == 2   # compile, link


def test_processes_loading_a_complete_build_take_no_lock(tmp_path):
    """With the kernel built, two processes loading it at once while a third holds the build
    lock (a build of another checkout, a long load): neither waits, neither says so."""
    sources, env = tiny(tmp_path)
    assert load_tiny(sources, env).returncode == 0
    folder = tmp_path / "ext" / kernels.build_name("tiny", sources)
    fd = os.open(folder / kernel_cache.LOCK_NAME, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        loaders = [subprocess.Popen([sys.executable, "-c", NEXT_BUILDER, str(sources)], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for _ in range(2)]
        outputs = [proc.communicate(timeout=120) for proc in loaders]
    finally:
        os.close(fd)
        for proc in locals().get("loaders", []):
            if proc.poll() is None:
                proc.kill()
    assert [proc.returncode for proc in loaders] == [0, 0], outputs
    assert outputs == [(f"loaded {folder.name}\n", "")] * 2


def test_a_half_written_build_is_rebuilt_not_loaded(tmp_path):
    """A library cut short (a build killed while linking) without its completion record, or
    with a record of another size, is never imported: the next process builds again."""
    sources, env = tiny(tmp_path)
    assert load_tiny(sources, env).returncode == 0
    folder = tmp_path / "ext" / kernels.build_name("tiny", sources)
    library = folder / f"{folder.name}.so"
    whole = library.read_bytes()
    for record_too in (False, True):
        library.write_bytes(whole[:len(whole) // 2])
        if not record_too:
            (folder / kernel_cache.COMPLETE).unlink()
        again = load_tiny(sources, env)
        assert again.returncode == 0 and again.stdout == f"loaded {folder.name}\n", again.stderr
        assert "compiling the test kernel" in again.stderr
        record = json.loads((folder / kernel_cache.COMPLETE).read_text())
        assert record == {"key": folder.name, "library": library.name,
                          "bytes": library.stat().st_size}


def test_a_build_killed_by_sigkill_does_not_block_the_next_process(tmp_path):
    """The next process waits for a build in progress, says so once on stderr naming the
    builder's pid and folder, and finishes its own build as soon as that builder is killed
    by SIGKILL (which runs no cleanup: torch's lock file stays behind)."""
    sources, env = tiny(tmp_path)
    folder = tmp_path / "ext" / kernels.build_name("tiny", sources)
    logs = {name: tmp_path / f"{name}.log" for name in ("stuck", "next", "next.err")}
    with logs["stuck"].open("w") as out:
        stuck = subprocess.Popen([sys.executable, "-c", STUCK_BUILDER, str(sources)], env=env,
                                 stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_for(logs["stuck"], "compiling\n", 120, stuck), logs["stuck"].read_text()
        with logs["next"].open("w") as out, logs["next.err"].open("w") as err:
            following = subprocess.Popen([sys.executable, "-c", NEXT_BUILDER, str(sources)],
                                         env=env, stdout=out, stderr=err)
        waiting = f"waiting for the kernel build by pid {stuck.pid} in {folder}\n"
        assert wait_for(logs["next.err"], waiting, 120, following), logs["next.err"].read_text()
        assert (folder / "lock").exists()   # torch's lock, as a killed build leaves it
        stuck.kill()
        stuck.wait(timeout=30)
        assert following.wait(timeout=240) == 0, logs["next.err"].read_text()
    finally:
        for proc in (stuck, locals().get("following")):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert logs["next"].read_text() == f"loaded {folder.name}\n"
    assert logs["next.err"].read_text().count("waiting for the kernel build") == 1


def test_a_first_build_says_so_on_stderr_and_a_complete_one_is_silent(
        fresh_build, monkeypatch, tmp_path, capsys):
    """A build takes 30-80 s in the middle of a run (the trainer's first step, the noise
    monitor's first measured step): one line on stderr says what is compiling and where; a
    complete build in the cache is imported without a word, without torch's builder."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = kernels.build_directory("fused_sequential")
    library = folder / f"{folder.name}.so"
    module = types.SimpleNamespace(__file__=str(library))

    def load(**kwargs):
        library.write_bytes(b"library")
        return module

    monkeypatch.setattr("torch.utils.cpp_extension.load", load)
    assert kernels.fused_sequential() is module
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "compiling the training kernel 'fused_sequential'" in err
    assert str(folder) in err
    kernels._build.cache_clear()
    monkeypatch.setattr("torch.utils.cpp_extension.load", None)   # never called again
    monkeypatch.setattr(kernel_cache, "_import", lambda name, path: (name, path))
    assert kernels.fused_sequential() == (folder.name, library)
    assert capsys.readouterr().err == ""


def test_the_update_runs_without_the_gil(compiled_kernel):
    """``update_trial`` lets other Python threads run while it updates: the per_trial program
    calls it from several threads at once, and a kernel holding the GIL through a memory-bound
    update stalled every other trial's Python (forward passes, autograd). A spinning thread
    stamps the time every 2,000 counts while the main thread is inside one call (tens of
    milliseconds of memory traffic): a kernel holding the GIL leaves no stamp inside the call
    but at its edges (the thread waits the whole call), one releasing it leaves no gap longer
    than half the call (measured: about 1 ms)."""
    import sys
    import threading
    import time

    n = 1 << 24
    params, grads, bufs = torch.ones(n), torch.ones(n), torch.ones(n)
    stamps, stop = [], threading.Event()

    def spin():
        count = 0
        while not stop.is_set():
            count += 1
            if count % 2000 == 0:
                stamps.append(time.perf_counter())

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    thread = threading.Thread(target=spin)
    thread.start()
    try:
        time.sleep(0.05)
        start = time.perf_counter()
        compiled_kernel.update_trial([params], [grads], [bufs], [], [None], 0.1, 0.9, [], 0, 1)
        end = time.perf_counter()
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    inside = [start] + [s for s in stamps if start < s < end] + [end]
    longest = max(b - a for a, b in zip(inside, inside[1:]))
    assert longest < 0.5 * (end - start), (longest, end - start, len(inside) - 2)
    assert float(params[0]) != 1.0   # the update ran
