"""The built-in model and the user's factories: :func:`mlp` (heteroflow's classifier, saved as
:data:`BUILTIN_MODEL`), :class:`ModelSpec` (a model factory and its arguments, as ``model.json`` and the archive
record them), and the import of a ``package.module:function`` reference (model, optimizer, loss factories and
training functions) with a message naming the parameter."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from heteroflow.components.errors import InvalidParameter
from heteroflow.components.training.step import TRAIN

if TYPE_CHECKING:  # torch is imported where it is used: train's parameter checks import this module
    from torch import nn

__all__ = ["BUILTIN_MODEL", "BUILTIN_OPTIMIZERS", "ModelSpec", "build_optimizer", "check_optimizer", "mlp"]


def mlp(in_features: int, num_classes: int, hidden_units: int = TRAIN.param("hidden_units").default,
        input_shape: tuple[int, ...] = ()) -> nn.Module:
    """The built-in classifier: ``in -> hidden -> ReLU -> hidden -> ReLU -> classes`` (inputs of more than one
    dimension are flattened first). Input ``(batch, *input_shape)`` float32, output logits ``(batch, num_classes)``;
    ``hidden_units`` defaults to the train step's (:data:`~heteroflow.components.training.step.TRAIN`)."""
    from torch import nn

    body = nn.Sequential(
        nn.Linear(in_features, hidden_units),
        nn.ReLU(),
        nn.Linear(hidden_units, hidden_units),
        nn.ReLU(),
        nn.Linear(hidden_units, num_classes),
    )
    return nn.Sequential(nn.Flatten(), body) if len(input_shape) > 1 else body


