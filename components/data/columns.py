"""What a table's columns mean (preprocess steps 2 and 3, see :mod:`heteroflow.components.data.preprocess`):
the files read as one table (:class:`_Table`), the class column (:data:`CLASS_COLUMN_NAMES`) and its classes,
the checks of the feature columns (row ids, :data:`ID_NAME_TOKENS`; text; values too large to standardise),
and the data report that lists each decision.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heteroflow.cache.errors import DatasetError
from heteroflow.components.data.cells import text_cells
from heteroflow.components.data.datasets import RawTable

if TYPE_CHECKING:  # numpy and pandas are imported where they are used: pipeline definitions import the steps
    import numpy as np
    import pandas as pd

__all__ = ["CLASS_COLUMN_NAMES", "CLASS_LIKE_WORDS", "ID_NAME_TOKENS", "WEIGHT_NAME_TOKENS"]

CLASS_COLUMN_NAMES = ("label", "class", "target", "y", "species", "outcome", "diagnosis", "labels", "classes")
"""Names taken for the class column when ``label_column`` is empty, first listed first (case and surrounding
spaces ignored): the names public tables (UCI, OpenML, Kaggle, scikit-learn's ``target``) give it. Without
such a column the last column is taken, with a notice naming any column whose name holds one of these words
(``income_class``)."""
ID_NAME_TOKENS = frozenset({"id", "ids", "uuid", "guid", "idx", "index"})
"""A column whose name holds one of these words (``id``, ``PassengerId``, ``user_id``, ``ID``) is taken for a
row id. Words are split at ``_``, spaces, digits and lower-to-upper case changes, so ``valid`` or ``paid``
are not ids."""

CLASS_LIKE_WORDS = frozenset(
    {*CLASS_COLUMN_NAMES, "survived", "survival", "income", "churn", "churned", "fraud", "default", "defaulted", "spam"}
)
"""Words that make a column's name a better class than the last column's (``Survived`` in Titanic, ``income``
in Adult, ``income_class``): a last-column guess names such a column, with ``label_column=`` for it."""
WEIGHT_NAME_TOKENS = frozenset({"fnlwgt", "wgt", "wt", "wgts", "weights", "sampleweight", "perwt", "pwgtp"})
"""A column whose name holds one of these words (``fnlwgt`` in Adult, ``sample_weights``) or ends in ``wgt``
looks like a sample weight (how many people a row stands for), not a property of the row: it is listed in the
class-column line with ``drop_columns=`` to leave it out (it stays a feature unless the user says so)."""

_MIN_ROWS_FOR_VALUE_CHECKS = 20  # below this, "one value per row" says nothing about a column
_LISTED_ROWS = 5


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
    as_text: dict[str, str] = dataclasses.field(default_factory=dict)  # column -> where it held numbers and text

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
    if table.format == "npz":  # its class is the y array by definition; it was "the last column, as none is named
        return columns[-1], "the .npz file's y array"  # as a class", of a column named 'label'
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
        alike = [c for c in columns[:-1] if _words(c) & CLASS_LIKE_WORDS]
        if alike:
            reason += f"; {_quoted(alike)} {'is' if len(alike) == 1 else 'are'} named like one: label_column={alike[0]}?"
        else:
            reason += _better_by_values(table, columns)
    return columns[-1], reason


def _poor_class(column: pd.Series, kind: str) -> str | None:
    """Why a guessed (last) column makes a poor class by its values, or None."""
    import numpy as np

    present = column.dropna()
    if len(present) < len(column):
        return f"it has {len(column) - len(present)} missing values"
    if kind != "number" or not len(present):
        return None
    values = present.to_numpy(dtype="float64")
    if not np.all(np.isfinite(values)) or not np.all(values == np.floor(values)):
        return "its values have fractions, like a measurement"
    low, high = values.min(), values.max()
    if 1800 <= low <= high <= 2100 and high > low:
        return f"its values look like years ({int(low)}..{int(high)}), not classes"
    return None


def _better_by_values(table: RawTable, columns: list[str]) -> str:
    """For a last column that makes a poor class: the columns whose values look like classes (a few distinct
    values, none missing, not numbers with fractions), fewest values first; "" when the last column is fine."""
    frame = table.frame
    why = _poor_class(frame[columns[-1]], table.kinds.get(columns[-1], "text"))
    if why is None:
        return ""
    n = len(frame)
    found = []
    for k, name in enumerate(columns[:-1]):
        column, kind = frame[name], table.kinds.get(name, "text")
        if kind not in ("number", "text", "bool") or column.isna().any() or _words(name) & ID_NAME_TOKENS:
            continue
        if kind == "number" and _poor_class(column, kind) is not None:
            continue
        distinct = int(column.nunique())
        if 2 <= distinct <= min(10, max(2, n // 5)):
            found.append((distinct, k, name))
    found.sort()
    if not found:
        return f"; {why}"
    listed = ", ".join(f"{name!r} ({distinct} values)" for distinct, _, name in found[:3])
    return f"; {why}; columns whose values look like classes: {listed}: label_column={found[0][2]}?"


def _weight_like(name: str) -> bool:
    """Whether a column's name says it is a sample weight (:data:`WEIGHT_NAME_TOKENS`)."""
    words = _words(name) | {w.lower() for w in re.split(r"[^A-Za-z]+", name) if w}
    return bool(words & WEIGHT_NAME_TOKENS) or name.strip().lower().endswith("wgt") or "sample_weight" in name.lower()


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
    mixed: dict[str, str] = {}
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
        part = t.frame.rename(columns={**rename, label: canon_label}) if rename or label != canon_label else t.frame
        if list(part.columns) != [*features, canon_label]:  # a copy of the cells: only when the order differs
            part = part[[*features, canon_label]]
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
                    numbers_in = t.source if kind == "number" else canon_table.source
                    text_in = canon_table.source if kind == "number" else t.source
                    mixed.setdefault(name, f"numbers in {Path(numbers_in).name}, text in {Path(text_in).name}")
                else:
                    raise DatasetError(
                        f"column {name!r} holds {kinds[name]} values in {canon_table.source} but {kind} values in "
                        f"{t.source}; make them agree, or drop_columns={name}"
                    )
        label_kinds.add(t.kinds[label])
        frames.append(part)
    if len(label_kinds) > 1:  # numbers in one file, text in another: text in all, as a feature column's cells
        kinds[canon_label] = "text"  # (the numbers stayed numbers: 1 and '1' were two classes, 0.0 and '0' too)
        as_text.add(canon_label)
    if as_text:
        for part in frames:
            for name in as_text:
                if pd.api.types.is_numeric_dtype(part[name]):
                    part[name] = text_cells(part[name]).to_numpy()
    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    frame = frame.reset_index(drop=True)
    file_of = np.concatenate([np.full(len(t.frame), i, dtype=np.int32) for i, t in enumerate(tables)])
    rows = [_positions(t.frame.index) for t in tables]
    row_of = rows[0] if len(rows) == 1 else np.concatenate(rows)
    return _Table(frame, kinds, canon_label, canon_reason, tables, file_of, row_of, mixed)


def _positions(index: pd.Index) -> np.ndarray:
    """An index's values as int64 (a RangeIndex's without the copy it would keep of them)."""
    import numpy as np
    import pandas as pd

    if isinstance(index, pd.RangeIndex):
        return np.arange(index.start, index.stop, index.step, dtype=np.int64)
    return index.to_numpy(dtype=np.int64)


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
        # neighbours compared, not subtracted: np.diff of uint8 pixels wraps a step down to a large step up (and
        # overflows int8/int16), so a pixel column read as increasing row ids and was dropped
        if np.all(values[1:] > values[:-1]) or np.all(values[1:] < values[:-1]):
            return "whole numbers that increase with the row order, one per row"
        low, high = int(values.min()), int(values.max())
        if high - low == n - 1 and column.is_unique:
            return f"the whole numbers {int(low)}..{int(high)}, one per row"
    elif kind == "text" and column.is_unique:
        return "text that is different in every row"
    return None


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


def _classes(y_raw: pd.Series, kind: str, label: str, label_reason: str, table: _Table) -> tuple[list[str], np.ndarray]:
    """Class names (sorted: numerically for whole numbers, else as text) and each row's class index."""
    import numpy as np
    import pandas as pd

    n = len(y_raw)
    if kind == "number" and y_raw.dtype == np.int64:  # whole numbers already: no infinite value, no fraction
        codes, found = pd.factorize(y_raw.to_numpy())
        uniques = np.sort(found)
        y = np.searchsorted(uniques, found)[codes]
        classes = [str(int(u)) for u in uniques]
    elif kind == "number":
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
    return classes, y.astype(np.int64, copy=False)


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
    fitted: Any,
    impute: bool,
    features: list[str],
    parameters: dict[str, Any],
    notices: list[str],
    label_reason: str,
) -> dict[str, Any]:
    """The data report; ``fitted``: the transformation's statistics
    (:class:`~heteroflow.components.data.colstats.FittedColumns`)."""
    import numpy as np

    encoded: dict[str, int] = {col: int(len(cats)) for col, cats in zip(fitted.text, fitted.categories)}
    imputed: dict[str, dict[str, Any]] = {}
    if impute:
        for names, values, kind in ((fitted.numeric, fitted.fill, "number"), (fitted.text, fitted.most, "text")):
            for j, col in enumerate(names):
                if col not in missing_counts or values is None:
                    continue
                value: Any = values[j]
                if kind == "text":
                    cats = fitted.categories[j]
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


