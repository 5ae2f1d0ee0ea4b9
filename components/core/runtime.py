"""Run one step attempt: the code path every engine shares.

:func:`run_step` is what ``heteroflow step`` (a process or a container), the KFP lightweight components
(kfp.local and a cluster), the in-process runner and Airflow tasks call. For one attempt of one step on one
candidate it:

1. works out the device: the candidate's torch device type, or the CPU when its kind is simulated
   (``HETEROFLOW_SIMULATE_DEVICES``, see :mod:`heteroflow.components.core.failures`);
2. records the attempt (``<run dir>/steps/<call>/attempt-<n>.json``, when a run folder is known);
3. raises an injected fault if ``HETEROFLOW_INJECT_FAULT`` asks for one;
4. calls the step's function with its parameters, the artifacts' local paths and the injected values;
5. turns the return value into facts (checked to be finite), writes them into the output artifacts' metadata
   and into the files of the outputs the function does not write itself;
6. classifies any exception (:func:`~heteroflow.components.core.failures.classify`) and returns an
   :class:`Outcome` instead of raising: the engine decides what the failure class means (retry, fall back,
   fail).

Exit codes of ``heteroflow step`` (:data:`EXIT_CODES`): 0 succeeded, 2 usage error, 3 permanent failure,
4 device failure, 5 transient failure, 130 interrupted.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from heteroflow.components.errors import HeteroflowError, InvalidParameter, did_you_mean
from heteroflow.components.core.failures import FailureClass, classify, injected_fault, simulated_devices
from heteroflow.components.resources import DeviceKind, Resources
from heteroflow.components.core.step import ArtifactType, Step
from heteroflow.components.core.telemetry import RUN_DIR_ENV, Iteration, progress_reporter, step_attempt

__all__ = [
    "DRIVER_PID_ENV",
    "EXIT_CODES",
    "ArtifactLike",
    "LocalArtifact",
    "NonFiniteValue",
    "Outcome",
    "TransientStepFailure",
    "candidate_from_json",
    "candidate_to_json",
    "run_step",
]

DRIVER_PID_ENV = "HETEROFLOW_DRIVER_PID"
"""The process that runs the whole pipeline (``heteroflow run``). A step process started under it watches it and
ends itself when it is gone, so a killed run leaves no step training on as an orphan (holding its checkpoint)."""

EXIT_CODES: Mapping[str, int] = {
    "succeeded": 0,
    "usage": 2,
    FailureClass.PERMANENT.value: 3,
    FailureClass.DEVICE.value: 4,
    FailureClass.TRANSIENT.value: 5,
    "interrupted": 130,
}
"""``heteroflow step`` exit status per outcome."""


class ArtifactLike(Protocol):
    """What an engine hands a step for an artifact: a local ``path`` and a ``metadata`` dict
    (``kfp.dsl.Artifact`` has both)."""

    path: str
    metadata: dict[str, Any]


@dataclasses.dataclass(slots=True)
class LocalArtifact:
    """An artifact outside KFP: a local path and its metadata (written beside it by ``heteroflow step``)."""

    path: str
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


class NonFiniteValue(HeteroflowError, FloatingPointError):
    """A step produced a non-finite number (NaN or infinity) in its facts; the message names where."""


class TransientStepFailure(HeteroflowError, RuntimeError):
    """Raised by an engine shim to make the engine retry a step after a transient failure."""


@dataclasses.dataclass(slots=True, kw_only=True)
class Outcome:
    """The result of one attempt.

    Attributes:
        call: the call's name in the pipeline (``train``).
        step: the step's name.
        status: ``succeeded`` or ``failed``.
        failure: the failure class when failed (``device``, ``transient``, ``permanent``).
        reason: the one-line reason when failed (``Type: message``).
        candidate: index of the candidate tried (None for a step without device).
        kind / accelerator: that candidate's device kind and model.
        device: the torch device type the work ran on (``cpu`` for a simulated kind).
        simulated: the kind was simulated.
        attempt: the attempt's number within the run (1-based; 1 without a run folder).
        facts: the step's facts (JSON-ready), including ``indices`` for a planner.
    """

    call: str
    step: str
    status: str
    failure: str | None = None
    reason: str | None = None
    candidate: int | None = None
    kind: str = dataclasses.field(default_factory=lambda: DeviceKind.host().value)
    accelerator: str | None = None
    device: str = "cpu"
    simulated: bool = False
    attempt: int = 1
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def route(self) -> str:
        """What the engine routes on: ``succeeded``, ``device``, ``transient`` or ``permanent``."""
        return "succeeded" if self.status == "succeeded" else str(self.failure)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.route]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def candidate_to_json(index: int, resources: Resources) -> str:
    """The candidate an engine hands a device-bound step: ``{"index": k, "resources": {...}}``."""
    return json.dumps({"index": index, "resources": resources.to_dict()}, sort_keys=True)


def candidate_from_json(text: str) -> tuple[int, Resources]:
    """Read what :func:`candidate_to_json` wrote, or a bare ``Resources`` dict / ``KIND:key=value`` spec (index 0).

    Raises:
        InvalidParameter: not one of those forms (the message shows them).
    """
    text = text.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InvalidParameter(f"candidate {text!r} is not JSON ({exc})") from None
        if "resources" in data:
            index = data.get("index", 0)
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise InvalidParameter(f"candidate index {index!r} is not an integer >= 0")
            return index, Resources.from_dict(data["resources"])
        return 0, Resources.from_dict(data)
    return 0, Resources.parse_spec(text)


_WATCHING: dict[str, int] = {}


def _watch_driver(poll_seconds: float = 0.5) -> None:
    """Start (once per process) a daemon thread that SIGKILLs this process when the pipeline's driver process
    (``$HETEROFLOW_DRIVER_PID``) is gone. The attempt record stays ``running`` with this process's pid, which the
    next run reads as killed; the checkpoint lock dies with the process."""
    text = os.environ.get(DRIVER_PID_ENV, "")
    if not text.isdigit() or int(text) == os.getpid() or _WATCHING:
        return
    driver = int(text)
    _WATCHING["pid"] = driver
    import signal
    import threading

    def watch() -> None:
        while True:
            time.sleep(poll_seconds)
            try:
                os.kill(driver, 0)
            except ProcessLookupError:
                os.kill(os.getpid(), signal.SIGKILL)
            except PermissionError:
                pass

    threading.Thread(target=watch, name="heteroflow-driver-watch", daemon=True).start()


def _finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise NonFiniteValue(f"{where} is {value}: a step result must be a finite number")
    if isinstance(value, Mapping):
        for k, v in value.items():
            _finite(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _finite(v, f"{where}[{i}]")


def _write_outputs(step: Step, outputs: Mapping[str, ArtifactLike], facts: dict[str, Any]) -> None:
    for spec in step.outputs:
        artifact = outputs.get(spec.name)
        if artifact is None:
            continue
        artifact.metadata.update(spec.metadata_for(facts))
        if spec.param is None:
            path = Path(artifact.path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(facts, indent=2, sort_keys=True, default=str), encoding="utf-8")
        if spec.type is ArtifactType.METRICS and hasattr(artifact, "log_metric"):
            for key, value in spec.metadata_for(facts).items():
                artifact.log_metric(key, value)


def run_step(
    step: Step,
    *,
    call: str | None = None,
    params: Mapping[str, Any] | None = None,
    inputs: Mapping[str, str | os.PathLike[str] | ArtifactLike] | None = None,
    outputs: Mapping[str, str | os.PathLike[str] | ArtifactLike] | None = None,
    candidate: Resources | None = None,
    candidate_index: int | None = None,
    placements: Mapping[str, str] | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    iteration: Iteration | None = None,
) -> Outcome:
    """Run one attempt of ``step`` and return its :class:`Outcome` (see the module docstring).

    Args:
        step: the step.
        call: the call's name in the pipeline (records go under it); default the step's name.
        params: parameter values; a missing one takes the step's default (a required one must be given).
        inputs / outputs: artifact name -> local path (or an :class:`ArtifactLike`); every input is required,
            a missing output gets no file.
        candidate: the candidate to run on (device-bound steps); default the step's first.
        candidate_index: its index in the step's candidate list (for records); default 0 for a device-bound step,
            else none.
        placements: for a planner step, ``{call: candidates JSON}`` of the calls it places.
        run_dir: the run folder for attempt records and fault counters; default ``$HETEROFLOW_RUN_DIR``.
        iteration: the ``ParallelFor`` iteration this attempt runs in (its index and item), None outside a loop:
            the attempt is recorded under that iteration, numbered among its attempts alone.

    Returns:
        The outcome; a failure is returned, not raised (``KeyboardInterrupt``/``SystemExit`` propagate).

    Raises:
        InvalidParameter: unknown or missing parameters or artifacts (a usage error: nothing ran).
    """
    call = call or step.name
    _watch_driver()
    values = _bind_params(step, params or {})
    in_paths = {name: _as_artifact(value) for name, value in (inputs or {}).items()}
    out_arts = {name: _as_artifact(value) for name, value in (outputs or {}).items()}
    for name in in_paths:
        step.input(name)
    for name in out_arts:
        step.output(name)
    missing = [s.name for s in step.inputs if s.name not in in_paths]
    if missing:
        raise InvalidParameter(f"step {call!r} needs input artifact(s) {', '.join(missing)} (--input NAME=PATH)")

    folder = Path(run_dir) if run_dir is not None else (Path(os.environ[RUN_DIR_ENV]) if os.environ.get(RUN_DIR_ENV) else None)
    if folder is not None:
        os.environ[RUN_DIR_ENV] = str(folder)  # the records of this attempt go there

    res = candidate if candidate is not None else step.candidates[0]
    # a step that is not device-bound has no candidate to record (kfp.local recorded 0 for every call, the in-process
    # engine none, so `heteroflow runs` listed a device for every step of a kfp.local run)
    index = candidate_index if candidate_index is not None else (0 if candidate is None and step.device_bound else None)
    kind_obj = DeviceKind(res.kind)
    kind = kind_obj.value
    simulated = kind in simulated_devices()
    device = kind_obj.simulated_device_type if simulated else res.torch_device_type
    accel = res.accelerator_spec
    outcome = Outcome(
        call=call,
        step=step.name,
        status="running",
        candidate=index,
        kind=kind,
        accelerator=accel.name if accel is not None else None,
        device=device,
        simulated=simulated,
    )

    kwargs: dict[str, Any] = dict(values)
    for spec in step.inputs:
        if spec.param:
            kwargs[spec.param] = in_paths[spec.name].path
    for spec in step.outputs:
        if spec.param:
            if spec.name not in out_arts:
                raise InvalidParameter(f"step {call!r} needs output artifact {spec.name!r} (--output NAME=PATH)")
            kwargs[spec.param] = out_arts[spec.name].path
            Path(out_arts[spec.name].path).parent.mkdir(parents=True, exist_ok=True)  # as KFP does for outputs
    if step.device_param:
        kwargs[step.device_param] = device
    if step.resources_param:
        kwargs[step.resources_param] = res
    if step.placements_param:
        kwargs[step.placements_param] = json.dumps(dict(placements or {}), sort_keys=True)

    failure = None
    try:
        with step_attempt(
            call,
            device=device,
            candidate=index,
            kind=kind,
            accelerator=outcome.accelerator,
            simulated=simulated,
            iteration=iteration,
        ) as record:
            outcome.attempt = record.attempt
            reporter = progress_reporter(record) if (step.progress_param or step.progress_context) else None
            if step.progress_param:
                kwargs[step.progress_param] = reporter
            try:
                fault = injected_fault(call, kind, state_dir=folder, iteration=None if iteration is None else (*iteration.outer, iteration.index))
                if fault is not None:
                    raise fault
                called = time.perf_counter()
                try:
                    if step.progress_context is not None:
                        with step.progress_context(reporter):
                            result = step.func(**kwargs)
                    else:
                        result = step.func(**kwargs)
                finally:
                    record.call_seconds = time.perf_counter() - called
                facts = step.to_facts(result)
                step.returned_values(facts)  # every output parameter there, of its type
                _finite(facts, f"step {call!r} result")
                _write_outputs(step, out_arts, facts)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:
                failure = classify(exc)
                record.failure = failure.cls.value
                raise
            record.details = dict(facts)
            seconds = facts.get("seconds")
            record.compute_seconds = float(seconds) if isinstance(seconds, (int, float)) else None
            if facts.get("device"):
                record.device = str(facts["device"])
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # classified above (or here, if recording failed), returned to the engine
        failure = failure or classify(exc)
        outcome.status = "failed"
        outcome.failure = failure.cls.value
        outcome.reason = failure.reason
        return outcome
    outcome.status = "succeeded"
    outcome.facts = facts
    if facts.get("device"):
        outcome.device = str(facts["device"])
    return outcome


def _as_artifact(value: str | os.PathLike[str] | ArtifactLike) -> ArtifactLike:
    if isinstance(value, (str, os.PathLike)):
        return LocalArtifact(os.fspath(value))
    return value


def _bind_params(step: Step, given: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(given) - set(step.param_names))
    if unknown:
        raise InvalidParameter(
            f"step {step.name!r} has no parameter(s) {', '.join(unknown)}{did_you_mean(unknown, step.param_names)}; valid: {', '.join(step.param_names) or 'none'}"
        )
    out: dict[str, Any] = {}
    for p in step.params:
        if p.name in given:
            value = given[p.name]
            out[p.name] = p.coerce(value) if isinstance(value, str) and p.type is not str else p.check(value)
        elif p.required:
            raise InvalidParameter(f"step {step.name!r} needs parameter {p.name!r} ({p.type.__name__}): {p.help}")
    return out


# --- the KFP lightweight components' entry -----------------------------------------------------------------

KFP_FAILURE = "heteroflow_failure"
RETRY_ON_ENV = "HETEROFLOW_RETRY_ON"
"""Set to ``any`` on a KFP task whose call's policy says ``retry_on="any"``: :func:`kfp_task` then raises on a
permanent failure too, so that KFP retries it (KFP's own behaviour) instead of routing it to the check task."""
KFP_CANDIDATE = "heteroflow_candidate"
KFP_PLACEMENTS = "heteroflow_placements"
KFP_PLACED_PREFIX = "heteroflow_placed_"
KFP_AFTER_PREFIX = "heteroflow_after_"
"""``heteroflow_after_<call>``: the route of a call this task reads from; anything but ``succeeded`` means the task
does not run (route ``upstream``: an upstream failure never starts a step, nor a fallback)."""
KFP_CANDIDATES = "heteroflow_candidates"
"""The call's whole candidate list (JSON), so the task decides its fallback with
:func:`heteroflow.components.core.fallback.next_candidate`."""
KFP_INVENTORY = "heteroflow_inventory"
"""The plan's device counts by kind (JSON; the planner's output, an input of the candidates it placed)."""
KFP_PLAN_INVENTORY = "heteroflow_plan_inventory"
"""The planner's output: the device counts by kind it placed against (JSON)."""
KFP_ARGUMENTS = "heteroflow_arguments"
"""A fallback chain's candidate tasks take the call's parameters as one JSON object (name -> value), made by the
chain's top-level ``<call>: arguments`` task from the pipeline's typed parameters: one channel through the
chain's condition groups instead of one per parameter (KFP declares every channel in every group it crosses)."""
KFP_URI_PREFIX = "heteroflow_uri_"
"""``heteroflow_uri_<output>``: outputs of a candidate task of a fallback chain, its artifacts' URIs (the chain
imports the chosen candidate's artifacts from these: kfp.local cannot select among artifacts with ``dsl.OneOf``)."""


_FAST_EXIT: dict[str, bool] = {}


def _skip_teardown_after_success() -> None:
    """Make this step process end with ``os._exit(0)`` once it has finished without an unhandled exception.

    A step process that imported torch spends 0.5-2 s tearing the interpreter down after KFP's executor has
    written its output file; nothing is left to do by then (our records are closed, the executor's output file
    is written with ``with open``). An unhandled exception (``sys.excepthook`` runs before ``atexit``) keeps the
    normal exit and its non-zero status; kfp's executor never calls ``sys.exit``.
    """
    if _FAST_EXIT:
        return
    import atexit
    import sys

    _FAST_EXIT["failed"] = False
    previous_hook = sys.excepthook

    def hook(*exc_info: Any) -> None:
        _FAST_EXIT["failed"] = True
        previous_hook(*exc_info)

    def exit_now() -> None:
        if not _FAST_EXIT["failed"]:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    sys.excepthook = hook
    atexit.register(exit_now)


def kfp_task(ref: str, call: str, args: dict[str, Any]) -> str:
    """Run one attempt inside a KFP lightweight component (the generated shim's whole body).

    Args:
        ref: the step's ``module:attribute``.
        call: the call's name.
        args: the shim's arguments: artifacts (KFP artifact objects), parameters, and the reserved
            ``heteroflow_*`` inputs and outputs (candidate JSON, the call's candidates, the plan's inventory,
            placements JSON, upstream routes, the planner's per-call start files, the
            artifact URIs file).

    Returns:
        The route the pipeline branches on: ``succeeded``; ``to-<k>`` (a device failure: fall back to candidate
        ``k``, the decision of :func:`heteroflow.components.core.fallback.next_candidate`); ``failed: <class>: <reason>``
        (permanent, or a device failure with no candidate left); ``upstream`` (a call it reads from did not
        succeed, so it did not run).

    Raises:
        TransientStepFailure: a transient failure, so that KFP retries the task with its backoff.
    """
    from types import SimpleNamespace

    from heteroflow.components.core.fallback import next_candidate
    from heteroflow.components.resources import Candidates
    from heteroflow.components.core.step import load_step

    _skip_teardown_after_success()
    args = dict(args)
    bundled = args.pop(KFP_ARGUMENTS, None)
    if bundled:
        args.update(json.loads(bundled))
    args.pop(KFP_FAILURE, None)  # kept out of the shims since routes carry their reason
    candidate_json = args.pop(KFP_CANDIDATE, None)
    candidates_json = args.pop(KFP_CANDIDATES, None)
    inventory_json = args.pop(KFP_INVENTORY, None)
    placements_json = args.pop(KFP_PLACEMENTS, None)
    uri_paths = {k[len(KFP_URI_PREFIX):]: args.pop(k) for k in list(args) if k.startswith(KFP_URI_PREFIX)}
    plan_inventory_path = args.pop(KFP_PLAN_INVENTORY, None)
    placed = {k[len(KFP_PLACED_PREFIX):]: args.pop(k) for k in list(args) if k.startswith(KFP_PLACED_PREFIX)}
    after = {k[len(KFP_AFTER_PREFIX):]: args.pop(k) for k in list(args) if k.startswith(KFP_AFTER_PREFIX)}
    outputs: dict[str, Any] = {}
    route = "failed"
    reason = ""
    indices: dict[str, Any] = {}
    # a call inside a loop, read after it (Collected), has one route per iteration
    blocked = sorted(name for name, r in after.items() if (any(x != "succeeded" for x in r) if isinstance(r, list) else r != "succeeded"))
    value_paths: dict[str, str] = {}
    values: dict[str, Any] = {}
    try:
        step = load_step(ref)
        inputs = {s.name: args.pop(s.name) for s in step.inputs}
        outputs = {s.name: args.pop(s.name) for s in step.outputs}
        value_paths = {p.name: args.pop(p.name) for p in step.returns if p.name in args}
        if blocked:
            route, reason = "upstream", f"not run: {', '.join(blocked)} did not succeed"
        else:
            index, resources = candidate_from_json(candidate_json) if candidate_json else (None, None)
            outcome = run_step(
                step,
                call=call,
                params=args,
                inputs=inputs,
                outputs=outputs,
                candidate=resources,
                candidate_index=index,
                placements=json.loads(placements_json) if placements_json else None,
                iteration=_kfp_local_iteration(),
            )
            reason = outcome.reason or ""
            if outcome.status == "succeeded":
                route = "succeeded"
                values = step.returned_values(outcome.facts)
                indices = outcome.facts.get("indices", {})
                if plan_inventory_path is not None:
                    Path(plan_inventory_path).parent.mkdir(parents=True, exist_ok=True)
                    Path(plan_inventory_path).write_text(json.dumps(outcome.facts.get("inventory") or {}), encoding="utf-8")
            elif outcome.failure == FailureClass.TRANSIENT.value:
                route = "transient"
            elif outcome.failure == FailureClass.DEVICE.value and candidates_json and index is not None:
                inventory = json.loads(inventory_json) if inventory_json else None
                cands = SimpleNamespace(name=call, candidates=Candidates.from_json(candidates_json), device_bound=True)
                decision = next_candidate(cands, index, "device", inventory, reason=reason)
                route = f"to-{decision.target}" if decision.action == "fallback" else "failed"
                reason = f"{outcome.failure}: {decision.why}" if route == "failed" else reason
            else:
                reason = f"{outcome.failure}: {reason}"
                if outcome.failure == FailureClass.PERMANENT.value and os.environ.get(RETRY_ON_ENV) == "any":
                    route = "transient"  # retry_on="any": KFP retries it; its last failure fails the run
    except HeteroflowError as exc:  # the task itself is malformed (a usage error): never worth a retry
        route, reason = "failed", f"{FailureClass.PERMANENT.value}: {exc}"
    if plan_inventory_path is not None and not Path(plan_inventory_path).exists():
        Path(plan_inventory_path).parent.mkdir(parents=True, exist_ok=True)
        Path(plan_inventory_path).write_text("{}", encoding="utf-8")
    for name, path in placed.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        start = indices.get(name, -1) if route == "succeeded" else -1
        Path(path).write_text(f"to-{start}" if isinstance(start, int) and start >= 0 else "upstream", encoding="utf-8")
    if route != "succeeded":
        for artifact in outputs.values():  # never leave an output a consumer or an importer cannot find
            target = Path(artifact.path)
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(f"not produced: {reason}\n", encoding="utf-8")
    if value_paths:
        _write_values(step, value_paths, values)
    for name, path in uri_paths.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(str(getattr(outputs.get(name), "uri", "")), encoding="utf-8")
    if route == "transient":
        if reason.startswith(f"{FailureClass.PERMANENT.value}: "):
            raise TransientStepFailure(f"step {call!r} failed (retry_on='any': retried with backoff): {reason}")
        raise TransientStepFailure(f"step {call!r} failed with a transient error (retried with backoff): {reason}")
    return f"failed: {route_text(reason)}" if route == "failed" else route


_KFP_ITERATION = re.compile(r"^for-loop-\d+-iteration-(\d+)$")


def _kfp_local_iteration() -> Iteration | None:
    """The ``ParallelFor`` iteration this KFP task runs in, on kfp.local: kfp.local runs iteration ``i`` of a loop
    task ``for-loop-<n>`` as a task named ``for-loop-<n>-iteration-<i>`` and roots every task inside it under that
    name (``<pipeline root>/<run>/for-loop-1-iteration-0/train/``: kfp 2.17's enhanced DAG orchestrator), which
    kfp's executor sets as the task root (``dsl.get_uri``). Only a task under the run folder's pipeline root
    (``$HETEROFLOW_RUN_DIR/kfp``, where heteroflow's kfp.local runs put it) is looked at: None for a task outside
    a loop, on a cluster (no run folder: nothing is recorded there) or with another layout. The loop item is not
    known here; the run's record fills it in from the loop's list."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        return None
    try:
        from kfp.dsl.types import artifact_types

        root = artifact_types.CONTAINER_TASK_ROOT
    except ImportError:  # pragma: no cover - kfp_task runs under kfp's executor
        return None
    if not root:
        return None
    try:
        parts = Path(root).resolve().relative_to(Path(run_dir, "kfp").resolve()).parts
    except ValueError:
        return None
    indices = [int(m.group(1)) for m in map(_KFP_ITERATION.match, parts) if m]
    return Iteration(index=indices[-1], outer=tuple(indices[:-1])) if indices else None


def _write_values(step: Step, paths: Mapping[str, str], values: Mapping[str, Any]) -> None:
    """Write the output parameters into KFP's output files (a string as it is, anything else as JSON, as KFP's
    backend reads ``dsl.OutputPath`` files). A call that did not succeed writes its type's empty value: the files
    must exist for KFP, and nothing reads them without checking the call's route first."""
    empty = {str: "", int: 0, float: 0.0, bool: False, list: [], dict: {}}
    for p in step.returns:
        if p.name not in paths:
            continue
        value = values.get(p.name, empty.get(p.type)) if p.name in values else empty.get(p.type)
        Path(paths[p.name]).parent.mkdir(parents=True, exist_ok=True)
        text = value if isinstance(value, str) and p.type is str else json.dumps(value)
        Path(paths[p.name]).write_text(text, encoding="utf-8")


def route_text(reason: str) -> str:
    """``reason`` as route text: JSON string escapes, and ``'`` as ``\\u0027``, so that no quote, backslash or newline
    reaches an engine's condition evaluator (kfp.local pastes values into a Python expression between single
    quotes). :func:`route_reason` reads it back."""
    return json.dumps(reason, ensure_ascii=True)[1:-1].replace("'", "\\u0027")


def route_reason(text: str) -> str:
    """The reason :func:`route_text` encoded."""
    try:
        return str(json.loads(f'"{text}"'))
    except ValueError:
        return text
