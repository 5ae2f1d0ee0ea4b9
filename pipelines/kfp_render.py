"""Render a :class:`~heteroflow.pipelines.graph.Pipeline` for Kubeflow Pipelines v2 (compile, kfp.local).

Nothing here knows a step's name or parameters: everything comes from the Pipeline and its Steps.

- **Components.** Each call becomes a KFP lightweight component generated from its Step: the signature lists
  the step's artifacts (``Input[Dataset]``, ``Output[Model]`` ...) and parameters (types, defaults), plus
  reserved ``heteroflow_*`` inputs and outputs; the body is one call into
  :func:`heteroflow.components.runtime.kfp_task`, the code path every engine shares. (kfp.local's
  SubprocessRunner runs only lightweight Python components, and KFP embeds a component's source text, so the
  source is generated and registered with :mod:`linecache`.) The image must have heteroflow installed.
- **Routing.** Every step task returns its route (``succeeded``, ``device``, ``permanent``; a transient failure
  raises, so KFP retries it with the call's policy). The rest of the pipeline runs inside
  ``If(route == "succeeded")``; a device failure of a device-bound call goes, in an ``Elif``, to the call's next
  candidate; anything else reaches an ``Else`` whose ``heteroflow-fail`` task (no retries) fails the run with the
  step's own message. So a permanent failure spends no retries, and a run whose later candidate succeeded ends
  SUCCEEDED (DESIGN.md: a failed task would fail the run even when a fallback succeeded).
- **Resources.** Each task gets its candidate's requests, limits, accelerator, node selector, tolerations,
  labels and annotations through :func:`heteroflow.pipelines.kfp_resources.apply_resources`, with the cluster
  profile's conventions (official device plugin or HAMi, label keys, queues) when one is given.
- **Placement.** The planner call returns, per device-bound call, the index of the first candidate whose device
  exists; an ``If(index == k)`` per candidate starts that call's fallback chain at ``k``. Each candidate's task
  carries that candidate's resources, and the candidate is an input of the task, so KFP's cache (which ignores
  resources) never answers a fallback from another device's entry.
- **Merging branches.** The calls after a device-bound call are rendered inside each of its success branches
  (kfp.local cannot select among artifacts with ``dsl.OneOf``), so a call with n candidates and a planner
  multiplies the tasks after it by n(n+1)/2 in the compiled YAML; exactly one copy runs.
- **Retries.** ``set_retry`` from the call's :class:`~heteroflow.components.retry.RetryPolicy`:
  ``backoff_max_duration`` is the total window on a cluster (Argo ``backoff.maxDuration``) and the per-wait cap on
  kfp.local, which reads the field that way.
- **Order.** Calls run one after another in the pipeline's order (each inside the previous one's success
  branch), so two calls that do not depend on each other do not run in parallel.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import json
import linecache
import re
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kfp import dsl
from kfp.dsl import Artifact, ClassificationMetrics, Dataset, Input, Metrics, Model, Output, OutputPath, PipelineTask

from heteroflow.components.errors import InvalidParameter
from heteroflow.components.cluster import DEFAULT_PROFILE, ClusterProfile
from heteroflow.components.resources import DeviceKind
from heteroflow.components.runtime import (
    KFP_CANDIDATE,
    KFP_FAILURE,
    KFP_PLACED_PREFIX,
    KFP_PLACEMENTS,
    candidate_to_json,
)
from heteroflow.components.step import ArtifactType, step_ref
from heteroflow.pipelines.graph import Call, OutputRef, ParamRef, Pipeline
from heteroflow.pipelines.kfp_resources import apply_resources

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
}
_shim_counter = itertools.count()


def apply_retry(task: PipelineTask, policy: Any, *, local: bool = False) -> PipelineTask:
    """Write ``policy`` (a :class:`~heteroflow.components.retry.RetryPolicy`) as KFP's retry strategy.

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


def _shim_source(call: Call, ref: str, *, placed: list[str]) -> str:
    step = call.step
    required: list[str] = []
    defaulted: list[str] = []
    for spec in step.inputs:
        required.append(f"{spec.name}: Input[{spec.type.value}]")
    for spec in step.outputs:
        required.append(f"{spec.name}: Output[{spec.type.value}]")
    required.append(f"{KFP_FAILURE}: OutputPath(str)")
    for name in placed:
        required.append(f"{KFP_PLACED_PREFIX}{name}: OutputPath(int)")
    if step.device_bound:
        required.append(f"{KFP_CANDIDATE}: str")
    if step.planner:
        required.append(f"{KFP_PLACEMENTS}: str")
    for p in step.params:
        text = f"{p.name}: {_annotation_text(p.type, p.optional)}"
        if p.required:
            required.append(text)
        else:
            defaulted.append(f"{text} = {p.default!r}")
    signature = ",\n    ".join(required + defaulted)
    doc = (step.description or step.name).replace('"""', "'''")
    return (
        f"def {call.name}(\n    {signature},\n) -> str:\n"
        f'    """{doc}"""\n'
        "    arguments = dict(locals())\n"
        "    from heteroflow.components.runtime import kfp_task\n\n"
        f"    return kfp_task({ref!r}, {call.name!r}, arguments)\n"
    )


