"""Reading tables (CSV, Parquet, .npz) with every reading decision recorded, and the built-in sample data set.

A data set folder holds one or more files in these formats (files in other formats, e.g. a README, are
ignored):

- ``.csv`` / ``.tsv``: text tables, parsed by :func:`pandas.read_csv` (its C engine). Per file, from the first
  64 KiB (:func:`sniff_csv`; each decision and its reason is kept in :class:`CsvFormat`):

  - *encoding*: UTF-8 with or without a byte-order mark (the mark is removed, as spreadsheet programs write
    one); UTF-16 with a byte-order mark; a file that is not valid UTF-8 is read as Latin-1 (every byte is a
    character) and the decision says so.
  - *delimiter*: ``,`` ``;`` tab or ``|``: the one that splits the sampled lines into the same number (>= 2)
    of columns most consistently; ties go to the split whose cells look most like numbers, then to the most
    columns. Rows may end with the delimiter (``a;b;c;``, as some exports write, on some rows or all): the
    empty field after the last column is not a column, and a field there that is not empty is an error naming
    its line. Lines that split into one column are an error that says what was seen (every line one quoted
    field: the table was quoted twice) and what would read the file.
  - *decimal mark*: ``,`` when the delimiter is not a comma and sampled numbers are written ``3,14`` (none
    ``3.14``), as European spreadsheets write them.
  - *header*: the first row is a header when it holds text above columns that are numbers below it; in a
    table of text only, when its cells are distinct and none occurs again below it in its column.

  Line ends may be LF or CRLF; fields may be quoted (``"Braund, Mr. Owen"``); blank lines are skipped and
  counted.
- ``.parquet`` / ``.pq``: read by pandas with pyarrow; the column types come from the file.
- ``.npz``: arrays ``x`` (or ``X``/``features``), shape ``(n, ...)`` (flattened to ``(n, d)``, features
  named ``x0`` .. ``x{d-1}``), and ``y`` (or ``labels``), shape ``(n,)``, the column ``label``.

Cells are cleaned the same way for training and for rows given to an archived model (:func:`clean_column`;
for an archived model's text columns cell by cell, :func:`text_cells`):
spaces around text are removed, :data:`MISSING_MARKERS` become missing (so ``" ?"`` is missing), a text
column whose every value is a number becomes numeric, and true/false columns become the text ``True`` /
``False``. Numeric-looking class values are read as numbers (``01`` and ``1`` are the same class).
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import io
import json
import math
import os
import re
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from heteroflow.cache.atomic import atomic_directory
from heteroflow.cache.errors import DatasetError
from heteroflow.cache.locations import home_dir
from heteroflow.components.data.formats import REGISTRY, TABLE

if TYPE_CHECKING:  # numpy and pandas are imported where they are used: pipeline definitions import the steps
    import numpy as np
    import pandas as pd

__all__ = [
    "DELIMITERS",
    "MISSING_MARKERS",
    "SUPPORTED_SUFFIXES",
    "ColumnKind",
    "CsvFormat",
    "RawTable",
    "clean_column",
    "data_files",
    "digits_source_dir",
    "export_digits",
    "read_table",
    "sniff_csv",
    "text_cells",
]



def __getattr__(name: str) -> Any:
    """``SUPPORTED_SUFFIXES``: the table readers' suffixes, asked of the reader registry each time (readers
    registered later included); kept for callers of the earlier constant."""
    if name == "SUPPORTED_SUFFIXES":
        return REGISTRY.suffixes(TABLE)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


MISSING_MARKERS = ("", "NA", "N/A", "n/a", "NaN", "nan", "NAN", "-nan", "null", "NULL", "?", "#N/A")
"""Cell texts read as a missing value, after the spaces around a cell are removed (so ``" ?"``, as the UCI
adult census data writes it, is missing too). ``None`` is not among them: it is a real category in many
tables."""

DELIMITERS = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe"}
"""The delimiters :func:`sniff_csv` tries, with their names (the ``delimiter`` parameter takes either)."""

ColumnKind = Literal["number", "text", "bool", "other"]

_SAMPLE_BYTES = 1 << 16
_SAMPLE_ROWS = 500
_NUMBER = re.compile(r"^[+-]?(\d+([.,]\d*)?|[.,]\d+)([eE][+-]?\d+)?$")
_DOT_DECIMAL = re.compile(r"^[+-]?\d*\.\d+([eE][+-]?\d+)?$")
_COMMA_DECIMAL = re.compile(r"^[+-]?\d+,\d+$")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CsvFormat:
    """How one text table is read, and why.

    Attributes:
        delimiter: ``,`` ``;`` ``\\t`` or ``|``.
        encoding: the Python codec: ``utf-8``, ``utf-8-sig`` (UTF-8 with a byte-order mark), ``utf-16`` or
            ``latin-1``.
        header: whether the first row names the columns.
        decimal: the decimal mark of numbers, ``.`` or ``,``.
        reasons: why each of ``delimiter``, ``encoding``, ``header`` and ``decimal`` was chosen.
        columns: the number of columns most sampled rows have (0: not known).
        trailing_delimiter: rows may end with the delimiter (``a;b;c;``, as some exports write): the empty
            field after the last column is not a column.
        header_names: the header row's cells (stripped; empty without a header).
    """

    delimiter: str
    encoding: str
    header: bool
    decimal: str
    reasons: dict[str, str]
    columns: int = 0
    trailing_delimiter: bool = False
    header_names: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        facts = {
            "delimiter": DELIMITERS.get(self.delimiter, self.delimiter),
            "encoding": self.encoding,
            "header": self.header,
            "decimal": self.decimal,
            "reasons": dict(self.reasons),
        }
        if self.trailing_delimiter:
            facts["trailing_delimiter"] = True
        return facts


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RawTable:
    """One file read and cleaned, every column kept.

    Attributes:
        frame: the cells, one column per file column (cleaned by :func:`clean_column`); the index is the
            data row's position in the file (0 = first row after any header), with blank rows removed.
        kinds: each column's :data:`ColumnKind`.
        source: the file.
        format: ``csv``, ``parquet`` or ``npz``.
        csv: how a text table was read (None for the other formats).
        named: whether the column names come from the file (a header, Parquet, or the class column of an
            .npz) rather than being made up (``column_1`` ... for a header-less CSV, ``x0`` ... for .npz).
        blank_rows: blank rows skipped.
    """

    frame: pd.DataFrame
    kinds: dict[str, ColumnKind]
    source: str
    format: str
    csv: CsvFormat | None
    named: bool
    blank_rows: int

    def where(self, position: int) -> str:
        """A data row's place in its file, for messages: ``name.csv line 12`` or ``name.parquet row 11``."""
        name = Path(self.source).name
        if self.csv is not None:
            return f"{name} line {position + 1 + int(self.csv.header)}"
        return f"{name} row {position + 1}"

    def describe(self) -> dict[str, Any]:
        """The reading decisions as JSON-ready facts (for the data report)."""
        facts: dict[str, Any] = {"path": self.source, "format": self.format, "rows": int(len(self.frame))}
        if self.csv is not None:
            facts.update(self.csv.to_dict())
        if self.blank_rows:
            facts["blank_rows_skipped"] = self.blank_rows
        return facts


