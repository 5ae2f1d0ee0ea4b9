"""One failure classifier for every engine, and the testing settings that rehearse failures.

:func:`classify` sorts an exception into one of three classes (DESIGN.md, "Resources, candidates, fallback"),
and every engine treats each class the same way:

=============  ===========================================================  ==========================================
class          what                                                         what the engine does
=============  ===========================================================  ==========================================
``device``     the device is absent or not allocatable, a driver or         move to the step's next candidate at once;
               runtime error, device out of memory                          no retry is spent on the failed device
``transient``  storage or network timeouts, a refused or reset              retry on the same candidate with the
               connection, a killed worker process                          step's backoff
``permanent``  bad data, a bad parameter, a bug: anything else              fail the step at once: no retry, no
                                                                            fallback
=============  ===========================================================  ==========================================

The rules, first match wins (:func:`rules` holds them as data; each names real exception types and messages; rows
3-6 are the failure patterns of the ``gpu`` and ``npu`` device kinds, and a plugin kind's patterns follow them):

=====  =========================================================================================  ===========
order  exception (type, or message fragment; types match subclasses)                              class
=====  =========================================================================================  ===========
1      heteroflow's :class:`DeviceUnavailable` (a device type absent here, e.g. no CUDA device)    device
2      ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``: "CUDA out of memory. Tried     device
       to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; ...)")
3      "CUDA error: device-side assert triggered" (an index out of range in a kernel: a bug)       permanent
4      ``torch.AcceleratorError`` (torch >= 2.8 raises it for CUDA runtime errors), or a message   device
       with "CUDA error:" ("CUDA error: invalid device ordinal", "... all CUDA-capable devices are
       busy or unavailable", "... uncorrectable ECC error encountered"), "No CUDA GPUs are
       available", "Found no NVIDIA driver on your system", "CUDA driver initialization failed",
       "Torch not compiled with CUDA enabled" (an ``AssertionError`` in torch), "NCCL error"
5      a ``RuntimeError`` whose message has "NPU out of memory" (torch_npu: "NPU out of memory.    device
       Tried to allocate 52.00 MiB (NPU 0; 60.96 GiB total capacity; ...)")
6      torch_npu / CANN runtime errors: "NPU function error:" ("aclrtGetDeviceCount(&device_count),  device
       error code is 207004 ... The device is unavailable", "c10_npu::SetDevice(device_id_), error
       code is 507033", "AclrtSynchronizeDeviceWithTimeout, error code is 507048"), "HCCL",
       "ERR00100 PTA call acl api failed"
7      ``TimeoutError``, ``ConnectionError`` (refused, reset, aborted), ``socket.timeout``,        transient
       ``OSError`` with errno ETIMEDOUT, ECONNRESET, ECONNREFUSED, EHOSTUNREACH, ENETUNREACH,
       ENETDOWN, EAGAIN, ESTALE (NFS), ``BlockingIOError`` (a lock another live process holds, e.g.
       heteroflow's ``CheckpointLocked``), ``concurrent.futures.process.BrokenProcessPool`` (a worker
       was killed), heteroflow's ``SourceUnavailable`` and any error class named ``*Timeout*`` /
       ``*ConnectionError*`` (aiohttp, botocore, requests)
8      anything else (``ValueError``, heteroflow's ``DatasetError``/``InvalidParameter``, a bug)   permanent
=====  =========================================================================================  ===========

Testing settings (they reach step processes, kfp.local tasks and Airflow tasks through the environment):

- ``HETEROFLOW_SIMULATE_DEVICES=npu,gpu`` (``heteroflow run --simulate-devices npu,gpu``): those device kinds
  count as present for placement; a step placed on one runs on the CPU but keeps its identity (kind,
  accelerator, candidate) in records and placement. An item may name a model: ``npu:ascend-910b3``, and a speed
  factor in (0, 1]: ``npu@0.5`` or ``npu:ascend-910b3@0.5`` (a replica of that kind in a mixed training job
  waits in proportion to its compute, so it runs at half speed: :mod:`heteroflow.components.training.shares`).
- ``HETEROFLOW_INJECT_FAULT=train@npu=device,preprocess@cpu=permanent,train@gpu=transient:2``
  (``heteroflow run --inject-fault ...``, repeatable): before the step's function runs on a candidate of that
  kind, raise a failure of that class. ``transient:N`` fails the first N attempts, then lets the step run (inside a
  ``ParallelFor``: the first N attempts of each iteration, as retries count per iteration).
  ``train@npu=device:after_steps=N`` lets the step start and fails it once it has done N optimizer steps (after
  the checkpoint due at that step is written), to rehearse a device that drops out mid-training: the next
  candidate resumes from that checkpoint (:func:`fault_after_steps`; the train step calls it after each step).
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from heteroflow.components.errors import DeviceUnavailable, HeteroflowError, InvalidParameter

__all__ = [
    "FAULT_ENV",
    "SIMULATE_ENV",
    "Failure",
    "FailureClass",
    "FaultSpec",
    "InjectedDeviceFault",
    "InjectedPermanentFault",
    "InjectedTransientFault",
    "RULES",
    "classify",
    "rules",
    "fault_after_steps",
    "injected_fault",
    "parse_faults",
    "simulated_devices",
]

SIMULATE_ENV = "HETEROFLOW_SIMULATE_DEVICES"
FAULT_ENV = "HETEROFLOW_INJECT_FAULT"


class FailureClass(str, enum.Enum):
    """What a failure means for the engine: see the module docstring's table."""

    DEVICE = "device"
    TRANSIENT = "transient"
    PERMANENT = "permanent"


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    """A classified failure: its class, the rule that matched, and the one-line reason (``Type: message``)."""

    cls: FailureClass
    rule: str
    reason: str


_TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ETIMEDOUT", "ECONNRESET", "ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH", "ENETDOWN", "EAGAIN", "ESTALE")
    if hasattr(errno, name)
)


def _message(exc: BaseException) -> str:
    return str(exc)


def _is_torch_type(exc: BaseException, *names: str) -> bool:
    """Whether ``exc`` is (a subclass of) a torch exception type named one of ``names``, without importing torch."""
    return any(t.__module__.split(".")[0] == "torch" and t.__name__ in names for t in type(exc).__mro__)


def _device_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, DeviceUnavailable)


def _torch_oom(exc: BaseException) -> bool:
    return _is_torch_type(exc, "OutOfMemoryError")


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, (TimeoutError, ConnectionError, BlockingIOError)):
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    names = [t.__name__ for t in type(exc).__mro__]
    if "BrokenProcessPool" in names:
        return True
    return any("Timeout" in n or "ConnectionError" in n or n == "SourceUnavailable" for n in names)


_Rule = tuple[str, FailureClass, Callable[[BaseException], bool]]

_GENERIC_FIRST: tuple[_Rule, ...] = (
    ("DeviceUnavailable", FailureClass.DEVICE, _device_unavailable),
    ("torch.OutOfMemoryError (device out of memory)", FailureClass.DEVICE, _torch_oom),
)
_GENERIC_LAST: tuple[_Rule, ...] = (
    ("timeout, connection or killed worker", FailureClass.TRANSIENT, _transient),
)


def _kind_rules(kinds: Any) -> tuple[_Rule, ...]:
    return tuple(
        (p.rule, FailureClass(p.failure_class), p.matches) for kind in kinds for p in kind.failure_patterns
    )


def rules() -> tuple[_Rule, ...]:
    """The classifier's rules in order: heteroflow's and torch's own device errors, then each registered device
    kind's failure patterns (:attr:`heteroflow.components.devices.DeviceKind.failure_patterns`: the built-ins'
    CUDA/NCCL and torch_npu/CANN/HCCL messages, then any plugin kind's), then transient errors."""
    from heteroflow.components.devices import all_kinds

    return _GENERIC_FIRST + _kind_rules(all_kinds()) + _GENERIC_LAST


def _builtin_rules() -> tuple[_Rule, ...]:
    from heteroflow.components.devices.builtin import BUILTINS

    return _GENERIC_FIRST + _kind_rules(BUILTINS) + _GENERIC_LAST


RULES: tuple[_Rule, ...] = _builtin_rules()
"""(rule, class, predicate) in order for the built-in kinds (:func:`rules` adds plugin kinds' patterns); the
first predicate that holds decides. Anything else is permanent."""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    name = type(exc).__qualname__
    return f"{name}: {text}" if text else name


def classify(exc: BaseException) -> Failure:
    """Classify an exception (see the module docstring's table).

    Args:
        exc: the exception a step raised.

    Returns:
        A :class:`Failure` with the class, the rule that matched and a one-line reason.
    """
    for rule, cls, predicate in rules():
        try:
            hit = predicate(exc)
        except Exception:  # a predicate must never mask the failure it looks at
            hit = False
        if hit:
            return Failure(cls, rule, _one_line(exc))
    return Failure(FailureClass.PERMANENT, "anything else (bad data, bad parameter, a bug)", _one_line(exc))


