"""The statistics of preprocess's table transformation, learned and applied with numpy alone (issue #32 item 1).

:mod:`heteroflow.components.data.tabular` archives the transformation as scikit-learn's ColumnTransformer
(``StandardScaler``, ``SimpleImputer``, ``OneHotEncoder``, ``MissingIndicator``). Importing scikit-learn costs
60-90 MB of resident memory; preprocess held it on top of the whole table. Here the same statistics are computed
with numpy, value for value what those estimators learn on the train split (the formulas are scikit-learn 1.x's,
followed operation for operation, so that the floats are the same bits; ``tests/test_preprocess_fast.py``
compares them with a ColumnTransformer fitted on the whole train split), and the features are computed from them.
Preprocess builds the ColumnTransformer from a :class:`FittedColumns` (``tabular.to_transform``) only after the
table is freed.

This module imports numpy only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["FittedColumns", "apply_into", "column_codes", "fit_columns", "input_columns", "sample_rows", "text_lookup"]

MISSING_CODE = -1
UNSEEN_CODE = -2


@dataclasses.dataclass
class FittedColumns:
    """What the transformation learned from the train split, in the ColumnTransformer's output order: the
    numeric columns (standardised), the text columns (one-hot), the ``indicate`` columns (0/1 "was missing").

    Attributes:
        numeric / text / indicate: the input columns of each part, in order.
        impute: whether missing values are filled.
        fill: per numeric column the median of its train cells (``SimpleImputer(strategy="median")``), float64
            ``(len(numeric),)``; None without ``impute``.
        mean / var / scale: per numeric column ``StandardScaler``'s ``mean_``, ``var_``, ``scale_`` (float64).
        seen: ``StandardScaler.n_samples_seen_`` (an int, or int64 per column where they differ).
        categories: per text column the values seen in the train split, sorted (object arrays of ``str``; the
            index is :class:`~heteroflow.components.data.tabular.TextCodes`' code).
        most: per text column the most frequent code (``SimpleImputer(strategy="most_frequent")``), float64;
            None without ``impute``.
        onehot: per text column the codes that get an output column (``OneHotEncoder.categories_``, int64).
    """

    numeric: list[str]
    text: list[str]
    indicate: list[str]
    impute: bool
    fill: np.ndarray | None
    mean: np.ndarray
    var: np.ndarray
    scale: np.ndarray
    seen: Any
    categories: list[np.ndarray]
    most: np.ndarray | None
    onehot: list[np.ndarray]

    @property
    def starts(self) -> dict[str, int]:
        """The first output column of each part present (``number``, ``text``, ``missing``)."""
        starts, at = {}, 0
        for name, width in (("number", len(self.numeric)), ("text", sum(len(c) for c in self.onehot)),
                            ("missing", len(self.indicate))):
            if (name == "number" and self.numeric) or (name == "text" and self.text) or (name == "missing" and self.indicate):
                starts[name] = at
                at += width
        return starts

    @property
    def width(self) -> int:
        """Output features."""
        return len(self.numeric) + sum(len(c) for c in self.onehot) + len(self.indicate)

    def output_names(self) -> list[str]:
        """``col`` (a scaled number), ``col=value`` (one-hot), ``col missing`` (indicator), in output order."""
        names = list(self.numeric)
        for col, cats, codes in zip(self.text, self.categories, self.onehot):
            names.extend(f"{col}={cats[int(c)]}" for c in codes)
        names.extend(f"{c} missing" for c in self.indicate)
        return names

    def text_categories(self) -> dict[str, list[str]]:
        """The values each text column held in the train split, by column."""
        return {col: [str(c) for c in cats] for col, cats in zip(self.text, self.categories)}


def column_codes(column: Any) -> tuple[np.ndarray, list[str]]:
    """A text column's codes (int, -1 missing) and its values as ``str``: a Categorical's own codes, else
    :func:`pandas.factorize`'s."""
    import pandas as pd

    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy(), [str(v) for v in column.cat.categories]
    codes, uniques = pd.factorize(column, use_na_sentinel=True)
    return codes, [str(v) for v in uniques]


def input_columns(frame: Any, *, numeric: Sequence[str], text: Sequence[str]) -> dict[str, Any]:
    """The input columns as :func:`fit_columns` and :func:`apply_into` take them: per numeric column its float64
    values (NaN missing; a view where the column is float64), per text column :func:`column_codes`."""
    columns: dict[str, Any] = {name: frame[name].to_numpy(dtype="float64", na_value=np.nan) for name in numeric}
    columns.update({name: column_codes(frame[name]) for name in text})
    return columns


def text_lookup(categories: np.ndarray, uniques: list[str]) -> np.ndarray:
    """Per code of ``uniques`` (and -1, last), :class:`TextCodes`' code: the index among ``categories``, -2 for a
    value not among them, -1 for missing."""
    index = {str(v): i for i, v in enumerate(categories)}
    return np.array([index.get(u, UNSEEN_CODE) for u in uniques] + [MISSING_CODE], dtype=np.int64)


def _mean_var(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``StandardScaler().fit(x)``'s mean, variance and samples seen for one column ``x`` (float64 ``(n, 1)``):
    scikit-learn's ``_incremental_mean_and_var`` from zero (Chan, Golub and LeVeque's corrected two-pass
    algorithm), operation for operation."""
    nan = np.isnan(x)
    sum_op = np.nansum if nan.any() else np.sum
    new_sum = sum_op(x, axis=0)
    new_count = x.shape[0] - sum_op(nan.astype(x.dtype), axis=0)
    last_count = np.zeros(1, dtype=np.float64)
    count = last_count + new_count
    mean = (np.zeros(1) * last_count + new_sum) / count
    temp = x - new_sum / new_count
    correction = sum_op(temp, axis=0)
    temp **= 2
    unnormalized = sum_op(temp, axis=0)
    unnormalized -= correction**2 / new_count
    return mean, unnormalized / count, count


def fit_columns(columns: Mapping[str, Any], train_rows: np.ndarray, *, numeric: Sequence[str], text: Sequence[str],
                impute: bool, indicate: Sequence[str]) -> FittedColumns:
    """Learn the transformation's statistics from the train split, one column at a time.

    Args:
        columns: :func:`input_columns` of the table.
        train_rows: the train split's row positions (int, ``(n,)``).
        numeric / text: the input columns of each kind, in order.
        impute: fill missing values (numbers: the median; text: the most frequent value).
        indicate: columns that get a 0/1 "was missing" output column.

    Returns:
        The :class:`FittedColumns`: for numbers ``SimpleImputer(strategy="median")`` (a column with no present
        train cell: 0), then ``StandardScaler`` (a near-constant column's scale is 1; scikit-learn's
        ``_is_constant_feature`` bound); for text the sorted values seen, the most frequent one (ties: the first
        in sorted order, as scipy's ``mode``) and the one-hot codes.
    """
    n = len(numeric)
    fill = np.zeros(n) if impute else None
    means, variances, counts = np.zeros(n), np.zeros(n), np.zeros(n)
    taken = np.empty((len(train_rows), 1), dtype=np.float64)  # each column's train cells in turn: one array
    for j, name in enumerate(numeric):
        values = np.take(columns[name], train_rows, out=taken[:, 0]).reshape(-1, 1)
        if fill is not None:
            median = np.ma.median(np.ma.masked_array(values, mask=np.isnan(values)), axis=0)
            fill[j] = 0 if np.ma.getmaskarray(median)[0] else np.ma.getdata(median)[0]
            values[np.isnan(values)] = fill[j]
        mean, var, count = _mean_var(values)
        means[j], variances[j], counts[j] = mean[0], var[0], count[0]
    seen: Any = counts.astype(np.int64)
    if n and seen.max() == seen.min():
        seen = seen[0]
    eps = np.finfo(np.float64).eps
    constant = variances <= counts * eps * variances + (counts * means * eps) ** 2
    scale = np.sqrt(variances)
    scale[constant] = 1.0
    categories, onehot, most = [], [], np.zeros(len(text)) if impute else None
    for j, name in enumerate(text):
        codes, uniques = columns[name]
        count = np.bincount(np.take(codes, train_rows) + 1, minlength=len(uniques) + 1)  # [0]: missing
        cats = np.array(sorted({uniques[k] for k in np.flatnonzero(count[1:])}), dtype=object)
        lookup = text_lookup(cats, uniques)[:-1]
        per_code = np.zeros(len(cats), dtype=np.int64)
        present = lookup >= 0
        np.add.at(per_code, lookup[present], count[1:][present])
        codes_seen = np.flatnonzero(per_code)
        if most is not None:
            most[j] = float(np.argmax(per_code)) if len(cats) else 0.0
            if count[0]:
                codes_seen = np.union1d(codes_seen, [int(most[j])])
        elif count[0]:
            codes_seen = np.union1d(codes_seen, [MISSING_CODE])
        categories.append(cats)
        onehot.append(codes_seen.astype(np.int64))
    return FittedColumns(numeric=list(numeric), text=list(text), indicate=list(indicate), impute=impute, fill=fill,
                         mean=means, var=variances, scale=scale, seen=seen, categories=categories, most=most,
                         onehot=onehot)


def sample_rows(columns: Mapping[str, Any], train_rows: np.ndarray, *, numeric: Sequence[str], text: Sequence[str],
                indicate: Sequence[str]) -> np.ndarray:
    """A few train rows (positions in the table, sorted) that hold every text value of the train split, a
    missing cell of each text column that has one there, and one of each ``indicate`` column: the rows
    :func:`heteroflow.components.data.tabular.to_transform` fits the ColumnTransformer's layout on."""
    keep = {0}
    for name in text:
        codes = columns[name][0]
        _, first = np.unique(np.take(codes, train_rows), return_index=True)  # a row of each value (and of a gap)
        keep.update(first.tolist())
    for name in indicate:
        gaps = np.isnan(np.take(columns[name], train_rows)) if name in numeric else np.take(columns[name][0], train_rows) < 0
        keep.update(np.flatnonzero(gaps)[:1].tolist())
    return np.asarray(train_rows)[np.asarray(sorted(keep), dtype=np.int64)]


_CHUNK_ROWS = 1 << 14  # rows :func:`apply_into` standardises at a time (16 numeric columns: 2 MiB of float64)


def apply_into(fitted: FittedColumns, columns: Mapping[str, Any], rows: np.ndarray, out: np.ndarray, *,
               scratch: np.ndarray | None = None) -> np.ndarray:
    """The features of the table's ``rows`` (positions) written into ``out`` (float32 ``(len(rows), width)``, C
    order, any content: it is overwritten), which is returned. ``scratch``: a float64 array of at least
    ``len(fitted.numeric) * 16384`` entries to standardise in, kept by a caller that calls this for many pieces
    (a new 2 MiB array each call is page-faulted in each time: issue #32 item 1); None: one is allocated. Value for value what the archived
    ColumnTransformer's ``transform`` gives: each number ``float32((x - mean) / scale)`` in float64 (a missing one
    first set to the median), each text value's 1 at its column among its column's one-hot codes (a value never
    seen in training: all zeros; a missing one: the most frequent value's), each indicator 1 where the cell is
    missing.

    Raises:
        ValueError: ``out`` has another shape or type.
    """
    if out.shape != (len(rows), fitted.width) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out is {out.dtype} {out.shape}; expected float32 {(len(rows), fitted.width)}, C order")
    out.fill(0)
    starts = fitted.starts
    numeric = fitted.numeric
    if numeric:
        start = starts["number"]
        block = out[:, start:start + len(numeric)]
        size = len(numeric) * _CHUNK_ROWS
        if scratch is None or scratch.dtype != np.float64 or scratch.size < size:
            scratch = np.empty(size, dtype=np.float64)
        buffer = scratch.reshape(-1)[:size].reshape(len(numeric), _CHUNK_ROWS)  # one feature a row: contiguous
        with np.errstate(all="ignore"):
            for first in range(0, len(rows), _CHUNK_ROWS):  # in chunks that stay in the cache, then one copy
                chunk = rows[first:first + _CHUNK_ROWS]
                part = buffer[:, : len(chunk)]
                for j, column in enumerate(numeric):
                    values = part[j]
                    np.take(columns[column], chunk, out=values)
                    if fitted.fill is not None:
                        values[np.isnan(values)] = fitted.fill[j]
                    values -= fitted.mean[j]
                    values /= fitted.scale[j]
                block[first:first + len(chunk)] = part.T
    n, width = out.shape
    if fitted.text:
        flat = out.reshape(-1)
        base = np.arange(n, dtype=np.int64) * width
        offset = starts["text"]
        for j, (column, cats) in enumerate(zip(fitted.text, fitted.onehot)):
            codes, uniques = columns[column]
            lookup = text_lookup(fitted.categories[j], uniques)  # per code of the table: TextCodes' code
            if fitted.most is not None:
                lookup[lookup == MISSING_CODE] = fitted.most[j]
            where = np.minimum(np.searchsorted(cats, lookup), max(len(cats) - 1, 0))  # its place among the
            place = np.where(cats[where] == lookup, where, -1) if len(cats) else np.full_like(lookup, -1)  # one-hot columns, or -1
            at = place[codes[rows]]
            known = at >= 0
            flat[base[known] + offset + at[known]] = 1
            offset += len(cats)
    if fitted.indicate:
        start = starts["missing"]
        for j, column in enumerate(fitted.indicate):
            if column in numeric:
                out[:, start + j] = np.isnan(np.take(columns[column], rows))
            else:
                out[:, start + j] = columns[column][0][rows] < 0
    return out
