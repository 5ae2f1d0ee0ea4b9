"""Output parameters, conditions, loops and sub-pipelines of a :class:`~heteroflow.pipelines.graph.Pipeline`:
what a KFP user writes with ``task.outputs["x"]``, ``dsl.If/Elif/Else``, ``dsl.ParallelFor``, ``dsl.Collected``
and a ``@dsl.pipeline`` called inside another.

Example (the shape of ``examples/practitioners/tuning_fanout.py``)::

    from heteroflow.pipelines.control import Collected, If, ParallelFor

    p = Pipeline("tuning")
    data = p.add(MAKE_DATA)
    with ParallelFor(p.param("learning_rates", default=[0.3, 0.1, 0.03], help="one trial per value")) as lr:
        trial = p.add(TRIAL, data=data.outputs.data, learning_rate=lr)       # returns accuracy: float
    best = p.add(CHOOSE, accuracies=Collected(trial.outputs["accuracy"]), learning_rates=lr.items)
    with If(best.outputs["accuracy"] >= 0.8, name="good enough"):
        p.add(ARCHIVE_BEST, learning_rate=best.outputs["learning_rate"])

- **Output parameters.** A step's :attr:`~heteroflow.components.core.step.Step.returns` (a scalar, list or
  NamedTuple return annotation, or ``step(returns=...)``): ``call.outputs["name"]`` / ``call.output`` is a
  :class:`ValueRef` that a later call's parameter (of the same type; an int feeds a float) or a condition reads.
- **Conditions.** ``with If(cond):`` / ``Elif`` / ``Else`` around ``p.add(...)`` calls; a condition compares a
  :class:`ValueRef` or a loop item, on the left, with a constant, a pipeline parameter a call binds, or another of
  them (``== != < <= > >=``): ``If(score.output >= p.param("threshold"))``. A pipeline parameter is not a left side
  (``p.param("mode") == "fast"`` is Python's own comparison of two values, False).
- **Loops.** ``with ParallelFor(items) as item:`` over a literal list, a list pipeline parameter
  (``p.param(..., default=[...])``) or a list output parameter; ``item`` feeds parameters, ``item.key`` (or
  ``item["key"]``) a field of a dict item. ``Collected(ref)`` gathers a loop's output parameter into a list for a
  call after the loop.
- **Sub-pipelines.** ``p.add(other_pipeline, name=..., **bindings)``: the other pipeline's parameters are bound
  like a step's (unbound ones become parameters of this pipeline), its artifact inputs
  (:func:`heteroflow.pipelines.subpipelines.pipeline_input`) to earlier calls' outputs, and what it returns (:meth:`Pipeline.set_outputs`) is the
  returned :class:`SubCall`'s ``outputs``. Its calls join this pipeline as ``<name>__<call>`` inside a
  :class:`Group` of kind ``pipeline`` (KFP renders a nested DAG, Airflow a TaskGroup; local engines run them
  in place): :mod:`heteroflow.pipelines.subpipelines`.

Each call keeps the groups it was added in (:attr:`Call.groups`, outermost first); engines read them:
:mod:`heteroflow.pipelines.kfp.control` (KFP, kfp.local), :mod:`heteroflow.pipelines.engines.control_run`
(in-process), :mod:`heteroflow.dags.control` (Airflow).
"""

from __future__ import annotations

import abc
import contextvars
import dataclasses
import inspect
import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from heteroflow.components.core.step import ArtifactType, Param
from heteroflow.components.errors import InvalidParameter

if TYPE_CHECKING:
    from heteroflow.pipelines.graph import Call, Pipeline

__all__ = [
    "Collected",
    "CollectedRef",
    "Condition",
    "Elif",
    "Else",
    "Group",
    "If",
    "InputRef",
    "LoopItem",
    "ParallelFor",
    "ValueRef",
    "Node",
    "evaluate",
    "tree",
]

