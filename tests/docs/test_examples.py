"""The runnable examples of the documentation (docs/examples/*.py) run and print what the pages
say they print, so they cannot rot. Each runs in a fresh interpreter, as a reader would run it,
from a scratch folder (an example that writes a run folder writes it there).

Each page shows its example's output too (``docs/examples/output/<name>.txt``, included after the
code): that output passes the example's own check and prints the same lines as a fresh run, and
``SPARSESCALE_WRITE_DOCS=1`` rewrites it from the fresh run."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
OUTPUT = EXAMPLES / "output"


def run_example(name: str, cwd: Path) -> str:
    """Run ``docs/examples/<name>`` and return what it prints."""
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], cwd=cwd, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def parse(text: str) -> dict[str, str]:
    """The ``key: value`` lines of an example's output, as a dict."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            out[key.strip()] = value.strip()
    return out


def check_train_trials(out):
    assert out["program"] in ("fused", "batched")          # batched without a C++ compiler
    status = out["status"].split()
    assert status == ["reached", "reached", "not_reached", "diverged"]
    hits = out["hit steps"].split()
    assert hits[2:] == ["None", "None"]
    # the group's steps-to-result is the smallest hit, and the plain loop agrees to the step
    assert int(out["steps to result"]) == min(int(h) for h in hits[:2])
    assert out["reference steps to result"] == out["steps to result"]
    assert float(out["best lr"]) == 0.03


def check_prune_and_train(out):
    assert float(out["sparsity"]) == pytest.approx(0.9, abs=1e-6)
    kept = dict(item.split("=") for item in out["kept per layer"].split())
    assert set(kept) == {"1.weight", "3.weight", "5.weight"}
    assert sum(int(k) for k in kept.values()) == round(15_000 * 0.1)   # weights of 40-100-100-10
    assert int(out["pruned weights that moved"]) == 0
    dense, sparse = int(out["dense steps to result"]), int(out["sparse steps to result"])
    assert 0 < dense < sparse                               # sparsity costs steps here
    # not borderline: met at about a third of the 4,000-step budget on every capability
    # (1,480 with ATEN_CPU_CAPABILITY=default, 1,360 with avx2)
    assert sparse < 2500


def check_gradient_noise(out):
    for level in ("dense", "sparse"):
        g_sq, trace = float(out[f"{level} g_sq"]), float(out[f"{level} trace_sigma"])
        assert g_sq > 0 and trace > 0 and float(out[f"{level} lambda_max"]) > 0
        assert float(out[f"{level} b_simple"]) == pytest.approx(trace / g_sq, rel=1e-4)
    # the values the Theory page quotes for the dense MLP at initialization
    assert float(out["dense g_sq"]) == pytest.approx(0.0330, rel=0.01)
    assert float(out["dense trace_sigma"]) == pytest.approx(7.85, rel=0.01)
    assert float(out["dense b_simple"]) == pytest.approx(237, rel=0.01)


def check_fit_scaling(out):
    assert float(out["b_crit"]) == pytest.approx(256, rel=0.1)
    assert float(out["s_min"]) == pytest.approx(1000, rel=0.1)
    low, high = (float(v) for v in out["b_crit interval"].split())
    assert low <= 256 <= high
    assert float(out["largest useful batch"]) == pytest.approx(4 * float(out["b_crit"]), rel=1e-3)
    regimes = [out[f"regime at {2 ** k}"] for k in range(2, 15)]
    assert regimes[0] == "perfect scaling" and regimes[-1] == "maximal data parallelism"
    assert "diminishing returns" in regimes


def check_own_model(out):
    assert out["tiny_mlp program"] in ("fused", "batched")
    # no rule covers it: the fastest candidate measured on this machine
    assert out["residual program"] in ("func", "per_trial", "plain")
    for name in ("tiny_mlp", "residual"):
        assert int(out[f"{name} steps to result"]) > 0
    rows = {k: v for k, v in out.items() if k.startswith("study sparsity")}
    assert len(rows) == 4                                   # 2 sparsities x 2 batch sizes
    assert all(v.startswith("done") for v in rows.values())
    assert all(re.search(r"steps to result \d+$", v) for v in rows.values())


def check_own_data(out):
    assert out["task"] == "classification" and out["classes"] == "3"
    assert out["split"] == "480 120"
    assert re.fullmatch(r"[0-9a-f]{16}", out["digest"])
    # BatchNorm and Dropout run a trial at a time (per_trial or plain, whichever was measured
    # faster), each trial with its own running statistics, and the plain loop with the trial's
    # random draws hits the goal at the same steps
    assert out["program"] in ("per_trial", "plain")
    assert out["running statistics"] == "(2, 32)"
    hits = out["hit steps"].split()
    assert "None" not in hits and hits == out["reference hit steps"].split()
    assert 0 < float(out["b_simple"]) < float("inf")
    assert "eval mode" in out["definition"]
    assert "1 batch-normalization layer uses running statistics" in out["definition"]
    assert "1 dropout layer is the identity" in out["definition"]
    # an own loss rules out the compiled kernel's program and its eager fallback
    assert out["mlp program"] in ("fused", "batched")
    assert out["mlp program with own loss"] in ("func", "per_trial", "plain")


def check_noise_monitor(out):
    assert out["method"] == "per_example" and out["smoothing"] == "window 100"
    assert int(out["csv rows"]) == 300                      # one row per step
    b_simple, se = (float(v) for v in out["b_simple"].split(" +- "))
    g_sq, trace = float(out["g_sq"]), float(out["trace_sigma"])
    assert g_sq > 0 and 0 < se < b_simple
    assert b_simple == pytest.approx(trace / g_sq, rel=1e-3)   # ratio of the window's averages
    assert b_simple == pytest.approx(210.6, rel=0.02)          # the value the page quotes


