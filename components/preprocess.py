"""Preprocess (CPU only): load a cached data set, split it into train/validation/test, normalise, write shards.

The split is stratified by class and seeded, so the same data and seed give the same shards. Features are
standardised with the mean and standard deviation of the *train* split only (no leakage into validation and
test). Files are parsed in parallel on ``num_workers`` CPU processes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from heteroflow.cache.atomic import atomic_directory
from heteroflow.cache.errors import DatasetError
from heteroflow.cache.prewarm import MANIFEST_NAME, Manifest
from heteroflow.components.datasets import Table, data_files, load_table
from heteroflow.components.errors import InvalidParameter
from heteroflow.components.resources import Resources, RetryPolicy
from heteroflow.components.step import ArtifactSpec, ArtifactType, Step, step

__all__ = [
    "SPLITS",
    "PreprocessResult",
    "available_cpus",
    "check_preprocess_params",
    "check_split_params",
    "load_split",
    "preprocess",
    "read_meta",
]

SPLITS = ("train", "validation", "test")
META_NAME = "meta.json"


def available_cpus() -> int:
    """CPU cores this process may use, at least 1.

    The smaller of the affinity mask (``os.sched_getaffinity``, which honours cpusets) and the cgroup v2 CPU
    quota (``/sys/fs/cgroup/cpu.max``: ``quota period``, rounded up), which is how a Kubernetes CPU limit
    reaches a container.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cores)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PreprocessResult:
    """What preprocess wrote.

    Attributes:
        output_dir: folder with ``<split>-NNNNN.npz`` shards (arrays ``x`` float32 ``(n, d)``, ``y`` int64
            ``(n,)``) and ``meta.json``.
        counts: samples per split.
        num_features: d.
        classes: class names, index = label id.
        num_workers: processes used to parse files.
        seconds: wall time, seconds.
    """

    output_dir: Path
    counts: dict[str, int]
    num_features: int
    classes: tuple[str, ...]
    num_workers: int
    seconds: float


def _resolve_files(source: str | os.PathLike[str]) -> tuple[list[Path], Manifest | None, str]:
    """The data files of ``source``, its manifest (None for a plain folder) and its source URI."""
    src = Path(source)
    if src.is_file() and (src.name == MANIFEST_NAME or src.suffix == ".json"):
        manifest = Manifest.load(src)
        return data_files(manifest.local_paths(), where=manifest.source_uri), manifest, manifest.source_uri
    if src.is_dir() and (src / MANIFEST_NAME).is_file():
        return _resolve_files(src / MANIFEST_NAME)
    if src.is_dir():
        files = [p for p in src.rglob("*") if p.is_file() and not p.name.startswith(".")]
        if not files:
            raise DatasetError(f"data set folder {src} is empty; put .csv or .npz files in it")
        return data_files(files, where=str(src)), None, str(src)
    if src.is_file():
        return data_files([src], where=str(src)), None, str(src)
    raise DatasetError(f"data set {src} does not exist")


def _split_indices(
    y: np.ndarray, validation_fraction: float, test_fraction: float, seed: int, classes: np.ndarray
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    for label in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == label))
        n = len(idx)
        n_test = int(round(n * test_fraction))
        n_val = int(round(n * validation_fraction))
        if n_test < 1 or n - n_test - n_val < 1:
            raise DatasetError(
                f"class '{classes[label]}' has {n} samples: too few to put at least one in test and one in train with "
                f"validation_fraction={validation_fraction} and test_fraction={test_fraction}; give more samples "
                "of that class, or drop it"
            )
        parts["test"].append(idx[:n_test])
        parts["validation"].append(idx[n_test:n_test + n_val])
        parts["train"].append(idx[n_test + n_val:])
    return {s: rng.permutation(np.concatenate(v)) for s, v in parts.items()}


def check_split_params(*, validation_fraction: float, test_fraction: float) -> None:
    """Check the split shares (the checks :func:`preprocess` makes; callers use it to fail before a run).

    Raises:
        InvalidParameter: a share out of range, or shares that leave nothing to train on.
    """
    if not 0 <= validation_fraction < 1:
        raise InvalidParameter(f"validation_fraction={validation_fraction} is out of range; valid: 0 <= x < 1")
    if not 0 < test_fraction < 1:
        raise InvalidParameter(f"test_fraction={test_fraction} is out of range; valid: 0 < x < 1")
    if validation_fraction + test_fraction >= 1:
        raise InvalidParameter(
            f"validation_fraction + test_fraction = {validation_fraction + test_fraction} leaves nothing to train on; "
            "valid: a sum below 1"
        )


def check_preprocess_params(
    *, validation_fraction: float, test_fraction: float, num_workers: int = 0, shard_size: int = 512
) -> None:
    """Check preprocess's parameters (the checks :func:`preprocess` makes; callers use it to fail before a run).

    Raises:
        InvalidParameter: the first parameter out of range, named, with its valid range.
    """
    check_split_params(validation_fraction=validation_fraction, test_fraction=test_fraction)
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise InvalidParameter(f"num_workers={num_workers!r} is out of range; valid: 0 (every given core) or more")
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise InvalidParameter(f"shard_size={shard_size!r} is out of range; valid: an integer >= 1")


