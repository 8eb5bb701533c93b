"""The digest of what a study's store measured: one SHA-256 over every table's rows, so that two
stores of the same spec, written by two versions of the library, can be compared by one hash.

    python -m experiments.scripts.store_digest RUN_DIR [RUN_DIR ...]
    python -m experiments.scripts.store_digest --golden GOLDEN.json RUN_DIR [RUN_DIR ...]

With ``--golden`` each store is compared with the golden digest of its study (by the study's
name in the store): ``equal``, ``DIFFERS`` (exit status 1), or ``not comparable`` where the golden
file was measured on another machine (:func:`machine`: float32 results depend on torch's version
and on the CPU instruction set its kernels dispatch to) or for another spec (its hash). The
bundled studies' golden digests are ``tests/experiments/store/golden_digests.json``.

Left out, because they differ between two runs of the same spec: each table's volatile columns
(``experiments.store.schema.VOLATILE``: wall times, creation times, seconds), the library and
torch versions, and the spec's TOML text (its wording may change while its canonical JSON and
hash, which are kept, do not). A table renamed since (``RENAMED_TABLES``) counts under its new
name, and an empty table counts as absent, so a store written before a table was added digests
as one written after. Rows are sorted, so the order groups finished in does not matter.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

from experiments.store.database import DB_NAME
from experiments.store.schema import RENAMED_TABLES, VOLATILE

# the columns every table may carry that say which software wrote a row, not what it measured
WRITER = ("lib_version", "torch_version", "spec_toml")


def table_rows(conn: sqlite3.Connection) -> dict[str, list[str]]:
    """Every non-empty table of ``conn`` under its current name: its rows as sorted JSON lines of
    the measured columns (column name -> value)."""
    out: dict[str, list[str]] = {}
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for name in names:
        table = RENAMED_TABLES.get(name, name)
        skip = set(VOLATILE.get(table, ())) | set(WRITER)
        cursor = conn.execute(f"SELECT * FROM {name}")
        columns = [d[0] for d in cursor.description]
        rows = sorted(json.dumps({c: v for c, v in zip(columns, row) if c not in skip},
                                 sort_keys=True) for row in cursor)
        if rows:
            out[table] = rows
    return out


def digest(run_dir: str | Path) -> str:
    """The SHA-256 (hex) of the store in ``run_dir`` (see the module docstring)."""
    path = Path(run_dir) / DB_NAME
    if not path.is_file():
        raise SystemExit(f"no results store at {path}")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = table_rows(conn)
    finally:
        conn.close()
    h = hashlib.sha256()
    for table in sorted(tables):
        h.update(table.encode() + b"\n")
        for row in tables[table]:
            h.update(row.encode() + b"\n")
    return h.hexdigest()


def machine() -> dict[str, str]:
    """What a store's numbers depend on besides the code and the spec: torch's version, the
    instruction set its CPU kernels dispatch to (``ATEN_CPU_CAPABILITY`` can lower it) and the
    Python version (the store records it)."""
    import platform

    import torch

    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "python": platform.python_version()}


def study_of(run_dir: str | Path) -> tuple[str, str]:
    """The study's name and spec hash stored in ``run_dir``."""
    path = Path(run_dir) / DB_NAME
    if not path.is_file():
        raise SystemExit(f"no results store at {path}")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT name, spec_hash FROM study WHERE id = 1").fetchone()
    except sqlite3.DatabaseError:
        row = None
    finally:
        conn.close()
    if row is None:
        raise SystemExit(f"{path} holds no study")
    return row[0], row[1]


def compare(run_dir: str | Path, golden: dict[str, Any]) -> str:
    """``equal``, ``DIFFERS ...`` or ``not comparable: ...``: the store in ``run_dir`` against
    ``golden`` (the JSON of a golden-digests file: ``machine`` and ``studies``, each study's
    ``digest`` and ``spec_hash``)."""
    name, spec_hash = study_of(run_dir)
    pinned = golden["studies"].get(name)
    if pinned is None:
        return f"not comparable: no golden digest for study {name!r} (pinned: " \
               f"{', '.join(sorted(golden['studies']))})"
    if pinned["spec_hash"] != spec_hash:
        return f"not comparable: the store's spec hash {spec_hash[:12]} is not the pinned " \
               f"{pinned['spec_hash'][:12]} (the spec changed)"
    if golden["machine"] != machine():
        return f"not comparable: pinned on {golden['machine']}, this machine is {machine()}"
    found = digest(run_dir)
    if found == pinned["digest"]:
        return "equal"
    return f"DIFFERS: {found[:12]} against the pinned {pinned['digest'][:12]}"


def main(argv: list[str]) -> int:
    golden = None
    if argv[:1] == ["--golden"] and len(argv) >= 2:
        golden = json.loads(Path(argv[1]).read_text())
        argv = argv[2:]
    if not argv:
        print(__doc__)
        return 2
    status = 0
    for run_dir in argv:
        if golden is None:
            print(f"{digest(run_dir)}  {run_dir}")
            continue
        verdict = compare(run_dir, golden)
        status = max(status, int(verdict.startswith("DIFFERS")))
        print(f"{verdict}  {run_dir}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
