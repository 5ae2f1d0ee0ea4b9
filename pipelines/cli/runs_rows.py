"""The rows of ``heteroflow runs``: one per run, with its data set, model and error, and the ``--filter`` and
``--sort`` over them.

A row's columns (:data:`COLUMNS`) are what the table shows and what ``--filter KEY=PATTERN`` and ``--sort KEY``
name: the pipeline's name alone (``heteroflow-default`` for every run of the default pipeline) does not tell runs
apart, their data set and model do.
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from heteroflow.components.core.telemetry import mixed_kinds
from heteroflow.components.errors import InvalidParameter

__all__ = ["COLUMNS", "filter_rows", "parse_filter", "run_row", "sort_rows"]

COLUMNS = ("run", "started", "status", "pipeline", "dataset", "model", "device", "accuracy", "seconds", "error")
"""What ``--filter`` and ``--sort`` take (``started`` is the start time, ``YYYY-mm-dd HH:MM`` UTC)."""

_NUMERIC = ("accuracy", "seconds")
_FILTER = re.compile(r"^\s*([A-Za-z_]+)\s*(!=|>=|<=|=|>|<)(.*)$")


def _when(ts: Any) -> str:
    if not isinstance(ts, (int, float)) or ts <= 0:
        return "-"
    return _dt.datetime.fromtimestamp(ts, tz=_dt.timezone.utc).strftime("%m-%d %H:%M")


def _devices(run: dict[str, Any]) -> str:
    """``call kind`` per device-bound call (those with a candidate index)."""
    # device-bound: the calls the planner placed (or that fell back); a record without placement: those with a
    # candidate index (kfp.local records one for every call, the in-process engine only for device-bound ones)
    bound = set(run.get("placement") or {}) | {f.get("step") for f in run.get("fallbacks") or []}
    parts = []
    for s in run.get("steps") or []:
        if (s.get("name") not in bound) if bound else s.get("candidate") is None:
            continue
        # a mixed candidate's train by every kind it trained on (its result's device_kind), not its first kind
        mixed = mixed_kinds((run.get("results") or {}).get(s.get("name"))) or mixed_kinds(s.get("details"))
        kind = "-" if s.get("status") == "not run" else mixed or str(s.get("kind") or s.get("device") or "-")
        parts.append(f"{s.get('name')} {kind}{' (sim)' if s.get('simulated') else ''}")
    return ", ".join(parts)


def _dataset_uri(run: dict[str, Any]) -> str | None:
    params = run.get("params") or {}
    results = run.get("results") or {}
    uri = params.get("dataset_uri") or params.get("source_uri") or (results.get("prewarm") or {}).get("source_uri")
    return str(uri) if uri else None


def _dataset_name(uri: str | None) -> str | None:
    if not uri:
        return None
    tail = uri.rstrip("/").split("://")[-1].split("?")[0]
    return Path(tail).name or tail


def _model(run: dict[str, Any], uri: str | None) -> str | None:
    """``name:vN`` of the archived model; without an archive: the name it would have (the run's ``model_name``, else
    the default from the data set and model factory); None for a pipeline that has no archive step (a trial saw
    ``messy-mlp`` listed for a pipeline that archives nothing)."""
    archived = (run.get("results") or {}).get("archive") or {}
    if archived.get("name"):
        return f"{archived['name']}:v{archived['version']}" if archived.get("version") else str(archived["name"])
    steps = [s for s in run.get("steps") or [] if isinstance(s, dict)]
    if steps and not any(str(s.get("name", "")).startswith("archive") for s in steps):
        return None
    params = run.get("params") or {}
    if params.get("model_name"):
        return str(params["model_name"])
    if uri is None:
        return None
    from heteroflow.components.models.archive import default_model_name

    return default_model_name(uri, str(params.get("model") or ""), str(params.get("dataset_factory") or ""))


def _error(run: dict[str, Any]) -> str | None:
    """Why the run did not succeed: the failed step, its failure class and the error's last line."""
    if run.get("status") == "succeeded":
        return None
    failed = next((s for s in run.get("steps") or [] if s.get("status") == "failed"), None)
    if failed is not None and (failed.get("error") or failed.get("failure")):
        text = str(failed.get("error") or "").strip().splitlines()
        message = re.sub(r"^[\w.]+(Error|Fault|Exception|Interrupt)\w*: ", "", text[-1]) if text else ""
        failure = f" ({failed['failure']})" if failed.get("failure") else ""
        return f"{failed.get('name')}{failure}: {message}".rstrip(": ")
    return " ".join(str(run["error"]).split()) if run.get("error") else None


