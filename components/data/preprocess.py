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
   StandardScaler, OneHotEncoder, SimpleImputer) on the train split only, and apply it to every split. The
   statistics are learned column by column and the features computed with numpy
   (:func:`~heteroflow.components.data.tabular.fit_columns`, :func:`~heteroflow.components.data.tabular.apply_into`),
   value for value what the ColumnTransformer gives, without passing each split through it, and with numpy
   alone (:mod:`heteroflow.components.data.colstats`); the fitted ColumnTransformer, what is archived, is built
   from those statistics once the shards are written and the table is freed, so that scikit-learn's import
   (60-90 MB) and the table are never held together (issue #32).
6. Write shards ``<split>-NNNNN.npz`` (the bytes :func:`numpy.savez` writes; computed and written in pieces of
   about 2 MiB of features, each written on a second thread while the next is computed, so that no split's
   features are held whole: issue #32 item 1) (``x`` float32 ``(n, d)``, ``y`` int64 ``(n,)``, ``source_file`` int32
   and ``source_row`` int64: the file's index in ``meta.json``'s ``files`` and the row's position in it),
   ``meta.json``, and the transformation (``transform.joblib``, ``transform.json``), which train copies into
   the model folder so the archived model can read raw rows
   (:func:`heteroflow.components.models.predict.load_archived`).

Where the parts live: the parameter checks in :mod:`heteroflow.components.data.parameters`; the class column,
the feature checks and the data report (steps 2 and 3) in :mod:`heteroflow.components.data.columns`; the split,
what preprocess writes (:class:`PreprocessResult`, the file names), the split, the shards and reading them back
(:func:`load_split`, :func:`read_meta`, :func:`split_rows`) in :mod:`heteroflow.components.data.shards`. This module runs the steps; every name above is still importable from here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heteroflow.cache.atomic import atomic_directory
from heteroflow.cache.errors import DatasetError
from heteroflow.cache.dataset import open_dataset
from heteroflow.components.data.columns import (
    CLASS_COLUMN_NAMES,
    ID_NAME_TOKENS,
    _check_finite,
    _class_column_line,
    _classes,
    _combine,
    _id_like,
    _imputed_notice,
    _report,
    _text_problem,
)
from heteroflow.components.data.arrowcsv import trim_memory
from heteroflow.components.data.csvformat import DELIMITERS
from heteroflow.components.data.datasets import RawTable, read_table
from heteroflow.components.data.formats import REGISTRY, TABLE
from heteroflow.components.errors import InvalidParameter, Problems
from heteroflow.components.data.parameters import (
    CATEGORICAL_CHOICES,
    HEADER_CHOICES,
    MISSING_CHOICES,
    MIXED_IMAGES_CHOICES,
    SEED_MAX,
    _choice,
    _names,
    check_integer,
    check_split_params,
)
from heteroflow.components.data.shards import (
    META_NAME,
    SCHEMA_NAME,
    SPLITS,
    TRANSFORM_FILES,
    TRANSFORM_NAME,
    PreprocessResult,
    load_split,
    read_meta,
    split_rows,
    stratified_split,
)
from heteroflow.components.resources import Resources, RetryPolicy
from heteroflow.components.core.processes import PRELOAD_TABLE_READERS, process_pool
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

_SHARD_BYTES = 16 << 20  # shard_size=0: as many samples as fit in about 16 MiB of float32 features

log = logging.getLogger(__name__)


def available_cpus() -> int:
    """CPU cores this process may use, at least 1: :func:`joblib.cpu_count`, which honours the affinity mask
    (cpusets) and the cgroup CPU quota (how a Kubernetes CPU limit reaches a container)."""
    import joblib

    return max(1, int(joblib.cpu_count()))


def check_preprocess_params(values: Mapping[str, Any] | None = None, /, **given: Any) -> None:
    """Check every parameter of :func:`preprocess` (the checks it makes first; callers use it to fail before a run).

    Args:
        values / given: parameter values by name (``preprocess``'s defaults for the others).

    Raises:
        InvalidParameter: every parameter out of range, each named with what is valid (several in one message).
    """
    v = with_defaults(preprocess, values, **given)
    validation_fraction, test_fraction = v["validation_fraction"], v["test_fraction"]
    label_column = v["label_column"]
    drop_columns, keep_columns, delimiter = v["drop_columns"], v["keep_columns"], v["delimiter"]
    header, categorical, missing = v["header"], v["categorical"], v["missing"]
    problems = Problems()
    with problems.check():
        check_split_params(validation_fraction=validation_fraction, test_fraction=test_fraction)
    for name, low, valid, high in (("shard_size", 0, "0 (about 16 MiB per shard) or more", None), ("seed", 0, "", SEED_MAX),
                                   ("num_workers", 0, "0 (every given core) or more", None), ("max_categories", 2, "", None)):
        with problems.check():
            check_integer(name, v[name], low, valid, high=high)
    if not isinstance(label_column, str):
        problems.add(InvalidParameter(f"label_column={label_column!r} is not a string; valid: a column name, or empty"))
    for check in (lambda: _names(drop_columns, "drop_columns"), lambda: _names(keep_columns, "keep_columns"),
                  lambda: _choice(header, "header", HEADER_CHOICES), lambda: _choice(missing, "missing", MISSING_CHOICES),
                  lambda: _choice(categorical, "categorical", CATEGORICAL_CHOICES),
                  lambda: _choice(v["mixed_images"], "mixed_images", MIXED_IMAGES_CHOICES)):
        with problems.check():
            check()
    if not isinstance(delimiter, str) or (
        delimiter != "auto" and delimiter not in DELIMITERS and delimiter not in DELIMITERS.values() and delimiter != "\\t"
    ):
        problems.add(InvalidParameter(f"delimiter={delimiter!r} is not valid; valid: auto, ',', ';', tab, '|'"))
    problems.raise_all("preprocess's parameters")


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
    mixed_images: str = "convert",
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
        label_column: the class column; empty: a column named label, class, target, y, species, outcome, diagnosis, labels or classes (any case; in that order of preference), else the last column.
        drop_columns: columns to leave out of the features, separated by commas.
        keep_columns: columns to use as features even when they look like row ids, separated by commas.
        header: whether CSV files start with a header row: auto (detect), true or false.
        delimiter: CSV delimiter: auto (detect among , ; tab |), or one of those (tab may be written tab).
        categorical: text feature columns: onehot (one 0/1 column per value) or error.
        max_categories: most distinct values a text column may have to be one-hot encoded.
        missing: missing values (empty, NA, N/A, nan, ?): error, impute (median or most frequent, plus an indicator column), or drop (the rows).
        mixed_images: image folders: convert (images of another mode or size than most are converted when read) or error.

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

    # The exact version prewarm wrote, every file checked against its manifest's sha256 (#28.14: a cached file edited
    # with the same size and its mtime restored passes a size or stat check); a plain folder through the same listing.
    view = open_dataset(source)
    if view.manifest is not None:  # a plain folder has no checksum to check against (and keeps no dataset_sha256)
        view = open_dataset(source, verify="sha256")
    files = [f for f in view.files if REGISTRY.is_data_file(str(f), TABLE)]  # the table readers' files (formats.py)
    if not files:  # no table: image folders and tensors (or a clear "no reader reads ..." error)
        from heteroflow.components.data.precheck import check_image_folder
        from heteroflow.components.data.readers import prepare_files

        check_image_folder(view)  # every unreadable image at once (a remote data set is first read here)

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
        options = {"mixed_images": _choice(mixed_images, "mixed_images", MIXED_IMAGES_CHOICES)}
        return prepare_files(view, output_dir, split=split, settings=settings, started=started, options=options)
    source_uri, dataset_sha256 = view.source_uri, view.dataset_sha256
    in_source_terms = view.in_source_terms  # messages and the report name the user's file, not its cached copy

    workers = min(workers, len(files))
    read = partial(read_table, header=header, delimiter=delimiter)
    with _small_pages():
        return _read_and_preprocess(files, read, workers, output_dir, in_source_terms, source_uri=source_uri,
                                    dataset_sha256=dataset_sha256, dataset_version=view.version,
                                    parameters=parameters, shard_size=shard_size, started=started)


def _read_and_preprocess(files: list[Any], read: Callable[..., RawTable], workers: int, output_dir: Any,
                         in_source_terms: Callable[[str], str], *, source_uri: str, dataset_sha256: str | None,
                         dataset_version: str | None, parameters: dict[str, Any], shard_size: int,
                         started: float) -> PreprocessResult:
    try:
        if workers > 1:
            with process_pool(workers, preload=PRELOAD_TABLE_READERS) as pool:  # imports first, then forks (#28.13)
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
            dataset_version=dataset_version,
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
    for name, where in table.as_text.items():
        notices.append(f"column {name!r} read as text in every file: it holds {where}")
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

    # Every problem of the class column and of the features is reported in one message (issue #28 item 3).
    problems: list[str] = []
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
            problems.append(
                f"class column {label!r} ({label_reason}) has {len(positions)} missing values, at "
                f"{table.where(positions)}; fill them in, or set missing=drop to drop those rows{never}"
            )
            if len(positions) < len(y_raw):  # the present values are checked too (a stand-in at each gap)
                y_raw = y_raw.fillna(y_raw[~absent].iloc[0])
    classes: list[str] = []
    y = np.zeros(0, dtype=np.int64)
    if not absent.all() or missing == "drop":  # a class column with no value at all has nothing more to check
        try:
            classes, y = _classes(y_raw, table.kinds[label], label, label_reason, table)
            y = y.astype(np.min_scalar_type(-max(len(classes), 1)), copy=False)  # int8 for < 128 classes (int64 in the shards)
        except DatasetError as exc:
            problems.append(str(exc))
        else:
            if len(classes) < 2:
                problems.append(f"data set {source_uri} has {len(classes)} class; a classifier needs at least 2 ({label_note})")

    # --- the features -----------------------------------------------------------------------------------
    dropped: dict[str, str] = {c: "drop_columns" for c in drop}
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

    said = _class_column_line(table, parameters, dropped, used)
    if said:  # the guess (or a weight-like feature), in one line, before any problem is raised
        notices.insert(0 if not parameters["label_column"] else len(notices), said)
        log.warning("preprocess: %s", said)
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
        # the class column and why it was chosen, once: a problem of the class column already says both
        note = "" if any(f"class column {label!r} ({label_reason})" in p for p in problems) else f" ({label_note})"
        raise DatasetError(f"data set {source_uri} cannot be used as it is{note}:\n- " + "\n- ".join(problems))
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
    impute = missing == "impute" and bool(missing_counts)
    transform = sample = None
    if _FAST_TRANSFORM:  # the statistics with numpy: scikit-learn is imported once the table is freed (below)
        fitted, x_of, sample = _fast_splits(frame, split, used=used, numeric=numeric, text=text, impute=impute,
                                            missing_counts=missing_counts)
    else:
        transform, fitted, x_of = _reference_splits(frame, split, used=used, numeric=numeric, text=text, impute=impute,
                                                    missing_counts=missing_counts)
    features = fitted.output_names()
    width = len(features)
    per_shard = shard_size or max(1, _SHARD_BYTES // (4 * max(width, 1)))
    # The old output is removed on a second thread once the new one is in place; the files written inside are
    # made durable by the one syncfs before the rename (no fsync each: nothing is visible before that rename).
    with atomic_directory(out, remove_old_later=True) as tmp, ThreadPoolExecutor(max_workers=1) as writer:
        shards = _write_splits(tmp, writer, split, x_of, per_shard=per_shard, width=width, y=y, table=table,
                               check=lambda x, name: _check_finite(x[:, : len(numeric)], features, name, frame, numeric))
        report = _report(
            table=table, tables=tables, rows_read=rows_read, classes=classes, y=y, used=used, numeric=numeric,
            text=text, dropped=dropped, dropped_rows=dropped_rows, missing_counts=missing_counts, fitted=fitted,
            impute=impute, features=features, parameters=parameters, notices=notices, label_reason=label_reason,
        )
        if report["columns_imputed"]:  # a decision on the user's cells: said on the console (issue #28 item 4)
            notices.append(_imputed_notice(report["columns_imputed"]))
            report["notices"] = list(notices)
        categories = fitted.text_categories()
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
        # The table is no longer needed: freed before scikit-learn is imported to build the archived
        # transformation, so that the two are never held together (issue #32 item 1: the peak memory).
        x_of = frame = table = y_raw = col = t = None  # (col, t: the last column checked, file described)
        tables.clear()  # freed by their reference counts: no gc.collect (issue #32 item 1: a full collection took
        # 0.1 s of CPU in a warm process; the resident memory when the transformation is built was the same without it)
        trim_memory()  # glibc keeps freed heap memory (the table's columns) resident without it
        from heteroflow.components.data import tabular

        if transform is None:
            transform = tabular.to_transform(fitted, sample)
        tabular.save_transform(tmp, transform, schema, durable=False)
    for notice in notices:
        if notice == said:  # said at once
            continue
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


_PIECE_BYTES = 2 << 20  # features computed at a time (float32), each piece written while the next is computed
_PIECES = 3  # pieces held at a time: one being computed, two being written


def _write_splits(
    tmp: Path, writer: ThreadPoolExecutor, split: dict[str, np.ndarray], x_of: Callable[..., np.ndarray], *,
    per_shard: int, width: int, y: np.ndarray, table: Any, check: Callable[[np.ndarray, str], None],
) -> dict[str, list[str]]:
    """Write every split as ``<split>-NNNNN.npz`` shards of at most ``per_shard`` samples (an empty split: one empty
    shard), in pieces of about :data:`_PIECE_BYTES`: each piece's features are computed into one of
    :data:`_PIECES` buffers (``x_of(split, begin, end, out)``), checked, and written into its shard on ``writer``
    (a second thread: writing releases the GIL) while the next one is computed, so that neither a split's nor a
    shard's features are held whole (issue #32 item 1: the peak memory of preprocess). The names of each split's
    shards."""
    import numpy as np

    from heteroflow.components.data.shards import _ShardFile

    piece_rows = max(1, _PIECE_BYTES // (4 * max(width, 1)))
    free = [np.empty(piece_rows * max(width, 1), dtype=np.float32) for _ in range(_PIECES)]
    pending: list[tuple[Future[None], np.ndarray | None]] = []
    names: dict[str, list[str]] = {}

    def submit(buffer: np.ndarray | None, fn: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        pending.append((writer.submit(fn, *args, **kwargs), buffer))

    try:
        for name in SPLITS:
            rows = split[name]
            names[name] = []
            for k, begin in enumerate(range(0, max(len(rows), 1), per_shard)):
                end = min(begin + per_shard, len(rows))
                shard = _ShardFile(tmp / f"{name}-{k:05d}.npz", end - begin, width)
                submit(None, shard.begin)
                for first in range(begin, end, piece_rows):
                    last = min(first + piece_rows, end)
                    while not free:  # the oldest piece written gives its buffer back
                        future, buffer = pending.pop(0)
                        future.result()
                        if buffer is not None:
                            free.append(buffer)
                    buffer = free.pop()
                    x = x_of(name, first, last, buffer[: (last - first) * width].reshape(last - first, width))
                    check(x, name)
                    submit(buffer, shard.write, x)
                at = rows[begin:end]
                submit(None, shard.end, y=y[at], source_file=table.file_of[at], source_row=table.row_of[at])
                names[name].append(shard.path.name)
        for future, _ in pending:
            future.result()
    finally:
        for future, _ in pending:
            future.cancel()
    return names


_FAST_TRANSFORM = True
"""Fit and apply the transformation with :func:`~heteroflow.components.data.tabular.fit_columns` and
:func:`~heteroflow.components.data.tabular.apply_into` (False: through scikit-learn's ColumnTransformer, the
reference ``tests/test_preprocess_fast.py`` compares them with)."""


def _fast_splits(
    frame: pd.DataFrame, split: dict[str, np.ndarray], *, used: list[str], numeric: list[str], text: list[str],
    impute: bool, missing_counts: dict[str, int],
) -> tuple[Any, Callable[..., np.ndarray], pd.DataFrame]:
    """The transformation's statistics (:class:`~heteroflow.components.data.colstats.FittedColumns`, learned
    with numpy: no scikit-learn import), ``x_of(split, begin, end, out)``: the features of the split's rows
    ``begin:end``, computed into ``out``, and the few train rows the archived ColumnTransformer is fitted on
    (:func:`~heteroflow.components.data.tabular.to_transform`)."""
    import numpy as np

    from heteroflow.components.data import colstats

    columns = colstats.input_columns(frame, numeric=numeric, text=text)
    train_rows = split["train"]
    indicate: list[str] = []
    if impute:
        for name in used:
            if name not in missing_counts:
                continue
            cells = columns[name][train_rows] if name in numeric else columns[name][0][train_rows]
            if (np.isnan(cells) if name in numeric else cells < 0).any():
                indicate.append(name)
    fitted = colstats.fit_columns(columns, train_rows, numeric=numeric, text=text, impute=impute, indicate=indicate)
    few = colstats.sample_rows(columns, train_rows, numeric=numeric, text=text, indicate=indicate)
    sample = frame.take(few)[list(used)].copy()  # its own cells: the table is freed before it is used

    scratch = np.empty(len(numeric) * colstats._CHUNK_ROWS, dtype=np.float64)  # one for every piece (main thread)

    def x_of(name: str, begin: int, end: int, out: np.ndarray) -> np.ndarray:
        return colstats.apply_into(fitted, columns, split[name][begin:end], out, scratch=scratch)

    return fitted, x_of, sample


def _reference_splits(
    frame: pd.DataFrame, split: dict[str, np.ndarray], *, used: list[str], numeric: list[str], text: list[str],
    impute: bool, missing_counts: dict[str, int],
) -> tuple[Any, Any, Callable[..., np.ndarray]]:
    """:func:`_fast_splits` through scikit-learn's ColumnTransformer: fitted on the train split, applied to each:
    the transformation, its statistics, and ``x_of``."""
    import numpy as np

    from heteroflow.components.data import tabular

    bounds = np.cumsum([0, *(len(split[s]) for s in SPLITS)])
    ordered = frame[used].take(np.concatenate([split[s] for s in SPLITS]))
    train_frame = ordered.iloc[: bounds[1]]
    indicate = [c for c in used if c in missing_counts and train_frame[c].isna().any()] if impute else []
    transform = tabular.build_transform(numeric=numeric, text=text, impute=impute, indicate=indicate)
    with np.errstate(all="ignore"), _threads():  # overflow is reported by _check_finite, naming the column
        train_x = np.asarray(transform.fit_transform(train_frame), dtype=np.float32)
    features = tabular.output_names(transform)

    held = {"train": train_x}

    def whole(name: str) -> np.ndarray:
        k = SPLITS.index(name)
        if name in held:
            return held[name]
        if not len(split[name]):  # validation_fraction=0
            return np.zeros((0, len(features)), dtype=np.float32)
        held.clear()  # one split's features held at a time
        with np.errstate(all="ignore"), _threads():
            held[name] = np.asarray(transform.transform(ordered.iloc[bounds[k]:bounds[k + 1]]), dtype=np.float32)
        return held[name]

    def x_of(name: str, begin: int, end: int, out: np.ndarray) -> np.ndarray:
        return whole(name)[begin:end]

    return transform, tabular.fitted_of(transform), x_of


@contextlib.contextmanager
def _small_pages() -> Iterator[None]:
    """numpy's large arrays without ``madvise(MADV_HUGEPAGE)`` for the time of a table's preprocess (numpy asks for
    transparent huge pages for arrays of 4 MiB or more; with the kernel's ``defrag=madvise``, the default, each
    first touch of such a page may compact memory on the faulting thread). Issue #32 item 1: on the 2-core VM the
    main thread's CPU in the read (moving 17 columns of the benchmark's table into arrays) was 0.13-0.17 s without,
    0.17-0.83 s with (0.32, 0.73, 0.83 in three warm runs in a row: it grows as memory fragments). numpy's own switch (``NUMPY_MADVISE_HUGEPAGE``
    at import) turned off and restored; nothing where numpy has none."""
    import numpy as np

    setter = getattr(getattr(getattr(np, "_core", None), "multiarray", None), "_set_madvise_hugepage", None)
    if setter is None:
        yield
        return
    before = setter(False)
    try:
        yield
    finally:
        setter(before)


@contextlib.contextmanager
def _threads() -> Iterator[None]:
    """Let the ColumnTransformer run its parts on threads (numpy and pandas release the GIL), not processes."""
    from joblib import parallel_config

    # Overflow (a number too large to standardise) is reported by _check_finite, naming the column; numpy's
    # errstate is per thread, so the workers' RuntimeWarnings are silenced here instead.
    with parallel_config(backend="threading", n_jobs=min(available_cpus(), 4)), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _versions() -> dict[str, str]:
    from importlib import metadata

    return {name: metadata.version(name) for name in ("scikit-learn", "pandas", "numpy")}


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
    notices = []
    for n in f.get("notices", []):
        if reason and reason in n:  # the class column is said once, in the head line; what the line adds stays
            n = n.split(reason, 1)[1].removeprefix("; set label_column to choose another").removeprefix("; ")
        if n:
            notices.append(n)
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
