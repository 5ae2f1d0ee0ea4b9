"""Devices and precision of a training run: the autocast dtype a precision means on a device
(:func:`resolve_precision`, from the accelerator registry), the ``GradScaler`` fp16 needs (:func:`make_scaler`), one
scaled optimizer step that says whether the scaler skipped it (:func:`scaled_step`), and waiting for a device's
queued work before timing it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from heteroflow.components.errors import InvalidParameter

if TYPE_CHECKING:  # torch is imported where it is used: train's parameter checks import this module
    import torch

__all__ = ["PRECISIONS", "make_scaler", "resolve_precision", "scaled_step"]

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def resolve_precision(precision: str, device: torch.device, *, bf16: bool | None = None) -> torch.dtype | None:
    """The autocast dtype for ``precision`` on ``device`` (None: fp32, no autocast).

    ``auto``: fp32 on the CPU (a kind without devices); on an accelerator bf16 when it computes in bf16 (``bf16``
    from the accelerator registry, :mod:`heteroflow.components.devices.accelerators`; unknown: the device kind's
    :attr:`~heteroflow.components.devices.DeviceKind.bf16`, else asked of torch), else fp16 (with a GradScaler).

    Raises:
        InvalidParameter: an unknown precision, or bf16/fp16 asked of a device that lacks it.
    """
    import torch

    if precision not in PRECISIONS:
        raise InvalidParameter(f"precision={precision!r} is unknown; valid: {', '.join(PRECISIONS)}")
    if precision == "fp32" or (precision == "auto" and _on_host(device)):
        return None
    if precision == "fp16":
        return torch.float16
    if bf16 is None:
        bf16 = _device_bf16(device)
    if precision == "bf16":
        return torch.bfloat16
    return torch.bfloat16 if bf16 else torch.float16


def _on_host(device: torch.device) -> bool:
    """Whether ``device`` is the host CPU (the torch type of a kind without devices), where ``auto`` means fp32."""
    from heteroflow.components.devices import is_host_device_type

    return is_host_device_type(device.type)


def _device_bf16(device: torch.device) -> bool:
    from heteroflow.components.devices import for_torch_device_type
    from heteroflow.components.devices.kind import device_bf16

    kind = for_torch_device_type(device.type)
    return kind.bf16_supported(device) if kind is not None else device_bf16(device)


def _synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` when its kind says timing must (``gpu``)."""
    from heteroflow.components.devices import for_torch_device_type

    kind = for_torch_device_type(device.type)
    if kind is not None:
        kind.synchronize(device)


def make_scaler(dtype: torch.dtype | None, device: torch.device) -> Any:
    """A ``torch.amp.GradScaler`` for fp16 autocast (None otherwise: bf16 and fp32 need none)."""
    import torch

    if dtype is not torch.float16:
        return None
    return torch.amp.GradScaler(device.type)


def scaled_step(scaler: Any, loss: torch.Tensor, optimizer: Any) -> torch.Tensor:
    """Backpropagate ``loss`` through ``scaler`` (a ``torch.amp.GradScaler``), take ``optimizer``'s step and update
    the scale, in ``GradScaler``'s documented order; return whether the scaler skipped the step.

    A scaler skips the optimizer step when the unscaled gradients hold an inf or NaN, and then multiplies its scale
    by ``backoff_factor`` (< 1; it never lowers the scale otherwise), so a lower scale after ``update()`` is a
    skipped step: the test the PyTorch maintainers give for not stepping an LR scheduler then
    (pytorch/pytorch#55585). The comparison stays on the device: nothing waits for it until it is read.

    Returns:
        A 0-dim bool tensor on the scale's device: True when the step was skipped (False for a disabled scaler).
    """
    import torch

    scaler.scale(loss).backward()  # scale() creates the scale tensor on its first call
    if not scaler.is_enabled():  # disabled (torch.amp.GradScaler("cuda") without CUDA): a plain step
        optimizer.step()
        return torch.zeros((), dtype=torch.bool)
    scale = scaler._get_scale_async()  # the scale tensor itself (GradScaler.get_scale() would wait for the device)
    before = scale.detach().clone()
    scaler.step(optimizer)
    scaler.update()
    return scaler._get_scale_async() < before  # type: ignore[no-any-return]
