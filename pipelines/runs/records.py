"""Run records and run folders, for every engine (kfp.local, in-process, Airflow).

A run gets a folder (default ``./heteroflow-runs/<run id>``; Airflow: ``<run root>/<dag id>/<run id>``) holding:

- ``run.json``: the run record (:class:`RunRecord`), written atomically when the run ends, whatever the end
  (succeeded, failed, interrupted, or an engine crash); its format only ever gains fields;
- ``steps/<call>/attempt-<n>.json``: one record per attempt, written by the steps themselves
  (:mod:`heteroflow.components.core.telemetry`); a call inside a ``ParallelFor`` has one folder per iteration,
  ``steps/<call>/iteration-<i>/attempt-<n>.json``, its attempts numbered within the iteration;
- ``driver.json``: the driver's pid, run id, pipeline and parameters, written when the run starts (a folder with it
  and no ``run.json`` whose pid is gone was killed: :func:`recover_killed_runs`);
- engine files: kfp.local's ``kfp/`` (its pipeline root) and ``kfp.log``.

This module is what every engine uses to check a run's arguments (:func:`prepare_arguments`), set up its folder
(:func:`prepare_run_dir`, :func:`start_run`) and write its record (:func:`build_record`, :func:`write_record`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import os
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from heteroflow.cache.atomic import atomic_write_bytes
from heteroflow.cache.redact import redact_url
from heteroflow.components.errors import InvalidParameter
from heteroflow.components.core.step import ArtifactType
from heteroflow.components.core.telemetry import AttemptRecord, attempt_file, iteration_key, process_alive, read_step_records
from heteroflow.pipelines.graph import Pipeline

__all__ = [
    "DATASET_PARAM",
    "DRIVER_FILE",
    "IterationSummary",
    "RunInProgress",
    "RunRecord",
    "StepSummary",
    "build_record",
    "collect",
    "begin_run",
    "fallbacks",
    "finish_run",
    "new_run_id",
    "prepare_arguments",
    "prepare_run_dir",
    "recover_killed_runs",
    "start_run",
    "uninterrupted",
]

DATASET_PARAM = "dataset_uri"
"""A pipeline parameter of this name, left empty, takes the built-in digits sample (exported on first use)."""


# --- the run record ---------------------------------------------------------------------------------------


_STATUS_ORDER = ("running", "interrupted", "killed", "failed", "succeeded")
"""How a loop call's status follows from its iterations': the first of these any iteration has."""


@dataclasses.dataclass(slots=True, kw_only=True)
class IterationSummary:
    """One ``ParallelFor`` iteration of a call (Airflow's mapped task instance, KFP's loop iteration).

    Attributes:
        iteration: 0-based index in its loop (Airflow's ``map_index``; a nested loop's innermost index).
        outer_iterations: a nested loop's enclosing iterations, outermost first (empty otherwise).
        item: the loop item (JSON, abbreviated when long), None when unknown.
        status / device / kind / accelerator / candidate / simulated / attempts / seconds / compute_seconds /
            error / failure / details / traceback_file: as :class:`StepSummary`'s, for this iteration alone
            (``attempts``: its attempts, retries and fallbacks included).
    """

    iteration: int
    outer_iterations: list[int] = dataclasses.field(default_factory=list)
    item: Any = None
    status: str = "not run"
    device: str | None = None
    kind: str | None = None
    accelerator: str | None = None
    candidate: int | None = None
    simulated: bool = False
    attempts: int = 0
    seconds: float | None = None
    compute_seconds: float | None = None
    error: str | None = None
    failure: str | None = None
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    traceback_file: str | None = None

    @property
    def key(self) -> tuple[int, ...]:
        return (*self.outer_iterations, self.iteration)


@dataclasses.dataclass(slots=True, kw_only=True)
class StepSummary:
    """One call of a run.

    Attributes:
        name: the call's name.
        status: ``succeeded``, ``failed``, ``running``, ``killed`` (its process died mid-attempt) or ``not run``;
            a call inside a loop: the first of running, interrupted, killed, failed, succeeded that one of its
            iterations has.
        device: the device of its last attempt (``cpu``, ``cuda``...).
        kind / accelerator / candidate / simulated: the candidate its last attempt ran on.
        attempts: attempts over all candidates; for a call inside a loop, the most attempts one iteration took
            (each iteration's own count is in ``iterations``), so ``attempts`` above 1 always means a retry or a
            fallback.
        seconds: wall time of the last attempt inside the step process, seconds; inside a loop, the sum of every
            iteration's.
        compute_seconds: the step's own work in the last attempt, seconds (inside a loop: the iterations' sum).
        error: the last error; failure: its class (inside a loop: the first failed iteration's).
        details: the facts of the last attempt; a call inside a loop: empty (no one attempt's facts are the call's),
            each iteration's are in ``iterations`` (records written before this: the last iteration's).
        traceback_file: the file holding the last failed attempt's full traceback (None: none written).
        iterations: a call inside a ``ParallelFor``: one :class:`IterationSummary` per iteration that ran, in
            iteration order; empty outside a loop (and in records written before loops were recorded apart).
    """

    name: str
    status: str
    device: str | None = None
    kind: str | None = None
    accelerator: str | None = None
    candidate: int | None = None
    simulated: bool = False
    attempts: int = 0
    seconds: float | None = None
    compute_seconds: float | None = None
    error: str | None = None
    failure: str | None = None
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    traceback_file: str | None = None
    iterations: list[IterationSummary] = dataclasses.field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepSummary:
        """A summary as ``run.json`` holds it (a record of any version: unknown fields are left out)."""
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in known}
        it_known = {f.name for f in dataclasses.fields(IterationSummary)}
        fields["iterations"] = [
            IterationSummary(**{k: v for k, v in it.items() if k in it_known})
            for it in fields.get("iterations") or [] if isinstance(it, Mapping) and isinstance(it.get("iteration"), int)
        ]
        return cls(**fields)

    @classmethod
    def from_records(cls, name: str, records: list[AttemptRecord], *, finished: bool = False) -> StepSummary:
        if not records:
            return cls(name=name, status="not run")
        groups: dict[tuple[int, ...] | None, list[AttemptRecord]] = {}
        for r in records:
            groups.setdefault(iteration_key(r), []).append(r)
        if set(groups) == {None}:
            return cls._from_attempts(name, records, finished=finished)
        iterations = []
        for key in sorted(groups, key=lambda k: (k is not None, k or ())):
            one = cls._from_attempts(name, groups[key], finished=finished)
            iterations.append(
                IterationSummary(
                    iteration=key[-1] if key else 0,
                    outer_iterations=list(key[:-1]) if key else [],
                    item=groups[key][-1].item,
                    **{f.name: getattr(one, f.name) for f in dataclasses.fields(IterationSummary)
                       if f.name not in ("iteration", "outer_iterations", "item")},
                )
            )
        statuses = {it.status for it in iterations}
        status = next((s for s in _STATUS_ORDER if s in statuses), iterations[-1].status)
        last = max(records, key=lambda r: r.started_at)
        failed = next((it for it in iterations if it.status not in ("succeeded", "running")), None)

        def total(field: str) -> float | None:
            values = [getattr(it, field) for it in iterations if getattr(it, field) is not None]
            return sum(values) if values else None

        return cls(
            name=name,
            status=status,
            device=last.device,
            kind=last.kind,
            accelerator=last.accelerator,
            candidate=last.candidate,
            simulated=last.simulated,
            attempts=max(it.attempts for it in iterations),
            seconds=total("seconds"),
            compute_seconds=total("compute_seconds"),
            error=failed.error if failed is not None and status != "succeeded" else None,
            failure=failed.failure if failed is not None and status != "succeeded" else None,
            details={},  # each iteration's facts are its own (iterations[].details)
            traceback_file=failed.traceback_file if failed is not None and status != "succeeded" else None,
            iterations=iterations,
        )

    @classmethod
    def _from_attempts(cls, name: str, records: list[AttemptRecord], *, finished: bool) -> StepSummary:
        """The summary of one call's attempts outside a loop, or of one iteration's."""
        last = records[-1]
        status = last.status
        if status == "running" and (finished or not process_alive(last.pid)):
            status = "killed"
        failed = next((r for r in reversed(records) if r.status == "failed"), None)
        return cls(
            name=name,
            status=status,
            device=last.device,
            kind=last.kind,
            accelerator=last.accelerator,
            candidate=last.candidate,
            simulated=last.simulated,
            attempts=len(records),
            seconds=last.seconds,
            compute_seconds=last.compute_seconds,
            error=failed.error if failed and status != "succeeded" else (last.error if status != "succeeded" else None),
            failure=failed.failure if failed and status != "succeeded" else None,
            details=last.details,
            traceback_file=failed.traceback_file if failed and status != "succeeded" else None,
        )


@dataclasses.dataclass(slots=True, kw_only=True)
class RunRecord:
    """The record of one run, written to ``<run_dir>/run.json``.

    Attributes:
        run_id: ``YYYYmmdd-HHMMSS-xxxx``; for a run given its folder, the folder's name, ``-``, then one (unique: #28.12).
        pipeline: the pipeline's name.
        status: ``succeeded`` when every call succeeded (even if a stop came after that), ``interrupted`` after
            Ctrl-C or SIGTERM, ``killed`` when the run's process died without a record (written by the next run,
            :func:`recover_killed_runs`), else ``failed``.
        run_dir: the run's folder.
        started_at: Unix time, seconds.
        wall_seconds: wall time of the whole run, seconds.
        params: the pipeline arguments used.
        steps: one summary per call, in pipeline order.
        fallbacks: one entry per candidate a device-bound call left: ``step``, ``candidate`` (index), ``kind``,
            ``accelerator``, ``failure`` and ``reason``.
        metrics: per call, the metrics of its Metrics outputs.
        results: per call, the facts of its successful attempt. A call inside a ``ParallelFor`` has no entry in
            either (records written before this: its last iteration's): each iteration's facts are in
            ``steps[].iterations[].details``, in iteration order.
        placement: per placed call, the planner's decision (chosen resources, why earlier ones were passed over; on a
            node inventory also ``scores``: each candidate's score, feasibility and reason, ``why`` the winner won,
            and ``pod``: what its pod asks for, placed).
        testing: the testing settings in force (simulated devices, injected faults), if any.
        error: what stopped the run when it was not a step (an engine crash), else None.
    """

    run_id: str
    pipeline: str
    status: str
    run_dir: str
    started_at: float
    wall_seconds: float
    params: dict[str, Any]
    steps: list[StepSummary]
    fallbacks: list[dict[str, Any]]
    metrics: dict[str, dict[str, Any]]
    results: dict[str, dict[str, Any]]
    placement: dict[str, Any]
    testing: dict[str, str] = dataclasses.field(default_factory=dict)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def step(self, name: str) -> StepSummary:
        return next(s for s in self.steps if s.name == name)

    @property
    def compute_seconds(self) -> float:
        """Sum of the steps' own compute time (their work, without process start, imports and orchestration)."""
        return sum(s.compute_seconds or 0.0 for s in self.steps)

    def write(self) -> Path:
        """Write ``<run_dir>/run.json`` atomically, credentials in URLs redacted."""
        path = Path(self.run_dir) / "run.json"
        atomic_write_bytes(path, redact_url(json.dumps(self.to_dict(), indent=2, default=str)).encode())
        from heteroflow.pipelines.runs.report import write_run_outputs  # report.html, metrics.prom beside run.json (#17)

        write_run_outputs(path.parent)
        return path