def _make_component(call: Call, image: str, *, placed: list[str]) -> Any:
    return _exec_component(_shim_source(call, step_ref(call.step), placed=placed), call.name, image)


_FAIL_SOURCE = '''def heteroflow_fail(step: str, route: str, reason: str):
    """Fail the run with the step's own message (a permanent failure, or no candidate left)."""
    if route == "device":
        raise RuntimeError(f"step {step!r} failed on its last candidate with a device failure: {reason}")
    raise RuntimeError(f"step {step!r} failed ({route}; not retried): {reason}")
'''


def _exec_component(source: str, name: str, image: str) -> Any:
    """A KFP lightweight component from generated source (registered in :mod:`linecache`, where
    ``inspect.getsource`` finds it; an entry whose mtime is None is never invalidated)."""
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
    return dsl.component(namespace[name], base_image=image, install_kfp_package=False)


# --- rendering ------------------------------------------------------------------------------------------------


class _Renderer:
    def __init__(self, pipeline: Pipeline, *, image: str, local: bool, profile: ClusterProfile | None = None) -> None:
        self.pipeline = pipeline
        self.calls = pipeline.calls
        self.image = image
        self.local = local
        self.profile = profile
        planner = pipeline.planner
        self.placed = [c.name for c in pipeline.placed_calls] if planner is not None else []
        self.components = {
            c.name: _make_component(c, image, placed=self.placed if c.step.planner else []) for c in self.calls
        }
        self.fail = _exec_component(_FAIL_SOURCE, "heteroflow_fail", image)
        self.placements_json = json.dumps(pipeline.placements(), sort_keys=True)

    # env: ("param", name) | ("out", call, output) | ("placed", call) -> channel

    def task(self, call: Call, env: dict[tuple[str, ...], Any], index: int | None) -> PipelineTask:
        kwargs: dict[str, Any] = {}
        for key, binding in call.bindings.items():
            if isinstance(binding, OutputRef):
                kwargs[key] = env[("out", binding.call, binding.output)]
            elif isinstance(binding, ParamRef):
                kwargs[key] = env[("param", binding.name)]
            else:
                kwargs[key] = binding.value
        resources = call.candidates[index or 0]
        if call.device_bound:
            kwargs[KFP_CANDIDATE] = candidate_to_json(index or 0, resources)
        if call.step.planner:
            kwargs[KFP_PLACEMENTS] = self.placements_json
        task = self.components[call.name](**kwargs)
        if call.device_bound:
            kind = DeviceKind(resources.kind).value
            task.set_display_name(f"{call.name} on {kind} (candidate {index})")
        else:
            task.set_display_name(call.name)
        # kfp.local ignores resources: the default profile there, without the default-profile warning (#16.20)
        apply_resources(task, resources, profile=self.profile or (DEFAULT_PROFILE if self.local else None))
        apply_retry(task, call.retry, local=self.local)
        if call.secrets and not self.local:  # kfp.local never reads kfp-kubernetes settings
            from kfp import kubernetes

            for secret in call.secrets:
                kubernetes.use_secret_as_env(
                    task, secret_name=secret.secret, secret_key_to_env={key: var for var, key in secret.env.items()}
                )
        task.set_caching_options(enable_caching=bool(call.cacheable))
        return task

    def fail_task(self, call: Call, task: PipelineTask) -> None:
        t = self.fail(step=call.name, route=task.outputs["Output"], reason=task.outputs[KFP_FAILURE])
        t.set_display_name(f"fail: {call.name}")
        t.set_caching_options(enable_caching=False)

    def emit(self, i: int, env: dict[tuple[str, ...], Any]) -> None:
        if i == len(self.calls):
            return
        call = self.calls[i]
        if call.device_bound:
            placed = env.get(("placed", call.name))
            if placed is None:
                self.emit_candidate(i, 0, env)
                return
            for k, res in enumerate(call.candidates):
                with dsl.If(placed == k, name=f"{call.name}-placed-on-{DeviceKind(res.kind).value}-{k}"):
                    self.emit_candidate(i, k, env)
            return
        task = self.task(call, env, None)
        inner = self.outputs_env(call, task, env)
        if i + 1 == len(self.calls):  # the last call: nothing to run after it (an empty branch breaks kfp.local)
            with dsl.If(task.outputs["Output"] != "succeeded", name=f"{call.name}-failed"):
                self.fail_task(call, task)
            return
        with dsl.If(task.outputs["Output"] == "succeeded", name=f"{call.name}-succeeded"):
            self.emit(i + 1, inner)
        with dsl.Else(name=f"{call.name}-failed"):
            self.fail_task(call, task)

    def emit_candidate(self, i: int, k: int, env: dict[tuple[str, ...], Any]) -> None:
        call = self.calls[i]
        task = self.task(call, env, k)
        inner = self.outputs_env(call, task, env)
        kind = DeviceKind(call.candidates[k].kind).value
        route = task.outputs["Output"]
        last_call = i + 1 == len(self.calls)
        last_candidate = k + 1 == len(call.candidates)
        if last_call and last_candidate:
            with dsl.If(route != "succeeded", name=f"{call.name}-failed-on-{kind}-{k}"):
                self.fail_task(call, task)
            return
        if last_call:  # no branch for success: an empty branch breaks kfp.local
            branch = dsl.If(route == "device", name=f"{call.name}-fallback-from-{kind}-{k}")
        else:
            with dsl.If(route == "succeeded", name=f"{call.name}-succeeded-on-{kind}-{k}"):
                self.emit(i + 1, inner)
            branch = dsl.Elif(route == "device", name=f"{call.name}-fallback-from-{kind}-{k}") if not last_candidate else None
        if branch is not None:
            with branch:
                self.emit_candidate(i, k + 1, env)
        with dsl.Else(name=f"{call.name}-failed-on-{kind}-{k}"):
            self.fail_task(call, task)

    def outputs_env(self, call: Call, task: PipelineTask, env: dict[tuple[str, ...], Any]) -> dict[tuple[str, ...], Any]:
        inner = dict(env)
        for spec in call.step.outputs:
            inner[("out", call.name, spec.name)] = task.outputs[spec.name]
        if call.step.planner:
            for name in self.placed:
                inner[("placed", name)] = task.outputs[f"{KFP_PLACED_PREFIX}{name}"]
        return inner


