"""Per-attempt step records, so a local run can show each step's device, attempts and seconds.

When ``$HETEROFLOW_RUN_DIR`` is set (``heteroflow run`` sets it for its steps), every attempt of a step
writes ``$HETEROFLOW_RUN_DIR/steps/<step>/attempt-<n>.json``: first with status ``running``, then
``succeeded`` or ``failed``. A killed attempt stays ``running``, which is how a rerun counts it. Unset (on
a cluster), nothing is written; the same facts go into the output artifacts' metadata for the Kubeflow UI.

An attempt inside a ``ParallelFor`` iteration belongs to that iteration, as in KFP (each iteration its own task
under the loop) and Airflow (each mapped task instance its own ``map_index``, its own try numbers): its record is
``steps/<step>/iteration-<i>/attempt-<n>.json`` (``i`` 0-based; a nested loop's iteration under its outer ones',
``iteration-<outer>/iteration-<i>/``), ``n`` counts the attempts of that iteration alone, and the record names the
iteration (:class:`Iteration`: ``iteration``, ``outer_iterations``, ``item``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from heteroflow.cache.atomic import atomic_write_bytes
from heteroflow.cache.redact import redact_url

__all__ = [
    "ITEM_TEXT_LIMIT",
    "RUN_DIR_ENV",
    "AttemptRecord",
    "Iteration",
    "attempt_file",
    "attempt_files",
    "iteration_key",
    "iteration_label",
    "process_alive",
    "progress_reporter",
    "read_step_records",
    "record_order",
    "recorded_item",
    "step_attempt",
    "where_ran",
]

RUN_DIR_ENV = "HETEROFLOW_RUN_DIR"

ITEM_TEXT_LIMIT = 200
"""A loop item whose JSON text is longer than this (characters) is recorded as that text cut to this length and
``…`` (:func:`recorded_item`); records stay small whatever a loop iterates over."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Iteration:
    """The ``ParallelFor`` iteration an attempt runs in (Airflow's mapped task instance, KFP's
    ``for-loop-<n>-iteration-<i>``).

    Attributes:
        index: 0-based index of the iteration in its loop (Airflow's ``map_index``); for a nested loop, in the
            innermost loop.
        item: the loop item (a JSON value), None when the engine cannot tell the step (kfp.local: the run's record
            fills it in from the loop's list, :func:`heteroflow.pipelines.runs.records.build_record`).
        outer: the enclosing loops' iteration indices, outermost first (empty for a loop that is not nested).
    """

    index: int
    item: Any = None
    outer: tuple[int, ...] = ()


def recorded_item(item: Any, limit: int = ITEM_TEXT_LIMIT) -> Any:
    """A loop item as an attempt record keeps it: the item itself when its JSON text has at most ``limit``
    characters, else that text cut to ``limit`` characters followed by ``…`` (a string). Credentials in URLs are
    redacted when the record is written."""
    text = json.dumps(item, default=str, sort_keys=True)
    return item if len(text) <= limit else text[:limit] + "…"


def iteration_key(record: Any) -> tuple[int, ...] | None:
    """The iteration an attempt record (an :class:`AttemptRecord` or its dict) belongs to: the outer indices then
    its own (``(1,)``; nested ``(0, 2)``), None outside a loop."""
    get = record.get if isinstance(record, dict) else lambda k, d=None: getattr(record, k, d)
    index = get("iteration")
    if not isinstance(index, int) or isinstance(index, bool):
        return None
    outer = get("outer_iterations") or []
    return (*(int(i) for i in outer), index)


def iteration_label(key: tuple[int, ...] | None) -> str:
    """``[1]`` for iteration 1 (``[0][2]`` nested), empty outside a loop: what the views append to a step's name."""
    return "".join(f"[{i}]" for i in key) if key else ""


def where_ran(kind: Any, device: Any = "", *, accelerator: Any = None, simulated: bool = False, details: Any = None) -> str:
    """Where a step ran, worded the one way every view says it (the steps tables, the report, the steps' own
    summaries): a device kind with its accelerator model and ``simulated, on cpu`` or its torch device
    (``gpu (nvidia-gpu, simulated, on cpu)``, ``npu (ascend-910, on npu:0)``); the CPU as its torch device
    (``cpu``); ``-`` when nothing is known. ``details``: the step's facts; a mixed candidate's train is worded by
    every kind it trained on (:func:`mixed_kinds`: ``gpu+npu (simulated, on cpu)``), not its first kind's model."""
    from heteroflow.components.devices import has_devices

    mixed = mixed_kinds(details)
    if mixed:
        kind, accelerator = mixed, None
    kind = getattr(kind, "value", kind)
    if not kind or not has_devices(str(kind)):
        return str(device or kind or "-")
    parts = [str(accelerator)] if accelerator else []
    if simulated:
        parts.append("simulated, on cpu")
    elif device and str(device) != str(kind):
        parts.append(f"on {device}")
    return f"{kind} ({', '.join(parts)})" if parts else str(kind)