def collect(run_dir: str | os.PathLike[str], pipeline: Pipeline, *, finished: bool = False) -> list[StepSummary]:
    """Summaries of the calls recorded so far under ``run_dir``, in pipeline order (then any others)."""
    records = read_step_records(run_dir)
    names = [c.name for c in pipeline.calls] + sorted(set(records) - {c.name for c in pipeline.calls})
    return [StepSummary.from_records(n, records.get(n, []), finished=finished) for n in names]


def fallbacks(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The candidates that device-bound calls left after a device failure, in the order they were left (a call
    inside a loop: each iteration's, with ``iteration``, and ``outer_iterations`` in a nested loop)."""
    out = []
    for call, records in read_step_records(run_dir).items():
        for r in records:
            if r.status == "failed" and r.failure == "device" and r.candidate is not None:
                key = iteration_key(r)
                later = [x for x in records if iteration_key(x) == key and x.candidate is not None and x.candidate > r.candidate]
                if later:
                    entry = {
                        "step": call,
                        "candidate": r.candidate,
                        "kind": r.kind,
                        "accelerator": r.accelerator,
                        "failure": r.failure,
                        "reason": r.error,
                        "at": r.ended_at,
                    }
                    if key is not None:
                        entry["iteration"] = r.iteration
                        if key[:-1]:  # a nested loop: the enclosing iterations too, outermost first
                            entry["outer_iterations"] = list(key[:-1])
                    out.append(entry)
    return sorted(out, key=lambda f: f["at"] or 0)


def close_stopped_attempts(run_dir: str | os.PathLike[str], ended_at: float) -> list[AttemptRecord]:
    """Mark the attempts a Ctrl-C or SIGTERM stopped while they ran: each attempt record still ``running`` is
    rewritten ``interrupted``, ended at ``ended_at`` (Unix time, the run's end) with its wall time in ``seconds``. A
    step process that was stopped before its own handler ran (SIGTERM, SIGKILL from the run) leaves such a record;
    one that caught the interrupt wrote ``interrupted`` itself. Returns the records rewritten."""
    from heteroflow.components.core.telemetry import _write

    closed = []
    for name, records in read_step_records(run_dir).items():
        for r in records:
            if r.status != "running":
                continue
            r.status, r.ended_at = "interrupted", max(ended_at, r.started_at)
            r.seconds = r.ended_at - r.started_at
            r.error = r.error or "stopped with the run (Ctrl-C or SIGTERM)"
            _write(attempt_file(run_dir, r), r)
            closed.append(r)
    return closed


def _loop_items(pipeline: Pipeline, call: Any, args: Mapping[str, Any], records: Mapping[str, list[AttemptRecord]]) -> list[Any] | None:
    """The list ``call``'s innermost loop iterated over, as far as the run's arguments and records tell it: a
    literal list, a list parameter's value, or an output parameter of a call that succeeded; else None."""
    from heteroflow.pipelines.control import ValueRef
    from heteroflow.pipelines.graph import ParamRef

    loops = [g for g in getattr(call, "groups", ()) if g.kind == "loop"]
    if not loops:
        return None
    items = loops[-1].items
    if isinstance(items, ParamRef):
        items = args.get(items.name)
    elif isinstance(items, ValueRef):
        done = [r for r in records.get(items.call, []) if r.status == "succeeded"]
        try:
            items = pipeline[items.call].step.returned_values(done[-1].details)[items.output] if done else None
        except (KeyError, TypeError, ValueError):
            items = None
    return items if isinstance(items, list) else None


def fill_loop_items(run_dir: str | os.PathLike[str], pipeline: Pipeline, args: Mapping[str, Any]) -> int:
    """Give each attempt record of a loop iteration that names no item (an engine that could not tell the step
    its item: kfp.local) the item of its index in the loop's list (:func:`_loop_items`), rewriting its file.
    Returns how many records were filled in."""
    from heteroflow.components.core.telemetry import _write, recorded_item

    records = read_step_records(run_dir)
    filled = 0
    for call in getattr(pipeline, "calls", ()):
        missing = [r for r in records.get(call.name, []) if r.iteration is not None and r.item is None]
        if not missing:
            continue
        items = _loop_items(pipeline, call, args, records)
        for r in missing:
            if items is not None and 0 <= r.iteration < len(items) and items[r.iteration] is not None:
                r.item = recorded_item(items[r.iteration])
                _write(attempt_file(run_dir, r), r)
                filled += 1
    return filled


def add_not_run_iterations(pipeline: Pipeline, args: Mapping[str, Any], steps: list[StepSummary],
                           records: Mapping[str, list[AttemptRecord]]) -> list[StepSummary]:
    """``steps`` with, for each call of a (not nested) ``ParallelFor`` the run reached (a call of that loop has an
    iteration recorded), an iteration ``not run`` for each item of the loop's list (:func:`_loop_items`) that has no
    attempt of the call: an iteration in which an earlier call of the loop failed, or one the engine could not start.
    Iterations ``not run`` do not change the call's status (that of the iterations that ran; ``not run`` when none did)."""
    from heteroflow.components.core.telemetry import recorded_item

    reached = {
        id(g)
        for c in getattr(pipeline, "calls", ())
        for g in getattr(c, "groups", ())
        if g.kind == "loop" and any(iteration_key(r) is not None for r in records.get(c.name, []))
    }
    out = []
    for summary in steps:
        call = next((c for c in getattr(pipeline, "calls", ()) if c.name == summary.name), None)
        loops = [g for g in getattr(call, "groups", ()) if g.kind == "loop"] if call is not None else []
        items = _loop_items(pipeline, call, args, records) if len(loops) == 1 and id(loops[0]) in reached else None
        have = {it.iteration for it in summary.iterations if not it.outer_iterations}
        missing = [i for i in range(len(items or [])) if i not in have]
        if missing:
            added = [IterationSummary(iteration=i, item=recorded_item(items[i]), status="not run") for i in missing]  # type: ignore[index]
            summary = dataclasses.replace(summary, iterations=sorted([*summary.iterations, *added], key=lambda it: it.key))
        out.append(summary)
    return out


def build_record(
    pipeline: Pipeline,
    *,
    run_id: str,
    folder: Path,
    started: float,
    wall_seconds: float,
    args: Mapping[str, Any],
    interrupted: bool,
    error: str | None = None,
    testing: Mapping[str, str] | None = None,
) -> RunRecord:
    """The :class:`RunRecord` of a finished run, from its attempt records (an interrupted run's attempts still
    marked running are closed first: :func:`close_stopped_attempts`)."""
    if interrupted:
        close_stopped_attempts(folder, started + wall_seconds)
    fill_loop_items(folder, pipeline, args)
    steps = add_not_run_iterations(pipeline, args, collect(folder, pipeline, finished=True), read_step_records(folder))
    by_name = {s.name: s for s in steps}
    # a call inside a condition or a loop may legitimately not run (a branch not taken, an empty list)
    optional = {c.name for c in pipeline.calls if any(g.kind != "pipeline" for g in getattr(c, "groups", ()))}
    if error is None and all(by_name[c.name].status == "succeeded" or (c.name in optional and by_name[c.name].status == "not run") for c in pipeline.calls):
        status = "succeeded"  # even if a stop came after the last step had completed: say what completed
    elif interrupted:
        status = "interrupted"
        # a step still running when Ctrl-C or SIGTERM came was stopped with the run, not killed: one word for it in
        # run.json, the summary table and the report's attempts (sections._attempts)
        steps = [dataclasses.replace(s, status="interrupted") if s.status == "killed" else s for s in steps]
        by_name = {s.name: s for s in steps}
    else:
        status = "failed"
    metrics: dict[str, dict[str, Any]] = {}
    results: dict[str, dict[str, Any]] = {}
    placement: dict[str, Any] = {}
    for call in pipeline.calls:
        summary = by_name[call.name]
        if summary.status != "succeeded" or summary.iterations:  # a loop call: its iterations carry their facts
            continue
        results[call.name] = dict(summary.details)
        for spec in call.step.outputs:
            if spec.type is ArtifactType.METRICS:
                try:
                    metrics.setdefault(call.name, {}).update(spec.metadata_for(summary.details))
                except (KeyError, TypeError, ValueError):  # facts without the metrics (an older record)
                    pass
        if call.step.planner:
            placement = dict(summary.details.get("placements", {}))
    return RunRecord(
        run_id=run_id,
        pipeline=pipeline.name,
        status=status,
        run_dir=str(folder),
        started_at=started,
        wall_seconds=wall_seconds,
        params={k: redact_url(v) if isinstance(v, str) else v for k, v in args.items()},
        steps=steps,
        fallbacks=[{k: v for k, v in f.items() if k != "at"} for f in fallbacks(folder)],
        metrics=metrics,
        results=results,
        placement=placement,
        testing=dict(testing or {}),
        error=error,
    )


# --- preparing a run ---------------------------------------------------------------------------------------


def check_dataset(uri: str) -> None:
    """Fail early, with a message that says what to do, when a data set source is missing, refused, empty or
    needs a driver that is not installed (the same listing prewarm uses: :func:`heteroflow.cache.prewarm.check_source`).
    A host that does not answer is left to the prewarm step, which retries it.

    Raises:
        DatasetError: see :func:`~heteroflow.cache.prewarm.check_source`.
    """
    from heteroflow.cache.errors import SourceUnavailable
    from heteroflow.cache.prewarm import check_source

    try:
        check_source(uri)
    except SourceUnavailable:
        pass


def prepare_arguments(pipeline: Pipeline, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """Every argument of a run of ``pipeline``, checked before anything runs: every problem found is reported, in
    one message, before prewarm copies anything.

    A ``dataset_uri`` parameter left empty takes the built-in digits sample; a local data set path is made
    absolute and checked: its listing, and, when the pipeline preprocesses it, its content
    (:func:`heteroflow.components.data.precheck.dataset_problems`: every image Pillow cannot read, class folders
    without images, a single class, tables that cannot be read). The parameters are checked by every step's check
    (ranges, factories importable, ``model_args`` against the model factory).

    Raises:
        InvalidParameter: unknown parameters, values of the wrong type or out of range (the steps' checks).
        DatasetError: a local data set folder that is missing, empty, holds no supported file, or the problems of
            its content above.
        RunProblems: problems of both kinds (an ``InvalidParameter`` and a ``DatasetError``): one message lists each.
    """
    from heteroflow.components.errors import Problems

    problems = Problems()
    given = dict(params or {})
    uri = ""
    if DATASET_PARAM in pipeline.params:
        uri = given.get(DATASET_PARAM)
        if not uri:
            from heteroflow.components.data.datasets import export_digits

            uri = str(export_digits())
        elif "://" not in uri:
            uri = str(Path(uri).expanduser().resolve())
        given[DATASET_PARAM] = uri
        with problems.check():
            check_dataset(uri)
    listed = not problems
    args = pipeline.arguments(given, problems=problems)
    pipeline.check(args, problems=problems, names=pipeline.given_names(given))  # each problem named as given
    preprocess_params = _preprocess_params(pipeline, args)
    if uri and listed and "://" not in uri and preprocess_params is not None:
        from heteroflow.cache.errors import DatasetError
        from heteroflow.components.data.precheck import dataset_problems

        for message in dataset_problems(uri, preprocess_params):
            problems.add(DatasetError(message))
    problems.raise_all("this run (nothing was run; fix each and rerun)")
    return args


def _preprocess_params(pipeline: Pipeline, args: Mapping[str, Any]) -> dict[str, Any] | None:
    """The parameters of the pipeline's (first) call of the shipped preprocess step (those with a valid value);
    None without such a call."""
    from heteroflow.components.data.preprocess import PREPROCESS
    from heteroflow.pipelines.graph import ParamRef

    for call in pipeline.calls:
        if call.step is PREPROCESS:
            return {
                key: args[b.name] if isinstance(b, ParamRef) else b.value
                for key, b in call.param_bindings().items()
                if (b.name in args if isinstance(b, ParamRef) else hasattr(b, "value"))  # not a value known at run time
            }
    return None


DRIVER_FILE = "driver.json"
"""Written into a run folder when the run starts (pid, run id, pipeline, parameters); a folder with it and no
``run.json`` whose pid is gone is a run that was killed (:func:`recover_killed_runs`)."""


_RUN_FILES = ("run.json", "steps", "kfp", DRIVER_FILE)


def prepare_run_dir(folder: Path) -> Path:
    """Create the run folder, so that rerunning the same command resumes an unfinished run.

    A folder that holds an earlier run which did not succeed (failed, interrupted, or killed: its driver process is
    gone) is moved aside to ``<folder>.previous-<n>`` (a killed one first gets its ``run.json``), and the new run
    starts in an empty ``<folder>``; train resumes from its checkpoint and prewarm reuses what is cached.

    Raises:
        InvalidParameter: ``folder`` is a file, cannot be created, holds a run that succeeded (a run's records are
            never overwritten), or holds a run that is still going.
    """
    if folder.exists() and not folder.is_dir():
        raise InvalidParameter(f"run folder {folder} is a file; give --output a new or empty folder")
    if folder.is_dir() and any((folder / name).exists() for name in _RUN_FILES):
        _set_aside_unfinished(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidParameter(
            f"cannot create the run folder {folder}: {exc.strerror or exc}; give --output a folder you can write"
        ) from None
    return folder.resolve()


def _set_aside_unfinished(folder: Path) -> None:
    try:
        driver = json.loads((folder / DRIVER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        driver = {}
    if not (folder / "run.json").exists():
        if process_alive(driver.get("pid")):
            raise InvalidParameter(f"run folder {folder} holds a run that is still going (pid {driver['pid']}); give --output another folder")
        recover_killed_runs(folder.parent, only=folder)
    try:
        status = json.loads((folder / "run.json").read_text(encoding="utf-8")).get("status")
    except (OSError, ValueError):
        status = None
    if status == "succeeded":
        raise InvalidParameter(f"run folder {folder} already holds a run that succeeded; give --output a new or empty folder")
    n = 1
    while folder.with_name(f"{folder.name}.previous-{n}").exists():
        n += 1
    aside = folder.with_name(f"{folder.name}.previous-{n}")
    folder.rename(aside)
    print(f"run folder {folder} held a run that did not succeed ({status or 'killed'}): moved aside to {aside}; "
          "this run starts there afresh and train resumes from its checkpoint", file=sys.stderr, flush=True)


def recover_killed_runs(root: Path, *, only: Path | None = None) -> list[Path]:
    """Give every killed run under ``root`` (a run folder with ``driver.json`` but no ``run.json``, whose driver
    process is gone) its ``run.json``: status ``killed``, each step as its attempt records left it (a ``running``
    attempt of a dead process reads ``killed``), in the pipeline's order with the calls that never started ``not
    run`` (``driver.json``'s ``calls``; an older one without them: in the order the steps started), and its time
    up to the last write in its folder (a killed attempt's progress and checkpoints, not only the records' times).
    Returns the folders recovered. Called when a run starts beside them, and by ``heteroflow runs``."""
    recovered = []
    if not root.is_dir():
        return recovered
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and (only is None or p == only)):
        driver, record = folder / DRIVER_FILE, folder / "run.json"
        if not driver.is_file() or record.exists():
            continue
        try:
            info = json.loads(driver.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if process_alive(info.get("pid")):
            continue
        started = float(info.get("started_at", 0.0) or 0.0)
        # its time runs to the last write in its folder: a running attempt rewrites its record with its progress
        RunRecord(
            **_record_so_far(folder, info, finished=True),
            status="killed",
            wall_seconds=max(0.0, _last_write(folder) - started),
            metrics={},
            results={},
            placement={},
            error=f"the run's process (pid {info.get('pid')}) ended without writing its record (killed)",
        ).write()
        shutil.rmtree(folder / "tmp", ignore_errors=True)  # the steps' scratch folder
        recovered.append(folder)
    return recovered


def _record_so_far(folder: Path, info: Mapping[str, Any], *, finished: bool) -> dict[str, Any]:
    """The fields of a run record that its folder and ``driver.json`` (``info``) hold without its driver: id,
    pipeline, folder, start, parameters, steps (see :func:`recover_killed_runs`), fallbacks."""
    records = read_step_records(folder)
    calls = [str(c) for c in info.get("calls") or []]
    if calls:
        names = calls + sorted(set(records) - set(calls))
    else:  # a driver.json from before the calls were listed
        names = sorted(records, key=lambda n: min((r.started_at for r in records[n]), default=0.0))
    return {
        "run_id": info.get("run_id", folder.name),
        "pipeline": info.get("pipeline", ""),
        "run_dir": str(folder),
        "started_at": info.get("started_at", 0.0),
        "params": info.get("params", {}),
        "steps": [StepSummary.from_records(n, records.get(n, []), finished=finished) for n in names],
        "fallbacks": [{k: v for k, v in f.items() if k != "at"} for f in fallbacks(folder)],
    }


def _last_write(folder: Path) -> float:
    """The latest modification time (Unix time) of a file under ``folder``, 0.0 when none can be read."""
    latest = 0.0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                latest = max(latest, os.stat(os.path.join(dirpath, name)).st_mtime)
    return latest


def running_record(folder: Path) -> dict[str, Any] | None:
    """What a run that is still going (``driver.json``, no ``run.json``, its driver process alive) has done so far,
    as a run record's fields (status ``running``, its time so far), for ``heteroflow runs``; None for a folder
    that is no such run (a killed one gets its record from :func:`recover_killed_runs` instead)."""
    driver = folder / DRIVER_FILE
    if not driver.is_file() or (folder / "run.json").exists():
        return None
    try:
        info = json.loads(driver.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not process_alive(info.get("pid")):
        return None
    fields = _record_so_far(folder, info, finished=False)
    record = RunRecord(**fields, status="running", wall_seconds=max(0.0, time.time() - float(info.get("started_at") or time.time())),
                       metrics={}, results={}, placement={}, error=None)
    return record.to_dict()


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def run_id_for(folder: Path, run_dir: str | os.PathLike[str] | None, run_id: str) -> str:
    """The run id of a run in ``folder``: ``run_id`` (from :func:`new_run_id`) in the default folder, else
    ``<folder name>-<run_id>``: unique even when two ``--output`` paths end in the same folder name (their records
    and Prometheus files are keyed by the id), and still found by the folder name as a prefix."""
    return run_id if run_dir is None else f"{folder.name}-{run_id}"




def start_run(pipeline: Pipeline, run_dir: str | os.PathLike[str] | None, args: Mapping[str, Any]) -> tuple[Path, str, float]:
    """Set up a run's folder (:func:`prepare_run_dir`; default ``./heteroflow-runs/<run id>``), give earlier killed
    runs beside it their record, and write ``driver.json``. Returns ``(folder, run id, started at)`` (Unix time).

    Raises:
        InvalidParameter: see :func:`prepare_run_dir`.
    """
    run_id = new_run_id()
    folder = prepare_run_dir(Path(run_dir) if run_dir is not None else Path.cwd() / "heteroflow-runs" / run_id)
    run_id = run_id_for(folder, run_dir, run_id)
    recover_killed_runs(folder.parent)
    started = time.time()
    driver = {"pid": os.getpid(), "run_id": run_id, "pipeline": pipeline.name, "params": dict(args), "started_at": started,
              "calls": [c.name for c in pipeline.calls]}  # the record of a run killed before its end lists them all
    atomic_write_bytes(folder / DRIVER_FILE, redact_url(json.dumps(driver, default=str)).encode(), durable=False)
    return folder, run_id, started


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunInProgress:
    """A run an engine has started (:func:`begin_run`): what :meth:`finish` needs to write its record, so every
    engine ends a run the same way.

    Attributes:
        pipeline: the pipeline that runs.
        run_id / folder / started: as :func:`start_run` returns them (``started``: Unix time, seconds).
        args: the run's checked arguments (:func:`prepare_arguments`).
        testing: the testing settings in force (:func:`heteroflow.pipelines.environment.testing_environment`).
    """

    pipeline: Pipeline
    run_id: str
    folder: Path
    started: float
    args: Mapping[str, Any]
    testing: Mapping[str, str] | None = None

    def finish(self, *, wall_seconds: float, interrupted: bool, error: str | None = None) -> RunRecord:
        """Write and return the run's record (:func:`finish_run`).

        Args:
            wall_seconds: the engine's wall time for the run, seconds.
            interrupted: the engine was stopped (Ctrl-C, or SIGTERM through the CLI) before it finished.
            error: what stopped the run when it was not a step (an engine crash), else None.

        Raises:
            KeyboardInterrupt: see :func:`finish_run`.
        """
        return finish_run(
            self.pipeline,
            run_id=self.run_id,
            folder=self.folder,
            started=self.started,
            wall_seconds=wall_seconds,
            args=self.args,
            interrupted=interrupted,
            error=error,
            testing=self.testing,
        )


def begin_run(
    pipeline: Pipeline,
    run_dir: str | os.PathLike[str] | None,
    args: Mapping[str, Any],
    *,
    testing: Mapping[str, str] | None = None,
) -> RunInProgress:
    """Start a run (:func:`start_run`: its folder, ``driver.json``) and return what ends it
    (:meth:`RunInProgress.finish`).

    Raises:
        InvalidParameter: see :func:`prepare_run_dir`.
    """
    folder, run_id, started = start_run(pipeline, run_dir, args)
    return RunInProgress(pipeline=pipeline, run_id=run_id, folder=folder, started=started, args=args, testing=testing)


@contextlib.contextmanager
def uninterrupted() -> Iterator[list[int]]:
    """Hold Ctrl-C and SIGTERM while a run's record is written, so the record, the message and the exit status
    tell one story; a signal that came meanwhile is raised as ``KeyboardInterrupt`` afterwards, unless the
    caller clears the yielded list (a run that had already succeeded). Outside the main thread, does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    held: list[int] = []
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def hold(signum: int, frame: object) -> None:
        held.append(signum)

    for s in previous:
        signal.signal(s, hold)
    try:
        yield held
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if held:
        raise KeyboardInterrupt


def release_kept_trainings(record: RunRecord) -> list[str]:
    """Once ``record``'s run succeeded, remove the checkpoint folders its train steps kept their finished model in
    (a step result's ``kept_checkpoint``: :func:`heteroflow.components.training.checkpoint_lock.keep_finished`);
    kept while the run had not succeeded, for a rerun to take instead of training again. Never raises.

    Returns:
        The folders removed.
    """
    if record.status != "succeeded":
        return []
    from heteroflow.components.training.checkpoint_lock import release_kept

    return [str(r["kept_checkpoint"]) for r in record.results.values()
            if isinstance(r, Mapping) and r.get("kept_checkpoint") and release_kept(str(r["kept_checkpoint"]))]


def finish_run(
    pipeline: Pipeline,
    *,
    run_id: str,
    folder: Path,
    started: float,
    wall_seconds: float,
    args: Mapping[str, Any],
    interrupted: bool,
    error: str | None = None,
    testing: Mapping[str, str] | None = None,
) -> RunRecord:
    """Write the run's record (:func:`build_record`) with Ctrl-C and SIGTERM held (:func:`uninterrupted`), so the
    record, the message and the exit status tell one story: a stop that comes once the engine has finished
    changes nothing (the run ended as recorded: succeeded or failed); a run stopped before its steps completed is
    ``interrupted``, and only then is the stop raised.

    Args:
        interrupted: the engine was stopped (Ctrl-C, or SIGTERM through the CLI) before it finished.

    Raises:
        KeyboardInterrupt: ``interrupted`` and not every step succeeded; its ``record`` attribute is the record
            written (what the CLI shows).
    """
    with uninterrupted() as held:
        record = build_record(
            pipeline,
            run_id=run_id,
            folder=folder,
            started=started,
            wall_seconds=wall_seconds,
            args=args,
            interrupted=interrupted,
            error=error,
            testing=testing,
        )
        record.write()
        held.clear()  # a stop that came once the engine had finished: the run had ended as its record says
    release_kept_trainings(record)
    if interrupted and record.status != "succeeded":
        stop = KeyboardInterrupt()
        stop.record = record  # type: ignore[attr-defined]
        raise stop
    return record
