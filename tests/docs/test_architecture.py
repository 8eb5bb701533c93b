"""The architecture page holds to the code: its module-size table is the code's (generated here:
``SPARSESCALE_WRITE_DOCS=1`` rewrites it), no module is over 500 lines and no folder holds more
than 16 modules, and its glossary is stated once and kept: each term defined once, the programs
those of the registry, every dotted name it quotes importable, and the words "kernel", "plan"
and "method" in no name of the code but those the glossary gives them, nor "schedule" in a name
of Lee et al.'s stage."""

import ast
import importlib
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
PACKAGES = ("training", "pruning", "theory", "experiments")
MAX_LINES, AIM_LINES, MAX_MODULES = 500, 400, 16
# The modules allowed past MAX_LINES (up to LONG_LINES), each with why it stays one module: a
# split would cut one job in two, or make a 20-40-line module only to meet the number. The page
# lists the same ones ("## Module sizes"); keep the list short.
LONG_LINES = 700
LONG = {
    "experiments/spec/study.py": "the Spec, its canonical form and its validation are one "
                                 "contract: the spec hash; each table's parser already has "
                                 "its own module",
    "training/engine/loop.py": "the step loop, the call it takes and what it leaves (Call, "
                               "Outcome): the stack's steps, evaluations and replay share the "
                               "Runner and the stack",
}
BEGIN, END = "<!-- module sizes: generated -->", "<!-- end of module sizes -->"


def modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def size_table() -> str:
    """The modules over AIM_LINES lines, largest first, with their docstring's first line."""
    rows = ["| module | lines | what it holds |", "|---|---|---|"]
    for n, path in sorted(((lines(p), p) for p in modules() if lines(p) > AIM_LINES),
                          key=lambda t: (-t[0], str(t[1]))):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        first = " ".join(doc.split("\n\n")[0].split()).replace("|", "\\|")
        first = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", first).replace("``", "`")
        rows.append(f"| `{path.relative_to(ROOT)}` | {n} | {first} |")
    return "\n".join(rows)


def test_the_module_size_table_is_the_codes():
    text = PAGE.read_text(encoding="utf-8")
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    table = "\n" + size_table() + "\n"
    if os.environ.get("SPARSESCALE_WRITE_DOCS") == "1":
        PAGE.write_text(text[:start] + table + text[end:], encoding="utf-8")
        return
    assert text[start:end] == table, ("the module-size table is stale: rerun this test with "
                                      "SPARSESCALE_WRITE_DOCS=1 to rewrite it")


def test_no_module_is_over_500_lines_but_those_listed():
    over = {rel: n for rel, n in ((str(p.relative_to(ROOT)), lines(p)) for p in modules())
            if n > (LONG_LINES if rel in LONG else MAX_LINES)}
    assert over == {}
    assert all((ROOT / rel).exists() for rel in LONG), "a listed module is gone: unlist it"


def test_the_page_lists_the_modules_allowed_past_500_lines():
    text = PAGE.read_text(encoding="utf-8").split("## Module sizes", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- `([\w/]+\.py)`: ", text, re.MULTILINE)
    assert listed == list(LONG), "docs/architecture.md, Module sizes: list LONG's modules"


def test_no_folder_holds_more_than_16_modules():
    folders: dict[Path, int] = {}
    for p in modules():
        folders[p.parent] = folders.get(p.parent, 0) + 1
    crowded = {str(f.relative_to(ROOT)): n for f, n in folders.items() if n > MAX_MODULES}
    assert crowded == {}


# -- the glossary ---------------------------------------------------------------------------


def glossary() -> dict[str, str]:
    """Term -> definition, from the page's definition list under "## Glossary"."""
    text = PAGE.read_text(encoding="utf-8").split("## Glossary", 1)[1]
    terms: dict[str, str] = {}
    for block in re.split(r"\n(?=\S[^\n]*\n:   )", text):
        head, sep, body = block.strip("\n").partition("\n:   ")
        if sep:
            assert head not in terms, f"{head!r} is defined twice"
            terms[head] = " ".join(body.split())
    return terms


def test_each_term_is_defined_once():
    terms = glossary()
    assert {"program", "kernel", "strategy", "cell", "stack", "chunk", "plan", "criterion",
            "stage"} <= set(terms)


def test_the_programs_are_the_registrys():
    from training.engine.programs.registry import PROGRAMS

    listed = glossary()["program"].split("stack of trials:", 1)[1].split(", each in")[0]
    named = re.findall(r"`([a-z_]+)`", listed)
    assert named == list(PROGRAMS)
    assert f"One of the {['four', 'five', 'six'][len(PROGRAMS) - 4]} ways" in glossary()["program"]


def test_every_dotted_name_the_glossary_quotes_imports():
    """``training.engine.strategy.Strategy`` and the like: a module, or an attribute of one."""
    for term, body in glossary().items():
        for name in re.findall(r"`((?:training|theory|pruning|experiments)(?:\.\w+)+)`", body):
            parts = name.split(".")
            for cut in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:cut]))
                except ModuleNotFoundError:
                    continue
                for attr in parts[cut:]:
                    assert hasattr(obj, attr), f"{term}: {name} does not exist"
                    obj = getattr(obj, attr)
                break


def names_in(path: Path) -> set[str]:
    """The identifiers a module defines or uses: modules, functions, classes, arguments,
    variables and attributes."""
    found = {path.stem}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        for field in ("name", "id", "attr", "arg", "asname"):
            value = getattr(node, field, None)
            if isinstance(value, str):
                found.add(value)
    return found


# Python's and torch's own names, in which "kernel" is a convolution's window or an attention
# backend, and "method" a kind of function or of process start
TORCH_NAMES = {"kernel_size", "sdpa_kernel", "classmethod", "staticmethod", "init_method",
               "start_method"}
# the modules whose "kernel" names hold compiled code (its build, its module, its calls)
COMPILED = {"training/engine/compiled_kernel.py", "training/engine/kernel_cache.py",
            "training/extensions.py", "training/processes/setup.py",
            "training/engine/strategy.py", "training/engine/updates.py",
            "training/engine/programs/fused.py", "training/engine/programs/per_trial.py",
            "theory/monitor/kernel.py", "theory/monitor/monitor.py", "experiments/run/runner.py"}


# the modules whose "method" is an estimator's way of computing (the noise monitor's, the trace
# estimator's, the bootstrap's resampling, numpy's quantile, the calibration script's choice of
# the monitor's), never a pruning criterion
ESTIMATORS = {"theory/monitor/capture.py", "theory/monitor/monitor.py",
              "theory/monitor/readings.py", "theory/estimators/curvature.py",
              "theory/models/scaling.py", "theory/verdicts/step_ratio.py",
              "experiments/scripts/calibration.py"}


@pytest.mark.parametrize("word, allowed", [
    ("kernel", COMPILED),
    ("plan", {str(p.relative_to(ROOT)) for p in (ROOT / "experiments").rglob("*.py")}),
    ("method", ESTIMATORS),
])
def test_a_word_names_its_concept_only(word, allowed):
    """"kernel" names compiled code only; "plan" the study's plan only (experiments); "method"
    an estimator's way of computing only: a pruning criterion is a "criterion" everywhere."""
    stray = {}
    for path in modules():
        rel = str(path.relative_to(ROOT))
        names = {n for n in names_in(path) if word in n.lower() and n not in TORCH_NAMES}
        if names and rel not in allowed:
            stray[rel] = sorted(names)
    assert stray == {}


# a name saying "schedule" and one of Lee et al.'s stage's things: the stage is "stage"
# ("schedule" names the lr, evaluation and batch-size schedules)
STAGE_AS_SCHEDULE = re.compile(r"schedul\w*(probe|stage|lipschitz|row|quantit|measur|step)|"
                               r"(probe|stage|lipschitz)\w*schedul", re.IGNORECASE)


def test_lee_stage_is_named_stage():
    stray = {}
    for path in modules():
        names = sorted(n for n in names_in(path) if STAGE_AS_SCHEDULE.search(n))
        if names:
            stray[str(path.relative_to(ROOT))] = names
    assert stray == {}