_OPS: Mapping[str, Any] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


class _Comparable(abc.ABC):
    """Comparisons that build a :class:`Condition` (as KFP's pipeline channels do). Subclasses define
    :meth:`_key`, the reference's identity."""

    __slots__ = ()

    def __eq__(self, other: object) -> Condition:  # type: ignore[override]
        return Condition(self, "==", other)

    def __ne__(self, other: object) -> Condition:  # type: ignore[override]
        return Condition(self, "!=", other)

    def __lt__(self, other: object) -> Condition:
        return Condition(self, "<", other)

    def __le__(self, other: object) -> Condition:
        return Condition(self, "<=", other)

    def __gt__(self, other: object) -> Condition:
        return Condition(self, ">", other)

    def __ge__(self, other: object) -> Condition:
        return Condition(self, ">=", other)

    def __hash__(self) -> int:
        return hash(self._key())

    @abc.abstractmethod
    def _key(self) -> tuple[Any, ...]:
        """What identifies the reference (hash and :meth:`same`)."""

    def same(self, other: object) -> bool:
        """Identity of references (``==`` builds a condition)."""
        return type(self) is type(other) and self._key() == other._key()  # type: ignore[attr-defined]

    def __bool__(self) -> bool:
        raise InvalidParameter(f"{self!r} is known only when the pipeline runs: use it in If(...), not in a Python if")


class ValueRef(_Comparable):
    """An output parameter of an earlier call: ``call.outputs["best"]`` or ``call.output``."""

    __slots__ = ("call", "output", "type")

    def __init__(self, call: str, output: str, type: type = str) -> None:
        self.call, self.output, self.type = call, output, type

    def _key(self) -> tuple[Any, ...]:
        return ("value", self.call, self.output)

    def __repr__(self) -> str:
        return f"{self.call}.outputs[{self.output!r}]"


class LoopItem(_Comparable):
    """The current item of a :class:`ParallelFor` (``field``: a key of a dict item, ``item.lr``)."""

    __slots__ = ("loop", "field", "type")

    def __init__(self, loop: Group, field: str | None = None, type: type | None = None) -> None:
        self.loop, self.field, self.type = loop, field, type

    def _key(self) -> tuple[Any, ...]:
        return ("item", self.loop.id, self.field)

    def __getattr__(self, name: str) -> LoopItem:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str) -> LoopItem:
        if self.field is not None:
            raise InvalidParameter(f"{self!r}: a loop item's field has no fields of its own")
        items = self.loop.items
        if isinstance(items, list):
            bad = [i for i, v in enumerate(items) if not isinstance(v, Mapping) or name not in v]
            if bad:
                raise InvalidParameter(f"ParallelFor item {bad[0]} ({items[bad[0]]!r}) has no key {name!r}; every item must be a dict with it")
            kinds = {type(v[name]) for v in items}
            typ = kinds.pop() if len(kinds) == 1 else (float if kinds <= {int, float} else None)
            return LoopItem(self.loop, name, typ)
        return LoopItem(self.loop, name, None)

    @property
    def items(self) -> Any:
        """What the loop iterates over (a literal list, a pipeline parameter or an output parameter): for a later
        call that needs the whole list (e.g. to name the best of a :func:`Collected` list)."""
        return self.loop.items

    def __repr__(self) -> str:
        return f"{self.loop.id}.item" + (f".{self.field}" if self.field else "")


class CollectedRef:
    """``Collected(ref)``: the values of ``ref`` (an output parameter of a call inside a loop), one per iteration,
    in the loop's item order, as a list for a call after the loop."""

    __slots__ = ("ref", "loop")

    def __init__(self, ref: ValueRef, loop: Group | None = None) -> None:
        self.ref, self.loop = ref, loop

    def __repr__(self) -> str:
        return f"Collected({self.ref!r})"


