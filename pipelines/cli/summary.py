"""What ``heteroflow run`` prints: the steps table (live while the run goes on: status, device, attempts, seconds,
progress, a retry's countdown) and, once it ends, the run's summary (where each device-bound step ran and why, its
fallbacks and retries, the steps' own summaries or what failed, the record's path)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from heteroflow.components.core.telemetry import where_ran
from heteroflow.pipelines.cli.common import console, whole_cells

__all__: list[str] = []


def _short_error(error: str | None) -> str:
    """``heteroflow.cache.errors.DatasetError: msg`` -> ``msg`` (our errors' messages say it all);
    any other exception keeps its type name."""
    if not error:
        return ""
    kind, sep, message = error.partition(": ")
    return message if sep and kind.startswith("heteroflow.") else error


def _progress_text(details: dict[str, Any]) -> str:
    p = details.get("progress") or {}
    if not p:
        return ""
    parts = []
    if "epoch" in p:
        parts.append(f"epoch {p['epoch']}/{p.get('epochs', '?')}")
    if "loss" in p:
        parts.append(f"loss {p['loss']:.4g}")  # significant digits: a loss of 3e-05 is not 0.0000
    if "samples_per_second" in p:
        parts.append(f"{p['samples_per_second']:,.0f} samples/s")
    if "files" in p:
        parts.append(f"{p['files']}/{p.get('files_total', '?')} files")
    if "bytes" in p:
        parts.append(f"{p['bytes'] / 2**20:,.1f} MiB")
    if not parts and p.get("waiting"):  # what the step waits for (a lock, a mixed job's agents)
        return str(p["waiting"])
    # device_kind: where it runs (the device column says it)
    return ", ".join(parts) or ", ".join(f"{k} {v}" for k, v in p.items() if k != "device_kind")


def _steps_table(steps: list[Any], pipeline: Any = None) -> Table:
    """The steps table; with ``pipeline`` (while a run goes on) seconds tick and a transient failure waiting for
    its retry shows ``retrying in N s (attempt k of n)`` (:func:`heteroflow.pipelines.cli.runs.live_state`). A step
    inside a loop is one row, ``train ×3``: its attempts are the most one iteration took, its seconds the
    iterations' sum, and its progress says how the iterations ended (``3 iterations: 3 succeeded``)."""
    import os
    import time

    from heteroflow.components.core.telemetry import RUN_DIR_ENV
    from heteroflow.pipelines.cli.runs import live_state, read_attempts
    from heteroflow.pipelines.runs.folders import iterations_note, step_label

    records = read_attempts(os.environ.get(RUN_DIR_ENV)) if pipeline is not None else {}
    now = time.time()
    table = Table(title="steps", title_justify="left")
    for col, justify in (
        ("step", "left"),
        ("status", "left"),
        ("device", "left"),
        ("attempts", "right"),
        ("seconds", "right"),
        ("progress", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    colours = {"succeeded": "green", "failed": "red", "running": "yellow", "retrying": "yellow", "killed": "red", "interrupted": "yellow"}
    for s in steps:
        status, seconds, note = s.status, s.seconds, ""
        if pipeline is not None:
            retry = pipeline[s.name].retry if s.name in pipeline else None
            status, seconds, note = live_state(s, records.get(s.name, []), retry, now)
        colour = colours.get(status, "dim")
        device = where_ran(s.kind, s.device, accelerator=s.accelerator, simulated=s.simulated,
                           details=s.details)  # one wording (#28 item 17)
        if s.candidate:
            device += f" [candidate {s.candidate}]"
        if not note and s.status != "running":
            note = iterations_note(s)  # a loop step (`train ×3`): how its iterations ended
        table.add_row(
            escape(step_label(s)),
            f"[{colour}]{status}[/]",
            escape(device),
            str(s.attempts) if s.attempts else "-",
            f"{seconds:.2f}" if seconds is not None else "-",
            # a step stopped mid-way (Ctrl-C, or killed) keeps its last progress: where it stopped (a trial found the
            # table after Ctrl-C cleared it)
            escape(note or (_progress_text(s.details) if s.status in ("running", "interrupted", "killed") else "")),
        )
    return whole_cells(table)


def _waiting_lines(steps: list[Any], seen: set[str]) -> list[str]:
    """What a step says it waits for (train waiting for an identical training's lock), once per step and text:
    printed as a line of its own on any console, a terminal's or a log's, not only in the live table."""
    out = []
    for s in steps:
        waiting = ((s.details or {}).get("progress") or {}).get("waiting") if isinstance(s.details, dict) else None
        if waiting and f"{s.name}\0{waiting}" not in seen:
            seen.add(f"{s.name}\0{waiting}")
            out.append(f"{s.name}: {waiting}")
    return out


def _live_console() -> Console:
    """A console bound to the terminal as it is now: kfp.local's output is redirected into kfp.log during the
    run, and a console that looks up ``sys.stdout`` at each write would follow it there."""
    return Console(file=sys.stdout, soft_wrap=True)


RUN_LABELS = frozenset({"report", "record", "next", "retries", "fallback", "engine error", "traceback"})
"""The labels of the run's own summary lines (``report: <path>``, ``next: ...``): a step's summary line that starts with
one (a step of yours named ``report`` printed ``report: files 4`` beside the run's ``report: <path>``) is printed as
``step report: files 4``."""


def _print_record(record: Any, pipeline: Any, *, elapsed: float | None = None, engine: str | None = None) -> None:
    """Print the run's summary (module docstring). ``elapsed``: the seconds the command waited for the engine, said
    beside the record's time where it is 2 s (and a quarter) longer, not kfp.local's usual second or two: the ``airflow`` engine's record times the
    DAG's run, from prepare-run to record-run, not Airflow's start-up before it (a new user's trial: "run succeeded
    in 6.4 s" after 19.7 s)."""
    from heteroflow.pipelines.runs.folders import fallback_step, ran_on

    if record.status == "submitted":  # a backend runs it (engine kfp): no steps here yet, and nothing failed
        kfp = record.results.get("kfp") or {}
        console.print(f"run submitted to {escape(str(kfp.get('host', 'the backend')))} as run {escape(str(kfp.get('run_id', '?')))}; "
                      f"record: {escape(str(record.run_dir))}/run.json", highlight=False)
        if kfp.get("url"):
            console.print(f"next: watch it in the Kubeflow UI: {escape(str(kfp['url']))}", highlight=False)
        return
    console.print(_steps_table(record.steps))
    as_dict = record.to_dict()
    for call, decision in record.placement.items():
        ran = ran_on(as_dict, call)  # where it ran in the end, as the table and the report say (#28 item 17)
        console.print(
            f"placement of {call}: {escape(ran)}" if ran else
            f"placement of {call}: candidate {decision.get('index')} -> [bold]{decision.get('device_kind')}[/] (placed; it did not run)",
            highlight=False,
        )
        for why in decision.get("passed_over", []):
            console.print(f"  passed over: {escape(why)}", highlight=False)
    for f in record.fallbacks:
        accel = f" ({f['accelerator']})" if f.get("accelerator") else ""
        console.print(
            f"fallback: {fallback_step(f)} left candidate {f['candidate']} ({f['kind']}{accel}) after a {f['failure']} "
            f"failure: {escape(_short_error(f['reason']))}",
            highlight=False,
        )
    from heteroflow.pipelines.cli.runs import retry_lines  # retries and the time spent waiting (#17)

    for line in retry_lines(record.run_dir):
        console.print(escape(line), highlight=False)
    if record.status == "succeeded":
        for call in pipeline.calls:
            for line in call.step.summarize(record.results.get(call.name, {})):
                if line.split(":", 1)[0] in RUN_LABELS:  # a step of yours named report: not taken for the run's report line
                    line = f"step {line}"
                console.print(escape(line), highlight=False)
    else:
        for s in record.steps:
            if s.status in ("failed", "killed"):
                kind = f" ({s.failure} failure)" if s.failure else ""
                console.print(f"[red]step {s.name} {s.status}{kind}:[/] {escape(_short_error(s.error))}", highlight=False)
                if s.traceback_file:  # where in your code (a model or dataset factory, a step) it was raised
                    console.print(f"  traceback: {escape(s.traceback_file)}", highlight=False)
        if record.error:
            console.print(f"[red]engine error:[/] {escape(record.error)}", highlight=False)
    report = Path(record.run_dir, "report.html")
    if report.is_file():
        console.print(f"report: {escape(str(report))}", highlight=False)
    took = f"{record.wall_seconds:.1f} s"
    if elapsed is not None and elapsed > record.wall_seconds + max(2.0, 0.25 * record.wall_seconds):
        took += f" ({elapsed:.1f} s with {f'the {engine} engine' if engine else 'the engine'}'s start-up)"
    console.print(f"run {record.status} in {took}; record: {escape(str(record.run_dir))}/run.json", highlight=False)
    from heteroflow.pipelines.cli.runs import next_line  # what to run next, with this run's id and model

    engine_log = Path(record.run_dir, "kfp.log")  # kfp.local's own output; the in-process engine has none
    console.print(escape(next_line(as_dict, engine_log=engine_log if engine_log.is_file() else None)), highlight=False)