def _class_column_line(table: _Table, parameters: dict[str, Any], dropped: dict[str, str], used: list[str]) -> str:
    """The class column, when guessed, in one line (preprocess logs it at once, before any problem is raised),
    listing the columns left out as row ids and those named like sample weights; with ``label_column`` set,
    only the weight-like features ("" when none)."""
    weights = [c for c in used if _weight_like(c)]
    weight_text = (
        f"{_quoted(weights)} {'looks' if len(weights) == 1 else 'look'} like a sample weight, used as a feature: "
        f"drop_columns={','.join(weights)} to leave {'it' if len(weights) == 1 else 'them'} out"
    ) if weights else ""
    if parameters["label_column"]:
        return weight_text
    label, reason = table.label, table.label_reason
    line = f"class column: {label!r}, {reason}"
    if "label_column" not in reason and not reason.startswith("the .npz file's"):  # an .npz has no other to choose
        line += "; set label_column to choose another"
    ids = [c for c, why in dropped.items() if why.startswith("looks like a row id")]
    if ids:
        line += f"; left out as row ids: {_quoted(ids)}"
    if weight_text:
        line += f"; {weight_text}"
    return line


def _imputed_notice(imputed: dict[str, dict[str, Any]]) -> str:
    """One line: which columns were imputed (missing=impute), how many cells each and with what value."""
    parts = []
    for name, how in imputed.items():
        value = f"{how['value']:g}" if isinstance(how["value"], float) else repr(how["value"])
        parts.append(f"{name!r} {how['missing']} (the {how['strategy']} value, {value})")
    cells = sum(how["missing"] for how in imputed.values())
    return (
        f"{cells} missing cells in {len(imputed)} column(s) imputed (missing=impute): " + ", ".join(parts)
        + "; each such column also gets a 0/1 'missing' indicator where the train split has a gap"
    )
