"""Property tests of the Kubernetes quantity parsers against ``kubernetes.utils.parse_quantity`` (need hypothesis,
from the ``dev`` extra; the rest of the resource model's tests are in test_resources.py and run without it)."""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis (the dev extra) is not installed")
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from heteroflow.components.errors import InvalidResources  # noqa: E402
from heteroflow.components.resources import parse_cpu, parse_memory, parse_quantity  # noqa: E402

_digits = st.text("0123456789", max_size=4)
_number = st.one_of(
    st.text("0123456789", min_size=1, max_size=8),
    st.builds(lambda a, b: f"{a}.{b}", _digits, _digits).filter(lambda s: s != "."),
)
_suffix = st.one_of(
    st.sampled_from(["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]),
    st.builds(lambda e, s, d: e + s + d, st.sampled_from("eE"), st.sampled_from(["", "+", "-"]), st.text("0123456789", min_size=1, max_size=2)),
)
K8S_QUANTITIES = st.builds(lambda s, n, x: s + n + x, st.sampled_from(["", "+", "-"]), _number, _suffix)
NOISE = st.text(alphabet="0123456789.+-eEinumkKMGTP _iI\u0661", max_size=12)


def _k8s_parse(text):
    from kubernetes.utils import parse_quantity as k8s_parse_quantity

    return k8s_parse_quantity(text)


@settings(max_examples=400, deadline=None)
@given(K8S_QUANTITIES)
@example("1E")  # exa, not an exponent
@example("1E3")
@example(".5Ki")
@example("5.")
def test_property_kubernetes_quantities_parse_to_the_library_value(text):
    """Strings of Kubernetes' grammar: both parsers accept them, with the same exact value."""
    from fractions import Fraction

    ours = parse_quantity(text)
    assert ours == Fraction(_k8s_parse(text))


@settings(max_examples=600, deadline=None)
@given(st.one_of(NOISE, st.text(max_size=12), K8S_QUANTITIES))
def test_property_any_string_gives_exact_value_or_invalid_resources(text):
    """Any string: an exact value, or InvalidResources (never a decimal or other exception); where ours accepts,
    the library agrees."""
    from fractions import Fraction

    for parse in (parse_quantity, parse_memory, parse_cpu):
        try:
            value = parse(text)
        except InvalidResources:
            continue
        if parse is parse_quantity:
            assert Fraction(_k8s_parse(text.strip())) == value
        elif parse is parse_memory:
            assert value == parse_quantity(text) and value >= 0
        else:
            assert value == parse_quantity(text) * 1000 and value >= 0
