"""An older store read, and upgraded, under today's schema.

A store is never rewritten to read it: a read-only reader (:func:`read_frame`) reads a table
added since the store was written as an empty table with its columns, a column added since as
NULL (or the default its type gives), and a renamed table or column under its new name. The
writer (:class:`experiments.store.database.Store`) upgrades the store in place when it opens it:
:func:`rename_tables` before the schema's ``CREATE TABLE IF NOT EXISTS`` (which would otherwise
make an empty table under the new name beside the old one), then :func:`add_columns`. What was
renamed or added is listed in :mod:`experiments.store.schema` (``RENAMED_TABLES``,
``RENAMED_COLUMNS``, ``ADDED_COLUMNS``).
"""

from __future__ import annotations

import sqlite3

import pandas as pd

from experiments.store.schema import (
    ADDED_COLUMNS, COLUMNS, NULLABLE_INT, RENAMED_COLUMNS, RENAMED_TABLES, SORT_KEYS,
    TABLE_NULLABLE_INT,
)

Connection = sqlite3.Connection | sqlite3.Cursor


def existing_columns(conn: Connection, table: str) -> set[str]:
    """The columns ``table`` has in the store (empty: no such table)."""
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def rename_tables(c: sqlite3.Cursor) -> None:
    """Give each of the :data:`~experiments.store.schema.RENAMED_TABLES` a store holds under its
    old name the new one (a store holding the new one already is left as it is)."""
    for old, new in RENAMED_TABLES.items():
        if existing_columns(c, old) and not existing_columns(c, new):
            c.execute(f"ALTER TABLE {old} RENAME TO {new}")


def add_columns(c: sqlite3.Cursor) -> None:
    """Rename the :data:`~experiments.store.schema.RENAMED_COLUMNS` a store holds under their
    old names, then add the :data:`~experiments.store.schema.ADDED_COLUMNS` it lacks."""
    for table, pairs in RENAMED_COLUMNS.items():
        have = existing_columns(c, table)
        for old, new in pairs:
            if old in have and new not in have:
                c.execute(f"ALTER TABLE {table} RENAME COLUMN {old} TO {new}")
    for table, columns in ADDED_COLUMNS.items():
        have = existing_columns(c, table)
        for name, kind in columns:
            if name not in have:
                c.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")


def read_frame(conn: sqlite3.Connection, table: str) -> pd.DataFrame:
    """Table ``table`` as a DataFrame sorted by its natural keys, read without the store being
    changed (module docstring): a table or column added since the store was written reads
    empty (NULL, or the default its type gives), a renamed table or column under its new
    name."""
    source = next((old for old, new in RENAMED_TABLES.items()
                   if new == table and not existing_columns(conn, table)), table)
    have = existing_columns(conn, source)
    if not have:   # a table added later, in a store written before it
        return pd.DataFrame(columns=list(COLUMNS[table]))
    renamed = {new: old for old, new in RENAMED_COLUMNS.get(table, ())}
    added = {c: kind.split(" DEFAULT ")[1] if " DEFAULT " in kind else "NULL"
             for c, kind in ADDED_COLUMNS.get(table, ())}
    select = [c if c in have else f"{renamed[c]} AS {c}" if renamed.get(c) in have
              else f"{added[c]} AS {c}" if c in added else c
              for c in COLUMNS[table]]
    df = pd.read_sql_query(f"SELECT {', '.join(select)} FROM {source}", conn)
    for col in (*NULLABLE_INT, *TABLE_NULLABLE_INT.get(table, ())):
        if col in df.columns:
            df[col] = df[col].astype("Int64")
    if table in SORT_KEYS and len(df):
        df = df.sort_values(SORT_KEYS[table], kind="stable").reset_index(drop=True)
    return df
