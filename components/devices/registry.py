"""The registry of device kinds: the built-ins, kinds registered in code, and kinds from entry points.

Third-party packages add a kind through the entry-point group ``heteroflow.devices`` (:data:`ENTRY_POINT_GROUP`);
the entry point's object is a :class:`~heteroflow.components.devices.DeviceKind`, an iterable of them, or a
callable without arguments returning either. Entry points load lazily (on the first lookup of a name that is
not registered yet, or the first listing of every kind) and once.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Iterable
from typing import Any

from heteroflow.components.devices.kind import DeviceKind
from heteroflow.components.errors import InvalidResources

__all__ = [
    "ENTRY_POINT_GROUP", "all_kinds", "cross_kind_backend", "find", "for_torch_device_type", "get", "has_devices",
    "host_kind", "is_host_device_type", "load_plugins", "register", "unregister",
]

ENTRY_POINT_GROUP = "heteroflow.devices"
"""The entry-point group third-party device kinds register under."""

_KINDS: dict[str, DeviceKind] = {}
_ALIASES: dict[str, str] = {}
_LOCK = threading.RLock()
_state = {"builtins": False, "plugins": False}


def _ensure_builtins() -> None:
    if _state["builtins"]:
        return
    with _LOCK:
        if _state["builtins"]:
            return
        _state["builtins"] = True
        from heteroflow.components.devices import builtin

        for kind in builtin.BUILTINS:
            register(kind)


def register(kind: DeviceKind, *, replace: bool = False) -> DeviceKind:
    """Register ``kind`` and return it.

    Args:
        kind: a kind defined with ``DeviceKind(name=..., ...)``.
        replace: allow replacing a registered kind of the same name.

    Raises:
        InvalidResources: ``kind`` is not a :class:`DeviceKind`, or its name or one of its aliases is taken by
            another kind (and ``replace`` is False).
    """
    if not isinstance(kind, DeviceKind):
        raise InvalidResources(f"kind={kind!r} is not a DeviceKind; valid: DeviceKind(name=..., ...)")
    with _LOCK:
        _ensure_builtins()  # the built-ins first, so a plugin cannot take their names by registering early
        name = kind.value
        old = _KINDS.get(name)
        if old is not None and old is not kind and not replace:
            raise InvalidResources(f"device kind {name!r} is already registered; valid: a new name, or replace=True")
        for alias in kind.aliases:
            owner = _ALIASES.get(alias) or (alias if alias in _KINDS else None)
            if owner is not None and owner != name:
                raise InvalidResources(f"alias {alias!r} of device kind {name!r} already names {owner!r}; valid: another alias")
        if old is not None:
            for a in old.aliases:
                _ALIASES.pop(a, None)
        _KINDS[name] = kind
        for alias in kind.aliases:
            _ALIASES[alias] = name
    return kind


def unregister(kind: DeviceKind | str) -> DeviceKind:
    """Remove a kind that was registered in code or by a plugin (tests, and a host that unloads a plugin), with its
    aliases; return it. Values that hold it keep working as strings, and a lookup of its name fails again.

    Raises:
        InvalidResources: ``kind`` names no registered kind, or a built-in one (``cpu``, ``gpu``, ``npu``: every
            run relies on them).
    """
    from heteroflow.components.devices import builtin

    with _LOCK:
        _ensure_builtins()
        name = _key(kind.value if isinstance(kind, DeviceKind) else str(kind))
        name = _ALIASES.get(name, name)
        if name in {k.value for k in builtin.BUILTINS}:
            raise InvalidResources(f"device kind {name!r} is built in and cannot be unregistered; valid: a kind registered later")
        old = _KINDS.pop(name, None)
        if old is None:
            raise InvalidResources(f"device kind {name!r} is not registered; valid: {', '.join(_KINDS)}")
        for alias in old.aliases:
            _ALIASES.pop(alias, None)
    accelerators = sys.modules.get("heteroflow.components.devices.accelerators")
    if accelerators is not None:  # its model standing for the kind is cached by name
        accelerators._default_accelerator.cache_clear()
    return old


def _accept(obj: Any, source: str) -> list[DeviceKind]:
    if callable(obj) and not isinstance(obj, DeviceKind):
        obj = obj()
    items = [obj] if isinstance(obj, (DeviceKind, str)) else list(obj) if isinstance(obj, Iterable) else [obj]
    bad = [i for i in items if not isinstance(i, DeviceKind)]
    if bad:
        raise InvalidResources(f"entry point {source}: {bad[0]!r} is not a DeviceKind; valid: DeviceKind(name=...)")
    return items


def load_plugins(*, force: bool = False) -> tuple[DeviceKind, ...]:
    """Load the kinds of the ``heteroflow.devices`` entry points (once; again with ``force``).

    A plugin that fails to load is skipped with a :class:`RuntimeWarning` naming it, so one broken package
    cannot stop every run.

    Returns:
        The kinds the entry points registered this time.
    """
    _ensure_builtins()
    with _LOCK:
        if _state["plugins"] and not force:
            return ()
        _state["plugins"] = True
        from importlib.metadata import entry_points

        added: list[DeviceKind] = []
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            source = f"{ep.name} = {ep.value}"
            try:
                for kind in _accept(ep.load(), source):
                    if _KINDS.get(kind.value) is not kind:
                        added.append(register(kind))
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not break every run
                warnings.warn(f"heteroflow: device-kind plugin {source!r} ({ENTRY_POINT_GROUP}) not loaded: {exc}",
                              RuntimeWarning, stacklevel=2)
        return tuple(added)


def _key(value: str) -> str:
    return value.strip().lower()


def find(value: str, *, aliases: bool = True) -> DeviceKind | None:
    """The registered kind named ``value`` (name, or alias when ``aliases``), loading plugins if needed; or
    None."""
    _ensure_builtins()
    key = _key(value)
    for attempt in range(2):
        kind = _KINDS.get(key)
        if kind is None and aliases and key in _ALIASES:
            kind = _KINDS.get(_ALIASES[key])
        if kind is not None or attempt or _state["plugins"]:
            return kind
        load_plugins()
    return None


def get(value: DeviceKind | str, *, field: str = "kind") -> DeviceKind:
    """The registered kind named by ``value`` (a :class:`DeviceKind`, a name or an alias; case-insensitive).

    Raises:
        InvalidResources: ``value`` names no registered kind; the message names ``field`` and lists them.
    """
    if isinstance(value, DeviceKind):
        registered = find(value.value, aliases=False)
        if registered is not None:
            return registered
        return value
    kind = find(value) if isinstance(value, str) else None
    if kind is None:
        valid = ", ".join(k.value for k in all_kinds())
        import difflib

        names = [k.value for k in all_kinds()] + sorted(_ALIASES)
        close = difflib.get_close_matches(_key(value), names, n=1, cutoff=0.6) if isinstance(value, str) and value.strip() else []
        hint = f"; did you mean {(_ALIASES.get(close[0]) or close[0])!r}?" if close else ""
        raise InvalidResources(f"{field}={value!r} is not a device kind; valid kinds: {valid}{hint}")
    return kind


def all_kinds() -> tuple[DeviceKind, ...]:
    """Every registered kind (built-ins first, then in registration order), plugins loaded."""
    load_plugins()
    return tuple(_KINDS.values())


def for_torch_device_type(device_type: str) -> DeviceKind | None:
    """The first registered kind whose :attr:`~DeviceKind.torch_device_type` is ``device_type`` (``"cuda"`` ->
    ``gpu``), or None (plugins are loaded first)."""
    for kind in all_kinds():
        if kind.torch_device_type == device_type:
            return kind
    return None


def host_kind() -> DeviceKind:
    """The host CPU's kind: the first registered kind that asks for no devices (the built-in ``cpu``, which
    cannot be unregistered, so there always is one)."""
    _ensure_builtins()
    with _LOCK:
        for kind in _KINDS.values():
            if not kind.has_devices:
                return kind
    raise AssertionError("no host device kind is registered")  # pragma: no cover - cpu is built in


def cross_kind_backend() -> str:
    """The ``torch.distributed`` backend of a process group whose ranks are on devices of different kinds (or
    types): the host kind's (``gloo``), which reduces host tensors; NCCL and HCCL groups cannot span each other's
    devices."""
    return host_kind().distributed_backend


def is_host_device_type(device_type: str) -> bool:
    """Whether the ``torch.device`` type ``device_type`` is the host's (``"cpu"``): the type of a registered kind
    that asks for no devices. Such a device has no index to select, no ``torch.<type>.set_device`` and no device
    ids for ``DistributedDataParallel``; autocast does not apply on it. False for a type no kind uses."""
    kind = for_torch_device_type(device_type)
    return kind is not None and not kind.has_devices


def has_devices(name: str) -> bool:
    """Whether the kind called ``name`` asks for devices (False for ``cpu``); True for a name no registered kind
    has (a record written where a plugin kind was installed)."""
    kind = find(name) if isinstance(name, str) else None
    return True if kind is None else kind.has_devices
