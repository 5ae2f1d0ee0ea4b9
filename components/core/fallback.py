"""The fallback rule and the retry rule, written once: every engine asks these two functions.

DESIGN.md ("Resources, candidates, fallback") states the rules; the in-process runner
(:mod:`heteroflow.pipelines.engines.inprocess`), the KFP step shim (:func:`heteroflow.components.core.runtime.kfp_task`) and
the Airflow fallback gate and retry policy (:mod:`heteroflow.dags.operators`) call :func:`next_candidate` and
:func:`retry_decision` instead of each carrying its own copy.

:func:`next_candidate` after candidate ``index`` of a call ended with ``failure``:

===================  =========================================================================================
failure              decision
===================  =========================================================================================
``succeeded``        ``done``: the call succeeded; no later candidate runs
``device``           ``fallback`` to the first later candidate the placement can serve (a kind the plan's
                     inventory has too few devices of is passed over, each with its reason); ``stop`` when none
                     is left, or the call is not device-bound (it has no fallback path)
``transient``        ``stop``: the retries on this candidate are spent (retries are :func:`retry_decision`'s)
``permanent``        ``stop``: no retry, no fallback
``None``             ``stop``: the candidate did not run (a call before it failed): an upstream failure never
                     starts a fallback
===================  =========================================================================================

Placement: the device counts the plan step placed against (its ``inventory`` fact, ``{"gpu": 2, "npu": 0}``),
or None when the pipeline has no planner (then every later candidate is assumed able to run). CPU candidates
always can.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from heteroflow.components.resources import DeviceKind, Resources

__all__ = ["Decision", "FAILURES", "cannot_run", "next_candidate", "retry_decision"]

FAILURES = ("succeeded", "device", "transient", "permanent", None)
"""What :func:`next_candidate` accepts as ``failure`` (an attempt's route; None: it did not run)."""


class CallLike(Protocol):
    """What the rule reads of a call (:class:`heteroflow.pipelines.graph.Call` has it)."""

    name: str

    @property
    def candidates(self) -> Sequence[Resources]: ...

    @property
    def device_bound(self) -> bool: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """What happens after a candidate ended.

    Attributes:
        action: ``done`` (succeeded), ``fallback`` (run candidate ``target``) or ``stop`` (the call failed).
        target: the candidate to run next (``fallback`` only), else None.
        why: one line saying why, naming the candidate left and its reason.
        passed_over: one line per later candidate skipped because the placement cannot serve it.
    """

    action: str
    target: int | None
    why: str
    passed_over: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _label(index: int, res: Resources) -> str:
    accel = res.accelerator_spec
    return f"candidate {index} ({DeviceKind(res.kind).value}{', ' + accel.name if accel is not None else ''})"


def cannot_run(res: Resources, placement: Mapping[str, int] | None) -> str | None:
    """Why ``res`` cannot run with ``placement`` (the plan's device counts by kind), or None when it can (always
    for CPU candidates, and for any candidate without a placement)."""
    for group in getattr(res, "replicas", ()):  # a mixed candidate: every kind's replicas
        why = cannot_run(group.resources.__class__(kind=group.kind, count=group.count), placement) if group.kind.has_devices else None
        if why is not None:
            return why
    kind = DeviceKind(res.kind)
    if placement is None or not kind.has_devices:
        return None
    need = max(int(res.count or 1), 1)
    have = int(placement.get(kind, 0) or 0)
    if have < need:
        return f"the plan's inventory has {have} {kind} device(s), needs {need}"
    return None


def next_candidate(
    call: CallLike,
    index: int,
    failure: str | None,
    placement: Mapping[str, int] | None = None,
    *,
    reason: str | None = None,
) -> Decision:
    """The decision after candidate ``index`` of ``call`` ended with ``failure`` (see the module's table).

    Args:
        call: the call (its ``candidates`` and ``device_bound``).
        index: the candidate that ended, 0-based.
        failure: ``succeeded``, ``device``, ``transient``, ``permanent``, or None (it did not run).
        placement: the plan's device counts by kind, or None (no planner).
        reason: the failure's one-line reason, quoted in ``why``.

    Raises:
        ValueError: ``failure`` is none of those, or ``index`` is not a candidate of ``call``.
    """
    if failure not in FAILURES:
        raise ValueError(f"failure={failure!r} is not valid; valid: {', '.join(map(repr, FAILURES))}")
    if not 0 <= index < len(call.candidates):
        raise ValueError(f"{call.name}: candidate index {index} is out of range 0..{len(call.candidates) - 1}")
    label = _label(index, call.candidates[index])
    because = f" ({reason})" if reason else ""
    if failure == "succeeded":
        return Decision("done", None, f"{label} succeeded")
    if failure is None:
        return Decision("stop", None, f"{label} did not run (a task before it failed, or it could not start): no fallback")
    if failure == "permanent":
        return Decision("stop", None, f"{label} failed permanently{because}: not retried, no fallback")
    if failure == "transient":
        return Decision("stop", None, f"{label} failed with a transient failure after its retries{because}: no fallback")
    if not call.device_bound:
        return Decision("stop", None, f"{label} failed on its device{because}; {call.name} is not device-bound: no fallback")
    passed: list[str] = []
    for j in range(index + 1, len(call.candidates)):
        res = call.candidates[j]
        why_not = cannot_run(res, placement)
        if why_not is not None:
            passed.append(f"candidate {j} ({res.describe()}): {why_not}")
            continue
        kind = DeviceKind(res.kind).value
        return Decision("fallback", j, f"{label} failed on its device{because}: falling back to candidate {j} ({kind})", tuple(passed))
    return Decision("stop", None, f"{label} failed on its device{because} and no later candidate can run", tuple(passed))


def retry_decision(policy: Any, failure: str | None, retry: int, elapsed_seconds: float = 0.0) -> float | None:
    """Seconds to wait before retry number ``retry`` (0-based) on the same candidate, or None for no retry.

    Only a *transient* failure is retried (a *permanent* one too when the policy says ``retry_on="any"``); the wait is ``policy.delay_seconds(retry)`` (KFP/Argo's backoff
    formula, :mod:`heteroflow.components.core.retry`); no retry once ``retry >= policy.retries`` or when it would start
    after ``policy.window_seconds`` from the first attempt's start (Argo's ``backoff.maxDuration``).

    Args:
        policy: a :class:`~heteroflow.components.core.retry.RetryPolicy`.
        failure: the attempt's route (``transient``, ``device``, ...).
        retry: how many retries already ran on this candidate.
        elapsed_seconds: seconds since the first attempt on this candidate started.
    """
    retried = policy.retries_failure(failure) if hasattr(policy, "retries_failure") else failure == "transient"
    if not retried or retry >= policy.retries:
        return None
    delay = policy.delay_seconds(retry)
    if elapsed_seconds + delay > policy.window_seconds:
        return None
    return delay
