"""Why a results store refuses a study: another study's spec, or results on other data.

A store holds one study (its spec hash) on one data set (its content digest); the messages say
which keys differ and what to do (another ``--out`` folder).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from experiments.store.schema import StudyInfo

# provenance keys that identify a data set's content (a data set made from the running
# interpreter's files differs between Python versions)
CONTENT_KEYS = ("corpus_digest", "digest")


def other_data(path: Path, stored: str | None, given: str | None) -> str | None:
    """Why the store at ``path`` refuses to add to its study with data whose provenance is
    ``given``: the content digest it recorded (``stored``) differs. None when they agree or
    either is unknown."""
    try:
        old, new = json.loads(stored or "{}"), json.loads(given or "{}")
    except json.JSONDecodeError:
        return None
    for key in CONTENT_KEYS:
        if key in old and key in new and old[key] != new[key]:
            versions = (f" (written with Python {old.get('python_version')}, this is "
                        f"{new.get('python_version')})" if "python_version" in old else "")
            return (f"{path} holds results on other data: its data set's {key} is {old[key]}, "
                    f"this one's {new[key]}{versions}; results on other data are never mixed: "
                    f"choose another --out folder")
    return None


def other_study(path: Path, existing: StudyInfo, info: StudyInfo) -> str:
    """Why the store at ``path``, holding ``existing``, refuses the study ``info``: the keys
    their specs differ in (a changed factory digest: the factory's code changed)."""
    try:
        keys = _differences(json.loads(existing.spec_json), json.loads(info.spec_json))
    except json.JSONDecodeError:
        keys = []
    code = (" (the factory module's code changed since: a new study, whose groups are all new)"
            if keys and all(k.endswith("_digest") for k in keys) else "")
    listed = ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
    differ = f"; they differ in {listed}" if keys else ""
    return (f"{path} holds a different study ({existing.name!r}, spec hash "
            f"{existing.spec_hash[:12]}) than the one given ({info.name!r}, spec hash "
            f"{info.spec_hash[:12]}){differ}{code}; studies are never mixed: choose another "
            f"--out folder")


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted key paths where two canonical specs differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b))
                for d in _differences(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else k)]
    return [] if a == b else [prefix or "(spec)"]
