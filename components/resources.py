"""The resource model: :class:`Resources` (one candidate), :class:`Candidates`, :class:`Toleration`, :class:`RetryPolicy`.

Quantities follow Kubernetes exactly (``k8s.io/apimachinery/pkg/api/resource.Quantity``): a number with an
optional suffix, binary ``Ki Mi Gi Ti Pi Ei`` (powers of 2^10), decimal ``n u m k M G T P E`` (powers of
10^3) or a decimal exponent (``1e9``). ``G`` is 10^9 bytes and ``Gi`` is 2^30 bytes; ``500m`` CPU is half a
core. Each string is parsed once, at construction, into an exact integer (millicores, bytes); any other string
raises :class:`InvalidResources` naming the field, the valid forms and, where one is near, the likely intent
(``16GB`` -> ``16G`` or ``16Gi``). Quantities are rendered back in the unit the user wrote where that is exact
(``8G`` stays ``8G``).

Accelerators come from the registry in :mod:`heteroflow.components.devices.accelerators` (models, families, the
names users write for them). The design follows SkyPilot's ``Resources`` (immutable value, ``ordered``
candidate lists) and flytekit's typed accelerator constants and separate ``requests=`` / ``limits=``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from decimal import Decimal
from fractions import Fraction
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

# --- Kubernetes quantities -------------------------------------------------------------------------------

# The grammar of k8s.io/apimachinery/pkg/api/resource/quantity.go, ASCII digits only (Python's \d also matches
# other scripts' digits, which Kubernetes rejects).
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_BINARY_EXP = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_EXP = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_MAX_INT64 = 2**63 - 1  # Kubernetes keeps Value() and MilliValue() in an int64
_MAX_DIGITS = 200  # significant digits: more cannot be an exact byte or millicore count we could check
_MEMORY_FORMS = "an integer number of bytes or a Kubernetes quantity such as 512Mi, 16Gi, 1G, 1.5Ti or 1e9"
_CPU_FORMS = "cores as a number or a Kubernetes quantity such as 500m, 0.5, 2 or 16"
_QUANTITY_FORMS = "a Kubernetes quantity such as 500m, 2, 512Mi, 16Gi, 1G or 1e9"

_PREFIX_WORDS = {
    "k": ("kilo", 3, "kibi", 10),
    "m": ("mega", 6, "mebi", 20),
    "g": ("giga", 9, "gibi", 30),
    "t": ("tera", 12, "tebi", 40),
    "p": ("peta", 15, "pebi", 50),
    "e": ("exa", 18, "exbi", 60),
}
_CPU_CORE_WORDS = ("", "core", "cores", "cpu", "cpus", "vcpu", "vcpus")
_CPU_MILLI_WORDS = ("m", "mcpu", "millicore", "millicores", "millicpu", "millicpus")


class _NotExact(Exception):
    """A well-formed quantity too large or too fine to be checked exactly (internal)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _exact(text: str) -> Fraction | None:
    """The exact value of a Kubernetes quantity string, or None when it is not one.

    Raises:
        _NotExact: ``"large"`` (beyond 10^1000), ``"fine"`` (a non-zero value below 10^-1000) or ``"digits"``
            (more than 200 significant digits).
    """
    m = _QUANTITY.fullmatch(text)
    if m is None or not (m["int"] or m["frac"]):
        return None
    suffix = m["suffix"] or ""
    frac = m["frac"] or ""
    exp2 = 0
    if suffix in _BINARY_EXP:
        exp10 = 0
        exp2 = _BINARY_EXP[suffix]
    elif suffix in _DECIMAL_EXP:
        exp10 = _DECIMAL_EXP[suffix]
    else:  # a decimal exponent, e.g. e9; huge ones are judged by sign without building the integer
        sign, digits = (suffix[1], suffix[2:]) if suffix[1] in "+-" else ("+", suffix[1:])
        digits = digits.lstrip("0") or "0"
        exp10 = int(digits) if len(digits) <= 7 else 10**8
        if sign == "-":
            exp10 = -exp10
    digits = (m["int"] + frac).lstrip("0")
    exp10 -= len(frac)
    stripped = digits.rstrip("0")
    exp10 += len(digits) - len(stripped)
    if not stripped:
        return Fraction(0)
    if len(stripped) > _MAX_DIGITS:
        raise _NotExact("digits")
    if len(stripped) - 1 + exp10 + exp2 * 0.302 > 1000:
        raise _NotExact("large")
    if exp10 < -1000:
        raise _NotExact("fine")
    value = Fraction(int(stripped) * 2**exp2 * 10 ** max(exp10, 0), 10 ** max(-exp10, 0))
    return -value if m["sign"] == "-" else value


