"""The prewarm step: copy a data set into the cache tier (:func:`heteroflow.cache.prewarm.prewarm_dataset`), as a
:class:`~heteroflow.components.step.Step`. (The function lives in ``heteroflow.cache``, which cannot import the
step layer above it.)"""

from __future__ import annotations

from typing import Any

from heteroflow.cache.prewarm import prewarm_dataset
from heteroflow.components.resources import Resources, RetryPolicy
from heteroflow.components.step import ArtifactSpec, ArtifactType, Step, step

__all__ = ["PREWARM"]

_HOUR = 3600.0


def _prewarm_facts(result: Any) -> dict[str, Any]:
    m = result.manifest
    return {
        "dataset_sha256": m.dataset_sha256,
        "files": len(m.files),
        "total_bytes": m.total_bytes,
        "files_copied": result.files_copied,
        "files_skipped": result.files_skipped,
        "bytes_copied": result.bytes_copied,
        "cache_dir": m.root,
        "source_uri": m.source_uri,
        "seconds": result.seconds,
    }


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _prewarm_summary(f: dict[str, Any]) -> list[str]:
    return [
        f"data set: {f['files']} files, {_bytes(f['total_bytes'])} (sha256 {f['dataset_sha256'][:12]}); "
        f"copied {f['files_copied']} files ({_bytes(f['bytes_copied'])}), {f['files_skipped']} already cached"
    ]


PREWARM: Step = step(
    prewarm_dataset,
    name="prewarm",
    outputs=[ArtifactSpec(name="dataset", type=ArtifactType.DATASET, param="dataset_dir", help="the data set's manifest")],
    candidates=[Resources(kind="cpu", cpu="1", memory="2Gi")],
    retry=RetryPolicy(retries=3, backoff_seconds=5, max_delay_seconds=60, window_seconds=2 * _HOUR),
    cacheable=False,  # its result depends on the cache tier's state
    facts=_prewarm_facts,
    summary=_prewarm_summary,
    ref="heteroflow.components.prewarm:PREWARM",
)
