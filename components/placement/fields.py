"""The inventory parser's building blocks: YAML with line numbers (for ``FILE:LINE:`` messages) and the field
checks (accelerator models, counts, numbers, DNS labels, mappings, quantities), each raising
:class:`~heteroflow.components.placement.views.InvalidInventory` with the field named.

Moved here from :mod:`heteroflow.components.placement.inventory`, which re-exports the public names.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from heteroflow.components.devices.accelerators import Accelerator, DeviceKind, find_accelerator
from heteroflow.components.errors import InvalidResources
from heteroflow.components.placement.views import InvalidInventory, _where

__all__ = ["dns_label", "load_yaml_with_lines", "lookup_policy", "model_key", "policy_reference"]

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


# --- YAML with line numbers ----------------------------------------------------------------------------------


class _Lined(dict):
    """A mapping from YAML that remembers its own line and each key's line (1-based)."""

    line: int = 0
    key_lines: dict[str, int]


class _LinedList(list):
    line: int = 0


def load_yaml_with_lines(text: str, *, where: str = "the document") -> Any:
    """Parse YAML (or JSON); mappings and lists remember their line, mappings each key's line (for messages).

    Args:
        where: what the text is (``inventory cluster.yaml``), for messages.

    Raises:
        DuplicateKey: a key is given twice in one mapping (the message gives both lines; YAML 1.2 requires keys to
            be unique, and PyYAML would keep the last silently).
        yaml.YAMLError: not YAML.
    """
    import yaml

    from heteroflow.components.core.keys import DuplicateKey

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader: Any, node: Any) -> _Lined:
        out = _Lined()
        out.line = node.start_mark.line + 1
        out.key_lines = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                given = key in out
            except TypeError:  # an unhashable key: the assignment below reports it
                given = False
            if given:
                raise DuplicateKey(f"{where}: key {key!r} is given twice (lines {out.key_lines[str(key)]} and {line}); give each key once")
            out[key] = loader.construct_object(value_node, deep=True)
            out.key_lines[str(key)] = line
        return out

    def sequence(loader: Any, node: Any) -> _LinedList:
        out = _LinedList(loader.construct_object(v, deep=True) for v in node.value)
        out.line = node.start_mark.line + 1
        return out

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, sequence)
    return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader subclass


def _line_of(obj: Any, key: str | None = None) -> int:
    if isinstance(obj, _Lined) and key is not None and key in obj.key_lines:
        return obj.key_lines[key]
    return int(getattr(obj, "line", 0))


# --- field checks ---------------------------------------------------------------------------------------------


def policy_reference(name: str, bases: type | tuple[type, ...], *, where: str = "") -> Any | None:
    """The policy a ``module:attribute`` name refers to (a placement policy, round or packing, of the user's own):
    the attribute itself when it is an instance of ``bases``, an instance made without arguments when it is a
    subclass of one, else None (the caller says what was expected).

    Raises:
        InvalidInventory: the module or attribute cannot be imported (``{where}policy=NAME cannot be imported``).
    """
    module, _, attr = name.partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidInventory(f"{where}policy={name!r} cannot be imported ({exc})") from None
    if isinstance(obj, type) and issubclass(obj, bases):
        return obj()
    return obj if isinstance(obj, bases) else None


def lookup_policy(name: Any, registry: Mapping[str, type], bases: type | tuple[type, ...], *, unknown: str,
                  wrong: str, where: str = "") -> Any:
    """The policy ``name`` names, for every registry of policies (whole-device, packing, both): an instance of
    ``bases`` as it is; a name of ``registry`` (its class, made without arguments); ``module:attribute``
    (:func:`policy_reference`).

    Raises:
        InvalidInventory: an unknown name (``{where}policy=NAME {unknown}``: the caller lists the valid names) or an
            attribute of another type (``{where}policy=NAME {wrong}``).
    """
    if isinstance(name, bases):
        return name
    if name in registry:
        return registry[name]()
    if ":" in name:
        policy = policy_reference(name, bases, where=where)
        if policy is None:
            raise InvalidInventory(f"{where}policy={name!r} {wrong}")
        return policy
    from heteroflow.components.errors import did_you_mean

    hint = did_you_mean([str(name)], list(registry)) if isinstance(name, str) else ""
    raise InvalidInventory(f"{where}policy={name!r}{hint} {unknown}")


def model_key(name: object, *, field: str) -> str:
    """The registry key of an accelerator model (``V100`` -> ``nvidia-v100``), or ``cpu``.

    Raises:
        InvalidInventory: unknown name or a family (the message lists the valid models).
    """
    host = DeviceKind.host().value
    if isinstance(name, str) and name.strip().lower() == host:
        return host
    return _model(name, field).name


def _model(name: object, field: str, kind: str | None = None, container: str | None = None) -> Accelerator:
    """One model of the registry; ``field`` names it for lookup errors, ``container`` (default ``field``) for
    the others."""
    try:
        accel = find_accelerator(str(name), field=field)
    except InvalidResources as exc:
        raise InvalidInventory(str(exc)) from None
    subject = container or field
    if accel.is_family:
        raise InvalidInventory(
            f"{subject} names {name!r}, a family ({accel.display_name}); an inventory counts devices of one model: "
            + ", ".join(m.name for m in accel.models)
        )
    if kind is not None and accel.kind.value != kind:
        raise InvalidInventory(
            f"{subject} names {name!r}, a {accel.kind.value} model ({accel.name} is a {accel.kind.value} model, "
            f"not a {kind} one)"
        )
    return accel


def _count(value: object, field: str, *, minimum: int = 0, noun: str = "count") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInventory(f"{field}={value!r} is not a {noun}; valid: an integer >= {minimum}")
    return value


def _number(value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidInventory(f"{field}={value!r} is not a number >= 0")
    return float(value)


def dns_label(value: object, field: str) -> str:
    """``value`` if it is a DNS label (lower case, digits, ``-``, at most 63).

    Raises:
        InvalidResources: it is not (the message names ``field``).
    """
    if not isinstance(value, str) or not _DNS_LABEL.fullmatch(value):
        raise InvalidResources(f"{field}={value!r} is not a name; valid: a DNS label (lower case, digits, '-', <= 63)")
    return value


def _mapping(value: Any, field: str, valid: Sequence[str] | None, *, source: str, line: int) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInventory(f"{_where(source, line)}{field} is {type(value).__name__}, not a mapping")
    if valid is not None:
        for key in value:
            if key not in valid:
                raise InvalidInventory(
                    f"{_where(source, _line_of(value, str(key)) or line)}{field} key {key!r} is unknown; valid: {', '.join(valid)}"
                )
    return value


def _quantity(parse: Any, value: object, field: str, *, where: str = "") -> int:
    """``parse(value)``; an error starts with ``where`` (``FILE:LINE: ``, or "" where the caller adds it)."""
    try:
        return int(parse(value, field=field))
    except InvalidResources as exc:
        raise InvalidInventory(f"{where}{exc}") from None
