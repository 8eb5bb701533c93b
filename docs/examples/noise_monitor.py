"""B_simple inside a plain PyTorch training loop (theory.NoiseScaleMonitor): the MNIST-1D MLP,
SGD with momentum at batch size 64, per-example gradient norms from the loop's own backward."""
import torch
import torch.nn.functional as F

import theory
import training

ds = training.data.load("mnist1d", seed=0)
net = training.models.build("mlp", ds, seed=0)
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
monitor = theory.NoiseScaleMonitor(net, window=100, csv="noise.csv")   # log_dir= for TensorBoard
gen = torch.Generator().manual_seed(0)
for step in range(300):
    idx = torch.randint(ds.n_train, (64,), generator=gen)
    opt.zero_grad()
    F.cross_entropy(net(ds.x_train[idx]), ds.y_train[idx]).backward()   # loss: a batch mean
    reading = monitor.step()                        # after backward, before the optimizer step
    opt.step()
print(f"method: {reading.method}")
print(f"smoothing: {reading.smoothing}")
print(f"b_simple: {reading.b_simple:.4g} +- {reading.b_simple_se:.2g}")
print(f"g_sq: {reading.g_sq:.4g}")
print(f"trace_sigma: {reading.trace_sigma:.4g}")
print(f"csv rows: {sum(1 for _ in open('noise.csv')) - 1}")