def Collected(ref: Any) -> CollectedRef:  # noqa: N802 - KFP's spelling
    """Gather a loop's output parameter into a list (KFP's ``dsl.Collected``).

    Raises:
        InvalidParameter: ``ref`` is not an output parameter (artifacts are not collected: write one artifact
            per iteration into a folder a later step reads, or collect a value naming it).
    """
    if not isinstance(ref, ValueRef):
        raise InvalidParameter(
            f"Collected({ref!r}): collect an output parameter (call.outputs['x'] of a step that returns a value); "
            "collecting artifacts is not supported on kfp.local or Airflow: return a value that names the artifact"
        )
    return CollectedRef(ref)


@dataclasses.dataclass(frozen=True, slots=True)
class InputRef:
    """An artifact input of a pipeline used as a sub-pipeline (:func:`heteroflow.pipelines.subpipelines.pipeline_input`)."""

    name: str
    type: ArtifactType


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Condition:
    """``left op right``: each side a :class:`ValueRef`, a pipeline parameter reference, a :class:`LoopItem` or a
    constant (str, int, float, bool)."""

    left: Any
    op: str
    right: Any

    def __bool__(self) -> bool:
        raise InvalidParameter(f"{self!r} is decided when the pipeline runs: use it in If(...), not in a Python if")

    def operands(self) -> tuple[Any, Any]:
        return self.left, self.right

    def __repr__(self) -> str:
        return f"{self.left!r} {self.op} {self.right!r}"


def evaluate(condition: Condition, resolve: Any) -> bool:
    """The condition's value, with ``resolve(operand)`` giving each reference's value (constants stay)."""
    left, right = (resolve(x) if _is_ref(x) else x for x in condition.operands())
    return bool(_OPS[condition.op](left, right))


def _is_ref(value: Any) -> bool:
    from heteroflow.pipelines.graph import ParamRef

    return isinstance(value, (ValueRef, LoopItem, ParamRef))


# --- groups ---------------------------------------------------------------------------------------------------

_IDS = itertools.count(1)
_SCOPE: contextvars.ContextVar[tuple[Group, ...]] = contextvars.ContextVar("heteroflow_control_scope", default=())
_LAST: contextvars.ContextVar[Group | None] = contextvars.ContextVar("heteroflow_control_last", default=None)


@dataclasses.dataclass(eq=False)
class Group:
    """A condition branch, a loop or a sub-pipeline: the calls added inside it carry it in ``Call.groups``.

    Attributes:
        kind: ``if``, ``elif``, ``else``, ``loop`` or ``pipeline``.
        id: unique in the process (``condition-3``, ``loop-1``, ``pipeline-2``).
        name: what the Kubeflow UI / Airflow shows (a sub-pipeline: its call name).
        condition: ``if``/``elif``: the condition.
        branches: ``if``/``elif``/``else``: the earlier branches of the same If (their conditions are false).
        items: ``loop``: a literal list, a pipeline parameter reference or a :class:`ValueRef`.
        parallelism: ``loop``: how many iterations may run at once (0: no limit).
        pipeline: ``pipeline``: the sub-pipeline's own name; ``outputs``: its exported outputs.
    """

    kind: str
    id: str
    name: str = ""
    condition: Condition | None = None
    branches: tuple[Group, ...] = ()
    items: Any = None
    parallelism: int = 0
    pipeline: str = ""
    outputs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Group({self.kind}, {self.id}, {self.name!r})"


class _Scope:
    """Context manager that puts a group on the stack of groups new calls are added in."""

    group: Group

    def __enter__(self) -> Any:
        self._token = _SCOPE.set((*_SCOPE.get(), self.group))
        _LAST.set(None)
        return self._value()

    def _value(self) -> Any:
        return self.group

    def __exit__(self, *exc: Any) -> None:
        _SCOPE.reset(self._token)
        _LAST.set(self.group)