def mixed_kinds(details: Any) -> str | None:
    """The kinds a step trained on together (``gpu+npu``: a mixed candidate's train, from its facts'
    ``device_kind``, or while it runs its live progress's), else None. Its attempt's ``kind`` names the candidate's first kind (what fault injection and
    fallback match), so the views word where it ran from this (:func:`where_ran` of it, without the first kind's
    accelerator model)."""
    if not isinstance(details, dict):
        return None
    kind = details.get("device_kind") or (details.get("progress") or {}).get("device_kind")  # live: its progress
    return kind if isinstance(kind, str) and "+" in kind else None


@dataclasses.dataclass(slots=True, kw_only=True)
class AttemptRecord:
    """One attempt of one step.

    Attributes:
        step: step name (``train``).
        attempt: 1-based attempt number within the run (within its iteration, for a step inside a loop).
        status: ``running``, ``succeeded``, ``failed`` or ``interrupted`` (Ctrl-C).
        device: device the attempt ran on (``cpu``, ``cuda``, ``npu``), or ``cpu`` for CPU-only steps.
        started_at / ended_at: Unix time, seconds.
        seconds: wall time of the attempt inside the step process, seconds.
        compute_seconds: time spent in the step's own work (excludes imports and artifact I/O), seconds.
        call_seconds: wall time of the call of the step's function (its own imports included), seconds.
        error: the exception line when failed.
        failure: the failure class when failed (``device``, ``transient``, ``permanent``; see
            :mod:`heteroflow.components.core.failures`).
        candidate: index of the candidate the attempt ran on (0 = preferred), None for a step without.
        kind: device kind of that candidate (``cpu``, ``gpu``, ``npu``).
        accelerator: accelerator model of that candidate, if any.
        simulated: the device kind was simulated (``HETEROFLOW_SIMULATE_DEVICES``) and the work ran on the CPU.
        pid: the process that ran the attempt (a ``running`` record whose process is gone was killed).
        details: step-specific facts (samples/s, files copied...).
        traceback_file: a failed attempt's full traceback (your model's or data's code included), a file beside the
            record (``attempt-<n>.traceback.txt``); None when the attempt did not fail or has no run folder.
        iteration: inside a ``ParallelFor``: the 0-based index of the iteration the attempt ran in (Airflow's
            ``map_index``; a nested loop's innermost index); ``attempt`` then counts that iteration's attempts
            alone. None outside a loop.
        outer_iterations: a nested loop's enclosing iterations, outermost first (empty otherwise).
        item: the iteration's loop item (JSON; abbreviated when long: :func:`recorded_item`); None outside a loop.
    """

    step: str
    attempt: int
    status: str = "running"
    device: str = "cpu"
    started_at: float = 0.0
    ended_at: float | None = None
    seconds: float | None = None
    compute_seconds: float | None = None
    call_seconds: float | None = None
    error: str | None = None
    failure: str | None = None
    candidate: int | None = None
    kind: str = dataclasses.field(default_factory=lambda: _host_kind_name())
    accelerator: str | None = None
    simulated: bool = False
    pid: int | None = None
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    traceback_file: str | None = None
    iteration: int | None = None
    outer_iterations: list[int] = dataclasses.field(default_factory=list)
    item: Any = None


def _host_kind_name() -> str:
    """The host kind's name (``cpu``): a record's kind when it names none."""
    from heteroflow.components.devices import host_kind

    return host_kind().value


