"""train's parameters that need parsing: the model factory's JSON arguments and the model it builds for the data,
and the per-device batch sizes and their union (split out of :mod:`heteroflow.components.training.step`)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from heteroflow.components.errors import InvalidParameter

__all__ = ["OFFERED_MODEL_ARGS", "check_model_args", "model_spec", "parse_batch_sizes", "union_batch_size"]

OFFERED_MODEL_ARGS = ("in_features", "num_classes", "input_shape", "hidden_units")
"""The arguments train offers every model factory (those it takes), from the data and ``hidden_units``."""


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


def check_model_args(model_factory: str, model_args: str) -> None:
    """Check ``model_args`` against the model factory's signature before a run (its module is imported, the
    factory is not called): every given argument must be one it takes, and every argument it needs must be given
    or be one train offers (:data:`OFFERED_MODEL_ARGS`). The same rules train applies when it builds the model
    (:meth:`heteroflow.components.training.factories.ModelSpec.resolve`).

    Raises:
        InvalidParameter: ``model_args`` is not a JSON object, the factory cannot be imported, does not take a
            given argument (names each, and what it takes), or needs one nobody gives (names it).
    """
    import inspect

    from heteroflow.components.training.factories import BUILTIN_MODEL, _import_callable

    given = _parse_model_args(model_args)
    ref = model_factory or BUILTIN_MODEL
    fn = _import_callable(ref, what="model_factory")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check it against
        return
    params = sig.parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = [k for k in given if k not in params]
        if unknown:
            import difflib

            close = difflib.get_close_matches(unknown[0], list(params), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InvalidParameter(
                f"model_args: {ref} takes no argument {', '.join(map(repr, unknown))}; it takes: {', '.join(params) or 'none'}{hint}"
            )
    needed = [
        name
        for name, p in params.items()
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and name not in given and name not in OFFERED_MODEL_ARGS
    ]
    if needed:
        raise InvalidParameter(
            f"model_factory={ref!r} cannot be called with what train gives it: it needs {', '.join(map(repr, needed))}, "
            f"which model_args does not give and train does not offer (it offers "
            f"{', '.join(OFFERED_MODEL_ARGS)}); give {'them' if len(needed) > 1 else 'it'} in model_args, e.g. "
            f"'{{\"{needed[0]}\": ...}}'"
        )


def check_hidden_units_used(model_factory: str, hidden_units: int, default: int) -> None:
    """Refuse ``hidden_units`` set (to other than its ``default``) for a model factory that does not take it: the
    width would be silently ignored.

    Raises:
        InvalidParameter: the factory takes no ``hidden_units`` (nor ``**kwargs``); the message says what to do.
    """
    import inspect

    from heteroflow.components.training.factories import BUILTIN_MODEL, _import_callable

    if hidden_units == default:
        return
    ref = model_factory or BUILTIN_MODEL
    try:
        params = inspect.signature(_import_callable(ref, what="model_factory")).parameters
    except (TypeError, ValueError):
        return
    if "hidden_units" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise InvalidParameter(
            f"hidden_units={hidden_units} is not used: model {ref} takes no hidden_units (it takes: "
            f"{', '.join(params) or 'none'}); leave hidden_units at its default, or give the model's own arguments in model_args"
        )


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
