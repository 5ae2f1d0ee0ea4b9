"""The module ``__getattr__`` of a package that replaced a module of the same name (issue #27's layout).

``heteroflow.components.training`` was a module and is now a package whose ``loop`` module holds what the module held;
saved references such as ``heteroflow.components.training:mlp`` must keep resolving, without importing that module
until a name is asked for (PEP 562: a module-level ``__getattr__``). Imports only the standard library.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["names_from"]


def names_from(package: str, module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that resolves a missing name from ``module``, imported on first use.

    Raises (from the returned function):
        AttributeError: ``module`` has no such name (the message names ``package``, as Python's own does), or a
            dunder name (never looked up in ``module``, so ``copy``, ``pickle`` and ``inspect`` probes stay cheap).
    """

    def __getattr__(name: str) -> Any:
        if not name.startswith("__"):
            try:
                return getattr(importlib.import_module(module), name)
            except AttributeError:
                pass
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    __getattr__.__doc__ = f"The names of :mod:`{module}`, resolved on first use (PEP 562)."
    return __getattr__
