"""The short table tests/gpu/check.sh prints last, from the logs it wrote under OUT:
``python tests/gpu/summary.py OUT``."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def phases(out: Path) -> dict[str, tuple[str, str]]:
    """Phase name -> (exit status, seconds) from phases.txt."""
    rows = {}
    for line in (out / "phases.txt").read_text().splitlines() if (out / "phases.txt").exists() else []:
        name, rc, seconds = line.split()
        rows[name] = ("timed out" if rc in ("124", "130", "137") else rc, seconds)
    return rows


def tests(out: Path) -> str:
    """passed / failed / skipped of the GPU tests (junit XML)."""
    path = out / "gpu-tests.xml"
    if not path.exists():
        return "no result"
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n, failed = int(suite.get("tests", 0)), int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    skipped = int(suite.get("skipped", 0))
    return f"{n - failed - skipped} passed, {failed} failed, {skipped} skipped"


def bench_rows(out: Path, name: str) -> list[str]:
    """The GPU rows of a bench log's final table."""
    path = out / f"{name}.log"
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.startswith("| ")]
    heads = [i for i, line in enumerate(lines) if line.startswith("| model |")]
    return lines[heads[-1] + 1:] if heads else []


def study(out: Path, name: str) -> str:
    """Groups done of planned in a study's run folder (probes stored or not)."""
    run_dir = out / "runs" / name
    try:
        import experiments
        from experiments.spec.plan import plan

        res = experiments.load_results(run_dir)
        done = int((res.groups.status == "done").sum())
        planned = len(plan(res.spec))
        probes = "probes stored" if len(res.probes) else "no probes"
        return f"{done}/{planned} groups, {probes}"
    except Exception as exc:  # noqa: BLE001 - a summary line, whatever went wrong
        return f"no store ({type(exc).__name__})"


def main(out: Path) -> None:
    ph = phases(out)
    env = (out / "environment.txt").read_text().splitlines() if (out / "environment.txt").exists() else []
    gpu = next((line for line in env if line.startswith("torch ")), "torch: unknown")
    print(f"\n## sparsescale GPU check\n\n{gpu}\n")
    print("| phase | status | seconds | result |\n|---|---|---|---|")
    results = {"gpu-tests": tests(out), "study-quickstart": study(out, "quickstart"),
               "study-lee": study(out, "lee_sparsity_mnist1d")}
    for name, (rc, seconds) in ph.items():
        print(f"| {name} | {'ok' if rc == '0' else rc} | {seconds} | {results.get(name, '')} |")
    for name in ("bench-fp32", "bench-tf32"):
        rows = bench_rows(out, name)
        if rows:
            print(f"\n{name}:\n\n| model | B | trials | device | precision | program | plain "
                  "steps/s | trial-steps/s | median ratio | ratio range | TFLOP/s | % of peak | "
                  "peak GPU MiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            print("\n".join(rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
