"""The preprocess step's parameter checks: the choices of its text parameters, the split shares, integers
(:func:`check_integer`, :data:`SEED_MAX`, also used by train), and column lists. :func:`check_preprocess_params`,
which checks them all against :func:`~heteroflow.components.data.preprocess.preprocess`'s defaults, is in
:mod:`heteroflow.components.data.preprocess`.
"""

from __future__ import annotations

import math
from typing import Any

from heteroflow.components.errors import InvalidParameter

__all__ = [
    "CATEGORICAL_CHOICES",
    "HEADER_CHOICES",
    "MISSING_CHOICES",
    "MIXED_IMAGES_CHOICES",
    "SEED_MAX",
    "check_integer",
    "check_split_params",
]

HEADER_CHOICES = ("auto", "true", "false")
CATEGORICAL_CHOICES = ("onehot", "error")
MISSING_CHOICES = ("error", "impute", "drop")
MIXED_IMAGES_CHOICES = ("convert", "error")
"""``mixed_images``: images of another mode or size than most of an image folder's are converted when read, or refused."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_split_params(*, validation_fraction: float, test_fraction: float) -> None:
    """Check the split shares (the checks :func:`preprocess` makes; callers use it to fail before a run).

    Raises:
        InvalidParameter: a share that is not a finite number, out of range, or shares that leave nothing to
            train on.
    """
    for name, value in (("validation_fraction", validation_fraction), ("test_fraction", test_fraction)):
        if not _is_number(value) or not math.isfinite(value):
            raise InvalidParameter(f"{name}={value!r} is not a finite number; valid: a number in the range below 1")
    if not 0 <= validation_fraction < 1:
        raise InvalidParameter(f"validation_fraction={validation_fraction} is out of range; valid: 0 <= x < 1")
    if not 0 < test_fraction < 1:
        raise InvalidParameter(f"test_fraction={test_fraction} is out of range; valid: 0 < x < 1")
    if validation_fraction + test_fraction >= 1:
        raise InvalidParameter(
            f"validation_fraction + test_fraction = {validation_fraction + test_fraction} leaves nothing to train on; "
            "valid: a sum below 1"
        )


SEED_MAX = 2**32 - 1
"""The largest seed every engine takes: numpy's ``default_rng`` takes any integer >= 0, ``torch.manual_seed``
integers up to 2**64 - 1, and JSON readers and KFP integer parameters are safe up to 2**53; 2**32 - 1 is also
the range of the legacy ``numpy.random.seed``."""


def check_integer(name: str, value: Any, low: int, valid: str = "", *, high: int | None = None) -> None:
    """Check one integer parameter: an ``int`` (not a bool) in ``low..high``.

    Raises:
        InvalidParameter: naming the parameter, the value and the valid range (``valid``, else derived).
    """
    if not valid:
        valid = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameter(f"{name}={value!r} is not an integer; valid: {valid}")
    if value < low or (high is not None and value > high):
        raise InvalidParameter(f"{name}={value!r} is out of range; valid: {valid}")


def _names(value: str, param: str) -> list[str]:
    if not isinstance(value, str):
        raise InvalidParameter(f"{param}={value!r} is not a string; valid: column names separated by commas")
    return [n.strip() for n in value.split(",") if n.strip()]


def _choice(value: Any, param: str, choices: tuple[str, ...]) -> str:
    text = str(value).strip().lower() if isinstance(value, (str, bool)) else None
    if text not in choices:
        raise InvalidParameter(f"{param}={value!r} is not valid; valid: {', '.join(choices)}")
    return text
