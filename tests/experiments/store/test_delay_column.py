"""The delay column of groups and trials (the gradient-delay axis): written from the record,
0 in a store written before it, which gains it (0 on every earlier row) when a study opens it for
writing; a read-only reader reads 0 without changing the store."""

import sqlite3
from dataclasses import replace

from experiments.store.database import DB_NAME, open_store
from experiments.store.results import load_results
from experiments.store.schema import COLUMNS

from .test_database import STUDY, record


def _drop_delay(db, table: str) -> None:
    """``table`` as the version before the delay axis wrote it (the column removed)."""
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute(f"ALTER TABLE {table} DROP COLUMN delay")


def test_the_delay_round_trips_on_groups_and_their_trials(tmp_path):
    with open_store(tmp_path, STUDY) as store:
        store.write_group(record("sync"))
        store.write_group(replace(record("late"), delay=4))
    res = load_results(tmp_path)
    assert dict(zip(res.groups.key, res.groups.delay)) == {"sync": 0, "late": 4}
    assert sorted(zip(res.trials.group_key, res.trials.delay)) == [
        ("late", 4), ("late", 4), ("sync", 0), ("sync", 0)]
    # B keyed with its delay: the delayed group of the same (sparsity, B, seed) sorts after
    assert list(res.groups.key) == ["sync", "late"]


def test_a_store_written_before_the_delay_axis_reads_delay_0_then_is_migrated(tmp_path):
    with open_store(tmp_path, STUDY) as store:
        store.write_group(record("old"))
    db = tmp_path / DB_NAME
    for table in ("groups", "trials"):
        _drop_delay(db, table)
    groups = load_results(tmp_path).groups   # read-only: read as 0, the store unchanged
    assert list(groups.columns) == list(COLUMNS["groups"]) and list(groups.delay) == [0]
    with sqlite3.connect(db) as conn:
        assert "delay" not in {r[1] for r in conn.execute("PRAGMA table_info(groups)")}
    with open_store(tmp_path, STUDY) as store:   # opened for writing: migrated
        store.write_group(replace(record("new"), delay=2))
    with sqlite3.connect(db) as conn:
        stored = dict(conn.execute("SELECT key, delay FROM groups"))
        trials = sorted(conn.execute("SELECT group_key, delay FROM trials"))
    assert stored == {"old": 0, "new": 2}
    assert trials == [("new", 2), ("new", 2), ("old", 0), ("old", 0)]
