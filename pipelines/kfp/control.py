"""Render output parameters, conditions, loops and sub-pipelines (:mod:`heteroflow.pipelines.control`) for KFP
with the real DSL: ``dsl.If/Elif/Else``, ``dsl.ParallelFor``, ``dsl.Collected``, output parameters as
``dsl.OutputPath`` outputs of a step's component, and a sub-pipeline as a nested ``@dsl.pipeline`` (a DAG in the
compiled IR, a sub-DAG in the Kubeflow UI).

:class:`ControlRenderer` extends :mod:`heteroflow.pipelines.kfp.render`'s renderer, so every call keeps its
resources, retries, secrets, fallback chain and routes:

- **Output parameters.** A step's component gets one ``OutputPath(<type>)`` per output parameter;
  :func:`heteroflow.components.core.runtime.kfp_task` writes each value (or, when the call did not succeed, its
  type's empty value: KFP needs the file; every reader checks the call's route first). A call reading a value reads
  the producer's route too (``heteroflow_after_<call>``), so it does not run after the producer failed.
- **Conditions.** kfp.local (kfp 2.17) resolves a ``dsl.If`` only on a task's single return value: on a named
  output of a task with several outputs it logs "Could not resolve parent input" and skips every branch (checked
  in ``tests/test_practitioners_control.py``). For kfp.local the renderer therefore passes every value a condition
  or a loop reads through a one-line ``heteroflow_value_<type>`` task whose single return value it is (run in the
  driver process, as the other bookkeeping tasks); for a cluster the condition reads the step's output directly.
  The calls inside a branch also read the routes of the calls its conditions read.
- **Checks.** Each group (a branch, a loop iteration, a sub-pipeline) ends with its own ``check`` task over the
  routes of the calls directly in it (a failed step fails that iteration or branch, and so the run, with its own
  message); the top-level check covers the top-level calls.
- **Loops.** ``dsl.ParallelFor`` over a literal list, a list pipeline parameter or a list output parameter
  (``parallelism`` passed on). ``Collected`` of a loop's value is ``dsl.Collected``; the reader also reads the
  collected routes of the producer (a list: the reader does not run unless every iteration succeeded).
- **Sub-pipelines.** The calls of a sub-pipeline group render inside a ``dsl.pipeline`` whose inputs are every
  channel they read from outside (pipeline parameters, artifacts, values, routes, the plan's inventory and
  placements) and whose outputs are every channel later calls read from inside.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Sequence
from typing import Any

from kfp import dsl

from heteroflow.components.errors import InvalidParameter
from heteroflow.components.core.step import step_ref
from heteroflow.pipelines import control
from heteroflow.pipelines.control import CollectedRef, Condition, Group, LoopItem, Node, ValueRef, tree
from heteroflow.pipelines.graph import Call, Const, OutputRef, ParamRef, Pipeline
from heteroflow.pipelines.subpipelines import check_runnable
from heteroflow.pipelines.kfp import render
from heteroflow.pipelines.kfp.render import _KFP_TYPES, _exec_component, _Renderer, _shim_source

__all__ = ["ControlRenderer"]

_TYPE_NAMES = {str: "str", int: "int", float: "float", bool: "bool", list: "list", dict: "dict"}

Key = tuple[str, ...]
_KFP_PARAM_TYPES = {str: "String", int: "Integer", float: "Double", bool: "Boolean", list: "List", dict: "Dict"}


def _value_source(typ: type) -> str:
    name = _TYPE_NAMES[typ]
    return (
        f"def heteroflow_value_{name}(value: {name}) -> {name}:\n"
        '    """Pass a value on as this task\'s single return value (kfp.local resolves conditions only on those)."""\n'
        "    return value\n"
    )


def _shim_with_values(call: Call, *, collected_after: Sequence[str], **shape: Any) -> str:
    """The step's component source (:func:`render._shim_source`) with an ``OutputPath`` per output parameter and
    a list input per collected route (both without defaults, so they go first)."""
    source = _shim_source(call, step_ref(call.step), **shape)
    py = render._py(call.name)  # the function's name as the shim writes it ('my-score': my_score; it asserted)
    for name in collected_after:  # one route per iteration of the loop it ran in
        after = render._py(name)
        source = source.replace(f"    {render.KFP_AFTER_PREFIX}{after}: str,\n", f"    {render.KFP_AFTER_PREFIX}{after}: list,\n", 1)
    extra = [f"{p.name}: OutputPath({_TYPE_NAMES[p.type]})" for p in call.step.returns]
    if not extra:
        return source
    head = f"def {py}(\n    "
    if source.startswith(f"def {py}() "):  # a step with no parameters or artifacts of its own
        return f"def {py}(" + "".join(f"\n    {e}," for e in extra) + "\n)" + source[len(f"def {py}()"):]
    assert source.startswith(head)
    return head + "".join(f"{e},\n    " for e in extra) + source[len(head):]


