"""Reading tabular data sets (CSV and .npz) and exporting the built-in sample data set (handwritten digits).

Supported formats, one or more files in a folder (files in other formats, e.g. a README, are ignored):

- ``.csv``: a header row, then one sample per row; the column named ``label`` is the class (any other
  columns are numeric features); without a ``label`` column the last column is the class.
- ``.npz``: arrays ``x`` (or ``X``/``features``), shape ``(n, ...)`` (flattened to ``(n, d)``), and ``y``
  (or ``labels``), shape ``(n,)``.

Labels may be integers (also written as whole floats, ``3.0``) or strings; classes are their sorted distinct
values.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from heteroflow.cache.atomic import atomic_directory
from heteroflow.cache.errors import DatasetError
from heteroflow.cache.locations import home_dir

__all__ = ["SUPPORTED_SUFFIXES", "Table", "data_files", "digits_source_dir", "export_digits", "load_table"]

SUPPORTED_SUFFIXES = (".csv", ".npz")
_FORMATS_HELP = "supported formats: .csv (header row, a 'label' column or the last column as class) and .npz (arrays x, y)"


@dataclasses.dataclass(frozen=True, slots=True)
class Table:
    """Features and raw labels of one file.

    Attributes:
        features: float32 array, shape ``(n, d)``.
        labels: array of ``n`` raw labels (ints or strings).
        source: the file it came from.
    """

    features: np.ndarray
    labels: np.ndarray
    source: str


def data_files(paths: Sequence[str | os.PathLike[str]], *, where: str) -> list[Path]:
    """Keep the files in a supported format, sorted.

    Raises:
        DatasetError: none of ``paths`` is a .csv or .npz file (names ``where``).
    """
    keep = sorted(Path(p) for p in paths if Path(p).suffix.lower() in SUPPORTED_SUFFIXES)
    if not keep:
        raise DatasetError(f"data set {where} has no .csv or .npz file; {_FORMATS_HELP}")
    return keep


def load_table(path: str | os.PathLike[str]) -> Table:
    """Read one .csv or .npz file.

    Raises:
        DatasetError: unsupported suffix, missing arrays/columns, non-numeric features, or no rows.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".npz":
        return _load_npz(p)
    if suffix == ".csv":
        return _load_csv(p)
    raise DatasetError(f"{p}: unsupported file type {suffix!r}; {_FORMATS_HELP}")


def _load_npz(p: Path) -> Table:
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
        features = x.reshape(len(x), -1).astype(np.float32)
    except ValueError:
        raise DatasetError(f"{p}: array {xkey!r} is not numeric (dtype {x.dtype})") from None
    return Table(features, y, str(p))


def _load_csv(p: Path) -> Table:
    with open(p, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header:
            raise DatasetError(f"{p}: empty CSV; expected a header row then one sample per row")
        header = [h.strip() for h in header]
        label_col = header.index("label") if "label" in header else len(header) - 1
        if len(header) < 2:
            raise DatasetError(f"{p}: CSV needs at least one feature column and a label column")
        rows: list[list[float]] = []
        labels: list[str] = []
        for lineno, row in enumerate(reader, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise DatasetError(f"{p}:{lineno}: {len(row)} columns, the header has {len(header)}")
            feats = []
            for j, cell in enumerate(row):
                if j == label_col:
                    continue
                try:
                    feats.append(float(cell))
                except ValueError:
                    raise DatasetError(
                        f"{p}:{lineno}: column {header[j]!r} holds {cell!r}, not a number "
                        "(features must be numeric; the class goes in the 'label' column)"
                    ) from None
            rows.append(feats)
            labels.append(row[label_col].strip())
    if not rows:
        raise DatasetError(f"{p}: CSV has a header but no rows")
    raw = np.asarray(labels)
    try:
        as_int = raw.astype(np.int64)
        if np.array_equal(as_int.astype(str), raw):  # canonical integers; codes such as "01" stay strings
            raw = as_int
    except ValueError:
        # whole numbers written as floats ("3.0", "3.000000e+00", as np.savetxt writes them) are integers
        if all(any(c in lab for c in ".eE") for lab in labels):
            try:
                as_float = raw.astype(np.float64)
            except ValueError:
                pass
            else:
                if np.all(np.isfinite(as_float)) and np.all(as_float == np.round(as_float)):
                    raw = as_float.astype(np.int64)
    return Table(np.asarray(rows, dtype=np.float32), raw, str(p))


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
