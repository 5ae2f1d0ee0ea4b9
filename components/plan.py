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
from collections.abc import Callable, Mapping
from typing import Any

from heteroflow.components.errors import InvalidParameter, InvalidResources, NoCandidateAvailable
from heteroflow.components.resources import Candidates, DeviceKind, Resources

__all__ = ["Inventory", "Placement", "local_inventory", "plan"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Inventory:
    """Devices available to this process.

    Attributes:
        devices: device count per kind (``cpu`` is 1 when present).
        notes: per kind, why it is absent (e.g. ``torch_npu is not installed``).
    """

    devices: Mapping[DeviceKind, int]
    notes: Mapping[DeviceKind, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, text: str, *, source: str = "device_inventory") -> Inventory:
        """An inventory stated by the user, e.g. ``{"gpu": 4, "npu": 0}`` (devices the job may get; the CPU
        is always present). Used on a cluster, where the plan pod itself has no accelerator to probe.

        Raises:
            InvalidParameter: not a JSON object of device kind -> count >= 0.
        """
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InvalidParameter(f"{source}={text!r} is not JSON ({exc}); valid: e.g. {{\"gpu\": 4, \"npu\": 0}}") from None
        if not isinstance(data, dict):
            raise InvalidParameter(f"{source}={text!r} is not a JSON object; valid: e.g. {{\"gpu\": 4, \"npu\": 0}}")
        devices: dict[DeviceKind, int] = {DeviceKind.CPU: 1}
        for key, count in data.items():
            try:
                kind = DeviceKind.parse(key, field=f"{source} key")
            except InvalidResources as exc:
                raise InvalidParameter(str(exc)) from None
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise InvalidParameter(f"{source}[{key!r}]={count!r} is not a device count; valid: an integer >= 0")
            devices[kind] = max(count, 1) if kind is DeviceKind.CPU else count
        notes = {k: f"{source} lists {n} {k.value} device(s)" for k, n in devices.items() if n == 0}
        return cls(devices=devices, notes=notes)


def local_inventory() -> Inventory:
    """Probe the devices PyTorch can use in this process (imports torch)."""
    import torch

    devices: dict[DeviceKind, int] = {DeviceKind.CPU: 1}
    notes: dict[DeviceKind, str] = {}
    if torch.cuda.is_available():
        devices[DeviceKind.GPU] = torch.cuda.device_count()
    else:
        devices[DeviceKind.GPU] = 0
        notes[DeviceKind.GPU] = (
            "torch.cuda.is_available() is False"
            + ("" if torch.version.cuda else f" (torch {torch.__version__} is a CPU-only build)")
        )
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
    return Inventory(devices=devices, notes=notes)


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


def plan(candidates: Candidates, *, inventory: Inventory | Callable[[], Inventory] = local_inventory) -> Placement:
    """Choose the first candidate that can run here.

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
        kind = DeviceKind(res.kind)
        have = inv.devices.get(kind, 0)
        need = max(res.count or 0, 1)
        if have >= need:
            return Placement(
                index=i,
                resources=res,
                device_kind=kind.value,
                torch_device=res.torch_device_type,
                passed_over=tuple(reasons),
            )
        why = inv.notes.get(kind) or f"{have} {kind.value} device(s) here"
        reasons.append(f"candidate {i} ({res.describe()}): needs {need} {kind.value} device(s); {why}")
    raise NoCandidateAvailable("no candidate can run here:\n  " + "\n  ".join(reasons))
