"""The project's imports form no circle, function-level (lazy) imports included; the packages
depend on each other one way only (experiments -> theory, pruning -> training), and so do the
sub-packages within a package and the modules directly inside it."""

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("training", "pruning", "theory", "experiments")
# what each package may import from the others
ALLOWED = {"training": set(), "pruning": {"training"}, "theory": {"training"},
           "experiments": {"training", "pruning", "theory"}}
# within experiments, what each sub-package may import: a study flows spec -> store -> report,
# the runner orchestrates them, the command line sits on top
EXPERIMENTS_LAYERS = ("spec", "store", "report", "run", "exchange", "cli")


def project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the four packages."""
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its body (``ast.walk`` visits imports in
    functions too). ``from a.b import c`` depends on ``a.b.c`` when that is a module, else on
    ``a.b``; a name that is not a project module is cut to its longest project prefix."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            targets += [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                        for a in node.names]
    out = set()
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported(name, path, modules) for name, path in modules.items()}


def test_the_walk_sees_lazy_and_relative_imports(tmp_path):
    """A circle hidden by a function-level import is found, relative imports resolve."""
    (tmp_path / "a.py").write_text("from . import b\nfrom .c import helper\n")
    (tmp_path / "b.py").write_text("def late():\n    from pkg.a import x\n    import pkg.c.d\n")
    modules = {"pkg": tmp_path / "__init__.py", "pkg.a": tmp_path / "a.py",
               "pkg.b": tmp_path / "b.py", "pkg.c": tmp_path / "c.py"}
    assert imported("pkg.a", modules["pkg.a"], modules) == {"pkg.b", "pkg.c"}
    assert imported("pkg.b", modules["pkg.b"], modules) == {"pkg.a", "pkg.c"}
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter({n: imported(n, modules[n], modules)
                                    for n in ("pkg.a", "pkg.b")}).prepare()


def test_no_import_circle(graph):
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(exc.args[1])}")
    assert set(order) == set(graph)


def test_packages_depend_one_way(graph):
    wrong = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                   if b.split(".")[0] != a.split(".")[0]
                   and b.split(".")[0] not in ALLOWED[a.split(".")[0]])
    assert not wrong, wrong


def unit(name: str, modules: dict[str, Path]) -> str:
    """The sub-package a module belongs to (``training.engine``), or the module itself when it
    lies directly inside its package (``training.trials``)."""
    parts = modules[name].relative_to(ROOT).parts
    return ".".join(parts[:2]) if len(parts) > 2 else name


@pytest.fixture(scope="module")
def unit_graph(graph) -> dict[str, set[str]]:
    modules = project_modules()
    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        for b in targets:
            if unit(a, modules) != unit(b, modules):
                out.setdefault(unit(a, modules), set()).add(unit(b, modules))
    return out


def test_sub_packages_form_no_circle(unit_graph):
    """Each sub-package (and each module directly in a package) as one node: no circle, so a
    sub-package never reaches back into a module that depends on it."""
    assert {"training.engine", "training.bench", "training.distributed", "experiments.spec",
            "experiments.run", "experiments.report", "experiments.cli"} <= set(unit_graph)
    try:
        graphlib.TopologicalSorter(unit_graph).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"sub-package circle: {' -> '.join(exc.args[1])}")


def test_experiments_sub_packages_follow_the_data_flow(unit_graph):
    wrong = []
    for a, targets in unit_graph.items():
        if not a.startswith("experiments.") or a.split(".")[1] not in EXPERIMENTS_LAYERS:
            continue
        rank = EXPERIMENTS_LAYERS.index(a.split(".")[1])
        wrong += [f"{a} -> {b}" for b in targets if b.startswith("experiments.")
                  and b.split(".")[1] in EXPERIMENTS_LAYERS
                  and EXPERIMENTS_LAYERS.index(b.split(".")[1]) > rank]
    assert not wrong, wrong


def test_the_engine_is_private_to_the_trainers(graph):
    """Only training's trainers, its benchmarks and the engine itself reach into
    ``training.engine``; the other packages use the public trainers."""
    users = sorted(a for a, targets in graph.items() if a.split(".")[0] != "training"
                   and any(b.startswith("training.engine") for b in targets))
    assert not users, users


def test_argparse_only_in_the_command_line_package():
    """Command-line code has one home, experiments/cli/: no other module imports argparse."""
    users = sorted(name for name, path in project_modules().items()
                   if not name.startswith("experiments.cli")
                   and any(isinstance(node, (ast.Import, ast.ImportFrom))
                           and "argparse" in ([a.name for a in node.names]
                                              if isinstance(node, ast.Import) else [node.module])
                           for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))))
    assert users == []
