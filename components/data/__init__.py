"""Data: reading files, the bundled sample data sets, preprocessing into features, and the prewarm step.

Owns: the reader registry (``formats``; third-party readers through the ``heteroflow.readers`` entry-point
group), the readers themselves (``readers``, ``datasets``; cell cleaning in ``cells``, how a text table is read
in ``csvformat``, with pyarrow's reader where the file allows in ``arrowcsv``), the preprocess step (``preprocess``; its parameter checks in ``parameters``, the decisions on
the class and feature columns in ``columns``, the split and the shards it writes in ``shards``) and its fitted
table transform (``tabular``; its statistics learned and applied with numpy alone in ``colstats``), the data set's checks before a run (``precheck``), and the prewarm step
(``prewarm``, over :mod:`heteroflow.cache`). The folders beside these modules hold the bundled data sets with their
licences (README.md).
May import: ``heteroflow.components.core``, ``heteroflow.components.devices``, ``heteroflow.components.errors``,
``heteroflow.cache``.
"""
