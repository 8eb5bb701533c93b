"""experiments.spec.plan: the order a study's groups are trained in."""

from experiments.spec.plan import plan, run_order
from experiments.spec.study import load, resolve_config


def test_run_order_puts_the_expected_longest_groups_first():
    """McCandlish et al. (2018)'s S(B) = S_min (1 + B_noise / B) times a step's cost B + 32: a
    U in B, so both ends come before the middle; a sparser level before a denser one at the
    same B. On the quickstart the two longest groups (90 % at B = 4096 and at B = 8) used to be
    first and last."""
    groups = plan(load(resolve_config("quickstart")))
    order = [(g.sparsity, g.batch_size) for g in run_order(groups)]
    assert sorted(order) == sorted((g.sparsity, g.batch_size) for g in groups)
    assert order[0] == (0.9, 4096)
    pos = {cell: i for i, cell in enumerate(order)}
    for s in (0.0, 0.9):
        assert pos[(s, 8)] < pos[(s, 128)] and pos[(s, 4096)] < pos[(s, 256)]
    for b in (8, 128, 4096):
        assert pos[(0.9, b)] < pos[(0.0, b)]
    assert pos[(0.9, 8)] < len(order) // 2
    assert run_order([]) == []
