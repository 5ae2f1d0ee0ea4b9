"""The pod fields a candidate carries besides its quantities, as immutable checked values: :class:`FrozenMap`
(node selectors, labels, annotations, affinity terms), Kubernetes' qualified names and label values
(:func:`check_qualified_name`, :func:`check_label_value`), :class:`Toleration` and the pod spec's affinity.

Each is checked as the Kubernetes API server checks it; an invalid value raises :class:`InvalidResources` naming
the field and the valid form. Moved here from :mod:`heteroflow.components.resources`, which re-exports the public
names.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from heteroflow.components.errors import InvalidResources

__all__ = [
    "FrozenMap",
    "Toleration",
    "check_label_value",
    "check_qualified_name",
    "thaw",
]



class FrozenMap(Mapping[str, Any]):
    """An immutable, hashable mapping (node selectors, labels, annotations, affinity terms)."""

    __slots__ = ("_data", "_hash")

    def __init__(self, data: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> None:
        object.__setattr__(self, "_data", dict(data))
        object.__setattr__(self, "_hash", None)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(frozenset(self._data.items())))
        return self._hash  # type: ignore[return-value]

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"FrozenMap is immutable (setting {name!r})")

    def __reduce__(self) -> tuple[type[FrozenMap], tuple[dict[str, Any]]]:  # pickle and copy.deepcopy
        return (FrozenMap, (self._data,))

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return FrozenMap((k, _freeze(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Turn a frozen structure (:class:`FrozenMap`, tuples) back into plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_KEY_FORMS = (
    "an optional DNS subdomain prefix and '/', then 1-63 characters of [A-Za-z0-9-_.] that start and end "
    "alphanumeric (e.g. 'nvidia.com/gpu.product', 'disktype')"
)
_VALUE_FORMS = "empty, or 1-63 characters of [A-Za-z0-9-_.] that start and end alphanumeric"


def check_qualified_name(key: object, *, field: str) -> str:
    """Check a label, annotation, node-selector or taint key (Kubernetes' ``IsQualifiedName``).

    Raises:
        InvalidResources: not such a name; the message names ``field`` and the valid form.
    """
    if isinstance(key, str):
        prefix, slash, name = key.rpartition("/")
        ok = bool(_NAME_PART.fullmatch(name)) and len(name) <= 63
        if slash:
            ok = ok and bool(prefix) and len(prefix) <= 253 and bool(_DNS_SUBDOMAIN.fullmatch(prefix))
        if ok:
            return key
    raise InvalidResources(f"{field} key {key!r} is not a Kubernetes qualified name; valid: {_KEY_FORMS}")


def check_label_value(value: object, *, field: str) -> str:
    """Check a label or node-selector value (Kubernetes' ``IsValidLabelValue``).

    Raises:
        InvalidResources: not such a value; the message names ``field`` and the valid form.
    """
    if isinstance(value, str) and (value == "" or (len(value) <= 63 and _NAME_PART.fullmatch(value))):
        return value
    raise InvalidResources(f"{field}={value!r} is not a Kubernetes label value; valid: {_VALUE_FORMS}")


def _string_map(value: object, *, field: str, label_values: bool) -> FrozenMap:
    if value is None:
        return FrozenMap()
    if not isinstance(value, Mapping):
        raise InvalidResources(f"{field}={value!r} is not a mapping; valid: a mapping of string keys to string values")
    out = {}
    for key, item in value.items():
        check_qualified_name(key, field=field)
        if label_values:
            check_label_value(item, field=f"{field}[{key!r}]")
        elif not isinstance(item, str):
            raise InvalidResources(f"{field}[{key!r}]={item!r} is not a string; valid: a string value")
        out[key] = item
    return FrozenMap(sorted(out.items()))


_TOLERATION_OPERATORS = ("Equal", "Exists")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_TOLERATION_KEYS = {
    "key": "key",
    "operator": "operator",
    "value": "value",
    "effect": "effect",
    "tolerationSeconds": "toleration_seconds",
    "toleration_seconds": "toleration_seconds",
}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Toleration:
    """A Kubernetes toleration (``core/v1 Toleration``), checked as the API server checks it.

    Args:
        key: the taint key, a qualified name; empty matches every key (then ``operator`` must be ``Exists``).
        operator: ``"Equal"`` (default) or ``"Exists"`` (matches any value; ``value`` must then be empty).
        value: the taint value for ``Equal``, a label value.
        effect: ``"NoSchedule"``, ``"PreferNoSchedule"``, ``"NoExecute"``, or empty for all effects.
        toleration_seconds: for ``NoExecute`` only: seconds the pod stays bound after the taint appears.

    Raises:
        InvalidResources: a field is invalid; the message names it (``toleration.operator=...``) and the valid
            choices.
    """

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None

    def __post_init__(self) -> None:
        if self.operator not in _TOLERATION_OPERATORS:
            raise InvalidResources(
                f"toleration.operator={self.operator!r} is unknown; valid: {', '.join(_TOLERATION_OPERATORS)}"
            )
        if self.key == "" and self.operator != "Exists":
            raise InvalidResources(
                f"toleration.operator={self.operator!r} with an empty key: a toleration without a key matches every "
                "taint and must use operator 'Exists'; valid: operator='Exists', or a key"
            )
        if self.key != "":
            check_qualified_name(self.key, field="toleration.key")
        if self.operator == "Exists" and self.value != "":
            raise InvalidResources(
                f"toleration.value={self.value!r} with operator 'Exists': Exists matches any value; valid: an empty "
                "value, or operator='Equal'"
            )
        check_label_value(self.value, field="toleration.value")
        if self.effect not in ("", *_TAINT_EFFECTS):
            raise InvalidResources(
                f"toleration.effect={self.effect!r} is unknown; valid: {', '.join(_TAINT_EFFECTS)}, or empty for all"
            )
        seconds = self.toleration_seconds
        if seconds is not None:
            if isinstance(seconds, bool) or not isinstance(seconds, int):
                raise InvalidResources(f"toleration.toleration_seconds={seconds!r} is not an integer; valid: whole seconds")
            if self.effect != "NoExecute":
                raise InvalidResources(
                    f"toleration.toleration_seconds={seconds!r} with effect={self.effect!r}: Kubernetes allows it only "
                    "with effect 'NoExecute'; valid: effect='NoExecute', or no toleration_seconds"
                )

    @classmethod
    def from_value(cls, value: Toleration | Mapping[str, Any] | Any, *, field: str = "toleration") -> Toleration:
        """Build from a :class:`Toleration`, a mapping with Kubernetes' keys (``tolerationSeconds`` or
        ``toleration_seconds``) or a ``kubernetes.client.V1Toleration``.

        Raises:
            InvalidResources: unknown keys or invalid values, reported under ``field`` (``tolerations[0].key``).
        """
        if isinstance(value, Toleration):
            return value
        if not isinstance(value, Mapping) and hasattr(value, "to_dict") and hasattr(value, "operator"):
            value = {k: v for k, v in value.to_dict().items() if v is not None}
        if not isinstance(value, Mapping):
            raise InvalidResources(f"{field}={value!r} is not a toleration; valid: a mapping with key, operator, value, effect")
        unknown = sorted(set(value) - set(_TOLERATION_KEYS))
        if unknown:
            raise InvalidResources(
                f"{field} has unknown field(s) {', '.join(map(str, unknown))}; valid: key, operator, value, effect, "
                "tolerationSeconds"
            )
        kwargs = {_TOLERATION_KEYS[k]: v for k, v in value.items() if v is not None}
        try:
            return cls(**kwargs)
        except InvalidResources as exc:
            raise InvalidResources(str(exc).replace("toleration.", f"{field}.", 1)) from None
        except TypeError as exc:  # a non-string key/value
            raise InvalidResources(f"{field}={dict(value)!r} is not a toleration ({exc})") from None

    def to_dict(self) -> dict[str, Any]:
        """Kubernetes' form (camelCase keys; empty fields left out)."""
        out: dict[str, Any] = {}
        if self.key:
            out["key"] = self.key
        out["operator"] = self.operator
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


_AFFINITY_KEYS = ("nodeAffinity", "podAffinity", "podAntiAffinity")


def _affinity(value: object) -> FrozenMap | None:
    if value is None:
        return None
    if hasattr(value, "to_dict") and not isinstance(value, Mapping):  # a kubernetes.client V1Affinity
        from kubernetes.client import ApiClient  # only reached when a kubernetes object was passed in

        value = ApiClient().sanitize_for_serialization(value)
    if not isinstance(value, Mapping) or not value:
        raise InvalidResources(
            f"affinity={value!r} is not an affinity; valid: a mapping with {', '.join(_AFFINITY_KEYS)} as in a pod spec"
        )
    unknown = sorted(set(value) - set(_AFFINITY_KEYS))
    if unknown:
        raise InvalidResources(
            f"affinity has unknown field(s) {', '.join(map(str, unknown))}; valid: {', '.join(_AFFINITY_KEYS)} "
            "(Kubernetes' camelCase names)"
        )
    for key, item in value.items():
        if not isinstance(item, Mapping):
            raise InvalidResources(f"affinity.{key}={item!r} is not a mapping; valid: the pod spec's {key} object")
    return _freeze(value)

