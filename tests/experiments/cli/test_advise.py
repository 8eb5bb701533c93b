"""``sparsescale advise``: the advice printed and its report written; a model or data set that
cannot be loaded is one error line and exit status 2, before anything trains."""

import pytest

from experiments.cli import main as cli


def test_advise_prints_and_writes_the_report(tiny_toml, tmp_path, capsys):
    out = tmp_path / "advice"
    assert cli.main(["advise", str(tiny_toml), "--k-max", "4", "--lr-trials", "4", "--quiet",
                     "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "recommended batch size: " in text and "of the equivalent sweep" in text
    assert f"report: {out / 'report.html'}" in text
    assert (out / "report.md").exists() and (out / "figures" / "advice.png").exists()


@pytest.mark.parametrize("args, message", [
    (["--model", "no_such_module_i29:mlp"], "error: workload.model: no_such_module_i29:mlp: no module named"),
    (["--dataset", "no_such_data"], "error: workload.dataset: found 'no_such_data'"),
    (["--model", "experiments.cli.main:DESCRIPTION"], "error: workload.model: experiments.cli.main:DESCRIPTION is str"),
    (["--batch-size", "100000"], "error: batch_size must be an integer in [1, "),
])
def test_a_workload_that_cannot_be_loaded_is_one_line_and_status_2(tiny_toml, args, message, capsys):
    assert cli.main(["advise", str(tiny_toml), "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