def data_files(paths: Sequence[str | os.PathLike[str]], *, where: str) -> list[Path]:
    """Keep the files some table reader reads (:mod:`heteroflow.components.data.formats`), sorted.

    Raises:
        DatasetError: none of ``paths`` is in a supported format (names ``where``).
    """
    keep = sorted(Path(p) for p in paths if REGISTRY.is_data_file(str(p), TABLE))
    if not keep:
        raise DatasetError(f"data set {where} has no .csv, .tsv, .parquet or .npz file; {REGISTRY.formats_help()}")
    return keep


# --- cleaning cells -----------------------------------------------------------------------------------------


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
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    if len(uniques) and not all(isinstance(u, str) for u in uniques):
        if any(isinstance(u, (list, dict, tuple, bytes)) for u in uniques):
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


# --- CSV sniffing --------------------------------------------------------------------------------------------


def _decode_sample(raw: bytes, *, whole: bool, path: Path) -> tuple[str, str, str]:
    """The sample as text (ending at a line end unless ``whole``), the codec, and why that codec."""
    if raw.startswith(codecs.BOM_UTF8):
        encoding, reason = "utf-8-sig", "UTF-8 with a byte-order mark (removed)"
    elif raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        encoding, reason = "utf-16", "UTF-16 (byte-order mark)"
    else:
        encoding, reason = "utf-8", "UTF-8 (no byte-order mark)"
    try:
        text = codecs.getincrementaldecoder(encoding)().decode(raw, final=whole)
    except UnicodeDecodeError as exc:
        if encoding != "utf-8":
            raise DatasetError(f"{path}: starts with a {reason} byte-order mark but is not valid {encoding}") from None
        encoding = "latin-1"
        reason = f"Latin-1: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        text = raw.decode("latin-1")
    if not whole:
        cut = max(text.rfind("\n"), text.rfind("\r"))
        text = text[: cut + 1] if cut >= 0 else text
    return text, encoding, reason


