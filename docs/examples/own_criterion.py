"""A pruning criterion of your own: register it, prune with it, and run a small study that
names it by import path (this file is ``own_criterion.py``; its digest keys the study).

The registration runs at import of this file, outside the ``__main__`` guard: a study imports
the criterion by its path, which runs this file's top level again as the module
``own_criterion`` (the same function from the same file: its entry is replaced, not refused).
"""
import torch

import experiments
import pruning
import training


@pruning.register("gradient_magnitude", needs=("dataset",), per_class=10)
def gradient_magnitude(model, params, context):
    """|dL/dw| on 10 training examples per class: the weights with the largest gradients are
    kept (SNIP without the weight factor)."""
    x, y = context.batch(model)            # the scoring batch, on the model's device and dtype
    loss = torch.nn.functional.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, list(params.values()))
    return {name: g.abs() for name, g in zip(params, grads)}


# the criterion by the import path of this file (found on sys.path: the script's folder)
SPEC = """
name = "own_criterion"
batch_sizes = [16, 64]
sparsities = [0.0, 0.5]
trials = 2
goal = {target = 0.15}
search = {lr = {scale = "log", min = 0.03, max = 0.3}}
budget = {max_steps = 600}
eval = {every = 10}
probes = {enabled = false}
pruning = {criterion = "own_criterion:gradient_magnitude"}
workload = {dataset = "teacher", model = "mlp", model_options = {hidden = [64]}, dataset_options = {n = 600, dim = 8, num_classes = 3, hidden = 16}}
"""

if __name__ == "__main__":
    ds = training.data.load("mnist1d", num_samples=4000, seed=0)
    net = training.models.build("mlp", ds, seed=0)                 # 40-100-100-10
    mask = pruning.prune(net, "gradient_magnitude", 0.9, dataset=ds)
    snip = pruning.prune(net, "snip", 0.9, dataset=ds)
    print("criteria:", " ".join(pruning.list_criteria()))
    print("sparsity:", round(mask.sparsity(), 6))
    print("kept per layer:", " ".join(f"{name}={mask.kept(name)}" for name in mask))
    both = sum(int((mask[k] * snip[k]).sum()) for k in mask)
    print("kept by snip too:", f"{both / mask.kept():.2f}")
    print("recorded:", mask.info["criterion"], mask.info["per_class"])

    spec = experiments.loads_spec(SPEC)
    print("spec pruning table:", spec.pruning_criterion,
          spec.criterion_digests[spec.pruning_criterion][:12])
    run_dir = experiments.run_study(spec, out="runs/own_criterion", workers=1, quiet=True,
                                    report=False)
    groups = experiments.load_results(run_dir).groups.sort_values(["sparsity", "batch_size"])
    print("groups done:", int((groups.status == "done").sum()), "of", len(groups))
    print("steps to result:", " ".join(f"{g.sparsity}/{g.batch_size}={g.steps_to_result}"
                                       for g in groups.itertuples()))
