"""The runner's rounds under a group-sequential rule: a huge paired effect stops the study at
look 1 (later rounds never trained, the stopping look stored, a rerun trains nothing); a null one
with a wide spread runs every round to the last look; a fixed rule trains everything at once."""

import math

import pytest

from experiments.report.design_view import looks
from experiments.run.rounds import round_seeds, stopped_at, train_rounds
from experiments.spec.study import loads
from experiments.store.database import Store
from dataclasses import astuple

from experiments.measures.stage.store import StageRow
from experiments.store.schema import GroupRecord

from .test_lipschitz_inside import IN_RUN

SEEDS = (0, 1, 2, 3)
SEQUENTIAL = (IN_RUN.replace("seeds = [0]", f"seeds = {list(SEEDS)}")
              + '\n[stopping]\nrule = "group_sequential"\nsparsity = 0.5\nrounds = 2\n'
                'alpha = 0.1\n')
# per trial of a seed: the spread of the paired log ratio (mean 0)
SPREAD = (0.5, -0.5, 0.4, -0.4)


def _trainer(store, effect, spread):
    """Writes, for each seed of the tasks (one task per seed), both levels' groups at B = 8 with
    L at steps 1,000 and 1,250 of 4 trials: log L_sparse - log L_dense = effect + spread[trial]."""
    trained = []

    def train(part):
        for seed in part:
            trained.append(seed)
            for sparsity in (0.0, 0.5):
                shift = [effect + d if sparsity else 0.0 for d in spread]
                stage = tuple(StageRow(sparsity, seed, 8, trial, step, 1250,
                                          "local_lipschitz", math.exp(1.0 + shift[trial]
                                                                      + 1e-3 * step / 250))
                              for trial in range(4) for step in (1000, 1250))
                store.write_group(GroupRecord(
                    key=f"{sparsity}-{seed}", sparsity=sparsity, batch_size=8, seed=seed,
                    status="done", steps_to_result=None, best_trial=None, max_steps=1250,
                    wall_time=0.0, trial_steps=0, config_json="{}",
                    measured=(("stage_probes", tuple(map(astuple, stage))),)))

    return train, trained


@pytest.mark.parametrize("effect, spread, stop, trained_seeds, why", [
    (1.0, (0.01, -0.01, 0.02, -0.02), 1, (0, 1), ["crossed"]),
    (0.0, SPREAD, 2, SEEDS, ["", "last look"]),
])
def test_rounds_stop_at_the_first_look_that_stops(tmp_path, effect, spread, stop,
                                                  trained_seeds, why):
    spec = loads(SEQUENTIAL)
    assert round_seeds(spec) == [(0, 1), (2, 3)]
    with Store(tmp_path) as store:
        train, trained = _trainer(store, effect, spread)
        assert train_rounds(spec, store, list(SEEDS), lambda seed: seed, train) == stop
        assert tuple(trained) == trained_seeds
        stored = store.frame("looks")
        assert list(stored.why) == why and list(stored.stop) == [0] * (len(why) - 1) + [1]
        # the stored looks are the rule's on the stored pairs (the report's)
        again = looks(store.frame("stage_probes"), spec.stopping, spec.seeds)
        assert [x.look for x in again] == list(stored.look)
        assert list(stored.pairs) == [8 * k for k in range(1, len(why) + 1)]   # 2 seeds x 4 a round
        assert stopped_at(store) == stop
        # a rerun trains no round after the stop
        assert train_rounds(spec, store, list(SEEDS), lambda seed: seed, train) == stop
        assert tuple(trained) == trained_seeds


def test_a_fixed_rule_trains_every_pair_in_one_round(tmp_path):
    fixed = (IN_RUN.replace("seeds = [0]", f"seeds = {list(SEEDS)}")
             + '\n[stopping]\nrule = "fixed"\nsparsity = 0.5\npairs = 16\n')
    spec = loads(fixed)
    with Store(tmp_path) as store:
        train, trained = _trainer(store, 1.0, SPREAD)
        assert train_rounds(spec, store, list(SEEDS), lambda seed: seed, train) is None
        assert tuple(trained) == SEEDS and not len(store.frame("looks"))


def test_a_sequential_rule_needs_L_inside_the_run():
    from experiments.spec.study import SpecError

    replayed = SEQUENTIAL.replace("lipschitz_in_run = true\n", "")
    with pytest.raises(SpecError) as err:
        loads(replayed)
    assert any(p.startswith("stopping.rule:") and "lipschitz_in_run" in p
               for p in err.value.problems)


# a tiny study whose effect is large: the 90 % network's L against the dense one's, on the
# whole split at 11 points of each 1,100-step run (no run meets the goal), 2 rounds of 2 seeds
STUDY = (IN_RUN.replace("sparsities = [0.0, 0.5]", "sparsities = [0.0, 0.9]")
         .replace("seeds = [0]", f"seeds = {list(SEEDS)}")
         .replace("batch_sizes = [8, 16]", "batch_sizes = [8]")
         .replace("max = 40", "max = 1100").replace("min = 20", "min = 1100")
         .replace("target = 0.15", "target = 0.001")
         .replace("lipschitz_every = 4", "lipschitz_every = 10")
         .replace("lipschitz_start = 8", "lipschitz_start = 1000")
         .replace("lipschitz_examples = 150\n", "")
         + '\n[stopping]\nrule = "group_sequential"\nsparsity = 0.9\nrounds = 2\n'
           'boundary = "pocock"\n')


@pytest.mark.filterwarnings("ignore::pruning.LayerCollapseWarning")
def test_a_study_with_a_large_effect_stops_after_its_first_round(tmp_path):
    import experiments
    from concurrent.futures import ThreadPoolExecutor

    (tmp_path / "seq.toml").write_text(STUDY)

    def run():
        return experiments.load_results(experiments.run_study(
            tmp_path / "seq.toml", out=tmp_path / "run", executor=ThreadPoolExecutor(1),
            quiet=True, report=False))

    r = run()
    (stop,) = r.looks.itertuples(index=False)
    assert (stop.look, stop.pairs, stop.why, stop.stop) == (1, 8, "crossed", 1)
    assert stop.statistic > stop.boundary and stop.low > 0
    # the second round (seeds 2 and 3) was never trained, nor its L measured
    assert set(r.groups.seed) == {0, 1} and set(r.stage_probes.seed) == {0, 1}
    assert [x.look for x in looks(r.stage_probes, r.spec.stopping, r.spec.seeds)] == [1]
    # a rerun trains nothing more
    assert set(run().groups.seed) == {0, 1}