def _unit_hint(unit: str) -> str:
    """Explain a bytes-style unit (``GB``, ``GiB``) that Kubernetes does not read."""
    low = unit.lower()
    prefix = low[:1]
    if prefix in _PREFIX_WORDS and low in (prefix + "b", prefix + "ib"):
        dec, dec_exp, binary, bin_exp = _PREFIX_WORDS[prefix]
        sym = "k" if prefix == "k" else prefix.upper()
        return (
            f" (Kubernetes writes {dec}bytes as {sym} = 10^{dec_exp} and {binary}bytes as {prefix.upper()}i = "
            f"2^{bin_exp}; {unit!r} is not a unit)"
        )
    return ""


def _suggest(text: str, *, memory: bool) -> list[str]:
    """Nearby valid spellings of a quantity the user probably meant (``1.5GiB`` -> ``1.5Gi``)."""
    compact = re.sub(r"\s+", "", text)
    if re.fullmatch(r"[+-]?[0-9]+,[0-9]+[A-Za-z]*", compact):  # decimal comma
        compact = compact.replace(",", ".")
    m = re.fullmatch(r"(?P<num>[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)(?P<unit>[A-Za-z]*)", compact)
    if m is None:
        return []
    num, unit = m["num"], m["unit"].lower()
    out: list[str] = []
    if memory:
        if unit in ("", "b", "byte", "bytes"):
            out = [num]
        elif unit[:1] in _PREFIX_WORDS and unit in (unit[:1], unit[:1] + "b"):
            p = unit[:1]
            out = [num + ("k" if p == "k" else p.upper()), num + p.upper() + "i"]
        elif unit[:1] in _PREFIX_WORDS and unit in (unit[:1] + "i", unit[:1] + "ib"):
            out = [num + unit[:1].upper() + "i"]
    elif unit in _CPU_CORE_WORDS:
        out = [num]
    elif unit in _CPU_MILLI_WORDS:
        out = [num + "m"]
    valid = []
    for candidate in dict.fromkeys(out):
        if candidate == text.strip():
            continue
        try:
            (parse_memory if memory else parse_cpu)(candidate)
        except InvalidResources:
            continue
        valid.append(candidate)
    return valid


def _did_you_mean(text: str, *, memory: bool) -> str:
    options = _suggest(text, memory=memory)
    if not options:
        return ""
    return "; did you mean " + " or ".join(repr(o) for o in options) + "?"


