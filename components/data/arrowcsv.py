"""Reading a text table with pyarrow's CSV reader (multi-threaded, typed while parsing), where the file allows
it, into the frame :func:`pandas.read_csv` gives for it with the options of
:func:`heteroflow.components.data.datasets._read_csv` (issue #32 item 1).

:func:`read` returns None (the caller reads the file with pandas, as before) for what it does not read the way
pandas does: an encoding other than UTF-8, a decimal comma, rows that end with the delimiter, a header with an
empty or repeated name, and any file pyarrow refuses (rows of other widths, bytes that are not UTF-8): pandas
reads those, or words the error, naming the line. Quoted fields may hold line ends and delimiters (when the
first 64 KiB hold a quote; a file whose first quote comes later and holds a line end is split into blocks inside
that field, which pyarrow refuses, and pandas reads it: ``tests/test_preprocess_fast.py``); a blank line is a row of missing cells, as pandas reads it (the
reader then counts and drops it).

How the frame is made the same:

- missing: the cells in :data:`~heteroflow.components.data.cells.MISSING_MARKERS` exactly (as pandas' ``na_values``
  with ``keep_default_na=False``); quoted ones too;
- true/false: ``True``/``TRUE``/``true`` and ``False``/``FALSE``/``false`` only (pyarrow would also take
  ``1``/``0``, which pandas reads as numbers);
- dates, times and timestamps, which pyarrow types and pandas leaves as text: those columns are read again as text;
- numbers written with spaces around them (`` 39``, as the UCI adult census data writes them), which pandas
  parses as numbers: such a text column whose every present cell is a whole number becomes int64 (float64 with
  a gap), and one of numbers float64;
- text columns of few distinct values come dictionary-encoded (a pandas Categorical), the cleaning's own kind.

How it is read (issue #32 item 1: speed and peak memory): every column typed from the file's first
:data:`SAMPLE_BYTES` (typed columns free each parsed block once converted; inferring keeps them all), and, where
every column is a number or a dictionary of text, streamed block by block straight into one numpy array per
column (:func:`_stream`), so that the cells are never held twice (a pyarrow table and the frame made of it). A
later block that does not fit the first one's types sends the file to the whole-table read, which infers each
column's type from every block, as before.

Source of the reader: :func:`pyarrow.csv.read_csv` (Apache Arrow), options in
https://arrow.apache.org/docs/python/generated/pyarrow.csv.ConvertOptions.html
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from heteroflow.components.data.cells import MISSING_MARKERS

if TYPE_CHECKING:
    import pandas as pd

    from heteroflow.components.data.csvformat import CsvFormat

__all__ = ["ENABLED", "read"]

ENABLED = True
"""Read with pyarrow where the file allows (False: always with pandas, the reference the tests compare with)."""

BLOCK_BYTES = 1 << 20
"""Bytes of the file pyarrow parses at a time: with typed columns, about what the reader holds beyond the table
per thread (1 MiB: 144 MB of pyarrow memory at the peak for the benchmark's 135 MB table, 183 MB with 16 MiB
blocks)."""

_TRUE = ["True", "TRUE", "true"]
_FALSE = ["False", "FALSE", "false"]


_PANDAS_ONLY_CELLS = re.compile(
    rb"(?:^|[,;\t|])[ \t]*(?:[+-]?0[xX][0-9A-Fa-f]+|(?!(?:nan|NaN|-nan|-NaN)[ \t]*(?:[,;\t|\r\n]|$))[+-]?[Nn][Aa][Nn])[ \t]*(?=[,;\t|\r\n]|$)",
    re.MULTILINE,
)
"""A cell pyarrow reads as a number and pandas as text: hexadecimal, or NaN spelled other than pandas' nan, NaN,
-nan, -NaN. Looked for in the first 64 KiB (past it, such a cell still reads as pyarrow reads it)."""


def read(path: str | os.PathLike[str], fmt: CsvFormat) -> pd.DataFrame | None:
    """The table at ``path`` as ``pandas.read_csv`` reads it with ``fmt`` (delimiter, header; every column, the
    index the data row's position), or None where it is read with pandas (see the module docstring).

    Raises:
        nothing of its own: a file pyarrow cannot read gives None.
    """
    if not ENABLED or fmt.encoding not in ("utf-8", "utf-8-sig") or fmt.decimal != "." or fmt.trailing_delimiter:
        return None
    if fmt.header and (
        len(set(fmt.header_names)) != len(fmt.header_names) or not all(fmt.header_names)
    ):
        return None
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyarrow import csv

    with open(path, "rb") as fh:  # a quote in the first 64 KiB: fields may hold line ends, which the reader's
        sample = fh.read(1 << 16)
    quoted = b'"' in sample  # splitting into blocks must then respect (about 30% slower)
    if _PANDAS_ONLY_CELLS.search(sample):
        # pyarrow's number parser takes hexadecimal (0x1F) and any spelling of NaN (nAn, +nan), pandas and the
        # archived model's row check neither: such a file is read with pandas, so a column has one kind whichever
        # reader reads it (the fast reader made 0x1F cells a number column, then refused them at prediction)
        return None
    read_options = csv.ReadOptions(use_threads=True, autogenerate_column_names=not fmt.header, block_size=BLOCK_BYTES)
    parse_options = csv.ParseOptions(delimiter=fmt.delimiter, quote_char='"', double_quote=True, escape_char=False,
                                     newlines_in_values=quoted, ignore_empty_lines=False)

    def convert(as_text: dict[str, Any]) -> Any:
        return csv.ConvertOptions(
            null_values=list(MISSING_MARKERS), strings_can_be_null=True, quoted_strings_can_be_null=True,
            true_values=_TRUE, false_values=_FALSE, auto_dict_encode=True, auto_dict_max_cardinality=1024,
            column_types=as_text,
        )

    # The system allocator: pyarrow's default (mimalloc) read the benchmark's table about 2x slower on a 2-core VM
    # (5.8-7.1 s against 2.7-3.7 s, benchmarks/preprocess.py's CSV) and kept more memory after it.
    pool = pa.system_memory_pool()
    try:
        # Typed: each column's type taken from the first block (a typed column's parsed blocks are freed as soon as
        # they are converted, where inferring keeps them to the end: 144 MB of pyarrow memory at the peak for the
        # benchmark's 135 MB table, against 326 MB); a later cell that does not fit the type reads the file again,
        # inferring from every block, as before.
        typed, sampled_rows = _sampled_types(path, read_options, parse_options, convert({}), pool, pa, csv)
        if typed and all(_streamed(kind, pa) for kind in typed.values()):
            # Room for the rows expected from the sample's rows per byte, and 5% more: numpy backs large arrays with
            # huge pages (2 MiB), and room reserved well past the last row would hold one resident per column.
            size = os.path.getsize(path)
            expected = sampled_rows if size <= SAMPLE_BYTES else int(size * sampled_rows / SAMPLE_BYTES)
            frame = _stream(path, fmt, read_options, parse_options, convert(typed), typed, pool, pa, pc, csv,
                            rows=int(expected * 1.05) + 1024)
            if frame is not None:
                return frame
        table = None
        if typed:
            try:
                table = csv.read_csv(path, read_options=read_options, parse_options=parse_options,
                                     convert_options=convert(typed), memory_pool=pool)
            except pa.ArrowInvalid as exc:
                if "conversion error" not in str(exc):
                    return None  # not a matter of types (a row of another width, say): pandas words it
        if table is None:
            table = csv.read_csv(path, read_options=read_options, parse_options=parse_options,
                                 convert_options=convert({}), memory_pool=pool)
        names = table.column_names
        if fmt.header and [n.strip() for n in names] != list(fmt.header_names[: len(names)]):
            return None  # the header row is not the one sniffed (a quoted name, say): pandas decides
        dated = {n: pa.string() for n, t in zip(names, table.schema.types) if not _plain(t, pa)}
        if dated:
            table = csv.read_csv(path, read_options=read_options, parse_options=parse_options,
                                 convert_options=convert(dated), memory_pool=pool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError):
        return None
    columns = {}
    for name, column in zip(table.column_names, table.columns):
        kind = column.type
        if pa.types.is_dictionary(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind):
            column = _as_numbers(column, pa, pc)
        elif pa.types.is_null(kind):
            column = pa.nulls(len(column), pa.float64())  # pandas: a column of missing cells is float64 NaN
        columns[name] = column
    table = pa.table(columns) if len(set(columns)) == len(table.column_names) else None
    columns.clear()  # the table holds the only reference to each column: to_pandas frees each once converted
    if table is None:
        return None
    frame = table.to_pandas(split_blocks=True, self_destruct=True, memory_pool=pool)  # each column freed once converted
    del table
    _trim()
    return frame


SAMPLE_BYTES = 1 << 20
"""Bytes of the file's start whose inferred column types the whole file is read with (see :func:`read`)."""


def _sampled_types(path: Any, read_options: Any, parse_options: Any, convert_options: Any, pool: Any, pa: Any,
                   csv: Any) -> tuple[dict[str, Any], int]:
    """Each column's type as pyarrow infers it from the first :data:`SAMPLE_BYTES` of the file: the types
    :func:`_plain` allows as they are (a dictionary of text as ``dictionary<int32, string>``), any other as text
    (what :func:`read` reads dates and times as); a column with no value there is left out (inferred from the
    whole file); and the sample's rows. Empty when the sample cannot be read (the whole-file read then decides)."""
    sample_options = csv.ReadOptions(use_threads=False, block_size=SAMPLE_BYTES,
                                     autogenerate_column_names=read_options.autogenerate_column_names)
    try:
        reader = csv.open_csv(path, read_options=sample_options, parse_options=parse_options,
                              convert_options=convert_options, memory_pool=pool)
        schema = reader.schema
        try:
            rows = reader.read_next_batch().num_rows
        except StopIteration:
            rows = 0
        reader.close()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError):
        return {}, 0
    if len(set(schema.names)) != len(schema.names):
        return {}, 0
    types = {}
    for name, kind in zip(schema.names, schema.types):
        if pa.types.is_null(kind):
            continue
        if pa.types.is_dictionary(kind):
            types[name] = pa.dictionary(pa.int32(), pa.string())
        else:
            types[name] = kind if _plain(kind, pa) else pa.string()
    return types, rows


