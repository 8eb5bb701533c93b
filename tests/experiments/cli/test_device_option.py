"""``--device`` on ``study``, ``branch``, ``bench`` and ``advise``: without a CUDA device, ``cuda`` is one
line and exit status 2 (bad input), before anything is trained or written."""

import pytest
import torch

from experiments.cli import main as cli

NO_CUDA = ('--device: no CUDA device was found (torch.cuda.is_available() is False); use '
           'device = "cpu"')


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("error: "), err
    return err.removeprefix("error: ").strip()


@pytest.mark.parametrize("command", ["study", "study-dry-run", "branch", "bench", "advise"])
def test_cuda_without_a_gpu_is_one_line_and_exit_2(command, no_cuda, tiny_toml, tmp_path,
                                                   capsys):
    out = tmp_path / "run"
    argv = {"study": ["study", str(tiny_toml), "--out", str(out), "--quiet", "--no-report"],
            "study-dry-run": ["study", str(tiny_toml), "--dry-run"],
            "branch": ["branch", str(tiny_toml), "--out", str(out), "--quiet"],
            "bench": ["bench", "--models", "mlp", "--batch-sizes", "8", "--trials", "2"],
            "advise": ["advise", str(tiny_toml), "--out", str(out), "--quiet"],
            }[command]
    assert cli.main([*argv, "--device", "cuda"]) == 2
    assert one_error_line(capsys) == NO_CUDA
    assert not out.exists()


def test_a_spec_asking_for_cuda_without_a_gpu_is_one_line(no_cuda, tiny_toml, tmp_path, capsys):
    tiny_toml.write_text(tiny_toml.read_text().replace('model = "mlp"\n',
                                                       'model = "mlp"\ndevice = "cuda"\n'))
    out = tmp_path / "run"
    assert cli.main(["study", str(tiny_toml), "--out", str(out), "--quiet", "--no-report"]) == 2
    assert one_error_line(capsys) == NO_CUDA.replace("--device", "workload.device")
    assert not out.exists()


@pytest.mark.parametrize("value", ["gpu", "cuda:x"])
def test_a_malformed_device_is_one_line(value, capsys):
    assert cli.main(["bench", "--models", "mlp", "--device", value]) == 2
    assert one_error_line(capsys) == f"--device: found {value!r}; allowed: cpu, cuda, cuda:N"


def test_bench_takes_a_precision(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--precision", "fp16"])
    assert info.value.code == 2
    assert "invalid choice: 'fp16'" in capsys.readouterr().err
