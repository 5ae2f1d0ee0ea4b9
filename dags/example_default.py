"""Example Airflow DAG: heteroflow's default pipeline every night at 03:00 UTC, in local mode.

prepare-run -> prewarm -> preprocess -> plan -> train (npu, else gpu, else cpu; one task per candidate, a
fallback gate between them) -> evaluate -> archive -> record-run. Parameters are the pipeline's (the DAG's
params; ``dataset_uri`` empty takes the digits sample). Accelerator tasks take slots of the pools
``heteroflow-npu`` / ``heteroflow-gpu`` (create them with ``heteroflow airflow pools``).

Use it from your own DAGS_FOLDER with a two-line file::

    # heteroflow_dags.py (the words "airflow" and "dag" must appear for Airflow to parse the file)
    from heteroflow.dags.example_default import dag
"""

from __future__ import annotations

from heteroflow.dags.factory import build_dag
from heteroflow.pipelines.default import default_pipeline

dag = build_dag(default_pipeline(), "heteroflow-default", schedule="0 3 * * *")