BUILTIN_MODEL = "heteroflow.components.training.loop:mlp"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A model factory and the keyword arguments it is called with (recorded in ``model.json`` and the archive).

    Attributes:
        ref: ``package.module:function`` returning a ``torch.nn.Module``.
        args: JSON-ready keyword arguments.
    """

    ref: str
    args: dict[str, Any]

    @classmethod
    def resolve(cls, ref: str, *, offered: Mapping[str, Any], given: Mapping[str, Any]) -> ModelSpec:
        """Choose the arguments: every ``given`` one (each must be a parameter of the factory), plus those of
        ``offered`` (``in_features``, ``num_classes``, ``input_shape``, ``hidden_units``) the factory accepts.

        Raises:
            InvalidParameter: the factory cannot be imported, is not callable, or does not take a given argument;
                or a given argument disagrees with an offered one (:func:`_check_overrides`).
        """
        fn = _import_callable(ref, what="model_factory")
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            return cls(ref=ref, args={**dict(offered), **dict(given)})
        takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        unknown = [k for k in given if k not in sig.parameters and not takes_any]
        if unknown:
            import difflib

            close = difflib.get_close_matches(unknown[0], list(sig.parameters), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InvalidParameter(
                f"model_args: {ref} takes no argument {unknown[0]!r}; it takes: {', '.join(sig.parameters) or 'none'}{hint}"
            )
        _check_overrides(offered, given)
        args = {k: v for k, v in offered.items() if k in sig.parameters}
        args.update(given)
        return cls(ref=ref, args=args)

    def build(self) -> nn.Module:
        """Call the factory.

        Raises:
            InvalidParameter: it does not return a ``torch.nn.Module`` (or raises while building).
        """
        from torch import nn

        fn = _import_callable(self.ref, what="model_factory")
        args = {k: tuple(v) if k == "input_shape" else v for k, v in self.args.items()}
        try:
            model = fn(**args)
        except TypeError as exc:
            raise InvalidParameter(f"model_factory={self.ref!r} cannot be called with {sorted(args)}: {exc}") from None
        except Exception as exc:  # the factory's own error: say which factory, called with what (the traceback has where)
            exc.add_note(f"(raised by model_factory {self.ref} called with "
                         f"{', '.join(f'{k}={v!r}' for k, v in sorted(args.items()))})")
            raise
        if not isinstance(model, nn.Module):
            raise InvalidParameter(f"model_factory={self.ref!r} returned a {type(model).__name__}, not a torch.nn.Module")
        return model

    def to_dict(self) -> dict[str, Any]:
        return {"factory": self.ref, "args": dict(self.args)}


def _check_overrides(offered: Mapping[str, Any], given: Mapping[str, Any]) -> None:
    """Refuse a ``model_args`` value that would silently replace what train offers: ``in_features``,
    ``num_classes`` and ``input_shape`` come from the data (a different value builds a model the data cannot
    feed), and ``hidden_units`` set both as train's parameter (to other than its default) and in ``model_args``
    to different values is ambiguous. An equal value is accepted.

    Raises:
        InvalidParameter: naming both values and what to do.
    """
    for key in given.keys() & offered.keys():
        mine, theirs = given[key], offered[key]
        if key == "input_shape":
            mine, theirs = list(mine) if isinstance(mine, (list, tuple)) else mine, list(theirs)
        if mine == theirs:
            continue
        if key == "hidden_units":
            if theirs == TRAIN.param("hidden_units").default:
                continue  # train's default: model_args sets it
            raise InvalidParameter(
                f"model_args: hidden_units={given[key]!r} disagrees with train's hidden_units={offered[key]!r}; "
                "set it in one place (model_args wins only over the default)"
            )
        raise InvalidParameter(
            f"model_args: {key}={given[key]!r} disagrees with the data ({key}={offered[key]!r}); leave {key} out of "
            "model_args: train passes it from the data"
        )


_EXAMPLES = {
    "optimizer": "mypkg.optim:sgd, a function(params, lr) returning a torch.optim optimizer",
    "loss": "torch.nn:CrossEntropyLoss, a class or function called with no arguments that returns the loss function",
    "train_function": "mypkg.loops:train, a function(ctx) that trains",
    "dataset_factory": "mypkg.data:make_dataset, a function(split) returning a torch Dataset or None",
}
"""The example each kind of reference's error gives (``module:attribute``); a model factory's is the default."""


BUILTIN_OPTIMIZERS: dict[str, str] = {
    "adam": "torch.optim.Adam(params, lr=learning_rate) (the default)",
    "adamw": "torch.optim.AdamW(params, lr=learning_rate)",
    "sgd": "torch.optim.SGD(params, lr=learning_rate, momentum=0.9)",
}
"""The optimizers the ``optimizer`` parameter names without a factory (any case), and what each builds. SGD's
momentum 0.9 is the usual one for image classifiers (Goyal et al. 2017, arXiv:1706.02677; torchvision's reference
recipes); another momentum, Nesterov or weight decay takes a factory ``module:function(params, lr)``."""


def check_optimizer(ref: str) -> None:
    """Check an ``optimizer`` parameter: empty, a name of :data:`BUILTIN_OPTIMIZERS`, or an importable
    ``module:function`` that can be called as ``fn(params, lr=...)``.

    Raises:
        InvalidParameter: none of these (the message lists the built-in names, with the closest one).
    """
    if not ref or ref.lower() in BUILTIN_OPTIMIZERS:
        return
    if ":" not in ref:
        from heteroflow.components.errors import did_you_mean

        raise InvalidParameter(
            f"optimizer={ref!r}{did_you_mean([ref], BUILTIN_OPTIMIZERS)} is neither a built-in optimizer "
            f"({', '.join(BUILTIN_OPTIMIZERS)}) nor a factory 'module:function' (e.g. {_EXAMPLES['optimizer']})")
    fn = _import_callable(ref, what="optimizer")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without one: called as it is
        return
    try:
        signature.bind(object(), lr=0.1)
    except TypeError as exc:
        raise InvalidParameter(f"optimizer={ref!r} cannot be called as {ref}(params, lr=...): {exc}; valid: "
                               f"{_EXAMPLES['optimizer']}") from None


def build_optimizer(ref: str, params: Any, lr: float) -> Any:
    """The optimizer ``ref`` names over ``params`` at learning rate ``lr``: empty or ``adam``: Adam; ``adamw``,
    ``sgd``: as :data:`BUILTIN_OPTIMIZERS`; else the factory ``module:function(params, lr=lr)``.

    Raises:
        InvalidParameter: as :func:`check_optimizer`, or the factory returns something not a
            ``torch.optim.Optimizer``.
    """
    import torch

    check_optimizer(ref)
    name = (ref or "adam").lower()
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    opt = _import_callable(ref, what="optimizer")(params, lr=lr)
    if not isinstance(opt, torch.optim.Optimizer):
        raise InvalidParameter(f"optimizer={ref!r} returned a {type(opt).__name__}, not a torch.optim.Optimizer")
    return opt


def _import_callable(ref: str, *, what: str) -> Callable[..., Any]:
    from heteroflow.components.core.step import import_object

    fn = import_object(ref, what=what, example=_EXAMPLES.get(what, "mypkg.models:make_model"))
    if not callable(fn):
        from heteroflow.components.core.step import _a

        raise InvalidParameter(f"{what}={ref!r} is {_a(type(fn))}, not a function")
    return fn  # type: ignore[no-any-return]