def process_alive(pid: int | None) -> bool:
    """Whether a process with this pid exists (on this machine); False for None or 0."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def _iteration_parts(key: tuple[int, ...] | None) -> list[str]:
    return [f"iteration-{i}" for i in key or ()]


def _step_dir(step: str, key: tuple[int, ...] | None = None) -> Path | None:
    run_dir = os.environ.get(RUN_DIR_ENV)
    return Path(run_dir, "steps", step, *_iteration_parts(key)) if run_dir else None


def attempt_file(run_dir: str | os.PathLike[str], record: AttemptRecord) -> Path:
    """Where ``record`` lives in the run folder ``run_dir``: ``steps/<step>/attempt-<n>.json``, or
    ``steps/<step>/iteration-<i>/attempt-<n>.json`` for an attempt inside a loop."""
    return Path(run_dir, "steps", record.step, *_iteration_parts(iteration_key(record)), f"attempt-{record.attempt}.json")


def _write(path: Path | None, record: AttemptRecord) -> None:
    if path is not None:
        # visible complete or not at all (rename); no fsync: a record lost to a power cut costs nothing. Credentials
        # in a URL (an error message, a fact) never reach the file.
        text = redact_url(json.dumps(dataclasses.asdict(record), indent=2, default=str))
        atomic_write_bytes(path, text.encode(), durable=False)


@contextlib.contextmanager
def step_attempt(step: str, *, device: str = "cpu", iteration: Iteration | None = None, **fields: Any) -> Iterator[AttemptRecord]:
    """Record one attempt of ``step`` around the ``with`` body; re-raises what the body raises.

    Args:
        step: the step's (call's) name in the pipeline.
        device: the device the attempt runs on.
        iteration: the loop iteration the attempt runs in (None: not in a loop); its attempts are numbered apart.
        fields: other :class:`AttemptRecord` fields known at the start (``candidate``, ``kind``...).
    """
    if iteration is not None:
        fields.update(iteration=iteration.index, outer_iterations=list(iteration.outer), item=recorded_item(iteration.item))
    key = None if iteration is None else (*iteration.outer, iteration.index)
    folder = _step_dir(step, key)
    number = 1
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        number = len(list(folder.glob("attempt-*.json"))) + 1
    path = folder / f"attempt-{number}.json" if folder is not None else None
    record = AttemptRecord(step=step, attempt=number, device=device, started_at=time.time(), pid=os.getpid(), **fields)
    _write(path, record)
    t0 = time.perf_counter()
    try:
        yield record
    except BaseException as exc:
        # Ctrl-C reaches the step processes too (the terminal signals the whole process group)
        record.status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        record.error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        if path is not None and record.status == "failed":  # the one line above rarely says where: keep the whole
            with contextlib.suppress(OSError):
                where = path.with_name(f"attempt-{number}.traceback.txt")
                atomic_write_bytes(where, redact_url("".join(traceback.format_exception(exc))).encode(), durable=False)
                record.traceback_file = str(where)
        raise
    else:
        record.status = "succeeded"
    finally:
        record.ended_at = time.time()
        record.seconds = time.perf_counter() - t0
        _write(path, record)


def progress_reporter(record: AttemptRecord, *, min_interval_seconds: float = 0.5) -> Callable[..., None]:
    """A callback ``report(**facts)`` for a running attempt: it keeps the latest facts in
    ``record.details["progress"]`` and rewrites the attempt's record file at most every ``min_interval_seconds``
    (so ``heteroflow run`` can show them live). Without a run folder it only keeps them in memory."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    target = attempt_file(run_dir, record) if run_dir else None
    last = [0.0]

    def report(**facts: Any) -> None:
        record.details["progress"] = facts
        now = time.monotonic()
        if target is not None and now - last[0] >= min_interval_seconds:
            last[0] = now
            _write(target, record)

    return report


def attempt_files(step_dir: Path) -> list[Path]:
    """Every attempt record file of one step's folder: its own and its loop iterations' (``iteration-<i>/``, nested
    ones too)."""
    files = list(step_dir.glob("attempt-*.json"))
    for sub in step_dir.iterdir():
        if sub.is_dir() and sub.name.startswith("iteration-"):
            files += attempt_files(sub)
    return files


def record_order(record: Any) -> tuple[Any, ...]:
    """Sort key of attempt records (objects or dicts) of one step: by iteration (outside a loop first), then
    attempt number."""
    key = iteration_key(record)
    number = record.get("attempt") if isinstance(record, dict) else record.attempt
    return (key is not None, key or (), number or 0)


def read_step_records(run_dir: str | os.PathLike[str]) -> dict[str, list[AttemptRecord]]:
    """All attempt records of a run, by step name, each list in iteration order (a step inside a loop), then
    attempt order."""
    out: dict[str, list[AttemptRecord]] = {}
    root = Path(run_dir, "steps")
    if not root.is_dir():
        return out
    known = {field.name for field in dataclasses.fields(AttemptRecord)}
    for step_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        records = []
        for f in attempt_files(step_dir):
            data = json.loads(f.read_text(encoding="utf-8"))
            records.append(AttemptRecord(**{k: v for k, v in data.items() if k in known}))
        out[step_dir.name] = sorted(records, key=record_order)
    return out
