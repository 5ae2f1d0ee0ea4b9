"""The resource model: device kinds, accelerators, :class:`Resources`, :class:`Candidates`, :class:`RetryPolicy`.

Quantities follow Kubernetes exactly (``k8s.io/apimachinery/pkg/api/resource.Quantity``): a number with an
optional suffix, binary ``Ki Mi Gi Ti Pi Ei`` (powers of 2^10), decimal ``n u m k M G T P E`` (powers of
10^3) or a decimal exponent (``1e9``). ``G`` is 10^9 bytes and ``Gi`` is 2^30 bytes; ``500m`` CPU is half a
core. Each string is parsed once, at construction, into an integer (millicores, bytes); bad input raises
:class:`InvalidResources` naming the field and the valid forms.

The design follows SkyPilot's ``Resources`` (immutable value, ``ordered`` candidate lists) and flytekit's
typed accelerator constants rendered through one path.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from heteroflow.components.errors import InvalidResources

__all__ = [
    "ACCELERATORS",
    "ASCEND_310P",
    "ASCEND_910",
    "Accelerator",
    "Candidates",
    "DeviceKind",
    "NVIDIA_GPU",
    "RetryPolicy",
    "Resources",
    "parse_cpu",
    "parse_memory",
]


class DeviceKind(str, enum.Enum):
    """The kinds of device a step can run on."""

    CPU = "cpu"
    GPU = "gpu"
    NPU = "npu"

    @classmethod
    def parse(cls, value: DeviceKind | str, *, field: str = "kind") -> DeviceKind:
        """Return the kind named by ``value`` (case-insensitive).

        Raises:
            InvalidResources: ``value`` is not one of ``cpu``, ``gpu``, ``npu``.
        """
        if isinstance(value, DeviceKind):
            return value
        if isinstance(value, str):
            try:
                return cls(value.strip().lower())
            except ValueError:
                pass
        valid = ", ".join(k.value for k in cls)
        raise InvalidResources(f"{field}={value!r} is not a device kind; valid kinds: {valid}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Accelerator:
    """One accelerator model and how every engine names it.

    Attributes:
        name: registry key, e.g. ``"nvidia-gpu"``, ``"ascend-910"``.
        kind: the device kind it belongs to.
        resource_name: the Kubernetes extended resource its device plugin advertises.
        torch_device_type: the ``torch.device`` type that drives it (``"cuda"``, ``"npu"`` via torch_npu).
        distributed_backend: the ``torch.distributed`` backend for it (``"nccl"``, ``"hccl"``).
    """

    name: str
    kind: DeviceKind
    resource_name: str
    torch_device_type: str
    distributed_backend: str


# Resource names are the ones the vendors' Kubernetes device plugins advertise
# (NVIDIA k8s-device-plugin; Huawei Ascend mindxdl device plugin).
NVIDIA_GPU = Accelerator(
    name="nvidia-gpu",
    kind=DeviceKind.GPU,
    resource_name="nvidia.com/gpu",
    torch_device_type="cuda",
    distributed_backend="nccl",
)
ASCEND_910 = Accelerator(
    name="ascend-910",
    kind=DeviceKind.NPU,
    resource_name="huawei.com/Ascend910",
    torch_device_type="npu",
    distributed_backend="hccl",
)
ASCEND_310P = Accelerator(
    name="ascend-310p",
    kind=DeviceKind.NPU,
    resource_name="huawei.com/Ascend310P",
    torch_device_type="npu",
    distributed_backend="hccl",
)
ACCELERATORS: Mapping[str, Accelerator] = {a.name: a for a in (NVIDIA_GPU, ASCEND_910, ASCEND_310P)}
_DEFAULT_ACCELERATOR = {DeviceKind.GPU: NVIDIA_GPU, DeviceKind.NPU: ASCEND_910}

# --- Kubernetes quantities -------------------------------------------------------------------------------

_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:\d+\.?\d*|\.\d+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_MEMORY_FORMS = "an integer number of bytes or a Kubernetes quantity such as 512Mi, 16Gi, 1G, 1.5Ti or 1e9"
_CPU_FORMS = "cores as a number or a Kubernetes quantity such as 500m, 0.5, 2 or 16"


def _parse_quantity(value: object, *, field: str, forms: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (str, int, float, Decimal)):
        raise InvalidResources(f"{field}={value!r} is not a quantity; valid: {forms}")
    if isinstance(value, str):
        text = value.strip()
        match = _QUANTITY.match(text)
        if not match:
            hint = ""
            if re.match(r"^[\d.]+\s*[kKmMgGtTpPeE][bB]?$", text) or text.lower().endswith(("gb", "mb", "kb", "tb")):
                hint = " (Kubernetes writes gigabytes as G = 10^9 and gibibytes as Gi = 2^30; 'GB' is not a unit)"
            raise InvalidResources(f"{field}={value!r} is not a Kubernetes quantity{hint}; valid: {forms}")
        number = Decimal(match["number"])
        suffix = match["suffix"] or ""
        if suffix in _BINARY:
            amount = number * _BINARY[suffix]
        elif suffix in _DECIMAL:
            amount = number * _DECIMAL[suffix]
        else:  # decimal exponent
            amount = number.scaleb(int(suffix[1:]))
    else:
        try:
            amount = Decimal(str(value))
        except InvalidOperation as exc:  # pragma: no cover - str(float) is always a decimal
            raise InvalidResources(f"{field}={value!r} is not a quantity; valid: {forms}") from exc
        if not amount.is_finite():
            raise InvalidResources(f"{field}={value!r} is not finite; valid: {forms}")
    if amount < 0:
        raise InvalidResources(f"{field}={value!r} is negative; valid: {forms}")
    return amount


def parse_cpu(value: str | int | float, *, field: str = "cpu") -> int:
    """Parse a CPU quantity into millicores (1 core = 1000).

    Args:
        value: ``"500m"``, ``"2"``, ``2``, ``0.5``...
        field: the name reported in errors.

    Returns:
        Millicores, an integer >= 0.

    Raises:
        InvalidResources: not a quantity, negative, or finer than 1m (Kubernetes' CPU precision).
    """
    cores = _parse_quantity(value, field=field, forms=_CPU_FORMS)
    millicores = cores * 1000
    if millicores != millicores.to_integral_value():
        raise InvalidResources(f"{field}={value!r} is finer than 1m (one millicore); valid: {_CPU_FORMS}")
    return int(millicores)


def parse_memory(value: str | int, *, field: str = "memory") -> int:
    """Parse a memory quantity into bytes.

    Args:
        value: ``"16Gi"`` (16 * 2^30), ``"1G"`` (10^9), ``"512Mi"``, ``1073741824``...
        field: the name reported in errors.

    Returns:
        Bytes, an integer >= 0.

    Raises:
        InvalidResources: not a Kubernetes quantity (``"16GB"``), negative, or a fraction of a byte.
    """
    amount = _parse_quantity(value, field=field, forms=_MEMORY_FORMS)
    if amount != amount.to_integral_value():
        raise InvalidResources(f"{field}={value!r} is not a whole number of bytes; valid: {_MEMORY_FORMS}")
    return int(amount)


def format_cpu(millicores: int) -> str:
    """Render millicores as the shortest exact Kubernetes quantity (``500m``, ``2``)."""
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores}m"


def format_memory(num_bytes: int) -> str:
    """Render bytes as the shortest exact Kubernetes quantity (``16Gi``, ``1G``, ``1500``)."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        if num_bytes and num_bytes % _BINARY[suffix] == 0:
            return f"{num_bytes // _BINARY[suffix]}{suffix}"
    for suffix in ("E", "P", "T", "G", "M", "k"):
        unit = int(_DECIMAL[suffix])
        if num_bytes and num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)


