"""What each step declares: its device candidates (in preference order) and its retry policy."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

from heteroflow.components.resources import Candidates, Resources, RetryPolicy

__all__ = ["DEFAULT_STEPS", "DEFAULT_TRAIN_CANDIDATES", "StepSpec"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StepSpec:
    """One step's declaration.

    Attributes:
        name: step name (``train``).
        candidates: where it can run, first preferred.
        retry: retries on one candidate.
        cacheable: whether an engine may answer it from a cache (False for steps whose result depends on
            live state: the inventory, the cache tier, the archive).
    """

    name: str
    candidates: Candidates
    retry: RetryPolicy
    cacheable: bool = True


DEFAULT_TRAIN_CANDIDATES = Candidates(
    [
        Resources(kind="npu", accelerator="ascend-910", count=1, cpu="8", memory="32Gi"),
        Resources(kind="gpu", accelerator="nvidia-gpu", count=1, cpu="8", memory="32Gi"),
        Resources(kind="cpu", cpu="8", memory="16Gi"),
    ]
)
"""Ascend 910 x1, else NVIDIA GPU x1, else 8 CPUs."""

_CPU_SMALL = Candidates([Resources(kind="cpu", cpu="1", memory="2Gi")])

DEFAULT_STEPS: Mapping[str, StepSpec] = MappingProxyType(
    {
        "prewarm": StepSpec(
            name="prewarm", candidates=_CPU_SMALL, retry=RetryPolicy(retries=3, backoff_seconds=5), cacheable=False
        ),
        "preprocess": StepSpec(
            name="preprocess",
            candidates=Candidates([Resources(kind="cpu", cpu="4", memory="8Gi")]),
            retry=RetryPolicy(retries=1, backoff_seconds=5),
        ),
        "plan": StepSpec(
            name="plan",
            candidates=Candidates([Resources(kind="cpu", cpu="500m", memory="512Mi")]),
            retry=RetryPolicy(retries=1, backoff_seconds=2),
            cacheable=False,
        ),
        "train": StepSpec(name="train", candidates=DEFAULT_TRAIN_CANDIDATES, retry=RetryPolicy(retries=2, backoff_seconds=10)),
        "evaluate": StepSpec(name="evaluate", candidates=DEFAULT_TRAIN_CANDIDATES, retry=RetryPolicy(retries=1, backoff_seconds=5)),
        "archive": StepSpec(
            name="archive", candidates=_CPU_SMALL, retry=RetryPolicy(retries=2, backoff_seconds=5), cacheable=False
        ),
    }
)
"""The default pipeline's steps, in order."""
