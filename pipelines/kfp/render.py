"""Render a :class:`~heteroflow.pipelines.graph.Pipeline` for Kubeflow Pipelines v2 (compile, kfp.local).

Nothing here knows a step's name or parameters: everything comes from the Pipeline and its Steps.

- **Components.** Each call becomes a KFP lightweight component generated from its Step: the signature lists
  the step's artifacts (``Input[Dataset]``, ``Output[Model]`` ...) and parameters (types, defaults), plus
  reserved ``heteroflow_*`` inputs and outputs; the body is one call into
  :func:`heteroflow.components.core.runtime.kfp_task`, the code path every engine shares. (kfp.local's
  SubprocessRunner runs only lightweight Python components, and KFP embeds a component's source text, so the
  source is generated and registered with :mod:`linecache`.) The image must have heteroflow installed.
- **One graph, flat.** Every call is one top-level task (a device-bound call with several candidates: a chain,
  below), wired only by the data it reads, so calls that do not depend on each other run in parallel on a
  cluster and on kfp.local too (kfp 2.17 runs a DAG's tasks one at a time; :func:`heteroflow.pipelines.kfp.local.run_local`
  starts every task whose inputs are ready). No call is nested in another call's branch.
- **Routing.** Every step task returns its route: ``succeeded``; ``to-<k>`` (a device failure: candidate ``k``
  runs next, decided in the task by :func:`heteroflow.components.core.fallback.next_candidate`, the rule every engine
  uses, with the plan's inventory); ``failed: <class>: <reason>`` (permanent, or a device failure with no
  candidate left; the reason escaped by :func:`heteroflow.components.core.runtime.route_text`, since kfp.local pastes
  values into a Python expression); ``upstream`` (a call it reads from did not succeed: it did not run). A
  transient failure raises, so KFP retries it with the call's policy. A task reads the routes of the calls it
  reads artifacts from (``heteroflow_after_<call>``) and does not run after their failure. No step task fails
  for a permanent or device failure: the run's last task, ``check: every step succeeded`` (no retries, no
  cache), reads every call's route, writes the run report as its ``HTML`` output ``report``
  (:mod:`heteroflow.pipelines.kfp.artifacts`) and fails the run with the first failed step's own message. So a permanent
  failure spends no retries, and a run whose later candidate succeeded ends SUCCEEDED (DESIGN.md: a failed task
  would fail the run even when a fallback succeeded).
- **Fallback chain.** A device-bound call with n >= 2 candidates renders as n levels, each a condition group
  named like ``train: npu -> gpu -> cpu [gpu-1]``: ``If(previous route == "to-k")`` runs candidate k, its
  ``Else`` (``[not gpu-1]``) a tiny ``skip`` task that passes the previous route and artifact URIs on;
  ``dsl.OneOf`` over parameters (which kfp.local supports) gives the level's route and URIs. The planner's
  output is the route into level 0 (``to-<first candidate it placed>``; without a planner candidate 0 runs
  unconditionally). After the last level one ``dsl.importer`` per output turns the chosen candidate's artifact
  URI back into a typed artifact (lineage in the UI), which the calls after it read: kfp.local cannot select
  among artifacts with ``dsl.OneOf``. A level's condition reads the OneOf of the level before: conditions on a
  OneOf resolve on kfp.local inside a condition group, not at the top level, which is why the check task, not
  an ``If``, ends the run.
- **A chain's parameters.** The candidates of a chain do not take the call's parameters one by one: a top-level
  ``<call>: arguments`` task takes them, typed and with their defaults as a step's component does (the values
  the Kubeflow UI shows, on that node), and returns them as one JSON object, which every candidate reads
  (``heteroflow_arguments``). KFP declares every pipeline channel a group's tasks read in every group it
  crosses, so one channel crosses a level's groups instead of one per parameter (train has 18). On kfp.local the
  arguments, skip and check tasks run in the driver process (:func:`bookkeeping_function`), not in a process
  each. Size: n candidate tasks, n skip tasks, linear in n. The default pipeline with three train candidates is
  2,270 lines as :func:`compile_pipeline` writes it (1..5 candidates: 1,248, 1,936, 2,270, 2,603, 2,944; a level
  ~335 lines; tested), 2,362 as KFP writes it: the levels' skip tasks share one component and executor (KFP copies
  both per task).
- **Resources.** Each task gets its candidate's requests, limits, accelerator, node selector, tolerations,
  labels and annotations through :func:`heteroflow.pipelines.kfp.resources.apply_resources`, with the cluster
  profile's conventions (official device plugin or HAMi, label keys, queues) when one is given. The candidate
  is an input of the task, so KFP's cache (which ignores resources) never answers a fallback from another
  device's entry.
- **Retries.** ``set_retry`` from the call's :class:`~heteroflow.components.core.retry.RetryPolicy`:
  ``backoff_max_duration`` is the total window on a cluster (Argo ``backoff.maxDuration``) and the per-wait cap on
  kfp.local, which reads the field that way.
"""

