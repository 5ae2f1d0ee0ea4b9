"""How a :class:`~heteroflow.pipelines.graph.Pipeline` becomes Airflow tasks: names, edges, pools and the tasks
each decision skips. Plain Python (no Airflow import), so the shape of a DAG is testable on its own.

For every call of the pipeline:

- a call with one task (not device-bound, or one candidate) is the task ``<call>``;
- a device-bound call with n >= 2 candidates is a task group ``<call>`` holding one task per candidate
  (``<call>.<kind>-<k>``), a *fallback gate* before each later candidate (``<call>.fallback-to-<k>``) and a
  *join* (``<call>.done``), which the calls that read its outputs wait for.

Around them, the setup task ``prepare-run`` (checks the arguments, fixes the run folder) and the teardown task
``record-run`` (writes ``run.json``). Call names (``[a-z][a-z0-9_-]*``) may not be these two.

Fallback (DESIGN.md, "Resources, candidates, fallback"), with the trigger rule of each task:

=========================  ===================  ================================================================
task                       trigger rule         runs when
=========================  ===================  ================================================================
candidate 0                ``all_success``      everything it reads from (and the planner) succeeded
fallback gate k (k >= 1)   ``all_failed``       candidate k-1 failed (or could not start); the gate reads the
                                                failure class candidate k-1 reported: on a *device* failure it
                                                opens candidate k (or the next one the planner's inventory can
                                                serve), otherwise (permanent, transient retries spent, an
                                                upstream failure) it skips every later candidate
candidate k (k >= 1)       ``none_failed``      its gate opened it (or was skipped by the planner, which started
                                                the call at k), and everything it reads from succeeded
join                       ``one_success``      one candidate succeeded (else it is ``upstream_failed``)
=========================  ===================  ================================================================

A candidate that succeeds skips the later candidates and gates itself (before it reports success), and the
planner skips the candidates it passed over and the gates leading to its choice: so no skipped candidate ever
waits for a slot in its device pool, and `one_failed`/`all_failed` firing on ``upstream_failed`` never starts
a fallback (the gate looks at the failure class, not at the state).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

from heteroflow.components.errors import InvalidParameter, did_you_mean
from heteroflow.components.resources import ACCELERATORS, DeviceKind, Resources
from heteroflow.pipelines.graph import Call, Pipeline

__all__ = [
    "POOL_PREFIX",
    "PREPARE_TASK",
    "RECORD_TASK",
    "CallTasks",
    "Layout",
    "airflow_params",
    "pool_for",
    "pools_for_inventory",
    "safe_run_id",
]

PREPARE_TASK = "prepare-run"
"""The setup task: checks the run's arguments and fixes its run folder (XCom: ``run_dir``, ``run_id``,
``args``, ``started_at``)."""
RECORD_TASK = "record-run"
"""The teardown task: writes ``run.json`` from the attempt records, whatever ended the run."""
POOL_PREFIX = "heteroflow"
"""Pools are ``heteroflow-<kind>`` and ``heteroflow-<kind>-<model>`` (model: registry key, e.g. ``ascend-910b3``)."""

FAILURE_KEY = "heteroflow_failure"
"""XCom key under which a failed step task leaves its outcome (failure class, reason, candidate)."""
DECISION_KEY = "heteroflow_decision"
"""XCom key under which a fallback gate leaves what it decided and why."""


@dataclasses.dataclass(frozen=True, slots=True)
class CallTasks:
    """The task ids of one call.

    Attributes:
        call: the call's name.
        candidates: one task id per candidate (one id for a call with a single task).
        gates: ``gates[k]`` is the gate before candidate ``k`` (``gates[0]`` is None: candidate 0 has none).
        join: the task the readers of its outputs wait for (the single task, or the group's ``done``).
    """

    call: str
    candidates: tuple[str, ...]
    gates: tuple[str | None, ...]
    join: str

    @property
    def grouped(self) -> bool:
        """Whether the call is a task group (a device-bound call with several candidates)."""
        return len(self.candidates) > 1

    def after_success(self, k: int) -> list[str]:
        """What candidate ``k`` skips when it succeeds: every later candidate and gate."""
        return [*self.candidates[k + 1 :], *(g for g in self.gates[k + 1 :] if g)]

    def passed_over(self, start: int) -> list[str]:
        """What the planner skips when it starts the call at candidate ``start``: the candidates before it and
        the gates up to and including its own (so it starts without waiting for a gate)."""
        return [*self.candidates[:start], *(g for g in self.gates[1 : start + 1] if g)]

    def route(self, k: int, target: int | None) -> list[str]:
        """What gate ``k`` skips to open candidate ``target`` (>= k), or to stop the call (``target`` None):
        candidates ``k..target-1`` and gates ``k+1..target`` (all later ones when stopping)."""
        end = len(self.candidates) if target is None else target
        gates_end = len(self.candidates) - 1 if target is None else target
        return [*self.candidates[k:end], *(g for g in self.gates[k + 1 : gates_end + 1] if g)]


def _kind(resources: Resources) -> str:
    return DeviceKind(resources.kind).value


class Layout:
    """The task ids of every call of ``pipeline`` (see the module docstring)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.calls: dict[str, CallTasks] = {}
        for call in pipeline.calls:
            n = len(call.candidates) if call.device_bound else 1
            if n == 1:
                self.calls[call.name] = CallTasks(call.name, (call.name,), (None,), call.name)
                continue
            candidates = tuple(f"{call.name}.{_kind(r)}-{k}" for k, r in enumerate(call.candidates))
            gates = (None, *(f"{call.name}.fallback-to-{k}" for k in range(1, n)))
            self.calls[call.name] = CallTasks(call.name, candidates, gates, f"{call.name}.done")
        self.planner = pipeline.planner.name if pipeline.planner is not None else None

    def __getitem__(self, call: str) -> CallTasks:
        return self.calls[call]

    def upstream(self, call: Call) -> list[str]:
        """The tasks a call's first candidate waits for: ``prepare-run``, the producers of its inputs, and the
        planner when the call is placed by one."""
        from heteroflow.pipelines.volumes import run_after

        out = [PREPARE_TASK]
        for ref in call.input_refs().values():
            out.append(self.calls[ref.call].join)
        for name in run_after(self.pipeline, call):  # .after(): ordering without data
            out.append(self.calls[name].join)
        if call.device_bound and self.planner is not None and self.planner != call.name:
            out.append(self.calls[self.planner].join)
        return list(dict.fromkeys(out))

    def planner_skips(self, indices: Mapping[str, int]) -> list[str]:
        """What the planner skips for its decision ``{call: start index}``."""
        out: list[str] = []
        for call, start in indices.items():
            tasks = self.calls.get(call)
            if tasks is not None and isinstance(start, int) and 0 < start < len(tasks.candidates):
                out.extend(tasks.passed_over(start))
        return out


def safe_run_id(run_id: str) -> str:
    """An Airflow run id (``manual__2025-01-01T00:00:00+00:00``) as a folder name: ``[A-Za-z0-9._-]`` only."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", run_id).strip("-") or "run"


# --- pools ---------------------------------------------------------------------------------------------------


def pool_for(resources: Resources, *, prefix: str = POOL_PREFIX) -> tuple[str | None, int]:
    """The pool a task on ``resources`` takes slots from, and how many: the devices it uses.

    A candidate that names one accelerator model uses that model's pool (``heteroflow-npu-ascend-910b3``);
    any other accelerator candidate (a family, only a kind, or a kind without registry models such as a plugin's
    ``mlu``) uses its kind's pool (``heteroflow-gpu``). CPU candidates use Airflow's ``default_pool`` (returned
    as None) with one slot.

    Returns:
        ``(pool name or None, slots >= 1)``.
    """
    kind = _kind(resources)
    if not DeviceKind(kind).has_devices:
        return None, 1
    slots = max(int(resources.count or 1), 1)
    models = resources.accelerator_models if resources.accelerator_spec is not None else ()
    # a model pool exists only for registry models (pools_for_inventory): not for the stand-in model of a kind
    # that has none (a plugin kind's resource_name), whose devices all count in the kind's pool
    if len(models) == 1 and models[0].name in ACCELERATORS:
        return f"{prefix}-{kind}-{models[0].name}", slots
    return f"{prefix}-{kind}", slots


def pools_for_inventory(inventory: Any, *, prefix: str = POOL_PREFIX) -> dict[str, tuple[int, str]]:
    """The pools an inventory calls for: ``{name: (slots, description)}``, one per accelerator kind (its
    device count) and one per model the inventory names (that model's count). CPU gets none.

    Args:
        inventory: a :class:`heteroflow.components.placement.plan.Inventory`.
    """
    out: dict[str, tuple[int, str]] = {}
    for kind in (k for k in DeviceKind if k.has_devices):
        n = int(inventory.devices.get(kind, 0))
        out[f"{prefix}-{kind.value}"] = (n, f"heteroflow: one slot per {kind.value} device (any model)")
        for model, count in sorted((inventory.models.get(kind) or {}).items()):
            out[f"{prefix}-{kind.value}-{model}"] = (int(count), f"heteroflow: one slot per {model} device")
    return out


# --- parameters ----------------------------------------------------------------------------------------------

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def airflow_params(pipeline: Pipeline, overrides: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The DAG's params (Airflow ``Param`` keyword arguments), one per pipeline parameter: JSON-schema type,
    default, description (help and unit). A required parameter (or an optional one) also accepts null; the
    run's ``prepare-run`` task then says what is missing.

    Args:
        overrides: new defaults for some parameters (e.g. ``{"dataset_uri": "s3://bucket/data"}``).

    Raises:
        InvalidParameter: an override names no parameter, or has the wrong type.
    """
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(pipeline.params))
    if unknown:
        raise InvalidParameter(f"params: unknown parameter(s) {', '.join(unknown)}{did_you_mean(unknown, pipeline.params)}; valid: {', '.join(sorted(pipeline.params))}")
    out: dict[str, dict[str, Any]] = {}
    for p in pipeline.params.values():
        typ = _JSON_TYPES[p.type]
        default = p.check(overrides[p.name]) if p.name in overrides else (None if p.required else p.default)
        nullable = p.optional or default is None
        description = p.help + (f" (unit: {p.unit})" if p.unit else "")
        if p.required and p.name not in overrides:
            description += " (required)"
        out[p.name] = {
            "default": default,
            "type": [typ, "null"] if nullable else typ,
            "description": description,
        }
    return out


def check_calls(pipeline: Pipeline, names: Iterable[str], *, what: str) -> None:
    """Raise :class:`InvalidParameter` when ``names`` holds a name that is not a call of ``pipeline``."""
    unknown = sorted(set(names) - {c.name for c in pipeline.calls})
    if unknown:
        raise InvalidParameter(f"{what}: unknown call(s) {', '.join(unknown)}; calls: {', '.join(c.name for c in pipeline.calls)}")


def subset(pipeline: Pipeline, calls: Iterable[str], *, name: str, description: str = "") -> Pipeline:
    """A new pipeline of some of ``pipeline``'s calls (with their candidates, retries and bindings; the
    parameters they use keep their defaults, help and units), e.g. the data-producing calls for a DAG of their
    own.

    Raises:
        InvalidParameter: an unknown call, or a kept call reads an output of a call left out.
    """
    check_calls(pipeline, calls, what="subset")
    return pipeline.subset(calls, name=name, description=description)
