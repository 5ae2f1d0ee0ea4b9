"""Plan (placement): pick the first candidate whose device exists here, and record why others were passed over.

Inventory: stated by the user (``device_inventory``, JSON; on a cluster the plan pod has no accelerator of its
own to probe), else the local one, as PyTorch sees it: ``cuda`` devices (``torch.cuda.device_count()``), Ascend
``npu`` devices when ``torch_npu`` imports (``torch.npu.device_count()``), and the CPU (always). A candidate is
usable when its device kind is present with at least ``count`` devices. Scoring by profile, load and locality
(the "any" policy) is a later extension; today both policies take the listed order.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from heteroflow.components.errors import InvalidParameter, InvalidResources, NoCandidateAvailable
from heteroflow.components.resources import Candidates, DeviceKind, Resources, RetryPolicy
from heteroflow.components.step import ArtifactSpec, ArtifactType, Step, step

__all__ = ["Inventory", "PlanResult", "check_plan_params", "Placement", "current_inventory", "local_inventory", "plan", "plan_step"]

SIMULATED_DEVICE_COUNT = 8
"""Devices of a simulated kind (``HETEROFLOW_SIMULATE_DEVICES``) in the inventory: one typical node's worth."""


_INVENTORY_FORMS = 'e.g. {"gpu": 4, "npu": 0}, or per model {"gpu": {"a100-80gb": 2, "t4": 4}, "npu": {"910b3": 8}}'


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Inventory:
    """Devices available to this process (or, stated, to the job on a cluster).

    Attributes:
        devices: device count per kind (``cpu`` is 1 when present).
        models: per kind, device count per accelerator model (registry key, see
            :mod:`heteroflow.components.accelerators`) when the models are known; a kind missing here is
            known only by its count.
        notes: per kind, why it is absent (e.g. ``torch_npu is not installed``).
        simulated: kinds present only by simulation (``HETEROFLOW_SIMULATE_DEVICES``).
    """

    devices: Mapping[DeviceKind, int]
    models: Mapping[DeviceKind, Mapping[str, int]] = dataclasses.field(default_factory=dict)
    notes: Mapping[DeviceKind, str] = dataclasses.field(default_factory=dict)
    simulated: tuple[DeviceKind, ...] = ()

    @classmethod
    def from_json(cls, text: str, *, source: str = "device_inventory") -> Inventory:
        """An inventory stated by the user: per device kind, a count, or a count per accelerator model
        (``{"gpu": {"a100-80gb": 2, "t4": 4}}``; models as :func:`~heteroflow.components.accelerators.find_accelerator`
        reads them, families excluded). The CPU is always present. Used on a cluster, where the plan pod itself
        has no accelerator to probe.

        Raises:
            InvalidParameter: not a JSON object of device kind -> count >= 0 or model -> count >= 0, an unknown
                model, a family where a model is needed, or a model of another kind.
        """
        from heteroflow.components.accelerators import find_accelerator

        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InvalidParameter(f"{source}={text!r} is not JSON ({exc}); valid: {_INVENTORY_FORMS}") from None
        if not isinstance(data, dict):
            raise InvalidParameter(f"{source}={text!r} is not a JSON object; valid: {_INVENTORY_FORMS}")

        def count_of(value: object, where: str) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidParameter(f"{where}={value!r} is not a device count; valid: an integer >= 0")
            return value

        devices: dict[DeviceKind, int] = {DeviceKind.CPU: 1}
        models: dict[DeviceKind, dict[str, int]] = {}
        for key, value in data.items():
            try:
                kind = DeviceKind.parse(key, field=f"{source} key")
            except InvalidResources as exc:
                raise InvalidParameter(str(exc)) from None
            if isinstance(value, dict) and kind is not DeviceKind.CPU:
                per_model: dict[str, int] = {}
                for name, n in value.items():
                    try:
                        accel = find_accelerator(name, field=f"{source}[{key!r}] model")
                    except InvalidResources as exc:
                        raise InvalidParameter(str(exc)) from None
                    if accel.is_family:
                        raise InvalidParameter(
                            f"{source}[{key!r}] names {name!r}, a family ({accel.display_name}); an inventory counts "
                            f"devices of one model: {', '.join(m.name for m in accel.models)}"
                        )
                    if accel.kind is not kind:
                        raise InvalidParameter(f"{source}[{key!r}] names {name!r}, a {accel.kind.value} model")
                    per_model[accel.name] = per_model.get(accel.name, 0) + count_of(n, f"{source}[{key!r}][{name!r}]")
                models[kind] = per_model
                devices[kind] = sum(per_model.values())
            else:
                n = count_of(value, f"{source}[{key!r}]")
                devices[kind] = max(n, 1) if kind is DeviceKind.CPU else n
        notes = {k: f"{source} lists {n} {k.value} device(s)" for k, n in devices.items() if n == 0}
        return cls(devices=devices, models=models, notes=notes)

    def describe(self, kind: DeviceKind) -> str:
        """What is here of ``kind``, e.g. ``4 gpu device(s): 2 x nvidia-a100-80gb, 2 x nvidia-t4``."""
        n = self.devices.get(kind, 0)
        per_model = self.models.get(kind)
        text = f"{n} {kind.value} device(s)"
        if per_model:
            text += ": " + ", ".join(f"{c} x {m}" for m, c in sorted(per_model.items()))
        return text


_GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd")
"""Device files a CUDA (NVIDIA driver) or ROCm (AMD KFD driver) device needs inside a container or host."""
_NPU_DEVICE_FILES = ("/dev/davinci_manager",)
"""The Ascend driver's management device (``/dev/davinci<N>`` per chip), which torch_npu needs."""


def local_inventory() -> Inventory:
    """Probe the devices PyTorch can use in this process.

    PyTorch is imported only when a device file of an accelerator driver exists (``/dev/nvidiactl`` for
    NVIDIA, ``/dev/kfd`` for AMD ROCm, ``/dev/davinci_manager`` for Ascend): without one no CUDA or NPU device
    can be opened, and the probe answers at once without the ~1.5 s import.
    """
    devices: dict[DeviceKind, int] = {DeviceKind.CPU: 1}
    notes: dict[DeviceKind, str] = {}
    has_gpu_driver = any(os.path.exists(p) for p in _GPU_DEVICE_FILES)
    has_npu_driver = any(os.path.exists(p) for p in _NPU_DEVICE_FILES)
    if not has_gpu_driver:
        devices[DeviceKind.GPU] = 0
        notes[DeviceKind.GPU] = f"no GPU driver device file here ({', '.join(_GPU_DEVICE_FILES)})"
    if not has_npu_driver:
        devices[DeviceKind.NPU] = 0
        notes[DeviceKind.NPU] = f"no Ascend driver device file here ({', '.join(_NPU_DEVICE_FILES)})"
    if not (has_gpu_driver or has_npu_driver):
        return Inventory(devices=devices, notes=notes)

    import torch

    models: dict[DeviceKind, dict[str, int]] = {}
    if has_gpu_driver:
        if torch.cuda.is_available():
            devices[DeviceKind.GPU] = torch.cuda.device_count()
            per_model = _cuda_models(torch)
            if per_model is not None:
                models[DeviceKind.GPU] = per_model
        else:
            devices[DeviceKind.GPU] = 0
            notes[DeviceKind.GPU] = (
                "torch.cuda.is_available() is False"
                + ("" if (torch.version.cuda or torch.version.hip) else f" (torch {torch.__version__} is a CPU-only build)")
            )
    if has_npu_driver:
        try:
            importlib.import_module("torch_npu")
        except ImportError:
            devices[DeviceKind.NPU] = 0
            notes[DeviceKind.NPU] = "torch_npu is not installed (Ascend NPUs need it)"
        else:
            npu = getattr(torch, "npu", None)
            available = bool(npu and npu.is_available())
            devices[DeviceKind.NPU] = npu.device_count() if available else 0
            if not available:
                notes[DeviceKind.NPU] = "torch_npu imports but torch.npu.is_available() is False"
    return Inventory(devices=devices, models=models, notes=notes)


