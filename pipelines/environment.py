"""The environment contract between a runner and its step processes, in one place.

Every engine runs a step attempt through :func:`heteroflow.components.core.runtime.run_step` (in its own process:
kfp.local and cluster pods, ``heteroflow step``; in the runner's process: the in-process runner and Airflow's local
mode). What a step attempt learns from its runner comes through these environment variables:

=================================  ==========================================================  ===================
variable                           meaning                                                     defined in
=================================  ==========================================================  ===================
``HETEROFLOW_RUN_DIR``             the run folder (attempt records, fault counters)            components.telemetry
``HETEROFLOW_RUN_ID``              the run's id (archive lineage)                              components.archive
``HETEROFLOW_DRIVER_PID``          the runner's pid: a step process ends itself when it dies   components.runtime
``HETEROFLOW_SIMULATE_DEVICES``    testing: device kinds simulated on the CPU                  components.failures
``HETEROFLOW_INJECT_FAULT``        testing: faults to inject                                   components.failures
``TMPDIR``                         kfp.local only: scratch inside the run folder               (POSIX)
=================================  ==========================================================  ===================

:func:`step_environment` builds the first three for a run; :func:`testing_environment` checks and sets the
testing ones; :func:`environ` sets any of them for a block and restores them after.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from heteroflow.components.models.archive import RUN_ID_ENV
from heteroflow.components.errors import InvalidParameter
from heteroflow.components.core.failures import FAULT_ENV, SIMULATE_ENV, parse_faults, simulated_devices
from heteroflow.components.resources import DeviceKind
from heteroflow.components.core.runtime import DRIVER_PID_ENV
from heteroflow.components.core.telemetry import RUN_DIR_ENV
from heteroflow.pipelines.graph import Pipeline

__all__ = ["CONTRACT", "environ", "step_environment", "testing_environment"]

CONTRACT: tuple[str, ...] = (RUN_DIR_ENV, RUN_ID_ENV, DRIVER_PID_ENV, SIMULATE_ENV, FAULT_ENV)
"""Every variable of the contract (the module docstring's table), as defined by the modules that read them."""


def step_environment(folder: Path | str, run_id: str, *, driver_pid: int | None = None) -> dict[str, str]:
    """The variables a step attempt of the run in ``folder`` gets (``driver_pid``: a runner whose steps run in
    other processes, which end themselves when it is gone)."""
    out = {RUN_DIR_ENV: str(folder), RUN_ID_ENV: run_id}
    if driver_pid is not None:
        out[DRIVER_PID_ENV] = str(driver_pid)
    return out


@contextlib.contextmanager
def testing_environment(
    simulate_devices: Sequence[str] | str | None = None,
    inject_faults: Sequence[str] | str | None = None,
    *,
    pipeline: Pipeline | None = None,
) -> Iterator[dict[str, str]]:
    """Set ``HETEROFLOW_SIMULATE_DEVICES`` / ``HETEROFLOW_INJECT_FAULT`` for the duration (they reach the step
    processes), after checking them; yields the settings in force (those already in the environment included).

    Args:
        simulate_devices / inject_faults: as ``--simulate-devices`` / ``--inject-fault`` take them.
        pipeline: when given, every fault must name one of its calls and a device kind among that call's
            candidates (a typo would otherwise rehearse nothing).

    Raises:
        InvalidParameter: a setting that does not parse, or a fault that cannot fire in ``pipeline``; the message
            names the option (or the environment variable) it came from.
    """
    changes: dict[str, str] = {}
    if simulate_devices:
        changes[SIMULATE_ENV] = simulate_devices if isinstance(simulate_devices, str) else ",".join(simulate_devices)
    if inject_faults:
        changes[FAULT_ENV] = inject_faults if isinstance(inject_faults, str) else ",".join(inject_faults)
    merged = {**{k: os.environ[k] for k in (SIMULATE_ENV, FAULT_ENV) if os.environ.get(k)}, **changes}
    simulated = simulated_devices(merged, source="--simulate-devices" if simulate_devices else SIMULATE_ENV)
    fault_source = "--inject-fault" if inject_faults else FAULT_ENV
    for spec in parse_faults(merged.get(FAULT_ENV, ""), source=fault_source):
        # the plan passes over a kind that is not here, so a fault on it would not fire; without a plan step that
        # places the call, its candidates are tried in order and the fault does fire
        planned = pipeline is None or (
            pipeline.planner is not None and spec.step in {c.name for c in pipeline.placed_calls}
        )
        if planned and DeviceKind.parse(spec.kind).has_devices and spec.kind not in simulated:
            from heteroflow.components.placement.plan import local_inventory

            if local_inventory().devices.get(DeviceKind(spec.kind), 0) == 0:
                warnings.warn(
                    f"{fault_source} {spec}: no {spec.kind} is here or simulated, so the plan passes over {spec.kind} "
                    f"candidates and the fault does not fire; add --simulate-devices {spec.kind}",
                    UserWarning,
                    stacklevel=3,
                )
        if pipeline is None:
            continue
        if spec.step not in pipeline:
            raise InvalidParameter(
                f"{fault_source} {spec}: the pipeline has no step {spec.step!r}; steps: {', '.join(c.name for c in pipeline.calls)}"
            )
        kinds = sorted({DeviceKind(r.kind).value for r in pipeline[spec.step].candidates}
                       | {g.kind.value for r in pipeline[spec.step].candidates for g in getattr(r, "replicas", ())})  # mixed: every kind
        if spec.kind not in kinds:
            raise InvalidParameter(
                f"{fault_source} {spec}: step {spec.step!r} has no {spec.kind} candidate, so the fault would never "
                f"fire; its candidates' kinds: {', '.join(kinds)}"
            )
    with environ(changes):
        yield merged


@contextlib.contextmanager
def environ(changes: Mapping[str, str | None]) -> Iterator[None]:
    """Set (a value) or unset (None) environment variables for the duration, then restore them."""
    old = {name: os.environ.get(name) for name in changes}
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


