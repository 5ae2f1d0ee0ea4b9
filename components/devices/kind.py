"""The device-kind object: one value per kind (``cpu``, ``gpu``, ``npu``, a plugin's ``tpu``) carrying its facts.

A :class:`DeviceKind` is a ``str`` subclass: it equals its name (``DeviceKind.GPU == "gpu"``), hashes like it,
and renders as it in JSON, f-strings and ``str()``; ``.value`` gives the plain ``str``. Calling the class with
one positional value looks a registered kind up (``DeviceKind("gpu")``, ``DeviceKind("cuda")``); calling it
with keywords defines a new kind (``DeviceKind(name="tpu", torch_device_type="xla", ...)``), which
:func:`~heteroflow.components.devices.register` then registers. ``DeviceKind.GPU`` (any registered name in upper
case) and ``for kind in DeviceKind`` work as they did for the former enum.

Facts about the built-in kinds come from ``shared/accelerators.md`` (PyTorch device types and backends [PD, TN],
extended resources [NVR, MCA], node labels [GFD, GKE, MCK]); see ``builtin.py``.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from heteroflow.components.errors import DeviceUnavailable, InvalidResources

__all__ = ["DeviceKind", "FailurePattern", "Probe", "device_bf16"]

FAILURE_CLASSES = ("device", "transient", "permanent")
"""The failure classes a pattern may name (the values of :class:`heteroflow.components.core.failures.FailureClass`)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FailurePattern:
    """An exception a kind's runtime raises, and the failure class the classifier gives it.

    It matches an exception when ``torch_types`` names (a base of) its torch type, or when it is an instance of
    ``exception_types`` (any type when empty) and its message contains one of ``messages``.

    Attributes:
        rule: the rule's name as the classifier reports it (``"CUDA/NCCL driver or runtime error"``).
        failure_class: ``"device"``, ``"transient"`` or ``"permanent"``.
        messages: message fragments, any of which matches (case-sensitive).
        exception_types: the builtin exception types the message rule applies to; empty: any.
        torch_types: names of torch exception types that match whatever their message (``"AcceleratorError"``).

    Raises:
        InvalidResources: an unknown ``failure_class``, or a pattern that can match nothing.
    """

    rule: str
    failure_class: str
    messages: tuple[str, ...] = ()
    exception_types: tuple[type[BaseException], ...] = ()
    torch_types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.failure_class not in FAILURE_CLASSES:
            raise InvalidResources(
                f"failure_class={self.failure_class!r} is unknown; valid: {', '.join(FAILURE_CLASSES)}"
            )
        if not (self.messages or self.torch_types):
            raise InvalidResources(f"failure pattern {self.rule!r} has neither messages nor torch_types; valid: at least one")

    def matches(self, exc: BaseException) -> bool:
        """Whether ``exc`` is an exception this pattern describes."""
        if self.torch_types and any(
            t.__module__.split(".")[0] == "torch" and t.__name__ in self.torch_types for t in type(exc).__mro__
        ):
            return True
        if self.exception_types and not isinstance(exc, self.exception_types):
            return False
        text = str(exc)
        return any(m in text for m in self.messages)


@dataclasses.dataclass(frozen=True, slots=True)
class Probe:
    """What probing this process found for one kind.

    Attributes:
        count: devices usable here (0 when none).
        note: why there are none (empty when there are some).
        names: the device name of each device (``("NVIDIA H200", "NVIDIA H200")``), or None when unknown.
    """

    count: int
    note: str = ""
    names: tuple[str, ...] | None = None


class _DeviceKindType(type):
    """Metaclass: ``DeviceKind("gpu")`` looks up, ``DeviceKind(name=...)`` defines, ``DeviceKind.GPU`` and
    iteration read the registry."""

    def __call__(cls, value: Any = None, /, **spec: Any) -> Any:
        if spec:
            if value is not None:
                raise TypeError("DeviceKind(): give either one kind to look up, or keywords to define one")
            return cls._define(**spec)
        from heteroflow.components.devices.registry import get

        return get(value)

    def __getattr__(cls, attr: str) -> Any:
        if attr.isupper() and not attr.startswith("_"):
            from heteroflow.components.devices.registry import find

            kind = find(attr.lower(), aliases=False)
            if kind is not None:
                return kind
        raise AttributeError(f"type object {cls.__name__!r} has no attribute {attr!r}")

    def __iter__(cls) -> Iterator[Any]:
        from heteroflow.components.devices.registry import all_kinds

        return iter(all_kinds())

    def __len__(cls) -> int:
        from heteroflow.components.devices.registry import all_kinds

        return len(all_kinds())


