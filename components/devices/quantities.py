"""Kubernetes quantities: parsing and rendering CPU, memory and any other quantity exactly.

Quantities follow Kubernetes exactly (``k8s.io/apimachinery/pkg/api/resource.Quantity``): a number with an
optional suffix, binary ``Ki Mi Gi Ti Pi Ei`` (powers of 2^10), decimal ``n u m k M G T P E`` (powers of
10^3) or a decimal exponent (``1e9``). ``G`` is 10^9 bytes and ``Gi`` is 2^30 bytes; ``500m`` CPU is half a
core. Each string is parsed into an exact value (millicores, bytes); any other string raises
:class:`InvalidResources` naming the field, the valid forms and, where one is near, the likely intent
(``16GB`` -> ``16G`` or ``16Gi``). Quantities are rendered back in the unit the user wrote where that is exact
(``8G`` stays ``8G``).

Moved here from :mod:`heteroflow.components.resources`, which re-exports the public names.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

from heteroflow.components.errors import InvalidResources

__all__ = [
    "format_cpu",
    "format_memory",
    "parse_cpu",
    "parse_memory",
    "parse_quantity",
]

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
