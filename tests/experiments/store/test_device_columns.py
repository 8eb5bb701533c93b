"""The groups' device columns (device, device_name, cuda_version, driver_version, precision):
written from the record, NULL in a store written before they existed, which gains them when a
study opens it for writing."""

import sqlite3
from dataclasses import replace

import pandas as pd

from experiments.store.database import DB_NAME, open_store

from experiments.store.results import load_results
from experiments.store.schema import ADDED_COLUMNS, COLUMNS

from .test_database import STUDY, record

DEVICE_COLUMNS = ("device", "device_name", "cuda_version", "driver_version", "precision")


def test_device_columns_round_trip(tmp_path):
    gpu = replace(record("gpu"), device="cuda:0", device_name="NVIDIA H100 80GB HBM3",
                  cuda_version="13.0", driver_version="580.159.04", precision="bf16")
    cpu = replace(record("cpu"), device="cpu", device_name="Some CPU", precision="fp32")
    with open_store(tmp_path, STUDY) as store:
        store.write_group(gpu)
        store.write_group(cpu)
    groups = load_results(tmp_path).groups.set_index("key")
    assert tuple(groups.loc["gpu", list(DEVICE_COLUMNS)]) == (
        "cuda:0", "NVIDIA H100 80GB HBM3", "13.0", "580.159.04", "bf16")
    row = groups.loc["cpu", list(DEVICE_COLUMNS)]
    assert (row.device, row.device_name, row.precision) == ("cpu", "Some CPU", "fp32")
    assert pd.isna(row.cuda_version) and pd.isna(row.driver_version)


def test_a_store_written_before_the_device_columns_reads_them_null_then_gains_them(tmp_path):
    assert set(DEVICE_COLUMNS) <= {name for name, _ in ADDED_COLUMNS["groups"]}
    with open_store(tmp_path, STUDY) as store:
        store.write_group(record("old"))
    db = tmp_path / DB_NAME
    # the columns before them (delay came later still: test_delay_column)
    earlier = ", ".join(c for c in COLUMNS["groups"] if c not in (*DEVICE_COLUMNS, "delay"))
    with sqlite3.connect(db) as conn:   # the groups table as the version before them wrote it
        conn.executescript(f"""
            PRAGMA foreign_keys = OFF;
            CREATE TABLE earlier (
                key TEXT PRIMARY KEY, sparsity REAL NOT NULL, batch_size INTEGER NOT NULL,
                seed INTEGER NOT NULL, status TEXT NOT NULL, steps_to_result INTEGER,
                best_trial INTEGER, max_steps INTEGER NOT NULL, n_trials INTEGER NOT NULL,
                n_reached INTEGER NOT NULL, n_diverged INTEGER NOT NULL, wall_time REAL NOT NULL,
                trial_steps INTEGER NOT NULL, error TEXT, config_json TEXT NOT NULL,
                lib_version TEXT NOT NULL, torch_version TEXT NOT NULL, finished TEXT NOT NULL,
                kernel TEXT);
            INSERT INTO earlier SELECT {earlier} FROM groups;
            DROP TABLE groups;
            ALTER TABLE earlier RENAME TO groups;""")
    with sqlite3.connect(db) as conn:
        have = {r[1] for r in conn.execute("PRAGMA table_info(groups)")}
    assert not have & set(DEVICE_COLUMNS)
    groups = load_results(tmp_path).groups
    assert list(groups.columns) == list(COLUMNS["groups"])
    assert groups[list(DEVICE_COLUMNS)].isna().all().all()
    with open_store(tmp_path, STUDY) as store:   # opened for writing: migrated
        store.write_group(replace(record("new"), device="cpu", precision="fp32"))
    groups = load_results(tmp_path).groups.set_index("key")
    assert groups.loc["new", "precision"] == "fp32" and pd.isna(groups.loc["old", "device"])
