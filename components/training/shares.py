"""Shares of the global batch in a mixed job (issue #29 items 2, 3, 7): from measured throughput, one global
sampler sliced by share, and simulated kinds at different speeds.

Shares
    Replica ``r``'s share of every global batch of ``B`` samples is ``b_r``, proportional to its measured
    throughput ``t_r`` (samples per busy second): ``b_r ~ B * t_r / sum(t)``, rounded by the largest-remainder
    method so ``sum(b) = B`` exactly, each ``b_r >= 1`` (:func:`shares_from_throughput`). With gradients weighted
    by ``b_r / B`` (:mod:`heteroflow.components.training.hierarchy`) one update is the gradient of the whole
    global batch, so rebalancing changes who computes what, never the trajectory. The balance is the one of
    KAITIAN (2025: GPU + MLU, shares by measured speed) and Whale (ATC'22, hardware-aware load balancing).

Global sampler
    :class:`GlobalSampler` draws each epoch's permutation of the ``n`` samples with numpy's ``default_rng(seed +
    epoch)`` (as heteroflow's single-process loader does), cuts it into global batches of ``B`` (the last one
    partial when ``B`` does not divide ``n``, as there) and gives replica ``r`` the ``b_r`` samples after those of
    replicas ``0 .. r-1`` (:func:`~heteroflow.components.training.gradients.rank_slice`); a partial batch is split
    in the shares' proportions and weighted by each part's size (:meth:`GlobalSampler.weight`), so every epoch
    trains on every sample and has the single-process run's steps. Which samples form a
    step's batch depends on ``seed``, ``B`` and the step only, never on how many replicas of which kinds train.

Simulated speeds
    ``HETEROFLOW_SIMULATE_DEVICES=gpu@1.0,npu@0.5`` (:func:`simulated_speeds`): a replica of a kind at speed
    ``s`` in (0, 1] runs its compute, then sleeps ``(1/s - 1)`` times the compute's measured time
    (:class:`SlowDown`), so it takes ``1/s`` as long and leaves the core free meanwhile: two replicas on two cores
    do not contend. Each replica uses one torch thread.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from heteroflow.components.errors import InvalidParameter

__all__ = ["GlobalSampler", "Rebalancer", "ShareEstimator", "SlowDown", "StepTimeModel", "balanced_shares", "shares_from_throughput", "step_seconds", "worth_changing", "simulated_speeds", "equal_shares", "utilization"]


def simulated_speeds(environ: Mapping[str, str] | None = None) -> dict[str, float]:
    """``{kind: speed factor}`` of the simulated kinds of ``HETEROFLOW_SIMULATE_DEVICES`` (1.0 where none is given).

    Raises:
        InvalidParameter: the setting does not parse (as
            :func:`~heteroflow.components.core.failures.simulated_devices` says).
    """
    from heteroflow.components.core.failures import SIMULATE_ENV, simulated_devices

    env = os.environ if environ is None else environ
    simulated_devices(env)  # the checks, with their messages
    out: dict[str, float] = {}
    from heteroflow.components.resources import DeviceKind

    for item in filter(None, (p.strip() for p in env.get(SIMULATE_ENV, "").split(","))):
        head, _, speed = item.partition("@")
        out[DeviceKind.parse(head.partition(":")[0]).value] = float(speed) if speed else 1.0
    return out


def equal_shares(global_batch: int, replicas: int) -> list[int]:
    """``global_batch`` split as evenly as integers allow over ``replicas`` (the first ones get the remainder).

    Raises:
        InvalidParameter: fewer samples than replicas.
    """
    return shares_from_throughput(global_batch, [1.0] * replicas)



def _check_batch(global_batch: object, n: int) -> None:
    """Raise :class:`InvalidParameter` unless ``global_batch`` is an integer >= ``n`` (one sample per replica)."""
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < n:
        raise InvalidParameter(f"batch_size={global_batch!r} is smaller than the {n} replicas; valid: an integer >= {n} (each replica takes at least one sample)")


def _positive(values: Sequence[float], pick: Callable[[list[float]], float]) -> list[float]:
    """``values`` with each non-finite or non-positive one replaced by ``pick`` of the good ones (1.0 when none
    is good): a replica not measured yet counts as the slowest measured."""
    good = [v for v in values if math.isfinite(v) and v > 0]
    stand_in = pick(good) if good else 1.0
    return [v if math.isfinite(v) and v > 0 else stand_in for v in values]


def shares_from_throughput(global_batch: int, throughput: Sequence[float]) -> list[int]:
    """Integer shares of ``global_batch`` proportional to ``throughput`` (samples/s per replica), summing to
    ``global_batch``, each >= 1, rounded so the slowest replica's step is as short as integers allow: from the
    proportional shares rounded down, each sample left goes to the replica that would then finish first
    (smallest ``(b_r + 1) / t_r``; ties to the lower rank), which minimises ``max_r b_r / t_r`` (a greedy
    makespan rule; largest-remainder rounding can leave a sample on the slower replica: 42:22 for 2:1 of 64).

    Args:
        global_batch: samples per optimizer step, >= number of replicas.
        throughput: each replica's measured samples per busy second (> 0; a non-finite or non-positive value
            counts as the smallest positive one measured, or 1.0 when none is).

    Raises:
        InvalidParameter: no replicas, or fewer samples than replicas.
    """
    n = len(throughput)
    if n == 0:
        raise InvalidParameter("throughput is empty; valid: one measured throughput per replica")
    _check_batch(global_batch, n)
    t = _positive(throughput, min)
    total = sum(t)
    shares = [max(1, int(math.floor(global_batch * x / total + 1e-9))) for x in t]
    while sum(shares) > global_batch:  # the one-sample floors took too many: from the replica that finishes last
        i = max((i for i in range(n) if shares[i] > 1), key=lambda i: (shares[i] / t[i], -i))
        shares[i] -= 1
    while sum(shares) < global_batch:
        i = min(range(n), key=lambda i: ((shares[i] + 1) / t[i], i))
        shares[i] += 1
    return shares


def step_seconds(shares: Sequence[int], throughput: Sequence[float]) -> float:
    """The predicted time of a step under ``shares``: the slowest replica's ``b_r / t_r`` (seconds; inf when a
    replica with samples has no throughput)."""
    return max((b / t if t > 0 else math.inf) if b > 0 else 0.0 for b, t in zip(shares, throughput))


def worth_changing(current: Sequence[int], new: Sequence[int], throughput: Sequence[float], remaining_steps: int,
                   setup_steps: float = 1.0) -> bool:
    """Whether moving from shares ``current`` to ``new`` pays off over the ``remaining_steps`` steps.

    A new share is a new batch shape: its first step sets up the kernels again (oneDNN's primitives on the CPU,
    cuDNN's algorithm search on a GPU), which costs about ``setup_steps`` steps' time once (measured on the 2-core
    machine: the first step at a new batch size took 0.1 to 0.5 steps more than a settled one for the benchmark's
    CNN, up to 2 more for a smaller one, where set-up weighs more). The change pays when the
    predicted saving per step (:func:`step_seconds`), times the steps left, exceeds that; it also damps shares
    that would flip between neighbours (43:21, 42:22) on measurement noise.
    """
    if list(new) == list(current):
        return False
    before, after = step_seconds(current, throughput), step_seconds(new, throughput)
    if not math.isfinite(before):
        return True
    return (before - after) * max(0, remaining_steps) > setup_steps * before


class ShareEstimator:
    """Each replica's throughput from per-step timings, robust to noisy steps (the shares follow it).

    A step's record per replica is its busy seconds (compute and simulated slow-down) and samples. An estimate
    (:meth:`estimate`) takes, per replica, the median over the window's steps of seconds per sample (one slow
    step, a page fault or another process on the core, moves a median of 3+ steps little; a mean of 5 it moves by
    a fifth of its excess), skipping each replica's first step after its share changed (new tensor shapes: the
    kernels' one-off set-up) when the window has other steps, and smooths it with the previous estimate
    (exponential moving average, weight ``smoothing`` on the new window) so one noisy window moves the shares only
    part of the way. The first estimate is the window's alone.

    Args:
        replicas: how many replicas report.
        smoothing: the new window's weight in (0, 1] (1: no smoothing).

    Raises:
        InvalidParameter: ``replicas`` < 1 or ``smoothing`` outside (0, 1].
    """

    def __init__(self, replicas: int, smoothing: float = 0.5) -> None:
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise InvalidParameter(f"replicas={replicas!r}; valid: an integer >= 1")
        if not 0 < smoothing <= 1:
            raise InvalidParameter(f"smoothing={smoothing!r}; valid: a weight in (0, 1]")
        self.replicas, self.smoothing = replicas, smoothing
        self.seconds_per_sample: list[float] | None = None
        self._window: list[list[tuple[float, int, bool]]] = [[] for _ in range(replicas)]

    def record(self, replica: int, busy_seconds: float, samples: int, first_at_share: bool = False) -> None:
        """One step of ``replica``: ``busy_seconds`` for ``samples``; ``first_at_share``: its first step since its
        share changed."""
        self._window[replica].append((float(busy_seconds), int(samples), bool(first_at_share)))

    def window_steps(self) -> int:
        """Steps recorded since the last estimate (the fewest over replicas)."""
        return min(len(w) for w in self._window)

    def estimate(self) -> list[float]:
        """Samples per busy second per replica (0.0 for a replica never measured); clears the window.

        Returns the previous estimate where a replica's window holds no usable step."""
        import statistics

        prev = self.seconds_per_sample
        new: list[float] = []
        for r, window in enumerate(self._window):
            usable = [(b, n) for b, n, first in window if n > 0 and b > 0 and math.isfinite(b)]
            settled = [(b, n) for b, n, first in window if n > 0 and b > 0 and math.isfinite(b) and not first]
            steps = settled or usable
            measured = statistics.median(b / n for b, n in steps) if steps else None
            before = prev[r] if prev is not None and prev[r] > 0 else None
            if measured is None:
                new.append(before or 0.0)
            elif before is None:
                new.append(measured)
            else:
                new.append(self.smoothing * measured + (1 - self.smoothing) * before)
        self.seconds_per_sample = new
        self._window = [[] for _ in range(self.replicas)]
        return self.throughput()

    def throughput(self) -> list[float]:
        """The last estimate as samples per busy second (0.0 where none)."""
        if self.seconds_per_sample is None:
            return [0.0] * self.replicas
        return [1.0 / s if s > 0 else 0.0 for s in self.seconds_per_sample]


