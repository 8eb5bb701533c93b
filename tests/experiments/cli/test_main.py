"""The CLI's other commands: list, probe, help, report errors."""

import pytest

import training
from experiments.cli import main as cli


def test_list(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "data sets: " in out and "mnist1d" in out and "teacher" in out
    assert "pruning criteria: " in out and "snip" in out
    assert "configs: " in out and "quickstart" in out


@pytest.mark.parametrize("command", ["study", "report", "probe", "list", "bench", "ddp"])
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


def test_probe_takes_the_criterion_under_its_old_option_name_with_a_warning(capsys):
    argv = ["probe", "--dataset", "teacher", "--dataset-option", "n=400", "--model", "linear",
            "--examples", "64", "--sparsity", "0.5"]
    assert cli.main(argv + ["--criterion", "magnitude"]) == 0
    new = capsys.readouterr()
    assert cli.main(argv + ["--method", "magnitude"]) == 0
    old = capsys.readouterr()
    assert old.out == new.out and "(magnitude)" in new.out
    assert "--method is deprecated, use --criterion" in old.err


def test_report_of_missing_run_is_a_clean_error(tmp_path, capsys):
    status = cli.main(["report", str(tmp_path / "nothing")])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: no results store") and len(err.splitlines()) == 1


def test_bench_and_bench_ddp_are_subcommands(monkeypatch):
    """`bench ddp ...` reaches the DDP benchmark's handler, `bench ...` the trainer benchmark's, with
    their options parsed by their own subparsers; the handler's status is the exit status."""
    from experiments.cli import bench

    calls = []
    monkeypatch.setattr(bench, "run_trainer_bench",
                        lambda a: calls.append(("bench", a.models, a.batch_sizes)) or 0)
    monkeypatch.setattr(bench, "run_ddp_bench",
                        lambda a: calls.append(("ddp", a.workers, a.per_worker_batch, str(a.out))) or 3)
    ddp = ["--workers", "1,2", "--per-worker-batch", "8,32", "--out", "run/cost_model.json"]
    assert cli.main(["bench", "ddp", *ddp]) == 3
    assert cli.main(["bench", "--models", "mlp", "--batch-sizes", "8"]) == 0
    assert calls == [("ddp", (1, 2), (8, 32), "run/cost_model.json"), ("bench", "mlp", "8")]


def test_bench_help_explains_both_benchmarks(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert "usage: sparsescale bench" in out and "--models" in out
    assert "ddp" in out and "sparsescale bench ddp --out RUN_DIR/cost_model.json" in out
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "ddp", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert "usage: sparsescale bench ddp" in out and "--per-worker-batch" in out and "--out" in out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "sparsescale bench ddp" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["bench", "ddp", "--workers", "0"], ["workers"]),
    (["ddp", "--batch-size", "8", "--lr", "0.1"], ["RANK", "torchrun"]),
])
def test_bad_input_is_one_error_line(argv, words, capsys, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "Traceback" not in err
    assert all(w in err for w in words)


def test_bad_option_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["probe", "--dataset-option", "n400"])
    assert info.value.code == 2
    assert "expected KEY=VALUE, got 'n400'" in capsys.readouterr().err