class If(_Scope):
    """``with If(call.outputs["x"] == "y", name=...):``: the calls inside run only when the condition holds
    (KFP's ``dsl.If``)."""

    def __init__(self, condition: Condition, name: str | None = None) -> None:
        if not isinstance(condition, Condition):
            raise InvalidParameter(f"If({condition!r}): give a comparison whose left side is an output parameter or a loop item "
                                   "(a pipeline parameter may be the right side), e.g. If(step.outputs['best'] == 'x') or "
                                   "If(step.output >= p.param('threshold'))")
        gid = f"condition-{next(_IDS)}"
        self.group = Group("if", gid, name or gid, condition=condition)


class Elif(_Scope):
    """``with Elif(condition):`` right after an ``If``/``Elif`` block (KFP's ``dsl.Elif``)."""

    def __init__(self, condition: Condition, name: str | None = None) -> None:
        if not isinstance(condition, Condition):
            raise InvalidParameter(f"Elif({condition!r}): give a comparison, e.g. Elif(step.output > 0.5)")
        previous = _previous_branch("Elif")
        gid = f"condition-{next(_IDS)}"
        self.group = Group("elif", gid, name or gid, condition=condition, branches=(*previous.branches, previous))


class Else(_Scope):
    """``with Else():`` right after an ``If``/``Elif`` block (KFP's ``dsl.Else``)."""

    def __init__(self, name: str | None = None) -> None:
        previous = _previous_branch("Else")
        gid = f"condition-{next(_IDS)}"
        self.group = Group("else", gid, name or gid, branches=(*previous.branches, previous))


def _previous_branch(what: str) -> Group:
    previous = _LAST.get()
    if previous is None or previous.kind not in ("if", "elif"):
        raise InvalidParameter(f"{what} must follow an If or Elif block directly (as in KFP)")
    return previous


class ParallelFor(_Scope):
    """``with ParallelFor(items) as item:``: the calls inside run once per item (KFP's ``dsl.ParallelFor``).

    Args:
        items: a literal list (of str, numbers, bools or dicts), a list pipeline parameter
            (``p.param("lrs", default=[...])``) or a list output parameter of an earlier call.
        parallelism: how many iterations may run at once; 0: no limit.

    Raises:
        InvalidParameter: an empty literal list, or items of another kind.
    """

    def __init__(self, items: Any, parallelism: int = 0, name: str | None = None) -> None:
        from heteroflow.pipelines.graph import ParamRef

        if isinstance(items, tuple):
            items = list(items)
        if isinstance(items, list):
            if not items:
                raise InvalidParameter("ParallelFor([]): the list is empty; give at least one item")
            bad = [v for v in items if not isinstance(v, (str, int, float, bool, Mapping))]
            if bad:
                raise InvalidParameter(f"ParallelFor: item {bad[0]!r} is a {type(bad[0]).__name__}; valid items: str, int, float, bool or dict")
            items = [dict(v) if isinstance(v, Mapping) else v for v in items]
        elif isinstance(items, ParamRef):
            default = items.default
            if default is not inspect.Parameter.empty and not isinstance(default, list):
                raise InvalidParameter(f"ParallelFor over parameter {items.name!r}: its default {default!r} is not a list")
        elif isinstance(items, ValueRef):
            if items.type is not list:
                raise InvalidParameter(f"ParallelFor over {items!r}: that output parameter is a {items.type.__name__}, not a list")
        else:
            raise InvalidParameter(f"ParallelFor({items!r}): give a list, a list pipeline parameter (p.param(...)) or a list output parameter")
        if not isinstance(parallelism, int) or parallelism < 0:
            raise InvalidParameter(f"ParallelFor: parallelism={parallelism!r}; valid: an int >= 0 (0: no limit)")
        gid = f"loop-{next(_IDS)}"
        self.group = Group("loop", gid, name or gid, items=items, parallelism=parallelism)

    def _value(self) -> LoopItem:
        items = self.group.items
        typ = None
        if isinstance(items, list):
            kinds = {type(v) for v in items}
            typ = kinds.pop() if len(kinds) == 1 else (float if kinds <= {int, float} else None)
        return LoopItem(self.group, None, typ)