def check_own_criterion(out):
    assert out["criteria"].split()[-1] == "gradient_magnitude"     # registered after the rest
    assert float(out["sparsity"]) == pytest.approx(0.9, abs=1e-6)
    kept = dict(item.split("=") for item in out["kept per layer"].split())
    assert sum(int(k) for k in kept.values()) == round(15_000 * 0.1)
    assert 0 < float(out["kept by snip too"]) < 1                 # another criterion than SNIP
    assert out["recorded"] == "gradient_magnitude 10"
    method, digest = out["spec pruning table"].split()
    assert method == "own_criterion:gradient_magnitude" and re.fullmatch(r"[0-9a-f]{12}", digest)
    assert out["groups done"] == "4 of 4"                         # 2 sparsities x 2 batch sizes
    assert all(re.fullmatch(r"0\.[05]/(16|64)=\d+", g) for g in out["steps to result"].split())


def check_async_nqm(out):
    rows = {int(k.split("B=")[1].split(",")[0]): [float(v) for v in out[k].split()]
            for k in out if k.startswith("steps at B=")}
    assert sorted(rows) == [1, 4, 16, 64, 256]
    grid = np.array([rows[b] for b in sorted(rows)])
    assert np.all(np.diff(grid, axis=1) > 0) and np.all(np.diff(grid, axis=0) < 0)
    b_crit = float(out["b_crit"])
    assert 35 < b_crit < 60
    measured = [float(v) for v in out["tau_crit measured"].split()]
    predicted = [float(v) for v in out["tau_crit predicted"].split()]
    # below B_crit the critical delay is B_crit / B, as the additive-noise reconstruction says
    for m, p in zip(measured[:3], predicted[:3]):
        assert m == pytest.approx(p, rel=0.25)
    winners = {k: v for k, v in out.items() if k.startswith("sooner at")}
    assert {v for k, v in winners.items() if k.endswith("W=4")} == {"sync"}
    assert {v for k, v in winners.items() if k.endswith("W=16")} == {"async"}


def check_own_program(out):
    assert out["programs"].split()[-1] == "chunked_plain"     # registered after the library's
    assert out["ran"] == "chunked_plain given"
    hits = out["hit steps"].split()
    assert all(h.isdigit() for h in hits)                     # both trials reach the goal
    assert out["plain hit steps"].split() == hits             # float64: the plain program's steps


def check_own_measurement(out):
    path, digest = out["measures"].split()
    assert path == "own_measurement:WeightNorm" and re.fullmatch(r"[0-9a-f]{12}", digest)
    norms = {k: [float(v) for v in out[k].split()] for k in out if k.startswith("norm ")}
    assert norms and int(out["rows"]) == sum(len(v) for v in norms.values())
    assert all(len(v) <= 5 and all(x > 0 for x in v) for v in norms.values())
    # every run of a level starts from the same (masked) initialization
    for level in ("0.0", "0.5"):
        starts = {v[0] for k, v in norms.items() if k.split()[1].startswith(level + "/")}
        assert len(starts) <= 1
    assert out["section"] == "True" and out["figure"] == "True"


def check_bundled_study(out):
    assert out["bundled"] == "True quickstart.toml"
    assert {"name", "workload", "goal", "batch_sizes", "sparsities"} <= set(out["golden keys"].split())
    assert re.fullmatch(r"[0-9a-f]{12}", out["hash"])
    assert out["groups planned"] == "4" and out["groups done"] == "4 of 4"


CHECKS = {
    "train_trials.py": check_train_trials,
    "prune_and_train.py": check_prune_and_train,
    "gradient_noise.py": check_gradient_noise,
    "fit_scaling.py": check_fit_scaling,
    "own_model.py": check_own_model,
    "own_data.py": check_own_data,
    "noise_monitor.py": check_noise_monitor,
    "own_criterion.py": check_own_criterion,
    "async_nqm.py": check_async_nqm,
    "own_program.py": check_own_program,
    "own_measurement.py": check_own_measurement,
    "bundled_study.py": check_bundled_study,
}


def test_every_example_is_checked_and_shown():
    """Each example file has a check here and is included in a page (pymdownx.snippets), with
    its output."""
    files = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert files == sorted(CHECKS)
    pages = "\n".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    for name in files:
        assert f'--8<-- "{name}"' in pages, f"{name} is not included in any page"
        shown = f'--8<-- "output/{name.removesuffix(".py")}.txt"'
        assert shown in pages, f"{name}'s output is not shown in any page"


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_shown_output_is_one_the_example_prints(name):
    """The output a page shows passes the example's check (the run that makes it is
    :func:`test_example_runs`)."""
    CHECKS[name](parse((OUTPUT / f"{name.removesuffix('.py')}.txt").read_text()))


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_example_runs(name, tmp_path):
    printed = run_example(name, tmp_path)
    CHECKS[name](parse(printed))
    shown = OUTPUT / f"{name.removesuffix('.py')}.txt"
    if os.environ.get("SPARSESCALE_WRITE_DOCS") == "1":
        shown.parent.mkdir(exist_ok=True)
        shown.write_text(printed)
    # the page shows the lines a run prints, in order (their values may differ by machine)
    assert list(parse(shown.read_text())) == list(parse(printed))
