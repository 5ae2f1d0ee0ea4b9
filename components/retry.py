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
"""

from __future__ import annotations

import dataclasses
import math

from heteroflow.components.errors import InvalidResources

__all__ = ["RetryPolicy", "kfp_duration"]


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
            (Argo ``backoff.maxDuration`` on a cluster; KFP's default 3600 s). Make it longer than
            ``retries`` attempts of the step plus their waits.

    Raises:
        InvalidResources: a field out of range, infinite or NaN; the message names it and the valid range.
    """

    retries: int = 2
    backoff_seconds: float = 5.0
    factor: float = 2.0
    max_delay_seconds: float = 300.0
    window_seconds: float = 3600.0

    def __post_init__(self) -> None:
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

    def delay_seconds(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0-based): ``min(backoff * factor**retry, cap)``."""
        return float(min(self.backoff_seconds * self.factor**retry, self.max_delay_seconds))

    def kfp_retry_args(self, *, local: bool) -> dict[str, object]:
        """Keyword arguments for KFP's ``PipelineTask.set_retry``.

        Args:
            local: the pipeline runs on kfp.local (``backoff_max_duration`` caps each wait there) rather than on
                a cluster (where it is Argo's total window).
        """
        return {
            "num_retries": self.retries,
            "backoff_duration": kfp_duration(self.backoff_seconds),
            "backoff_factor": float(self.factor),
            "backoff_max_duration": kfp_duration(self.max_delay_seconds if local else self.window_seconds),
        }
