"""How a text table (``.csv`` / ``.tsv``) is read, decided from its first 64 KiB: :func:`sniff_csv` and the
:class:`CsvFormat` it returns, each decision with its reason (encoding, delimiter, decimal mark, header; the
rules are in the docstring of :mod:`heteroflow.components.data.datasets`, which reads the table with them).
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import io
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from heteroflow.cache.errors import DatasetError
from heteroflow.components.data.cells import MISSING_MARKERS

__all__ = ["DELIMITERS", "CsvFormat", "file_not_text", "not_text", "sniff_csv"]

DELIMITERS = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe"}
"""The delimiters :func:`sniff_csv` tries, with their names (the ``delimiter`` parameter takes either)."""

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


_BINARY_BLOCK = 8000
"""Bytes looked at for a NUL, as git's ``buffer_is_binary`` does (text in any 8-bit or UTF-8 encoding has none)."""

_SIGNATURES = (
    (b"PK\x03\x04", "a zip archive", "an Excel .xlsx workbook is one: save it as CSV"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an Office file", "an Excel .xls workbook is one: save it as CSV"),
    (b"\x1f\x8b", "a gzip file", "decompress it first: gunzip"),
    (b"BZh", "a bzip2 file", "decompress it first: bunzip2"),
    (b"\xfd7zXZ\x00", "an xz file", "decompress it first: unxz"),
    (b"\x28\xb5\x2f\xfd", "a zstd file", "decompress it first: unzstd"),
    (b"PAR1", "a Parquet file", "name it .parquet to read it"),
    (b"\x93NUMPY", "a NumPy .npy array", ""),
    (b"SQLite format 3\x00", "an SQLite database", ""),
    (b"%PDF-", "a PDF document", ""),
    (b"\x89PNG", "a PNG image", ""),
    (b"\xff\xd8\xff", "a JPEG image", ""),
)
"""The first bytes of binary files a table is often mistaken for: (signature, what the file is, what to do)."""


def not_text(raw: bytes) -> str | None:
    """Why ``raw`` (a file's first bytes) is not a text table, or None when it may be one: a binary file's known
    signature (zip/xlsx, gzip, Parquet, ...), else a NUL byte in the first 8000 bytes, as ``file`` and git decide
    a file is binary. UTF-16 with a byte-order mark is text (its NULs are half its characters)."""
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return None
    for magic, what, todo in _SIGNATURES:
        if raw.startswith(magic):
            return f"it starts as {what} does" + (f" ({todo})" if todo else "")
    nul = raw.find(b"\x00", 0, _BINARY_BLOCK)
    if nul >= 0:
        return (f"it holds a NUL byte (at byte {nul}), as binary files do (UTF-16 text without a byte-order mark "
                "does too: save it as UTF-8)")
    return None


def file_not_text(path: str | os.PathLike[str]) -> str | None:
    """:func:`not_text` of the file's first block; None also for a file that cannot be read (its reader says why)."""
    try:
        with open(path, "rb") as fh:
            return not_text(fh.read(_BINARY_BLOCK))
    except OSError:
        return None


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
        cells = Counter(c for r in rows for c in r)  # each distinct cell checked once
        numeric = sum(k for c, k in cells.items() if _is_number(c, ",")) / max(cells.total(), 1)
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
    cells = list(dict.fromkeys(c.strip() for r in rows for c in r))  # each distinct cell once (only presence counts)
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
        values = Counter(r[j] for r in body if j < len(r))  # each distinct cell checked once
        present = {v: k for v, k in values.items() if not _is_missing(v)}
        total = sum(present.values())
        if total and sum(k for v, k in present.items() if _is_number(v, decimal)) >= 0.9 * total:
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
        DatasetError: the file is empty, is not text (:func:`not_text`: a binary file's signature or a NUL byte),
            or starts with a byte-order mark its content does not match.
    """
    p = Path(path)
    with open(p, "rb") as fh:
        raw = fh.read(_SAMPLE_BYTES + 1)
    whole = len(raw) <= _SAMPLE_BYTES
    raw = raw[:_SAMPLE_BYTES]
    binary = not_text(raw)
    if binary:  # pandas read it as text anyway: "Expected 1 fields in line 3, saw 2 (columns split by comma ...)"
        raise DatasetError(f"{p}: not a text table: {binary}; a {p.suffix or 'text table'} file must be text (a header "
                           "row, then one sample per row)")
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
