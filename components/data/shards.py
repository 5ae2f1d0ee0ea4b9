"""What preprocess writes: its result (:class:`PreprocessResult`), the stratified split, the shard files
(``<split>-NNNNN.npz``), ``meta.json`` and the names of the transformation's files; written by
:mod:`heteroflow.components.data.preprocess` and read back here (:func:`read_meta`, :func:`load_split`,
:func:`split_rows`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heteroflow.cache.errors import DatasetError
from heteroflow.components.errors import InvalidParameter

if TYPE_CHECKING:  # numpy is imported where it is used: pipeline definitions import the steps
    import numpy as np

__all__ = [
    "META_NAME",
    "SCHEMA_NAME",
    "SPLITS",
    "TRANSFORM_FILES",
    "TRANSFORM_NAME",
    "PreprocessResult",
    "load_split",
    "read_meta",
    "split_rows",
    "stratified_split",
]

SPLITS = ("train", "validation", "test")
META_NAME = "meta.json"
TRANSFORM_NAME = "transform.joblib"
"""The fitted transformation (a scikit-learn ColumnTransformer written with :func:`joblib.dump`, a pickle:
load only archives you trust)."""
SCHEMA_NAME = "transform.json"
"""What the transformation expects: the input columns and their kinds, the class column and classes."""
TRANSFORM_FILES = (TRANSFORM_NAME, SCHEMA_NAME)
"""The files that carry the transformation: preprocess writes them, train copies them into the model folder."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PreprocessResult:
    """What preprocess wrote.

    Attributes:
        output_dir: folder with ``<split>-NNNNN.npz`` shards (arrays ``x`` float32 ``(n, d)``, ``y`` int64
            ``(n,)``, ``source_file`` int32 ``(n,)``, ``source_row`` int64 ``(n,)``), ``meta.json``, ``transform.joblib``
            and ``transform.json``.
        counts: samples per split.
        num_features: d, the width of ``x`` (numeric columns, one-hot columns, indicator columns).
        classes: class names, index = label id.
        num_workers: processes used to read files.
        seconds: wall time, seconds.
        report: the data report (JSON-ready): files and how each was read (delimiter, encoding, header,
            decimal mark, with reasons), rows read and used, rows dropped and why, the class column and why,
            class counts, columns used / dropped (with why) / encoded (categories) / imputed (count, strategy,
            value), output features, the parameters as given, and the notices.
        notices: decisions the user should know about (also in ``report["notices"]``, and logged).
    """

    output_dir: Path
    counts: dict[str, int]
    num_features: int
    classes: tuple[str, ...]
    num_workers: int
    seconds: float
    report: dict[str, Any] = dataclasses.field(default_factory=dict)
    notices: tuple[str, ...] = ()


def stratified_split(
    labels: np.ndarray,
    *,
    validation_fraction: float,
    test_fraction: float,
    seed: int,
    too_few: Callable[[Any, int], Exception],
    at_least_one_test: bool = False,
) -> dict[str, np.ndarray]:
    """Row indices per split (``train``, ``validation``, ``test``), stratified by label: per class (in
    ``np.unique`` order) a permutation from ``np.random.default_rng(seed)``, whose first ``round(n * test_fraction)``
    rows go to test, the next ``round(n * validation_fraction)`` to validation and the rest to train. Each split's
    indices are sorted (rows read in file order; train shuffles its batches anyway).

    Args:
        labels: ``(n,)`` integer labels.
        too_few: the exception to raise for a class (its label, its sample count) left with no test or no train
            row.
        at_least_one_test: a class whose test share rounds to 0 gives 1 row to test instead (the image and tensor
            readers) rather than being too few (tables).

    Raises:
        Exception: ``too_few(label, n)`` for the first class that cannot be split.
    """
    import numpy as np

    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    # Each row's split (0 train, 1 validation, 2 test), then each split's rows in order: O(n), no sort of the
    # indices; the same rows as sorting each split's permuted indices (issue #32 item 1).
    assigned = np.zeros(len(labels), dtype=np.int8)
    for label in _distinct(labels, np):
        idx = rng.permutation(np.flatnonzero(labels == label))
        n = len(idx)
        n_test = int(round(n * test_fraction))
        if at_least_one_test:
            n_test = max(1, n_test)
        n_val = int(round(n * validation_fraction))
        if n_test < 1 or n - n_test - n_val < 1:
            raise too_few(label, n)
        assigned[idx[:n_test]] = 2
        assigned[idx[n_test:n_test + n_val]] = 1
    return {s: np.flatnonzero(assigned == k).astype(np.int64, copy=False) for k, s in enumerate(SPLITS)}