from __future__ import annotations

import inspect
import itertools
import json
import linecache
import re
import threading
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kfp import dsl
from kfp.dsl import HTML, Artifact, ClassificationMetrics, Dataset, Input, Metrics, Model, Output, OutputPath, PipelineTask

from heteroflow.components.errors import InvalidParameter
from heteroflow.components.devices.cluster import DEFAULT_PROFILE, ClusterProfile
from heteroflow.components.resources import DeviceKind
from heteroflow.components.core.runtime import (
    KFP_AFTER_PREFIX,
    KFP_ARGUMENTS,
    KFP_CANDIDATE,
    KFP_CANDIDATES,
    KFP_INVENTORY,
    KFP_PLACED_PREFIX,
    KFP_PLACEMENTS,
    KFP_PLAN_INVENTORY,
    KFP_URI_PREFIX,
    candidate_to_json,
)
from heteroflow.components.core.step import ArtifactType, Step, step_ref
from heteroflow.pipelines.graph import Call, OutputRef, ParamRef, Pipeline
from heteroflow.pipelines.kfp import platform
from heteroflow.pipelines.kfp.patches import cheap_container_checks
from heteroflow.pipelines.kfp.resources import apply_resources
from heteroflow.pipelines.volumes import run_after as vol_run_after

__all__ = ["DEFAULT_IMAGE", "apply_resources", "apply_retry", "compile_pipeline", "to_kfp"]

DEFAULT_IMAGE = "heteroflow-python:0.1.0"
"""Default base image: an image with ``pip install heteroflow[all]`` inside (see the README). The name contains
"python" because kfp.local's SubprocessRunner warns on images that do not. It is a placeholder: on a cluster,
give ``--image`` an image you built."""

_KFP_TYPES: Mapping[ArtifactType, type] = {
    ArtifactType.ARTIFACT: Artifact,
    ArtifactType.DATASET: Dataset,
    ArtifactType.MODEL: Model,
    ArtifactType.METRICS: Metrics,
    ArtifactType.CLASSIFICATION_METRICS: ClassificationMetrics,
    ArtifactType.HTML: HTML,
}
_shim_counter = itertools.count()


def _py(name: str) -> str:
    """A call name as a Python identifier (``train-large`` -> ``train_large``; KFP names the task ``train-large``)."""
    return name.replace("-", "_")


def apply_retry(task: PipelineTask, policy: Any, *, local: bool = False) -> PipelineTask:
    """Write ``policy`` (a :class:`~heteroflow.components.core.retry.RetryPolicy`) as KFP's retry strategy.

    Args:
        local: the pipeline runs on kfp.local (``backoff_max_duration`` is then the per-wait cap, not the total
            window).
    """
    if policy.retries:
        task.set_retry(**policy.kfp_retry_args(local=local))
    return task


# --- component generation ----------------------------------------------------------------------------------


def _annotation_text(typ: type, optional: bool) -> str:
    return f"Optional[{typ.__name__}]" if optional else typ.__name__


def _param_signature(step: Step) -> tuple[list[str], list[str]]:
    """A step's parameters as Python parameters: the required ones (``name: type``), then those with defaults
    (``name: type = default``)."""
    required: list[str] = []
    defaulted: list[str] = []
    for p in step.params:
        text = f"{p.name}: {_annotation_text(p.type, p.optional)}"
        if p.required:
            required.append(text)
        else:
            defaulted.append(f"{text} = {_literal(p.default, step=step.name, name=p.name)}")
    return required, defaulted


