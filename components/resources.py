"""The resource model: :class:`Resources` (one candidate), :class:`Candidates`, :class:`Toleration`, :class:`RetryPolicy`.

Quantities follow Kubernetes exactly (``k8s.io/apimachinery/pkg/api/resource.Quantity``): ``G`` is 10^9 bytes
and ``Gi`` is 2^30 bytes; ``500m`` CPU is half a core. Each string is parsed once, at construction, into an exact
integer (millicores, bytes); any other string raises :class:`InvalidResources` naming the field, the valid forms
and, where one is near, the likely intent (``16GB`` -> ``16G`` or ``16Gi``). Quantities are rendered back in the
unit the user wrote where that is exact (``8G`` stays ``8G``).

This module holds :class:`Resources` and :class:`Candidates`; the rest of the model lives beside the device
kinds and is re-exported here, so every name keeps its import path:

- :mod:`heteroflow.components.devices.quantities`: Kubernetes quantities (:func:`parse_quantity`,
  :func:`parse_cpu`, :func:`parse_memory`, :func:`format_cpu`, :func:`format_memory`);
- :mod:`heteroflow.components.devices.scheduling`: :class:`FrozenMap`, :func:`thaw`, Kubernetes names and label
  values (:func:`check_qualified_name`, :func:`check_label_value`), :class:`Toleration` and affinity;
- :mod:`heteroflow.components.core.retry`: :class:`RetryPolicy`.

Accelerators come from the registry in :mod:`heteroflow.components.devices.accelerators` (models, families, the
names users write for them). The design follows SkyPilot's ``Resources`` (immutable value, ``ordered``
candidate lists) and flytekit's typed accelerator constants and separate ``requests=`` / ``limits=``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from heteroflow.components.devices.accelerators import (
    ACCELERATORS,
    ASCEND_310P,
    ASCEND_910,
    NVIDIA_GPU,
    Accelerator,
    DeviceKind,
    default_accelerator,
    find_accelerator,
)
from heteroflow.components.devices.quantities import (
    _render_cpu,
    _render_memory,
    format_cpu,
    format_memory,
    parse_cpu,
    parse_memory,
    parse_quantity,
)
from heteroflow.components.devices.scheduling import (
    FrozenMap,
    Toleration,
    _affinity,
    _string_map,
    check_label_value,
    check_qualified_name,
    thaw,
)
from heteroflow.components.core.keys import first_duplicate
from heteroflow.components.errors import InvalidResources

__all__ = [
    "ACCELERATORS",
    "ASCEND_310P",
    "ASCEND_910",
    "Accelerator",
    "Candidates",
    "DeviceKind",
    "FrozenMap",
    "NVIDIA_GPU",
    "PRECISIONS",
    "NO_LIMIT",
    "RetryPolicy",
    "Resources",
    "Toleration",
    "check_label_value",
    "check_qualified_name",
    "find_accelerator",
    "format_cpu",
    "format_memory",
    "parse_cpu",
    "parse_memory",
    "parse_quantity",
    "thaw",
]


# --- Resources --------------------------------------------------------------------------------------------

PRECISIONS = ("fp32", "fp16", "bf16")
"""Compute precisions a candidate may ask for; ``bf16`` is checked against the accelerator."""

_FIELDS = (
    "kind",
    "count",
    "nodes",
    "cpu",
    "memory",
    "cpu_limit",
    "memory_limit",
    "device_memory",
    "device_share",
    "accelerator",
    "precision",
    "node_selector",
    "tolerations",
    "affinity",
    "labels",
    "annotations",
)


NO_LIMIT = "none"
"""``cpu_limit=NO_LIMIT`` / ``memory_limit=NO_LIMIT``: a request without any limit (Kubernetes: ``requests`` set,
``limits`` absent)."""


def _no_limit(value: object) -> bool:
    return isinstance(value, str) and value.strip().lower() == NO_LIMIT


def _positive(value: object, *, field: str, memory: bool) -> int | None:
    if value is None or (field.endswith("_limit") and _no_limit(value)):
        return None
    amount = parse_memory(value, field=field) if memory else parse_cpu(value, field=field)
    if amount == 0:
        raise InvalidResources(
            f"{field}={value!r} is zero: a pod's request or limit is positive or absent; valid: a positive "
            f"{'memory' if memory else 'CPU'} quantity, or None to leave it out"
        )
    return amount


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Resources:
    """What one step asks for on one device kind (one *candidate*). Immutable; change with
    :func:`dataclasses.replace`.

    Args:
        kind: ``"cpu"``, ``"gpu"`` or ``"npu"`` (or a :class:`DeviceKind`); default: the accelerator's kind,
            else ``cpu``.
        count: accelerator devices, a whole number; default 1 for ``gpu``/``npu``, and 0 (no devices) for
            ``cpu``. Kubernetes requires an extended resource's request to equal its limit, so the count is both.
        nodes: pods on separate nodes, each asking for everything here (``count`` devices, ``cpu``, ``memory``),
            >= 1; default 1. More than 1 makes a multi-node job: on a cluster the train step submits it as a
            Kubeflow Trainer TrainJob or PyTorchJob with gang scheduling (:mod:`heteroflow.components.training.trainjob`),
            one process per device on each node.
        cpu: CPU request in cores, a Kubernetes quantity (``"500m"``, ``"2"``) or a number; default ``"1"``;
            None asks for none.
        memory: host memory request, a Kubernetes quantity (``"16Gi"``, ``"8G"``); default ``"2Gi"``; None
            asks for none.
        cpu_limit: CPU limit (>= ``cpu``); None: the same as ``cpu``; ``"none"`` (:data:`NO_LIMIT`): no limit at
            all (the pod may use idle CPU on the node, what users of a shared cluster often set for CPU; KFP's
            ``set_cpu_request`` without ``set_cpu_limit``).
        memory_limit: memory limit (>= ``memory``); None: the same as ``memory``; ``"none"``: no limit.
        device_memory: memory per accelerator device (at least this much), a Kubernetes quantity; None for any.
            On a model it must not exceed the model's; on a family it narrows the family to models with enough.
        device_share: part of one device, a number with 0 < share < 1 (``0.5``: half of one GPU's compute and,
            unless ``device_memory`` says otherwise, memory), only with ``count=1``; None: whole devices. Stored in
            thousandths (:attr:`device_share_milli`, the ``gpu_milli`` of GPU-sharing schedulers and the Alibaba
            traces); on a cluster it needs a GPU-sharing device plugin (HAMi: :mod:`heteroflow.components.placement.podplace`).
        accelerator: a model or family from the registry, by any name users write (``"T4"``,
            ``"NVIDIA_TESLA_T4"``, ``"A100"``, ``"ascend-910b3"``, ``"910B"``); stored as its registry key.
            Default: ``nvidia-gpu`` (any NVIDIA) for gpu, ``ascend-910`` (any Ascend 910) for npu.
        precision: ``"fp32"``, ``"fp16"`` or ``"bf16"``, or None; ``bf16`` on a model without it is an error,
            and narrows a family to models with it.
        node_selector: node labels the pod requires, ``{key: value}``.
        tolerations: :class:`Toleration` values or mappings in Kubernetes' form.
        affinity: the pod spec's ``affinity`` object (``nodeAffinity``/``podAffinity``/``podAntiAffinity``,
            camelCase, as in YAML) or a ``kubernetes.client.V1Affinity``.
        labels: pod labels, ``{key: value}``.
        annotations: pod annotations, ``{key: value}``.

    Attributes (parsed once, at construction; quantities are exact integers):
        cpu_millicores, cpu_limit_millicores: CPU request and limit in millicores, or None.
        memory_bytes, memory_limit_bytes: memory request and limit in bytes, or None.
        device_memory_bytes: ``device_memory`` in bytes, or None.

    Raises:
        InvalidResources: a field is invalid or two contradict; the message names the field and lists the valid
            forms or choices.
    """

    kind: DeviceKind | str | None = None
    count: int | None = None
    nodes: int = 1
    # Compared (and hashed) by their parsed values below, so cpu=1 equals cpu="1000m" and "1024Mi" equals "1Gi".
    cpu: str | int | float | None = dataclasses.field(default="1", compare=False)
    memory: str | int | None = dataclasses.field(default="2Gi", compare=False)
    cpu_limit: str | int | float | None = dataclasses.field(default=None, compare=False)
    memory_limit: str | int | None = dataclasses.field(default=None, compare=False)
    device_memory: str | int | None = dataclasses.field(default=None, compare=False)
    device_share: float | None = None
    accelerator: str | None = None
    precision: str | None = None
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=FrozenMap)
    tolerations: tuple[Toleration, ...] = ()
    affinity: Mapping[str, Any] | None = None
    labels: Mapping[str, str] = dataclasses.field(default_factory=FrozenMap)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=FrozenMap)
    cpu_millicores: int | None = dataclasses.field(init=False, repr=False)
    memory_bytes: int | None = dataclasses.field(init=False, repr=False)
    cpu_limit_millicores: int | None = dataclasses.field(init=False, repr=False)
    memory_limit_bytes: int | None = dataclasses.field(init=False, repr=False)
    device_memory_bytes: int | None = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        accel = None
        if self.accelerator is not None:
            accel = find_accelerator(self.accelerator)
            object.__setattr__(self, "accelerator", accel.name)
        kind = DeviceKind.parse(self.kind) if self.kind is not None else (accel.kind if accel else DeviceKind.host())
        object.__setattr__(self, "kind", kind)
        if accel is not None and accel.kind is not kind:
            raise InvalidResources(
                f"accelerator={accel.name!r} is a {accel.kind.value}, but kind={kind.value!r}; valid: "
                f"kind={accel.kind.value!r}, or leave kind out"
            )
        self._set_count(kind)
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1:
            raise InvalidResources(
                f"nodes={self.nodes!r} is not a node count; valid: an integer >= 1 (pods on separate nodes, each with "
                "the candidate's devices)"
            )
        self._set_quantities(kind)
        self._set_share(kind)
        self._check_accelerator_fit()
        object.__setattr__(self, "node_selector", _string_map(self.node_selector, field="node_selector", label_values=True))
        object.__setattr__(self, "labels", _string_map(self.labels, field="labels", label_values=True))
        object.__setattr__(self, "annotations", _string_map(self.annotations, field="annotations", label_values=False))
        tolerations = () if self.tolerations is None else self.tolerations
        if isinstance(tolerations, (str, bytes, Mapping)) or not isinstance(tolerations, Iterable):
            raise InvalidResources(f"tolerations={tolerations!r} is not a list; valid: a list of tolerations")
        object.__setattr__(
            self,
            "tolerations",
            tuple(Toleration.from_value(t, field=f"tolerations[{i}]") for i, t in enumerate(tolerations)),
        )
        object.__setattr__(self, "affinity", _affinity(self.affinity))

    def _set_count(self, kind: DeviceKind) -> None:
        count = self.count
        if count is None:
            count = 1 if kind.has_devices else 0
        if isinstance(count, bool) or not isinstance(count, int):
            raise InvalidResources(
                f"count={self.count!r} is not an integer; valid: a whole number of devices >= 1 (Kubernetes counts "
                "extended resources in whole devices)"
            )
        if count < 0:
            raise InvalidResources(f"count={count} is negative; valid: a whole number of devices >= 1")
        if not kind.has_devices and count != 0:
            raise InvalidResources(
                f"count={count} with kind={kind.value!r}: a CPU candidate has no accelerator devices; "
                "set cpu='N' for cores, or kind='gpu'/'npu' for devices"
            )
        if kind.has_devices and count == 0:
            raise InvalidResources(f"count=0 with kind={kind.value!r}: an accelerator candidate needs count >= 1")
        object.__setattr__(self, "count", count)

    def _set_quantities(self, kind: DeviceKind) -> None:
        cpu = _positive(self.cpu, field="cpu", memory=False)
        memory = _positive(self.memory, field="memory", memory=True)
        cpu_limit = _positive(self.cpu_limit, field="cpu_limit", memory=False)
        memory_limit = _positive(self.memory_limit, field="memory_limit", memory=True)
        for name, req, lim, given in (
            ("cpu", cpu, cpu_limit, self.cpu_limit),
            ("memory", memory, memory_limit, self.memory_limit),
        ):
            if req is not None and lim is not None and req > lim:
                raise InvalidResources(
                    f"{name}={getattr(self, name)!r} is above {name}_limit={given!r}: a request cannot exceed its "
                    f"limit; valid: {name} <= {name}_limit, or leave {name}_limit out (it then equals {name})"
                )
        object.__setattr__(self, "cpu_millicores", cpu)
        object.__setattr__(self, "memory_bytes", memory)
        object.__setattr__(self, "cpu_limit_millicores", cpu if cpu_limit is None and not _no_limit(self.cpu_limit) else cpu_limit)
        object.__setattr__(
            self, "memory_limit_bytes", memory if memory_limit is None and not _no_limit(self.memory_limit) else memory_limit
        )
        device_memory = None
        if self.device_memory is not None:
            if not kind.has_devices:
                raise InvalidResources(f"device_memory is set with kind={kind.value!r}; it only applies to gpu/npu")
            device_memory = _positive(self.device_memory, field="device_memory", memory=True)
        object.__setattr__(self, "device_memory_bytes", device_memory)
        precision = self.precision
        if precision is not None:
            if not isinstance(precision, str) or precision.strip().lower() not in PRECISIONS:
                raise InvalidResources(f"precision={precision!r} is unknown; valid: {', '.join(PRECISIONS)}")
            object.__setattr__(self, "precision", precision.strip().lower())

    def _set_share(self, kind: DeviceKind) -> None:
        share = self.device_share
        if share is None:
            return
        valid = "valid: a number with 0 < device_share < 1 (part of one device, e.g. 0.5), with count=1"
        try:
            value = float(share) if not isinstance(share, bool) else float("nan")
        except (TypeError, ValueError):
            raise InvalidResources(f"device_share={share!r} is not a number; {valid}") from None
        if not 0 < value < 1:
            raise InvalidResources(f"device_share={share!r} is not part of one device; {valid}, or leave it out for whole devices")
        if not kind.has_devices:
            raise InvalidResources(f"device_share={share!r} with kind={kind.value!r}: only a gpu/npu device can be shared; {valid}")
        if self.count != 1 or self.nodes != 1:
            raise InvalidResources(f"device_share={share!r} with count={self.count}, nodes={self.nodes}: a share is part of one "
                                   f"device; {valid} and nodes=1")
        if not 1 <= round(value * 1000) <= 999:
            raise InvalidResources(f"device_share={share!r} is below a thousandth of a device; {valid}, at least 0.001")
        object.__setattr__(self, "device_share", round(value * 1000) / 1000)

    @property
    def device_share_milli(self) -> int | None:
        """``device_share`` in thousandths of one device (1-999), or None for whole devices."""
        return None if self.device_share is None else round(self.device_share * 1000)

    def _check_accelerator_fit(self) -> None:
        accel = self.accelerator_spec
        if accel is None:
            return
        models = accel.models
        if self.device_memory_bytes is not None:
            fit = tuple(m for m in models if (m.device_memory_bytes or 0) >= self.device_memory_bytes)
            if not fit:
                largest = max(models, key=lambda m: m.device_memory_bytes or 0)
                most = format_memory(largest.device_memory_bytes or 0)
                bigger = [
                    f"{m.name} ({format_memory(m.device_memory_bytes or 0)})"
                    for m in ACCELERATORS.values()
                    if not m.is_family and m.vendor == accel.vendor and (m.device_memory_bytes or 0) >= self.device_memory_bytes
                ]
                what = (
                    f"is more than {accel.name} ({accel.display_name}) has ({most})"
                    if not accel.is_family
                    else f"is more than any model of {accel.name} ({accel.display_name}) has (the largest, "
                    f"{largest.name}, has {most})"
                )
                raise InvalidResources(
                    f"device_memory={self.device_memory!r} {what}; valid: at most {most}"
                    + (f", or an accelerator with more: {', '.join(bigger)}" if bigger else "")
                )
            models = fit
        if self.precision == "bf16":
            fit = tuple(m for m in models if m.bf16)
            if not fit:
                with_bf16 = [m.name for m in ACCELERATORS.values() if not m.is_family and m.kind is accel.kind and m.bf16]
                which = "it has" if not accel.is_family else "none of its models (with the memory asked) has"
                raise InvalidResources(
                    f"precision='bf16' on accelerator={accel.name!r} ({accel.display_name}): {which} no bfloat16; "
                    f"valid: precision='fp16' or 'fp32', or an accelerator with bf16: {', '.join(with_bf16)}"
                )

    # -- derived views ---------------------------------------------------------------------------------

    @property
    def accelerator_spec(self) -> Accelerator | None:
        """The :class:`Accelerator` (model or family) this asks for (None for CPU)."""
        kind = DeviceKind.parse(self.kind)
        if not kind.has_devices:
            return None
        if self.accelerator is not None:
            return ACCELERATORS[self.accelerator]
        return default_accelerator(kind)

    @property
    def accelerator_models(self) -> tuple[Accelerator, ...]:
        """The models that satisfy this candidate: the accelerator's models with at least ``device_memory`` and,
        for ``precision="bf16"``, bf16 support. Empty for CPU."""
        accel = self.accelerator_spec
        if accel is None:
            return ()
        models = accel.models
        if self.device_memory_bytes is not None:
            models = tuple(m for m in models if (m.device_memory_bytes or 0) >= self.device_memory_bytes)
        if self.precision == "bf16":
            models = tuple(m for m in models if m.bf16)
        return models

    @property
    def torch_device_type(self) -> str:
        """The ``torch.device`` type that runs this (``"cpu"``, ``"cuda"``, ``"npu"``, ``"hpu"``)."""
        accel = self.accelerator_spec
        return DeviceKind.parse(self.kind).torch_device_type if accel is None else accel.torch_device_type

    @property
    def distributed_backend(self) -> str:
        """The ``torch.distributed`` backend for this (``"gloo"`` on CPU, ``"nccl"``, ``"hccl"``)."""
        accel = self.accelerator_spec
        return DeviceKind.parse(self.kind).distributed_backend if accel is None else accel.distributed_backend

    def cpu_text(self, *, limit: bool = False) -> str | None:
        """The CPU request (or limit) as a Kubernetes quantity in the unit the user wrote where exact; None if
        absent."""
        value = self.cpu_limit_millicores if limit else self.cpu_millicores
        if value is None:
            return None
        written = self.cpu_limit if limit and self.cpu_limit is not None else self.cpu
        return _render_cpu(value, written)

    def memory_text(self, *, limit: bool = False) -> str | None:
        """The memory request (or limit) as a Kubernetes quantity in the unit the user wrote where exact
        (``"8G"`` stays ``"8G"``); None if absent."""
        value = self.memory_limit_bytes if limit else self.memory_bytes
        if value is None:
            return None
        written = self.memory_limit if limit and self.memory_limit is not None else self.memory
        return _render_memory(value, written)

    def device_memory_text(self) -> str | None:
        """``device_memory`` in the unit the user wrote where exact; None if not set."""
        if self.device_memory_bytes is None:
            return None
        return _render_memory(self.device_memory_bytes, self.device_memory)

    def _k8s_map(self, *, limit: bool) -> dict[str, str]:
        out = {}
        cpu, memory = self.cpu_text(limit=limit), self.memory_text(limit=limit)
        if cpu is not None:
            out["cpu"] = cpu
        if memory is not None:
            out["memory"] = memory
        accel = self.accelerator_spec
        if accel is not None:
            if self.device_share is not None:  # the official plugins cannot share a device: the error says what can
                from heteroflow.components.devices.podplan import share_resources

                share_resources(self)
            out[accel.resource_name] = str(self.count)
        return out

    def k8s_requests(self) -> dict[str, str]:
        """The Kubernetes ``resources.requests`` map under the official device plugins (exact quantities in the
        user's units; the accelerator's extended resource with its count). A cluster profile may name the
        accelerator differently: see ``heteroflow.pipelines.k8s.resources``.

        Raises:
            InvalidResources: a ``device_share``, which the official device plugins cannot give (a HAMi profile
                can: ``heteroflow.pipelines.k8s.resources.build_pod_resources``)."""
        return self._k8s_map(limit=False)

    def k8s_limits(self) -> dict[str, str]:
        """The Kubernetes ``resources.limits`` map (limits default to the requests; the device count is both)."""
        return self._k8s_map(limit=True)

    def describe(self) -> str:
        """A short human label, e.g. ``gpu x1 (nvidia-gpu), 4 CPU, 16Gi`` or ``cpu, 1 CPU (limit 2), 2Gi (limit 4Gi)``."""
        accel = self.accelerator_spec
        kind = DeviceKind.parse(self.kind)
        parts = [kind.value if not kind.has_devices else f"{kind.value} x{self.count} ({accel.name if accel else kind.value})"]
        if self.nodes > 1:
            parts[0] += f" on each of {self.nodes} nodes"
        for unit, req, lim in (
            (" CPU", self.cpu_text(), self.cpu_text(limit=True)),
            ("", self.memory_text(), self.memory_text(limit=True)),
        ):
            if req is not None:
                parts.append(f"{req}{unit}" + ("" if lim == req else " (no limit)" if lim is None else f" (limit {lim})"))
            elif lim is not None:
                parts.append(f"limit {lim}{unit}")
        if self.device_memory_bytes is not None:
            parts.append(f"device memory >= {self.device_memory_text()}")
        if self.device_share is not None:
            parts.append(f"share {self.device_share:g} of the device")
        if self.precision:
            parts.append(self.precision)
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict that :meth:`from_dict` turns back into an equal value (quantities in the user's
        units). The keys ``kind, count, cpu, memory, device_memory, accelerator`` are always present; the others
        only when set."""
        out: dict[str, Any] = {
            "kind": DeviceKind(self.kind).value,
            "count": self.count,
            "cpu": self.cpu_text(),
            "memory": self.memory_text(),
            "device_memory": self.device_memory_text(),
            "accelerator": self.accelerator,
        }
        if self.nodes != 1:
            out["nodes"] = self.nodes
        if self.cpu_limit_millicores != self.cpu_millicores:
            out["cpu_limit"] = self.cpu_text(limit=True) or NO_LIMIT
        if self.memory_limit_bytes != self.memory_bytes:
            out["memory_limit"] = self.memory_text(limit=True) or NO_LIMIT
        if self.precision is not None:
            out["precision"] = self.precision
        if self.device_share is not None:
            out["device_share"] = self.device_share
        for name in ("node_selector", "labels", "annotations"):
            if getattr(self, name):
                out[name] = dict(getattr(self, name))
        if self.tolerations:
            out["tolerations"] = [t.to_dict() for t in self.tolerations]
        if self.affinity is not None:
            out["affinity"] = thaw(self.affinity)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Resources:
        """Build from a mapping of the constructor's fields.

        Raises:
            InvalidResources: not a mapping, an unknown key (the message lists the valid ones) or an invalid
                value.
        """
        if not isinstance(data, Mapping):
            raise InvalidResources(f"resources={data!r} is not a mapping; valid keys: {', '.join(_FIELDS)}")
        if "replicas" in data and cls is Resources:  # a mixed candidate (heteroflow.components.replicas)
            from heteroflow.components.replicas import MixedResources

            return MixedResources.from_dict(data)
        unknown = sorted(set(data) - set(_FIELDS), key=str)
        if unknown:
            from heteroflow.components.errors import did_you_mean
            from heteroflow.components.replicas import JOB_OPTIONS  # compresion: a mixed job's option, misspelled

            close = did_you_mean(map(str, unknown), [*_FIELDS, *JOB_OPTIONS])
            raise InvalidResources(
                f"unknown resource field(s) {', '.join(map(str, unknown))}{close}; "
                f"valid: {', '.join(_FIELDS)}"
            )
        fields = {k: data[k] for k in _FIELDS if k in data}
        for name in ("node_selector", "labels", "annotations"):
            if fields.get(name, ...) is None:
                fields[name] = FrozenMap()
        if fields.get("tolerations", ...) is None:
            fields["tolerations"] = ()
        return cls(**fields)

    @classmethod
    def parse_spec(cls, spec: str, *, _mixed_part: bool = False) -> Resources:
        """Parse the command-line form ``KIND[:key=value,...]``, e.g. ``gpu:count=1,memory=16Gi``,
        ``gpu:accelerator=T4,memory=8G`` or ``cpu:cpu=8``.

        ``_mixed_part`` (internal): the spec is one part of a mixed candidate
        (:meth:`heteroflow.components.replicas.Replicas.parse_spec`), whose own message names the job's options, so a
        misspelled field is not said to be "an option of a mixed candidate only".

        Raises:
            InvalidResources: malformed spec, unknown key, a key given twice (``cpu:cpu=2,cpu=4``, or ``kind=``
                beside the ``KIND:`` prefix) or invalid value.
        """
        if "+" in spec and cls is Resources:  # gpu:count=2+npu:count=4: a mixed candidate (heteroflow.components.replicas)
            from heteroflow.components.replicas import MixedResources

            return MixedResources.parse_spec(spec)
        given = spec
        if ":" not in spec and "," in spec and "=" in spec:  # gpu,count=1: the kind's colon left out
            spec = spec.replace(",", ":", 1)
        kind, _, rest = spec.partition(":")
        if ";" in rest and "=" in rest.partition(";")[2]:
            raise InvalidResources(
                f"candidate {spec!r}: fields are separated by ',', not ';' (e.g. gpu:count=1,memory=16Gi)"
            )
        from heteroflow.components.replicas import JOB_OPTIONS  # a mixed job's options (replicas imports this module)

        fields: dict[str, Any] = {"kind": kind}
        written: dict[str, str] = {}
        for item in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, value = item.partition("=")
            if not eq:
                raise InvalidResources(f"candidate {spec!r}: {item!r} is not key=value (e.g. gpu:count=1,memory=16Gi)")
            key = key.strip()
            if key == "kind":
                raise InvalidResources(
                    f"candidate {spec!r}: the kind is given twice ({kind!r} before the colon and kind={value.strip()}); "
                    "write it once, before the colon (e.g. gpu:count=1)"
                )
            if key in written:
                raise InvalidResources(
                    f"candidate {spec!r}: {key} is given twice ({written[key]} and {item}); give each key once"
                )
            written[key] = item
            if key in JOB_OPTIONS:
                raise InvalidResources(
                    f"candidate {given!r}: {key} is an option of a mixed candidate, whose kinds train one job together "
                    f"and exchange gradients (kinds joined by '+', e.g. gpu+npu,{key}={value.strip()}); a candidate of "
                    "one kind has no exchange between kinds")
            if key in ("count", "nodes"):
                try:
                    fields[key] = int(value)
                except ValueError:
                    what = "devices" if key == "count" else "nodes"
                    raise InvalidResources(
                        f"{key}={value!r} in candidate {spec!r} is not an integer; valid: a whole number of {what}"
                    ) from None
            else:
                fields[key] = value.strip()
        try:
            return cls.from_dict(fields)
        except InvalidResources as exc:
            # a misspelled job option on a candidate of one kind ('gpu:compresion=fp16'): the suggestion alone sent
            # the user to an option this candidate cannot take
            import difflib

            closest = (difflib.get_close_matches(str(key).lower(), [*_FIELDS, *JOB_OPTIONS], n=1) for key in sorted(set(fields) - set(_FIELDS), key=str))
            meant = [m[0] for m in closest if m and m[0] in JOB_OPTIONS]
            if _mixed_part or not meant or not str(exc).startswith("unknown resource field"):
                raise
            raise InvalidResources(
                f"{exc}; {', '.join(meant)} {'is an option' if len(meant) == 1 else 'are options'} of a mixed candidate only, whose "
                f"kinds train one job together (kinds joined by '+', e.g. gpu+npu,{meant[0]}=...)") from None


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
        given = list(options)
        items: list[Resources] = []
        for i, opt in enumerate(given):
            if isinstance(opt, Resources):
                items.append(opt)
            elif isinstance(opt, str):
                items.append(Resources.parse_spec(opt))
            elif isinstance(opt, Mapping):
                items.append(Resources.from_dict(opt))
            elif isinstance(opt, (list, tuple)):  # [Replicas("gpu", 2), Replicas("npu", 4)]: a mixed candidate
                from heteroflow.components.replicas import MixedResources

                items.append(MixedResources.of(opt))
            else:
                raise InvalidResources(f"candidates[{i}]={opt!r} is not a Resources, a mapping, a 'KIND:...' spec or a list of Replicas")
        if not items:
            raise InvalidResources("candidates is empty; give at least one Resources, e.g. Resources(kind='cpu')")
        twice = first_duplicate(items)
        if twice is not None:
            first, second = twice
            written = [given[i] for i in twice]
            how = "" if all(isinstance(w, Resources) for w in written) else f" (written {' and '.join(map(repr, written))})"
            raise InvalidResources(
                f"candidates lists the same Resources twice: candidates[{first}] and candidates[{second}] are both "
                f"{items[first].describe()}{how}; each fallback must differ"
            )
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


# --- Retry policy: defined in heteroflow.components.core.retry, re-exported here for existing imports -------------

from heteroflow.components.core.retry import RetryPolicy  # noqa: E402
