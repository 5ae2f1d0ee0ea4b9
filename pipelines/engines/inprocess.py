"""Run a :class:`~heteroflow.pipelines.graph.Pipeline` in this process, for tests and quick iteration.

The same definition and the same per-attempt code path (:func:`heteroflow.components.core.runtime.run_step`) as the
KFP and Airflow renderings, with DESIGN.md's failure semantics carried out in Python:

- a *transient* failure is retried on the same candidate, waiting ``RetryPolicy.delay_seconds(n)`` before
  retry n, while the next retry would still start inside the policy's total window;
- a *device* failure of a device-bound call moves to its next candidate at once (no retry spent);
- a *permanent* failure (or a device failure with no candidate left) fails the run; nothing after it runs
  (inside a ``ParallelFor``: nothing after it in its iteration; the other iterations still run, then the loop
  fails: :mod:`heteroflow.pipelines.engines.control_run`).

Calls run one after another in the pipeline's order; artifacts live under ``<run dir>/artifacts/<call>/<name>``.
The run folder and ``run.json`` are :mod:`heteroflow.pipelines.runs.records`' (the same for every engine). Ctrl-C (or
SIGTERM through the CLI) stops the run between attempts' records: ``run.json`` says ``interrupted`` and the same
command resumes (train from its checkpoint).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from heteroflow.components.core.fallback import next_candidate, retry_decision
from heteroflow.components.core.runtime import LocalArtifact, Outcome, run_step
from heteroflow.components.core.telemetry import Iteration
from heteroflow.pipelines.graph import Call, Pipeline
from heteroflow.pipelines.environment import environ, step_environment, testing_environment
from heteroflow.pipelines.runs.prerendering import prewarm as prewarm_report
from heteroflow.pipelines.runs.records import RunRecord, begin_run, prepare_arguments
from heteroflow.pipelines.volumes import make_local_volumes, remove_local_volumes, step_env, warn_local_packages

__all__ = ["run_call", "run_inprocess"]


def run_call(
    call: Call,
    *,
    params: Mapping[str, Any],
    inputs: Mapping[str, str],
    outputs: Mapping[str, str],
    start: int = 0,
    placements: Mapping[str, str] | None = None,
    placement: Mapping[str, int] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    iteration: Iteration | None = None,
) -> Outcome:
    """Run one call with its retry policy and, if device-bound, its fallback chain from candidate ``start``.

    Args:
        placement: the plan's device counts by kind (its ``inventory`` fact): later candidates it cannot serve are
            passed over (:func:`heteroflow.components.core.fallback.next_candidate`); None: no planner.
        iteration: the ``ParallelFor`` iteration the call runs in (None outside a loop): its attempts, retries
            and fallbacks are that iteration's.

    Returns:
        The last attempt's outcome (``succeeded``, or the failure that stopped the call).
    """
    index = start if call.device_bound else 0
    while True:
        first_started = time.monotonic()
        retry = 0
        while True:
            outcome = run_step(
                call.step,
                call=call.name,
                params=params,
                inputs=inputs,
                outputs={k: LocalArtifact(v) for k, v in outputs.items()},
                candidate=call.candidates[index],
                candidate_index=index if call.device_bound else None,
                placements=placements,
                iteration=iteration,
            )
            delay = retry_decision(call.retry, outcome.route, retry, time.monotonic() - first_started)
            if delay is None:
                break
            sleep(delay)
            retry += 1
        decision = next_candidate(call, index, outcome.route, placement)
        if decision.action != "fallback":
            return outcome
        assert decision.target is not None
        index = decision.target


def run_inprocess(
    pipeline: Pipeline,
    params: Mapping[str, Any] | None = None,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    simulate_devices: Sequence[str] | str | None = None,
    inject_faults: Sequence[str] | str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> RunRecord:
    """Run ``pipeline`` in this process and return (and write) its :class:`RunRecord`.

    Args:
        pipeline: the pipeline.
        params: its arguments (see :func:`heteroflow.pipelines.runs.records.prepare_arguments`).
        run_dir: the run folder; default ``./heteroflow-runs/<run id>``.
        simulate_devices / inject_faults: the testing settings (:mod:`heteroflow.components.core.failures`).
        sleep: how to wait between retries (tests pass a no-op).

    Raises:
        InvalidParameter / DatasetError: bad arguments, checked before anything runs.
    """
    from heteroflow.pipelines.control import has_control
    from heteroflow.pipelines.subpipelines import check_runnable
    from heteroflow.pipelines.engines.control_run import run_control

    check_runnable(pipeline)
    with testing_environment(simulate_devices, inject_faults, pipeline=pipeline) as testing:
        args = prepare_arguments(pipeline, params)
        for call in pipeline.calls:  # refused before the run starts: a volume this engine cannot stand in for
            step_env(call, engine="inprocess")
        warn_local_packages(pipeline.calls, engine="inprocess")
        active = begin_run(pipeline, run_dir, args, testing=testing)
        folder, run_id = active.folder, active.run_id
        make_local_volumes(pipeline.calls, folder, engine="inprocess")  # PVCs as folders of the run (deleted below)
        prewarm_report()  # matplotlib imports while the steps run, not after them
        t0 = time.perf_counter()
        produced: dict[tuple[str, str], str] = {}
        starts: dict[str, int] = {}
        inventory: dict[str, int] | None = None
        interrupted = False
        try:
            with environ(step_environment(folder, run_id)):
                controlled = has_control(pipeline)
                if controlled:  # output parameters, conditions, loops, sub-pipelines
                    run_control(pipeline, args, folder, sleep=sleep)
                for call in () if controlled else pipeline.calls:
                    outputs = {s.name: str(folder / "artifacts" / call.name / s.name) for s in call.step.outputs}
                    inputs = {name: produced[(ref.call, ref.output)] for name, ref in call.input_refs().items()}
                    with environ(step_env(call, engine="inprocess")):  # the call's env and volume folders
                        outcome = run_call(
                            call,
                            params=pipeline.call_params(call, args),
                            inputs=inputs,
                            outputs=outputs,
                            start=starts.get(call.name, 0),
                            placements=pipeline.placements() if call.step.planner else None,
                            placement=inventory,
                            sleep=sleep,
                        )
                    if outcome.status != "succeeded":
                        break
                    produced.update({(call.name, k): v for k, v in outputs.items()})
                    if call.step.planner:
                        starts.update(outcome.facts.get("indices", {}))
                        found = outcome.facts.get("inventory")
                        inventory = dict(found) if isinstance(found, Mapping) else None
        except KeyboardInterrupt:
            interrupted = True
        finally:
            remove_local_volumes(folder)  # a CreatePVC lives for the run (KFP's DeletePVC at its end)
        record = active.finish(wall_seconds=time.perf_counter() - t0, interrupted=interrupted)
    return record
