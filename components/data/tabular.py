"""The fitted transformation of a table: raw columns in, the float32 features the model reads out.

Built from scikit-learn parts in one :class:`~sklearn.compose.ColumnTransformer`:

- numeric columns: ``SimpleImputer(strategy="median")`` (only with ``missing=impute``), then
  ``StandardScaler`` (mean and standard deviation of the train split, in float64; a constant column becomes
  0), then a cast to float32;
- text columns: :class:`TextCodes` (each value's index among the values seen in the train split; -1 for a
  missing value, -2 for a value never seen), ``SimpleImputer(strategy="most_frequent")`` on the codes (only
  with ``missing=impute``), then ``OneHotEncoder(handle_unknown="ignore")`` (a value never seen in training
  is all zeros; :class:`OneHotCodes`, the same encoder with a vectorised ``transform``);
- with ``missing=impute``: ``MissingIndicator`` for every column that has a missing value in the train split
  (one 0/1 column each).

:class:`TextCodes` exists for speed: scikit-learn's encoders compare Python strings one by one, while
``pandas.factorize`` hashes them, so the codes cost about a quarter of the encoder's time on a million rows.

Preprocess fits and applies it without passing the splits through the ColumnTransformer (issue #32 item 1):
:mod:`heteroflow.components.data.colstats` learns the statistics the same estimators learn from the whole
train split, column by column, with numpy alone, and computes the features from them, value for value what
``transform`` gives (``tests/test_preprocess_fast.py`` compares them); :func:`to_transform` then fits the
ColumnTransformer on a few rows that hold every text value and sets its statistics to those. The archived
object is the same ColumnTransformer as before, so models archived before still load.

This module imports scikit-learn at import time (the saved transformation refers to :class:`TextCodes` by
this module's name); heteroflow imports it only inside the functions that fit or apply a transformation.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.preprocessing import OneHotEncoder

from heteroflow.cache.atomic import atomic_write_bytes
from heteroflow.cache.errors import DatasetError
from heteroflow.components.data.cells import clean_column, text_cells
from heteroflow.components.data.shards import SCHEMA_NAME, TRANSFORM_FILES, TRANSFORM_NAME

__all__ = [
    "SCHEMA_NAME",
    "TRANSFORM_FILES",
    "TRANSFORM_NAME",
    "OneHotCodes",
    "TextCodes",
    "apply_fast",
    "apply_into",
    "as_float32",
    "build_transform",
    "column_codes",
    "fit_columns",
    "fit_fast",
    "input_columns",
    "known_categories",
    "load_transform",
    "output_names",
    "prepare_rows",
    "save_transform",
    "text_categories",
    "text_cells",
]


_MISSING_CODE = -1
_UNSEEN_CODE = -2


class TextCodes(TransformerMixin, BaseEstimator):
    """Text columns to integer codes: a value's index among the sorted values seen in :meth:`fit`, -1 for a
    missing value (NaN/None), -2 for a value not seen in :meth:`fit`.

    Input: a DataFrame (or 2-D array) of ``(n, k)`` text cells; output: int64 ``(n, k)``.
    """

    def fit(self, X: Any, y: Any = None) -> TextCodes:
        import pandas as pd

        frame = pd.DataFrame(X)
        self.categories_ = [
            np.array(sorted({str(v) for v in pd.unique(frame.iloc[:, j].dropna())}), dtype=object)
            for j in range(frame.shape[1])
        ]
        self.n_features_in_ = frame.shape[1]
        if hasattr(X, "columns"):
            self.feature_names_in_ = np.asarray([str(c) for c in X.columns], dtype=object)
        return self

    def transform(self, X: Any) -> np.ndarray:
        import pandas as pd

        frame = pd.DataFrame(X)
        out = np.empty(frame.shape, dtype=np.int64)
        for j, cats in enumerate(self.categories_):
            codes, uniques = pd.factorize(frame.iloc[:, j], use_na_sentinel=True)
            index = {v: i for i, v in enumerate(cats)}
            table = np.array([index.get(str(u), _UNSEEN_CODE) for u in uniques] + [_MISSING_CODE], dtype=np.int64)
            out[:, j] = table[codes]
        return out

    def get_feature_names_out(self, input_features: Sequence[str] | None = None) -> np.ndarray:
        if input_features is None:
            input_features = getattr(self, "feature_names_in_", [f"x{j}" for j in range(self.n_features_in_)])
        return np.asarray(list(input_features), dtype=object)


class OneHotCodes(OneHotEncoder):
    """scikit-learn's :class:`~sklearn.preprocessing.OneHotEncoder` with a vectorised ``transform`` for what
    :class:`TextCodes` gives it: a dense 2-D array of integer codes, dense output, no dropped or infrequent
    categories, unknown codes ignored (all zeros). Each column's codes are placed among its sorted categories
    with one :func:`numpy.searchsorted` and the ones are written with one scatter, about 10x faster than the
    parent's per-category comparison on a million rows. Anything else goes to the parent; fitting is the
    parent's. The output is the parent's, value for value (``tests/test_tables_faults.py`` checks it)."""

    def transform(self, X: Any) -> Any:
        codes = X if isinstance(X, np.ndarray) else None
        if (
            codes is None
            or codes.ndim != 2
            or codes.dtype.kind not in "iu"
            or self.sparse_output
            or self.drop is not None
            or self.handle_unknown != "ignore"
            or getattr(self, "_infrequent_enabled", False)
            or codes.shape[1] != len(self.categories_)
            or any(c.dtype.kind not in "iu" for c in self.categories_)
        ):
            return super().transform(X)
        n = codes.shape[0]
        sizes = [len(c) for c in self.categories_]
        out = np.zeros((n, sum(sizes)), dtype=self.dtype)
        flat = out.reshape(-1)
        base = np.arange(n, dtype=np.int64) * out.shape[1]
        offset = 0
        for j, cats in enumerate(self.categories_):
            column = codes[:, j]
            where = np.minimum(np.searchsorted(cats, column), len(cats) - 1)
            known = cats[where] == column
            flat[base[known] + offset + where[known]] = 1
            offset += len(cats)
        return out


def as_float32(x: np.ndarray) -> np.ndarray:
    """The standardised numbers as float32, the model's input type (half the memory of float64 when the parts
    are stacked)."""
    return np.ascontiguousarray(x, dtype=np.float32)


def build_transform(*, numeric: Sequence[str], text: Sequence[str], impute: bool, indicate: Sequence[str]) -> Any:
    """An unfitted ColumnTransformer (see the module docstring).

    Args:
        numeric: numeric input columns, in order.
        text: text input columns, in order.
        impute: fill missing values (median / most frequent).
        indicate: columns that get a 0/1 "was missing" column.

    ``n_jobs`` is left at None: the parts run in parallel where the caller sets joblib's ``parallel_config``
    (preprocess runs them on threads), one after the other elsewhere.
    """
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import MissingIndicator, SimpleImputer
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import FunctionTransformer, StandardScaler

    parts: list[tuple[str, Any, list[str]]] = []
    if numeric:
        steps: list[tuple[str, Any]] = []
        if impute:
            steps.append(("impute", SimpleImputer(strategy="median", keep_empty_features=True)))
        steps.append(("scale", StandardScaler()))
        steps.append(("float32", FunctionTransformer(as_float32, feature_names_out="one-to-one")))
        parts.append(("number", Pipeline(steps), list(numeric)))
    if text:
        steps = [("codes", TextCodes())]
        if impute:
            most_frequent = SimpleImputer(missing_values=_MISSING_CODE, strategy="most_frequent", keep_empty_features=True)
            steps.append(("impute", most_frequent))
        steps.append(("onehot", OneHotCodes(handle_unknown="ignore", sparse_output=False, dtype=np.float32)))
        parts.append(("text", Pipeline(steps), list(text)))
    if indicate:
        parts.append(("missing", MissingIndicator(features="all"), list(indicate)))
    return ColumnTransformer(parts, remainder="drop", sparse_threshold=0.0, verbose_feature_names_out=False)


def output_names(transform: Any) -> list[str]:
    """Names of the output features of a fitted transformation: ``col`` (a scaled number), ``col=value``
    (one-hot), ``col missing`` (indicator)."""
    names: list[str] = []
    for name, part, columns in transform.transformers_:
        if name == "number":
            names.extend(columns)
        elif name == "text":
            encoder = part.named_steps["codes"]
            onehot = part.named_steps["onehot"]
            for col, cats, codes in zip(columns, encoder.categories_, onehot.categories_):
                names.extend(f"{col}={cats[int(c)]}" for c in codes)
        elif name == "missing":
            names.extend(f"{c} missing" for c in columns)
    return names


def text_categories(transform: Any) -> dict[str, list[str]]:
    """The values each text column held in the train split (what :class:`TextCodes` learned), by column."""
    found: dict[str, list[str]] = {}
    for name, part, columns in transform.transformers_:
        if name == "text":
            for col, cats in zip(columns, part.named_steps["codes"].categories_):
                found[col] = [str(c) for c in cats]
    return found


@contextlib.contextmanager
def _stock_pickling() -> Iterator[None]:
    """Pickle with joblib's own reducers only, for the duration. joblib's ``NumpyPickler`` copies pickle's dispatch
    table when joblib is imported; in a process that imported dill first (Airflow does), dill's reducers are in
    that copy (``dill.extend``), so ``transform.joblib`` names ``dill._dill._load_type`` for a ``slice``: another
    file for the same transformation (the archive then kept a duplicate version of the same model), and one that
    cannot be loaded where dill is not installed. While it pickles, the table is pickle's own, as dill's public
    ``dill.extend(False)`` restores it (dill's state is then put back as it was)."""
    import pickle
    import sys

    from joblib import numpy_pickle

    def from_dill(dispatch: Mapping[Any, Any]) -> bool:
        return any(str(getattr(f, "__module__", "") or "").startswith("dill") for f in dispatch.values())

    with _PICKLING:  # process-wide tables: one swap at a time (a review: two threads could leave dill unextended)
        table = numpy_pickle.NumpyPickler.dispatch
        dill = sys.modules.get("dill")
        if dill is None or not from_dill(table):
            yield
            return
        extended = from_dill(pickle._Pickler.dispatch)  # type: ignore[attr-defined]
        dill.extend(False)  # pickle's table without dill's reducers
        stock = pickle._Pickler.dispatch.copy()  # type: ignore[attr-defined]
        if extended:
            dill.extend(True)
        numpy_pickle.NumpyPickler.dispatch = stock
        try:
            yield
        finally:
            numpy_pickle.NumpyPickler.dispatch = table


_PICKLING = threading.RLock()
"""Held while :func:`_stock_pickling` swaps the pickling tables (they are the process's)."""


def save_transform(folder: str | os.PathLike[str], transform: Any, schema: Mapping[str, Any], *,
                   durable: bool = True) -> None:
    """Write ``transform.joblib`` and ``transform.json`` into ``folder`` (each atomically; ``durable``: each
    fsynced, False where the folder is made durable as a whole, as preprocess's :func:`atomic_directory` does).
    The pickle is the same bytes in every process (:func:`_stock_pickling`): loading it never needs dill."""
    import io

    import joblib

    buffer = io.BytesIO()
    with _stock_pickling():
        joblib.dump(transform, buffer)
    atomic_write_bytes(Path(folder, TRANSFORM_NAME), buffer.getvalue(), durable=durable)
    atomic_write_bytes(Path(folder, SCHEMA_NAME), json.dumps(schema, indent=2).encode(), durable=durable)


def load_transform(folder: str | os.PathLike[str]) -> tuple[Any, dict[str, Any]]:
    """Read what :func:`save_transform` wrote.

    Raises:
        DatasetError: the folder holds no saved transformation.
    """
    import joblib

    try:
        schema = json.loads(Path(folder, SCHEMA_NAME).read_text(encoding="utf-8"))
        transform = joblib.load(Path(folder, TRANSFORM_NAME))
    except FileNotFoundError as exc:
        raise DatasetError(
            f"{folder} holds no saved transformation ({Path(exc.filename).name} is missing); it was written by a "
            "heteroflow without one: preprocess and train again"
        ) from None
    return transform, schema


def known_categories(schema: Mapping[str, Any], column: str) -> list[str] | None:
    """The values a text column held in training: the schema's ``categories`` (written since issue #16), else
    read from the one-hot feature names ``column=value``; None when neither says."""
    for spec in schema.get("columns", []):
        if spec.get("name") == column and "categories" in spec:
            return [str(c) for c in spec["categories"]]
    prefix = f"{column}="
    found = [f[len(prefix):] for f in schema.get("features", []) if isinstance(f, str) and f.startswith(prefix)]
    return found or None


def prepare_rows(rows: Any, schema: Mapping[str, Any], *, where: str = "rows") -> Any:
    """Raw rows to the cleaned input frame the transformation takes.

    Args:
        rows: a pandas DataFrame (columns by name; other columns, such as the class column, are ignored), a
            sequence of mappings (column name -> cell), or a 2-D sequence/array whose rows hold the input
            columns in the schema's order.
        schema: the saved schema (``transform.json``).
        where: what the rows are, for messages.

    Returns:
        A DataFrame of the input columns, cleaned the way training cleaned them, each row on its own: a row's
        cells never depend on the other rows given with it (text cells through :func:`text_cells`).

    Raises:
        DatasetError: a column is absent, a numeric column holds text, or a value is missing where the
            transformation cannot fill it (trained with ``missing=error`` or ``drop``). Messages name the row
            (0-based position in ``rows``) and column.
    """
    import pandas as pd

    columns = [c["name"] for c in schema["columns"]]
    if isinstance(rows, pd.DataFrame):
        frame = rows
    elif isinstance(rows, Sequence) and rows and isinstance(rows[0], Mapping):
        frame = pd.DataFrame(list(rows))
    else:
        array = np.asarray(rows, dtype=object)
        if array.ndim != 2 or array.shape[1] != len(columns):
            raise DatasetError(
                f"{where}: expected rows of {len(columns)} cells ({', '.join(columns)}), got shape {array.shape}"
            )
        frame = pd.DataFrame(array, columns=columns)
    absent = [c for c in columns if c not in frame.columns]
    if absent:
        raise DatasetError(f"{where}: column(s) {', '.join(map(repr, absent))} are missing; the model reads {', '.join(columns)}")
    decimal = schema.get("decimal", ".")
    out = {}
    for spec in schema["columns"]:
        name, kind = spec["name"], spec["kind"]
        values = frame[name].reset_index(drop=True)
        if kind == "number":
            cleaned, got = clean_column(values, decimal=decimal)
            if got != "number":
                text = cleaned.astype(object)
                present = text.notna().to_numpy()
                shown = text.where(present).str.replace(",", ".", regex=False) if decimal == "," else text.where(present)
                bad = present & pd.to_numeric(shown, errors="coerce").isna().to_numpy()
                first = int(np.flatnonzero(bad)[0])
                raise DatasetError(f"{where}: row {first}: column {name!r} holds {text.iloc[first]!r}, not a number")
            cleaned = cleaned.astype("float64")
            infinite = np.isinf(cleaned.to_numpy())
            if infinite.any():
                raise DatasetError(f"{where}: row {int(np.flatnonzero(infinite)[0])}: column {name!r} is not a finite number")
        else:
            cleaned = text_cells(values, known_categories(schema, name), decimal=decimal)
        out[name] = cleaned
    prepared = pd.DataFrame(out)
    if not schema.get("imputes", False):
        missing = prepared.isna()
        if missing.to_numpy().any():
            r, c = np.argwhere(missing.to_numpy())[0]
            why = (
                "its training data had no missing value, so it learned no value to fill in"
                if schema.get("missing") == "impute"
                else f"it was trained with missing={schema.get('missing', 'error')} and cannot fill a missing value "
                "(train with missing=impute)"
            )
            raise DatasetError(f"{where}: row {int(r)}: column {columns[c]!r} is missing; {why}")
    return prepared


# --- the fitted transformation computed without a per-call ColumnTransformer (issue #32 item 1) ----------------
# The statistics are learned and applied with numpy in :mod:`heteroflow.components.data.colstats` (no scikit-learn
# import there); here the archived ColumnTransformer is built from them, and read back into them.

from heteroflow.components.data.colstats import (  # noqa: E402  (re-exported: their former home)
    FittedColumns,
    column_codes,
    input_columns,
    sample_rows,
)


def to_transform(fitted: FittedColumns, sample: Any) -> Any:
    """The fitted ColumnTransformer of :func:`build_transform` (the object archived with a model) holding
    ``fitted``'s statistics.

    The ColumnTransformer is fitted on ``sample``, a few train rows that hold every text value of the train split
    (and a missing cell of each ``indicate`` column; :func:`~heteroflow.components.data.colstats.sample_rows`):
    what it learns from the column layout and the text values (columns, categories, output widths) is the same
    from those rows as from all. Its statistics are then set to ``fitted``'s, those the same estimators learn
    from the whole train split: the scaler's mean, variance, scale and samples seen, the imputers' medians and
    most frequent values. Preprocess calls it after the table is freed (scikit-learn's import is 60-90 MB).

    Args:
        fitted: :func:`~heteroflow.components.data.colstats.fit_columns` of the train split.
        sample: the sample rows (pandas DataFrame of the input columns, in the table's order).
    """
    transform = build_transform(numeric=fitted.numeric, text=fitted.text, impute=fitted.impute, indicate=fitted.indicate)
    transform.fit(sample)
    parts = {name: part for name, part, _ in transform.transformers_}
    if fitted.numeric:
        steps = parts["number"].named_steps
        if fitted.impute:
            steps["impute"].statistics_ = fitted.fill.copy()
        scale = steps["scale"]
        scale.mean_, scale.var_, scale.scale_ = fitted.mean.copy(), fitted.var.copy(), fitted.scale.copy()
        scale.n_samples_seen_ = fitted.seen
    if fitted.text and fitted.impute:
        parts["text"].named_steps["impute"].statistics_ = fitted.most.copy()
    return transform


def fitted_of(transform: Any) -> FittedColumns:
    """The statistics a fitted :func:`build_transform` holds, as :class:`FittedColumns` (what
    :func:`apply_into` computes the features from)."""
    parts = {name: (part, list(columns)) for name, part, columns in transform.transformers_}
    numeric, text = parts.get("number", (None, []))[1], parts.get("text", (None, []))[1]
    fill = mean = var = scale = most = None
    seen: Any = 0
    if numeric:
        steps = parts["number"][0].named_steps
        fill = np.asarray(steps["impute"].statistics_) if "impute" in steps else None
        scaler = steps["scale"]
        mean, var, scale, seen = scaler.mean_, scaler.var_, scaler.scale_, scaler.n_samples_seen_
    categories, onehot = [], []
    impute = fill is not None
    if text:
        steps = parts["text"][0].named_steps
        most = np.asarray(steps["impute"].statistics_) if "impute" in steps else None
        impute = impute or most is not None
        categories, onehot = list(steps["codes"].categories_), list(steps["onehot"].categories_)
    empty = np.zeros(0)
    return FittedColumns(numeric=numeric, text=text, indicate=parts.get("missing", (None, []))[1], impute=impute,
                         fill=fill, mean=empty if mean is None else mean, var=empty if var is None else var,
                         scale=empty if scale is None else scale, seen=seen, categories=categories, most=most,
                         onehot=onehot)


def fit_fast(frame: Any, columns: Mapping[str, Any], train_rows: np.ndarray, *, used: Sequence[str],
             numeric: Sequence[str], text: Sequence[str], impute: bool, indicate: Sequence[str]) -> tuple[Any, np.ndarray]:
    """:func:`fit_columns`, and the train split's features (:func:`apply_fast`), float32 ``(n, num_features)``."""
    transform = fit_columns(frame, columns, train_rows, used=used, numeric=numeric, text=text, impute=impute,
                            indicate=indicate)
    return transform, apply_fast(transform, columns, train_rows, numeric=numeric, text=text)


def fit_columns(frame: Any, columns: Mapping[str, Any], train_rows: np.ndarray, *, used: Sequence[str],
                numeric: Sequence[str], text: Sequence[str], impute: bool, indicate: Sequence[str]) -> Any:
    """The fitted ColumnTransformer of :func:`build_transform` for the train split ``train_rows`` of ``frame``,
    without passing the train split through it: :func:`~heteroflow.components.data.colstats.fit_columns`, then
    :func:`to_transform` on the sample rows.

    Args:
        frame: the whole table (pandas DataFrame; ``train_rows`` are positions in it).
        columns: :func:`input_columns` of ``frame``.
        train_rows: the train split's row positions, in the split's order (int, ``(n,)``).
        used: the input columns in the table's order (``numeric`` and ``text`` together).
        impute / indicate: as for :func:`build_transform`.
    """
    from heteroflow.components.data import colstats

    fitted = colstats.fit_columns(columns, train_rows, numeric=numeric, text=text, impute=impute, indicate=indicate)
    few = sample_rows(columns, train_rows, text=text, indicate=indicate, numeric=numeric)
    return to_transform(fitted, frame.take(few)[list(used)])


def apply_fast(transform: Any, columns: Mapping[str, Any], rows: np.ndarray, *, numeric: Sequence[str],
               text: Sequence[str]) -> np.ndarray:
    """What ``transform.transform`` gives for the table's ``rows`` (positions), value for value: float32
    ``(len(rows), num_features)`` (:func:`apply_into` into a new array).

    Raises:
        ValueError: ``transform`` was not built for these columns.
    """
    fitted = transform if isinstance(transform, FittedColumns) else fitted_of(transform)
    return apply_into(fitted, columns, rows, np.empty((len(rows), fitted.width), dtype=np.float32),
                      numeric=numeric, text=text)


def apply_into(transform: Any, columns: Mapping[str, Any], rows: np.ndarray, out: np.ndarray, *,
               numeric: Sequence[str], text: Sequence[str]) -> np.ndarray:
    """:func:`~heteroflow.components.data.colstats.apply_into` for a fitted :func:`build_transform` (or its
    :class:`FittedColumns`): the features of ``rows`` written into ``out`` (float32 ``(len(rows), num_features)``,
    C order), which is returned.

    Raises:
        ValueError: ``transform`` was not built for these columns, or ``out`` has another shape or type.
    """
    from heteroflow.components.data import colstats

    fitted = transform if isinstance(transform, FittedColumns) else fitted_of(transform)
    if fitted.numeric and list(fitted.numeric) != list(numeric):
        raise ValueError(f"the transformation's numeric columns {fitted.numeric} are not {list(numeric)}")
    if fitted.text and list(fitted.text) != list(text):
        raise ValueError(f"the transformation's text columns {fitted.text} are not {list(text)}")
    return colstats.apply_into(fitted, columns, rows, out)