def _amount(value: object, *, field: str, forms: str, memory: bool | None) -> Fraction:
    """Parse ``value`` (a quantity string, int, float or Decimal) exactly; see :func:`parse_quantity`."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float, Decimal)):
        raise InvalidResources(f"{field}={value!r} is not a quantity; valid: {forms}")
    if isinstance(value, str):
        try:
            amount = _exact(value.strip())
        except _NotExact as exc:
            if exc.why == "large":
                raise InvalidResources(f"{field}={value!r} is too large; valid: {forms}") from None
            if exc.why == "digits":
                raise InvalidResources(
                    f"{field}={value!r} has more than {_MAX_DIGITS} significant digits; valid: {forms}"
                ) from None
            amount = Fraction(1, 10**1001)  # a positive value finer than any unit: the caller says why
        if amount is None:
            hint = ""
            if memory is not None:
                m = re.fullmatch(r"\s*[+-]?[0-9.,]*\s*([A-Za-z]+)\s*", value)
                hint = _did_you_mean(value, memory=memory) + (_unit_hint(m[1]) if m and memory else "")
            raise InvalidResources(f"{field}={value!r} is not a Kubernetes quantity{hint}; valid: {forms}")
        return amount
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        raise InvalidResources(f"{field}={value!r} is not finite; valid: {forms}")
    if isinstance(value, Decimal) and not value.is_finite():
        raise InvalidResources(f"{field}={value!r} is not finite; valid: {forms}")
    if isinstance(value, int):
        return Fraction(value)
    try:
        return Fraction(Decimal(str(value)))  # as written: 0.1 is one tenth, not the binary float
    except (ValueError, ArithmeticError):  # pragma: no cover - str(float) is always a finite decimal here
        raise InvalidResources(f"{field}={value!r} is not a quantity; valid: {forms}") from None


def parse_quantity(value: str | int | float | Decimal, *, field: str = "quantity") -> Fraction:
    """Parse a Kubernetes quantity into its exact value (``"1.5Gi"`` -> 1610612736, ``"100m"`` -> 1/10).

    Accepts exactly what Kubernetes' ``resource.ParseQuantity`` accepts (leading and trailing spaces aside),
    unlike ``kubernetes.utils.parse_quantity``, which also takes ``1K``, ``1mi``, ``1e3Ki``, ``NaN``,
    ``Infinity`` and ``1_000``.

    Args:
        value: the quantity; ints and finite floats/Decimals are taken as written (``0.1`` is 1/10).
        field: the name reported in errors.

    Returns:
        The value as a :class:`fractions.Fraction` (signed).

    Raises:
        InvalidResources: not a quantity, not finite, beyond 10^1000, finer than 10^-1000 or with more than 200
            significant digits (so that every answer is exact). Never another exception.
    """
    amount = _amount(value, field=field, forms=_QUANTITY_FORMS, memory=None)
    if amount and abs(amount) < Fraction(1, 10**1000):
        raise InvalidResources(f"{field}={value!r} is finer than 10^-1000; valid: {_QUANTITY_FORMS}")
    return amount


def parse_cpu(value: str | int | float, *, field: str = "cpu") -> int:
    """Parse a CPU quantity into millicores (1 core = 1000).

    Args:
        value: ``"500m"``, ``"2"``, ``2``, ``0.5``...
        field: the name reported in errors.

    Returns:
        Millicores, an integer >= 0 (callers that put it in a pod reject 0).

    Raises:
        InvalidResources: not a quantity (with the likely intent, e.g. ``"2 cores"`` -> ``"2"``), negative,
            finer than 1m (Kubernetes' CPU precision) or above 2^63-1 millicores.
    """
    cores = _amount(value, field=field, forms=_CPU_FORMS, memory=False)
    if cores < 0:
        raise InvalidResources(f"{field}={value!r} is negative; valid: {_CPU_FORMS}")
    millicores = cores * 1000
    if millicores.denominator != 1:
        raise InvalidResources(f"{field}={value!r} is finer than 1m (one millicore); valid: {_CPU_FORMS}")
    if millicores > _MAX_INT64:
        raise InvalidResources(f"{field}={value!r} is too large (above 2^63-1 millicores); valid: {_CPU_FORMS}")
    return int(millicores)


def parse_memory(value: str | int, *, field: str = "memory") -> int:
    """Parse a memory quantity into bytes.

    Args:
        value: ``"16Gi"`` (16 * 2^30), ``"1G"`` (10^9), ``"512Mi"``, ``1073741824``...
        field: the name reported in errors.

    Returns:
        Bytes, an integer >= 0 (callers that put it in a pod reject 0).

    Raises:
        InvalidResources: not a Kubernetes quantity (the message suggests the likely intent: ``"16GB"`` ->
            ``"16G"`` or ``"16Gi"``; ``"1.5GiB"`` -> ``"1.5Gi"``; ``"16 Gi"`` -> ``"16Gi"``), negative, a fraction
            of a byte (``"1m"`` is a thousandth of a byte; the message suggests ``"1M"`` or ``"1Mi"``) or above
            2^63-1 bytes.
    """
    amount = _amount(value, field=field, forms=_MEMORY_FORMS, memory=True)
    if amount < 0:
        raise InvalidResources(f"{field}={value!r} is negative; valid: {_MEMORY_FORMS}")
    if amount.denominator != 1:
        hint = _did_you_mean(value, memory=True) if isinstance(value, str) else ""
        raise InvalidResources(f"{field}={value!r} is not a whole number of bytes{hint}; valid: {_MEMORY_FORMS}")
    if amount > _MAX_INT64:
        raise InvalidResources(f"{field}={value!r} is too large (above 2^63-1 bytes, about 8Ei); valid: {_MEMORY_FORMS}")
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
        unit = 10 ** _DECIMAL_EXP[suffix]
        if num_bytes and num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)


def _written_suffix(value: object) -> str | None:
    """The unit suffix the user wrote (``"8G"`` -> ``"G"``, ``"1500"`` or ``1500`` -> ``""``); None for an
    exponent form (``"1e9"``) or anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return ""
    if isinstance(value, str):
        m = _QUANTITY.fullmatch(value.strip())
        if m is not None:
            suffix = m["suffix"] or ""
            if suffix in _BINARY_EXP or suffix in _DECIMAL_EXP:
                return suffix
    return None


def _render_memory(num_bytes: int, written: object) -> str:
    """``num_bytes`` in the unit of ``written`` where that is exact (``8G`` stays ``8G``), else the shortest."""
    suffix = _written_suffix(written)
    if suffix is not None and suffix not in ("n", "u", "m"):
        unit = _BINARY.get(suffix) or 10 ** _DECIMAL_EXP[suffix]
        if num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return format_memory(num_bytes)


def _render_cpu(millicores: int, written: object) -> str:
    """``millicores`` as cores or ``m``, whichever the user wrote, where exact (``0.5`` becomes ``500m``)."""
    suffix = _written_suffix(written)
    if suffix == "m":
        return f"{millicores}m"
    return format_cpu(millicores)


# --- Immutable mappings, names and tolerations ------------------------------------------------------------


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
    "accelerator",
    "precision",
    "node_selector",
    "tolerations",
    "affinity",
    "labels",
    "annotations",
)