def _distinct(labels: np.ndarray, np: Any) -> np.ndarray:
    """``np.unique(labels)``; for small non-negative integers (class indices) counted instead of sorted."""
    if labels.dtype.kind in "iu" and len(labels):
        low, high = labels.min(), labels.max()
        if low >= 0 and high < max(1 << 16, len(labels)):
            return np.flatnonzero(np.bincount(labels)).astype(labels.dtype, copy=False)
    return np.unique(labels)


def _write_shards(folder: Path, split: str, per_shard: int, **arrays: np.ndarray) -> list[str]:
    """Write one split as ``<split>-NNNNN.npz`` files of at most ``per_shard`` samples; their names."""
    import numpy as np

    n = len(arrays["x"])
    names = []
    for k, begin in enumerate(range(0, max(n, 1), per_shard)):
        name = f"{split}-{k:05d}.npz"
        chunk = {key: value[begin:begin + per_shard] for key, value in arrays.items()}
        chunk["y"] = chunk["y"].astype(np.int64)
        np.savez(folder / name, **chunk)
        names.append(name)
    return names


class _ShardFile:
    """One shard written in pieces, each call on the same writer thread, in order: :meth:`begin`, :meth:`write`
    for each piece of ``x`` (float32 rows, in order), :meth:`end` with the other arrays: the bytes
    :func:`numpy.savez` writes for the whole ``x`` (an uncompressed zip of one ``.npy`` per array), without ``x``
    held whole and without np.savez's copy of each array in 16 MiB pieces (issue #32 item 1)."""

    def __init__(self, path: Path, rows: int, width: int) -> None:
        self.path, self.rows, self.width = path, rows, width
        self.archive: Any = None
        self.entry: Any = None

    def begin(self) -> None:
        import zipfile

        import numpy as np
        from numpy.lib import format as npy

        self.archive = zipfile.ZipFile(self.path, "w", compression=zipfile.ZIP_STORED, allowZip64=True)
        self.entry = self.archive.open("x.npy", "w", force_zip64=True)
        header = {"descr": npy.dtype_to_descr(np.dtype(np.float32)), "fortran_order": False, "shape": (self.rows, self.width)}
        npy.write_array_header_1_0(self.entry, header)

    def write(self, piece: np.ndarray) -> None:
        self.entry.write(memoryview(piece.reshape(-1)).cast("B"))

    def end(self, **arrays: np.ndarray) -> None:
        import numpy as np
        from numpy.lib import format as npy

        self.entry.close()
        arrays["y"] = arrays["y"].astype(np.int64, copy=False)
        with self.archive:
            for key, value in arrays.items():
                value = np.ascontiguousarray(value)
                with self.archive.open(f"{key}.npy", "w", force_zip64=True) as fh:
                    npy.write_array_header_1_0(fh, npy.header_data_from_array_1_0(value))
                    fh.write(memoryview(value.reshape(-1)).cast("B"))


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
    import numpy as np

    if split not in SPLITS:
        raise InvalidParameter(f"split={split!r} is unknown; valid: {', '.join(SPLITS)}")
    meta = read_meta(dataset_dir)
    xs, ys = [], []
    for fname in meta["shards"][split]:
        with np.load(Path(dataset_dir, fname)) as data:
            xs.append(data["x"])
            ys.append(data["y"])
    return np.concatenate(xs), np.concatenate(ys)


def split_rows(dataset_dir: str | os.PathLike[str], split: str) -> list[tuple[str, int]]:
    """Where each sample of a split came from, in shard order: ``(file, position)`` with ``file`` as named in
    ``meta.json`` (the user's path) and ``position`` the data row's 0-based position in it (blank rows
    counted, the header not), the index of :attr:`~heteroflow.components.data.datasets.RawTable.frame`.

    Raises:
        InvalidParameter: ``split`` is not one of train, validation, test.
        DatasetError: the folder is not preprocess output.
    """
    import numpy as np

    if split not in SPLITS:
        raise InvalidParameter(f"split={split!r} is unknown; valid: {', '.join(SPLITS)}")
    meta = read_meta(dataset_dir)
    out: list[tuple[str, int]] = []
    for fname in meta["shards"][split]:
        with np.load(Path(dataset_dir, fname)) as data:
            out.extend((meta["files"][int(f)], int(r)) for f, r in zip(data["source_file"], data["source_row"]))
    return out