# --- Resources --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Resources:
    """What one step asks for on one device kind. Immutable; change with :func:`dataclasses.replace`.

    Args:
        kind: ``"cpu"``, ``"gpu"`` or ``"npu"`` (or a :class:`DeviceKind`).
        count: accelerator devices; default 1 for ``gpu``/``npu``, and must be 0 for ``cpu``.
        cpu: CPU cores, a Kubernetes quantity (``"500m"``, ``"2"``) or a number; default ``"1"``.
        memory: host memory, a Kubernetes quantity (``"16Gi"``, ``"1G"``); default ``"2Gi"``.
        device_memory: memory per accelerator device, a Kubernetes quantity, or None for "any".
        accelerator: a key of :data:`ACCELERATORS`; default ``nvidia-gpu`` for gpu, ``ascend-910`` for npu.

    Attributes (parsed once, at construction):
        cpu_millicores: ``cpu`` in millicores.
        memory_bytes: ``memory`` in bytes.
        device_memory_bytes: ``device_memory`` in bytes, or None.

    Raises:
        InvalidResources: a field is invalid; the message names it and lists the valid forms.
    """

    kind: DeviceKind | str = DeviceKind.CPU
    count: int | None = None
    # Compared (and hashed) by their parsed values below, so cpu=1 equals cpu="1000m" and "1024Mi" equals "1Gi".
    cpu: str | int | float = dataclasses.field(default="1", compare=False)
    memory: str | int = dataclasses.field(default="2Gi", compare=False)
    device_memory: str | int | None = dataclasses.field(default=None, compare=False)
    accelerator: str | None = None
    cpu_millicores: int = dataclasses.field(init=False, repr=False)
    memory_bytes: int = dataclasses.field(init=False, repr=False)
    device_memory_bytes: int | None = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        kind = DeviceKind.parse(self.kind)
        object.__setattr__(self, "kind", kind)
        count = self.count
        if count is None:
            count = 0 if kind is DeviceKind.CPU else 1
        if isinstance(count, bool) or not isinstance(count, int):
            raise InvalidResources(f"count={self.count!r} is not an integer; valid: a whole number of devices >= 0")
        if count < 0:
            raise InvalidResources(f"count={count} is negative; valid: a whole number of devices >= 0")
        if kind is DeviceKind.CPU and count != 0:
            raise InvalidResources(
                f"count={count} with kind='cpu': a CPU candidate has no accelerator devices; "
                "set cpu='N' for cores, or kind='gpu'/'npu' for devices"
            )
        if kind is not DeviceKind.CPU and count == 0:
            raise InvalidResources(f"count=0 with kind={kind.value!r}: an accelerator candidate needs count >= 1")
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "cpu_millicores", parse_cpu(self.cpu))
        object.__setattr__(self, "memory_bytes", parse_memory(self.memory))
        device_memory_bytes = None
        if self.device_memory is not None:
            if kind is DeviceKind.CPU:
                raise InvalidResources("device_memory is set with kind='cpu'; it only applies to gpu/npu")
            device_memory_bytes = parse_memory(self.device_memory, field="device_memory")
        object.__setattr__(self, "device_memory_bytes", device_memory_bytes)
        if self.accelerator is not None:
            accel = ACCELERATORS.get(self.accelerator)
            if accel is None:
                raise InvalidResources(
                    f"accelerator={self.accelerator!r} is unknown; valid: {', '.join(sorted(ACCELERATORS))}"
                )
            if accel.kind is not kind:
                raise InvalidResources(
                    f"accelerator={self.accelerator!r} is a {accel.kind.value}, but kind={kind.value!r}"
                )

    # -- derived views ---------------------------------------------------------------------------------

    @property
    def accelerator_spec(self) -> Accelerator | None:
        """The :class:`Accelerator` this asks for (None for CPU)."""
        if self.kind is DeviceKind.CPU:
            return None
        if self.accelerator is not None:
            return ACCELERATORS[self.accelerator]
        return _DEFAULT_ACCELERATOR[DeviceKind(self.kind)]

    @property
    def torch_device_type(self) -> str:
        """The ``torch.device`` type that runs this (``"cpu"``, ``"cuda"``, ``"npu"``)."""
        accel = self.accelerator_spec
        return "cpu" if accel is None else accel.torch_device_type

    def k8s_requests(self) -> dict[str, str]:
        """Render as a Kubernetes ``resources.limits`` map (exact quantities, extended resource included)."""
        out = {"cpu": format_cpu(self.cpu_millicores), "memory": format_memory(self.memory_bytes)}
        accel = self.accelerator_spec
        if accel is not None:
            out[accel.resource_name] = str(self.count)
        return out

    def describe(self) -> str:
        """A short human label, e.g. ``gpu x1 (nvidia-gpu), 4 CPU, 16Gi``."""
        accel = self.accelerator_spec
        head = "cpu" if accel is None else f"{DeviceKind(self.kind).value} x{self.count} ({accel.name})"
        return f"{head}, {format_cpu(self.cpu_millicores)} CPU, {format_memory(self.memory_bytes)}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict that :meth:`from_dict` turns back into an equal value."""
        return {
            "kind": DeviceKind(self.kind).value,
            "count": self.count,
            "cpu": format_cpu(self.cpu_millicores),
            "memory": format_memory(self.memory_bytes),
            "device_memory": None if self.device_memory_bytes is None else format_memory(self.device_memory_bytes),
            "accelerator": self.accelerator,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Resources:
        """Build from a mapping of the constructor's fields.

        Raises:
            InvalidResources: an unknown key (the message lists the valid ones) or an invalid value.
        """
        valid = ("kind", "count", "cpu", "memory", "device_memory", "accelerator")
        unknown = sorted(set(data) - set(valid))
        if unknown:
            raise InvalidResources(f"unknown resource field(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
        return cls(**{k: data[k] for k in valid if k in data})

    @classmethod
    def parse_spec(cls, spec: str) -> Resources:
        """Parse the command-line form ``KIND[:key=value,...]``, e.g. ``gpu:count=1,memory=16Gi`` or ``cpu:cpu=8``.

        Raises:
            InvalidResources: malformed spec, unknown key or invalid value.
        """
        kind, _, rest = spec.partition(":")
        fields: dict[str, Any] = {"kind": kind}
        for item in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, value = item.partition("=")
            if not eq:
                raise InvalidResources(f"candidate {spec!r}: {item!r} is not key=value (e.g. gpu:count=1,memory=16Gi)")
            key = key.strip()
            if key == "count":
                try:
                    fields[key] = int(value)
                except ValueError:
                    raise InvalidResources(f"count={value!r} in candidate {spec!r} is not an integer") from None
            else:
                fields[key] = value.strip()
        return cls.from_dict(fields)


# --- Candidates -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Candidates:
    """An ordered list of :class:`Resources` a step can run on; the first is preferred (SkyPilot's ``ordered``).

    Args:
        options: one or more :class:`Resources` (or mappings / ``KIND:key=value`` specs), most preferred first.
        policy: ``"ordered"`` (take the first usable one) or ``"any"`` (the planner picks by score; until a
            scorer is configured it falls back to the listed order).

    Raises:
        InvalidResources: empty list, an item that is not a resource, duplicates, or an unknown policy.
    """

    options: tuple[Resources, ...]
    policy: str = "ordered"

    def __init__(self, options: Iterable[Resources | Mapping[str, Any] | str], policy: str = "ordered") -> None:
        items: list[Resources] = []
        for i, opt in enumerate(options):
            if isinstance(opt, Resources):
                items.append(opt)
            elif isinstance(opt, str):
                items.append(Resources.parse_spec(opt))
            elif isinstance(opt, Mapping):
                items.append(Resources.from_dict(opt))
            else:
                raise InvalidResources(f"candidates[{i}]={opt!r} is not a Resources, a mapping or a 'KIND:...' spec")
        if not items:
            raise InvalidResources("candidates is empty; give at least one Resources, e.g. Resources(kind='cpu')")
        if len(set(items)) != len(items):
            raise InvalidResources("candidates lists the same Resources twice; each fallback must differ")
        if policy not in ("ordered", "any"):
            raise InvalidResources(f"policy={policy!r} is unknown; valid: ordered, any")
        object.__setattr__(self, "options", tuple(items))
        object.__setattr__(self, "policy", policy)

    def __iter__(self) -> Iterator[Resources]:
        return iter(self.options)

    def __len__(self) -> int:
        return len(self.options)

    def __getitem__(self, index: int) -> Resources:
        return self.options[index]

    def to_json(self) -> str:
        """Serialise (for a step's string input); :meth:`from_json` reads it back."""
        return json.dumps({"policy": self.policy, "options": [r.to_dict() for r in self.options]}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Candidates:
        """Read what :meth:`to_json` wrote.

        Raises:
            InvalidResources: not JSON of that shape.
        """
        try:
            data = json.loads(text)
            options, policy = data["options"], data.get("policy", "ordered")
            if not isinstance(options, list):
                raise TypeError(f"'options' is {type(options).__name__}, not a list")
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidResources(f"candidates JSON is malformed ({exc}); expected {{'options': [...]}}") from None
        return cls(options, policy=policy)


# --- Retry policy: defined in heteroflow.components.retry, re-exported here for existing imports -------------

from heteroflow.components.retry import RetryPolicy  # noqa: E402
