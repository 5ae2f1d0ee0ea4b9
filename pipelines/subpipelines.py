"""Sub-pipelines: a :class:`~heteroflow.pipelines.graph.Pipeline` used as a step of another (KFP's
pipeline-as-component), with the artifact inputs (:func:`pipeline_input`) and outputs
(:meth:`Pipeline.set_outputs`) that make it one.

``outer.add(sub, name="data", **bindings)`` adds ``sub``'s calls to ``outer`` as ``<name>__<call>``, inside a
:class:`~heteroflow.pipelines.control.Group` of kind ``pipeline`` (with the conditions and loops of ``sub`` cloned
inside it), each call keeping its candidates, retries, secrets and every other field. Renderers read the group:
KFP renders a nested ``@dsl.pipeline`` (:mod:`heteroflow.pipelines.kfp.control`), Airflow a TaskGroup, the local
engines run the calls in place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from heteroflow.components.core.step import ArtifactType
from heteroflow.components.errors import InvalidParameter
from heteroflow.pipelines.control import (
    _IDS,
    _LAST,
    _SCOPE,
    CollectedRef,
    Condition,
    Group,
    InputRef,
    LoopItem,
    ValueRef,
    current_groups,
)

if TYPE_CHECKING:
    from heteroflow.pipelines.graph import Pipeline

__all__ = ["SubCall", "add_pipeline", "check_runnable", "pipeline_input", "set_outputs"]


def pipeline_input(pipeline: Pipeline, name: str, type: ArtifactType | str = ArtifactType.DATASET) -> InputRef:
    """Declare an artifact input of ``pipeline``, for its calls' inputs; bound when the pipeline is used as a step
    of another (``outer.add(pipeline, name=output_ref)``). A pipeline with inputs runs only as a sub-pipeline.

    Raises:
        InvalidParameter: a name that is not an identifier, or declared twice with another type.
    """
    if not name.isidentifier():
        raise InvalidParameter(f"pipeline input {name!r} is not a Python identifier")
    ref = InputRef(name, ArtifactType(type))
    inputs = _inputs(pipeline)
    if name in inputs and inputs[name] != ref:
        raise InvalidParameter(f"pipeline {pipeline.name!r} already has an input {name!r} of type {inputs[name].type.value}")
    inputs[name] = ref
    return ref


def _inputs(pipeline: Pipeline) -> dict[str, InputRef]:
    found = pipeline.__dict__.setdefault("_inputs", {})
    return found


class SubCall:
    """A sub-pipeline added to a pipeline (:meth:`Pipeline.add` with a Pipeline): its ``outputs`` are what the
    sub-pipeline returns (:meth:`Pipeline.set_outputs`), as references to its calls in this pipeline."""

    def __init__(self, name: str, group: Group, outputs: Mapping[str, Any]) -> None:
        self.name, self.group, self._outputs = name, group, dict(outputs)

    @property
    def outputs(self) -> _SubOutputs:
        return _SubOutputs(self)

    @property
    def output(self) -> Any:
        """The sub-pipeline's one output (KFP's ``task.output``)."""
        if len(self._outputs) != 1:
            raise InvalidParameter(f"sub-pipeline {self.name!r} has {len(self._outputs)} outputs ({', '.join(self._outputs) or 'none'}); use .outputs[NAME]")
        return next(iter(self._outputs.values()))

    def __repr__(self) -> str:
        return f"SubCall({self.name!r}, outputs={list(self._outputs)})"


class _SubOutputs:
    def __init__(self, sub: SubCall) -> None:
        self._sub = sub

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str) -> Any:
        try:
            return self._sub._outputs[name]
        except KeyError:
            raise InvalidParameter(f"sub-pipeline {self._sub.name!r} has no output {name!r}; valid: {', '.join(self._sub._outputs) or 'none (Pipeline.set_outputs)'}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._sub._outputs)


def add_pipeline(parent: Pipeline, sub: Pipeline, *, name: str | None = None, **bindings: Any) -> SubCall:
    """Add ``sub``'s calls to ``parent`` as one sub-pipeline call (see the module docstring).

    Args:
        name: the sub-pipeline call's name (default: ``sub``'s name with ``_`` for ``-``); its calls become
            ``<name>__<call>``.
        bindings: ``sub``'s parameters (constants, ``p.param(...)``, output parameters, loop items) and artifact
            inputs (earlier calls' outputs).

    Raises:
        InvalidParameter: an unknown binding, an unbound artifact input, a type mismatch, a clash of names.
    """
    from heteroflow.pipelines.graph import Const, OutputRef, ParamRef

    call_name = name or sub.name.replace("-", "_")
    if sub is parent:
        raise InvalidParameter(f"pipeline {parent.name!r} cannot contain itself")
    inputs = _inputs(sub)
    unknown = sorted(set(bindings) - set(sub.params) - set(inputs))
    if unknown:
        valid = [*sub.params, *inputs]
        raise InvalidParameter(f"{call_name}: sub-pipeline {sub.name!r} has no parameter or input {', '.join(unknown)}; valid: {', '.join(valid)}")
    missing = [n for n in inputs if n not in bindings]
    if missing:
        raise InvalidParameter(f"{call_name}: sub-pipeline {sub.name!r} needs its input artifact(s) {', '.join(missing)} bound to earlier calls' outputs")
    for key, ref in inputs.items():
        value = bindings[key]
        if not isinstance(value, OutputRef):
            raise InvalidParameter(f"{call_name}: input {key!r} must be an earlier call's output artifact (call.outputs.NAME)")
        src = parent[value.call].step.output(value.output)
        if src.type is not ref.type:
            raise InvalidParameter(f"{call_name}: input {key!r} is a {ref.type.value}, but {value.call}.{value.output} is a {src.type.value}")
    params: dict[str, Any] = {}
    for pname, param in sub.params.items():
        if pname in bindings:
            params[pname] = bindings[pname]
        else:  # unbound: a parameter of the parent, named like the sub-pipeline's (qualified when taken)
            outer = pname.replace(".", "_")
            if outer in parent.params:
                outer = f"{call_name}_{outer}"
            params[pname] = ParamRef(outer, param.default, param.help, param.unit)
    scope = current_groups()
    group = Group("pipeline", f"pipeline-{next(_IDS)}", call_name, pipeline=sub.name)
    cloned: dict[Group, Group] = {}

    def clone(g: Group) -> Group:
        if g not in cloned:
            kind_id = g.id.split("-")[0]
            cloned[g] = dataclasses.replace(
                g,
                id=f"{kind_id}-{next(_IDS)}",
                condition=remap(g.condition) if g.condition is not None else None,
                branches=tuple(clone(b) for b in g.branches),
                items=remap(g.items),
                outputs={k: remap(v) for k, v in g.outputs.items()},
            )
        return cloned[g]

    names = {c.name: f"{call_name}__{c.name}" for c in sub.calls}

    def remap(value: Any) -> Any:
        if isinstance(value, ParamRef):
            return params[value.name]
        if isinstance(value, OutputRef):
            return OutputRef(names[value.call], value.output)
        if isinstance(value, InputRef):
            return bindings[value.name]
        if isinstance(value, ValueRef):
            return ValueRef(names[value.call], value.output, value.type)
        if isinstance(value, LoopItem):
            return LoopItem(clone(value.loop), value.field, value.type)
        if isinstance(value, CollectedRef):
            return CollectedRef(remap(value.ref), clone(value.loop) if value.loop is not None else None)
        if isinstance(value, Condition):
            return Condition(remap(value.left), value.op, remap(value.right))
        if isinstance(value, Const):
            return value.value
        return value

    fixed = {f.name for f in dataclasses.fields(type(sub.calls[0]))} if sub.calls else set()
    token = _SCOPE.set((*scope, group))
    try:
        for inner in sub.calls:
            own_groups = tuple(clone(g) for g in inner.groups)
            _SCOPE.set((*scope, group, *own_groups))
            call = parent.add(inner.step, name=names[inner.name], **{k: remap(v) for k, v in inner.bindings.items()})
            for field in fixed - {"name", "step", "bindings", "groups"}:  # candidates, retry, secrets, env ...: as in sub
                value = getattr(inner, field)
                if field == "run_after":  # .after() names calls of the sub-pipeline: their names here (it waited on
                    value = tuple(names.get(n, n) for n in value)  # a call of the parent named alike, or failed)
                setattr(call, field, value)
    finally:
        _SCOPE.reset(token)
    _LAST.set(group)
    outputs = {k: remap(v) for k, v in getattr(sub, "_outputs", {}).items()}
    group.outputs = outputs
    return SubCall(call_name, group, outputs)


def set_outputs(pipeline: Pipeline, refs: Mapping[str, Any]) -> None:
    """What ``pipeline`` returns when used as a sub-pipeline (see :meth:`Pipeline.set_outputs`)."""
    from heteroflow.pipelines.graph import OutputRef

    out = pipeline.__dict__.setdefault("_outputs", {})
    for key, ref in refs.items():
        if not key.isidentifier():
            raise InvalidParameter(f"pipeline output name {key!r} is not a Python identifier")
        if not isinstance(ref, (OutputRef, ValueRef)) or ref.call not in pipeline:
            raise InvalidParameter(f"pipeline output {key!r}: give an output of one of this pipeline's calls (call.outputs.NAME), not {ref!r}")
        producer = pipeline[ref.call]
        if any(g.kind in ("loop", "if", "elif", "else") for g in producer.groups):
            raise InvalidParameter(f"pipeline output {key!r}: {ref!r} is produced inside a loop or condition; return a value computed after it")
        out[key] = ref




def check_runnable(pipeline: Pipeline) -> None:
    """Raise if ``pipeline`` has artifact inputs (it runs only as a sub-pipeline)."""
    inputs = getattr(pipeline, "_inputs", {})
    if inputs:
        raise InvalidParameter(
            f"pipeline {pipeline.name!r} has input artifact(s) {', '.join(inputs)}; it runs only as a sub-pipeline: "
            f"add it to another pipeline (outer.add({pipeline.name.replace('-', '_')}, {next(iter(inputs))}=call.outputs.NAME))"
        )
