"""The digest of what a study's store measured: one SHA-256 over every table's rows, so that two
stores of the same spec, written by two versions of the library, can be compared by one hash.

    python -m experiments.scripts.store_digest RUN_DIR [RUN_DIR ...]

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


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for run_dir in argv:
        print(f"{digest(run_dir)}  {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
