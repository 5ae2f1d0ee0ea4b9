"""The prewarm step: copy a data set into the cache tier (:func:`heteroflow.cache.prewarm.prewarm_dataset`), as a
:class:`~heteroflow.components.core.step.Step`. (The function lives in ``heteroflow.cache``, which cannot import the
step layer above it.)"""

from __future__ import annotations

from typing import Any

from heteroflow.cache.prewarm import prewarm_dataset
from heteroflow.cache.progress import Progress, format_bytes, report_progress
from heteroflow.components.resources import Resources, RetryPolicy
from heteroflow.components.core.step import ArtifactSpec, ArtifactType, Step, step

__all__ = ["PREWARM"]

_HOUR = 3600.0


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
    facts=lambda result: result.facts(),
    progress_context=_progress,
    summary=_prewarm_summary,
    ref="heteroflow.components.data.prewarm:PREWARM",
)
