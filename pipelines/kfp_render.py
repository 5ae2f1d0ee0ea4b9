"""Render heteroflow's resource model onto KFP tasks: one call per task.

KFP v2's ``PipelineTask`` setters take Kubernetes-style strings; :func:`apply_resources` writes the exact
quantities parsed by :class:`~heteroflow.components.resources.Resources`, :func:`apply_retry` writes every
retry field (KFP puts backoff factor and max duration into the IR even when a user gives none, so we write
ours out too), and :func:`apply_step` does both plus caching for a :class:`StepSpec`.
"""

from __future__ import annotations

from kfp.dsl import PipelineTask

from heteroflow.components.resources import Resources, RetryPolicy
from heteroflow.components.spec import StepSpec

__all__ = ["apply_resources", "apply_retry", "apply_step", "kfp_memory"]

_BINARY = (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def kfp_memory(num_bytes: int) -> str:
    """Bytes as a quantity KFP's validator accepts (``^[0-9]+(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?$``), exactly."""
    for suffix, unit in _BINARY:
        if num_bytes and num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)


def apply_resources(task: PipelineTask, resources: Resources) -> PipelineTask:
    """Set CPU and memory (request = limit) and the accelerator type and count of ``resources`` on ``task``.

    Returns:
        ``task``, for chaining.
    """
    cpu = resources.k8s_requests()["cpu"]
    memory = kfp_memory(resources.memory_bytes)
    task.set_cpu_request(cpu).set_cpu_limit(cpu)
    task.set_memory_request(memory).set_memory_limit(memory)
    accel = resources.accelerator_spec
    if accel is not None:
        task.set_accelerator_type(accel.resource_name).set_accelerator_limit(resources.count or 1)
    return task


def apply_retry(task: PipelineTask, policy: RetryPolicy) -> PipelineTask:
    """Write ``policy`` as KFP's retry strategy (same backoff formula; durations in whole seconds)."""
    if policy.retries:
        task.set_retry(
            num_retries=policy.retries,
            backoff_duration=f"{int(policy.backoff_seconds)}s",
            backoff_factor=float(policy.factor),
            backoff_max_duration=f"{int(policy.max_delay_seconds)}s",
        )
    return task


def apply_step(task: PipelineTask, spec: StepSpec, resources: Resources | None = None) -> PipelineTask:
    """Apply a step's resources (``resources``, else its preferred candidate), retry policy and caching."""
    apply_resources(task, resources if resources is not None else spec.candidates[0])
    apply_retry(task, spec.retry)
    if not spec.cacheable:
        task.set_caching_options(enable_caching=False)
    return task