# --- testing settings ------------------------------------------------------------------------------------


class InjectedDeviceFault(DeviceUnavailable):
    """A device failure raised on purpose by ``HETEROFLOW_INJECT_FAULT`` (classified ``device``)."""


class InjectedTransientFault(HeteroflowError, TimeoutError):
    """A transient failure raised on purpose by ``HETEROFLOW_INJECT_FAULT`` (classified ``transient``)."""


class InjectedPermanentFault(HeteroflowError, ValueError):
    """A permanent failure raised on purpose by ``HETEROFLOW_INJECT_FAULT`` (classified ``permanent``)."""


_INJECTED = {
    FailureClass.DEVICE: InjectedDeviceFault,
    FailureClass.TRANSIENT: InjectedTransientFault,
    FailureClass.PERMANENT: InjectedPermanentFault,
}

_FAULT = re.compile(
    r"^(?P<step>[A-Za-z_][\w.-]*)@(?P<kind>[a-z]+)=(?P<cls>device|transient|permanent)"
    r"(?::(?:after_steps=(?P<after>\d+)|(?P<times>\d+)))?$"
)


@dataclasses.dataclass(frozen=True, slots=True)
class FaultSpec:
    """One injected fault: fail ``step`` on candidates of device ``kind`` with ``cls``; ``times`` attempts
    (None: every attempt); with ``after_steps``, not before the step starts but once it has done that many
    optimizer steps (training steps only)."""

    step: str
    kind: str
    cls: FailureClass
    times: int | None = None
    after_steps: int | None = None

    def __str__(self) -> str:
        tail = f":{self.times}" if self.times is not None else ""
        if self.after_steps is not None:
            tail = f":after_steps={self.after_steps}"
        return f"{self.step}@{self.kind}={self.cls.value}{tail}"


def parse_faults(text: str, *, source: str = FAULT_ENV) -> tuple[FaultSpec, ...]:
    """Parse ``STEP@KIND=CLASS[:N | :after_steps=N]`` items separated by commas (or given one per ``--inject-fault``).

    Raises:
        InvalidParameter: an item that does not parse; the message shows the valid form.
    """
    from heteroflow.components.resources import DeviceKind

    out = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        m = _FAULT.match(item)
        if not m:
            raise InvalidParameter(
                f"{source}: {item!r} is not STEP@KIND=CLASS[:N | :after_steps=N]; e.g. train@npu=device, "
                "preprocess@cpu=permanent, train@npu=transient:2, train@npu=device:after_steps=40 "
                "(CLASS: device, transient, permanent)"
            )
        try:
            DeviceKind.parse(m["kind"], field=f"{source} {item!r}: kind")
        except HeteroflowError as exc:
            raise InvalidParameter(str(exc)) from None
        times = int(m["times"]) if m["times"] is not None else None
        after = int(m["after"]) if m["after"] is not None else None
        if times == 0:  # a typo that would look like a passed failure test: nothing would be injected
            raise InvalidParameter(
                f"{source}: {item!r} fails no attempt (:N counts the attempts that fail); valid: N >= 1, "
                f"e.g. {m['step']}@{m['kind']}={m['cls']}:1, or no :N to fail every attempt"
            )
        if after == 0:  # checked after each step: 0 would fail after the first one, not before it
            raise InvalidParameter(
                f"{source}: {item!r}: after_steps counts the optimizer steps done before the fault; valid: N >= 1, "
                f"or no :after_steps to fail the attempt before its first step"
            )
        out.append(FaultSpec(m["step"], m["kind"], FailureClass(m["cls"]), times, after))
    return tuple(out)


