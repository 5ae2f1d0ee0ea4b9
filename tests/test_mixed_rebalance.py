"""The feedback rebalance of a mixed job (#29 item 2): shares that equalize each replica's measured busy time per
step, fit as a line per replica (``t(b) = a + c * b``) rather than assumed proportional to throughput, with
hysteresis against noise. Synthetic timings only: deterministic, no processes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from heteroflow.components.errors import InvalidParameter
from heteroflow.components.training.shares import Rebalancer, SlowDown, StepTimeModel, balanced_shares, shares_from_throughput

B = 64


def _best(batch: int, times) -> list[int]:
    """The split of ``batch`` over two replicas with the smallest slowest step, by trying every split."""
    return min(([b, batch - b] for b in range(1, batch)), key=lambda s: (max(times[0](s[0]), times[1](s[1])), s[0]))


def _run(times, steps_per_window: int, windows: int, rng, noise: float = 0.0, outliers: float = 0.0, start=(32, 32)):
    """Rebalance like the training loop does: ``steps_per_window`` steps at the current shares (the first after a
    change flagged), then a proposal. Returns the shares after each window."""
    reb = Rebalancer(2, B)
    shares, first, history = list(start), [False, False], []
    for w in range(windows):
        for s in range(steps_per_window):
            for r in range(2):
                t = times[r](shares[r]) * (1 + rng.uniform(-noise, noise))
                if rng.random() < outliers:
                    t *= 10
                reb.record(r, shares[r], t, first_at_share=first[r] and s == 0)
        new = reb.propose(shares, remaining_steps=1000)
        first = [n != c for n, c in zip(new, shares)]
        shares = new
        history.append(list(shares))
    return history


# speeds 1.0 and 0.5 with a fixed part per step (overhead that does not shrink with the share) and a convex
# term (small batches use a core less well: the slow replica's time per sample at a small share is higher)
AFFINE = (lambda b: 0.004 + 0.00085 * b, lambda b: 2 * (0.004 + 0.00085 * b))
CONVEX = (lambda b: 0.003 + 0.0008 * b + 2e-6 * b * b, lambda b: 0.012 + 0.0014 * b + 1.5e-5 * b * b)


def test_balanced_shares_minimise_the_slowest_predicted_step():
    lines = [(0.004, 0.00085), (0.008, 0.0017)]
    best = balanced_shares(B, lines)
    assert sum(best) == B and best == _best(B, [lambda b: 0.004 + 0.00085 * b, lambda b: 0.008 + 0.0017 * b])
    # with no fixed part it is the throughput rule
    assert balanced_shares(B, [(0.0, 1 / 2000), (0.0, 1 / 1000)]) == shares_from_throughput(B, [2000, 1000]) == [43, 21]
    # three replicas: no other split of 20 samples does better
    lines3 = [(0.01, 0.001), (0.0, 0.003), (0.02, 0.0005)]
    got = balanced_shares(20, lines3)
    slowest = max(a + c * b for (a, c), b in zip(lines3, got))
    splits = [(i, j, 20 - i - j) for i in range(1, 19) for j in range(1, 20 - i)]
    assert all(max(a + c * b for (a, c), b in zip(lines3, s)) >= slowest - 1e-12 for s in splits)
    assert balanced_shares(3, [(0.0, 1.0), (0.0, math.nan), (0.0, 0.0)]) == [1, 1, 1]
    # within bounds; bounds no split fits are ignored
    assert balanced_shares(B, [(0.0, 1 / 2000), (0.0, 1 / 1000)], [(30, 40), (1, B)]) == [40, 24]
    assert balanced_shares(B, [(0.0, 1 / 2000), (0.0, 1 / 1000)], [(1, 10), (1, 10)]) == [43, 21]
    with pytest.raises(InvalidParameter, match="batch_size=1 is smaller than the 2 replicas"):
        balanced_shares(1, lines)


def test_the_line_goes_through_the_measurements():
    m = StepTimeModel(2)
    for b in (32, 32, 32, 44, 44, 44):
        m.record(0, b, AFFINE[0](b))
    m.record(0, 50, 99.0, first_at_share=True)  # a set-up step: left out
    m.record(0, 50, math.inf)
    a, c = m.line(0, at=44)
    assert a == pytest.approx(0.004) and c == pytest.approx(0.00085)
    assert m.predict([20, 1], at=[44, 1])[0] == pytest.approx(AFFINE[0](20))
    assert m.predict([20, 1])[1] == math.inf  # replica 1 never measured
    # one share measured: the proportional line (the throughput rule)
    m.record(1, 32, 0.064)
    assert m.line(1) == pytest.approx((0.0, 0.002))
    # a wild slope from two noisy, nearby shares is kept within the range
    m2 = StepTimeModel(1)
    m2.record(0, 20, 0.040)
    m2.record(0, 21, 0.010)
    a, c = m2.line(0, at=20)
    assert c == pytest.approx(0.25 * 0.040 / 20)
    with pytest.raises(InvalidParameter, match="memory=0"):
        StepTimeModel(2, memory=0)


def test_the_rebalance_reaches_the_shares_that_equalize_an_affine_time():
    rng = np.random.default_rng(0)
    best = _best(B, AFFINE)
    # shares linear in throughput over-assign the slower replica: its time per sample is higher at a small share
    proportional = shares_from_throughput(B, [32 / AFFINE[0](32), 32 / AFFINE[1](32)])
    assert proportional[1] > best[1]
    history = _run(AFFINE, 3, 6, rng)
    assert history[0] == proportional  # the first rebalance has one share measured: the throughput rule
    assert history[1] == best  # the second has a slope: the balance
    assert all(h == best for h in history[1:])


def test_the_rebalance_settles_where_a_convex_time_is_balanced():
    rng = np.random.default_rng(1)
    best = _best(B, CONVEX)
    history = _run(CONVEX, 3, 8, rng)
    assert abs(history[-1][0] - best[0]) <= 1
    # the predicted slowest step at the settled shares is within one sample's time of the best
    slowest = max(CONVEX[0](history[-1][0]), CONVEX[1](history[-1][1]))
    assert slowest <= max(CONVEX[0](best[0]), CONVEX[1](best[1])) + CONVEX[1](2) - CONVEX[1](1)
    assert history[-3:] == [history[-1]] * 3  # settled: no more changes


def test_the_rebalance_holds_under_noise():
    best = _best(B, CONVEX)
    changes_after_settling, finals = [], []
    for seed in range(40):
        rng = np.random.default_rng(100 + seed)
        # 8% noise per step and one step in twenty ten times slower (another process on the core)
        history = _run(CONVEX, 5, 12, rng, noise=0.08, outliers=0.05)
        finals.append(history[-1])
        changes_after_settling.append(sum(a != b for a, b in zip(history[3:], history[4:])))
    assert all(abs(f[0] - best[0]) <= 2 for f in finals)
    assert sum(abs(f[0] - best[0]) <= 1 for f in finals) >= 36
    fastest = max(CONVEX[0](best[0]), CONVEX[1](best[1]))
    assert all(max(CONVEX[0](f[0]), CONVEX[1](f[1])) <= 1.03 * fastest for f in finals)
    # hysteresis: once near the balance the shares mostly stay (the odd move between near-ties such as 45:19
    # and 46:18, whose slowest steps differ by 0.1%); without it (noise_factor=0, min_gain=0) these runs
    # changed shares 97 times after the third window
    assert sum(changes_after_settling) <= 20
    assert max(changes_after_settling) <= 3


def test_no_change_without_measurements_or_when_it_does_not_pay():
    reb = Rebalancer(2, B)
    reb.record(0, 32, 0.03)
    assert reb.propose([32, 32], remaining_steps=100) == [32, 32] and not reb.settled  # replica 1 never measured
    for _ in range(3):
        reb.record(1, 32, 0.06)
        reb.record(0, 32, 0.03)
    assert reb.propose([32, 32], remaining_steps=0) == [32, 32] and reb.settled  # nothing left to save
    assert reb.propose([32, 32], remaining_steps=100) == [43, 21] and not reb.settled
    assert reb.throughput([32, 32]) == pytest.approx([32 / 0.03, 32 / 0.06])
    # a slope is trusted near its points: the new share stays within `reach` of the shares measured
    far = Rebalancer(2, B, reach=2)
    for b0, b1 in ((32, 32), (34, 30)):
        for _ in range(3):
            far.record(0, b0, 0.001 * b0)
            far.record(1, b1, 0.004 * b1)
    assert far.propose([34, 30], remaining_steps=100) == [36, 28]
    with pytest.raises(InvalidParameter, match="noise_factor=-1"):
        Rebalancer(2, B, noise_factor=-1)


class _OvershootingClock:
    """A clock whose sleeps overshoot by 0.4 ms each (the kernel's timer slack and wake-up)."""

    def __init__(self) -> None:
        self.now, self.calls = 0.0, []

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.calls.append(seconds)
        self.now += seconds + 0.0004


def test_slowdown_sleeps_the_planned_time_in_total(monkeypatch):
    import heteroflow.components.training.shares as shares_module

    clock = _OvershootingClock()
    monkeypatch.setattr(shares_module, "time", clock)
    slow = SlowDown(0.5)
    for _ in range(50):
        assert slow.pause(0.001) == pytest.approx(0.002)
    assert slow.planned_seconds == pytest.approx(0.05)
    # each sleep is shortened by what the earlier ones overshot: the total exceeds the plan by one overshoot,
    # not by one per call (50 x 0.4 ms = 20 ms)
    assert clock.now == pytest.approx(0.05 + 0.0004)
    assert clock.calls[0] == pytest.approx(0.001) and all(c == pytest.approx(0.0006) for c in clock.calls[1:])


def test_a_change_back_goes_half_as_far():
    # measured 40:24 (after a move from 32:32) as if the first replica were far slower: the model would go back
    # past 32:32; a change against the last move goes at most half as far as it went (4 samples)
    reb = Rebalancer(2, B, reach=64)
    for _ in range(3):
        reb.record(0, 32, 0.032)
        reb.record(1, 32, 0.064)
    assert reb.propose([32, 32], remaining_steps=1000) == [43, 21]
    for _ in range(5):
        reb.record(0, 43, 0.090)
        reb.record(1, 21, 0.040)
    assert reb.propose([43, 21], remaining_steps=1000) == [37, 27]


def test_after_one_bounce_between_neighbouring_splits_the_shares_settle():
    # measurements near the balance, each a little noisy the other way: without the rule the shares went 46:18,
    # 45:19, 46:18, 45:19, ... (a new batch shape every few steps); after one bounce they settle, then move again
    reb = Rebalancer(2, B)
    current = [44, 20]
    seen = []
    for t0, t1 in ((0.040, 0.0445), (0.0465, 0.0415), (0.0425, 0.0460), (0.0470, 0.0410), (0.0425, 0.0460)):
        for _ in range(6):
            reb.record(0, current[0], t0)
            reb.record(1, current[1], t1)
        current = reb.propose(current, remaining_steps=1000)
        seen.append((current, reb.settled))
    assert seen[:3] == [([46, 18], False), ([45, 19], False), ([45, 19], True)]
    assert seen[4] == ([46, 18], False)  # the next measurement starts afresh
