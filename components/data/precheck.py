"""The data set's problems found before a run does any work: every one of them, in one list.

A run checks what it can before prewarm copies anything (:func:`heteroflow.pipelines.runs.records.prepare_arguments`
calls :func:`dataset_problems` for a local data set). What is checked, by data kind (the reader registry decides the
kind, :meth:`heteroflow.components.data.formats.ReaderRegistry.detect_kind`):

- an image folder: every image opened and checked with Pillow (``verify``: the whole file read, no pixels decoded),
  each one that cannot be read listed; images at the top of the folder; class folders without images; fewer than 2
  classes. These are the checks preprocess makes (:func:`heteroflow.components.data.readers.prepare_images`), which
  stops at the first.
- tables (up to :data:`TABLE_BYTES` of table files): every file read as preprocess reads it (each one that cannot
  be read listed), the class column chosen as preprocess chooses it (``label_column``, else the guess), and fewer
  than 2 classes in it. The rest of a table's checks (missing values, id-like columns, ...) stay with preprocess,
  which reports all of a table's problems in one message.

Tensors and dataset factories are read by train only; remote data sets are checked by prewarm (listing only).
"""

from __future__ import annotations

import concurrent.futures
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from heteroflow.cache.errors import DatasetError
from heteroflow.components.errors import InvalidParameter

__all__ = ["TABLE_BYTES", "check_image_folder", "dataset_problems"]

TABLE_BYTES = 64 << 20
"""Tables read before a run, in bytes of table files (64 MiB): a larger data set's class column is checked by
preprocess alone, so that a run does not read a large table twice before it starts."""

_VERIFY_THREADS = 8


def dataset_problems(uri: str, params: Mapping[str, Any] | None = None) -> list[str]:
    """Every problem of the local data set ``uri`` that shows before preprocess, as messages naming the file (or
    the class column) and what to do.

    Args:
        uri: a local folder or file (absolute); anything with ``://`` gets no check here (an empty list).
        params: preprocess's parameters for it (``label_column``, ``header``, ``delimiter``; defaults for the others).
            Tables are not read when one of those three is not valid (preprocess's own check reports it).

    Returns:
        The problems, in the order found; empty when none was found.
    """
    from heteroflow.cache.dataset import open_dataset
    from heteroflow.components.core.step import with_defaults
    from heteroflow.components.data.formats import REGISTRY
    from heteroflow.components.data.preprocess import preprocess

    if "://" in uri:
        return []
    try:
        view = open_dataset(uri, verify="none")
        kind = REGISTRY.detect_kind(view.relative)
    except (DatasetError, InvalidParameter) as exc:
        return [str(exc)]
    values = with_defaults(preprocess, params)  # preprocess's own defaults for those not given
    if kind == "image_folder":
        return _image_problems(view)
    if kind == "table":
        from heteroflow.components.data.preprocess import check_preprocess_params

        try:  # the tables are read with these: a bad one is preprocess's check's problem, reported once, not here again
            check_preprocess_params(header=values["header"], delimiter=values["delimiter"], label_column=values["label_column"])
        except InvalidParameter:
            return []
        return _table_problems(view, values)
    return []


def check_image_folder(view: Any) -> None:
    """Preprocess's check of an image folder before it reads one (a remote data set is first seen there): every
    problem at once, not the first. Nothing is checked for another data kind.

    Args:
        view: the :class:`~heteroflow.cache.dataset.DatasetView` of the data set.

    Raises:
        DatasetError: the problems :func:`dataset_problems` lists for an image folder, in one message.
    """
    from heteroflow.components.data.formats import REGISTRY

    if REGISTRY.detect_kind(view.relative) != "image_folder":
        return
    problems = [view.in_source_terms(p) for p in _image_problems(view)]
    if len(problems) == 1:
        raise DatasetError(problems[0])
    if problems:
        raise DatasetError(f"{len(problems)} problems with data set {view.source_uri}:\n- " + "\n- ".join(
            p.replace("\n", "\n  ") for p in problems))


