"""What a report says about its workload beyond the numbers: a spec's ``reductions`` text (how
the design is reduced from the paper's), and a byte-level language model's goal in bits per
byte."""

import math

import pytest

from experiments.report.formatting import goal_text
from experiments.report.write import write_report
from experiments.spec.study import SpecError, loads, reductions
from experiments.store.database import open_store
from experiments.store.schema import StudyInfo

from ..synthetic import spec_text

TEXT = "Reduced from the paper: 8 trials per batch size (paper: 100)."


def test_the_report_prints_the_reductions(tmp_path):
    spec = loads(f'reductions = "{TEXT}"\n' + spec_text())
    assert reductions(spec) == TEXT
    assert spec.hash == loads(spec_text()).hash      # not part of the study's hash
    with open_store(tmp_path, StudyInfo(spec.name, spec.toml, spec.hash, spec.to_json())):
        pass
    write_report([tmp_path])
    md = (tmp_path / "report.md").read_text()
    studies = md.split("## Studies")[1].split("## ")[0]
    assert TEXT in studies
    assert reductions(loads(spec_text())) == ""


def test_reductions_must_be_text():
    with pytest.raises(SpecError, match="reductions: found 3; allowed: a string"):
        loads("reductions = 3\n" + spec_text())


def test_a_byte_level_goal_is_also_in_bits_per_byte():
    lm = loads(spec_text().replace('dataset = "teacher"', 'dataset = "python_source"')
               .replace('model = "mlp"', 'model = "transformer_lm"')
               .replace('metric = "error"\ntarget = 0.2', 'metric = "loss"\ntarget = 1.5'))
    bits = 1.5 / math.log(2)
    assert goal_text(lm) == f"validation loss < 1.5 ({bits:.4g} bits per byte)"
    assert goal_text(loads(spec_text())) == "validation error < 0.2"