def _pipeline_doc(pipeline: Pipeline) -> str:
    lines = [pipeline.description or pipeline.name, "", "Args:"]
    for p in pipeline.params.values():
        unit = f" (unit: {p.unit})" if p.unit else ""
        lines.append(f"    {p.name}: {p.help}{unit}")
    return "\n".join(lines)


@contextlib.contextmanager
def _cheap_container_checks() -> Iterator[None]:
    """KFP's resource setters each call ``PipelineTask._ensure_container_spec_exists``, which calls
    ``inspect.stack()`` only to name the caller in an error message: ~50 ms per call in a deep stack, seconds for
    a pipeline with fallback branches. While rendering, use the same check without the stack walk (kfp 2.17's
    check, message included)."""
    original = PipelineTask._ensure_container_spec_exists

    def ensure(self: PipelineTask) -> None:
        if self.container_spec is None:
            raise ValueError(
                "this setter can only be used on single-step components, not pipelines used as components, or "
                "special components like importers."
            )

    PipelineTask._ensure_container_spec_exists = ensure  # type: ignore[method-assign]
    try:
        yield
    finally:
        PipelineTask._ensure_container_spec_exists = original  # type: ignore[method-assign]


def to_kfp(
    pipeline: Pipeline, *, image: str = DEFAULT_IMAGE, local: bool = False, profile: ClusterProfile | None = None
) -> Any:
    """Render ``pipeline`` as a KFP pipeline (a ``GraphComponent``): compile it, or call it under ``kfp.local``.

    Args:
        pipeline: the pipeline.
        image: container image with heteroflow installed, for every step.
        local: render for kfp.local (retry backoff caps each wait) instead of a cluster (total window).
        profile: the cluster profile (:mod:`heteroflow.components.cluster`): device-plugin conventions, node
            labels, queues, default tolerations; None: the official plugins' resource names and no selectors.

    Raises:
        InvalidParameter: a step that a step process cannot import (defined in ``__main__``).
    """
    renderer = _Renderer(pipeline, image=image, local=local, profile=profile)
    params = list(pipeline.params.values())

    def body(*args: Any) -> None:
        env: dict[tuple[str, ...], Any] = {("param", p.name): a for p, a in zip(params, args)}
        renderer.emit(0, env)

    signature = []
    for p in params:
        annotation = typing.Optional[p.type] if p.optional else p.type
        default = inspect.Parameter.empty if p.required else p.default
        signature.append(inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotation))
    body.__signature__ = inspect.Signature(signature)  # type: ignore[attr-defined]
    body.__name__ = re.sub(r"\W", "_", pipeline.name)
    body.__qualname__ = body.__name__
    body.__doc__ = _pipeline_doc(pipeline)
    with _cheap_container_checks():
        return dsl.pipeline(body, name=pipeline.name, description=pipeline.description or None)


def compile_pipeline(
    pipeline: Pipeline, path: str | Path, *, image: str = DEFAULT_IMAGE, profile: ClusterProfile | None = None
) -> Path:
    """Compile ``pipeline`` to KFP IR YAML at ``path`` (for the Kubeflow UI or ``kfp.Client``).

    Raises:
        InvalidParameter: ``path`` does not end in .yaml/.yml.
        OSError: the file cannot be written (the message names the path).
    """
    from kfp import compiler

    out = Path(path)
    if out.suffix not in (".yaml", ".yml"):
        raise InvalidParameter(f"output {out} must be a file name ending in .yaml or .yml")
    compiler.Compiler().compile(to_kfp(pipeline, image=image, profile=profile), str(out))
    return out