def utilization(busy_seconds: Sequence[float], wall_seconds: float) -> list[float]:
    """Each replica's busy fraction, busy time over wall time (0-1)."""
    return [min(1.0, b / wall_seconds) if wall_seconds > 0 else 0.0 for b in busy_seconds]


class GlobalSampler:
    """The global batches of a run, sliced by share (see the module docstring).

    Args:
        n: samples in the data set.
        global_batch: samples per optimizer step ``B``.
        seed: shuffling seed (epoch ``e`` uses ``default_rng(seed + e)``).
        shuffle: False: in order.

    Raises:
        InvalidParameter: fewer samples than one global batch.
    """

    def __init__(self, n: int, global_batch: int, seed: int = 0, *, shuffle: bool = True) -> None:
        if n < global_batch:
            raise InvalidParameter(f"the data set has {n} samples, fewer than one global batch of {global_batch}; valid: batch_size <= {n}")
        self.n, self.global_batch, self.seed, self.shuffle = n, global_batch, seed, shuffle
        self._orders: dict[int, Any] = {}

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch: ``ceil(n / B)``, the last global batch partial when ``B`` does not divide
        ``n`` (as heteroflow's single-process loader, and a DataLoader without ``drop_last``, does)."""
        return -(-self.n // self.global_batch)

    def batch(self, step: int) -> Any:
        """The sample indices (int64 numpy array of ``B``, fewer for an epoch's last, partial batch) of global step
        ``step`` (0-based, across epochs)."""
        import numpy as np

        epoch, b = divmod(step, self.steps_per_epoch)
        if epoch not in self._orders:
            self._orders = {epoch: np.random.default_rng(self.seed + epoch).permutation(self.n) if self.shuffle else np.arange(self.n)}
        return self._orders[epoch][b * self.global_batch:(b + 1) * self.global_batch]

    def sizes(self, step: int, shares: Sequence[int]) -> list[int]:
        """Each replica's samples of step ``step``'s global batch under ``shares``: the shares themselves for a
        whole batch; a partial batch of ``m`` samples split in the same proportions, ``m * share / B`` rounded by
        largest remainders, ties to the lower rank (Hamilton's method, as
        :meth:`~heteroflow.components.training.batches.EpochBatches.sizes` splits a single-kind run's last batch).

        Raises:
            InvalidParameter: a share that is not an integer >= 1, or shares that do not sum to the global batch.
        """
        from heteroflow.components.training.batches import proportional_sizes
        from heteroflow.components.training.gradients import batch_weights

        batch_weights(shares)  # each an integer >= 1
        if sum(shares) != self.global_batch:
            raise InvalidParameter(f"shares {list(shares)} sum to {sum(shares)}, not the global batch {self.global_batch}")
        return proportional_sizes(len(self.batch(step)), shares)

    def part(self, step: int, shares: Sequence[int], rank: int) -> Any:
        """Replica ``rank``'s part of step ``step``'s global batch under ``shares`` (one integer per replica,
        summing to ``B``): its :meth:`sizes` entry of samples after those of the ranks before it. A replica whose
        part of a partial batch is empty gets the batch's first sample, which :meth:`weight` makes count 0 (every
        replica takes every step, or the collectives hang).

        Raises:
            InvalidParameter: shares that do not sum to the global batch, or a rank outside them.
        """
        sizes = self.sizes(step, shares)
        if not 0 <= rank < len(sizes):
            raise InvalidParameter(f"rank={rank} has no share; shares has {len(sizes)} entries")
        batch = self.batch(step)
        part = batch[sum(sizes[:rank]):sum(sizes[:rank + 1])]
        return part if len(part) else batch[:1]

    def weight(self, step: int, shares: Sequence[int], rank: int) -> float:
        """What replica ``rank``'s mean loss (and gradient) counts in step ``step``'s update: its samples over the
        step's, ``share / B`` for a whole batch (so the weighted sum over replicas is the mean over the global
        batch), 0 for a stand-in sample."""
        sizes = self.sizes(step, shares)
        return sizes[rank] / sum(sizes)

    def steps(self, start: int, stop: int) -> Iterator[int]:
        return iter(range(start, stop))


class SlowDown:
    """A simulated kind at ``speed`` (0, 1]: :meth:`pause` after a compute of ``seconds`` sleeps
    ``(1/speed - 1) * seconds``; :attr:`busy_seconds` adds both (the device's busy time).

    ``time.sleep`` overshoots (the kernel's timer slack and the wake-up: 0.1-0.5 ms a call on the 2-core
    machine, a few hundred calls a run), which would make the kind slower than ``speed``; each sleep is shortened
    by what the earlier ones overshot, so the total sleep stays ``(1/speed - 1)`` times the total compute
    (:attr:`slept_seconds` against :attr:`planned_seconds`)."""

    def __init__(self, speed: float = 1.0) -> None:
        if not 0 < speed <= 1:
            raise InvalidParameter(f"speed={speed!r}; valid: a number in (0, 1]")
        self.speed = speed
        self.busy_seconds = 0.0
        self.planned_seconds = 0.0
        self.slept_seconds = 0.0

    def pause(self, compute_seconds: float) -> float:
        """Sleep for the slower kind's extra time after ``compute_seconds`` of compute (less what earlier sleeps
        overshot); returns the busy time of this compute (compute plus the extra time)."""
        extra = compute_seconds * (1.0 / self.speed - 1.0)
        if extra > 0:
            self.planned_seconds += extra
            due = self.planned_seconds - self.slept_seconds
            if due > 0:
                t0 = time.perf_counter()
                time.sleep(due)
                self.slept_seconds += time.perf_counter() - t0
        busy = compute_seconds + extra
        self.busy_seconds += busy
        return busy


# --- shares that equalize the measured step time (a feedback rebalance) --------------------------------------


def balanced_shares(global_batch: int, lines: Sequence[tuple[float, float]],
                    bounds: Sequence[tuple[int, int]] | None = None) -> list[int]:
    """Integer shares of ``global_batch`` that minimise the slowest replica's predicted step time
    ``max_r (a_r + c_r * b_r)`` (seconds), each ``b_r >= 1``, summing to ``global_batch``.

    Every replica starts at one sample and each further sample goes to the replica whose step would then end
    first (smallest ``a_r + c_r * (b_r + 1)``; ties to the lower rank). For step times that grow with the share
    this greedy rule is optimal for the makespan (each sample is placed where it raises the maximum least).

    Args:
        global_batch: samples per optimizer step, >= number of replicas.
        lines: ``(a_r, c_r)`` per replica: fixed seconds per step and seconds per sample (``c_r > 0``; a
            non-finite or non-positive ``c_r`` counts as the largest positive one given, or 1.0 when none is).
        bounds: ``(lowest, highest)`` share per replica (ignored when no split of ``global_batch`` fits them).

    Raises:
        InvalidParameter: no replicas, or fewer samples than replicas.
    """
    n = len(lines)
    if n == 0:
        raise InvalidParameter("lines is empty; valid: one (fixed seconds, seconds per sample) pair per replica")
    _check_batch(global_batch, n)
    a = [x if math.isfinite(x) else 0.0 for x, _ in lines]
    c = _positive([y for _, y in lines], max)
    lo, hi = [1] * n, [global_batch] * n
    if bounds is not None and len(bounds) == n:
        blo, bhi = [max(1, int(x)) for x, _ in bounds], [min(global_batch, int(y)) for _, y in bounds]
        if all(x <= y for x, y in zip(blo, bhi)) and sum(blo) <= global_batch <= sum(bhi):
            lo, hi = blo, bhi
    shares = list(lo)
    for _ in range(global_batch - sum(shares)):
        i = min((i for i in range(n) if shares[i] < hi[i]), key=lambda i: (a[i] + c[i] * (shares[i] + 1), i))
        shares[i] += 1
    return shares


class StepTimeModel:
    """Each replica's busy time per step as a function of its share, ``t_r(b) = a_r + c_r * b`` (seconds),
    fit from the steps it measured.

    Why not throughput alone: shares proportional to measured samples per second assume ``a_r = 0``; a step
    has a part that does not shrink with the share (Python and autograd overhead per layer, kernel launches, the
    hook's calls per bucket) and small batches use a core less well, so a replica measured at a large share is
    predicted too fast at a small one. Measured on 2 cores for the benchmark's CNN: the slower kind's time per
    sample at its ~20-sample share was 18-33% above its time at 32, and shares from throughput over-assigned it.

    The fit (:meth:`line`): per replica, the median time of the steps at each share it ran (a median: a step
    slowed by another process moves it little); the slope ``c_r`` is the least-squares slope over those medians,
    weighted by their step counts, when two or more shares were measured, else ``t/b`` of the one share (the
    proportional model: the first rebalance is the throughput one). The line is then anchored at the median of
    the share given (the current one), so it goes through the latest measurement; repeated rebalancing is a
    secant iteration that settles where the measured times are equal, whatever the true ``t_r(b)`` (convex,
    affine, noisy). The slope is kept within ``[0.25, 1.5]`` times ``t/b`` at the anchor (a fixed part of at most
    75% of the step; a per-sample cost at most 1.5x the mean one), so a noisy pair of nearby shares cannot send
    the shares far off.

    Args:
        replicas: how many replicas report.
        memory: steps kept per replica (the oldest go first: the machine's load drifts).

    Raises:
        InvalidParameter: ``replicas`` < 1 or ``memory`` < 1.
    """

    SLOPE_RANGE = (0.25, 1.5)

    def __init__(self, replicas: int, memory: int = 64) -> None:
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise InvalidParameter(f"replicas={replicas!r}; valid: an integer >= 1")
        if isinstance(memory, bool) or not isinstance(memory, int) or memory < 1:
            raise InvalidParameter(f"memory={memory!r}; valid: an integer >= 1")
        from collections import deque

        self.replicas, self.memory = replicas, memory
        self._steps: list[deque[tuple[int, float]]] = [deque(maxlen=memory) for _ in range(replicas)]

    def record(self, replica: int, share: int, seconds: float, first_at_share: bool = False) -> None:
        """One step of ``replica`` at ``share`` samples that kept it busy ``seconds``. A step that is the first at
        a new share (new tensor shapes: the kernels' one-off set-up) or is not a positive finite time is left
        out."""
        if first_at_share or share < 1 or not (math.isfinite(seconds) and seconds > 0):
            return
        self._steps[replica].append((int(share), float(seconds)))

    def medians(self, replica: int) -> dict[int, tuple[float, int]]:
        """``{share: (median seconds, steps)}`` of ``replica``'s kept steps."""
        import statistics

        by: dict[int, list[float]] = {}
        for b, t in self._steps[replica]:
            by.setdefault(b, []).append(t)
        return {b: (statistics.median(ts), len(ts)) for b, ts in by.items()}

    def line(self, replica: int, at: int | None = None) -> tuple[float, float] | None:
        """``(a_r, c_r)`` of ``replica`` anchored at share ``at`` (the most measured share when ``at`` has no
        step, or is None); None when the replica has no step."""
        med = self.medians(replica)
        if not med:
            return None
        b0 = at if at in med else max(med, key=lambda b: (med[b][1], b))
        t0 = med[b0][0]
        proportional = t0 / b0
        c = proportional
        if len(med) >= 2:
            w = [n for _, n in med.values()]
            bs = list(med)
            ts = [t for t, _ in med.values()]
            wsum = sum(w)
            bbar = sum(wi * bi for wi, bi in zip(w, bs)) / wsum
            tbar = sum(wi * ti for wi, ti in zip(w, ts)) / wsum
            sxx = sum(wi * (bi - bbar) ** 2 for wi, bi in zip(w, bs))
            if sxx > 0:
                c = sum(wi * (bi - bbar) * (ti - tbar) for wi, bi, ti in zip(w, bs, ts)) / sxx
            lo, hi = self.SLOPE_RANGE
            c = min(hi * proportional, max(lo * proportional, c))
        return t0 - c * b0, c

    def shares_seen(self, replica: int) -> list[int]:
        """The distinct shares of ``replica``'s kept steps, ascending."""
        return sorted({b for b, _ in self._steps[replica]})

    def noise(self, replica: int, share: int) -> float:
        """The relative standard error of ``replica``'s median step time at ``share`` (0-1; 1.0 with fewer than
        two steps): ``1.25 * 1.48 * MAD / median / sqrt(n)`` (the median's standard error for normal noise, from
        the median absolute deviation)."""
        import statistics

        ts = [t for b, t in self._steps[replica] if b == share]
        if len(ts) < 2:
            return 1.0
        m = statistics.median(ts)
        mad = statistics.median(abs(t - m) for t in ts)
        return min(1.0, 1.2533 * 1.4826 * mad / m / math.sqrt(len(ts))) if m > 0 else 1.0

    def predict(self, shares: Sequence[int], at: Sequence[int] | None = None) -> list[float]:
        """Predicted busy seconds per step of each replica at ``shares`` (lines anchored at ``at``, default
        ``shares``; inf for a replica with no step)."""
        anchors = list(at) if at is not None else list(shares)
        out = []
        for r, b in enumerate(shares):
            ln = self.line(r, anchors[r])
            out.append(ln[0] + ln[1] * b if ln is not None else math.inf)
        return out


class Rebalancer:
    """Shares that equalize each replica's measured busy time per step (a feedback rebalance), with hysteresis.

    Each step every replica :meth:`record` s its share and busy seconds (compute, the slow-down, sampling: what
    the others wait for); :meth:`propose` fits :class:`StepTimeModel` lines anchored at the current shares and
    returns :func:`balanced_shares` of them, or the current shares when the change does not pay:

    - the predicted slowest step must shrink by more than ``min_gain`` and, unless it shrinks by more than
      ``max_hold``, by more than ``noise_factor`` times the measurements' relative standard error at the
      current shares (:meth:`StepTimeModel.noise`): a neighbour that only looks better by noise is not taken,
      so shares do not flip between 43:21 and 44:20 (the steps at one share pool across windows, so the error
      shrinks the longer shares stay), while a large imbalance (equal shares for speeds 2:1: a third of the
      step) is corrected at once even on a loaded machine;
    - the saving over the ``remaining_steps`` must exceed ``setup_steps`` steps' time (a new batch shape sets
      up its kernels once: :func:`worth_changing`);
    - once a replica has a slope (two shares measured), its new share stays within ``reach`` samples (default a
      tenth of the global batch) of the shares it ran: a line is trusted near its points, so a noisy slope
      cannot throw the shares far; the first rebalance, with one share measured, is the throughput rule's;
    - a change back against the previous one (the load drifted between two measurements, or one was noisy)
      goes at most half as far as the previous one went, so two such measurements bisect rather than flip;
    - after a change back of one sample, a change back again (the balance lies between two neighbouring splits)
      is not taken: the shares settle, and the next measurement starts afresh (seen in ``benchmarks/hetero.py``:
      44:20 and 45:19 every 4 steps for 50 steps, each change a step with new batch shapes).

    :attr:`settled` is False after a proposal that changed the shares, and after one that the noise alone held
    back (the caller re-measures soon: the new shares give the model a second point, and more steps at the same
    shares pool into a steadier median; two or three rebalances reach the balance of an affine ``t(b)``); True
    when the shares are the best the model sees, or the change is below ``min_gain`` or does not pay;
    :attr:`held` is True when the noise alone held the change back (the caller may wait longer each time).

    Args:
        replicas: how many replicas report.
        global_batch: samples per optimizer step.
        setup_steps / noise_factor / min_gain / max_hold / reach: the hysteresis above.
        memory: steps kept per replica (:class:`StepTimeModel`).

    Raises:
        InvalidParameter: bad counts or a non-positive factor.
    """

    def __init__(self, replicas: int, global_batch: int, *, setup_steps: float = 1.0, noise_factor: float = 2.0,
                 min_gain: float = 0.01, max_hold: float = 0.1, memory: int = 64, reach: int | None = None) -> None:
        if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < replicas:
            raise InvalidParameter(f"batch_size={global_batch!r} is smaller than the {replicas} replicas; valid: an integer >= {replicas}")
        if noise_factor < 0 or min_gain < 0 or setup_steps < 0 or max_hold < 0:
            raise InvalidParameter(f"setup_steps={setup_steps!r}, noise_factor={noise_factor!r}, min_gain={min_gain!r}; valid: numbers >= 0")
        self.model = StepTimeModel(replicas, memory)
        self.global_batch, self.setup_steps, self.noise_factor, self.min_gain = global_batch, setup_steps, noise_factor, min_gain
        self.max_hold = max_hold
        self._last_move: list[int] | None = None
        self._last_was_back = False  # the last change taken went back against the one before it
        self.reach = reach if reach is not None else max(1, math.ceil(global_batch / 10))
        self.settled = False
        self.held = False

    def record(self, replica: int, share: int, seconds: float, first_at_share: bool = False) -> None:
        """One step of ``replica`` (see :meth:`StepTimeModel.record`)."""
        self.model.record(replica, share, seconds, first_at_share)

    def throughput(self, shares: Sequence[int]) -> list[float]:
        """Samples per busy second of each replica at ``shares`` as the model predicts them (0.0 where it has no
        step)."""
        return [b / t if math.isfinite(t) and t > 0 else 0.0 for b, t in zip(shares, self.model.predict(shares))]

    def propose(self, current: Sequence[int], remaining_steps: int) -> list[int]:
        """The shares for the next steps (``current`` when no change pays; see the class docstring)."""
        current = list(current)
        lines = [self.model.line(r, current[r]) for r in range(len(current))]
        if any(ln is None for ln in lines):
            self.settled, self.held = False, False
            return current
        bounds = []
        for r in range(len(current)):
            seen = self.model.shares_seen(r)
            bounds.append((seen[0] - self.reach, seen[-1] + self.reach) if len(seen) >= 2 else (1, self.global_batch))
        new = balanced_shares(self.global_batch, lines, bounds)  # type: ignore[arg-type]
        last = self._last_move
        back = last is not None and sum((n - c) * m for n, c, m in zip(new, current, last)) < 0  # against the last move
        if back:
            half = [(abs(m) + 1) // 2 for m in last]  # type: ignore[union-attr]
            new = balanced_shares(self.global_batch, lines, [(max(lo, c - h), min(hi, c + h)) for (lo, hi), c, h in zip(bounds, current, half)])  # type: ignore[arg-type]
            if self._last_was_back and max(abs(m) for m in last) <= 1 and max(abs(n - c) for n, c in zip(new, current)) <= 1:  # type: ignore[union-attr]
                # bounced between two neighbouring splits: either is within a sample of the balance
                self.settled, self.held = True, False
                self._last_move, self._last_was_back = None, False
                return current
        before = max(a + c * b for (a, c), b in zip(lines, current))  # type: ignore[misc]
        after = max(a + c * b for (a, c), b in zip(lines, new))  # type: ignore[misc]
        gain = (before - after) / before if before > 0 else 0.0
        noise = max(self.model.noise(r, b) for r, b in enumerate(current))
        pays = (before - after) * max(0, remaining_steps) > self.setup_steps * before
        if new == current or gain <= self.min_gain or not pays:
            self.settled, self.held = True, False
            return current
        if gain <= min(self.max_hold, self.noise_factor * noise):  # maybe only noise: more steps at these shares first
            self.settled, self.held = False, True
            return current
        self.settled, self.held = False, False
        self._last_move = [n - c for n, c in zip(new, current)]
        self._last_was_back = back
        return new
