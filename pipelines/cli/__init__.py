"""The ``heteroflow`` command line: the console script and one module per command group.

Owns: ``script`` (the console script: starts kfp.local's step processes before the command line is imported),
``main`` (the typer app and ``heteroflow run``; its names are also this package's), ``common`` (what every command
shares: the consoles, the one-line error, ``--param`` pairs, ``--pipeline``), ``summary`` (the steps table and what
``heteroflow run`` prints at its end), ``step``, ``archive``, ``cache``, ``manifests``, ``predict``, ``runs``,
``simulate``, ``train`` (the other commands and command groups).
May import: everything in ``heteroflow.pipelines``, ``heteroflow.components``, ``heteroflow.cache``; the Airflow group
(``heteroflow.dags``) only through the ``heteroflow.cli`` entry point.
"""

from heteroflow.components.core.lazy import names_from

__getattr__ = names_from(__name__, "heteroflow.pipelines.cli.main")