class DeviceKind(str, metaclass=_DeviceKindType):
    """A kind of device a step can run on, and everything heteroflow knows about it.

    Define one with keywords (all but ``name`` optional); the built-ins are in ``builtin.py``.

    Args (keyword-only):
        name: the kind's name, lower case (``"gpu"``); what records, candidates and compiled YAML show.
        aliases: other names that parse to it (``("cuda",)``), matched case-insensitively.
        description: one line for help texts.
        has_devices: False for the host CPU (a candidate of it asks for no devices: count 0, always present).
        torch_device_type: the ``torch.device`` type that drives it (``"cuda"``, ``"npu"``, ``"cpu"``).
        torch_module: a module to import before torch knows ``torch_device_type`` (``"torch_npu"``), or None.
        device_noun: how messages name one device (``"CUDA device"``, ``"Ascend NPU"``); default
            ``"<torch_device_type> device"``.
        distributed_backend: the ``torch.distributed`` backend (``"nccl"``, ``"hccl"``, ``"gloo"``).
        bf16: whether every device of the kind computes in bfloat16 (True for a kind whose every generation does,
            e.g. Gaudi [HF]); None (default): it differs by model, so the accelerator registry or torch answers
            (``torch.<type>.is_bf16_supported()``). The ``auto`` precision and ``precision="bf16"`` candidates
            of a kind without registry models read it.
        default_accelerator: the accelerator-registry key a candidate of this kind asks for when it names none
            (``"nvidia-gpu"``), or None.
        resource_name: the Kubernetes extended resource when the accelerator registry has no entry for the kind
            (a plugin's ``"google.com/tpu"``), or None.
        node_label_keys: node labels whose value names the device model (``nvidia.com/gpu.product``).
        device_files: driver device files; when none exists the probe answers 0 without importing torch.
        driver_name: how the "no driver" note names the driver (``"GPU"``, ``"Ascend"``).
        synchronizes: whether timing waits for the device (``torch.<type>.synchronize``).
        profiler_activity: the ``torch.profiler.ProfilerActivity`` member for device time (``"CUDA"``), or None.
        tracks_peak_memory: whether ``torch.<type>.max_memory_allocated`` gives the device's peak memory.
        failure_patterns: exceptions of its runtime and their failure class, for the classifier.
        simulated_device_type: the torch device type a simulated candidate of this kind runs on (``"cpu"``).
        probe_hook: ``f(kind, torch) -> Probe`` counting the devices here; default: ``torch.<type>``'s
            ``is_available()`` and ``device_count()``.
        model_names_hook: ``f(torch) -> list[str]``: the name of each device (for per-model counts).

    Raises:
        InvalidResources: a name that is empty or not lower case, or a field of the wrong type.
    """

    # no __slots__: str subclasses cannot have them; attributes live in __dict__ and are read-only.
    name: str
    aliases: tuple[str, ...]
    description: str
    has_devices: bool
    torch_device_type: str
    torch_module: str | None
    device_noun: str
    distributed_backend: str
    bf16: bool | None
    default_accelerator: str | None
    resource_name: str | None
    node_label_keys: tuple[str, ...]
    device_files: tuple[str, ...]
    driver_name: str
    synchronizes: bool
    profiler_activity: str | None
    tracks_peak_memory: bool
    failure_patterns: tuple[FailurePattern, ...]
    simulated_device_type: str
    probe_hook: Callable[[DeviceKind, Any], Probe] | None
    model_names_hook: Callable[[Any], list[str]] | None

    @classmethod
    def _define(
        cls,
        *,
        name: str,
        aliases: tuple[str, ...] = (),
        description: str = "",
        has_devices: bool = True,
        torch_device_type: str | None = None,
        torch_module: str | None = None,
        device_noun: str | None = None,
        distributed_backend: str = "gloo",
        bf16: bool | None = None,
        default_accelerator: str | None = None,
        resource_name: str | None = None,
        node_label_keys: tuple[str, ...] = (),
        device_files: tuple[str, ...] = (),
        driver_name: str | None = None,
        synchronizes: bool = False,
        profiler_activity: str | None = None,
        tracks_peak_memory: bool = False,
        failure_patterns: tuple[FailurePattern, ...] = (),
        simulated_device_type: str = "cpu",
        probe_hook: Callable[[DeviceKind, Any], Probe] | None = None,
        model_names_hook: Callable[[Any], list[str]] | None = None,
    ) -> DeviceKind:
        if not isinstance(name, str) or not name or name != name.strip().lower() or "," in name or ":" in name:
            raise InvalidResources(f"name={name!r} is not a device-kind name; valid: a non-empty lower-case word")
        if isinstance(aliases, str):
            raise InvalidResources(f"aliases={aliases!r} is a string; valid: a tuple of names")
        for f, v in (("node_label_keys", node_label_keys), ("device_files", device_files), ("failure_patterns", failure_patterns)):
            if isinstance(v, str):
                raise InvalidResources(f"{f}={v!r} is a string; valid: a tuple")
        if not all(isinstance(p, FailurePattern) for p in failure_patterns):
            raise InvalidResources("failure_patterns: valid: FailurePattern values only")
        obj = str.__new__(cls, name)
        dtype = torch_device_type or name
        values = dict(
            name=name,
            aliases=tuple(a.strip().lower() for a in aliases),
            description=description,
            has_devices=bool(has_devices),
            torch_device_type=dtype,
            torch_module=torch_module,
            device_noun=device_noun or f"{dtype} device",
            distributed_backend=distributed_backend,
            bf16=None if bf16 is None else bool(bf16),
            default_accelerator=default_accelerator,
            resource_name=resource_name,
            node_label_keys=tuple(node_label_keys),
            device_files=tuple(device_files),
            driver_name=driver_name or name.upper(),
            synchronizes=bool(synchronizes),
            profiler_activity=profiler_activity,
            tracks_peak_memory=bool(tracks_peak_memory),
            failure_patterns=tuple(failure_patterns),
            simulated_device_type=simulated_device_type,
            probe_hook=probe_hook,
            model_names_hook=model_names_hook,
        )
        obj.__dict__.update(values)
        return obj

    def __setattr__(self, attr: str, value: Any) -> None:
        raise AttributeError(f"DeviceKind {self.value!r} is read-only ({attr})")

    def __delattr__(self, attr: str) -> None:
        raise AttributeError(f"DeviceKind {self.value!r} is read-only ({attr})")

    def __repr__(self) -> str:
        return f"DeviceKind({str.__str__(self)!r})"

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return format(str.__str__(self), spec)

    __hash__ = str.__hash__

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        from heteroflow.components.devices.registry import get

        return (get, (str.__str__(self),))

    def __copy__(self) -> DeviceKind:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> DeviceKind:
        return self

    @property
    def value(self) -> str:
        """The kind's name as a plain ``str`` (``"gpu"``), as the former enum's ``.value`` gave it."""
        return str.__str__(self)

    @classmethod
    def parse(cls, value: DeviceKind | str, *, field: str = "kind") -> DeviceKind:
        """Return the registered kind named by ``value`` (a name or alias, case-insensitive, spaces stripped).

        Raises:
            InvalidResources: ``value`` names no registered kind; the message names ``field`` and lists the
                registered kinds.
        """
        from heteroflow.components.devices.registry import get

        return get(value, field=field)

    @classmethod
    def host(cls) -> DeviceKind:
        """The host CPU's kind: the first registered kind that asks for no devices (the built-in ``cpu``).

        What a candidate that names no kind and no accelerator runs on, the kind every inventory has, and the
        model name of a node without devices."""
        from heteroflow.components.devices.registry import host_kind

        return host_kind()

    @property
    def is_host(self) -> bool:
        """Whether this is a host kind (asks for no devices: no device index, ``set_device`` or DDP device ids)."""
        return not self.has_devices

    # -- behaviour -----------------------------------------------------------------------------------------

    def _driven_type(self, device_type: str | None) -> str | None:
        """The torch device type a replica of this kind drives (``device_type``, default its own), or None when
        that is the host's (a host kind, or a simulated replica on the host)."""
        from heteroflow.components.devices.registry import is_host_device_type

        dtype = device_type or self.torch_device_type
        if self.is_host or is_host_device_type(dtype):
            return None
        return dtype

    def torch_device(self, index: int | None = None, *, device_type: str | None = None) -> Any:
        """The ``torch.device`` of device ``index`` of this kind (``cuda:1``); a host kind's has no index
        (``cpu`` whatever ``index``), and ``index`` None gives the type alone (torch's current device of it).

        Args:
            index: the device index, >= 0, or None.
            device_type: the torch device type when the replica's accelerator model is driven by another type
                than the kind's own (Gaudi's ``hpu`` for ``npu``), or the host's for a simulated replica;
                default :attr:`torch_device_type`.

        Raises:
            DeviceUnavailable: :attr:`torch_module` is not installed (torch does not know the device type).
        """
        import torch

        dtype = self._driven_type(device_type)
        if dtype is None:
            return torch.device(device_type or self.torch_device_type)
        if dtype == self.torch_device_type:
            self.import_backend()
        return torch.device(dtype) if index is None else torch.device(dtype, int(index))

    def set_device(self, index: int, *, device_type: str | None = None, torch: Any | None = None) -> None:
        """Make device ``index`` of this kind the process's current one (what a worker does with its local rank
        before it builds a model or a process group): ``torch.<type>.set_device(index)`` (``torch.cuda``, or
        ``torch.npu`` once :attr:`torch_module` is imported), else, for a type torch's device-agnostic API drives,
        ``torch.accelerator.set_device_index(index)``; nothing on the host (a host kind, a simulated replica), or
        when torch has neither.

        Args:
            index: the device index, >= 0 (a worker's local rank among the workers of its kind).
            device_type: as for :meth:`torch_device`.
            torch: the torch module (default: imported here).

        Raises:
            DeviceUnavailable: :attr:`torch_module` is not installed.
        """
        dtype = self._driven_type(device_type)
        if dtype is None:
            return
        if torch is None:
            import torch  # noqa: PLC0415
        if dtype == self.torch_device_type:
            self.import_backend()
        setter = getattr(getattr(torch, dtype, None), "set_device", None)
        if callable(setter):
            setter(int(index))
            return
        acc = getattr(torch, "accelerator", None)
        if acc is not None and acc.is_available() and acc.current_accelerator().type == dtype:
            acc.set_device_index(int(index))

    def ddp_device_ids(self, device: Any) -> list[int] | None:
        """``DistributedDataParallel``'s ``device_ids`` for a replica of this kind on ``device`` (a
        ``torch.device``): ``[device.index]`` on an accelerator device with an index; None on a host kind, on the
        host (a simulated kind's replica), or without an index."""
        if self._driven_type(device.type) is None or device.index is None:
            return None
        return [int(device.index)]

    def import_backend(self, device: str | None = None) -> None:
        """Import :attr:`torch_module` (which registers the device type with torch), if the kind needs one.

        Raises:
            DeviceUnavailable: the module is not installed (a device failure: the caller may fall back).
        """
        if self.torch_module is None:
            return
        try:
            importlib.import_module(self.torch_module)
        except ImportError:
            where = f"device={device!r}: " if device is not None else ""
            raise DeviceUnavailable(f"{where}{self.missing_module_note}") from None

    @property
    def missing_module_note(self) -> str:
        """The note for a kind whose :attr:`torch_module` is not installed."""
        return f"{self.torch_module} is not installed ({self.device_noun}s need it)"

    def torch_namespace(self, torch: Any) -> Any:
        """``torch.<torch_device_type>`` (``torch.cuda``), or None when torch has no such module."""
        return getattr(torch, self.torch_device_type, None)

    def is_available(self, torch: Any) -> bool:
        """Whether torch can use a device of this kind in this process (CPU: always)."""
        if not self.has_devices:
            return True
        mod = self.torch_namespace(torch)
        check = getattr(mod, "is_available", None)
        return bool(check()) if callable(check) else False

    def probe(self, torch: Any | None = None) -> Probe:
        """Count the devices of this kind that PyTorch can use here, with their names where the kind tells them.

        Imports torch (and :attr:`torch_module`) only when a driver device file of the kind exists (or, for a
        kind that names no device file, when it has a :attr:`probe_hook`): without one no device can be opened,
        and the probe answers at once. The host CPU counts as one device.
        """
        if not self.has_devices:
            return Probe(1)
        if self.device_files and not any(os.path.exists(p) for p in self.device_files):
            return Probe(0, f"no {self.driver_name} driver device file here ({', '.join(self.device_files)})")
        if not self.device_files and self.probe_hook is None:
            return Probe(0, f"heteroflow cannot detect {self.value} devices here (the kind names no driver device "
                            "file or probe); simulate them or give an inventory")
        if torch is None:
            import torch  # noqa: PLC0415
        if self.probe_hook is not None:
            return self.probe_hook(self, torch)
        if self.torch_module is not None:
            try:
                importlib.import_module(self.torch_module)
            except ImportError:
                return Probe(0, self.missing_module_note)
        if not self.is_available(torch):
            return Probe(0, f"{self.torch_module or 'torch'} imports but torch.{self.torch_device_type}.is_available() is False")
        return Probe(int(self.torch_namespace(torch).device_count()), "", self.device_names(torch))

    def device_names(self, torch: Any) -> tuple[str, ...] | None:
        """The name of each device here (``("NVIDIA H200", ...)``), or None when the kind cannot tell."""
        if self.model_names_hook is None:
            return None
        return tuple(self.model_names_hook(torch))

    def bf16_supported(self, device: Any) -> bool:
        """Whether ``device`` (a ``torch.device`` of this kind) computes in bfloat16: the kind's :attr:`bf16` when
        it states one, else ``torch.<type>.is_bf16_supported()`` (the CPU: True; False when torch cannot tell)."""
        if not self.has_devices:
            return True
        if self.bf16 is not None:
            return self.bf16
        return device_bf16(device)

    def synchronize(self, device: Any) -> None:
        """Wait for the work queued on ``device`` (a no-op unless :attr:`synchronizes`)."""
        if not self.synchronizes or device.type == "cpu":
            return
        import torch

        getattr(torch, device.type).synchronize(device)

    def reset_peak_memory(self, device: Any) -> None:
        """Reset the device's memory high-water mark (a no-op unless :attr:`tracks_peak_memory`)."""
        if not self.tracks_peak_memory or device.type == "cpu":
            return
        import torch

        getattr(torch, device.type).reset_peak_memory_stats(device)

    def peak_memory_bytes(self, device: Any) -> int | None:
        """The device's memory high-water mark in bytes, or None unless :attr:`tracks_peak_memory`."""
        if not self.tracks_peak_memory or device.type == "cpu":
            return None
        import torch

        return int(getattr(torch, device.type).max_memory_allocated(device))

    def classify(self, exc: BaseException) -> FailurePattern | None:
        """The first of :attr:`failure_patterns` that ``exc`` matches, or None."""
        for p in self.failure_patterns:
            if p.matches(exc):
                return p
        return None


def device_bf16(device: Any) -> bool:
    """Whether ``device`` (any ``torch.device``) computes in bfloat16: the CPU does; otherwise
    ``torch.<type>.is_bf16_supported()``, False when torch cannot tell or the check raises."""
    import torch

    if device.type == "cpu":
        return True
    mod = getattr(torch, device.type, None)
    check = getattr(mod, "is_bf16_supported", None)
    try:
        return bool(check()) if callable(check) else False
    except Exception:  # noqa: BLE001 - a backend that raises instead of answering
        return False
