"""A bundled study: a TOML file in ``experiments/configs/``, run by name (``sparsescale study
NAME``), with its canonical JSON and hash pinned in ``tests/experiments/spec/golden/``.

Adding one touches three places: the TOML file, its golden files (written by ``python
tests/experiments/spec/test_golden_hashes.py``, which the golden test then checks against every
later change) and the page that reports it (``docs/reproductions.md``). This example writes a
small study the way a bundled one is written, loads it as the library loads a bundled config,
prints what the golden files would pin, and runs it.
"""
import json
from pathlib import Path

import experiments
from experiments.spec.study import list_configs, resolve_config

STUDY = """
# What the study asks, in a comment the report's spec section keeps.
name = "teacher_scaling"
description = "steps to result of a small MLP on the teacher task, dense and 50 % sparse"
optimizer = "momentum"
batch_sizes = [16, 64]
sparsities = [0.0, 0.5]
trials = 2
seeds = [0]

[workload]
dataset = "teacher"
dataset_options = {n = 600, dim = 8, num_classes = 3, hidden = 16}
model = "mlp"
model_options = {hidden = [64]}

[goal]
metric = "error"
target = 0.15

[search]
lr = {scale = "log", min = 0.03, max = 0.3}

[budget]
max_steps = 600

[eval]
every = 10

[probes]
enabled = false
"""

if __name__ == "__main__":
    print("bundled:", "quickstart" in list_configs(), resolve_config("quickstart").name)
    path = Path("teacher_scaling.toml")   # in the library: experiments/configs/teacher_scaling.toml
    path.write_text(STUDY)
    spec = experiments.load_spec(path)
    pinned = json.loads(spec.to_json())   # golden/teacher_scaling.json holds this text
    print("golden keys:", " ".join(sorted(pinned)))
    print("hash:", spec.hash[:12])
    print("groups planned:", len(experiments.plan(spec)))
    run_dir = experiments.run_study(spec, out="runs/teacher_scaling", workers=1, quiet=True,
                                    report=False)
    groups = experiments.load_results(run_dir).groups.sort_values(["sparsity", "batch_size"])
    print("groups done:", int((groups.status == "done").sum()), "of", len(groups))
