"""train's parameters that need parsing: the model factory's JSON arguments and the model it builds for the data,
and the per-device batch sizes and their union (split out of :mod:`heteroflow.components.training.step`)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from heteroflow.components.errors import InvalidParameter

__all__ = ["model_spec", "parse_batch_sizes", "union_batch_size"]


def _parse_model_args(text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidParameter(f"model_args={text!r} is not JSON ({exc}); valid: a JSON object, e.g. '{{\"channels\": 16}}'") from None
    if not isinstance(value, dict):
        raise InvalidParameter(f"model_args={text!r} is not a JSON object; valid: e.g. '{{\"channels\": 16}}'")
    return value


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """train's ``batch_sizes`` (``"64,32"``) as integers, () for an empty text.

    Raises:
        InvalidParameter: an entry that is not an integer >= 1 (names it, with what is valid).
    """
    if not isinstance(text, str):
        raise InvalidParameter(f"batch_sizes={text!r} is not text; valid: comma-separated integers >= 1, e.g. '64,32'")
    if not text.strip():
        return ()
    out = []
    for i, item in enumerate(text.split(",")):
        try:
            size = int(item.strip())
        except ValueError:
            size = 0
        if size < 1:
            raise InvalidParameter(
                f"batch_sizes={text!r}: entry {i} ({item.strip()!r}) is not a batch size; valid: comma-separated "
                "integers >= 1, one per worker (samples per step), e.g. '64,32'"
            )
        out.append(size)
    return tuple(out)


def union_batch_size(values: Mapping[str, Any]) -> int:
    """The samples of one optimizer step: the sum of ``batch_sizes`` when given, else ``batch_size``."""
    return sum(parse_batch_sizes(values["batch_sizes"])) or int(values["batch_size"])


def model_spec(splits: Any, values: Mapping[str, Any]) -> Any:
    """The model train builds for ``splits`` with train's parameters ``values`` (``model_factory``, ``model_args``,
    ``hidden_units``): a :class:`~heteroflow.components.training.loop.ModelSpec` offered ``in_features`` (the product of
    one sample's shape), ``num_classes``, ``input_shape`` and ``hidden_units``.

    Raises:
        InvalidParameter: a factory that cannot be imported, or ``model_args`` that is not a JSON object.
    """
    from heteroflow.components.training.loop import BUILTIN_MODEL, ModelSpec

    offered = {
        "in_features": math.prod(splits.input_shape),
        "num_classes": len(splits.classes),
        "input_shape": list(splits.input_shape),
        "hidden_units": values["hidden_units"],
    }
    return ModelSpec.resolve(values["model_factory"] or BUILTIN_MODEL, offered=offered, given=_parse_model_args(values["model_args"]))