def _cuda_models(torch: Any) -> dict[str, int] | None:
    """Count per registry model of the CUDA devices (``torch.cuda.get_device_name``, e.g. ``NVIDIA H200``), or
    None when one of them is not in the registry (then only the count is known)."""
    from heteroflow.components.accelerators import find_accelerator

    out: dict[str, int] = {}
    for i in range(torch.cuda.device_count()):
        name = torch.cuda.get_device_name(i)
        try:
            accel = find_accelerator(name)
        except InvalidResources:
            try:
                accel = find_accelerator(name.removeprefix("NVIDIA ").removeprefix("Tesla "))
            except InvalidResources:
                return None
        if accel.is_family:
            return None
        out[accel.name] = out.get(accel.name, 0) + 1
    return out


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """The plan's choice.

    Attributes:
        index: position of the chosen candidate in the list (0 = preferred).
        resources: the chosen candidate.
        device_kind: its kind (``cpu``, ``gpu``, ``npu``).
        torch_device: the ``torch.device`` type to train on (``cpu``, ``cuda``, ``npu``).
        passed_over: for each earlier candidate, why it was not chosen.
    """

    index: int
    resources: Resources
    device_kind: str
    torch_device: str
    passed_over: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "resources": self.resources.to_dict(),
            "device_kind": self.device_kind,
            "torch_device": self.torch_device,
            "passed_over": list(self.passed_over),
        }


def _fits(res: Resources, inv: Inventory) -> tuple[bool, str]:
    """Whether ``res`` can run on ``inv``, and if not, why (one clause)."""
    kind = DeviceKind(res.kind)
    need = max(res.count or 0, 1)
    have = inv.devices.get(kind, 0)
    if have < need:
        return False, f"needs {need} {kind.value} device(s); " + (inv.notes.get(kind) or f"{have} {kind.value} device(s) here")
    per_model = inv.models.get(kind)
    if kind is DeviceKind.CPU or not per_model:
        return True, ""
    wanted = {m.name for m in res.accelerator_models}
    usable = {m: c for m, c in per_model.items() if m in wanted and c >= need}
    if usable:
        return True, ""
    accel = res.accelerator_spec
    memory = f" with >= {res.device_memory} device memory" if res.device_memory is not None else ""
    precision = f" that compute in {res.precision}" if getattr(res, "precision", None) else ""
    asked = accel.display_name if accel is not None else kind.value
    return False, f"needs {need} x {asked}{memory}{precision} on one model; here: {inv.describe(kind)}"


def plan(candidates: Candidates, *, inventory: Inventory | Callable[[], Inventory] = local_inventory) -> Placement:
    """Choose the first candidate that can run here: its device kind is present with ``count`` devices and, when
    the inventory names models, one model the candidate accepts (its accelerator or a member of its family, with
    at least its ``device_memory`` and, for ``precision="bf16"``, bf16 support) has ``count`` devices.

    Args:
        candidates: in preference order.
        inventory: the devices present, or a function returning them (default: probe PyTorch).

    Returns:
        A :class:`Placement`.

    Raises:
        NoCandidateAvailable: no candidate fits; the message says why each was passed over.
    """
    inv = inventory() if callable(inventory) else inventory
    reasons: list[str] = []
    for i, res in enumerate(candidates):
        ok, why = _fits(res, inv)
        if ok:
            kind = DeviceKind(res.kind)
            return Placement(
                index=i,
                resources=res,
                device_kind=kind.value,
                torch_device=res.torch_device_type,
                passed_over=tuple(reasons),
            )
        reasons.append(f"candidate {i} ({res.describe()}): {why}")
    raise NoCandidateAvailable("no candidate can run here:\n  " + "\n  ".join(reasons))


def check_plan_params(*, device_inventory: str = "", training_profile: str = "") -> None:
    """Check plan's parameters before a run (the checks :func:`plan_step` makes).

    Raises:
        InvalidParameter: ``device_inventory`` is not a JSON object of device kind -> count; ``training_profile``
            is not a readable profile.
    """
    if device_inventory.strip():
        Inventory.from_json(device_inventory)
    if training_profile:
        from heteroflow.components.profiling import read_profile

        read_profile(training_profile, field="training_profile")


