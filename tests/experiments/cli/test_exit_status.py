"""The command line's exit status says whose fault an error is: 2 for bad input (a ValueError:
a spec problem, an unknown data set, a store of another program's), 1 for a storage or IO
failure (an OSError: a run folder in use by another driver, a read-only folder, a file that
cannot be read, a required kernel that cannot be built), with one `error:` line naming the
path."""

import pytest

from experiments.cli import main as cli
from experiments.store.database import DB_NAME

RUN = ["--quiet", "--no-report", "--no-cost-model"]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("error: "), err
    return err


@pytest.mark.parametrize("case", ["spec key", "data set", "foreign store"])
def test_bad_input_exits_2(case, tiny_toml, tmp_path, capsys):
    if case == "spec key":
        tiny_toml.write_text(tiny_toml.read_text().replace("trials = 4", "trails = 4"))
        argv, words = ["study", str(tiny_toml), "--dry-run"], ["did you mean 'trials'"]
    elif case == "data set":
        argv, words = ["probe", "--dataset", "no-such-data"], ["unknown data set"]
    else:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / DB_NAME).write_bytes(b"not sqlite at all" * 64)
        argv, words = ["report", str(run_dir)], ["not a sparsescale results store",
                                                 str(run_dir / DB_NAME)]
    assert cli.main(argv) == 2
    err = one_error_line(capsys)
    assert all(w in err for w in words), err


def test_folder_in_use_by_another_driver_exits_1_naming_the_store(tiny_toml, tmp_path, capsys,
                                                                  driver_holding):
    out = tmp_path / "run"
    holder = driver_holding(tiny_toml, out)
    assert cli.main(["study", str(tiny_toml), "--out", str(out), *RUN]) == 1
    err = one_error_line(capsys)
    assert str(out / DB_NAME) in err and "in use" in err and str(holder.pid) in err, err


def test_read_only_run_folder_exits_1_naming_it(tiny_toml, tmp_path, capsys, read_only):
    out = tmp_path / "run"
    out.mkdir()
    read_only(out)
    assert cli.main(["study", str(tiny_toml), "--out", str(out), *RUN]) == 1
    err = one_error_line(capsys)
    assert f"cannot write the results store {out / DB_NAME}" in err, err
    assert not (out / DB_NAME).exists()


def test_unreadable_spec_file_exits_1_naming_it(tmp_path, capsys):
    folder = tmp_path / "spec.toml"
    folder.mkdir()   # a folder where the file should be
    assert cli.main(["study", str(folder), "--dry-run"]) == 1
    err = one_error_line(capsys)
    assert f"cannot read the study spec {folder}" in err, err


def test_unwritable_report_folder_exits_1_naming_it(full, tmp_path, capsys):
    (tmp_path / "file").write_text("a file, not a folder")
    out = tmp_path / "file" / "report"
    assert cli.main(["report", str(full), "--out", str(out)]) == 1
    err = one_error_line(capsys)
    assert f"cannot write the report into {out}" in err, err


def test_a_required_kernel_that_cannot_be_built_exits_1(tiny_toml, tmp_path, capsys,
                                                        monkeypatch):
    """SPARSESCALE_REQUIRE_KERNEL=1 on a machine without a compiler: the study stops before
    training with the reason and the build folder, instead of warning and training eagerly."""
    from training.engine import compiled_kernel as kernels

    monkeypatch.delenv(kernels.DISABLE_ENV, raising=False)
    monkeypatch.setenv(kernels.REQUIRE_ENV, "1")
    monkeypatch.setenv("CXX", "no-such-compiler-x9")
    kernels._build.cache_clear()
    try:
        status = cli.main(["study", str(tiny_toml), "--out", str(tmp_path / "run"), *RUN])
    finally:
        kernels._build.cache_clear()
    assert status == 1
    err = one_error_line(capsys)
    assert "no-such-compiler-x9" in err and kernels.REQUIRE_ENV in err, err
    assert str(kernels.build_directory("fused_sequential")) in err, err
