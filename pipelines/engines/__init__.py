"""Engines behind one interface: the ``Engine`` protocol, its registry, ``heteroflow.run``, the in-process engine.

Owns: ``registry`` (the protocol and the registry; third-party engines through the ``heteroflow.engines``
entry-point group; its names are also this package's), ``runner`` (``heteroflow.run``), ``inprocess`` (with
``control_run``: its walk of conditions, loops and sub-pipelines).
May import: ``heteroflow.pipelines`` (graph, environment, runs), ``heteroflow.components``, ``heteroflow.cache``;
engine modules of other subpackages only by name through the registry.
"""

from heteroflow.components.core.lazy import names_from

__getattr__ = names_from(__name__, "heteroflow.pipelines.engines.registry")
