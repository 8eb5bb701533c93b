"""The programs a store records: each group's (``groups.program``, named ``kernel`` in stores
written before 2026-12, which are read under the new name and renamed when a study opens them
for writing), and each cell's (the ``programs`` table: the first record of a batch size
stands)."""

import sqlite3
from dataclasses import replace

from experiments.store.database import DB_NAME, open_store

from experiments.store.results import load_results
from experiments.store.schema import COLUMNS, RENAMED_COLUMNS

from .test_database import STUDY, record


def test_a_cells_first_recorded_program_stands(tmp_path):
    with open_store(tmp_path, STUDY) as store:
        assert store.programs() == {}
        assert store.record_programs({8: ("per_trial", "measured"), 64: ("fused", "ruled")}) == {
            8: "per_trial", 64: "fused"}
        # a later choice (another machine's cache, a rerun under load) does not replace it
        assert store.record_programs({8: ("plain", "measured"), 16: ("plain", "measured")}) == {
            8: "per_trial", 16: "plain", 64: "fused"}
    programs = load_results(tmp_path).programs
    assert list(programs.columns) == list(COLUMNS["programs"])
    assert programs[["batch_size", "program", "choice"]].values.tolist() == [
        [8, "per_trial", "measured"], [16, "plain", "measured"], [64, "fused", "ruled"]]


def old_store(path):
    """A store as written before 2026-12: the group's program in a column named ``kernel``, no
    ``programs`` table."""
    with open_store(path, STUDY) as store:
        store.write_group(replace(record("old"), program="per_trial"))
    with sqlite3.connect(path / DB_NAME) as conn:
        conn.executescript("ALTER TABLE groups RENAME COLUMN program TO kernel;"
                           "DROP TABLE programs;")


def columns(path, table):
    with sqlite3.connect(path / DB_NAME) as conn:
        return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]


def test_an_old_store_reads_kernel_as_program_then_gains_the_new_name(tmp_path):
    assert RENAMED_COLUMNS["groups"] == (("kernel", "program"),)
    old_store(tmp_path)
    assert "kernel" in columns(tmp_path, "groups") and "program" not in columns(tmp_path, "groups")
    before = load_results(tmp_path)   # read-only: nothing migrated
    assert list(before.groups.columns) == list(COLUMNS["groups"])
    assert before.groups.program.tolist() == ["per_trial"] and before.programs.empty
    assert "kernel" in columns(tmp_path, "groups") and columns(tmp_path, "programs") == []
    with open_store(tmp_path, STUDY) as store:   # opened for writing: renamed, table added
        store.write_group(replace(record("new"), program="plain"))
        store.record_programs({32: ("per_trial", "measured")})
    have = columns(tmp_path, "groups")
    assert "program" in have and "kernel" not in have
    after = load_results(tmp_path)
    assert after.groups.set_index("key").program.to_dict() == {"old": "per_trial", "new": "plain"}
    assert after.programs.program.tolist() == ["per_trial"]