def current_groups() -> tuple[Group, ...]:
    """The groups a call added now is in (outermost first)."""
    return _SCOPE.get()


# --- binding (called by Pipeline.add) -----------------------------------------------------------------------


def is_channel(value: Any) -> bool:
    """Whether ``value`` is a control-flow reference a call's parameter may be bound to."""
    return isinstance(value, (ValueRef, LoopItem, CollectedRef))


def register(pipeline: Pipeline, groups: Sequence[Group], call: Call | None = None) -> None:
    """Register the list pipeline parameters the loops in ``groups`` iterate over, and check their conditions'
    references and the artifacts ``call`` reads (called by ``Pipeline.add`` for each new call).

    Raises:
        InvalidParameter: a reference the call cannot read (see :func:`bind_param`).
    """
    from heteroflow.pipelines.graph import OutputRef, ParamRef

    for key, binding in (call.bindings.items() if call is not None else ()):
        if isinstance(binding, OutputRef) and binding.call in pipeline:
            inside = [g for g in pipeline[binding.call].groups if g not in groups and g.kind != "pipeline"]
            if inside:
                raise InvalidParameter(
                    f"{call.name}: input {key!r} reads {binding.call}.{binding.output}, produced inside {inside[0].name} "
                    "that this call is outside of; artifacts do not cross a loop or a condition (return a value instead, "
                    "or add the call inside)"
                )
    for group in groups:
        if group.kind == "loop" and isinstance(group.items, ParamRef):
            ref = group.items
            param = Param(name=ref.name, type=list, default=ref.default, help=ref.help or "the items a ParallelFor loops over", unit=ref.unit)
            existing = pipeline._params.get(ref.name)
            if existing is not None and existing.type is not list:
                raise InvalidParameter(f"ParallelFor over {ref.name!r}: that pipeline parameter is already a {existing.type.__name__}")
            if existing is None:
                pipeline._params[ref.name] = param
            pass  # items keep the ParamRef as given (its default and help), for `item.items`
        elif group.kind == "loop" and isinstance(group.items, ValueRef):
            _visible(pipeline, group.items, groups[: groups.index(group)], where=f"ParallelFor over {group.items!r}")
        for branch in (group, *group.branches):
            if branch.condition is not None:
                for side in branch.condition.operands():
                    if isinstance(side, ValueRef):
                        _visible(pipeline, side, groups[: groups.index(group)], where=f"condition {branch.condition!r}")
                    elif isinstance(side, ParamRef) and side.name not in pipeline._params:
                        raise InvalidParameter(f"condition {branch.condition!r}: {side.name!r} is not a parameter of pipeline {pipeline.name!r}; bind it to a call first")


def _visible(pipeline: Pipeline, ref: ValueRef, groups: Sequence[Group], *, where: str) -> Any:
    """The producing call of ``ref``, checked to be readable from a call in ``groups``: not inside a loop or a
    condition branch the reader is not in (KFP reads such a value only through Collected, or not at all)."""
    if ref.call not in pipeline:
        raise InvalidParameter(f"{where}: call {ref.call!r} is not in pipeline {pipeline.name!r} yet")
    producer = pipeline[ref.call]
    inside = [g for g in producer.groups if g not in groups and g.kind != "pipeline"]
    if inside:
        g = inside[0]
        if g.kind == "loop":
            raise InvalidParameter(f"{where}: {ref!r} is produced inside {g.name}; after the loop read it as Collected({ref!r})")
        raise InvalidParameter(
            f"{where}: {ref!r} is produced inside condition {g.name}, so it may not exist outside it; read it in a call "
            "inside the same If (KFP's dsl.OneOf over branches is not supported on the open-source backend)"
        )
    return producer


