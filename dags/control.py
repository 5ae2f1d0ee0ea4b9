"""Airflow rendering of output parameters, conditions, loops and sub-pipelines
(:mod:`heteroflow.pipelines.control`), used by :func:`heteroflow.dags.factory.build_dag`.

- **Output parameters: XCom.** A step task's XCom (its outcome record) carries ``values``: its output parameters
  by name. A task that reads one pulls it from the producer's task(s) (the candidate that succeeded) and depends on
  the producer; in kubernetes mode the value is added to the pod's ``heteroflow step`` arguments
  (``--param NAME=VALUE``, JSON for anything but a string) when the task starts.
- **Conditions: branching by skip.** A task inside an ``If``/``Elif``/``Else`` branch evaluates the branch's
  condition (and the earlier branches') from XCom and the run's arguments when it starts, and skips itself
  (``AirflowSkipException``) when its branch is not taken; the branch's later tasks are then skipped by Airflow's
  ``all_success`` rule. The run record counts a call in a branch not taken as not run, not failed.
- **Loops: a mapped task group.** A ``ParallelFor`` is a ``MappedTaskGroup`` named after the loop (what
  ``@task_group(...).expand(loop_item=...)`` builds): over the literal list, or over the list an ``<loop>-items``
  task returns (a list pipeline parameter, or an output parameter: known only when the run starts). Each of its
  calls is a task of the group, so Airflow runs one instance of it per item (``map_index``: the item's index, whose
  item the task reads when it starts) and, as KFP runs a loop's iterations, the instances of one index depend only on
  each other: a failed ``train[1]`` leaves ``evaluate[1]`` ``upstream_failed`` and ``evaluate[0]``/``[2]`` running
  (with plain mapped tasks, every ``evaluate`` instance waited for, and failed with, every ``train`` instance).
  What reads the loop from outside waits for every instance. Each instance writes its artifacts under
  ``artifacts/<call>/<map index>/``; ``Collected`` pulls the values of every instance, in map-index order. Airflow
  maps one level: nested loops, and fallback chains inside a loop, raise an error that names the alternative.
- **Sub-pipelines: a TaskGroup each.** Their calls are calls of the pipeline (``<sub>__<call>``), tasks like any
  other, inside a ``TaskGroup`` named after the sub-pipeline call (``prefix_group_id=False``: the task ids stay the
  calls' names, which the rest of the rendering uses).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException

from heteroflow.components.errors import InvalidParameter
from heteroflow.dags.layout import PREPARE_TASK, Layout
from heteroflow.dags.operators import StepOperator
from heteroflow.dags.pods import PodStepOperator
from heteroflow.pipelines.control import CollectedRef, Group, LoopItem, ValueRef, evaluate
from heteroflow.pipelines.graph import Call, ParamRef, Pipeline

__all__ = ["ControlPodOperator", "ControlStepOperator", "LoopItemsOperator", "check_renderable", "control_upstream", "loop_of"]


def loop_of(call: Call) -> Group | None:
    """The loop ``call`` is inside, or None."""
    return next((g for g in call.groups if g.kind == "loop"), None)


def check_renderable(pipeline: Pipeline) -> None:
    """Raise for what the Airflow rendering cannot express (see the module docstring).

    Raises:
        InvalidParameter: nested loops, or a call with several candidates inside a loop (naming the alternative).
    """
    for call in pipeline.calls:
        loops = [g for g in call.groups if g.kind == "loop"]
        if len(loops) > 1:
            raise InvalidParameter(
                f"Airflow: {call.name} is inside {len(loops)} nested ParallelFor loops; Airflow's dynamic task mapping maps "
                "one level: loop over one list of combinations instead, or run the pipeline with kfp / kfp-local / inprocess"
            )
        if loops and call.device_bound and len(call.candidates) > 1:
            raise InvalidParameter(
                f"Airflow: {call.name} has {len(call.candidates)} candidates inside a ParallelFor; a fallback chain is not "
                "mapped: give it one candidate inside the loop, or run the pipeline with kfp / kfp-local / inprocess"
            )


def _group_refs(group: Group) -> list[Any]:
    refs: list[Any] = []
    for branch in (group, *group.branches):
        if branch.condition is not None:
            refs.extend(branch.condition.operands())
    if group.kind == "loop":
        refs.append(group.items)
    return refs


def _airflow_key(name: str) -> str:
    """``name`` as an Airflow task or group id: letters, digits, ``_``, ``.`` and ``-``; a run of anything else one
    dash (a loop named ``lr: trials`` was Airflow's bare "has to be made of alphanumeric" ValueError)."""
    import re

    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "loop"


def check_loop_ids(pipeline: Pipeline, layout: Any) -> None:
    """Each loop's task group id (and its ``-items`` task's) is its own in the DAG: Airflow keeps task and group ids
    in one namespace, KFP does not (two loops named ``trials``, or a loop named like a call, compiled for KFP and
    failed the DAG with Airflow's bare DuplicateTaskIdFound).

    Raises:
        InvalidParameter: the loop and what already has its id.
    """
    taken: dict[str, str] = {}
    for tasks in layout.calls.values():
        for task_id in (*tasks.candidates, *(g for g in tasks.gates if g), tasks.join):
            taken.setdefault(task_id, f"call {tasks.call!r}")
    seen: set[str] = set()
    for call in pipeline.calls:
        for group in call.groups:
            if group.kind != "loop" or group.id in seen:
                continue
            seen.add(group.id)
            for task_id in (loop_group_id(group), *([] if isinstance(group.items, list) else [items_task_id(group)])):
                if task_id in taken:
                    raise InvalidParameter(
                        f"ParallelFor {group.name!r}: its Airflow id {task_id!r} is taken by {taken[task_id]} (Airflow keeps "
                        "task and group ids in one namespace); valid: a name of its own, ParallelFor(..., name='...')")
                taken[task_id] = f"loop {group.name!r}"


def items_task_id(group: Group) -> str:
    """The task that returns the list of a loop over a run-time list (``<loop>-items``)."""
    return f"{_airflow_key(group.name)}-items"


def loop_group_id(group: Group) -> str:
    """The id of a loop's mapped task group (the loop's name, as an Airflow id)."""
    return _airflow_key(group.name)


def loop_item(op: Any, context: Mapping[str, Any]) -> Any:
    """The item of the loop iteration a task instance inside a loop's mapped task group runs (its ``map_index``):
    from the literal list, or from the ``<loop>-items`` task's list; None outside a loop."""
    group = loop_of(op.pipeline[op.call_name])
    index = _map_index(context)
    if group is None or index is None:
        return None
    items = group.items if isinstance(group.items, list) else context["ti"].xcom_pull(task_ids=items_task_id(group), map_indexes=-1)
    return items[index]


def control_upstream(pipeline: Pipeline, layout: Layout, call: Call) -> list[str]:
    """The join tasks of the calls whose output parameters ``call`` (or its conditions, or its loop) reads."""
    names: list[str] = []
    for binding in call.bindings.values():
        if isinstance(binding, ValueRef):
            names.append(binding.call)
        elif isinstance(binding, CollectedRef):
            names.append(binding.ref.call)
    for group in call.groups:
        names += [r.call for r in _group_refs(group) if isinstance(r, ValueRef)]
    return list(dict.fromkeys(layout[n].join for n in names if n != call.name))


def _results(ti: Any, layout: Layout, call: str, **pull: Any) -> list[Any]:
    """The outcome records of ``call``'s tasks (each a list when ``call`` is mapped and pulled whole)."""
    return [ti.xcom_pull(task_ids=task_id, **pull) for task_id in layout[call].candidates]


class _Resolver:
    """Values of a task's control-flow references, from XCom and the run's arguments."""

    def __init__(self, op: Any, context: Mapping[str, Any]) -> None:
        self.op = op
        self.ti = context["ti"]
        self.pipeline: Pipeline = op.pipeline
        self.layout: Layout = op.layout
        self.call = self.pipeline[op.call_name]
        prep = self.ti.xcom_pull(task_ids=PREPARE_TASK) or {}
        self.args = dict(prep.get("args") or {})

    def value(self, ref: ValueRef) -> Any:
        producer = self.pipeline[ref.call]
        same_loop = loop_of(producer) is not None and loop_of(producer) is loop_of(self.call)
        pull = {"map_indexes": self.ti.map_index} if same_loop else {}
        for result in _results(self.ti, self.layout, ref.call, **pull):
            if isinstance(result, Mapping) and result.get("route") == "succeeded":
                return result.get("values", {})[ref.output]
        raise InvalidParameter(f"{self.call.name}: no value {ref!r} in XCom ({ref.call} did not succeed)")

    def collected(self, ref: CollectedRef) -> list[Any]:
        """The values of every mapped instance of the producer, in map-index order."""
        found: list[tuple[int, Any]] = []
        for task_id in self.layout[ref.ref.call].candidates:
            for result in self.ti.xcom_pull(task_ids=[task_id]) or []:
                if isinstance(result, Mapping) and result.get("route") == "succeeded":
                    found.append((int(result.get("map_index") or 0), result.get("values", {})[ref.ref.output]))
        return [v for _, v in sorted(found, key=lambda pair: pair[0])]

    def resolve(self, value: Any) -> Any:
        if isinstance(value, ValueRef):
            return self.value(value)
        if isinstance(value, CollectedRef):
            return self.collected(value)
        if isinstance(value, ParamRef):
            return self.args[value.name]
        if isinstance(value, LoopItem):
            item = self.op.loop_item
            return item[value.field] if value.field is not None else item
        return value

    def taken(self, group: Group) -> bool:
        def holds(g: Group) -> bool:
            return g.condition is not None and evaluate(g.condition, self.resolve)

        return not any(holds(b) for b in group.branches) and (group.kind == "else" or holds(group))

    def params(self) -> dict[str, Any]:
        """Skip the task if a branch it is in is not taken; else its control-flow parameters' values.

        Raises:
            AirflowSkipException: a branch not taken.
        """
        for group in self.call.groups:
            if group.kind in ("if", "elif", "else") and not self.taken(group):
                raise AirflowSkipException(f"{self.call.name}: branch {group.name!r} is not taken")
        out: dict[str, Any] = {}
        for key, binding in self.call.bindings.items():
            if isinstance(binding, (ValueRef, LoopItem, CollectedRef)):
                out[key] = self.call.step.param(key).check(self.resolve(binding))
        return out


def _map_index(context: Mapping[str, Any]) -> int | None:
    index = getattr(context["ti"], "map_index", -1)
    return index if isinstance(index, int) and index >= 0 else None


class ControlStepOperator(StepOperator):
    """:class:`StepOperator` for a call with control-flow references (local mode; see the module docstring).

    Args:
        loop_item: the item of this mapped instance (``expand(loop_item=...)``); None outside a loop.
    """

    def __init__(self, *, loop_item: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.loop_item = loop_item

    def execute(self, context: Any) -> Any:
        self.loop_item = loop_item(self, context) if self.loop_item is None else self.loop_item
        self.channel_params = _Resolver(self, context).params()
        self.map_index = _map_index(context)
        return super().execute(context)

    def finish(self, context: Any, result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        result["map_index"] = _map_index(context)
        return super().finish(context, result, **kwargs)


class ControlPodOperator(PodStepOperator):
    """:class:`PodStepOperator` for a call with control-flow references (kubernetes mode): the references' values
    join the pod's arguments when the task starts, and a mapped instance's artifacts get their own folder."""

    def __init__(self, *, loop_item: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.loop_item = loop_item

    def execute(self, context: Any) -> Any:
        self.loop_item = loop_item(self, context) if self.loop_item is None else self.loop_item
        values = _Resolver(self, context).params()
        args = pod_arguments(self.pipeline, self.pipeline[self.call_name], self.arguments, values, _map_index(context))
        self.arguments = args
        return super().execute(context)

    def finish(self, context: Any, result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        result["map_index"] = _map_index(context)
        return super().finish(context, result, **kwargs)


class LoopItemsOperator(BaseOperator):
    """The list a ``ParallelFor`` maps over, when it is known only at run time (a list pipeline parameter or an
    output parameter): its return value feeds ``expand(loop_item=...)``.

    Raises:
        AirflowFailException: (as InvalidParameter) the value is not a list.
    """

    ui_color = "#fff4e0"

    def __init__(self, *, pipeline: Pipeline, layout: Layout, call_name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.layout = layout
        self.call_name = call_name  # a call of the loop (its items are resolved as that call would)
        self.loop_item = None

    def execute(self, context: Any) -> Any:
        group = loop_of(self.pipeline[self.call_name])
        assert group is not None
        items = _Resolver(self, context).resolve(group.items)
        if not isinstance(items, list):
            raise InvalidParameter(f"ParallelFor {group.name}: {group.items!r} is {items!r}, not a list")
        return items


def pod_arguments(pipeline: Pipeline, call: Call, arguments: list[str], values: Mapping[str, Any], map_index: int | None) -> list[str]:
    """A pod's ``heteroflow step`` arguments with the call's control-flow parameter ``values`` added
    (``--param NAME=VALUE``: a string as it is, anything else as JSON, which ``heteroflow step`` reads back) and,
    for a mapped instance, the artifacts of the calls of its loop in the instance's folder
    (``artifacts/<call>/<map index>/<name>``)."""
    args = list(arguments)
    for key, value in values.items():
        args += ["--param", f"{key}={value if isinstance(value, str) else json.dumps(value)}"]
    if map_index is not None:
        loop = loop_of(call)
        mapped = {c.name for c in pipeline.calls if loop is not None and loop_of(c) is loop}
        for i, arg in enumerate(args):
            if i and args[i - 1] in ("--output", "--input"):
                name, _, path = arg.partition("=")
                folder, _, output = path.rpartition("/")
                if folder.rpartition("/")[2] in mapped:
                    args[i] = f"{name}={folder}/{map_index}/{output}"
    return args


def operator_options(pipeline: Pipeline, layout: Layout, call: Call, *, kube: bool, tasks: dict[str, Any]) -> dict[str, Any]:
    """The extra keyword arguments of ``call``'s task (used by :func:`heteroflow.dags.factory.build_dag`): the
    operator class that resolves its references (a call inside a loop is a task of the loop's mapped task group,
    :func:`enter_groups`, and reads its item when it starts)."""
    uses = bool(call.groups) or any(isinstance(b, (ValueRef, LoopItem, CollectedRef)) for b in call.bindings.values())
    if not uses:
        return {}
    return {"operator_class": ControlPodOperator if kube else ControlStepOperator}


def _loop_items(pipeline: Pipeline, layout: Layout, group: Group, tasks: dict[str, Any]) -> Any:
    """What a loop's mapped task group expands over: its literal list, or the output of its ``<loop>-items`` task
    (created in ``tasks`` the first time, before the group opens: it must not be one of its instances)."""
    if isinstance(group.items, list):
        return list(group.items)
    task_id = items_task_id(group)
    if task_id not in tasks:
        first = next(c for c in pipeline.calls if group in c.groups)
        items = LoopItemsOperator(
            task_id=task_id, pipeline=pipeline, layout=layout, call_name=first.name, retries=0,
            doc_md=f"The items of ParallelFor {group.name!r} ({group.items!r}), known when the run starts.",
        )
        producers = [tasks[PREPARE_TASK]]
        if isinstance(group.items, ValueRef):
            producers.append(tasks[layout[group.items.call].join])
        producers >> items
        tasks[task_id] = items
    return tasks[task_id].output


def enter_groups(call: Call | None, stack: list[Any], *, pipeline: Pipeline | None = None, layout: Layout | None = None,
                 tasks: dict[str, Any] | None = None) -> None:
    """Open and close the sub-pipelines' TaskGroups and the loops' mapped task groups around the task of ``call``
    (None: close every one), given the ``(group, TaskGroup)`` pairs open now in ``stack`` (updated in place)."""
    from airflow.sdk import TaskGroup
    from airflow.sdk.definitions._internal.expandinput import DictOfListsExpandInput
    from airflow.sdk.definitions.taskgroup import MappedTaskGroup

    wanted = [g for g in call.groups if g.kind in ("pipeline", "loop")] if call is not None else []
    keep = 0
    while keep < min(len(stack), len(wanted)) and stack[keep][0] is wanted[keep]:
        keep += 1
    while len(stack) > keep:
        stack.pop()[1].__exit__(None, None, None)
    for group in wanted[keep:]:
        if group.kind == "loop":
            assert pipeline is not None and layout is not None and tasks is not None
            items = _loop_items(pipeline, layout, group, tasks)
            task_group = MappedTaskGroup(  # its id checked first (check_loop_ids)
                group_id=loop_group_id(group), prefix_group_id=False, expand_input=DictOfListsExpandInput({"loop_item": items}),
                tooltip=f"ParallelFor {group.name}: one instance of each task per item",
            )
        else:
            task_group = TaskGroup(group_id=group.name, prefix_group_id=False, tooltip=f"sub-pipeline {group.pipeline!r}")
        task_group.__enter__()
        stack.append((group, task_group))
