"""The retry policy of a step, with each engine's real semantics.

Engines disagree about what "maximum backoff" means, so the policy models both limits:

- ``max_delay_seconds`` caps each single wait. Airflow's ``max_retry_delay`` is this cap; so is the field KFP
  calls ``backoff_max_duration`` when **kfp.local** runs the pipeline (it caps each wait there).
- ``window_seconds`` is the total window, from the start of the first attempt, in which a retry may still
  start. On a cluster KFP compiles ``backoff_max_duration`` to Argo's ``retryStrategy.backoff.maxDuration``,
  which is this window (KFP's default is 3600 s). An attempt that runs longer than the window is never
  retried, so a long step needs a long window.

The n-th wait (n = 0, 1, ...) is ``min(backoff_seconds * factor**n, max_delay_seconds)``: KFP's ``set_retry``
(``backoff_duration``, ``backoff_factor``) and Argo's ``retryStrategy.backoff`` formula. KFP durations are whole
seconds: :func:`kfp_duration` rounds to the nearest second and never turns a positive duration into ``0s``.

On a cluster the cap on each wait does not reach Argo: KFP's IR has no field for it (its argocompiler passes only
``maxRetryCount``, ``backoffDuration``, ``backoffFactor`` and ``backoffMaxDuration``), so Argo waits
``backoff_seconds * factor**n`` uncapped (``timeToWait = duration * factor^retry_number``, optionally capped by
``backoff.cap``, which KFP never sets; Argo Workflows ``workflow/controller/operator.go``, ``processNodeRetries``),
and it starts no retry whose start would pass the first attempt's start plus ``maxDuration`` ("Backoff would
exceed max duration limit").

**Every declared retry can start** (issue #16.15): a user who writes ``retries=5`` expects five retries, as
Airflow gives them (``BaseOperator.retries``: "the number of retries that should be performed before failing
the task"; Airflow has no total window), while KFP's ``backoff_max_duration`` is a window ("Maximum duration during
which the task will be retried", ``PipelineTask.set_retry``). So a policy whose waits alone, on the engine that
waits longest (Argo, uncapped), pass ``window_seconds`` is refused at construction with the number of retries that
could start and the two ways out: a longer ``window_seconds`` (the waits plus the attempts' own run time, which
only the author knows, which is why the window is never derived silently) or fewer ``retries``. E.g.
``RetryPolicy(retries=5, backoff_seconds=300, max_delay_seconds=1800)`` with the default 3600 s window would
compile to ``maxRetryCount: 5`` while only 3 retries could ever start. The attempts' own run time still counts
against the window at run time; give a window with room for it.
"""

from __future__ import annotations

import dataclasses
import math

from heteroflow.components.errors import InvalidResources

__all__ = ["RETRY_ON", "RetryPolicy", "RetryWindowWarning", "kfp_duration"]

RETRY_ON = ("transient", "any")
"""What a policy retries: ``transient`` (heteroflow's default: only failures classified transient; a permanent
failure fails at once, a device failure moves to the next candidate) or ``any`` (KFP's own behaviour: a permanent
failure is retried too; a device failure still moves to the next candidate, since that is what makes fallback
right)."""


class RetryWindowWarning(UserWarning):
    """A compiled retry policy promises more retries than its engine can start (Argo's uncapped waits)."""


def _grown(backoff: float, factor: float, n: int) -> float:
    """``backoff * factor**n``; ``inf`` past a float's range (a float ``**`` raises OverflowError there)."""
    try:
        return float(backoff * factor**n)
    except OverflowError:
        return math.inf


def _startable(waits: list[float], window: float) -> int:
    """How many retries start, in order, before the running sum of ``waits`` passes ``window``."""
    total = 0.0
    for n, wait in enumerate(waits):
        total += wait
        if total > window:
            return n
    return len(waits)


def _secs(seconds: float) -> str:
    return f"{math.ceil(seconds):d}" if seconds < 1e15 else f"{seconds:g}"


def _show(waits: list[float]) -> str:
    return ", ".join(f"{w:g}" for w in waits[:8]) + (", ..." if len(waits) > 8 else "")


