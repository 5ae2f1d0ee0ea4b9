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

    Returns:
        The problems, in the order found; empty when none was found.
    """
    from heteroflow.cache.dataset import open_dataset
    from heteroflow.components.data.formats import REGISTRY

    if "://" in uri:
        return []
    try:
        view = open_dataset(uri, verify="none")
        kind = REGISTRY.detect_kind(view.relative)
    except (DatasetError, InvalidParameter) as exc:
        return [str(exc)]
    values = dict(params or {})
    if kind == "image_folder":
        return _image_problems(view)
    if kind == "table":
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
    from heteroflow.components.data.columns import _combine
    from heteroflow.components.data.datasets import read_table
    from heteroflow.components.data.formats import REGISTRY, TABLE

    files = [f for f in view.files if REGISTRY.is_data_file(str(f), TABLE)]
    if not files or sum(f.stat().st_size for f in files) > TABLE_BYTES:
        return []
    header, delimiter = params.get("header", "auto"), params.get("delimiter", "auto")
    label_column = str(params.get("label_column", "") or "").strip()
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


def _count(items: Any, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _listed(names: list[str], limit: int = 10) -> str:
    more = f", and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
