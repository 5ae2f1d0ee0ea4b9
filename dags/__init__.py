"""Airflow 3 rendering of heteroflow pipelines (imports go dags -> pipelines -> components -> cache).

- :func:`heteroflow.dags.factory.build_dag`: a Pipeline as a DAG, in ``local`` or ``kubernetes`` mode;
- :mod:`heteroflow.dags.layout`: the DAG's shape (task ids, fallback gates, pools, params), without Airflow;
- :mod:`heteroflow.dags.operators` / :mod:`heteroflow.dags.pods`: the tasks;
- :mod:`heteroflow.dags.control`: output parameters (XCom), conditions, loops (dynamic task mapping), sub-pipelines;
- :mod:`heteroflow.dags.volumes`: a call's env, volumes, image and packages on pods, and the per-run PVC tasks;
- :mod:`heteroflow.dags.engine`: the ``airflow`` engine (``heteroflow.run(engine="airflow")``), registered through the
  ``heteroflow.engines`` entry point;
- :mod:`heteroflow.dags.pools` and ``heteroflow airflow pools``: pools per device kind and accelerator model;
- ``example_default.py`` / ``example_asset.py``: example DAG files (this folder can be a DAGS_FOLDER).

Importing this package imports nothing from Airflow.
"""