def run_row(run: dict[str, Any]) -> dict[str, Any]:
    """One run as a row: ``run_id``, ``started``, ``status``, ``pipeline``, ``dataset`` (the data set folder's name;
    a ``dataset_factory`` run: the factory's ``module:function``), ``dataset_uri``, ``model``, ``devices``, ``accuracy``, ``seconds``, ``fallbacks``, ``error``, ``run_dir``."""
    from heteroflow.cache.redact import redact_url
    from heteroflow.pipelines.runs.folders import headline_metric

    metric = headline_metric(run)
    uri = _dataset_uri(run)
    # train read a dataset_factory's samples: that is the run's data, not the folder prewarm and preprocess went over
    factory = str((run.get("params") or {}).get("dataset_factory") or "")
    return {
        "run_id": run.get("run_id"),
        "started": _when(run.get("started_at")),
        "started_at": run.get("started_at"),
        "status": run.get("status"),
        "pipeline": run.get("pipeline"),
        "dataset": factory or _dataset_name(uri),
        "dataset_uri": f"dataset_factory {factory}" if factory else redact_url(uri) if uri else None,
        "model": _model(run, uri),
        "devices": _devices(run),
        "accuracy": metric[1] if metric else None,
        "seconds": run.get("wall_seconds"),
        "fallbacks": [f"{f.get('step')} left {f.get('kind')} ({f.get('failure')})" for f in run.get("fallbacks") or []],
        "error": _error(run),
        "run_dir": run.get("run_dir"),
    }


def _texts(row: dict[str, Any], key: str) -> list[str]:
    """The texts a ``--filter`` pattern for ``key`` is matched against (the data set: its name and its URI)."""
    if key == "run":
        return [str(row["run_id"])]
    if key == "started":
        ts = row.get("started_at")
        return [_dt.datetime.fromtimestamp(ts, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M")] if isinstance(ts, (int, float)) and ts > 0 else [""]
    if key == "device":
        return [row["devices"] or ""]
    if key == "dataset":
        return [row["dataset"] or "", row["dataset_uri"] or ""]
    value = row.get(key)
    return ["" if value is None else str(value)]


def parse_filter(text: str) -> tuple[str, str, str]:
    """``KEY=PATTERN``, ``KEY!=PATTERN`` (a glob, case-insensitive; ``-`` matches an empty column), or ``KEY>N``,
    ``KEY>=N``, ``KEY<N``, ``KEY<=N`` for ``accuracy`` and ``seconds``, as ``(key, operator, value)``.

    Raises:
        InvalidParameter: not of that form, an unknown key (lists the valid ones) or a comparison on a text column.
    """
    m = _FILTER.match(text)
    if not m:
        raise InvalidParameter(
            f"--filter {text!r} is not KEY=PATTERN, KEY!=PATTERN or KEY>N / KEY<N; e.g. --filter dataset=iris* "
            f"--filter 'accuracy>=0.9'; keys: {', '.join(COLUMNS)}"
        )
    key, op, value = m[1].lower(), m[2], m[3].strip()
    if key not in COLUMNS:
        raise InvalidParameter(f"--filter {text!r}: no column {key!r}; valid: {', '.join(COLUMNS)}")
    if op not in ("=", "!="):
        if key not in _NUMERIC:
            raise InvalidParameter(f"--filter {text!r}: {op} compares numbers; numeric columns: {', '.join(_NUMERIC)} (text columns take = or !=)")
        try:
            float(value)
        except ValueError:
            raise InvalidParameter(f"--filter {text!r}: {value!r} is not a number") from None
    return key, op, value


def _matches(row: dict[str, Any], key: str, op: str, value: str) -> bool:
    if op in ("=", "!="):
        pattern = "" if value == "-" else value.lower()
        found = any(fnmatch.fnmatchcase(t.lower(), pattern) for t in _texts(row, key))
        return found if op == "=" else not found
    number = row.get(key)
    if not isinstance(number, (int, float)):
        return False  # a run without the value never passes a comparison
    limit = float(value)
    return {">": number > limit, ">=": number >= limit, "<": number < limit, "<=": number <= limit}[op]


def filter_rows(rows: Iterable[dict[str, Any]], filters: Sequence[str]) -> list[dict[str, Any]]:
    """The rows that pass every filter (:func:`parse_filter`).

    Raises:
        InvalidParameter: a bad filter.
    """
    parsed = [parse_filter(f) for f in filters]
    return [r for r in rows if all(_matches(r, *p) for p in parsed)]


def sort_rows(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """``rows`` sorted by ``keys`` (``KEY`` ascending, ``-KEY`` descending; the first key first); runs without the
    value come last either way. No keys: the order given (newest first).

    Raises:
        InvalidParameter: an unknown key (lists the valid ones).
    """
    out = list(rows)
    for spec in reversed(list(keys)):
        descending, key = spec.startswith("-"), spec.lstrip("-+").strip().lower()
        if key not in COLUMNS:
            raise InvalidParameter(f"--sort {spec!r}: no column {key!r}; valid: {', '.join(COLUMNS)} (-KEY sorts descending)")

        def value(row: dict[str, Any], key: str = key) -> Any:
            if key in _NUMERIC or key == "started":
                v = row.get("started_at" if key == "started" else key)
                return v if isinstance(v, (int, float)) and (key != "started" or v > 0) else None
            text = _texts(row, key)[0]
            return text.lower() or None

        present = [r for r in out if value(r) is not None]
        missing = [r for r in out if value(r) is None]
        out = sorted(present, key=value, reverse=descending) + missing
    return out
