"""Where train runs: the torch device of a device string, the device kind of a torch device type, and the worker
processes a candidate trains with (split out of :mod:`heteroflow.components.training.step`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from heteroflow.components.errors import DeviceUnavailable, InvalidParameter

if TYPE_CHECKING:
    import torch

    from heteroflow.components.resources import Resources

__all__ = ["distributed_workers", "resolve_device"]


def resolve_device(device: str) -> torch.device:
    """Turn a device string (``cpu``, ``cuda``, ``cuda:1``, ``npu``) into a usable ``torch.device``.

    Raises:
        DeviceUnavailable: the device type is absent here (a device failure: the caller may fall back).
        InvalidParameter: not a device string torch knows.
    """
    import torch

    from heteroflow.components.devices import all_kinds, for_torch_device_type

    if isinstance(device, str):
        named = for_torch_device_type(device.partition(":")[0].strip())
        if named is not None:  # e.g. torch_npu registers the "npu" device type; without it torch rejects the string
            named.import_backend(device)
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        valid = ", ".join(t for k in all_kinds() for t in ((k.torch_device_type, f"{k.torch_device_type}:N") if k.has_devices else (k.torch_device_type,)))
        raise InvalidParameter(f"device={device!r} is not a torch device; valid: {valid}") from None
    kind = for_torch_device_type(dev.type)
    if kind is not None and kind.has_devices and kind.torch_namespace(torch) is not None:
        if not kind.is_available(torch):
            raise DeviceUnavailable(f"device={device!r}: no {kind.device_noun} is available to this process")
    elif dev.type != "meta" and (kind is None or not kind.is_host):
        # other accelerators (xpu, hpu, mps, ...): torch's device-agnostic API (torch >= 2.6) says what is here
        acc = getattr(torch, "accelerator", None)
        current = acc.current_accelerator() if acc is not None and acc.is_available() else None
        if current is None or current.type != dev.type:
            raise DeviceUnavailable(f"device={device!r}: no {dev.type} device is available to this process")
    if (kind is None or not kind.is_host) and dev.index is None:
        # the process's current device of that type (the one CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES leave)
        acc = getattr(torch, "accelerator", None)
        if acc is not None and acc.is_available() and acc.current_accelerator().type == dev.type:
            dev = torch.device(dev.type, acc.current_device_index())
    return dev


def _kind_of_type(device_type: str) -> str | None:
    """The kind name whose torch device type is ``device_type`` (``cuda`` -> ``gpu``), or None."""
    from heteroflow.components.devices import for_torch_device_type

    kind = for_torch_device_type(device_type)
    return None if kind is None else kind.value


def distributed_workers(resources: Resources | None) -> int:
    """Worker processes train starts for a candidate: its device ``count`` when that is more than 1 on an
    accelerator kind (one process per device, :func:`heteroflow.components.training.distributed.launch`), else 1 (this
    process). A CPU candidate's ``cpu`` is threads of one process."""
    if resources is None:
        return 1
    from heteroflow.components.devices import DeviceKind

    count = int(resources.count or 0)
    return count if DeviceKind.parse(resources.kind).has_devices and count > 1 else 1