def _literal(value: Any, *, step: str = "", name: str = "") -> str:
    """A default as Python source (``repr``).

    Raises:
        InvalidParameter: a non-finite float: a KFP pipeline's IR keeps a default as a JSON number, which has no
            infinity or NaN (its repr ``inf`` compiled to a bare NameError, and ``float('inf')`` fails in KFP's
            protobuf serialisation); the message names the step and the parameter.
    """
    import math

    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidParameter(
            f"step {step!r}: parameter {name}'s default {value!r} cannot be written in a KFP pipeline (its IR keeps a "
            "default as a JSON number, which has no infinity or NaN); valid: a finite default, or an optional "
            "parameter (default None) the step reads as no limit")
    return repr(value)


def _shim_source(call: Call, ref: str, *, placed: list[str], after: list[str], chain: bool, inventory: bool) -> str:
    """The lightweight component of ``call``: its artifacts, the reserved inputs and outputs, and its parameters,
    typed with their defaults; a chain's candidates take the parameters as one JSON input instead
    (``heteroflow_arguments``, made by :func:`_arguments_source`'s task)."""
    step = call.step
    required: list[str] = []
    for spec in step.inputs:
        required.append(f"{spec.name}: Input[{spec.type.value}]")
    for spec in step.outputs:
        required.append(f"{spec.name}: Output[{spec.type.value}]")
    for name in placed:
        required.append(f"{KFP_PLACED_PREFIX}{name}: OutputPath(str)")
    if placed:
        required.append(f"{KFP_PLAN_INVENTORY}: OutputPath(str)")
    if chain:
        required.extend(f"{KFP_URI_PREFIX}{spec.name}: OutputPath(str)" for spec in step.outputs)
    for name in after:
        required.append(f"{KFP_AFTER_PREFIX}{_py(name)}: str")
    if step.device_bound:
        required.append(f"{KFP_CANDIDATE}: str")
        required.append(f"{KFP_CANDIDATES}: str")
    if inventory:
        required.append(f"{KFP_INVENTORY}: str")
    if step.planner:
        required.append(f"{KFP_PLACEMENTS}: str")
    params, defaulted = ([f"{KFP_ARGUMENTS}: str"], []) if chain else _param_signature(step)
    required.extend(params)
    signature = "".join(f"\n    {p}," for p in required + defaulted)  # none: a step without parameters or artifacts
    doc = (step.description or step.name).replace('"""', "'''")
    return (
        f"def {_py(call.name)}({signature}{chr(10) if signature else ''}) -> str:\n"
        f'    """{doc}"""\n'
        "    arguments = __import__('builtins').dict(__import__('builtins').locals())  # a parameter may be named dict\n"
        "    from heteroflow.components.core.runtime import kfp_task\n\n"
        f"    return kfp_task({ref!r}, {call.name!r}, arguments)\n"
    )


def _make_component(call: Call, image: str, local: bool = False, **shape: Any) -> Any:
    options = platform.component_options(call, image, local=local)
    return _exec_component(_shim_source(call, step_ref(call.step), **shape), _py(call.name), options.pop("base_image"), **options)


def _skip_source(call: Call) -> str:
    """A candidate of ``call`` that does not run: it passes the previous candidate's route, reason and artifact
    URIs on (the ``Else`` branch of its level; ``dsl.OneOf`` needs a value from every branch)."""
    names = [s.name for s in call.step.outputs]
    ins = "".join(f", uri_{n}: str" for n in names)
    outs = "".join(f", {KFP_URI_PREFIX}{n}: OutputPath(str)" for n in names)
    # the (path, text) pairs as a tuple's source; none: '()' (it wrote '(,)', a SyntaxError, for a step with no output)
    pairs = "(" + ", ".join(f"({KFP_URI_PREFIX}{n}, uri_{n})" for n in names) + ",)" if names else "()"
    return (
        f"def heteroflow_skip_{_py(call.name)}(route: str{ins}{outs}) -> str:\n"
        f'    """A candidate of {call.name} that does not run: pass the previous route and artifact URIs on."""\n'
        "    import os\n\n"
        f"    for path, text in {pairs}:\n"
        "        os.makedirs(os.path.dirname(path), exist_ok=True)\n"
        "        with open(path, 'w', encoding='utf-8') as f:\n"
        "            f.write(text)\n"
        "    return route\n"
    )


_BOOKKEEPING: dict[str, Any] = {}
"""Source text -> function of every bookkeeping component rendered in this process (arguments, skip, check): what
:func:`bookkeeping_function` finds for kfp.local."""
_BOOKKEEPING_LOCK = threading.Lock()