def _image_problems(view: Any) -> list[str]:
    from heteroflow.components.data.readers import IMAGE_SUFFIXES

    base = view.source_uri.rstrip("/")
    problems: list[str] = []
    by_class: dict[str, list[str]] = {}
    others: set[str] = set()
    top: list[str] = []
    for rel in view.relative:
        parent = rel.rpartition("/")[0]
        if os.path.splitext(rel)[1].lower() in IMAGE_SUFFIXES:
            (by_class.setdefault(parent, []) if parent else top).append(rel)
        elif parent:
            others.add(parent)
    if len(top) == 1:  # the words of preprocess's own check (readers.prepare_images) for one
        problems.append(
            f"image {base}/{top[0]} lies at the top of the data set; an image folder holds one folder per class "
            "(e.g. cat/1.png, dog/2.png)"
        )
    elif top:
        problems.append(
            f"{len(top)} images lie at the top of the data set {base} ({_listed(top)}); an image folder holds one "
            "folder per class (e.g. cat/1.png, dog/2.png): move them into their class folder"
        )
    empty = sorted(others - set(by_class))
    if empty:
        named = f"class folder {base}/{empty[0]} has" if len(empty) == 1 else f"{len(empty)} class folders of {base} have"
        listed = "" if len(empty) == 1 else f" ({_listed(empty)})"
        problems.append(
            f"{named} no images (.png, .jpg, ...){listed}; every class folder needs at least one image, or remove the folder"
        )
    if len(by_class) < 2:
        found = f" ({', '.join(sorted(by_class))})" if by_class else ""
        problems.append(
            f"image folder {base} has {len(by_class)} class folder(s){found}; a classifier needs at least 2: "
            "add a folder of images per class"
        )
    files = [rel for rel in view.relative if os.path.splitext(rel)[1].lower() in IMAGE_SUFFIXES]
    root = Path(view.root)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(_VERIFY_THREADS, len(files)))) as pool:
        results = list(pool.map(lambda rel: _unreadable(root / rel), files))
    bad = [(rel, why) for rel, why in zip(files, results) if why]
    if len(bad) == 1:
        problems.append(f"image {base}/{bad[0][0]} cannot be decoded ({bad[0][1]}); remove it or replace it with a valid image")
    elif bad:
        listed = "\n- ".join(f"{base}/{rel} ({why})" for rel, why in bad)
        problems.append(
            f"{_count(bad, 'image')} of {len(files)} in image folder {base} cannot be decoded; remove them or replace "
            f"them with valid images:\n- {listed}"
        )
    return problems


def _unreadable(path: Path) -> str:
    """Why Pillow cannot read the image at ``path`` ("" when it can)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img.verify()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:  # the reason, without the path
        return " ".join(str(exc).replace(repr(str(path)), "").replace(str(path), "").split()) or type(exc).__name__
    return ""


def _table_problems(view: Any, params: Mapping[str, Any]) -> list[str]:
    """``params``: every preprocess parameter (:func:`dataset_problems` fills in the defaults)."""
    from heteroflow.components.data.formats import REGISTRY, TABLE

    files = [f for f in view.files if REGISTRY.is_data_file(str(f), TABLE)]
    if not files or sum(f.stat().st_size for f in files) > TABLE_BYTES:
        return []
    header, delimiter = params["header"], params["delimiter"]
    label_column = str(params["label_column"] or "").strip()
    if _plainly_fine(files, header=header, delimiter=delimiter, label_column=label_column):
        return []  # what the full read below would find: nothing (without importing pandas in the driver)
    from heteroflow.components.data.columns import _combine
    from heteroflow.components.data.datasets import read_table

    problems: list[str] = []
    tables = []
    for f in files:
        try:
            tables.append(read_table(f, header=header, delimiter=delimiter))
        except (DatasetError, InvalidParameter) as exc:
            problems.append(view.in_source_terms(str(exc)))
    if problems or not tables:
        return problems
    try:
        table = _combine(tables, label_column)
    except DatasetError as exc:
        return [view.in_source_terms(str(exc))]
    classes = table.frame[table.label].dropna().unique()
    if len(classes) < 2:
        found = f" ({classes[0]!r})" if len(classes) else ""
        problems.append(
            f"data set {view.source_uri} has {len(classes)} class{found} in class column {table.label!r} "
            f"({table.label_reason}); a classifier needs at least 2: set label_column to the class column, or add "
            "samples of the other classes"
        )
    return problems


FAST_BYTES = 4 << 20
"""Text tables up to this size in all (4 MiB) are first checked by :func:`_plainly_fine` with Python's csv module."""


