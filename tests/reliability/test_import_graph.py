"""The project's imports form no circle, function-level (lazy) imports included, and the
packages depend on each other one way only: experiments -> theory, pruning -> training."""

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("training", "pruning", "theory", "experiments")
# what each package may import from the others
ALLOWED = {"training": set(), "pruning": {"training"}, "theory": {"training"},
           "experiments": {"training", "pruning", "theory"}}


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
