"""The run folder: a store that is locked, corrupt, foreign or from another spec, a read-only
folder and a full disk are each refused with one clear line before any training starts, and the
refusal writes nothing. What the folder holds is bad input (StoreContentError, a ValueError); a
store that cannot be used is a storage failure (StoreIOError, an OSError)."""

import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import experiments
from experiments.cli import main as cli
from experiments.store.database import DB_NAME, StoreContentError, StoreError, StoreIOError

from .conftest import SPEC, NoTraining, edit, snapshot


def refused(spec_file, out, kind: type[StoreError]) -> str:
    """Run the study into ``out`` expecting a StoreError of ``kind`` before any training; its
    message."""
    with pytest.raises(StoreError) as info:
        experiments.run_study(spec_file, out=out, executor=NoTraining(), quiet=True, report=False)
    message = str(info.value)
    assert type(info.value) is kind, (type(info.value), message)
    assert "\n" not in message, message
    return message


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A run folder holding the finished tiny study (run in-process on one thread)."""
    base = tmp_path_factory.mktemp("finished")
    spec = base / "reliability.toml"
    spec.write_text(SPEC)
    run_dir = experiments.run_study(spec, out=base / "run", executor=ThreadPoolExecutor(1),
                                    quiet=True, report=False)
    return spec, run_dir


def copy_run(finished, tmp_path):
    spec, run_dir = finished
    shutil.copytree(run_dir, tmp_path / "run")
    return spec, tmp_path / "run"


def test_store_from_another_spec_is_refused_untouched(finished, tmp_path):
    spec, run_dir = copy_run(finished, tmp_path)
    other = tmp_path / "other.toml"
    other.write_text(edit("target = 0.3", "target = 0.25"))
    before = snapshot(run_dir)
    message = refused(other, run_dir, StoreContentError)
    assert "holds a different study" in message and "another --out folder" in message
    assert snapshot(run_dir) == before


@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign"])
def test_corrupt_or_foreign_store_is_refused_untouched(finished, tmp_path, damage):
    spec, run_dir = copy_run(finished, tmp_path)
    db = run_dir / DB_NAME
    if damage == "garbage":
        db.write_bytes(b"this is not a database" * 100)
    elif damage == "truncated":
        db.write_bytes(db.read_bytes()[:3000])
    else:   # some other program's SQLite file in the run folder
        db.unlink()
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        con.execute("INSERT INTO notes (text) VALUES ('keep me')")
        con.commit()
        con.close()
    before = snapshot(run_dir)
    message = refused(spec, run_dir, StoreContentError)
    assert str(db) in message and "not a sparsescale results store" in message, message
    assert snapshot(run_dir) == before
    with pytest.raises(StoreContentError, match="not a sparsescale results store"):
        experiments.load_results(run_dir)


def test_empty_store_left_by_a_run_killed_at_once_is_completed(spec_file, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / DB_NAME).touch()   # SQLite had created the file, nothing more
    with pytest.raises(StoreContentError, match="holds no study yet"):
        experiments.load_results(run_dir)
    experiments.run_study(spec_file, out=run_dir, executor=ThreadPoolExecutor(1), quiet=True,
                          report=False)
    assert set(experiments.load_results(run_dir).groups.status) == {"done"}


def test_store_errors_reach_the_command_line_as_one_line(tmp_path, spec_file, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.sqlite").write_bytes(b"not sqlite at all" * 64)
    for argv in (["study", str(spec_file), "--out", str(run_dir), "--quiet", "--no-report"],
                 ["report", str(run_dir)]):
        status = cli.main(argv)
        out, err = capsys.readouterr()
        assert status == 2 and "Traceback" not in err, argv
        assert err.count("\n") == 1 and err.startswith("error: "), err
        assert "not a sparsescale results store" in err, err


def test_folder_in_use_by_another_driver_is_refused_then_freed_by_its_death(
        spec_file, tmp_path, driver_holding):
    out = tmp_path / "run"
    holder = driver_holding(spec_file, out)
    try:
        start = time.monotonic()
        message = refused(spec_file, out, StoreIOError)
        assert time.monotonic() - start < 20   # refused at once, not after a lock timeout
        assert "in use" in message and str(holder.pid) in message, message
        assert str(out / DB_NAME) in message, message
    finally:
        holder.kill()
        holder.wait()
    # the lock dies with its process: a rerun after the kill proceeds
    run_dir = experiments.run_study(spec_file, out=out, executor=ThreadPoolExecutor(1),
                                    quiet=True, report=False)
    assert set(experiments.load_results(run_dir).groups.status) == {"done"}


@pytest.mark.parametrize("state", ["empty", "finished"])
def test_read_only_run_folder_is_refused_before_training(finished, tmp_path, read_only, state):
    if state == "finished":
        spec, run_dir = copy_run(finished, tmp_path)
    else:
        spec, run_dir = finished[0], tmp_path / "run"
        run_dir.mkdir()
    read_only(run_dir)
    before = snapshot(run_dir)
    message = refused(spec, run_dir, StoreIOError)
    assert str(run_dir) in message and "cannot write" in message, message
    assert snapshot(run_dir) == before


def test_run_folder_below_a_file_is_refused(spec_file, tmp_path):
    (tmp_path / "plain").write_text("a file, not a folder")
    message = refused(spec_file, tmp_path / "plain" / "run", StoreIOError)
    assert "cannot write" in message and "plain" in message


# Run inside a private mount namespace on a 16 KiB tmpfs (the test machine's mounts are untouched).
FULL = textwrap.dedent("""\
    import sys
    from concurrent.futures import Executor
    import experiments

    class NoTraining(Executor):
        def submit(self, fn, *args, **kwargs):
            print("TRAINING STARTED", flush=True)
            raise SystemExit(3)

    try:
        experiments.run_study(sys.argv[1], out=sys.argv[2], executor=NoTraining(), quiet=True,
                              report=False)
    except experiments.StoreError as exc:
        print(f"{type(exc).__name__}:", exc)
    """)


def test_full_disk_is_refused_before_training(spec_file, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if not shutil.which("unshare"):
        pytest.skip("needs unshare(1) for a private tmpfs mount")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot create a mount namespace here (needs root or user namespaces)")
    script = ('mount -t tmpfs -o size=16k tmpfs "$1" || exit 77; '
              'head -c 1M /dev/zero > "$1/filler" 2>/dev/null; '
              'exec "$0" -c "$2" "$3" "$1/run"')
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                           sys.executable, str(mnt), FULL, str(spec_file)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode == 77:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    assert "TRAINING STARTED" not in proc.stdout and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("StoreIOError: "), proc.stdout + proc.stderr
    assert "disk" in lines[0] and "run" in lines[0], lines[0]
