"""Cleaning cells: the same for training and for rows given to an archived model.

:func:`clean_column` cleans a whole column and says what it holds (:data:`ColumnKind`); :func:`text_cells`
cleans an archived model's text columns cell by cell. Spaces around text are removed, :data:`MISSING_MARKERS`
become missing (so ``" ?"`` is missing), a text column whose every value is a number becomes numeric, and
true/false columns become the text ``True`` / ``False``. The readers (:mod:`heteroflow.components.data.datasets`)
clean every table they read through :func:`_clean_frame`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # numpy and pandas are imported where they are used: pipeline definitions import the steps
    import numpy as np
    import pandas as pd

__all__ = ["MISSING_MARKERS", "ColumnKind", "clean_column", "text_cells"]

MISSING_MARKERS = ("", "NA", "N/A", "n/a", "NaN", "nan", "NAN", "-nan", "null", "NULL", "?", "#N/A")
"""Cell texts read as a missing value, after the spaces around a cell are removed (so ``" ?"``, as the UCI
adult census data writes it, is missing too). ``None`` is not among them: it is a real category in many
tables."""

ColumnKind = Literal["number", "text", "bool", "other"]


def clean_column(values: pd.Series, *, decimal: str = ".", numbers: bool = True) -> tuple[pd.Series, ColumnKind]:
    """Clean one column and say what it holds.

    Numbers stay numbers (int64 or float64; infinities are kept for the caller to report); ``True``/``False``
    become the text ``"True"``/``"False"`` (kind ``bool``); text is stripped of surrounding spaces, cells
    equal to a :data:`MISSING_MARKERS` entry become missing (NaN), and a text column whose every present
    value is a number (``" 39"``, or ``"3,5"`` with ``decimal=","``) becomes a float64 column; the rest stays
    text, as a pandas ``Categorical``. Dates, durations and other types are kind ``other``. The work is done
    once per distinct value (:func:`pandas.factorize`), so a column of a million cells with few distinct
    values costs little.

    Args:
        values: one column, any dtype.
        decimal: the decimal mark of numbers written as text.
        numbers: turn a text column of numbers into a numeric one (False: keep it text, as a column that
            was text in training stays text).

    Returns:
        The cleaned column (same index and name) and its kind.
    """
    import numpy as np
    import pandas as pd
    from pandas.api import types

    if types.is_bool_dtype(values):
        out = pd.Categorical(values.map({True: "True", False: "False"}), categories=["False", "True"])
        return pd.Series(out, index=values.index, name=values.name), "bool"
    if types.is_numeric_dtype(values) and not types.is_complex_dtype(values):
        if isinstance(values.dtype, pd.api.extensions.ExtensionDtype):  # nullable Int64/Float64: NaN for <NA>
            values = values.astype("float64")
        return values, "number"
    if not (types.is_object_dtype(values) or types.is_string_dtype(values) or isinstance(values.dtype, pd.CategoricalDtype)):
        return values, "other"
    try:
        codes, uniques = pd.factorize(values, use_na_sentinel=True)
    except TypeError:  # cells pandas cannot hash: a nested Parquet column's lists (numpy arrays) or structs (dicts)
        return values, "other"
    if len(uniques) and not all(isinstance(u, str) for u in uniques):
        if any(isinstance(u, (list, dict, tuple, bytes, np.ndarray)) for u in uniques):
            return values, "other"
    text = pd.Index([str(u).strip() for u in uniques], dtype=object)
    present = ~text.isin(MISSING_MARKERS)
    cleaned = pd.Series(np.where(present, text, np.nan), dtype=object)
    kind: ColumnKind = "text"
    if not present.any():  # nothing but missing values: no text to keep, and no sign of text
        return pd.Series(np.full(len(values), np.nan), index=values.index, name=values.name), "number"
    shown = cleaned[present]
    as_number = pd.to_numeric(shown.str.replace(",", ".", regex=False) if decimal == "," else shown, errors="coerce")
    if numbers and as_number.notna().all():
        number = np.full(len(cleaned) + 1, np.nan)  # the last entry serves code -1 (missing)
        number[:-1][present] = as_number.to_numpy(dtype="float64")
        return pd.Series(number[codes], index=values.index, name=values.name), "number"
    lowered = shown.str.lower()
    if lowered.isin(("true", "false")).all():
        cleaned[present] = np.where(lowered == "true", "True", "False")
        kind = "bool"
    # Text is kept as a pandas Categorical: one code per cell, each distinct text once (cheap to select rows of)
    merged, categories = pd.factorize(cleaned, use_na_sentinel=True)  # "a" and " a" are one category now
    merged = np.append(merged, -1)  # code -1 (missing) stays -1
    out = pd.Categorical.from_codes(merged[codes], categories=pd.Index(categories, dtype=object))
    return pd.Series(out, index=values.index, name=values.name), kind


def _cell_text(value: Any) -> str | None:
    """One cell as training's text: None when missing; ``True``/``False`` for a bool; a whole number without
    a fraction (``101``, whatever its type: pandas turns an integer column with a gap into floats); other
    numbers as Python writes them; text stripped of surrounding spaces; :data:`MISSING_MARKERS` missing."""
    import numpy as np
    import pandas as pd

    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, (bool, np.bool_)):
        return "True" if value else "False"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        number = float(value)
        if np.isnan(number):
            return None
        return str(int(number)) if number.is_integer() else repr(number)
    text = str(value).strip()
    return None if text in MISSING_MARKERS else text


def text_cells(values: Any, categories: Sequence[str] | None = None, *, decimal: str = ".") -> Any:
    """A text column of raw rows, cell by cell, as training saw it: every cell's text depends on that cell
    alone, never on the other rows of the batch (issue #16: an integer column with an empty cell becomes
    float in pandas, and ``101.0`` no longer matched ``101``).

    Each cell goes through :func:`_cell_text`; a text not among ``categories`` (the values seen in training)
    is then matched to one by meaning when exactly one fits: ``true``/``TRUE`` to ``True`` (a true/false
    column), and a number to the category of the same value (``101.0`` or ``1.50`` to ``101`` or ``1.5``, with
    ``decimal`` as the decimal mark). A text that matches nothing stays as it is (the encoder then gives it
    all zeros, as for any value never seen).

    Args:
        values: one column (a pandas Series or a sequence), any dtype.
        categories: the values seen in training, or None.
        decimal: the decimal mark of numbers written as text.

    Returns:
        A pandas Series of ``str`` or missing (NaN), object dtype, same length (a fresh 0-based index).
    """
    import numpy as np
    import pandas as pd

    series = pd.Series(values).reset_index(drop=True)
    codes, uniques = pd.factorize(series, use_na_sentinel=True)
    known = set(categories or ())
    by_value: dict[float, str | None] = {}
    titles = {c.lower(): c for c in known if c in ("True", "False")}
    for c in known:
        number = _as_number(c, decimal)
        if number is not None:
            by_value[number] = None if number in by_value else c  # two categories of one value: no match
    texts: list[Any] = []
    for u in uniques:
        text = _cell_text(u)
        if text is not None and known and text not in known:
            if text.lower() in titles:
                text = titles[text.lower()]
            else:
                number = _as_number(text, decimal)
                if number is not None and by_value.get(number):
                    text = by_value[number]
        texts.append(np.nan if text is None else text)
    table = np.array([*texts, np.nan], dtype=object)  # code -1 (missing) takes the last entry
    return pd.Series(table[codes], dtype=object, name=series.name)


def _as_number(text: str, decimal: str) -> float | None:
    try:
        number = float(text.replace(",", ".") if decimal == "," else text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _clean_frame(frame: pd.DataFrame, *, decimal: str = ".") -> tuple[pd.DataFrame, dict[str, ColumnKind]]:
    import pandas as pd

    kinds: dict[str, ColumnKind] = {}
    out = frame.copy(deep=False)
    for name in frame.columns:
        column = frame[name]
        cleaned, kinds[name] = clean_column(column, decimal=decimal)
        if cleaned is not column:  # replace changed columns only: no copy of the untouched numbers
            out[name] = cleaned
    return out, kinds
