"""Specs naming registered workloads keep their canonical JSON, spec hash and group keys bit for
bit: the values below were computed at the commit before factories by import path existed
(96f20e3), so every store written before them is still found, reused and reported."""

import hashlib
import textwrap

import pytest

from experiments.spec.plan import plan
from experiments.spec.study import from_canonical, loads

SPECS = {
"tiny": textwrap.dedent("""\
    name = "tiny"
    optimizer = "momentum"
    batch_sizes = [8, 32, 128]
    sparsities = [0.0, 0.5]
    trials = 4
    seeds = [0]

    [workload]
    dataset = "teacher"
    dataset_options = {n = 600, dim = 8, num_classes = 3, hidden = 16}
    model = "mlp"
    model_options = {hidden = [16]}

    [goal]
    metric = "error"
    target = 0.3

    [search]
    lr = {scale = "log", min = 0.01, max = 1.0}
    momentum = {scale = "reverse-log", min = 0.5, max = 0.99}

    [budget]
    examples = 8000
    min = 20
    max = 200

    [eval]
    every = 10

    [probes]
    enabled = false
    """),
"series": textwrap.dedent("""\
    name = "series"
    optimizer = ["momentum", "adamw"]
    batch_sizes = {min = 8, max = 256}
    sparsities = [0.0, 0.9]
    trials = 6
    seeds = [0, 1]

    [workload]
    dataset = "mnist1d"
    dataset_options = {num_samples = 4000}
    model = "cnn1d"

    [goal]
    metric = "loss"
    target = 0.5
    comparison = "<="

    [pruning]
    criterion = ["snip", "magnitude"]
    sanity = ["shuffle"]

    [search]
    seed = 3
    lr = {scale = "log", min = 1e-3, max = 1.0}
    momentum = 0.9
    decay_steps = {scale = "linear", min = 0.5, max = 1.0, relative = true}
    end_factor = {scale = "log", min = 1e-3, max = 0.1}
    weight_decay = {scale = "log", min = 1e-5, max = 0.1}

    [search.optimizers.adamw]
    lr = {scale = "log", min = 1e-4, max = 1e-2}

    [budget]
    max_steps = 300

    [eval]
    kind = "geometric"
    first = 5
    ratio = 1.5

    [probes]
    batch_sizes = ["smallest", "largest"]
    points = 4
    curvature_examples = 256

    [branching]
    enabled = true
    k_max = 8
    """),
}

# (spec, variant, spec hash = sha256 of the canonical JSON, sha256 of the variant's group keys)
GOLDEN = [
    ('tiny', 'tiny', 'b8a183d932cf1a7e2ac658861d242d17a5a553fdd7135770344d82cd4d85c19b',
     'a90ed8564beac02a0c86b11768b5032cea25d5fb9f79b561f7eff8e5a942866e'),
    ('series', 'series-momentum-snip', 'd8a2780b1b56ecc1cb9081ddcaf4b70abac0681febc877dd354b47f40a32fa69',
     '0ff953449ad82995c1cd6d7120906db773d5d9fa6bd55e63415edb0b6ee56e2b'),
    ('series', 'series-momentum-snip-shuffle', '80c1931fa50ca4fc73f3119d8d883fa26c6ca9813e4efa626d4c6b9f0e50ec75',
     '9e5cb79a08bf1e65bb1f24e680ae2f5d9a4787ab04d4ce34826a58e3d58a4ec7'),
    ('series', 'series-momentum-magnitude', '5f6fba55eb47e74df8e16f68fdc98b50ecc2a88529051c7014362c8416813db4',
     '2c9d7524e0f7ced81b8e182f3776d68c499ebfb07290cccf18500f26ecf8c5fa'),
    ('series', 'series-momentum-magnitude-shuffle', '79eb3abaa8bf877b01e1d0c1a6709b00c52157e8082033302de8c6f051b58d20',
     '953321ba11dd7e1f6d290cd9db74123eb8ee37a664dc7edcfbd856a70caeec66'),
    ('series', 'series-adamw-snip', '1a972987c34f75fbe6f75f9625a939c012388fa79ec0db44af7e7e01e7890a7e',
     '8a6bac80d42652d67f8fdc4a38723f4804c63087592e0bdc0956ed0aaf5238ba'),
    ('series', 'series-adamw-snip-shuffle', '527970ffa2b69505ee18569a505f4d56489c1e50c19410185aaea23e7c275fc8',
     '6051e9d8b9a59714cf24e181e8322b70e75f28f8592390cb84d7ed92b1b07826'),
    ('series', 'series-adamw-magnitude', '6f9b29841658a09c31c54bde13761e05c85770b2ef572430dcff270cbf5f15b0',
     'c150d4e3f80068cdcc1fcd211277cee885ea4d9e9f5f253ffa81711f7f659f36'),
    ('series', 'series-adamw-magnitude-shuffle', '409128d5331b18d507d0528559ac0cd34fdc6870bfb4a143fb897527f24e6572',
     '3766d58ca2563390d1bd3d6c668b60cf90a0a1472d3af83448df052c974b8b09'),
]


@pytest.mark.parametrize("name,variant,spec_hash,keys", GOLDEN, ids=[g[1] for g in GOLDEN])
def test_registered_workloads_keep_their_hashes_and_group_keys(name, variant, spec_hash, keys):
    spec = next(v for v in loads(SPECS[name]).variants() if v.name == variant)
    assert hashlib.sha256(spec.to_json().encode()).hexdigest() == spec.hash == spec_hash
    assert '_digest"' not in spec.to_json()
    groups = plan(spec)
    assert hashlib.sha256(" ".join(g.key for g in groups).encode()).hexdigest() == keys
    for g in groups:   # each key is the hash of its config, which names no digest either
        assert hashlib.sha256(g.config_json.encode()).hexdigest()[:20] == g.key
        assert "_digest" not in g.config_json
    assert from_canonical(spec.canonical()).hash == spec_hash
