"""Engines behind one interface: the ``Engine`` protocol, its registry, ``heteroflow.run``, the in-process engine.

Owns: ``registry`` (the protocol and the registry; third-party engines through the ``heteroflow.engines``
entry-point group; its names are also this package's), ``runner`` (``heteroflow.run``), ``inprocess``.
May import: ``heteroflow.pipelines`` (graph, environment, runs), ``heteroflow.components``, ``heteroflow.cache``;
engine modules of other subpackages only by name through the registry.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES_FROM = "heteroflow.pipelines.engines.registry"


def __getattr__(name: str) -> Any:
    """The names of :mod:`heteroflow.pipelines.engines.registry`, resolved on first use (PEP 562), so the module path
    ``heteroflow.pipelines.engines`` that this package replaced keeps working (saved ``heteroflow.pipelines.engines:NAME`` strings included)."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return getattr(importlib.import_module(_NAMES_FROM), name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