def bookkeeping_function(full_command: list[str]) -> Any:
    """The Python function of a bookkeeping task (a chain's ``arguments`` and ``skip``, the final ``check``) whose lightweight
    component command is ``full_command``, or None for any other task (a step, a user's component).

    A function is returned only when its exact source text is the program the command would run (KFP embeds a
    component's source in its command), so running it in this process runs the same code a step process would.
    kfp.local uses this to run these tasks without a process of their own (:mod:`heteroflow.pipelines.kfp.local`).
    """
    name = next((full_command[i + 1] for i, a in enumerate(full_command[:-1]) if a == "--function_to_execute"), None)
    if name is None or not (name == "heteroflow_check" or name.startswith(("heteroflow_skip_", "heteroflow_arguments_", "heteroflow_value_"))):
        return None
    with _BOOKKEEPING_LOCK:
        known = list(_BOOKKEEPING.items())
    for source, func in known:
        if func.__name__ == name and any(source in part for part in full_command):
            return func
    return None


def _arguments_source(call: Call) -> str:
    """A chain's ``<call>: arguments`` task: the call's parameters, typed and with their defaults as in a step's
    component, returned as one JSON object that every candidate task of the chain reads (``heteroflow_arguments``:
    one pipeline channel through the chain's groups instead of one per parameter)."""
    required, defaulted = _param_signature(call.step)
    signature = "".join(f"\n    {p}," for p in required + defaulted)
    return (
        f"def heteroflow_arguments_{_py(call.name)}({signature}{chr(10) if signature else ''}) -> str:\n"
        f'    """The parameters of {call.name} as one JSON object, for the candidates of its fallback chain."""\n'
        "    arguments = __import__('builtins').dict(__import__('builtins').locals())  # a parameter may be named dict\n"
        "    import json\n\n"
        "    return json.dumps(arguments, sort_keys=True)\n"
    )


def _exec_component(source: str, name: str, image: str, *, bookkeeping: bool = False, **options: Any) -> Any:
    """A KFP lightweight component from generated source (registered in :mod:`linecache`, where
    ``inspect.getsource`` finds it; an entry whose mtime is None is never invalidated).

    Args:
        bookkeeping: an arguments, skip or check task's component: remember its function for
            :func:`bookkeeping_function`.
    """
    filename = f"<heteroflow-kfp-component-{next(_shim_counter)}-{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {
        "Input": Input,
        "Output": Output,
        "OutputPath": OutputPath,
        "Optional": typing.Optional,
        **{t.value: _KFP_TYPES[t] for t in ArtifactType},
    }
    # dont_inherit: this module's `from __future__ import annotations` would turn the annotations into strings
    exec(compile(source, filename, "exec", dont_inherit=True), namespace)  # noqa: S102 - our own generated source
    if bookkeeping:
        with _BOOKKEEPING_LOCK:
            _BOOKKEEPING.setdefault(source, namespace[name])
    return dsl.component(namespace[name], base_image=image, install_kfp_package=False, **options)


def _check_source(calls: list[str], *, pipeline: str = "", steps: Mapping[str, str] | None = None) -> str:
    """The run's last task: write the run report as an ``HTML`` artifact (``report``:
    :func:`heteroflow.pipelines.kfp.artifacts.write_report_artifact`; ``steps``: call -> step ref), then fail the run
    with the first failed call's own message (no retries), else succeed."""
    params = ", ".join([f"route_{_py(c)}: str" for c in calls] + ["report: Output[HTML]"])
    routes = "{" + ", ".join(f"{c!r}: route_{_py(c)}" for c in calls) + "}"
    checks = "".join(
        f"    if route_{_py(c)}.startswith('failed: '):\n"
        f"        cls, _, why = json.loads(chr(34) + route_{_py(c)}[8:] + chr(34)).partition(': ')\n"
        f"        raise RuntimeError(f\"step {c!r} failed ({{cls}}; not retried): {{why}}\")\n"
        for c in calls
    )
    return (
        f"def heteroflow_check({params}) -> str:\n"
        '    """Write the run report (the HTML artifact report), then fail the run with the first failed step\'s own '
        'message (a permanent failure, or a device failure with no candidate left); a step that did not run after it '
        'reads upstream."""\n'
        "    import json\n\n"
        "    from heteroflow.pipelines.kfp.artifacts import write_report_artifact\n\n"
        f"    write_report_artifact(report, pipeline={pipeline!r}, steps={dict(steps or {})!r}, routes={routes})\n"
        f"{checks}"
        "    return 'succeeded'\n"
    )


