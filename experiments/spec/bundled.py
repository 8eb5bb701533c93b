"""The bundled study configs (``experiments/configs/*.toml``) and the ``reductions`` text a
spec carries (how a bundled study's design is reduced from the paper's)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any


CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def list_configs() -> list[str]:
    """Names of the bundled study configs (``experiments/configs/*.toml``)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))


def resolve_config(path: str | Path) -> Path:
    """``path`` if it exists, else the bundled config of that name (``quickstart``)."""
    p = Path(path)
    if p.exists():
        return p
    bundled = CONFIG_DIR / (p.name if p.suffix == ".toml" else f"{p.name}.toml")
    return bundled if bundled.exists() else p


def reductions(spec: Any) -> str:
    """The spec's ``reductions`` text (how a bundled study's design is reduced from the
    paper's), read from its TOML text: like ``description``, not part of the hash, so a store
    keeps it in ``spec_toml`` and the report prints it. Empty when there is none."""
    try:
        value = tomllib.loads(spec.toml).get("reductions", "") if spec.toml else ""
    except tomllib.TOMLDecodeError:
        return ""
    return value.strip() if isinstance(value, str) else ""
