"""The prewarm step: copy a data set into the cache tier (:func:`heteroflow.cache.prewarm.prewarm_dataset`), as a
:class:`~heteroflow.components.core.step.Step`. (The function lives in ``heteroflow.cache``, which cannot import the
step layer above it.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from heteroflow.cache.prewarm import prewarm_dataset, prewarm_option_problems
from heteroflow.cache.progress import Progress, format_bytes, report_progress
from heteroflow.components.resources import Resources, RetryPolicy
from heteroflow.components.core.step import ArtifactSpec, ArtifactType, Step, step, with_defaults
from heteroflow.components.errors import InvalidParameter, Problems

__all__ = ["PREWARM", "check_prewarm_params"]

_HOUR = 3600.0


def check_prewarm_params(values: Mapping[str, Any] | None = None, /, **given: Any) -> None:
    """Check prewarm's parameters before a run (the checks :func:`~heteroflow.cache.prewarm.prewarm_dataset` makes
    when it starts: :func:`~heteroflow.cache.prewarm.prewarm_option_problems`).

    Args:
        values / given: parameter values by name (``prewarm_dataset``'s defaults for the others).

    Raises:
        InvalidParameter: every bad ``cache_root``, ``copy_threads``, ``verify_cached``, ``keep_versions`` or
            ``lock_timeout_s``, each named with what is valid (several in one message).
    """
    v = with_defaults(prewarm_dataset, values, **given)
    problems = Problems()
    for message in prewarm_option_problems(cache_root=v["cache_root"], copy_threads=v["copy_threads"],
                                           verify_cached=v["verify_cached"], keep_versions=v["keep_versions"],
                                           lock_timeout_s=v["lock_timeout_s"]):
        problems.add(InvalidParameter(message))
    problems.raise_all("prewarm's parameters")


def _progress(report: Any) -> Any:
    """Forward the cache tier's progress (:mod:`heteroflow.cache.progress`) to the step's live record."""

    def forward(p: Progress) -> None:
        report(
            phase=p.phase,
            files=p.files_done,
            files_total=p.files_total,
            bytes=p.bytes_done,
            bytes_total=p.bytes_total,
            bytes_per_second=round(p.bytes_per_s),
        )

    return report_progress(forward)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _prewarm_summary(f: dict[str, Any]) -> list[str]:
    return [
        f"data set: {_count(f['files'], 'file')}, {format_bytes(f['total_bytes'])} (sha256 {f['dataset_sha256'][:12]}); "
        f"copied {_count(f['files_copied'], 'file')} ({format_bytes(f['bytes_copied'])}), {f['files_skipped']} already cached"
    ]


PREWARM: Step = step(
    prewarm_dataset,
    name="prewarm",
    outputs=[ArtifactSpec(name="dataset", type=ArtifactType.DATASET, param="dataset_dir", help="the data set's manifest")],
    candidates=[Resources(kind="cpu", cpu="1", memory="2Gi")],
    retry=RetryPolicy(retries=3, backoff_seconds=5, max_delay_seconds=60, window_seconds=2 * _HOUR),
    cacheable=False,  # its result depends on the cache tier's state
    check=check_prewarm_params,
    facts=lambda result: result.facts(),
    progress_context=_progress,
    summary=_prewarm_summary,
    ref="heteroflow.components.data.prewarm:PREWARM",
)