# --- rendering ------------------------------------------------------------------------------------------------


def _kind(res: Any) -> str:
    """A candidate's kind as labels give it: ``gpu``; a mixed candidate's every kind, ``gpu+npu``."""
    kinds = getattr(res, "kinds", None)
    return "+".join(kinds) if kinds and len(kinds) > 1 else DeviceKind(res.kind).value


def chain_label(call: Call) -> str:
    """What the Kubeflow UI shows for a call's fallback chain: ``train: npu -> gpu -> cpu``."""
    return f"{call.name}: " + " -> ".join(_kind(r) for r in call.candidates)


class _Renderer:
    def __init__(self, pipeline: Pipeline, *, image: str, local: bool, profile: ClusterProfile | None = None) -> None:
        self.pipeline = pipeline
        self.calls = pipeline.calls
        self.image = image
        self.local = local
        self.profile = profile
        planner = pipeline.planner
        self.planner = planner.name if planner is not None else None
        self.placed = [c.name for c in pipeline.placed_calls] if planner is not None else []
        self.components = {
            c.name: _make_component(
                c,
                image,
                local,
                placed=self.placed if c.step.planner else [],
                after=self.after(c),
                chain=self.chained(c),
                inventory=c.device_bound and self.planner is not None,
            )
            for c in self.calls
        }
        self.skips = {
            c.name: _exec_component(_skip_source(c), f"heteroflow_skip_{_py(c.name)}", image, bookkeeping=True)
            for c in self.calls
            if self.chained(c)
        }
        self.arguments = {
            c.name: _exec_component(_arguments_source(c), f"heteroflow_arguments_{_py(c.name)}", image, bookkeeping=True)
            for c in self.calls
            if self.chained(c)
        }
        self.check = _exec_component(
            _check_source([c.name for c in self.calls], pipeline=pipeline.name, steps={c.name: step_ref(c.step) for c in self.calls}),
            "heteroflow_check", image, bookkeeping=True,
        )
        self.placements_json = json.dumps(pipeline.placements(), sort_keys=True)
        self.pvcs: dict[str, Any] = {}  # CreatePVC name -> its task (platform.create_pvcs, in the pipeline's body)
        self.tops: dict[str, list[Any]] = {}  # call -> its tasks outside condition groups (what DeletePVC waits for)

    def chained(self, call: Call) -> bool:
        """Whether ``call`` renders as a fallback chain: device-bound with several candidates (a single candidate
        the plan cannot place fails the plan step itself)."""
        return call.device_bound and len(call.candidates) > 1

    def after(self, call: Call) -> list[str]:
        """The calls whose route ``call`` reads: those it reads artifacts from, and the planner for a call it places
        that renders without a chain (one candidate: no level reads the plan's route, so without this it would start
        beside the plan, even after the plan failed)."""
        names = [ref.call for ref in call.input_refs().values()]
        names += vol_run_after(self.pipeline, call)  # .after(): ordering without data, read as a route
        if self.planner is not None and call.name in self.placed and not self.chained(call):
            names.append(self.planner)
        return list(dict.fromkeys(names))

    # env: ("param", name) | ("out", call, output) | ("route", call) | ("placed", call) | ("inventory",)

    def bound(self, call: Call, env: dict[tuple[str, ...], Any], names: Any) -> dict[str, Any]:
        """The arguments of ``call``'s bindings named in ``names``, each as :meth:`argument` gives it."""
        return {key: self.argument(call, key, binding, env) for key, binding in call.bindings.items() if key in names}

    def argument(self, call: Call, key: str, binding: Any, env: dict[tuple[str, ...], Any]) -> Any:
        """The task argument for ``binding`` (``call``'s parameter ``key``): an upstream output's channel, a
        pipeline parameter's, or a constant's value."""
        if isinstance(binding, OutputRef):
            return env[("out", binding.call, binding.output)]
        if isinstance(binding, ParamRef):
            return env[("param", binding.name)]
        return binding.value

    def task(self, call: Call, env: dict[tuple[str, ...], Any], index: int) -> PipelineTask:
        params = {p.name for p in call.step.params}
        if self.chained(call):  # the parameters come as one JSON object (the chain's arguments task)
            kwargs = self.bound(call, env, set(call.bindings) - params)
            kwargs[KFP_ARGUMENTS] = env[("arguments", call.name)]
        else:
            kwargs = self.bound(call, env, set(call.bindings))
        for name in self.after(call):
            kwargs[f"{KFP_AFTER_PREFIX}{_py(name)}"] = env[("route", name)]
        resources = call.candidates[index]
        if call.device_bound:
            kwargs[KFP_CANDIDATE] = candidate_to_json(index, resources)
            kwargs[KFP_CANDIDATES] = call.candidates.to_json()
            if self.planner is not None:
                kwargs[KFP_INVENTORY] = env[("inventory",)]
        if call.step.planner:
            kwargs[KFP_PLACEMENTS] = self.placements_json
        task = self.components[call.name](**kwargs)
        shown = call.display_name or call.name
        if call.device_bound:
            task.set_display_name(f"{shown} on {_kind(resources)} (candidate {index})")
        else:
            task.set_display_name(shown)
        platform.apply_call_options(task, call, local=self.local, pvcs=self.pvcs)
        # kfp.local ignores resources: the default profile there, without the default-profile warning (#16.20)
        apply_resources(task, resources, profile=self.profile or (DEFAULT_PROFILE if self.local else None), local=self.local)
        apply_retry(task, call.retry, local=self.local)
        if call.secrets and not self.local:  # kfp.local never reads kfp-kubernetes settings
            from kfp import kubernetes

            for secret in call.secrets:
                kubernetes.use_secret_as_env(
                    task, secret_name=secret.secret, secret_key_to_env={key: var for var, key in secret.env.items()}
                )
        task.set_caching_options(enable_caching=bool(call.cacheable))
        return task

    @staticmethod
    def small(task: PipelineTask, name: str) -> PipelineTask:
        """A bookkeeping task (skip, check): no retries, no cache, a name that says what it is."""
        task.set_display_name(name)
        task.set_caching_options(enable_caching=False)
        return task

    def emit(self, call: Call, env: dict[tuple[str, ...], Any]) -> None:
        if self.chained(call):
            self.emit_chain(call, env)
            return
        task = self.task(call, env, 0)
        self.tops[call.name] = [task]
        env[("route", call.name)] = task.outputs["Output"]
        for spec in call.step.outputs:
            env[("out", call.name, spec.name)] = task.outputs[spec.name]
        if call.step.planner:
            for name in self.placed:
                env[("placed", name)] = task.outputs[f"{KFP_PLACED_PREFIX}{name}"]
            env[("inventory",)] = task.outputs[KFP_PLAN_INVENTORY]

    def emit_chain(self, call: Call, env: dict[tuple[str, ...], Any]) -> None:
        label = chain_label(call)
        names = [s.name for s in call.step.outputs]
        params = {p.name for p in call.step.params}
        arguments = self.small(self.arguments[call.name](**self.bound(call, env, params)), f"{call.name}: arguments")
        env[("arguments", call.name)] = arguments.outputs["Output"]
        route: Any = env.get(("placed", call.name))
        uris: dict[str, Any] = {n: "" for n in names}
        for k, res in enumerate(call.candidates):
            if route is None:  # no planner: candidate 0 always starts the chain
                task = self.task(call, env, 0)
                route = task.outputs["Output"]
                uris = {n: task.outputs[f"{KFP_URI_PREFIX}{n}"] for n in names}
                continue
            with dsl.If(route == f"to-{k}", name=f"{label} [{_kind(res)}-{k}]"):
                task = self.task(call, env, k)
            with dsl.Else(name=f"{label} [not {_kind(res)}-{k}]"):
                # KFP wraps the If/Else pair in a `condition-branches-N` group when the Else opens: name it (#28.19)
                platform.name_condition_branches(f"{label} [{_kind(res)}-{k} or not]")
                passed = self.small(
                    self.skips[call.name](route=route, **{f"uri_{n}": uris[n] for n in names}),
                    f"{call.name}: not {_kind(res)}-{k}",
                )
            route = dsl.OneOf(task.outputs["Output"], passed.outputs["Output"])
            uris = {n: dsl.OneOf(task.outputs[f"{KFP_URI_PREFIX}{n}"], passed.outputs[f"{KFP_URI_PREFIX}{n}"]) for n in names}
        env[("route", call.name)] = route
        self.tops[call.name] = []
        for spec in call.step.outputs:
            imported = dsl.importer(artifact_uri=uris[spec.name], artifact_class=_KFP_TYPES[spec.type], reimport=False)
            imported.set_display_name(f"{call.display_name or call.name}: {spec.name} (from the candidate that ran)")
            self.tops[call.name].append(imported)
            env[("out", call.name, spec.name)] = imported.output

    def finish(self, env: dict[tuple[str, ...], Any]) -> None:
        kwargs: dict[str, Any] = {}
        for call in self.calls:
            kwargs[f"route_{_py(call.name)}"] = env[("route", call.name)]
        check = self.small(self.check(**kwargs), "check: every step succeeded")
        platform.delete_pvcs(self.pipeline, self.pvcs, self.tops, check)


