"""Preprocess (CPU only): read a data set's tables, decide what the data means, check it, split it, fit the
transformation on the train split, and write shards.

Steps, each decision reported in :attr:`PreprocessResult.report` (and ``meta.json``):

1. Read every file (:func:`heteroflow.components.data.datasets.read_table`: delimiter, encoding, header, missing
   markers), in parallel on ``num_workers`` processes.
2. The class column: ``label_column``, else a column named as a class (:data:`CLASS_COLUMN_NAMES`, first
   listed first), else the last column; a guessed class column is said in a notice (logged at once, before
   anything is fitted). A class column with missing values is an error listing the first rows (``missing=drop`` drops those
   rows); one that looks continuous (numbers with a fractional part, or more than half as many distinct
   values as rows, and more than 20) is an error.
3. The features: every other column but ``drop_columns``. A column that looks like a row id (named like one,
   see :data:`ID_NAME_TOKENS`; whole numbers, one per row, increasing with the row order or covering
   ``min..max`` exactly; text different in every row) is left out with a notice unless it is in
   ``keep_columns``. Text columns are one-hot encoded (``categorical=onehot``) when they hold at most
   ``max_categories`` distinct values. Missing values are an error (``missing=error``), filled with the
   median / most frequent value plus an indicator column (``impute``), or their rows dropped (``drop``).
   An infinite number is always an error. Every problem found is reported in one error, each naming the
   column and the parameter that changes the decision.
4. Split each class into train / validation / test (stratified, seeded: same data and seed, same shards).
5. Fit the transformation (:mod:`heteroflow.components.data.tabular`: scikit-learn's ColumnTransformer,
   StandardScaler, OneHotEncoder, SimpleImputer) on the train split only, and apply it to every split.
6. Write shards ``<split>-NNNNN.npz`` (``x`` float32 ``(n, d)``, ``y`` int64 ``(n,)``, ``source_file`` int32
   and ``source_row`` int64: the file's index in ``meta.json``'s ``files`` and the row's position in it),
   ``meta.json``, and the transformation (``transform.joblib``, ``transform.json``), which train copies into
   the model folder so the archived model can read raw rows
   (:func:`heteroflow.components.models.predict.load_archived`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import logging
import math
import os
import re
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heteroflow.cache.atomic import atomic_directory
from heteroflow.cache.errors import DatasetError
from heteroflow.cache.dataset import open_dataset
from heteroflow.components.data.datasets import DELIMITERS, RawTable, read_table, text_cells
from heteroflow.components.errors import InvalidParameter
from heteroflow.components.data.formats import REGISTRY, TABLE
from heteroflow.components.resources import Resources, RetryPolicy
from heteroflow.components.core.step import ArtifactSpec, ArtifactType, Step, step, with_defaults

if TYPE_CHECKING:  # numpy and pandas are imported where they are used: pipeline definitions import the steps
    import numpy as np
    import pandas as pd

__all__ = [
    "CATEGORICAL_CHOICES",
    "CLASS_COLUMN_NAMES",
    "HEADER_CHOICES",
    "ID_NAME_TOKENS",
    "META_NAME",
    "MISSING_CHOICES",
    "SCHEMA_NAME",
    "SPLITS",
    "TRANSFORM_FILES",
    "TRANSFORM_NAME",
    "PreprocessResult",
    "available_cpus",
    "SEED_MAX",
    "check_integer",
    "check_preprocess_params",
    "check_split_params",
    "load_split",
    "preprocess",
    "read_meta",
    "split_rows",
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
HEADER_CHOICES = ("auto", "true", "false")
CATEGORICAL_CHOICES = ("onehot", "error")
MISSING_CHOICES = ("error", "impute", "drop")
CLASS_COLUMN_NAMES = ("label", "class", "target", "y", "species", "outcome", "diagnosis", "labels", "classes")
"""Names taken for the class column when ``label_column`` is empty, first listed first (case and surrounding
spaces ignored): the names public tables (UCI, OpenML, Kaggle, scikit-learn's ``target``) give it. Without
such a column the last column is taken, with a notice naming any column whose name holds one of these words
(``income_class``)."""
ID_NAME_TOKENS = frozenset({"id", "ids", "uuid", "guid", "idx", "index"})
"""A column whose name holds one of these words (``id``, ``PassengerId``, ``user_id``, ``ID``) is taken for a
row id. Words are split at ``_``, spaces, digits and lower-to-upper case changes, so ``valid`` or ``paid``
are not ids."""

_SHARD_BYTES = 16 << 20  # shard_size=0: as many samples as fit in about 16 MiB of float32 features
_MIN_ROWS_FOR_VALUE_CHECKS = 20  # below this, "one value per row" says nothing about a column
_LISTED_ROWS = 5

log = logging.getLogger(__name__)


def available_cpus() -> int:
    """CPU cores this process may use, at least 1: :func:`joblib.cpu_count`, which honours the affinity mask
    (cpusets) and the cgroup CPU quota (how a Kubernetes CPU limit reaches a container)."""
    import joblib

    return max(1, int(joblib.cpu_count()))


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


# --- parameters --------------------------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_split_params(*, validation_fraction: float, test_fraction: float) -> None:
    """Check the split shares (the checks :func:`preprocess` makes; callers use it to fail before a run).

    Raises:
        InvalidParameter: a share that is not a finite number, out of range, or shares that leave nothing to
            train on.
    """
    for name, value in (("validation_fraction", validation_fraction), ("test_fraction", test_fraction)):
        if not _is_number(value) or not math.isfinite(value):
            raise InvalidParameter(f"{name}={value!r} is not a finite number; valid: a number in the range below 1")
    if not 0 <= validation_fraction < 1:
        raise InvalidParameter(f"validation_fraction={validation_fraction} is out of range; valid: 0 <= x < 1")
    if not 0 < test_fraction < 1:
        raise InvalidParameter(f"test_fraction={test_fraction} is out of range; valid: 0 < x < 1")
    if validation_fraction + test_fraction >= 1:
        raise InvalidParameter(
            f"validation_fraction + test_fraction = {validation_fraction + test_fraction} leaves nothing to train on; "
            "valid: a sum below 1"
        )


SEED_MAX = 2**32 - 1
"""The largest seed every engine takes: numpy's ``default_rng`` takes any integer >= 0, ``torch.manual_seed``
integers up to 2**64 - 1, and JSON readers and KFP integer parameters are safe up to 2**53; 2**32 - 1 is also
the range of the legacy ``numpy.random.seed``."""


def check_integer(name: str, value: Any, low: int, valid: str = "", *, high: int | None = None) -> None:
    """Check one integer parameter: an ``int`` (not a bool) in ``low..high``.

    Raises:
        InvalidParameter: naming the parameter, the value and the valid range (``valid``, else derived).
    """
    if not valid:
        valid = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameter(f"{name}={value!r} is not an integer; valid: {valid}")
    if value < low or (high is not None and value > high):
        raise InvalidParameter(f"{name}={value!r} is out of range; valid: {valid}")


def _names(value: str, param: str) -> list[str]:
    if not isinstance(value, str):
        raise InvalidParameter(f"{param}={value!r} is not a string; valid: column names separated by commas")
    return [n.strip() for n in value.split(",") if n.strip()]


def _choice(value: Any, param: str, choices: tuple[str, ...]) -> str:
    text = str(value).strip().lower() if isinstance(value, (str, bool)) else None
    if text not in choices:
        raise InvalidParameter(f"{param}={value!r} is not valid; valid: {', '.join(choices)}")
    return text


def check_preprocess_params(values: Mapping[str, Any] | None = None, /, **given: Any) -> None:
    """Check every parameter of :func:`preprocess` (the checks it makes first; callers use it to fail before a run).

    Args:
        values / given: parameter values by name (``preprocess``'s defaults for the others).

    Raises:
        InvalidParameter: the first parameter out of range, named, with what is valid.
    """
    v = with_defaults(preprocess, values, **given)
    validation_fraction, test_fraction, shard_size = v["validation_fraction"], v["test_fraction"], v["shard_size"]
    num_workers, max_categories, label_column = v["num_workers"], v["max_categories"], v["label_column"]
    drop_columns, keep_columns, delimiter = v["drop_columns"], v["keep_columns"], v["delimiter"]
    header, categorical, missing = v["header"], v["categorical"], v["missing"]
    check_split_params(validation_fraction=validation_fraction, test_fraction=test_fraction)
    check_integer("shard_size", shard_size, 0, "0 (about 16 MiB per shard) or more")
    check_integer("num_workers", num_workers, 0, "0 (every given core) or more")
    check_integer("max_categories", max_categories, 2)
    check_integer("seed", v["seed"], 0, high=SEED_MAX)
    if not isinstance(label_column, str):
        raise InvalidParameter(f"label_column={label_column!r} is not a string; valid: a column name, or empty")
    _names(drop_columns, "drop_columns")
    _names(keep_columns, "keep_columns")
    _choice(header, "header", HEADER_CHOICES)
    _choice(categorical, "categorical", CATEGORICAL_CHOICES)
    _choice(missing, "missing", MISSING_CHOICES)
    if not isinstance(delimiter, str) or (
        delimiter != "auto" and delimiter not in DELIMITERS and delimiter not in DELIMITERS.values() and delimiter != "\\t"
    ):
        raise InvalidParameter(f"delimiter={delimiter!r} is not valid; valid: auto, ',', ';', tab, '|'")


# --- the data set's files ----------------------------------------------------------------------------------


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

    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    for label in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == label))
        n = len(idx)
        n_test = int(round(n * test_fraction))
        if at_least_one_test:
            n_test = max(1, n_test)
        n_val = int(round(n * validation_fraction))
        if n_test < 1 or n - n_test - n_val < 1:
            raise too_few(label, n)
        parts["test"].append(idx[:n_test])
        parts["validation"].append(idx[n_test:n_test + n_val])
        parts["train"].append(idx[n_test + n_val:])
    return {s: np.sort(np.concatenate(v)) if v else np.zeros(0, np.int64) for s, v in parts.items()}


# --- the table as one -----------------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Table:
    """All files as one table: the cells, each column's kind, and where each row came from."""

    frame: pd.DataFrame
    kinds: dict[str, str]
    label: str
    label_reason: str
    files: list[RawTable]
    file_of: np.ndarray  # int32 (n,): index into files
    row_of: np.ndarray  # int64 (n,): the row's position in its file

    def where(self, positions: np.ndarray, total: int | None = None) -> str:
        """The first rows among ``positions`` (indices into ``frame``) as file lines, and how many more."""
        shown = [self.files[self.file_of[i]].where(int(self.row_of[i])) for i in positions[:_LISTED_ROWS]]
        if len(self.files) > 1 or not shown:
            text = ", ".join(shown)
        else:  # one file: name it once
            name = shown[0].split(" ", 1)[0]
            text = name + " " + ", ".join(s.split(" ", 1)[1] for s in shown)
        more = (total if total is not None else len(positions)) - len(shown)
        return text + (f" and {more} more" if more > 0 else "")

    def keep(self, mask: np.ndarray) -> None:
        self.frame = self.frame[mask].reset_index(drop=True)
        self.file_of = self.file_of[mask]
        self.row_of = self.row_of[mask]


def _label_of(table: RawTable, label_column: str) -> tuple[str, str]:
    """The class column of one file and why: ``label_column``, else the best-placed name of
    :data:`CLASS_COLUMN_NAMES`, else the last column."""
    columns = [str(c) for c in table.frame.columns]
    if label_column:
        if label_column in columns:
            return label_column, f"label_column={label_column}"
        folded = [c for c in columns if c.lower() == label_column.lower()]
        if len(folded) == 1:
            return folded[0], f"label_column={label_column}"
        close = difflib.get_close_matches(label_column, columns, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise DatasetError(
            f"{table.source}: label_column={label_column!r} is not a column{hint} (columns: {', '.join(columns)})"
        )
    if table.named:
        named = sorted(
            (CLASS_COLUMN_NAMES.index(c.strip().lower()), k, c)
            for k, c in enumerate(columns)
            if c.strip().lower() in CLASS_COLUMN_NAMES
        )
        if named:
            chosen = named[0][2]
            others = [c for _, _, c in named[1:]]
            also = f", preferred to {_quoted(others)}" if others else ""
            return chosen, f"the column named {chosen!r}{also}"
    listed = ", ".join(CLASS_COLUMN_NAMES[:5]) + ", ..."
    reason = f"the last column, as none is named as a class ({listed}); set label_column to choose another"
    if table.named:
        alike = [c for c in columns[:-1] if _words(c) & set(CLASS_COLUMN_NAMES)]
        if alike:
            reason += f"; {_quoted(alike)} {'is' if len(alike) == 1 else 'are'} named like one: label_column={alike[0]}?"
    return columns[-1], reason


def _quoted(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names)


def _combine(tables: list[RawTable], label_column: str) -> _Table:
    import numpy as np
    import pandas as pd

    named = [t for t in tables if t.named] or tables[:1]
    guesses = [(t, *_label_of(t, label_column)) for t in named]
    # the file whose class column is named as one speaks for all (a file without it is then named in an error)
    canon_table, canon_label, canon_reason = next(
        (g for g in guesses if not g[2].startswith("the last column")), guesses[0]
    )
    canon_columns = [str(c) for c in canon_table.frame.columns]
    features = [c for c in canon_columns if c != canon_label]
    picked = []
    for t in tables:
        columns = [str(c) for c in t.frame.columns]
        if t is canon_table:
            label = canon_label
        elif t.named and canon_table.named:
            # every named file has the class column the first one has: the same name, not its own guess
            label = _label_of(t, label_column)[0] if label_column else canon_label
            if label not in columns:
                raise DatasetError(
                    f"{t.source} has no column {canon_label!r}, the class column of {canon_table.source} "
                    f"({canon_reason}); every file needs the same columns (columns of {Path(t.source).name}: "
                    f"{_listed(columns)})"
                )
        elif canon_label in columns:  # an .npz file: its class column is named, its features are not
            label = canon_label
        elif len(columns) == len(canon_columns):  # a header-less file: the class column at the same place
            label = columns[canon_columns.index(canon_label)]
        else:
            label = _label_of(t, label_column)[0] if label_column and not canon_table.named else columns[-1]
        picked.append((t, label))
    frames, kinds = [], {c: canon_table.kinds[c] for c in features}
    kinds[canon_label] = canon_table.kinds[canon_label]
    label_kinds = set()
    as_text: set[str] = set()
    for t, label in picked:
        own = [c for c in t.frame.columns if c != label]
        if own == features:
            rename = {}
        elif t.named and canon_table.named and set(own) == set(features):
            rename = {}
        elif len(own) == len(features) and not (t.named and canon_table.named):
            rename = dict(zip(own, features))
        elif t.named and canon_table.named:
            lacks, extra = [c for c in features if c not in own], [c for c in own if c not in features]
            name, canon_name = Path(t.source).name, Path(canon_table.source).name
            said = []
            if lacks:
                said.append(f"{name} lacks column(s) {_quoted(lacks)}, which {canon_name} has")
            if extra:
                said.append(f"{'it' if lacks else name} has column(s) {_quoted(extra)}, which {canon_name} lacks")
            count = f"has {len(own)} features but {canon_table.source} has {len(features)}: " if len(own) != len(features) else ""
            raise DatasetError(
                f"{t.source} {count}" + "; ".join(said) + f" (class column {canon_label!r}: {canon_reason}); every file "
                "needs the same columns"
            )
        else:
            raise DatasetError(
                f"{t.source} has {len(own)} features but {canon_table.source} has {len(features)} (features of "
                f"{Path(t.source).name}: {_listed(own)}; of {Path(canon_table.source).name}: {_listed(features)}); every "
                "file needs the same columns"
            )
        part = t.frame.rename(columns={**rename, label: canon_label})[[*features, canon_label]]
        for own_name, name in zip(own, features):
            name = rename.get(own_name, own_name)
            kind = t.kinds[own_name]
            if kind != kinds[name] and t.frame[own_name].isna().all():
                continue  # a column with no value in this file says nothing about its kind
            if kinds[name] == "number" and canon_table.frame[name].isna().all():
                kinds[name] = kind
            elif kind != kinds[name]:
                if {kind, kinds[name]} == {"text", "bool"}:
                    kinds[name] = "text"
                elif {kind, kinds[name]} <= {"number", "text", "bool"}:
                    # text in one file, numbers in another (`room`: A1, 101 here; 101, 102 there): text in all,
                    # each number written as the text it was (101, not 101.0), so a cell never depends on its file
                    kinds[name] = "text"
                    as_text.add(name)
                else:
                    raise DatasetError(
                        f"column {name!r} holds {kinds[name]} values in {canon_table.source} but {kind} values in "
                        f"{t.source}; make them agree, or drop_columns={name}"
                    )
        label_kinds.add(t.kinds[label])
        frames.append(part)
    if len(label_kinds) > 1:
        kinds[canon_label] = "text"
    if as_text:
        for part in frames:
            for name in as_text:
                if pd.api.types.is_numeric_dtype(part[name]):
                    part[name] = text_cells(part[name]).to_numpy()
    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    frame = frame.reset_index(drop=True)
    file_of = np.concatenate([np.full(len(t.frame), i, dtype=np.int32) for i, t in enumerate(tables)])
    row_of = np.concatenate([t.frame.index.to_numpy(dtype=np.int64) for t in tables])
    return _Table(frame, kinds, canon_label, canon_reason, tables, file_of, row_of)


def _listed(names: list[str], limit: int = 8) -> str:
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _words(name: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", name)}


def _whole(values: np.ndarray) -> bool:
    import numpy as np

    if values.dtype.kind in "iu":
        return True
    head = values[:1000]  # most measurement columns show a fraction at once
    if not np.all(head == np.floor(head)):
        return False
    return bool(np.all(np.isfinite(values)) and np.all(values == np.floor(values)))


def _id_like(name: str, column: pd.Series, kind: str, missing: int) -> str | None:
    """Why a column looks like a row id, or None."""
    import numpy as np

    if _words(name) & ID_NAME_TOKENS:
        return "named like an id"
    n = len(column)
    if n < _MIN_ROWS_FOR_VALUE_CHECKS or missing:
        return None
    if kind == "number":
        values = column.to_numpy()
        if not _whole(values):
            return None
        steps = np.diff(values)
        if np.all(steps > 0) or np.all(steps < 0):
            return "whole numbers that increase with the row order, one per row"
        low, high = values.min(), values.max()
        if high - low == n - 1 and column.is_unique:
            return f"the whole numbers {int(low)}..{int(high)}, one per row"
    elif kind == "text" and column.is_unique:
        return "text that is different in every row"
    return None


# --- preprocess --------------------------------------------------------------------------------------------


def preprocess(
    source: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    *,
    validation_fraction: float = 0.15,
    test_fraction: float = 0.15,
    seed: int = 0,
    num_workers: int = 0,
    shard_size: int = 0,
    label_column: str = "",
    drop_columns: str = "",
    keep_columns: str = "",
    header: str = "auto",
    delimiter: str = "auto",
    categorical: str = "onehot",
    max_categories: int = 50,
    missing: str = "error",
) -> PreprocessResult:
    """Read, check, split, transform and shard a data set (see the module docstring for each step).

    Args:
        source: a prewarm manifest (``manifest.json``), a folder holding one, or a plain data folder/file.
        output_dir: folder to write; replaced as a whole (written beside it, then renamed into place).
        validation_fraction: share of each class for validation, in [0, 1) (unit: fraction).
        test_fraction: share of each class for test, in (0, 1) (unit: fraction).
        seed: seed of the split (same seed and data, same shards).
        num_workers: processes reading files; 0: every CPU core this step is given (unit: processes).
        shard_size: samples per shard file; 0: as many as fit in about 16 MiB (unit: samples).
        label_column: the class column; empty: a column named label, class, target, y, species, outcome, diagnosis, else the last column.
        drop_columns: columns to leave out of the features, separated by commas.
        keep_columns: columns to use as features even when they look like row ids, separated by commas.
        header: whether CSV files start with a header row: auto (detect), true or false.
        delimiter: CSV delimiter: auto (detect among , ; tab |), or one of those (tab may be written tab).
        categorical: text feature columns: onehot (one 0/1 column per value) or error.
        max_categories: most distinct values a text column may have to be one-hot encoded.
        missing: missing values (empty, NA, N/A, nan, ?): error, impute (median or most frequent, plus an indicator column), or drop (the rows).

    Returns:
        A :class:`PreprocessResult` with the data report.

    Raises:
        InvalidParameter: a parameter out of range.
        DatasetError: no data file, an unreadable file, files that disagree on their columns, a class column
            that is missing, has missing values or looks continuous, too few samples of a class, and the
            problems of the features (each named with the parameter that changes the decision).
    """
    started = time.perf_counter()
    check_preprocess_params(locals())
    header = _choice(header, "header", HEADER_CHOICES)
    categorical = _choice(categorical, "categorical", CATEGORICAL_CHOICES)
    missing = _choice(missing, "missing", MISSING_CHOICES)
    label_column = label_column.strip()
    parameters = {
        "label_column": label_column,
        "drop_columns": drop_columns,
        "keep_columns": keep_columns,
        "header": header,
        "delimiter": delimiter,
        "categorical": categorical,
        "max_categories": max_categories,
        "missing": missing,
        "validation_fraction": validation_fraction,
        "test_fraction": test_fraction,
        "seed": seed,
    }
    workers = num_workers or available_cpus()

    # The exact version prewarm wrote, checked against its manifest (sizes); a plain folder through the same listing.
    view = open_dataset(source)
    files = [f for f in view.files if REGISTRY.is_data_file(str(f), TABLE)]  # the table readers' files (formats.py)
    if not files:  # no table: image folders and tensors (or a clear "no reader reads ..." error)
        from heteroflow.components.data.readers import prepare_files

        def split(labels: np.ndarray) -> dict[str, np.ndarray]:  # the readers keep at least one test sample a class
            return stratified_split(
                labels, validation_fraction=validation_fraction, test_fraction=test_fraction, seed=seed,
                at_least_one_test=True,
                too_few=lambda c, n: DatasetError(
                    f"class {int(c)} has {n} samples: too few for a train, validation and test share "
                    f"(validation_fraction={validation_fraction}, test_fraction={test_fraction}); add samples or lower them"
                ),
            )

        settings = {"seed": seed, "validation_fraction": validation_fraction, "test_fraction": test_fraction}
        return prepare_files(view, output_dir, split=split, settings=settings, started=started)
    source_uri, dataset_sha256 = view.source_uri, view.dataset_sha256
    in_source_terms = view.in_source_terms  # messages and the report name the user's file, not its cached copy

    workers = min(workers, len(files))
    read = partial(read_table, header=header, delimiter=delimiter)
    try:
        if workers > 1:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                tables = list(pool.map(read, files))
        else:
            tables = [read(f) for f in files]
        tables = [dataclasses.replace(t, source=in_source_terms(t.source)) for t in tables]
        out = Path(output_dir)
        return _preprocess_tables(
            tables,
            out,
            source_uri=source_uri,
            dataset_sha256=dataset_sha256,
            dataset_version=view.version,
            parameters=parameters,
            shard_size=shard_size,
            workers=workers,
            started=started,
        )
    except DatasetError as exc:
        message = in_source_terms(str(exc))
        if source_uri not in message:  # every message names the data set
            message = f"data set {source_uri}: {message}"
        raise DatasetError(message) from None


def _preprocess_tables(
    tables: list[RawTable],
    out: Path,
    *,
    source_uri: str,
    dataset_sha256: str | None,
    dataset_version: str | None = None,
    parameters: dict[str, Any],
    shard_size: int,
    workers: int,
    started: float,
) -> PreprocessResult:
    import numpy as np
    import pandas as pd

    notices: list[str] = []
    missing = parameters["missing"]
    table = _combine(tables, parameters["label_column"])
    rows_read = len(table.frame)
    label, label_reason = table.label, table.label_reason
    label_note = f"class column {label!r}: {label_reason}"
    if not parameters["label_column"]:  # a guess is never silent: said in one line, before training
        guess = f"class column: {label!r}, {label_reason}"
        notices.append(guess if "label_column" in label_reason else guess + "; set label_column to choose another")
        log.warning("preprocess: %s", notices[0])
    for t in tables:
        if t.csv is not None and t.csv.encoding == "latin-1":
            notices.append(f"{t.source}: read as {t.csv.reasons['encoding']}")
        if t.blank_rows:
            notices.append(f"{t.source}: {t.blank_rows} blank rows skipped")
    dropped_rows: dict[str, int] = {}

    # --- the class column -------------------------------------------------------------------------------
    columns = [c for c in table.frame.columns if c != label]
    drop = _names(parameters["drop_columns"], "drop_columns")
    keep = _names(parameters["keep_columns"], "keep_columns")
    for param, names in (("drop_columns", drop), ("keep_columns", keep)):
        for name in names:
            if name == label:
                raise DatasetError(f"{param} names {name!r}, the class column ({label_reason}); set label_column to use another")
            if name not in columns:
                close = difflib.get_close_matches(name, columns, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise DatasetError(f"{param} names {name!r}, which is not a column{hint} (columns: {', '.join(columns)})")

    y_raw = table.frame[label]
    absent = y_raw.isna().to_numpy()
    if absent.any():
        positions = np.flatnonzero(absent)
        if missing == "drop":
            table.keep(~absent)
            dropped_rows["missing class"] = len(positions)
            notices.append(f"{len(positions)} rows without a class ({label!r}) dropped (missing=drop)")
            y_raw = table.frame[label]
        else:
            never = " (class values are never imputed)" if missing == "impute" else ""
            raise DatasetError(
                f"class column {label!r} ({label_reason}) has {len(positions)} missing values, at "
                f"{table.where(positions)}; fill them in, or set missing=drop to drop those rows{never}"
            )
    classes, y = _classes(y_raw, table.kinds[label], label, label_reason, table)
    if len(classes) < 2:
        raise DatasetError(
            f"data set {source_uri} has {len(classes)} class; a classifier needs at least 2 ({label_note})"
        )

    # --- the features -----------------------------------------------------------------------------------
    dropped: dict[str, str] = {c: "drop_columns" for c in drop}
    problems: list[str] = []
    used: list[str] = []
    missing_counts: dict[str, int] = {}
    frame = table.frame
    for name in columns:
        if name in dropped:
            continue
        col, kind = frame[name], table.kinds[name]
        n_missing = int(col.isna().sum())
        if n_missing == len(col):
            dropped[name] = "empty: every value is missing"
            notices.append(f"column {name!r} left out: every value is missing")
            continue
        if kind == "other":
            problems.append(
                f"column {name!r} holds {col.dtype} values, which are neither numbers nor text; drop_columns={name}"
            )
            continue
        why = None if name in keep else _id_like(name, col, kind, n_missing)
        if why:
            dropped[name] = f"looks like a row id ({why})"
            notices.append(f"column {name!r} left out of the features: it looks like a row id ({why}); to use it, set keep_columns={name}")
            continue
        if kind == "number":
            infinite = np.isinf(col.to_numpy(dtype="float64", na_value=np.nan))
            if infinite.any():
                positions = np.flatnonzero(infinite)
                problems.append(
                    f"column {name!r} has {len(positions)} infinite values, at {table.where(positions)}: a feature must be "
                    f"a finite number; fix those cells, mark them missing (empty, NA or ?), or drop_columns={name}"
                )
        elif kind in ("text", "bool"):
            problem = _text_problem(name, col, table, parameters)
            if problem:
                problems.append(problem)
        if n_missing:
            missing_counts[name] = n_missing
        used.append(name)

    if missing_counts and missing == "error":
        listed = "; ".join(
            f"{name!r}: {count} (at {table.where(np.flatnonzero(frame[name].isna().to_numpy()), count)})"
            for name, count in missing_counts.items()
        )
        rows_with = int(frame[list(missing_counts)].isna().any(axis=1).sum())
        problems.append(
            f"missing values in {len(missing_counts)} column(s): {listed}; set missing=impute (median or most frequent "
            f"value, plus an indicator column) or missing=drop (drops the {rows_with} rows that have one), or drop_columns"
        )
    if problems:
        raise DatasetError(
            f"data set {source_uri} cannot be used as it is ({label_note}):\n- " + "\n- ".join(problems)
        )
    if not used:
        raise DatasetError(f"data set {source_uri} has no feature column left ({label_note}; left out: {', '.join(dropped) or 'none'})")
    if missing_counts and missing == "drop":
        incomplete = frame[list(missing_counts)].isna().any(axis=1).to_numpy()
        table.keep(~incomplete)
        y = y[~incomplete]
        dropped_rows["missing values"] = int(incomplete.sum())
        notices.append(
            f"{int(incomplete.sum())} rows with missing values dropped (missing=drop): "
            + ", ".join(f"{k!r} {v}" for k, v in missing_counts.items())
        )
        present = np.unique(y)
        if len(present) < len(classes):
            lost = [classes[i] for i in range(len(classes)) if i not in set(present.tolist())]
            raise DatasetError(f"after dropping rows with missing values, no row of class(es) {', '.join(lost)} is left ({label_note})")
        frame = table.frame
    numeric = [c for c in used if table.kinds[c] == "number"]
    text = [c for c in used if table.kinds[c] != "number"]

    # --- split, fit, transform --------------------------------------------------------------------------
    validation_fraction, test_fraction = parameters["validation_fraction"], parameters["test_fraction"]
    split = stratified_split(
        y,
        validation_fraction=validation_fraction,
        test_fraction=test_fraction,
        seed=parameters["seed"],
        too_few=lambda label, n: DatasetError(
            f"class '{classes[label]}' has {n} samples: too few to put at least one in test and one in train with "
            f"validation_fraction={validation_fraction} and test_fraction={test_fraction}; give more samples "
            f"of that class, or drop it ({label_note})"
        ),
    )
    from heteroflow.components.data import tabular

    impute = missing == "impute" and bool(missing_counts)
    # One selection of rows in split order; each split is then a slice of it (no copy).
    bounds = np.cumsum([0, *(len(split[s]) for s in SPLITS)])
    ordered = frame[used].take(np.concatenate([split[s] for s in SPLITS]))
    train_frame = ordered.iloc[: bounds[1]]
    indicate = [c for c in used if c in missing_counts and train_frame[c].isna().any()] if impute else []
    transform = tabular.build_transform(numeric=numeric, text=text, impute=impute, indicate=indicate)
    width = 0
    per_shard = 0
    features: list[str] = []
    with atomic_directory(out) as tmp, ThreadPoolExecutor(max_workers=1) as writer:
        # Shards are written on a second thread while the next split is transformed (writing releases the GIL).
        written: dict[str, Future[list[str]]] = {}
        for k, name in enumerate(SPLITS):
            idx = split[name]
            part = ordered.iloc[bounds[k]:bounds[k + 1]]
            with np.errstate(all="ignore"), _threads():  # overflow is reported below, naming the column
                if name == "train":
                    x = transform.fit_transform(part)
                    features = tabular.output_names(transform)
                    width = len(features)
                    per_shard = shard_size or max(1, _SHARD_BYTES // (4 * max(width, 1)))
                elif len(idx):
                    x = transform.transform(part)
                else:  # validation_fraction=0
                    x = np.zeros((0, width), dtype=np.float32)
            x = np.asarray(x, dtype=np.float32)
            _check_finite(x, features, name, frame, numeric)
            written[name] = writer.submit(
                _write_shards, tmp, name, per_shard, x=x, y=y[idx], source_file=table.file_of[idx], source_row=table.row_of[idx]
            )
        shards = {name: future.result() for name, future in written.items()}
        report = _report(
            table=table, tables=tables, rows_read=rows_read, classes=classes, y=y, used=used, numeric=numeric,
            text=text, dropped=dropped, dropped_rows=dropped_rows, missing_counts=missing_counts, transform=transform,
            impute=impute, features=features, parameters=parameters, notices=notices, label_reason=label_reason,
        )
        categories = tabular.text_categories(transform)
        schema = {
            "format_version": 1,
            "label_column": label,
            "classes": list(classes),
            "columns": [
                {"name": c, "kind": "number"} if c in numeric else {"name": c, "kind": "text", "categories": categories[c]}
                for c in used
            ],
            "features": features,
            "num_features": width,
            "missing": missing,
            "imputes": impute,
            "decimal": next((t.csv.decimal for t in tables if t.csv is not None), "."),
            "read": {"header": parameters["header"], "delimiter": parameters["delimiter"]},
            "versions": _versions(),
        }
        meta: dict[str, Any] = {
            "source_uri": source_uri,
            "dataset_sha256": dataset_sha256,
            "dataset_version": dataset_version,
            "num_features": width,
            "classes": list(classes),
            "label_column": label,
            "counts": {k: int(len(v)) for k, v in split.items()},
            "shards": shards,
            "files": [t.source for t in tables],
            "transform": TRANSFORM_NAME,
            "seed": parameters["seed"],
            "validation_fraction": parameters["validation_fraction"],
            "test_fraction": parameters["test_fraction"],
            "report": report,
        }
        (tmp / META_NAME).write_text(json.dumps(meta, indent=2), encoding="utf-8")
        tabular.save_transform(tmp, transform, schema)
    for notice in notices[0 if parameters["label_column"] else 1:]:  # the class column's was said at once
        log.warning("preprocess: %s", notice)
    return PreprocessResult(
        output_dir=out,
        counts=meta["counts"],
        num_features=width,
        classes=tuple(classes),
        num_workers=workers,
        seconds=time.perf_counter() - started,
        report=report,
        notices=tuple(notices),
    )


@contextlib.contextmanager
def _threads() -> Iterator[None]:
    """Let the ColumnTransformer run its parts on threads (numpy and pandas release the GIL), not processes."""
    from joblib import parallel_config

    # Overflow (a number too large to standardise) is reported by _check_finite, naming the column; numpy's
    # errstate is per thread, so the workers' RuntimeWarnings are silenced here instead.
    with parallel_config(backend="threading", n_jobs=min(available_cpus(), 4)), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _check_finite(x: np.ndarray, features: list[str], split: str, frame: pd.DataFrame, numeric: list[str]) -> None:
    """Every transformed value is finite; else name the input column (a number too large to standardise)."""
    import numpy as np

    if np.isfinite(x).all():
        return
    bad = ~np.isfinite(x)
    column = features[int(np.flatnonzero(bad.any(axis=0))[0])].split("=", 1)[0]
    values = frame[column].to_numpy(dtype="float64", na_value=np.nan) if column in numeric else None
    largest = f" (largest magnitude {np.nanmax(np.abs(values)):.3g})" if values is not None else ""
    raise DatasetError(
        f"column {column!r} has values too large to standardise{largest}: the {split} features are not finite "
        f"numbers; rescale the column, or drop_columns={column}"
    )


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


def _versions() -> dict[str, str]:
    from importlib import metadata

    return {name: metadata.version(name) for name in ("scikit-learn", "pandas", "numpy")}


def _classes(y_raw: pd.Series, kind: str, label: str, label_reason: str, table: _Table) -> tuple[list[str], np.ndarray]:
    """Class names (sorted: numerically for whole numbers, else as text) and each row's class index."""
    import numpy as np
    import pandas as pd

    n = len(y_raw)
    if kind == "number":
        values = y_raw.to_numpy(dtype="float64")
        infinite = np.isinf(values)
        if infinite.any():
            positions = np.flatnonzero(infinite)
            raise DatasetError(
                f"class column {label!r} ({label_reason}) has {len(positions)} infinite values, at {table.where(positions)}"
            )
        fractional = values != np.floor(values)
        if fractional.any():
            examples = ", ".join(f"{v:g}" for v in pd.unique(values[fractional])[:3])
            distinct = len(pd.unique(values))
            raise DatasetError(
                f"class column {label!r} ({label_reason}) looks continuous: {distinct} distinct values in {n} rows, with "
                f"fractions such as {examples}; a classifier needs a column of classes: set label_column to it"
            )
        # hash once (pandas.factorize), then sort the few distinct values: O(n), where np.unique sorts every row
        codes, found = pd.factorize(values.astype(np.int64))
        uniques = np.sort(found)
        y = np.searchsorted(uniques, found)[codes]
        classes = [str(int(u)) for u in uniques]
    else:
        codes, uniques = pd.factorize(y_raw)
        order = np.argsort(np.asarray(uniques, dtype=str), kind="stable")
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        y = rank[codes]
        classes = [str(uniques[i]) for i in order]
    if len(classes) > max(20, n // 2):
        raise DatasetError(
            f"class column {label!r} ({label_reason}) has {len(classes)} distinct values in {n} rows: nearly one class "
            f"per row, so it looks like an id or a measurement, not a class; set label_column to the class column"
        )
    return classes, y.astype(np.int64)


def _text_problem(name: str, col: pd.Series, table: _Table, parameters: dict[str, Any]) -> str | None:
    import numpy as np
    import pandas as pd

    codes, uniques = pd.factorize(col, use_na_sentinel=True)
    counts = np.bincount(codes[codes >= 0], minlength=len(uniques))
    is_number = pd.to_numeric(pd.Series(np.asarray(uniques, dtype=object)), errors="coerce").notna().to_numpy()
    numbers, texts = int(counts[is_number].sum()), int(counts[~is_number].sum())
    if numbers and numbers >= texts:
        bad = np.flatnonzero(~is_number)
        examples = ", ".join(repr(str(uniques[i])) for i in bad[:3])
        positions = np.flatnonzero(np.isin(codes, bad))
        return (
            f"column {name!r} is mostly numbers ({numbers} of {numbers + texts} values) but holds text ({examples}), "
            f"at {table.where(positions)}; fix those cells, mark them missing (empty, NA or ?), or drop_columns={name}"
        )
    if parameters["categorical"] == "error":
        return f"column {name!r} holds text ({len(uniques)} distinct values); set categorical=onehot to encode it, or drop_columns={name}"
    if len(uniques) > parameters["max_categories"]:
        return (
            f"column {name!r} holds text with {len(uniques)} distinct values, more than max_categories="
            f"{parameters['max_categories']} for one-hot encoding; drop_columns={name} (or raise max_categories)"
        )
    return None


def _report(
    *,
    table: _Table,
    tables: list[RawTable],
    rows_read: int,
    classes: list[str],
    y: np.ndarray,
    used: list[str],
    numeric: list[str],
    text: list[str],
    dropped: dict[str, str],
    dropped_rows: dict[str, int],
    missing_counts: dict[str, int],
    transform: Any,
    impute: bool,
    features: list[str],
    parameters: dict[str, Any],
    notices: list[str],
    label_reason: str,
) -> dict[str, Any]:
    import numpy as np

    encoded: dict[str, int] = {}
    imputed: dict[str, dict[str, Any]] = {}
    for name, part, columns in transform.transformers_:
        if name == "text":
            for col, cats in zip(columns, part.named_steps["codes"].categories_):
                encoded[col] = int(len(cats))
        if impute and name in ("number", "text"):
            imputer = part.named_steps["impute"]
            for j, col in enumerate(columns):
                if col not in missing_counts:
                    continue
                value: Any = imputer.statistics_[j]
                if name == "text":
                    cats = part.named_steps["codes"].categories_[j]
                    value = str(cats[int(value)]) if 0 <= int(value) < len(cats) else None
                    strategy = "most frequent"
                else:
                    value, strategy = float(value), "median"
                imputed[col] = {"missing": missing_counts[col], "strategy": strategy, "value": value, "indicator": f"{col} missing"}
    counts = np.bincount(y, minlength=len(classes))
    return {
        "files": [t.describe() for t in tables],
        "rows_read": int(rows_read),
        "rows_used": int(len(y)),
        "rows_dropped": dropped_rows,
        "class_column": table.label,
        "class_column_reason": label_reason,
        "class_counts": {c: int(k) for c, k in zip(classes, counts)},
        "columns_used": used,
        "columns_numeric": numeric,
        "columns_text": text,
        "columns_dropped": dropped,
        "columns_encoded": encoded,
        "columns_imputed": imputed,
        "num_features": len(features),
        "parameters": parameters,
        "notices": list(notices),
    }


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


# --- the step definition ----------------------------------------------------------------------------------

_HOUR = 3600.0


def _preprocess_facts(result: PreprocessResult) -> dict[str, Any]:
    return {
        "counts": dict(result.counts),
        "num_features": result.num_features,
        "num_classes": len(result.classes),
        "classes": list(result.classes),
        "num_workers": result.num_workers,
        "seconds": result.seconds,
        "notices": list(result.notices),
        "report": result.report,  # in the run record; not in the artifact's metadata (it is large)
    }


def _preprocess_summary(f: dict[str, Any]) -> list[str]:
    report = f.get("report", {})
    counts = f["counts"]
    head = (
        f"preprocess: {sum(counts.values())} rows used (train {counts['train']}, validation {counts['validation']}, "
        f"test {counts['test']}), {f['num_features']} features, {f['num_classes']} classes"
    )
    reason = report.get("class_column_reason", "")
    if report.get("class_column"):
        head += f"; class column {report['class_column']!r} ({reason})"
    notices = [n for n in f.get("notices", []) if not (reason and reason in n)]  # said once, in the head line
    return [head, *(f"  notice: {n}" for n in notices)]


PREPROCESS: Step = step(
    preprocess,
    name="preprocess",
    inputs=[ArtifactSpec(name="dataset", type=ArtifactType.DATASET, param="source")],
    outputs=[
        ArtifactSpec(
            name="shards",
            type=ArtifactType.DATASET,
            param="output_dir",
            help="train/validation/test shards and the fitted transformation",
            metadata=lambda f: {k: f[k] for k in ("counts", "num_features", "num_classes")},
        )
    ],
    candidates=[Resources(kind="cpu", cpu="4", memory="8Gi")],
    retry=RetryPolicy(retries=1, backoff_seconds=5, max_delay_seconds=60, window_seconds=2 * _HOUR),
    check=check_preprocess_params,
    facts=_preprocess_facts,
    summary=_preprocess_summary,
    ref="heteroflow.components.data.preprocess:PREPROCESS",
)
