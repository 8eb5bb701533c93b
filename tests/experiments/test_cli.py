"""The CLI's other commands: list, probe, help, report errors."""

import pytest

import training
from experiments import cli


def test_list(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "data sets: " in out and "mnist1d" in out and "teacher" in out
    assert "pruning methods: " in out and "snip" in out
    assert "configs: " in out and "quickstart" in out


@pytest.mark.parametrize("command", ["study", "report", "probe", "list", "bench"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    assert len(capsys.readouterr().out.splitlines()) > 3


def test_probe_matches_the_library(capsys):
    import theory

    argv = ["probe", "--dataset", "teacher", "--dataset-option", "n=400", "--model", "linear",
            "--examples", "64"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    ds = training.data.load("teacher", n=400)
    net = training.models.build("linear", ds, seed=0)
    expected = theory.gradient_noise(net, ds, examples=64, seed=0, hessian_examples=16)
    line = next(l for l in out.splitlines() if l.strip().startswith("b_simple"))
    assert float(line.split()[1]) == pytest.approx(expected.b_simple, rel=1e-5)


def test_report_of_missing_run_is_a_clean_error(tmp_path, capsys):
    pytest.importorskip("experiments.report")
    status = cli.main(["report", str(tmp_path / "nothing")])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: ") and "Traceback" not in err


def test_bench_dispatches_to_the_trainer_or_the_ddp_benchmark(monkeypatch):
    """`bench ddp ...` hands its options to training.distributed.bench_main, `bench ...` to
    training.bench.main, each untouched; their status is the exit status."""
    from training import bench, distributed

    calls = []
    monkeypatch.setattr(bench, "main", lambda argv: calls.append(("bench", argv)) or 0)
    monkeypatch.setattr(distributed, "bench_main", lambda argv: calls.append(("ddp", argv)) or 3)
    ddp = ["--workers", "1,2", "--per-worker-batch", "8,32", "--out", "run/cost_model.json"]
    assert cli.main(["bench", "ddp", *ddp]) == 3
    assert cli.main(["bench", "--models", "mlp", "--batch-sizes", "8"]) == 0
    assert cli.main(["bench"]) == 0
    assert calls == [("ddp", ddp), ("bench", ["--models", "mlp", "--batch-sizes", "8"]),
                     ("bench", [])]


def test_bench_help_explains_both_benchmarks(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert "sparsescale bench ddp [options]" in out and "cost_model.json" in out
    assert "--models" in out     # then the trainer benchmark's own options
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "ddp", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert "usage: sparsescale bench ddp" in out and "--per-worker-batch" in out and "--out" in out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "bench ddp" in capsys.readouterr().out


def test_bench_ddp_bad_option_is_a_clean_error(capsys):
    assert cli.main(["bench", "ddp", "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "workers" in err and "Traceback" not in err
