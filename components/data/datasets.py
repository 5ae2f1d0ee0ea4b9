"""Reading tables (CSV, Parquet, .npz) with every reading decision recorded, and the built-in sample data set.

A data set folder holds one or more files in these formats (files in other formats, e.g. a README, are
ignored):

- ``.csv`` / ``.tsv``: text tables, parsed by :func:`pyarrow.csv.read_csv` where the file allows it
  (:mod:`heteroflow.components.data.arrowcsv`), else by :func:`pandas.read_csv` (its C engine). Per file, from the first
  64 KiB (:func:`sniff_csv`; each decision and its reason is kept in :class:`CsvFormat`):

  - *encoding*: UTF-8 with or without a byte-order mark (the mark is removed, as spreadsheet programs write
    one); UTF-16 with a byte-order mark; a file that is not valid UTF-8 is read as Latin-1 (every byte is a
    character) and the decision says so.
  - *delimiter*: ``,`` ``;`` tab or ``|``: the one that splits the sampled lines into the same number (>= 2)
    of columns most consistently; ties go to the split whose cells look most like numbers, then to the most
    columns. Rows may end with the delimiter (``a;b;c;``, as some exports write, on some rows or all, also
    only past the sample, which the delimiter decision then names): the
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

Where the parts live: cleaning cells in :mod:`heteroflow.components.data.cells`; deciding how a text table is
read (:func:`sniff_csv`, :class:`CsvFormat`) in :mod:`heteroflow.components.data.csvformat`. This module reads
the files (:func:`read_table`) and exports the built-in sample; every name above is still importable from here.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heteroflow.cache.atomic import atomic_directory
from heteroflow.cache.errors import DatasetError
from heteroflow.cache.locations import home_dir
from heteroflow.components.data.cells import MISSING_MARKERS, ColumnKind, _clean_frame, clean_column, text_cells
from heteroflow.components.data.csvformat import DELIMITERS, CsvFormat, sniff_csv
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
        hint = REGISTRY.misnamed(paths)
        raise DatasetError(
            f"data set {where} has no .csv, .tsv, .parquet or .npz file; {hint + '; ' if hint else ''}{REGISTRY.formats_help()}"
        )
    return keep


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
    if fmt.trailing_delimiter:
        _expect_trailing(p, fmt, kwargs)
    from heteroflow.components.data import arrowcsv

    try:
        fast = arrowcsv.read(p, fmt)  # pyarrow's reader where the file allows it (#32), else pandas' below
        frame, fmt = (fast, fmt) if fast is not None else _read_csv_decoded(p, fmt, kwargs)
    except _OneFieldMore as more:  # a row ends with the delimiter beyond the sample (or sniffing missed it)
        if fmt.trailing_delimiter or more.saw != fmt.columns + 1:
            raise more.error from None
        reason = f"; line {more.line} ends with a {DELIMITERS[fmt.delimiter]} (an empty field after the last column, ignored)"
        fmt = dataclasses.replace(
            fmt, trailing_delimiter=True, reasons={**fmt.reasons, "delimiter": fmt.reasons["delimiter"] + reason}
        )
        _expect_trailing(p, fmt, kwargs)
        try:
            frame, fmt = _read_csv_decoded(p, fmt, kwargs)
        except _OneFieldMore as again:
            raise again.error from None
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
        # the header row as written: pandas renames a repeated name ('a', 'a' -> 'a', 'a.1'), so only names that
        # differ by spaces were caught, and 'a,a,label' trained on 'a' and 'a.1'
        written = [n for n in fmt.header_names if n] or list(frame.columns)
        dups = [n for i, n in enumerate(written) if n in written[:i]] or list(frame.columns[frame.columns.duplicated()])
        if dups:
            dup = dups[0]
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


def _expect_trailing(p: Path, fmt: CsvFormat, kwargs: dict[str, Any]) -> None:
    """Read the field after the last column as a column of its own (checked empty after reading).

    The header row, when there is one, is skipped rather than read (``header=0``): pandas' C parser takes the
    number of fields to expect from the header row, so a header without the trailing delimiter made every later
    row that has one "Expected 3 fields in line 3, saw 4" unless the first data row had one too."""
    names = list(fmt.header_names[: fmt.columns]) if fmt.header else [f"column_{j + 1}" for j in range(fmt.columns)]
    _check_header_names(p, names)
    kwargs["names"] = [*names, _TRAILING]
    if fmt.header:
        kwargs["header"], kwargs["skiprows"] = None, 1


class _OneFieldMore(Exception):
    """pandas found a row with more fields than the rows before it (``error``: the message for the user)."""

    def __init__(self, error: DatasetError, *, line: int, saw: int) -> None:
        super().__init__(str(error))
        self.error, self.line, self.saw = error, line, saw


_MORE_FIELDS = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")


def _read_csv_decoded(p: Path, fmt: CsvFormat, kwargs: dict[str, Any]) -> tuple[pd.DataFrame, CsvFormat]:
    """The frame, read as ``fmt.encoding`` says, or as Latin-1 when the file is not UTF-8 beyond the sample."""
    try:
        return _read_csv_frame(p, fmt.encoding, kwargs), fmt
    except UnicodeDecodeError as exc:
        if fmt.encoding != "utf-8":
            raise DatasetError(f"{p}: not valid {fmt.encoding} ({exc.reason} at byte {exc.start})") from None
        reason = f"Latin-1: not valid UTF-8 beyond the first 64 KiB ({exc.reason})"
        fmt = dataclasses.replace(fmt, encoding="latin-1", reasons={**fmt.reasons, "encoding": reason})
        return _read_csv_frame(p, fmt.encoding, kwargs), fmt


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
        error = DatasetError(
            f"{p}: {str(exc).strip().removeprefix('Error tokenizing data. C error: ')} (columns split by {name}; "
            "a field that holds the delimiter must be in double quotes, or set delimiter)"
        )
        more = _MORE_FIELDS.search(str(exc))
        if more:
            raise _OneFieldMore(error, line=int(more.group(2)), saw=int(more.group(3))) from None
        raise error from None


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
