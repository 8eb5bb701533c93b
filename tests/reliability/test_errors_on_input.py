"""Bad input raises the package's own errors: no module of the four packages raises a bare
``ValueError``, ``TypeError``, ``RuntimeError`` or ``KeyError`` (the invariants that no input can
break are ``AssertionError`` / ``NotImplementedError``, or say why here)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("training", "pruning", "theory", "experiments")
BARE = {"ValueError", "TypeError", "RuntimeError", "KeyError", "IndexError", "Exception"}
# an internal check of a derivation (sympy's solution of the bound), which no input reaches
INTERNAL = {("theory/models/bounds.py", "RuntimeError")}


def test_no_bare_builtin_error_is_raised():
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            rel = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                    name = getattr(node.exc.func, "id", None)
                    if name in BARE and (rel, name) not in INTERNAL:
                        found.append(f"{rel}:{node.lineno} {name}")
    assert found == []