def _rows(text: str, delimiter: str) -> list[list[str]]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    rows = []
    try:
        for row in reader:
            if row and any(c.strip() for c in row):
                rows.append(row)
            if len(rows) >= _SAMPLE_ROWS:
                break
    except csv.Error:  # an unterminated quote at the sample's end: keep what was parsed
        pass
    return rows


def _is_number(cell: str, decimal: str) -> bool:
    cell = cell.strip()
    if not _NUMBER.match(cell):
        return False
    return decimal == "," or "," not in cell


def _widths(rows: list[list[str]]) -> tuple[int, int, bool]:
    """The number of columns most rows have, how many rows have it, and whether rows end with the delimiter.

    A row that ends in an empty field counts for both its width and one less (``a;b;c;`` is 3 columns and an
    optional trailing delimiter, or 4 with an empty last cell); ties go to the narrower width, as a last column
    empty in every row (and unnamed) is a trailing delimiter."""
    counts: Counter[int] = Counter()
    for r in rows:
        counts[len(r)] += 1
        if len(r) > 1 and not r[-1].strip():
            counts[len(r) - 1] += 1
    width, hits = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))
    trailing = width > 1 and any(len(r) == width + 1 and not r[-1].strip() for r in rows)
    return width, hits, trailing


def _choose_delimiter(text: str) -> tuple[str, list[list[str]], str]:
    scored = []
    for d in DELIMITERS:
        rows = _rows(text, d)
        if not rows:
            continue
        modal, hits, _ = _widths(rows)
        if modal < 2:
            continue
        cells = [c for r in rows for c in r]
        numeric = sum(_is_number(c, ",") for c in cells) / max(len(cells), 1)
        scored.append(((round(hits / len(rows), 2), round(numeric, 2), modal), d, rows))
    if not scored:
        rows = _rows(text, ",")
        return ",", rows, "no delimiter (, ; tab |) splits the first lines into 2 or more columns"
    scored.sort(key=lambda s: s[0], reverse=True)
    (consistency, _, modal), d, rows = scored[0]
    others = ", ".join(f"{DELIMITERS[s[1]]}: {s[0][2]}" for s in scored[1:])
    reason = f"{DELIMITERS[d]}: {modal} columns on {consistency:.0%} of the first {len(rows)} rows"
    return d, rows, reason + (f" (also tried {others} columns)" if others else "")


def _choose_decimal(rows: list[list[str]], delimiter: str) -> tuple[str, str]:
    if delimiter == ",":
        return ".", "'.': the delimiter is a comma"
    cells = [c.strip() for r in rows for c in r]
    comma = sum(bool(_COMMA_DECIMAL.match(c)) for c in cells)
    dot = sum(bool(_DOT_DECIMAL.match(c)) for c in cells)
    if comma and not dot:
        return ",", f"',': numbers in the first rows are written like {next(c for c in cells if _COMMA_DECIMAL.match(c))!r}"
    return ".", "'.'"


def _is_missing(cell: str) -> bool:
    return cell.strip() in MISSING_MARKERS