def simulated_devices(environ: Mapping[str, str] | None = None, *, source: str = SIMULATE_ENV) -> dict[str, str]:
    """The simulated device kinds from ``HETEROFLOW_SIMULATE_DEVICES``: ``{kind: accelerator model or ""}``.

    Raises:
        InvalidParameter: an item that is not a device kind (optionally ``kind:model``), or ``cpu``.
    """
    from heteroflow.components.resources import DeviceKind

    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in env.get(SIMULATE_ENV, "").split(","))):
        item, _, speed = item.partition("@")  # npu@0.5: a simulated kind at half speed (training.shares.simulated_speeds)
        if speed:
            try:
                factor = float(speed)
            except ValueError:
                factor = float("nan")
            if not 0 < factor <= 1:  # nan (not a number, or "nan") fails this too
                what = "is out of range" if factor == factor else "is not a number"
                raise InvalidParameter(
                    f"{source} item {item + '@' + speed!r}: speed {speed!r} {what}; valid: a number in (0, 1], "
                    f"the simulated kind's speed as a fraction of the CPU replica's, e.g. {item}@0.5 (half as fast)"
                )
        kind_text, _, model = item.partition(":")
        try:
            kind = DeviceKind.parse(kind_text, field=f"{source} item").value
        except HeteroflowError as exc:
            raise InvalidParameter(str(exc)) from None
        if not DeviceKind.parse(kind).has_devices:
            others = [k.value for k in DeviceKind if k.has_devices]
            raise InvalidParameter(f"{source}: the CPU is always present; simulate {', '.join(others[:-1])} or {others[-1]}")
        model = model.strip()
        if model:  # checked here, before any step: 'gpu:nosuchmodel' failed in plan, 'gpu:ascend-910b3' passed
            from heteroflow.components.devices.accelerators import ACCELERATORS, find_accelerator

            of_kind = [a.name for a in ACCELERATORS.values() if a.kind.value == kind and not a.is_family]
            try:
                accel = find_accelerator(model, field=f"{source} item {item!r}: model")
            except HeteroflowError:
                accel = None
            if accel is None or accel.kind.value != kind:
                what = "is unknown" if accel is None else f"is a {accel.kind.value} model"
                raise InvalidParameter(f"{source} item {item!r}: model {model!r} {what}; valid: a {kind} model "
                                       f"({', '.join(of_kind)}), or {kind} alone")
            model = accel.name
        out[kind] = model
    return out


def _faults_of(step: str, kind: str, environ: Mapping[str, str] | None) -> list[FaultSpec]:
    """The items of ``HETEROFLOW_INJECT_FAULT`` (in ``environ``, default ``os.environ``) for ``step`` on a ``kind``
    candidate, in order (none when it is unset or blank).

    Raises:
        InvalidParameter: the setting does not parse.
    """
    text = (os.environ if environ is None else environ).get(FAULT_ENV, "")
    return [spec for spec in parse_faults(text) if spec.step == step and spec.kind == kind] if text.strip() else []


def injected_fault(
    step: str,
    kind: str,
    *,
    state_dir: Path | None,
    environ: Mapping[str, str] | None = None,
    iteration: tuple[int, ...] | None = None,
) -> BaseException | None:
    """The fault to raise now for ``step`` on a ``kind`` candidate, from ``HETEROFLOW_INJECT_FAULT``, or None.

    ``transient:N`` counts the attempts it failed in ``<state_dir>/faults/<step>@<kind>`` (the run folder, so a
    retried step process sees the count of the earlier ones). Inside a ``ParallelFor`` the count is the
    iteration's own, as its retries are (``iteration``: its key, outer indices first, e.g. ``(1,)``; the counter
    ``<step>@<kind>[1]``): each iteration fails its first N attempts, whatever order the engine runs them in.

    Raises:
        InvalidParameter: the setting does not parse.
    """
    for spec in _faults_of(step, kind, environ):
        if spec.after_steps is not None:
            continue  # an after_steps fault fires inside the step (fault_after_steps), not before it
        if spec.times is not None:
            if state_dir is None:
                raise InvalidParameter(f"{FAULT_ENV} item {spec}: a counted fault needs a run folder (HETEROFLOW_RUN_DIR)")
            counter = state_dir / "faults" / (f"{step}@{kind}" + "".join(f"[{i}]" for i in iteration or ()))
            counter.parent.mkdir(parents=True, exist_ok=True)
            done = int(counter.read_text() or 0) if counter.exists() else 0
            if done >= spec.times:
                continue
            counter.write_text(str(done + 1))
        return _INJECTED[spec.cls](f"injected by {FAULT_ENV} ({spec}) on a {kind} candidate of step {step!r}")
    return None


def fault_after_steps(step: str, kind: str, steps_done: int, *, environ: Mapping[str, str] | None = None) -> BaseException | None:
    """The fault to raise now for ``step`` on a ``kind`` candidate that has done ``steps_done`` optimizer steps,
    from an ``after_steps=N`` item of ``HETEROFLOW_INJECT_FAULT`` (``steps_done >= N``), or None.

    Raises:
        InvalidParameter: the setting does not parse.
    """
    for spec in _faults_of(step, kind, environ):
        if spec.after_steps is not None and steps_done >= spec.after_steps:
            return _INJECTED[spec.cls](
                f"injected by {FAULT_ENV} ({spec}) on a {kind} candidate of step {step!r} after {steps_done} steps"
            )
    return None
