"""Benchmarks of the trainers: :mod:`training.bench.speed` (the vectorized trainer against the
plain ``torch.optim`` loop, ``sparsescale bench``) and :mod:`training.bench.measure` (its clocks,
marginal rates, FLOP counts, matmul peak and peak resident memory)."""
