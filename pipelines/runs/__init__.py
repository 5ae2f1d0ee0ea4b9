"""Runs: run records and folders, reading them back, the HTML report and the Prometheus metrics.

Owns: ``records`` (writing ``run.json`` and attempt records), ``folders`` (reading run folders of any engine), ``report``
(``report.html``; its ``sections``, ``charts`` (matplotlib plots as inline SVG), ``markup`` (style sheet, escaping,
formats) and ``prerendering`` (matplotlib imported and plots drawn while a run goes on)), ``metrics`` (``metrics.prom``
and ``heteroflow metrics serve``).
May import: ``heteroflow.components``, ``heteroflow.cache``; not the engines or the CLI.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES_FROM = "heteroflow.pipelines.runs.folders"


def __getattr__(name: str) -> Any:
    """The names of :mod:`heteroflow.pipelines.runs.folders`, resolved on first use (PEP 562), so the module path
    ``heteroflow.pipelines.runs`` that this package replaced keeps working (saved ``heteroflow.pipelines.runs:NAME`` strings included)."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return getattr(importlib.import_module(_NAMES_FROM), name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
