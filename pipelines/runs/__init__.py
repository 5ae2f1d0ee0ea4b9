"""Runs: run records and folders, reading them back, the HTML report and the Prometheus metrics.

Owns: ``records`` (writing ``run.json`` and attempt records), ``folders`` (reading run folders of any engine), ``report``
(``report.html``; its ``sections``, ``charts`` (matplotlib plots as inline SVG), ``markup`` (style sheet, escaping,
formats) and ``prerendering`` (matplotlib imported and plots drawn while a run goes on)), ``metrics`` (``metrics.prom``
and ``heteroflow metrics serve``).
May import: ``heteroflow.components``, ``heteroflow.cache``; not the engines or the CLI.
"""

from heteroflow.components.core.lazy import names_from

__getattr__ = names_from(__name__, "heteroflow.pipelines.runs.folders")