class ControlRenderer(_Renderer):
    """:class:`render._Renderer` with output parameters, groups and sub-pipelines (see the module docstring)."""

    def __init__(self, pipeline: Pipeline, **kwargs: Any) -> None:
        check_runnable(pipeline)
        self.by_name = {c.name: c for c in pipeline.calls}
        super().__init__(pipeline, **kwargs)
        # condition / loop operands that kfp.local needs as a task's single return value
        self.routed: set[Key] = set()
        for call in pipeline.calls:
            for group in call.groups:
                for ref in self._group_refs(group):
                    if isinstance(ref, ValueRef):
                        self.routed.add(("value", ref.call, ref.output))
        for call in pipeline.calls:
            if call.step.returns or self.collected_after(call):
                self.components[call.name] = _exec_component(
                    _shim_with_values(
                        call,
                        collected_after=self.collected_after(call),
                        placed=self.placed if call.step.planner else [],
                        after=self.after(call),
                        chain=self.chained(call),
                        inventory=call.device_bound and self.planner is not None,
                    ),
                    render._py(call.name),
                    self.image,
                )
                if self.chained(call):
                    raise InvalidParameter(
                        f"{call.name}: a call with output parameters or collected inputs renders for KFP only with one "
                        "candidate (its fallback chain cannot pass values on); give it one candidate, or return the "
                        "value from a call after it"
                    )
        self.subs: dict[str, Any] = {}
        self.values = {
            t: _exec_component(_value_source(t), f"heteroflow_value_{_TYPE_NAMES[t]}", self.image, bookkeeping=True) for t in _TYPE_NAMES
        }

    # -- what a call reads ---------------------------------------------------------------------------------

    @staticmethod
    def _group_refs(group: Group) -> list[Any]:
        refs: list[Any] = []
        for branch in (group, *group.branches):
            if branch.condition is not None:
                refs.extend(x for x in branch.condition.operands() if isinstance(x, (ValueRef, ParamRef, LoopItem)))
        if group.kind == "loop" and isinstance(group.items, (ValueRef, ParamRef)):
            refs.append(group.items)
        return refs

    def _loop_of(self, name: str) -> Group | None:
        return next((g for g in self.by_name[name].groups if g.kind == "loop"), None)

    def collected_after(self, call: Call) -> list[str]:
        """Calls inside a loop whose values ``call`` reads through Collected: it reads their collected routes."""
        return list(dict.fromkeys(b.ref.call for b in call.bindings.values() if isinstance(b, CollectedRef)))

    def after(self, call: Call) -> list[str]:
        """The base rule (the calls it reads artifacts from, the planner), plus the calls whose output parameters
        it or its groups' conditions and loops read (through Collected too: see :meth:`collected_after`)."""
        names = list(super().after(call))
        for binding in call.bindings.values():
            if isinstance(binding, ValueRef):
                names.append(binding.call)
            elif isinstance(binding, CollectedRef):
                names.append(binding.ref.call)
        for group in getattr(call, "groups", ()):
            for ref in self._group_refs(group):
                if isinstance(ref, ValueRef):
                    names.append(ref.call)
        return list(dict.fromkeys(names))

    def reads(self, call: Call) -> list[Key]:
        """The channels ``call``'s tasks read (for a sub-pipeline's inputs)."""
        keys: list[Key] = []
        for binding in call.bindings.values():
            if isinstance(binding, ParamRef):
                keys.append(("param", binding.name))
            elif isinstance(binding, OutputRef):
                keys.append(("out", binding.call, binding.output))
            elif isinstance(binding, ValueRef):
                keys.append(("value", binding.call, binding.output))
            elif isinstance(binding, LoopItem):
                keys.append(("item", binding.loop.id))
            elif isinstance(binding, CollectedRef):
                keys.append(("value", binding.ref.call, binding.ref.output))
        keys += [("route", name) for name in self.after(call)]
        if call.device_bound and self.planner is not None:
            keys.append(("inventory",))
            if self.chained(call):
                keys.append(("placed", call.name))
        return keys

    def group_reads(self, group: Group) -> list[Key]:
        keys: list[Key] = []
        for ref in self._group_refs(group):
            if isinstance(ref, ValueRef):
                keys.append(("value", ref.call, ref.output))
            elif isinstance(ref, ParamRef):
                keys.append(("param", ref.name))
            elif isinstance(ref, LoopItem):
                keys.append(("item", ref.loop.id))
        return keys

    # -- channels --------------------------------------------------------------------------------------------

    def argument(self, call: Call, key: str, binding: Any, env: dict[Key, Any]) -> Any:  # type: ignore[override]
        """As the base renderer's, plus an earlier call's output parameter, a loop item, the values a loop
        collected, and a bare value."""
        if isinstance(binding, (OutputRef, ParamRef, Const)):
            return super().argument(call, key, binding, env)
        if isinstance(binding, ValueRef):
            return env[("value", binding.call, binding.output)]
        if isinstance(binding, LoopItem):
            return self._item(binding, env, call.step.param(key).type)
        if isinstance(binding, CollectedRef):
            return dsl.Collected(env[("value", binding.ref.call, binding.ref.output)])
        return binding

    @staticmethod
    def _item(item: LoopItem, env: dict[Key, Any], typ: type | None = None) -> Any:
        channel = env[("item", item.loop.id)]
        if not item.field:
            return channel
        field = getattr(channel, item.field)
        if typ is not None:  # KFP types every field of a dict item as the first item's first value (Dict[str, int])
            field.channel_type = _KFP_PARAM_TYPES[typ]
        return field

    def _operand(self, value: Any, env: dict[Key, Any]) -> Any:
        if isinstance(value, ValueRef):
            key = ("value", value.call, value.output)
            return env.get(("routed", *key[1:]), env[key])
        if isinstance(value, ParamRef):
            return env[("param", value.name)]
        if isinstance(value, LoopItem):
            return self._item(value, env)
        return value

    def _condition(self, condition: Condition, env: dict[Key, Any]) -> Any:
        left, right = (self._operand(x, env) for x in condition.operands())
        return control._OPS[condition.op](left, right)  # a KFP ConditionOperation

    # -- emission --------------------------------------------------------------------------------------------

    def emit(self, call: Call, env: dict[Key, Any]) -> None:
        if not call.step.returns:
            super().emit(call, env)
            return
        task = self.task(call, env, 0)
        env[("route", call.name)] = task.outputs["Output"]
        for spec in call.step.outputs:
            env[("out", call.name, spec.name)] = task.outputs[spec.name]
        for p in call.step.returns:
            key = ("value", call.name, p.name)
            env[key] = task.outputs[p.name]
            if self.local and key in self.routed:  # see the module docstring: one return value for kfp.local
                passed = self.small(self.values[p.type](value=task.outputs[p.name]), f"{call.name}: {p.name}")
                env[("routed", call.name, p.name)] = passed.output

    def task(self, call: Call, env: dict[Key, Any], index: int) -> Any:
        saved = {("route", n): env[("route", n)] for n in self.collected_after(call)}
        env.update({("route", n): dsl.Collected(env[("route", n)]) for n in self.collected_after(call)})
        try:
            return super().task(call, env, index)
        finally:
            env.update(saved)

    def emit_node(self, node: Node, env: dict[Key, Any]) -> None:
        """Emit a group's calls and nested groups in order, then its check task."""
        direct: list[Call] = []
        for child in node.children:
            if isinstance(child, Node):
                self.emit_group(child, env)
            else:
                self.emit(child, env)
                direct.append(child)
        if node.group is not None and direct:
            self.check_routes(direct, env, f"check: {node.group.name}")

    def check_routes(self, calls: Sequence[Call], env: dict[Key, Any], name: str) -> Any:
        names = [c.name for c in calls]
        steps = {c.name: render.step_ref(c.step) for c in calls}
        check = _exec_component(render._check_source(names, pipeline=self.pipeline.name, steps=steps), "heteroflow_check", self.image, bookkeeping=True)
        return self.small(check(**{f"route_{render._py(n)}": env[("route", n)] for n in names}), name)

    def emit_group(self, node: Node, env: dict[Key, Any]) -> None:
        group = node.group
        assert group is not None
        if group.kind == "pipeline":
            self.emit_subpipeline(node, env)
            return
        if group.kind == "loop":
            items = group.items
            if isinstance(items, ParamRef):
                items = env[("param", items.name)]
            elif isinstance(items, ValueRef):
                items = self._operand(items, env)
            with dsl.ParallelFor(items, parallelism=group.parallelism or None, name=group.name) as item:
                inner = dict(env)
                inner[("item", group.id)] = item
                self.emit_node(node, inner)
            env.update({k: v for k, v in inner.items() if k not in env})  # read after the loop through Collected
            return
        if group.kind == "if":
            context: Any = dsl.If(self._condition(group.condition, env), name=group.name)  # type: ignore[arg-type]
        elif group.kind == "elif":
            context = dsl.Elif(self._condition(group.condition, env), name=group.name)  # type: ignore[arg-type]
        else:
            context = dsl.Else(name=group.name)
        with context:  # what the branch produces stays inside it (pipelines.control refuses readers outside)
            self.emit_node(node, dict(env))

    def emit_subpipeline(self, node: Node, env: dict[Key, Any]) -> None:
        """Call the group's nested ``dsl.pipeline`` (built beforehand by :meth:`build_subpipelines`) here."""
        group = node.group
        assert group is not None
        component, needed, exported, ident = self.subs[group.id]
        task = component(**{ident(k): env[k] for k in needed})
        task.set_display_name(group.name)
        for k in exported:
            env[k] = task.outputs[ident(k)]

    def build_subpipelines(self, node: Node) -> None:
        """Build every sub-pipeline group's ``dsl.pipeline`` under ``node``, innermost first (KFP builds a nested
        pipeline outside any other pipeline's context, as a user defines it at module level)."""
        for child in node.children:
            if isinstance(child, Node):
                self.build_subpipelines(child)
                if child.group is not None and child.group.kind == "pipeline":
                    self.build_subpipeline(child)

    def build_subpipeline(self, node: Node) -> None:
        """The group's calls as a nested ``dsl.pipeline`` (see the module docstring)."""
        group = node.group
        assert group is not None
        inside = list(node.calls())
        names = {c.name for c in inside}
        produced: set[Key] = set()
        for c in inside:
            produced.add(("route", c.name))
            produced.update(("out", c.name, s.name) for s in c.step.outputs)
            produced.update(("value", c.name, p.name) for p in c.step.returns)
            if c.step.planner:
                produced.add(("inventory",))
                produced.update(("placed", n) for n in self.placed)
            produced.update(("item", g.id) for g in c.groups[c.groups.index(group) + 1:] if g.kind == "loop")
        needed: list[Key] = []
        for c in inside:
            needed += [k for k in self.reads(c) if k not in produced]
            for g in c.groups[c.groups.index(group) + 1:]:
                needed += [k for k in self.group_reads(g) if k not in produced]
        needed = list(dict.fromkeys(needed))
        later = [c for c in self.calls if c.name not in names]
        exported: list[Key] = []
        for c in later:
            exported += [k for k in self.reads(c) if k in produced]
            for g in c.groups:
                exported += [k for k in self.group_reads(g) if k in produced]
        exported = list(dict.fromkeys(exported))
        if self.local:
            exported += [("routed", *k[1:]) for k in exported if k[0] == "value" and k in self.routed]

        def ident(key: Key) -> str:
            return "_".join(str(k) for k in key).replace("-", "_").replace(".", "_")

        def annotation(key: Key, *, out: bool) -> Any:
            if key[0] == "out":
                cls = _KFP_TYPES[self.by_name[key[1]].step.output(key[2]).type]
                return cls if out else dsl.Input[cls]
            if key[0] in ("value", "routed"):
                return self.by_name[key[1]].step.returned(key[2]).type
            if key[0] == "param":
                p = self.pipeline.params[key[1]]
                return typing.Optional[p.type] if p.optional else p.type
            if key[0] == "item":
                return self._item_type(key[1], inside)
            return str

        params = [inspect.Parameter(ident(k), inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation(k, out=False)) for k in needed]
        outputs = typing.NamedTuple("Outputs", [(ident(k), annotation(k, out=True)) for k in exported])  # type: ignore[misc]

        def body(*args: Any) -> Any:
            inner: dict[Key, Any] = dict(zip(needed, args))
            self.emit_node(node, inner)
            return outputs(*(inner[k] for k in exported)) if exported else None

        body.__signature__ = inspect.Signature(params, return_annotation=outputs if exported else inspect.Signature.empty)  # type: ignore[attr-defined]
        body.__name__ = body.__qualname__ = group.name
        body.__doc__ = f"Sub-pipeline {group.pipeline!r} as {group.name}."
        with render.cheap_container_checks():
            component = dsl.pipeline(body, name=group.pipeline.replace("_", "-"))
        self.subs[group.id] = (component, needed, exported, ident)

    def _item_type(self, loop_id: str, inside: Sequence[Call]) -> Any:
        for c in inside:
            for name, b in c.bindings.items():
                if isinstance(b, LoopItem) and b.loop.id == loop_id:
                    if b.field is not None:
                        raise InvalidParameter(f"{c.name}: a dict item's field read inside a sub-pipeline; bind the field to a parameter of the sub-pipeline")
                    return c.step.param(name).type
        return str

    def finish(self, env: dict[Key, Any]) -> None:
        top = [c for c in self.calls if not c.groups]
        if top:
            check = self.check_routes(top, env, "check: every step succeeded")
            render.platform.delete_pvcs(self.pipeline, self.pvcs, self.tops, check)


def to_kfp_control(pipeline: Pipeline, renderer: ControlRenderer) -> Any:
    """The pipeline's body for :func:`render.to_kfp`: the tree of groups, emitted in order."""
    root = tree(pipeline.calls)
    renderer.build_subpipelines(root)

    def emit_all(env: dict[Key, Any]) -> None:
        renderer.emit_node(root, env)
        renderer.finish(env)

    return emit_all
