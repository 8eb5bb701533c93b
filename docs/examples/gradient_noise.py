"""Gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018) and the top Hessian
eigenvalue of the MNIST-1D MLP at initialization, dense and 90 % sparse."""
import pruning
import theory
import training

ds = training.data.load("mnist1d", seed=0)       # 7,200 training examples
net = training.models.build("mlp", ds, seed=0)
mask = pruning.prune(net, "snip", sparsity=0.9, dataset=ds)

for label, m in (("dense", None), ("sparse", mask)):
    # |G|^2 and tr(Sigma) on the whole training split (float64); hessian_examples=0 skips B_noise
    est = theory.gradient_noise(net, ds, mask=m, hessian_examples=0)
    top = theory.hessian_top_eigenvalues(net, ds, k=1, mask=m, examples=512)   # Lanczos
    print(f"{label} g_sq: {est.g_sq:.6g}")
    print(f"{label} trace_sigma: {est.trace_sigma:.6g}")
    print(f"{label} b_simple: {est.b_simple:.6g}")
    print(f"{label} lambda_max: {float(top[0]):.6g}")
