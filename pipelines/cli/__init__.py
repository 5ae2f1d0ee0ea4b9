"""The ``heteroflow`` command line: the console script and one module per command group.

Owns: ``script`` (the console script: starts kfp.local's step processes before the command line is imported),
``main`` (the typer app and ``heteroflow run``; its names are also this package's), ``common`` (what every command
shares: the consoles, the one-line error, ``--param`` pairs, ``--pipeline``), ``summary`` (the steps table and what
``heteroflow run`` prints at its end), ``step``, ``archive``, ``cache``, ``manifests``, ``runs``, ``simulate``,
``train`` (the other commands and command groups).
May import: everything in ``heteroflow.pipelines``, ``heteroflow.components``, ``heteroflow.cache``; the Airflow group
(``heteroflow.dags``) only through the ``heteroflow.cli`` entry point.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES_FROM = "heteroflow.pipelines.cli.main"


def __getattr__(name: str) -> Any:
    """The names of :mod:`heteroflow.pipelines.cli.main`, resolved on first use (PEP 562), so the module path
    ``heteroflow.pipelines.cli`` that this package replaced keeps working (saved ``heteroflow.pipelines.cli:NAME`` strings included)."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return getattr(importlib.import_module(_NAMES_FROM), name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