def current_inventory(device_inventory: str = "") -> Inventory:
    """The inventory plan uses: ``device_inventory`` (JSON) when given, else the local one (probes PyTorch),
    plus the device kinds simulated by ``HETEROFLOW_SIMULATE_DEVICES`` (:data:`SIMULATED_DEVICE_COUNT` each).

    Raises:
        InvalidParameter: ``device_inventory`` or the simulation setting does not parse.
    """
    from heteroflow.components.failures import simulated_devices

    inv = Inventory.from_json(device_inventory) if device_inventory.strip() else local_inventory()
    simulated = simulated_devices()
    if not simulated:
        return inv
    from heteroflow.components.accelerators import find_accelerator

    devices = dict(inv.devices)
    models = {k: dict(v) for k, v in inv.models.items()}
    notes = dict(inv.notes)
    for kind_name, model in simulated.items():
        kind = DeviceKind(kind_name)
        devices[kind] = max(devices.get(kind, 0), SIMULATED_DEVICE_COUNT)
        notes.pop(kind, None)
        if model:
            try:
                accel = find_accelerator(model, field=f"simulated {kind_name} model")
            except InvalidResources as exc:
                raise InvalidParameter(str(exc)) from None
            models[kind] = {accel.name: SIMULATED_DEVICE_COUNT}
        else:
            models.pop(kind, None)
    return Inventory(devices=devices, models=models, notes=notes, simulated=tuple(DeviceKind(k) for k in simulated))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    """What the plan step decided.

    Attributes:
        indices: per placed call, the index of the chosen candidate (0 = preferred).
        placements: per placed call, the :class:`Placement` as a dict (chosen resources, passed-over reasons).
        inventory: the device counts it placed against, by kind.
        seconds: wall time, seconds.
    """

    indices: dict[str, int]
    placements: dict[str, dict[str, Any]]
    inventory: dict[str, int]
    seconds: float
    training_profile: dict[str, Any] | None = None


def plan_step(placement_path: str, *, placements: str, device_inventory: str = "", training_profile: str = "") -> PlanResult:
    """Choose a candidate for each device-bound step: the first whose device is here.

    Args:
        placement_path: file to write the decision to (JSON: per call, the chosen candidate and why each
            earlier one was passed over).
        placements: ``{call: candidates JSON}`` of the calls to place (the engine passes it).
        device_inventory: JSON {"gpu": N, "npu": M} of the devices the job may get, for plan; empty: probe with PyTorch where plan runs (set it on a cluster, where the plan pod has no accelerator).
        training_profile: path of a training profile (JSON from heteroflow profile): checked and recorded with the placement; placement does not use it yet.

    Returns:
        A :class:`PlanResult`.

    Raises:
        InvalidParameter: ``placements`` or ``device_inventory`` is malformed.
        NoCandidateAvailable: a call has no candidate that can run; the message says why each was passed over.
    """
    started = time.perf_counter()
    recorded = None
    if training_profile:
        from heteroflow.components.profiling import read_profile

        prof = read_profile(training_profile, field="training_profile")
        recorded = {"path": training_profile, **{k: prof.get(k) for k in ("device", "samples_per_second", "key_operators",
                                                                            "peak_memory_bytes", "peak_memory_of")}}
    try:
        wanted = json.loads(placements or "{}")
        if not isinstance(wanted, dict):
            raise TypeError("not an object")
    except (ValueError, TypeError) as exc:
        raise InvalidParameter(f"placements={placements!r} is not a JSON object of call -> candidates ({exc})") from None
    inventory = current_inventory(device_inventory)
    chosen: dict[str, Placement] = {}
    for call, candidates_json in wanted.items():
        try:
            chosen[call] = plan(Candidates.from_json(candidates_json), inventory=inventory)
        except NoCandidateAvailable as exc:
            raise NoCandidateAvailable(f"step {call!r}: {exc}") from None
    decision = {call: p.to_dict() for call, p in chosen.items()}
    Path(placement_path).parent.mkdir(parents=True, exist_ok=True)
    Path(placement_path).write_text(json.dumps(decision, indent=2, sort_keys=True), encoding="utf-8")
    return PlanResult(
        indices={call: p.index for call, p in chosen.items()},
        placements=decision,
        inventory={k.value: n for k, n in inventory.devices.items()},
        seconds=time.perf_counter() - started,
        training_profile=recorded,
    )


# --- the step definition ----------------------------------------------------------------------------------

_HOUR = 3600.0


PLAN: Step = step(
    plan_step,
    name="plan",
    outputs=[ArtifactSpec(name="placement", type=ArtifactType.ARTIFACT, param="placement_path", help="the placement (JSON)")],
    candidates=[Resources(kind="cpu", cpu="500m", memory="512Mi")],
    retry=RetryPolicy(retries=1, backoff_seconds=2, max_delay_seconds=30, window_seconds=_HOUR),
    cacheable=False,  # its result depends on the live inventory
    planner=True,
    placements_param="placements",
    check=check_plan_params,
    ref="heteroflow.components.plan:PLAN",
)