def preprocess(
    source: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    *,
    validation_fraction: float = 0.15,
    test_fraction: float = 0.15,
    seed: int = 0,
    num_workers: int = 0,
    shard_size: int = 512,
) -> PreprocessResult:
    """Split (stratified, seeded), normalise and shard a data set on CPU workers.

    Args:
        source: a prewarm manifest (``manifest.json``), a folder holding one, or a plain data folder/file.
        output_dir: folder to write; replaced as a whole (written beside it, then renamed into place).
        validation_fraction: share of each class for validation, in [0, 1) (unit: fraction).
        test_fraction: share of each class for test, in (0, 1) (unit: fraction).
        seed: seed of the split (same seed and data, same shards).
        num_workers: processes parsing files; 0: every CPU core this step is given (unit: processes).
        shard_size: samples per shard file, >= 1 (unit: samples).

    Returns:
        A :class:`PreprocessResult`.

    Raises:
        InvalidParameter: a fraction, ``num_workers`` or ``shard_size`` out of range.
        DatasetError: no data file, unreadable files, files with different feature counts, too few samples.
    """
    started = time.perf_counter()
    check_preprocess_params(
        validation_fraction=validation_fraction, test_fraction=test_fraction, num_workers=num_workers, shard_size=shard_size
    )
    workers = num_workers or available_cpus()

    files, manifest, source_uri = _resolve_files(source)
    dataset_sha256 = manifest.dataset_sha256 if manifest is not None else None

    def in_source_terms(message: str) -> str:
        # Errors name the user's file (the prewarm source), not its copy in the cache tier.
        if manifest is None:
            return message
        return message.replace(manifest.root.rstrip("/") + "/", source_uri.rstrip("/") + "/")

    workers = min(workers, len(files))
    try:
        if workers > 1:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                tables: list[Table] = list(pool.map(load_table, files))
        else:
            tables = [load_table(f) for f in files]
        width = tables[0].features.shape[1]
        for t in tables:
            if t.features.shape[1] != width:
                raise DatasetError(f"{t.source} has {t.features.shape[1]} features but {tables[0].source} has {width}")
    except DatasetError as exc:
        raise DatasetError(in_source_terms(str(exc))) from None
    x = np.concatenate([t.features for t in tables])
    raw = np.concatenate([t.labels.astype(str) if t.labels.dtype.kind in "US" else t.labels for t in tables])
    classes_raw, y = np.unique(raw, return_inverse=True)
    if len(classes_raw) < 2:
        raise DatasetError(f"data set {source_uri} has {len(classes_raw)} class; a classifier needs at least 2")
    split = _split_indices(y, validation_fraction, test_fraction, seed, classes_raw)
    mean = x[split["train"]].mean(axis=0)
    std = x[split["train"]].std(axis=0)
    std[std == 0] = 1.0

    out = Path(output_dir)
    with atomic_directory(out) as tmp:
        shards: dict[str, list[str]] = {}
        for name, idx in split.items():
            shards[name] = []
            for k, start in enumerate(range(0, max(len(idx), 1), shard_size)):
                chunk = idx[start:start + shard_size]
                fname = f"{name}-{k:05d}.npz"
                np.savez(tmp / fname, x=((x[chunk] - mean) / std).astype(np.float32), y=y[chunk].astype(np.int64))
                shards[name].append(fname)
        meta: dict[str, Any] = {
            "source_uri": source_uri,
            "dataset_sha256": dataset_sha256,
            "num_features": int(width),
            "classes": [str(c) for c in classes_raw],
            "counts": {k: int(len(v)) for k, v in split.items()},
            "shards": shards,
            "mean": mean.tolist(),
            "std": std.tolist(),
            "seed": seed,
            "validation_fraction": validation_fraction,
            "test_fraction": test_fraction,
        }
        (tmp / META_NAME).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return PreprocessResult(
        output_dir=out,
        counts=meta["counts"],
        num_features=int(width),
        classes=tuple(meta["classes"]),
        num_workers=workers,
        seconds=time.perf_counter() - started,
    )


def read_meta(dataset_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``meta.json`` of a preprocessed data set.

    Raises:
        DatasetError: the folder is not preprocess output.
    """
    path = Path(dataset_dir, META_NAME)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DatasetError(f"{dataset_dir} is not a preprocessed data set (no {META_NAME}); run preprocess first") from None


def load_split(dataset_dir: str | os.PathLike[str], split: str) -> tuple[np.ndarray, np.ndarray]:
    """All shards of one split, concatenated: ``x`` float32 ``(n, d)``, ``y`` int64 ``(n,)``.

    Raises:
        InvalidParameter: ``split`` is not one of train, validation, test.
        DatasetError: the folder is not preprocess output.
    """
    if split not in SPLITS:
        raise InvalidParameter(f"split={split!r} is unknown; valid: {', '.join(SPLITS)}")
    meta = read_meta(dataset_dir)
    xs, ys = [], []
    for fname in meta["shards"][split]:
        with np.load(Path(dataset_dir, fname)) as data:
            xs.append(data["x"])
            ys.append(data["y"])
    return np.concatenate(xs), np.concatenate(ys)


# --- the step definition ----------------------------------------------------------------------------------

_HOUR = 3600.0


def _preprocess_facts(result: Any) -> dict[str, Any]:
    return {
        "counts": dict(result.counts),
        "num_features": result.num_features,
        "num_classes": len(result.classes),
        "classes": list(result.classes),
        "num_workers": result.num_workers,
        "seconds": result.seconds,
    }


PREPROCESS: Step = step(
    preprocess,
    name="preprocess",
    inputs=[ArtifactSpec(name="dataset", type=ArtifactType.DATASET, param="source")],
    outputs=[ArtifactSpec(name="shards", type=ArtifactType.DATASET, param="output_dir", help="train/validation/test shards")],
    candidates=[Resources(kind="cpu", cpu="4", memory="8Gi")],
    retry=RetryPolicy(retries=1, backoff_seconds=5, max_delay_seconds=60, window_seconds=2 * _HOUR),
    check=check_preprocess_params,
    facts=_preprocess_facts,
    ref="heteroflow.components.preprocess:PREPROCESS",
)
