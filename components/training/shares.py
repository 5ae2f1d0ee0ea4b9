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
    epoch)`` (as heteroflow's single-process loader does), cuts it into global batches of ``B`` (a last, partial
    batch is dropped: every replica takes the same steps) and gives replica ``r`` the ``b_r`` samples after those
    of replicas ``0 .. r-1`` (:func:`~heteroflow.components.training.gradients.rank_slice`). Which samples form a
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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from heteroflow.components.errors import InvalidParameter

__all__ = ["GlobalSampler", "ShareEstimator", "SlowDown", "shares_from_throughput", "step_seconds", "worth_changing", "simulated_speeds", "equal_shares", "utilization"]


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
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < n:
        raise InvalidParameter(f"batch_size={global_batch!r} is smaller than the {n} replicas; valid: an integer >= {n} (each replica takes at least one sample)")
    good = [t for t in throughput if math.isfinite(t) and t > 0]
    floor_t = min(good) if good else 1.0
    t = [x if math.isfinite(x) and x > 0 else floor_t for x in throughput]
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
        """Optimizer steps per epoch (the last, partial global batch is dropped)."""
        return self.n // self.global_batch

    def batch(self, step: int) -> Any:
        """The sample indices (int64 numpy array of ``B``) of global step ``step`` (0-based, across epochs)."""
        import numpy as np

        epoch, b = divmod(step, self.steps_per_epoch)
        if epoch not in self._orders:
            self._orders = {epoch: np.random.default_rng(self.seed + epoch).permutation(self.n) if self.shuffle else np.arange(self.n)}
        return self._orders[epoch][b * self.global_batch:(b + 1) * self.global_batch]

    def part(self, step: int, shares: Sequence[int], rank: int) -> Any:
        """Replica ``rank``'s part of step ``step``'s global batch under ``shares`` (one integer per replica,
        summing to ``B``).

        Raises:
            InvalidParameter: shares that do not sum to the global batch, or a rank outside them.
        """
        from heteroflow.components.training.gradients import rank_slice

        if sum(shares) != self.global_batch:
            raise InvalidParameter(f"shares {list(shares)} sum to {sum(shares)}, not the global batch {self.global_batch}")
        return self.batch(step)[rank_slice(list(shares), rank)]

    def steps(self, start: int, stop: int) -> Iterator[int]:
        return iter(range(start, stop))


class SlowDown:
    """A simulated kind at ``speed`` (0, 1]: :meth:`pause` after a compute of ``seconds`` sleeps
    ``(1/speed - 1) * seconds``; :attr:`busy_seconds` adds both (the device's busy time)."""

    def __init__(self, speed: float = 1.0) -> None:
        if not 0 < speed <= 1:
            raise InvalidParameter(f"speed={speed!r}; valid: a number in (0, 1]")
        self.speed = speed
        self.busy_seconds = 0.0

    def pause(self, compute_seconds: float) -> float:
        """Sleep for the slower kind's extra time after ``compute_seconds`` of compute; returns the busy time
        of this compute (compute plus the sleep)."""
        extra = compute_seconds * (1.0 / self.speed - 1.0)
        if extra > 0:
            time.sleep(extra)
        busy = compute_seconds + extra
        self.busy_seconds += busy
        return busy