def kfp_duration(seconds: float) -> str:
    """A KFP/Argo duration string in whole seconds: rounded, and at least ``1s`` for any positive duration.

    Args:
        seconds: a finite duration >= 0, in seconds.

    Returns:
        e.g. ``"0s"``, ``"1s"`` (for 0.2 s), ``"3s"`` (for 2.6 s).
    """
    if seconds <= 0:
        return "0s"
    return f"{max(1, round(seconds))}s"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How often a step is retried on one candidate (transient failures only), and how long it waits.

    Args:
        retries: retries after the first attempt, 0..100.
        backoff_seconds: wait before the first retry, seconds, >= 0.
        factor: growth of the wait per retry, >= 1.
        max_delay_seconds: cap on any single wait, seconds, >= backoff_seconds (Airflow ``max_retry_delay``;
            kfp.local's reading of ``backoff_max_duration``).
        window_seconds: total window from the first attempt's start in which a retry may start, seconds, > 0
            (Argo ``backoff.maxDuration`` on a cluster; KFP's default 3600 s). It must hold the waits before all
            ``retries`` (:meth:`cluster_wait_seconds`); make it longer by the run time of ``retries`` attempts.
        retry_on: ``"transient"`` (default) or ``"any"``: which failure classes are retried (:data:`RETRY_ON`).

    Raises:
        InvalidResources: a field out of range, infinite or NaN (the message names it and the valid range), or a
            window too short for the waits before the declared retries (the message says how many could start and
            the window they all need).
    """

    retries: int = 2
    backoff_seconds: float = 5.0
    factor: float = 2.0
    max_delay_seconds: float = 300.0
    window_seconds: float = 3600.0
    retry_on: str = "transient"

    def __post_init__(self) -> None:
        if self.retry_on not in RETRY_ON:
            raise InvalidResources(f"retry_on={self.retry_on!r} is unknown; valid: {', '.join(map(repr, RETRY_ON))}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or not 0 <= self.retries <= 100:
            raise InvalidResources(f"retries={self.retries!r} is out of range; valid: an integer 0..100")
        for name, low in (("backoff_seconds", 0.0), ("factor", 1.0), ("max_delay_seconds", 0.0), ("window_seconds", 0.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidResources(f"{name}={value!r} is not a number; valid: a finite number >= {low:g}")
            if not math.isfinite(value):
                raise InvalidResources(f"{name}={value!r} is not finite; valid: a finite number >= {low:g} (seconds)")
            if not value >= low:
                raise InvalidResources(f"{name}={value!r} is out of range; valid: a finite number >= {low:g}")
        if self.window_seconds == 0:
            raise InvalidResources("window_seconds=0 allows no retry at all; valid: a finite number > 0 (seconds)")
        if self.max_delay_seconds < self.backoff_seconds:
            raise InvalidResources(
                f"max_delay_seconds={self.max_delay_seconds!r} is below backoff_seconds={self.backoff_seconds!r}"
            )
        waits = [self.delay_seconds(n) for n in range(self.retries)]
        if sum(waits) > self.window_seconds:
            can_start = _startable(waits, self.window_seconds)
            raise InvalidResources(
                f"retries={self.retries} cannot all start within window_seconds={self.window_seconds:g} (the total "
                f"window from the first attempt's start: Argo's backoff.maxDuration, KFP's default 3600 s): the waits "
                f"before them alone add up to {sum(waits):g} s ({_show(waits)} s), so at most {can_start} could "
                f"start; valid: window_seconds >= {_secs(sum(waits))} plus the run time of {self.retries} "
                f"attempts, or retries <= {can_start}"
            )

    def retries_failure(self, failure: str | None) -> bool:
        """Whether a failure of class ``failure`` (``transient``, ``permanent``, ``device``, ``upstream``) is retried
        on the same candidate: transient ones always (when ``retries`` > 0), permanent ones with ``retry_on="any"``."""
        return failure == "transient" or (self.retry_on == "any" and failure == "permanent")

    def describe(self) -> str:
        """One line for people, e.g. ``2 retries (transient failures), 5 s apart x2 (at most 300 s), within 3600 s``;
        ``no retries`` for ``retries=0``."""
        if not self.retries:
            return "no retries"
        what = "transient failures" if self.retry_on == "transient" else "any failure but a device failure"
        grow = f" x{self.factor:g}" if self.factor != 1 else ""
        return (
            f"{self.retries} retr{'y' if self.retries == 1 else 'ies'} ({what}), {self.backoff_seconds:g} s apart{grow} "
            f"(at most {self.max_delay_seconds:g} s), within {self.window_seconds:g} s"
        )

    def delay_seconds(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0-based): ``min(backoff * factor**retry, cap)``, as
        Airflow, kfp.local and the in-process engine wait."""
        return float(min(_grown(self.backoff_seconds, self.factor, retry), self.max_delay_seconds))

    def cluster_delay_seconds(self, retry: int) -> float:
        """Seconds Argo waits before retry number ``retry`` (0-based) on a cluster: the compiled (whole-second)
        ``backoff * factor**retry``, uncapped: KFP compiles no cap (see the module docstring). ``inf`` past a
        float's range."""
        backoff = float(kfp_duration(self.backoff_seconds)[:-1])
        return _grown(backoff, self.factor, retry)

    def retries_that_can_start(self, *, cluster: bool, attempt_seconds: float = 0.0) -> int:
        """How many of ``retries`` can start if every attempt runs ``attempt_seconds`` (>= 0): retry n starts
        after n + 1 attempts and n + 1 waits, and only within ``window_seconds`` of the first attempt's start.

        Args:
            cluster: Argo's waits (:meth:`cluster_delay_seconds`, uncapped) rather than Airflow's and the local
                engines' (:meth:`delay_seconds`).
            attempt_seconds: run time of each attempt, seconds.
        """
        wait = self.cluster_delay_seconds if cluster else self.delay_seconds
        return _startable([attempt_seconds + wait(n) for n in range(self.retries)], self.window_seconds)

    def kfp_retry_args(self, *, local: bool) -> dict[str, object]:
        """Keyword arguments for KFP's ``PipelineTask.set_retry``.

        Args:
            local: the pipeline runs on kfp.local (``backoff_max_duration`` caps each wait there) rather than on
                a cluster (where it is Argo's total window).
        """
        if not local:
            can_start = self.retries_that_can_start(cluster=True)
            if can_start < self.retries:
                import warnings

                waits = [self.cluster_delay_seconds(n) for n in range(self.retries)]
                warnings.warn(
                    f"retries={self.retries} compiles to maxRetryCount: {self.retries}, but on a cluster at most "
                    f"{can_start} can start: Argo waits backoff_seconds x factor^n uncapped (KFP compiles no "
                    f"max_delay_seconds), {_show(waits)} s, within backoff.maxDuration={self.window_seconds:g} s; "
                    f"give window_seconds >= {_secs(sum(waits))} plus the attempts' run time, a smaller factor, "
                    f"or retries <= {can_start}",
                    RetryWindowWarning,
                    stacklevel=2,
                )
        return {
            "num_retries": self.retries,
            "backoff_duration": kfp_duration(self.backoff_seconds),
            "backoff_factor": float(self.factor),
            "backoff_max_duration": kfp_duration(self.max_delay_seconds if local else self.window_seconds),
        }