def _streamed(kind: Any, pa: Any) -> bool:
    """A type :func:`_stream` reads: numbers (int64, float64) and dictionaries of text."""
    return bool(pa.types.is_int64(kind) or pa.types.is_float64(kind) or pa.types.is_dictionary(kind))


def _grown(array: Any, rows: int, filled: int) -> Any:
    """``array`` with room for ``rows`` (its first ``filled`` entries kept)."""
    import numpy as np

    grown = np.empty(rows, dtype=array.dtype) if array.dtype != bool else np.zeros(rows, dtype=bool)
    grown[:filled] = array[:filled]
    return grown


def _stream(path: Any, fmt: CsvFormat, read_options: Any, parse_options: Any, convert_options: Any,
            typed: dict[str, Any], pool: Any, pa: Any, pc: Any, csv: Any, rows: int) -> pd.DataFrame | None:
    """The frame :func:`read` makes, read block by block (pyarrow's streaming reader, every column typed) straight
    into one numpy array per column (numbers) or one array of dictionary codes (text), so that the file's cells
    are held once: the whole-table read holds the table and the frame made of it at once (issue #32 item 1: 522 MB
    at the peak for the benchmark's 135 MB table, against about 300 MB). Room is reserved for ``rows`` rows (pages
    never written are never resident) and grown when more come. None where a block does not fit (a type not that
    of the first block, a row pyarrow refuses): :func:`read` then reads the whole table as before, and decides.
    """
    import numpy as np
    import pandas as pd

    capacity = max(rows, 1)
    names = list(typed)
    kinds = [typed[n] for n in names]
    numbers: dict[int, np.ndarray] = {}
    gaps: dict[int, np.ndarray] = {}  # int64 columns with a missing cell: where (pandas makes them float64)
    codes: dict[int, np.ndarray] = {}
    values: dict[int, dict[str, int]] = {}
    for j, kind in enumerate(kinds):
        if pa.types.is_dictionary(kind):
            codes[j], values[j] = np.empty(capacity, dtype=np.int32), {}
        else:
            numbers[j] = np.empty(capacity, dtype=np.float64 if pa.types.is_float64(kind) else np.int64)
    def fill(source: Any, options: Any, start: int, limit: int, seen_values: dict[int, dict[str, int]],
             gap_of: dict[int, np.ndarray], grow: bool) -> int:
        """Stream ``source`` into the arrays from row ``start`` (up to ``limit``, else grown where ``grow``, else
        :class:`_NoRoom`, and then freed memory handed back every :data:`TRIM_BLOCKS` blocks); the rows read."""
        nonlocal capacity
        at = start
        blocks = 0
        reader = csv.open_csv(source, read_options=options, parse_options=parse_options,
                              convert_options=convert_options, memory_pool=pool)
        with reader:
            if reader.schema.names != names:
                raise _NotStreamed
            if fmt.header and [n.strip() for n in names] != list(fmt.header_names[: len(names)]):
                raise _NotStreamed
            for batch in reader:
                n = batch.num_rows
                if batch.schema.types != kinds:
                    raise _NotStreamed
                if at + n > limit:
                    if not grow:
                        raise _NoRoom
                    capacity = limit = max(capacity + capacity // 4, at + n)  # a quarter more
                    for arrays in (numbers, codes, gap_of):
                        for j in arrays:
                            arrays[j] = _grown(arrays[j], capacity, at)
                for j, column in enumerate(batch.columns):
                    if j in numbers:
                        if column.null_count and pa.types.is_int64(column.type):
                            gap = gap_of.setdefault(j, np.zeros(capacity, dtype=bool))
                            gap[at:at + n] = column.is_null().to_numpy(zero_copy_only=False)
                            column = pc.fill_null(column, 0)
                        numbers[j][at:at + n] = column.to_numpy(zero_copy_only=False)  # float: NaN where missing
                    else:
                        seen = seen_values[j]
                        lookup = np.array([seen.setdefault(v, len(seen)) for v in column.dictionary.to_pylist()] + [-1],
                                          dtype=np.int32)
                        indices = column.indices
                        indices = (pc.fill_null(indices, -1) if indices.null_count else indices).to_numpy()
                        codes[j][at:at + n] = lookup[indices]  # -1 (missing) takes the last entry
                at += n
                del batch, column
                blocks += 1
                if not grow and blocks % TRIM_BLOCKS == 0:
                    trim_memory()  # the blocks this thread freed, kept by glibc in its arena otherwise
        return at - start

    if THREADED:  # the whole file parsed on pyarrow's threads, then each column moved into its array and freed
        for j in codes:
            values[j] = {}
        try:
            at = _threaded(path, fmt, read_options, parse_options, convert_options, names, kinds, numbers, codes,
                           gaps, values, pool, pa, pc, csv, np)
        except (_NotStreamed, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowIndexError, UnicodeDecodeError):
            return None
        return _frame_of(names, numbers, codes, gaps, values, at, pool, pa, pc, np, pd)
    halves = PARALLEL and os.path.getsize(path) >= PARALLEL_BYTES and not parse_options.newlines_in_values
    if halves:  # room for each half's rows and 10% more (pages never written are never resident)
        capacity = int(capacity * 1.1) + 2048
        for arrays in (numbers, codes):
            for j in arrays:
                arrays[j] = np.empty(capacity, dtype=arrays[j].dtype)
    at = _halves(path, read_options, csv, names, fill, numbers, codes, gaps, values, capacity, np, pa) if halves else None
    if at is None:
        try:
            for arrays in (gaps, values):
                arrays.clear()
            values.update({j: {} for j in codes})
            at = fill(path, read_options, 0, capacity, values, gaps, True)
        except (_NotStreamed, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowIndexError, UnicodeDecodeError):
            return None
    return _frame_of(names, numbers, codes, gaps, values, at, pool, pa, pc, np, pd)


def _frame_of(names: list[str], numbers: dict[int, Any], codes: dict[int, Any], gaps: dict[int, Any],
              values: dict[int, dict[str, int]], at: int, pool: Any, pa: Any, pc: Any, np: Any, pd: Any) -> Any:
    """The frame of :func:`_stream`'s arrays (their first ``at`` rows): numbers as they are (an int64 column with a
    gap as float64 with NaN there), dictionary codes as a Categorical of the values in order of first appearance
    (or numbers, :func:`_as_numbers`)."""
    _trim()
    columns: dict[str, Any] = {}
    for j, name in enumerate(names):
        if j in numbers:
            column = numbers.pop(j)[:at]
            if j in gaps:
                column = column.astype(np.float64)
                column[gaps.pop(j)[:at]] = np.nan
            columns[name] = pd.Series(column, name=name, copy=False)
        else:
            found = codes.pop(j)[:at]
            dictionary = pa.DictionaryArray.from_arrays(pa.array(found, mask=found < 0),
                                                        pa.array(list(values.pop(j)), pa.string()))
            del found
            column = _as_numbers(pa.chunked_array([dictionary]), pa, pc)
            columns[name] = column.to_pandas(memory_pool=pool)
            columns[name].name = name
    return pd.DataFrame(columns, copy=False)


THREADED = True
"""Read a file whose every column is typed from its sample with :func:`pyarrow.csv.read_csv` (the whole file parsed on
pyarrow's threads), then move each column into its numpy array and free it (:func:`_threaded`), rather than block by
block with the streaming reader, which parses on one thread (issue #32 item 1: 2 quiet cores, the benchmark's table,
0.72 s against 1.13 s in a fresh process; the peak is the table held once, column by column, see :func:`_threaded`).
False: the streaming reader (``tests/test_preprocess_fast.py`` reads with both)."""


def _threaded(path: Any, fmt: CsvFormat, read_options: Any, parse_options: Any, convert_options: Any, names: list[str],
              kinds: list[Any], numbers: dict[int, Any], codes: dict[int, Any], gaps: dict[int, Any],
              values: dict[int, dict[str, int]], pool: Any, pa: Any, pc: Any, csv: Any, np: Any) -> int:
    """Read the whole file typed (``convert_options``) on pyarrow's threads, then fill ``numbers`` / ``codes`` /
    ``gaps`` / ``values`` as :func:`_stream`'s streaming read does, block by block, one column at a time, each
    column's blocks freed once moved (and the freed memory handed back every few columns), so that a cell is held
    twice only for the column being moved: the rows read.

    Raises:
        _NotStreamed: a header or a column type other than the sample's; pyarrow's errors (a conversion error:
            a later cell that does not fit the sample's type).
    """
    table = csv.read_csv(path, read_options=read_options, parse_options=parse_options,
                         convert_options=convert_options, memory_pool=pool)
    if table.column_names != names or table.schema.types != kinds:
        raise _NotStreamed
    if fmt.header and [n.strip() for n in names] != list(fmt.header_names[: len(names)]):
        raise _NotStreamed
    rows = table.num_rows
    held = table.columns
    del table  # the list holds the only reference to each column: each is freed once moved
    for j in range(len(held)):
        column, held[j] = held[j], None
        if j in numbers:
            numbers[j] = target = np.empty(rows, dtype=numbers[j].dtype)
            integer = pa.types.is_int64(column.type) and column.null_count > 0
            if integer:
                gaps[j] = gap = np.zeros(rows, dtype=bool)
        else:
            codes[j] = target = np.empty(rows, dtype=np.int32)
            seen = values[j]
        at = 0
        for chunk in column.chunks:
            n = len(chunk)
            if j in numbers:
                if integer and chunk.null_count:
                    gap[at:at + n] = chunk.is_null().to_numpy(zero_copy_only=False)
                    chunk = pc.fill_null(chunk, 0)
                target[at:at + n] = chunk.to_numpy(zero_copy_only=False)  # float: NaN where missing
            else:
                lookup = np.array([seen.setdefault(v, len(seen)) for v in chunk.dictionary.to_pylist()] + [-1],
                                  dtype=np.int32)
                indices = chunk.indices
                indices = (pc.fill_null(indices, -1) if indices.null_count else indices).to_numpy()
                target[at:at + n] = lookup[indices]  # -1 (missing) takes the last entry
            at += n
        del column
        if j % TRIM_BLOCKS == TRIM_BLOCKS - 1:
            trim_memory()  # the moved columns' blocks, freed into the parsing threads' glibc arenas
    return rows


class _NotStreamed(Exception):
    """A block :func:`_stream` does not read (another type or header than the first block's)."""


class _NoRoom(Exception):
    """A half of the file held more rows than the room reserved for it (:func:`_halves`)."""


PARALLEL = False
"""Read a large file (:data:`PARALLEL_BYTES` or more, no quote in its first 64 KiB) as two halves on two threads
(pyarrow's streaming reader parses on one thread; issue #32 item 1). Off: on the 2-core VM shared with other
work it measured no faster inside preprocess (paired medians of the ratio vs pandas.read_csv 0.38 vs 0.42 serial,
0.31 vs 0.32), while its peak is 25-40 MB higher (both threads' blocks); a read alone in a fresh process was
1.03-1.39 s against 1.37-1.80 s. ``tests/test_preprocess_fast.py`` checks it gives the one-stream frame."""

PARALLEL_BYTES = 16 << 20

TRIM_BLOCKS = 4
"""While two halves are read, each thread hands the memory it freed back every this many blocks (without it the
two threads' glibc arenas held about 90 MB more at the peak for the benchmark's table)."""


class _Range:
    """The bytes ``[start, stop)`` of a file as a read-only stream (what pyarrow's reader reads a half from)."""

    def __init__(self, path: Any, start: int, stop: int) -> None:
        self._file = open(path, "rb")  # noqa: SIM115  (closed by pyarrow's reader, or by close())
        self._file.seek(start)
        self._left = stop - start
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        size = self._left if size is None or size < 0 else min(size, self._left)
        data = self._file.read(size)
        self._left -= len(data)
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self._file.close()
        self.closed = True


def _halves(path: Any, read_options: Any, csv: Any, names: list[str], fill: Any, numbers: dict[int, Any],
            codes: dict[int, Any], gaps: dict[int, Any], values: dict[int, dict[str, int]], capacity: int, np: Any,
            pa: Any) -> int | None:
    """Stream the file's two halves (split at the line end after its middle) into the arrays at once, the second
    on a thread of its own, into the room past the first half's share of ``capacity``, then moved up to follow the
    first half (its text values' codes renumbered as the first half's): the rows, or None where the file is not
    split that way (a half outside its room, a block of another type, an error: the caller reads it serially).
    The rows, their order and the values' order of first appearance are the serial read's."""
    from concurrent.futures import ThreadPoolExecutor

    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        fh.seek(size // 2)
        tail = fh.read(1 << 20)
    end = tail.find(b"\n")
    if end < 0:
        return None
    split = size // 2 + end + 1
    offset = min(int(capacity * split / size), capacity)
    second_options = csv.ReadOptions(use_threads=read_options.use_threads, column_names=names,
                                     block_size=read_options.block_size)
    values2: dict[int, dict[str, int]] = {j: {} for j in codes}
    gaps2: dict[int, Any] = {}
    for j in codes:
        values[j] = {}
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            second = pool.submit(fill, _Range(path, split, size), second_options, offset, capacity, values2, gaps2, False)
            try:
                first = fill(_Range(path, 0, split), read_options, 0, offset, values, gaps, False)
            finally:
                rows2 = second.result() if not second.cancel() else 0
    except (_NotStreamed, _NoRoom, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowIndexError, UnicodeDecodeError):
        return None
    for j, seen in values2.items():  # the second half's codes as the first half's (new values numbered after)
        remap = np.array([values[j].setdefault(v, len(values[j])) for v in seen] + [-1], dtype=np.int32)
        part = codes[j][offset:offset + rows2]
        part[...] = remap[part]
    for arrays in (numbers, codes):
        for j, array in arrays.items():
            array[first:first + rows2] = array[offset:offset + rows2]  # numpy copies first where they overlap
    for j, gap in gaps2.items():
        mine = gaps.setdefault(j, np.zeros(capacity, dtype=bool))
        mine[first:first + rows2] = gap[offset:offset + rows2]
    return first + rows2


def trim_memory() -> None:
    """Hand the memory the reader's threads freed back to the system (glibc keeps it in per-thread arenas: 613 MB
    resident after reading the benchmark's 135 MB table, 266 MB after this; preprocess calls it again once the
    table is freed); nothing where there is no glibc."""
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        try:  # the name first: find_library runs a subprocess (a fork of this large process)
            _LIBC = ctypes.CDLL("libc.so.6")
        except OSError:
            try:
                _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            except OSError:
                _LIBC = False
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


_LIBC: Any = None
_trim = trim_memory


def _plain(kind: Any, pa: Any) -> bool:
    """A type pandas' reader gives too: integers, floats, booleans, text, nothing."""
    return bool(
        pa.types.is_int64(kind) or pa.types.is_float64(kind) or pa.types.is_boolean(kind) or pa.types.is_string(kind)
        or pa.types.is_large_string(kind) or pa.types.is_null(kind)
        or (pa.types.is_dictionary(kind) and (pa.types.is_string(kind.value_type) or pa.types.is_large_string(kind.value_type)))
    )


def _as_numbers(column: Any, pa: Any, pc: Any) -> Any:
    """A text column whose present cells are all numbers with spaces around them (pandas parses those): int64, or
    float64 (with a gap, or a fraction); any other text column as it is."""
    values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    dictionary = pa.types.is_dictionary(values.type)
    cells = values.dictionary if dictionary else values
    if len(cells) == 0 or not pc.any(pc.match_substring_regex(cells, r"^\s|\s$")).as_py():
        return column  # no cell with a space at an end: pyarrow would have typed numbers itself
    trimmed = pc.utf8_trim_whitespace(cells)
    try:
        numbers = pc.cast(trimmed, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        try:
            numbers = pc.cast(trimmed, pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return column
    if dictionary:
        numbers = pc.take(numbers, values.indices)
    if pa.types.is_int64(numbers.type) and numbers.null_count:
        numbers = pc.cast(numbers, pa.float64())
    return numbers