def _choose_header(rows: list[list[str]], decimal: str) -> tuple[bool, str]:
    first, body = rows[0], rows[1:]
    width = len(first)
    if not body:
        texts = [c for c in first if not _is_missing(c) and not _is_number(c, decimal)]
        return bool(texts), "one row only" + (": it holds text, read as the header" if texts else "")
    numeric_cols = []
    for j in range(width):
        values = [r[j] for r in body if j < len(r) and not _is_missing(r[j])]
        if values and sum(_is_number(v, decimal) for v in values) >= 0.9 * len(values):
            numeric_cols.append(j)
    if numeric_cols:
        text_over_numbers = [first[j].strip() for j in numeric_cols if not _is_missing(first[j]) and not _is_number(first[j], decimal)]
        if text_over_numbers:
            return True, f"the first row holds text ({', '.join(repr(t) for t in text_over_numbers[:3])}) above numeric columns"
        return False, "the first row holds numbers where the rows below hold numbers"
    cells = [c.strip() for c in first]
    below = [{r[j].strip() for r in body if j < len(r)} for j in range(width)]
    repeated = [c for j, c in enumerate(cells) if c in below[j]]
    if all(cells) and len(set(cells)) == len(cells) and not repeated:
        return True, "a table of text: the first row's cells are distinct and occur nowhere below"
    why = f"{repeated[0]!r} occurs again below" if repeated else "its cells are not distinct names"
    return False, f"a table of text whose first row is data ({why})"


def sniff_csv(
    path: str | os.PathLike[str], *, header: str = "auto", delimiter: str = "auto"
) -> CsvFormat:
    """Decide how to read a text table from its first 64 KiB (see the module docstring for the rules).

    Args:
        path: the file.
        header: ``auto``, ``true`` or ``false``.
        delimiter: ``auto``, or one of ``,`` ``;`` ``|`` ``\\t`` (also ``tab``, ``comma``, ``semicolon``,
            ``pipe``).

    Returns:
        A :class:`CsvFormat` with the reason for each decision.

    Raises:
        DatasetError: the file is empty, or starts with a byte-order mark its content does not match.
    """
    p = Path(path)
    with open(p, "rb") as fh:
        raw = fh.read(_SAMPLE_BYTES + 1)
    whole = len(raw) <= _SAMPLE_BYTES
    raw = raw[:_SAMPLE_BYTES]
    text, encoding, encoding_reason = _decode_sample(raw, whole=whole, path=p)
    if not text.strip():
        raise DatasetError(f"{p}: empty file; expected a table (a header row, then one sample per row)")
    if delimiter == "auto":
        delim, rows, delimiter_reason = _choose_delimiter(text)
    else:
        delim = _delimiter_char(delimiter)
        rows, delimiter_reason = _rows(text, delim), f"delimiter={delimiter!r}"
    width, _, trailing = _widths(rows) if rows else (0, 0, False)
    if rows and width < 2:
        raise DatasetError(_one_column(p, text, rows, delim, delimiter_reason, given=delimiter != "auto"))
    if trailing:
        delimiter_reason += f"; rows may end with a {DELIMITERS[delim]} (an empty field after the last column, ignored)"
    decimal, decimal_reason = _choose_decimal(rows, delim)
    if header == "auto":
        has_header, header_reason = _choose_header(rows, decimal) if rows else (False, "no rows")
    else:
        has_header, header_reason = header == "true", f"header={header}"
    return CsvFormat(
        delimiter=delim,
        encoding=encoding,
        header=has_header,
        decimal=decimal,
        reasons={"delimiter": delimiter_reason, "encoding": encoding_reason, "header": header_reason, "decimal": decimal_reason},
        columns=width,
        trailing_delimiter=trailing,
        header_names=tuple(c.strip() for c in rows[0]) if has_header and rows else (),
    )


_UNQUOTE = (
    "python -c \"import csv, sys; [print(r[0]) for r in csv.reader(open(sys.argv[1], newline=''))]\" {name} > unquoted.csv"
)


