"""An older store read under today's schema, and upgraded when opened for writing: the table
``schedule_probes`` (stores before 2026-12) is ``stage_probes``."""

import sqlite3

from experiments.store.database import DB_NAME, open_store
from experiments.store.results import load_results
from experiments.measures.probes.store import ProbeRow, write_probes
from experiments.measures.stage.store import StageRow
from experiments.store.schema import COLUMNS, RENAMED_TABLES

from .test_database import STUDY

# the table as the schema before 2026-12 made it, word for word
OLD_TABLE = """
CREATE TABLE schedule_probes (   -- L at Lee et al.'s stage: every N steps to the goal
    sparsity REAL NOT NULL, seed INTEGER NOT NULL, batch_size INTEGER NOT NULL,
    trial INTEGER NOT NULL, step INTEGER NOT NULL,
    horizon INTEGER NOT NULL,   -- the trial's own steps-to-result: the run ends there
    quantity TEXT NOT NULL, value REAL,
    examples INTEGER,           -- the sample L's gradients used (NULL: the whole training split)
    seconds REAL, lib_version TEXT NOT NULL, torch_version TEXT NOT NULL,
    PRIMARY KEY (sparsity, seed, batch_size, trial, step, quantity));
"""
OLD_ROWS = [(0.5, 0, 32, trial, step, 3100, "local_lipschitz", 2.0 + trial + step / 1000, 2000,
             9.0, "0.0", "2.0") for trial in (0, 2) for step in (1000, 2000)]


def old_store(path):
    """A store as written before 2026-12: Lee et al.'s stage in ``schedule_probes``."""
    open_store(path, STUDY).close()
    with sqlite3.connect(path / DB_NAME) as conn:
        conn.execute("DROP TABLE stage_probes")
        conn.execute(OLD_TABLE)
        conn.executemany(f"INSERT INTO schedule_probes VALUES ({', '.join('?' * 12)})", OLD_ROWS)


def tables(path):
    with sqlite3.connect(path / DB_NAME) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_an_old_store_reads_schedule_probes_as_stage_probes_then_gains_the_new_name(tmp_path):
    assert RENAMED_TABLES == {"schedule_probes": "stage_probes"}
    old_store(tmp_path)
    before = load_results(tmp_path)   # read-only: nothing migrated
    assert list(before.stage_probes.columns) == list(COLUMNS["stage_probes"])
    assert before.stage_probes[["trial", "step", "value"]].values.tolist() == [
        [0, 1000, 3.0], [0, 2000, 4.0], [2, 1000, 5.0], [2, 2000, 6.0]]
    assert "schedule_probes" in tables(tmp_path) and "stage_probes" not in tables(tmp_path)

    with open_store(tmp_path, STUDY):   # opened for writing: renamed, its rows kept
        pass
    assert "stage_probes" in tables(tmp_path) and "schedule_probes" not in tables(tmp_path)
    after = load_results(tmp_path).stage_probes
    assert after.drop(columns=["lib_version", "torch_version"]).equals(
        before.stage_probes.drop(columns=["lib_version", "torch_version"]))

    with open_store(tmp_path, STUDY) as store:   # and written under the new name
        write_probes(store, 0.5, [ProbeRow(0.5, 0, 32, 0, 0.0, "loss", 2.3, 9.0)],
                     [StageRow(0.5, 0, 32, 1, 1000, 3100, "local_lipschitz", 7.0, 2000)])
    assert load_results(tmp_path).stage_probes.value.tolist() == [7.0]   # the level replaced


def test_a_store_holding_both_names_keeps_its_new_table(tmp_path):
    """A store already upgraded never has its table replaced by an old one beside it."""
    old_store(tmp_path)
    with sqlite3.connect(tmp_path / DB_NAME) as conn:
        conn.execute("CREATE TABLE stage_probes AS SELECT * FROM schedule_probes WHERE 0")
    with open_store(tmp_path, STUDY):
        pass
    assert {"schedule_probes", "stage_probes"} <= tables(tmp_path)
    assert load_results(tmp_path).stage_probes.empty