def _plainly_fine(files: list[Path], *, header: str, delimiter: str, label_column: str) -> bool:
    """Whether the full check (every file read by pandas as preprocess reads it) would surely find no problem,
    decided without pandas (whose import alone costs a run's driver about 0.3 s): every file a ``.csv``/``.tsv``
    read by the built-in csv reader, sniffed as preprocess sniffs it (:func:`~heteroflow.components.data.csvformat.sniff_csv`),
    decoding as sniffed to its end, every non-blank row as wide as the header row (no trailing delimiter), distinct
    column names, every file with the same columns, and at least 2 distinct values in the class column (chosen as
    preprocess chooses it: ``label_column``, a column named as a class, else the last one), counted with numbers
    by value and true/false by meaning. False (the full check decides, and words any problem) in every other case.
    """
    import csv

    from heteroflow.components.data.cells import MISSING_MARKERS
    from heteroflow.components.data.columns import CLASS_COLUMN_NAMES
    from heteroflow.components.data.csvformat import sniff_csv
    from heteroflow.components.data.formats import REGISTRY, TABLE

    if sum(f.stat().st_size for f in files) > FAST_BYTES:
        return False
    layout: tuple[bool, tuple[str, ...]] | None = None
    values: set[Any] = set()
    missing = frozenset(MISSING_MARKERS)
    for f in files:
        if REGISTRY.for_path(f, kind=TABLE).name != "csv" or f.suffix.lower() not in (".csv", ".tsv"):
            return False
        try:
            fmt = sniff_csv(f, header=header, delimiter=delimiter)
            text = f.read_bytes().decode(fmt.encoding)
        except (DatasetError, InvalidParameter, UnicodeError, OSError):
            return False
        if fmt.trailing_delimiter or fmt.columns < 2 or not text.strip() or not text.lstrip("\ufeff")[:1].strip():
            return False
        try:
            rows = list(csv.reader(io.StringIO(text.lstrip("\ufeff"), newline=""), delimiter=fmt.delimiter, strict=True))
        except csv.Error:
            return False
        width = len(rows[0])
        if width != fmt.columns:
            return False
        if fmt.header:
            names = tuple(c.strip() for c in rows[0])
            rows = rows[1:]
            if len(set(names)) != width:
                return False
        else:
            names = tuple(f"column_{j + 1}" for j in range(width))
        body = [r for r in rows if any(c.strip() for c in r)]
        if not body or any(len(r) != width for r in body):
            return False
        if layout is None:
            layout = (fmt.header, names)
        elif layout != (fmt.header, names):  # files that differ: the full check combines them as preprocess does
            return False
        if label_column:
            folded = [c for c in names if c == label_column] or [c for c in names if c.lower() == label_column.lower()]
            if len(folded) != 1:
                return False
            label = folded[0]
        else:
            named = [c for c in CLASS_COLUMN_NAMES if c in {n.strip().lower() for n in names}] if fmt.header else []
            label = next(n for n in names if n.strip().lower() == named[0]) if named else names[-1]
        j = names.index(label)
        for r in body:
            cell = r[j].strip()
            if cell in missing:
                continue
            values.add(_class_key(cell, fmt.decimal))
    return len(values) >= 2


def _class_key(cell: str, decimal: str) -> Any:
    """A class value as preprocess tells classes apart: numbers by value (``01`` is ``1``), true/false by meaning."""
    try:
        return float(cell.replace(",", ".") if decimal == "," else cell)
    except ValueError:
        lowered = cell.lower()
        return lowered if lowered in ("true", "false") else cell


def _count(items: Any, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _listed(names: list[str], limit: int = 10) -> str:
    more = f", and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
