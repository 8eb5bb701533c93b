"""The asynchronous wall-clock model against closed forms: the expected maximum of exponentials
(H_W), renewal throughput W / E[t], round-robin delays W - 1, and a brute-force event loop."""

import heapq

import numpy as np
import pytest

from training.distributed import asynctime as at
from training.distributed.costmodel import CostModel, CostModelError

COST = CostModel(t_fixed=2e-3, t_example=1e-5, alpha=5e-5, beta=1e-9, n_params=10_000)


def test_without_stragglers_workers_take_turns_and_every_delay_is_w_minus_1():
    run = at.simulate_async(COST, 4, 16, 40, at.Stragglers("none"))
    assert run.delays[:4].tolist() == [0, 1, 2, 3]       # first round: all from w_0
    assert np.all(run.delays[4:] == 3)
    assert run.worker[:8].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    t = at.compute_time(COST, 16) + at.push_pull_time(COST)
    assert run.time == pytest.approx(10 * t, rel=1e-12)  # 40 updates = 10 rounds
    sync = at.simulate_sync(COST, 4, 16, 10, at.Stragglers("none"))
    step = at.compute_time(COST, 16) + COST.allreduce_time(4)
    assert sync == pytest.approx(10 * step, rel=1e-12)


def test_sync_step_mean_is_the_harmonic_number_for_exponential_stragglers():
    """E max of W Exp(1) = H_W; the mean over n steps is within 4.5 standard errors."""
    s = at.Stragglers("exponential", scale=0.5)
    for w in (1, 3, 8):
        n = 40_000
        total = at.simulate_sync(COST, w, 32, n, s, seed=w)
        expected = at.expected_sync_step(COST, w, 32, s)
        c = at.compute_time(COST, 32)
        assert expected == pytest.approx(c * (1 + 0.5 * sum(1 / i for i in range(1, w + 1)))
                                         + COST.allreduce_time(w))
        # sd of max of W Exp(1): sqrt(sum 1/i^2)
        se = c * 0.5 * np.sqrt(sum(1 / i**2 for i in range(1, w + 1))) / np.sqrt(n)
        assert abs(total / n - expected) < 4.5 * se


@pytest.mark.parametrize("stragglers", [at.Stragglers("exponential", 1.0),
                                        at.Stragglers("lognormal", 2.0, shape=1.0)])
def test_async_throughput_is_w_over_the_mean_and_the_mean_delay_is_w_minus_1(stragglers):
    w, n = 6, 120_000
    run = at.simulate_async(COST, w, 8, n, stragglers, seed=3)
    interval = at.expected_async_interval(COST, w, 8, stragglers)
    assert interval == pytest.approx((at.compute_time(COST, 8) * (1 + stragglers.scale)
                                      + at.push_pull_time(COST)) / w)
    assert run.time / n == pytest.approx(interval, rel=0.02)
    assert run.delays.mean() == pytest.approx(w - 1, rel=0.02)
    assert run.delays.max() > 2 * (w - 1)                # stragglers spread the delays


def test_event_order_and_delays_match_a_brute_force_event_loop():
    """A heap of (finish time, worker) and an update counter, written independently."""
    s = at.Stragglers("exponential", 2.0)
    w, n = 5, 300
    run = at.simulate_async(COST, w, 4, n, s, seed=11)
    # the same draws: the simulation doubles its jobs until enough; redraw the final block
    jobs = 1 * -(-n // w)
    while True:
        rng = np.random.default_rng(11)
        d = at.compute_time(COST, 4) * s.draw(rng, (w, jobs)) + at.push_pull_time(COST)
        fin = np.cumsum(d, axis=1)
        if np.sort(fin.ravel())[n - 1] <= fin[:, -1].min():
            break
        jobs *= 2
    heap = [(d[i, 0], i, 0) for i in range(w)]
    heapq.heapify(heap)
    start_version = [0] * w
    delays, workers, t = [], [], 0.0
    for u in range(n):
        t, i, j = heapq.heappop(heap)
        delays.append(u - start_version[i])
        workers.append(i)
        start_version[i] = u + 1
        heapq.heappush(heap, (t + d[i, j + 1], i, j + 1))
    assert run.delays.tolist() == delays
    assert run.worker.tolist() == workers
    assert run.time == pytest.approx(t, rel=1e-12)


def test_compare_says_where_async_is_sooner():
    """No stragglers, free communication: sync step c(Wb) + allreduce, async update c(b) / W.
    With S(Wb, 0) = S(b, W - 1) async wins; when the delay costs many more steps it loses."""
    cost = CostModel(t_fixed=1e-3, t_example=0.0, alpha=0.0, beta=0.0, n_params=1)
    steps = {(8, 0): 1000, (32, 0): 400, (8, 3): 400, (64, 0): 300, (8, 7): 5000, (16, 0): 600}
    rows = at.compare(steps, cost, (4, 8), at.Stragglers("none"))
    rows = {(r.per_worker_batch, r.workers): r for r in rows}
    r = rows[(8, 4)]
    assert (r.sync_steps, r.async_steps) == (400, 400)
    assert r.sync_time == pytest.approx(0.4) and r.async_time == pytest.approx(0.1)
    assert r.winner == "async" and r.mean_delay == pytest.approx((0 + 1 + 2 + 3 + 396 * 3) / 400)
    r = rows[(8, 8)]
    assert r.sync_time == pytest.approx(0.3) and r.async_time == pytest.approx(5000 * 1e-3 / 8)
    assert r.winner == "sync"
    assert (16, 4) not in rows                            # S(16, 3) not measured
    late = at.compare({(8, 0): 10, (32, 0): 10, (8, 3): None}, cost, (4,), at.Stragglers("none"))
    assert late[0].async_time is None and late[0].winner == "sync"
    table = at.format_comparison(list(rows.values()), at.Stragglers("none"))
    assert "| 8 | 4 | 400 | 0.4 s | 400 | 0.1 s |" in table


def test_bad_input_names_the_key():
    with pytest.raises(CostModelError, match="distribution 'pareto' unknown; allowed: none, exponential, lognormal"):
        at.Stragglers("pareto")
    with pytest.raises(CostModelError, match="scale must be"):
        at.Stragglers("exponential", -1.0)
    with pytest.raises(CostModelError, match="keys must be"):
        at.compare({(8,): 3}, COST)
    with pytest.raises(CostModelError, match="workers must be"):
        at.simulate_async(COST, 0, 8, 10)
