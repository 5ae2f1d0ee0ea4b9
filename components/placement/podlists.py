"""Pod and node lists in the Alibaba GPU cluster trace's CSV layout (``cluster-trace-gpu-v2023``, Weng et al., USENIX
ATC'23), read into resource vectors (:mod:`heteroflow.components.placement.vectors`): the plan step's workload file
(an inventory's ``workload:``) and ``heteroflow simulate``'s traces (:mod:`heteroflow.pipelines.alibaba` re-exports
these names).

Formats (CSV with a header; github.com/alibaba/clusterdata ``cluster-trace-gpu-v2023/README.md``):

- node list: ``sn`` (or ``name``), ``cpu_milli``, ``memory_mib``, ``gpu``, ``model`` (any model name; empty for a
  CPU-only node).
- pod list: ``name``, ``cpu_milli``, ``memory_mib``, ``num_gpu``, ``gpu_milli`` (thousandths of each device),
  optionally ``gpu_spec`` (allowed models, ``V100M16|V100M32``) and the trace's other columns (ignored).

Missing columns are named in the error, bad values with the file, line and column.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from heteroflow.components.placement.clusters import InvalidTrace
from heteroflow.components.placement.vectors import InvalidRequest, NodeSpec, Request
from heteroflow.components.placement.views import InvalidInventory

__all__ = ["NODE_COLUMNS", "POD_COLUMNS", "detect_csv", "read_nodes", "read_pods"]

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
"""The node list's columns (``name`` may stand for ``sn``)."""
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
"""The pod list's required columns; ``gpu_spec`` and the times are optional."""


def _header(path: Path) -> list[str]:
    from heteroflow.components.data.csvformat import file_not_text

    binary = file_not_text(path)
    if binary:  # said "'utf-8' codec can't decode byte ...", naming no file
        raise InvalidTrace(f"{path}: not a text file: {binary}; a pod or node list is a CSV text file")
    try:
        with path.open(newline="", encoding="utf-8") as f:
            return [c.strip() for c in next(csv.reader(f), [])]
    except OSError as exc:
        raise InvalidTrace(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise InvalidTrace(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None


def detect_csv(path: str | Path) -> str | None:
    """``"alibaba-nodes"`` or ``"alibaba-pods"`` when the file's header has the columns that identify the node or
    pod list (``gpu`` + ``model``, or ``num_gpu`` + ``gpu_milli``), else None."""
    cols = set(_header(Path(path)))
    if {"num_gpu", "gpu_milli"} <= cols:
        return "alibaba-pods"
    if {"gpu", "model"} <= cols and "cpu_milli" in cols:
        return "alibaba-nodes"
    return None


def _rows(path: Path, required: tuple[str, ...], what: str, alias: dict[str, str] | None = None, err: type[Exception] = InvalidTrace) -> list[tuple[int, dict[str, str]]]:
    header = _header(path)
    have = set(header) | {k for k, v in (alias or {}).items() if v in header}
    missing = [c for c in required if c not in have]
    if missing:
        raise err(f"{path}:1: missing column(s) {', '.join(missing)}; the Alibaba 2023 {what} needs {', '.join(required)}"
                  f" (found: {', '.join(header) or 'no header'})")
    with path.open(newline="", encoding="utf-8") as f:
        rows = []
        for lineno, row in enumerate(csv.DictReader(f), start=2):
            for k, v in (alias or {}).items():
                if k not in row and v in row:
                    row[k] = row[v]
            rows.append((lineno, row))
    if not rows:
        raise err(f"{path}: no rows after the header")
    return rows


def _num(row: dict[str, str], col: str, where: str, err: type[Exception]) -> int:
    raw = (row.get(col) or "").strip()
    try:
        v = float(raw)
    except ValueError:
        raise err(f"{where}{col}={raw!r}; valid: a number >= 0") from None
    if v < 0 or v != int(v):
        raise err(f"{where}{col}={raw!r}; valid: an integer >= 0")
    return int(v)


def _read(path: str | Path, columns: tuple[str, ...], what: str, err: type[Exception], build: Any, *,
          catch: type[Exception], alias: dict[str, str] | None = None) -> list[Any]:
    """``build(row, number)`` for each row of the CSV at ``path`` (``number(column)``: the column's integer >= 0),
    in file order. ``catch``: what ``build`` raises for a bad row, re-raised as ``err`` with the file and line."""
    p = Path(path)
    if not p.is_file():
        raise err(f"{p}: no such {what}")
    out = []
    for lineno, row in _rows(p, columns, what, alias=alias, err=err):
        where = f"{p}:{lineno}: "
        try:
            out.append(build(row, lambda col, row=row, where=where: _num(row, col, where, err)))
        except catch as exc:
            text = str(exc)
            raise err(text if text.startswith(str(p)) else f"{where}{text}") from None
    return out


def read_nodes(path: str | Path) -> list[NodeSpec]:
    """The node list as :class:`NodeSpec` values (in file order).

    Raises:
        InvalidInventory: unreadable file, a missing column (named), or a bad value (file, line and column named).
    """
    def node(row: dict[str, str], number: Any) -> NodeSpec:
        return NodeSpec(name=row["sn"].strip(), cpu_milli=number("cpu_milli"), memory_mib=number("memory_mib"),
                        gpus=number("gpu"), model=(row.get("model") or "").strip() or None)

    return _read(path, NODE_COLUMNS, "node list", InvalidInventory, node, catch=InvalidInventory, alias={"sn": "name"})


def read_pods(path: str | Path) -> list[Request]:
    """The pod list as :class:`Request` values (in file order; ``gpu_spec`` becomes the allowed models).

    Raises:
        InvalidTrace: unreadable file, a missing column (named), or a bad value (file, line and column named).
    """
    def pod(row: dict[str, str], number: Any) -> Request:
        num = number("num_gpu")
        return Request(name=row["name"].strip(), cpu_milli=number("cpu_milli"), memory_mib=number("memory_mib"),
                       num_gpu=num, gpu_milli=number("gpu_milli") if num else 0, models=(row.get("gpu_spec") or "").strip())

    return _read(path, POD_COLUMNS, "pod list", InvalidTrace, pod, catch=InvalidRequest)