def _positive(value: object, *, field: str, memory: bool) -> int | None:
    if value is None:
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
        cpu_limit: CPU limit (>= ``cpu``); None: the same as ``cpu``.
        memory_limit: memory limit (>= ``memory``); None: the same as ``memory``.
        device_memory: memory per accelerator device (at least this much), a Kubernetes quantity; None for any.
            On a model it must not exceed the model's; on a family it narrows the family to models with enough.
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
        kind = DeviceKind.parse(self.kind) if self.kind is not None else (accel.kind if accel else DeviceKind.CPU)
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
        object.__setattr__(self, "cpu_limit_millicores", cpu if cpu_limit is None else cpu_limit)
        object.__setattr__(self, "memory_limit_bytes", memory if memory_limit is None else memory_limit)
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
            out[accel.resource_name] = str(self.count)
        return out

    def k8s_requests(self) -> dict[str, str]:
        """The Kubernetes ``resources.requests`` map under the official device plugins (exact quantities in the
        user's units; the accelerator's extended resource with its count). A cluster profile may name the
        accelerator differently: see ``heteroflow.pipelines.k8s.resources``."""
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
                parts.append(f"{req}{unit}" + (f" (limit {lim})" if lim != req else ""))
            elif lim is not None:
                parts.append(f"limit {lim}{unit}")
        if self.device_memory_bytes is not None:
            parts.append(f"device memory >= {self.device_memory_text()}")
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
            out["cpu_limit"] = self.cpu_text(limit=True)
        if self.memory_limit_bytes != self.memory_bytes:
            out["memory_limit"] = self.memory_text(limit=True)
        if self.precision is not None:
            out["precision"] = self.precision
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
        unknown = sorted(set(data) - set(_FIELDS), key=str)
        if unknown:
            raise InvalidResources(
                f"unknown resource field(s) {', '.join(map(str, unknown))}; valid: {', '.join(_FIELDS)}"
            )
        fields = {k: data[k] for k in _FIELDS if k in data}
        for name in ("node_selector", "labels", "annotations"):
            if fields.get(name, ...) is None:
                fields[name] = FrozenMap()
        if fields.get("tolerations", ...) is None:
            fields["tolerations"] = ()
        return cls(**fields)

    @classmethod
    def parse_spec(cls, spec: str) -> Resources:
        """Parse the command-line form ``KIND[:key=value,...]``, e.g. ``gpu:count=1,memory=16Gi``,
        ``gpu:accelerator=T4,memory=8G`` or ``cpu:cpu=8``.

        Raises:
            InvalidResources: malformed spec, unknown key, a key given twice (``cpu:cpu=2,cpu=4``, or ``kind=``
                beside the ``KIND:`` prefix) or invalid value.
        """
        kind, _, rest = spec.partition(":")
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


# --- Retry policy: defined in heteroflow.components.core.retry, re-exported here for existing imports -------------

from heteroflow.components.core.retry import RetryPolicy  # noqa: E402
