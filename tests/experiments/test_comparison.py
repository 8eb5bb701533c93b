"""The multi-optimizer verdict: which optimizer extends perfect scaling further."""

from dataclasses import dataclass

import pandas as pd

from experiments.comparison import optimizer_sentences


@dataclass
class FakeRun:
    """What the sentences read from a run: its label, optimizer and planned sparsities."""

    label: str
    optimizer: str
    spec: dict


def fits(rows):
    cols = ["series", "b_crit", "b_crit_lo", "b_crit_hi", "note"]
    return pd.DataFrame(rows, columns=cols).set_index("series")


RUNS = (FakeRun("opt (momentum)", "momentum", {"sparsities": [0.0, 0.9]}),
        FakeRun("opt (adamw)", "adamw", {"sparsities": [0.0, 0.9]}))


def test_separated_intervals_name_the_optimizer_with_the_larger_critical_batch():
    table = fits([("opt (momentum), dense", 450.0, 380.0, 530.0, ""),
                  ("opt (adamw), dense", 900.0, 700.0, 1200.0, ""),
                  ("opt (momentum), 90 % sparse", 660.0, 500.0, 800.0, ""),
                  ("opt (adamw), 90 % sparse", 700.0, 600.0, 900.0, "")])
    dense, sparse = optimizer_sentences(RUNS, table)
    assert dense == ("Which optimizer extends perfect scaling further, dense: opt (adamw) extends "
                     "perfect scaling further (the intervals do not overlap). Fitted B_crit (90 % "
                     "intervals): opt (adamw) 900 [700, 1200]; opt (momentum) 450 [380, 530].")
    assert sparse.startswith("Which optimizer extends perfect scaling further, 90 % sparse: not "
                             "resolved: opt (adamw) has the largest B_crit but the intervals overlap")


def test_a_bound_decides_nothing_and_unfitted_levels_are_skipped():
    table = fits([("opt (momentum), dense", 450.0, 380.0, 530.0, ""),
                  ("opt (adamw), dense", 9000.0, 5000.0, 20000.0,
                   "B_crit at the edge of what the batch sizes resolve: a bound"),
                  ("opt (momentum), 90 % sparse", 660.0, 500.0, 800.0, "")])
    (dense,) = optimizer_sentences(RUNS, table)
    assert "dense: not resolved: a critical batch at the edge" in dense
    assert "opt (adamw) 9000 [5000, 20000] (a bound: at the edge of the measured batch sizes)" in dense


def test_one_optimizer_has_no_comparison():
    table = fits([("a (momentum), dense", 450.0, 380.0, 530.0, ""),
                  ("b (momentum), dense", 900.0, 700.0, 1200.0, "")])
    runs = (FakeRun("a (momentum)", "momentum", {"sparsities": [0.0]}),
            FakeRun("b (momentum)", "momentum", {"sparsities": [0.0]}))
    assert optimizer_sentences(runs, table) == []