def _pipeline_doc(pipeline: Pipeline) -> str:
    lines = [pipeline.description or pipeline.name, "", "Args:"]
    for p in pipeline.params.values():
        unit = f" (unit: {p.unit})" if p.unit else ""
        lines.append(f"    {p.name.replace('.', '_').replace('-', '_')}: {p.help}{unit}")
    return "\n".join(lines)


def kfp_param_names(pipeline: Pipeline) -> dict[str, str]:
    """Pipeline parameter -> its name in KFP (a Python identifier: ``train.seed`` is ``train_seed``).

    Raises:
        InvalidParameter: two parameters that would get the same KFP name.
    """
    out: dict[str, str] = {}
    for name in pipeline.params:
        kfp_name = name.replace(".", "_").replace("-", "_")
        clash = next((k for k, v in out.items() if v == kfp_name), None)
        if clash is not None:
            raise InvalidParameter(f"parameters {clash!r} and {name!r} both become {kfp_name!r} in KFP; rename one (p.param(...))")
        out[name] = kfp_name
    return out


def kfp_arguments(pipeline: Pipeline, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` (by pipeline parameter) keyed by their KFP names (:func:`kfp_param_names`)."""
    names = kfp_param_names(pipeline)
    return {names[k]: v for k, v in arguments.items()}


def to_kfp(
    pipeline: Pipeline, *, image: str = DEFAULT_IMAGE, local: bool = False, profile: ClusterProfile | None = None
) -> Any:
    """Render ``pipeline`` as a KFP pipeline (a ``GraphComponent``): compile it, or call it under ``kfp.local``.

    Args:
        pipeline: the pipeline.
        image: container image with heteroflow installed, for every step.
        local: render for kfp.local (retry backoff caps each wait) instead of a cluster (total window).
        profile: the cluster profile (:mod:`heteroflow.components.devices.cluster`): device-plugin conventions, node
            labels, queues, default tolerations; None: the official plugins' resource names and no selectors.

    Raises:
        InvalidParameter: ``pipeline`` is not a Pipeline; a step that a step process cannot import (defined in
            ``__main__``).
    """
    from heteroflow.pipelines import control

    if not isinstance(pipeline, Pipeline):  # None said "'NoneType' object has no attribute 'calls'"
        raise InvalidParameter(
            f"pipeline={pipeline!r} is not a heteroflow Pipeline; valid: a Pipeline (the default pipeline: "
            "heteroflow.pipelines.default.default_pipeline())")
    emit_all = None
    if control.has_control(pipeline):  # output parameters, conditions, loops, sub-pipelines
        from heteroflow.pipelines.kfp.control import ControlRenderer, to_kfp_control

        renderer: _Renderer = ControlRenderer(pipeline, image=image, local=local, profile=profile)
        emit_all = to_kfp_control(pipeline, renderer)  # type: ignore[arg-type]
    else:
        renderer = _Renderer(pipeline, image=image, local=local, profile=profile)
    params = list(pipeline.params.values())

    def body(*args: Any) -> None:
        env: dict[tuple[str, ...], Any] = {("param", p.name): a for p, a in zip(params, args)}
        renderer.pvcs = platform.create_pvcs(pipeline, local=local)
        if emit_all is not None:
            emit_all(env)
            return
        for call in pipeline.calls:
            renderer.emit(call, env)
        renderer.finish(env)

    names = kfp_param_names(pipeline)
    signature = []
    for p in params:
        annotation = typing.Optional[p.type] if p.optional else p.type
        default = inspect.Parameter.empty if p.required else p.default
        signature.append(inspect.Parameter(names[p.name], inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotation))
    body.__signature__ = inspect.Signature(signature)  # type: ignore[attr-defined]
    body.__name__ = re.sub(r"\W", "_", pipeline.name)
    body.__qualname__ = body.__name__
    body.__doc__ = _pipeline_doc(pipeline)
    with cheap_container_checks():
        return dsl.pipeline(
            body,
            name=pipeline.name,
            description=pipeline.description or None,
            display_name=getattr(pipeline, "display_name", None),
            pipeline_root=None if local else getattr(pipeline, "pipeline_root", None),
        )


def compile_pipeline(
    pipeline: Pipeline, path: str | Path, *, image: str = DEFAULT_IMAGE, profile: ClusterProfile | None = None
) -> Path:
    """Compile ``pipeline`` to KFP IR YAML at ``path`` (for the Kubeflow UI or ``kfp.Client``): KFP's compiler
    output with identical executors and components shared (:func:`_compact_ir`).

    Raises:
        InvalidParameter: ``path`` does not end in .yaml/.yml.
        OSError: the file cannot be written (the message names the path).
    """
    from kfp import compiler

    out = Path(path)
    if out.suffix not in (".yaml", ".yml"):
        raise InvalidParameter(f"output {out} must be a file name ending in .yaml or .yml")
    compiler.Compiler().compile(to_kfp(pipeline, image=image, profile=profile), str(out))
    text = out.read_text(encoding="utf-8")
    out.write_text(_compact_ir(text), encoding="utf-8")
    return out


# --- the written IR: shared specs ----------------------------------------------------------------------------


def _share_identical_specs(docs: list[Any]) -> None:
    """Let tasks share byte-identical executors and component specs, in place (KFP gives every task its own copy,
    ``comp-x``, ``comp-x-2`` ..., even of the same component: kubeflow/pipelines#6134).

    ``docs`` is a compiled pipeline as data: the IR and, with kfp-kubernetes settings, the platform spec.
    Executors are merged when their container (or importer) spec and their kfp-kubernetes settings are equal;
    component specs when they are equal (after the executors' merge, so a component that differed only in the
    label of an equal executor merges too), until nothing merges. The first name in KFP's order stays; every
    ``executorLabel`` and ``componentRef`` that named another one names it. The IR allows this: a component is a
    name any number of tasks refer to, an executor a label any number of components name, and the platform spec
    keys its settings by that label; KFP's backend visits each component once by name.
    """
    ir = docs[0]
    platform_spec = docs[1] if len(docs) > 1 else {}
    settings = platform_spec.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {}).get("executors", {})
    executors = ir.get("deploymentSpec", {}).get("executors", {})
    components = ir.get("components", {})

    def merged(specs: dict[str, Any], key: Any) -> dict[str, str]:
        first: dict[str, str] = {}
        rename: dict[str, str] = {}
        for name in sorted(specs, key=lambda n: (len(n), n)):  # comp-x before comp-x-2 before comp-x-10
            rename[name] = first.setdefault(json.dumps(key(name), sort_keys=True), name)
        return {old: new for old, new in rename.items() if old != new}

    while True:
        labels = merged(executors, lambda label: [executors[label], settings.get(label)])
        for component in components.values():
            if component.get("executorLabel") in labels:
                component["executorLabel"] = labels[component["executorLabel"]]
        for label in labels:
            del executors[label]
            settings.pop(label, None)
        names = merged(components, lambda name: components[name])
        for dag in [ir["root"].get("dag", {}), *(c["dag"] for c in components.values() if "dag" in c)]:
            for task in dag.get("tasks", {}).values():
                ref = task.get("componentRef", {})
                if ref.get("name") in names:
                    ref["name"] = names[ref["name"]]
        for name in names:
            del components[name]
        if not labels and not names:
            return


def _compact_ir(text: str) -> str:
    """A compiled pipeline's YAML (KFP's ``Compiler`` output) with identical specs shared
    (:func:`_share_identical_specs`), written as KFP writes it (block style, sorted keys); KFP's header comments
    are kept. The result parses to the same pipeline (``kfp.components.load_component_from_file``,
    ``PipelineSpec``)."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    docs = list(yaml.load_all("".join(lines[start:]), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))  # libyaml: same data, ~5x faster
    _share_identical_specs(docs)
    platform.integer_defaults(docs)
    return "".join(lines[:start]) + yaml.dump_all(docs, sort_keys=True)
