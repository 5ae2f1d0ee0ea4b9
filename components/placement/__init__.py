"""Placement: the cluster inventory, the placement policies and their simulator core, and the plan step.

Owns: ``inventory`` (the one parser of cluster inventories: inventory files and ``kubectl get nodes -o json``;
re-exports the names of the three modules it builds on: ``views``, the parsed inventory and its views per
consumer; ``fields``, YAML with line numbers and the field checks; ``k8s_nodes``, Kubernetes nodes),
``policies`` (the policies and Gavel's max-min allocation; it re-exports the three below, and its names are also
this package's), ``state`` (jobs, decisions, the simulator's state), ``clusters`` (throughput tables and
inventories to place on), ``rounds`` (placement rounds and reclaim), ``plan`` (the plan step).
May import: ``heteroflow.components.core``, ``devices``, ``errors``, ``heteroflow.cache``.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES_FROM = "heteroflow.components.placement.policies"


def __getattr__(name: str) -> Any:
    """The names of :mod:`heteroflow.components.placement.policies`, resolved on first use (PEP 562), so the module path
    ``heteroflow.components.placement`` that this package replaced keeps working (saved ``heteroflow.components.placement:NAME`` strings included)."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return getattr(importlib.import_module(_NAMES_FROM), name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
