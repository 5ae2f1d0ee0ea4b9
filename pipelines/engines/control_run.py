"""Run a pipeline with output parameters, conditions, loops and sub-pipelines (:mod:`heteroflow.pipelines.control`)
in this process: the in-process engine's walk of the pipeline's tree of groups.

- A call's output parameters are its facts of those names (:meth:`Step.returned_values`), kept for the calls
  after it; an ``If``/``Elif``/``Else`` branch runs when its condition holds and the earlier branches' do not
  (:func:`heteroflow.pipelines.control.evaluate`); what it produces stays inside it.
- A ``ParallelFor`` runs its calls once per item, in order (one process: iterations one after another); each
  iteration's artifacts live under ``artifacts/<call>/<iteration>/<name>``; ``Collected`` reads the list of one
  value over the iterations. Each iteration's attempts are recorded as that iteration's (its index and item,
  :class:`~heteroflow.components.core.telemetry.Iteration`), not as more attempts of the call.
- A sub-pipeline's calls run in place (they are calls of the pipeline, ``<sub>__<call>``).
- Failures as :func:`heteroflow.pipelines.engines.inprocess.run_call` decides them (retries, fallback); the first
  call that does not succeed ends the run (nothing after it runs, in any group), except inside a ``ParallelFor``,
  whose iterations are independent (KFP's semantics, as kfp.local and Airflow's mapped instances run them): a call
  that fails ends its own iteration (the calls after it in that iteration do not run), every other iteration
  still runs, and once all have run the loop fails, which ends the run (nothing after the loop runs).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from heteroflow.components.core.telemetry import Iteration
from heteroflow.components.errors import InvalidParameter
from heteroflow.pipelines.control import CollectedRef, Group, LoopItem, Node, ValueRef, evaluate, tree
from heteroflow.pipelines.graph import Call, ParamRef, Pipeline

__all__ = ["run_control"]

Key = tuple[Any, ...]


class _Stop(Exception):
    """A call did not succeed: the run ends."""


def run_control(
    pipeline: Pipeline,
    args: Mapping[str, Any],
    folder: Path,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Run every call of ``pipeline`` that its conditions and loops reach; return whether none failed.

    Args:
        pipeline: the pipeline.
        args: its arguments (checked).
        folder: the run folder (artifacts go under ``artifacts/``).
        sleep: how to wait between retries.

    Raises:
        InvalidParameter: a loop over something that is not a list when the run reaches it.
    """
    from heteroflow.pipelines.engines.inprocess import run_call

    state: dict[str, Any] = {"starts": {}, "inventory": None}

    def resolve(value: Any, env: Mapping[Key, Any]) -> Any:
        if isinstance(value, ValueRef):
            return env[("value", value.call, value.output)]
        if isinstance(value, ParamRef):
            return args[value.name]
        if isinstance(value, LoopItem):
            item = env[("item", value.loop.id)]
            return item[value.field] if value.field is not None else item
        if isinstance(value, CollectedRef):
            return list(env[("collected", value.ref.call, value.ref.output)])
        return value

    def run_one(call: Call, env: dict[Key, Any]) -> None:
        params = pipeline.call_params(call, args)
        for key, binding in call.bindings.items():
            if isinstance(binding, (ValueRef, LoopItem, CollectedRef)):
                params[key] = call.step.param(key).check(resolve(binding, env))
        indices = [int(env[("iteration", g.id)]) for g in call.groups if g.kind == "loop"]
        suffix = [str(i) for i in indices]
        loops = [g for g in call.groups if g.kind == "loop"]
        iteration = Iteration(index=indices[-1], item=env[("item", loops[-1].id)], outer=tuple(indices[:-1])) if loops else None
        outputs = {s.name: str(Path(folder, "artifacts", call.name, *suffix, s.name)) for s in call.step.outputs}
        inputs = {name: env[("out", ref.call, ref.output)] for name, ref in call.input_refs().items()}
        outcome = run_call(
            call,
            params=params,
            inputs=inputs,
            outputs=outputs,
            start=state["starts"].get(call.name, 0),
            placements=pipeline.placements() if call.step.planner else None,
            placement=state["inventory"],
            sleep=sleep,
            iteration=iteration,
        )
        if outcome.status != "succeeded":
            raise _Stop(call.name)
        env.update({("out", call.name, k): v for k, v in outputs.items()})
        env.update({("value", call.name, k): v for k, v in call.step.returned_values(outcome.facts).items()})
        if call.step.planner:
            state["starts"].update(outcome.facts.get("indices", {}))
            found = outcome.facts.get("inventory")
            state["inventory"] = dict(found) if isinstance(found, Mapping) else None

    def taken(group: Group, env: Mapping[Key, Any]) -> bool:
        def holds(g: Group) -> bool:
            return g.condition is not None and evaluate(g.condition, lambda ref: resolve(ref, env))

        return not any(holds(b) for b in group.branches) and (group.kind == "else" or holds(group))

    def walk(node: Node, env: dict[Key, Any]) -> None:
        for child in node.children:
            if not isinstance(child, Node):
                run_one(child, env)
                continue
            group = child.group
            assert group is not None
            if group.kind == "pipeline":
                walk(child, env)
            elif group.kind == "loop":
                items = resolve(group.items, env)
                if not isinstance(items, list):
                    raise InvalidParameter(f"ParallelFor {group.name}: {group.items!r} is {items!r}, not a list")
                produced = [(c.name, p.name) for c in child.calls() if group in c.groups for p in c.step.returns]
                collected: dict[tuple[str, str], list[Any]] = {k: [] for k in produced}
                failed: list[int] = []
                for i, item in enumerate(items):
                    inner = dict(env)
                    inner[("item", group.id)] = item
                    inner[("iteration", group.id)] = i
                    try:
                        walk(child, inner)
                    except _Stop:  # this iteration failed; the others are independent of it and still run
                        failed.append(i)
                        continue
                    for k in produced:
                        if ("value", *k) in inner:
                            collected[k].append(inner[("value", *k)])
                if failed:  # the loop failed, after every iteration ran: nothing after it runs
                    raise _Stop(f"{group.name} iteration(s) {failed}")
                env.update({("collected", *k): v for k, v in collected.items()})
            elif taken(group, env):
                walk(child, dict(env))

    try:
        walk(tree(pipeline.calls), {})
    except _Stop:
        return False
    return True