def _one_column(p: Path, text: str, rows: list[list[str]], delim: str, reason: str, *, given: bool) -> str:
    """Why the sampled lines split into one column, and what would read them."""
    lines = [line for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else ""
    shown = first if len(first) <= 60 else first[:57] + "..."
    quoted = bool(lines) and all(len(r) == 1 for r in rows) and all(
        line.strip().startswith('"') and line.strip().endswith('"') for line in lines[:_SAMPLE_ROWS]
    )
    if quoted:
        inner = "\n".join(r[0] for r in rows)
        d, inner_rows, _ = _choose_delimiter(inner)
        width = _widths(inner_rows)[0] if inner_rows else 1
        if width >= 2:
            return (
                f"{p}: found 1 column: every line is one quoted field (line 1: {shown!r}), so no delimiter can split "
                f"it; inside the quotes, {DELIMITERS[d]} splits the lines into {width} columns: the table was quoted a "
                f"second time (as a spreadsheet saves a table pasted into one column). Remove the outer quotes to read "
                f"it: {_UNQUOTE.format(name=p.name)}"
            )
        return f"{p}: found 1 column: every line is one quoted field (line 1: {shown!r}), and no delimiter splits the text inside"
    if given:
        d, other_rows, _ = _choose_delimiter(text)
        width = _widths(other_rows)[0] if other_rows else 1
        if width >= 2:
            return (
                f"{p}: found 1 column ({reason} splits no sampled line, line 1: {shown!r}); {DELIMITERS[d]} splits "
                f"the lines into {width} columns: set delimiter={'tab' if d == chr(9) else d}"
            )
    return (
        f"{p}: found 1 column ({reason}); a table needs feature columns and a class column. If the file uses "
        "another delimiter, set delimiter (one of , ; tab |)"
    )


def _delimiter_char(delimiter: str) -> str:
    by_name = {name: d for d, name in DELIMITERS.items()}
    if delimiter in DELIMITERS:
        return delimiter
    if delimiter in by_name:
        return by_name[delimiter]
    if delimiter == "\\t":
        return "\t"
    raise DatasetError(f"delimiter={delimiter!r} is not supported; valid: auto, ',', ';', tab, '|'")


# --- reading -------------------------------------------------------------------------------------------------


def read_table(path: str | os.PathLike[str], *, header: str = "auto", delimiter: str = "auto") -> RawTable:
    """Read one table file with the table reader registered for its suffix (:mod:`heteroflow.components.data.formats`:
    .csv/.tsv, .parquet, .npz, or a third party's) and clean its cells (:func:`clean_column`).

    Args:
        path: the file.
        header: for text tables: ``auto`` (detect), ``true`` or ``false``.
        delimiter: for text tables: ``auto`` (detect) or the delimiter.

    Returns:
        A :class:`RawTable` with every column of the file.

    Raises:
        DatasetError: unsupported suffix (:class:`~heteroflow.components.data.formats.UnknownFormat`, listing the
            registered readers), an unreadable or malformed file (the message names the file, and
            for a text table the line and the delimiter in use), or no rows.
    """
    p = Path(path)
    return REGISTRY.for_path(p, kind=TABLE).read(p, header=header, delimiter=delimiter)


def _read_csv(p: Path, *, header: str, delimiter: str) -> RawTable:
    import numpy as np
    import pandas as pd

    fmt = sniff_csv(p, header=header, delimiter=delimiter)
    kwargs: dict[str, Any] = dict(
        sep=fmt.delimiter,
        header=0 if fmt.header else None,
        decimal=fmt.decimal,
        na_values=list(MISSING_MARKERS),
        keep_default_na=False,
        skip_blank_lines=False,
        engine="c",
        index_col=False,  # never the first column as the index when a row has one field more than the header
    )
    if fmt.trailing_delimiter:  # the field after the last column is read as a column of its own, checked empty
        names = list(fmt.header_names[: fmt.columns]) if fmt.header else [f"column_{j + 1}" for j in range(fmt.columns)]
        _check_header_names(p, names)
        kwargs["names"] = [*names, _TRAILING]
    try:
        frame = _read_csv_frame(p, fmt.encoding, kwargs)
    except UnicodeDecodeError as exc:
        if fmt.encoding != "utf-8":
            raise DatasetError(f"{p}: not valid {fmt.encoding} ({exc.reason} at byte {exc.start})") from None
        reason = f"Latin-1: not valid UTF-8 beyond the first 64 KiB ({exc.reason})"
        fmt = dataclasses.replace(fmt, encoding="latin-1", reasons={**fmt.reasons, "encoding": reason})
        frame = _read_csv_frame(p, fmt.encoding, kwargs)
    if _TRAILING in frame.columns:
        extra = frame.pop(_TRAILING)
        filled = extra.notna().to_numpy() & (extra.astype(str).str.strip() != "").to_numpy()
        if filled.any():
            k = int(np.flatnonzero(filled)[0])
            raise DatasetError(
                f"{p}: line {k + 1 + int(fmt.header)} has a field after the last of the {fmt.columns} columns "
                f"({extra.iloc[k]!r}); rows may end with a {DELIMITERS[fmt.delimiter]} but hold no more fields: "
                "fix that line, or give every column a name in the header"
            )
    if fmt.header:
        frame.columns = [str(c).strip() for c in frame.columns]
        if frame.columns.duplicated().any():
            dup = frame.columns[frame.columns.duplicated()][0]
            raise DatasetError(f"{p}: the header names column {dup!r} twice; give each column its own name")
    else:
        frame.columns = [f"column_{j + 1}" for j in range(frame.shape[1])]
    if frame.shape[1] < 2:  # the sampled rows split into columns, but the header row does not
        name = DELIMITERS[fmt.delimiter]
        raise DatasetError(
            f"{p}: found 1 column: the header row {str(frame.columns[0])[:60]!r} holds no {name}, while {name} splits "
            f"the rows below into {fmt.columns} columns ({fmt.reasons['delimiter']}); set delimiter to the one the header "
            "uses (one of , ; tab |), or header=false if the file has no header"
        )
    mixed = [c for c in frame.columns if frame[c].dtype == object and _mixed_types(frame[c])]
    if mixed:  # pandas typed parts of the file differently (chunked inference): read those columns as text
        frame[mixed] = _read_csv_frame(p, fmt.encoding, {**kwargs, "dtype": str, "usecols": _positions(frame, mixed)}).to_numpy()
    cleaned, kinds = _clean_frame(frame, decimal=fmt.decimal)
    blank = np.ones(len(cleaned), dtype=bool)
    for name in cleaned.columns:  # a row is blank when every cell is missing; most tables stop at column 1
        blank &= cleaned[name].isna().to_numpy()
        if not blank.any():
            break
    if blank.any():
        cleaned = cleaned[~blank]
    if cleaned.empty:
        raise DatasetError(f"{p}: no data rows ({fmt.reasons['header']})")
    return RawTable(frame=cleaned, kinds=kinds, source=str(p), format="csv", csv=fmt, named=fmt.header, blank_rows=int(blank.sum()))


_TRAILING = "\x00trailing"  # the name given to the empty field after a trailing delimiter (no real header has it)


def _check_header_names(p: Path, names: list[str]) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise DatasetError(f"{p}: the header names column {name!r} twice; give each column its own name")
        seen.add(name)


def _positions(frame: pd.DataFrame, columns: list[str]) -> list[int]:
    return [list(frame.columns).index(c) for c in columns]


def _mixed_types(column: pd.Series) -> bool:
    import pandas as pd

    kinds = {type(v) for v in pd.unique(column.dropna())[:10_000]}
    return len(kinds) > 1


def _read_csv_frame(p: Path, encoding: str, kwargs: dict[str, Any]) -> pd.DataFrame:
    import pandas as pd

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("ignore", pd.errors.DtypeWarning)
            warnings.simplefilter("always", pd.errors.ParserWarning)
            frame = pd.read_csv(p, encoding=encoding, **kwargs)
        for w in caught:
            if issubclass(w.category, pd.errors.ParserWarning) and "does not match length of data" in str(w.message):
                # index_col=False: pandas dropped the last field of rows one field longer than the header
                name = DELIMITERS.get(kwargs["sep"], kwargs["sep"])
                raise DatasetError(
                    f"{p}: the header row names {len(frame.columns)} column(s) but the rows below have more fields "
                    f"(columns split by {name}); give every column a name in the header, set delimiter to the one the "
                    "header uses, or header=false if the file has no header"
                )
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return frame
    except pd.errors.EmptyDataError:
        raise DatasetError(f"{p}: empty file; expected a table (a header row, then one sample per row)") from None
    except pd.errors.ParserError as exc:
        name = DELIMITERS.get(kwargs["sep"], kwargs["sep"])
        raise DatasetError(
            f"{p}: {str(exc).strip().removeprefix('Error tokenizing data. C error: ')} (columns split by {name}; "
            "a field that holds the delimiter must be in double quotes, or set delimiter)"
        ) from None


def _read_parquet(p: Path) -> RawTable:
    import pandas as pd

    try:
        frame = pd.read_parquet(p)
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{p}: not a readable Parquet file ({exc})") from None
    frame = frame.reset_index(drop=True)
    frame.columns = [str(c).strip() for c in frame.columns]
    cleaned, kinds = _clean_frame(frame)
    if cleaned.empty:
        raise DatasetError(f"{p}: no rows")
    return RawTable(frame=cleaned, kinds=kinds, source=str(p), format="parquet", csv=None, named=True, blank_rows=0)


def _read_npz(p: Path) -> RawTable:
    import numpy as np
    import pandas as pd

    try:
        with np.load(p, allow_pickle=False) as data:
            xkey = next((k for k in ("x", "X", "features") if k in data), None)
            ykey = next((k for k in ("y", "labels") if k in data), None)
            if xkey is None or ykey is None:
                raise DatasetError(f"{p}: .npz needs arrays 'x' and 'y' (found: {', '.join(data.files) or 'none'})")
            x = np.asarray(data[xkey])
            y = np.asarray(data[ykey])
    except DatasetError:
        raise
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{p}: not a readable .npz file ({exc})") from None
    if x.ndim < 1 or len(x) == 0:
        raise DatasetError(f"{p}: array {xkey!r} holds no samples")
    if y.shape != (len(x),):
        raise DatasetError(f"{p}: 'y' has shape {y.shape}, expected ({len(x)},) to match {xkey!r}")
    try:
        features = x.reshape(len(x), -1).astype(np.float64)
    except (ValueError, TypeError):
        raise DatasetError(f"{p}: array {xkey!r} is not numeric (dtype {x.dtype})") from None
    frame = pd.DataFrame(features, columns=[f"x{j}" for j in range(features.shape[1])])
    label, label_kind = clean_column(pd.Series(y))
    frame["label"] = label.to_numpy()
    kinds: dict[str, ColumnKind] = {c: "number" for c in frame.columns[:-1]}
    kinds["label"] = label_kind
    return RawTable(frame=frame, kinds=kinds, source=str(p), format="npz", csv=None, named=False, blank_rows=0)


# --- the built-in sample: scikit-learn's handwritten digits -------------------------------------------------

_DIGITS_PARTS = 4
_DIGITS_SOURCE_NOTE = """\
# Handwritten digits (scikit-learn `load_digits`)

1,797 grey-level 8x8 images of the digits 0-9 (64 features, values 0-16), the test part of the UCI
"Optical Recognition of Handwritten Digits" data set (Alpaydin and Kaynak, 1998; CC BY 4.0), as shipped
inside scikit-learn. Exported by heteroflow as CSV: columns pixel_0..pixel_63, then label.
"""


def digits_source_dir() -> Path:
    """Where the digits sample is exported: ``<heteroflow home>/datasets/digits``."""
    return home_dir() / "datasets" / "digits"


def export_digits(dest: str | os.PathLike[str] | None = None) -> Path:
    """Export scikit-learn's digits (1,797 samples, 64 features, 10 classes) as CSV files, once.

    Writes ``digits-part-{0..3}.csv`` and ``SOURCE.md`` into a temporary folder and renames it into place,
    so ``dest`` is either absent or complete. A complete export is left as is.

    Args:
        dest: target folder; default :func:`digits_source_dir`.

    Returns:
        The folder.
    """
    import numpy as np

    target = Path(dest) if dest is not None else digits_source_dir()
    marker = target / "export.json"
    if marker.is_file():
        return target
    from sklearn.datasets import load_digits  # imported only to export (it takes about a second)

    bunch = load_digits()
    x, y = bunch.data.astype(np.int64), bunch.target.astype(np.int64)
    # a folder left by an interrupted export (no export.json) is replaced as a whole
    with atomic_directory(target) as tmp:
        header = [f"pixel_{i}" for i in range(x.shape[1])] + ["label"]
        for part, idx in enumerate(np.array_split(np.arange(len(x)), _DIGITS_PARTS)):
            with open(tmp / f"digits-part-{part}.csv", "w", newline="", encoding="utf-8") as fh:
                writer = csv.writer(fh)
                writer.writerow(header)
                for i in idx:
                    writer.writerow([*x[i].tolist(), int(y[i])])
        (tmp / "SOURCE.md").write_text(_DIGITS_SOURCE_NOTE, encoding="utf-8")
        (tmp / "export.json").write_text(
            json.dumps({"samples": int(len(x)), "features": int(x.shape[1]), "classes": 10}), encoding="utf-8"
        )
    return target