def bind_param(pipeline: Pipeline, call: str, param: Param, value: Any, groups: Sequence[Group]) -> Any:
    """The binding of step parameter ``param`` of ``call`` to a control-flow reference, type-checked.

    Raises:
        InvalidParameter: a reference the call cannot read (a loop item outside its loop, a value from inside a
            loop without Collected, a Collected value inside its own loop) or of another type.
    """
    where = f"{call}: parameter {param.name!r}"
    if isinstance(value, ValueRef):
        _visible(pipeline, value, groups, where=where)
        _check_type(where, param, value.type, repr(value))
        return value
    if isinstance(value, LoopItem):
        if value.loop not in groups:
            raise InvalidParameter(f"{where}: {value!r} is the item of a loop this call is not inside")
        if value.type is not None:
            _check_type(where, param, value.type, repr(value))
        return value
    if isinstance(value, CollectedRef):
        producer = pipeline[value.ref.call] if value.ref.call in pipeline else None
        if producer is None:
            raise InvalidParameter(f"{where}: call {value.ref.call!r} is not in pipeline {pipeline.name!r} yet")
        loops = [g for g in producer.groups if g.kind == "loop" and g not in groups]
        if not loops:
            raise InvalidParameter(f"{where}: {value!r}: {value.ref.call} is not inside a loop this call is outside of; read it directly")
        if len(loops) > 1:
            raise InvalidParameter(f"{where}: {value!r} crosses {len(loops)} nested loops; collect one loop at a time")
        others = [g for g in producer.groups if g not in groups and g.kind in ("if", "elif", "else")]
        if others:
            raise InvalidParameter(f"{where}: {value!r} is produced inside condition {others[0].name}; collect values produced in every iteration")
        if param.type is not list:
            raise InvalidParameter(f"{where} is a {param.type.__name__}; Collected(...) gives a list: annotate the parameter list")
        return CollectedRef(value.ref, loops[0])
    raise InvalidParameter(f"{where}: {value!r} cannot be bound")


def _check_type(where: str, param: Param, typ: type, what: str) -> None:
    if typ is param.type or (param.type is float and typ is int):
        return
    from heteroflow.components.core.step import _a

    raise InvalidParameter(f"{where} is {_a(param.type)}, but {what} is {_a(typ)}")


def conditional(call: Call) -> bool:
    """Whether ``call`` may legitimately not run: it is inside a condition branch or a loop."""
    return any(g.kind != "pipeline" for g in call.groups)


class Node:
    """A node of a pipeline's tree of groups (the root: group None): its calls and nested groups, in order."""

    def __init__(self, group: Group | None) -> None:
        self.group = group
        self.children: list[Call | Node] = []

    def calls(self) -> Iterable[Call]:
        for child in self.children:
            if isinstance(child, Node):
                yield from child.calls()
            else:
                yield child


def tree(calls: Sequence[Call]) -> Node:
    """The calls as a tree of their groups (what engines walk to render or run them).

    Raises:
        InvalidParameter: a group's calls are not contiguous (a call added to a group after it was left).
    """
    root = Node(None)
    for call in calls:
        node = root
        for group in call.groups:
            last = node.children[-1] if node.children else None
            if isinstance(last, Node) and last.group is group:
                node = last
            else:
                if any(isinstance(c, Node) and c.group is group for c in node.children):
                    raise InvalidParameter(f"{call.name}: added to {group.name} after other calls left it; add a group's calls together")
                new = Node(group)
                node.children.append(new)
                node = new
        node.children.append(call)
    return root


def has_control(pipeline: Pipeline) -> bool:
    """Whether ``pipeline`` uses output parameters, conditions, loops or sub-pipelines (then engines render it
    with their control-flow renderers)."""
    return any(c.groups or c.step.returns or any(is_channel(b) for b in c.bindings.values()) for c in pipeline.calls)
