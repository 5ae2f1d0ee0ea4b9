"""Example Airflow DAGs: train when the prewarmed data set (an Airflow Asset) is updated.

- ``heteroflow-prewarm`` runs the default pipeline's data-source calls (those that read no artifact and place
  nothing: prewarm) every hour; when the data set has been prewarmed into the cache tier, the Asset
  ``heteroflow-prewarmed-dataset`` gets an event (its ``extra``: the run folder, the output paths and the
  step's facts: files and bytes copied).
- ``heteroflow-train-on-prewarm`` is the whole default pipeline, scheduled on that Asset: every update starts a
  training run. Its own prewarm finds the data set cached and verified and copies nothing.

Use them from your own DAGS_FOLDER with a two-line file::

    # heteroflow_asset_dags.py (the words "airflow" and "dag" must appear for Airflow to parse the file)
    from heteroflow.dags.example_asset import prewarm_dag, train_dag
"""

from __future__ import annotations

from airflow.sdk import Asset

from heteroflow.dags.factory import build_dag
from heteroflow.dags.layout import subset
from heteroflow.pipelines.default import default_pipeline

PREWARMED = Asset("heteroflow-prewarmed-dataset")
"""Updated each time ``heteroflow-prewarm`` has (re)filled the cache tier with the data set."""

_pipeline = default_pipeline()
_sources = [c.name for c in _pipeline.calls if not c.input_refs() and not c.step.planner]

prewarm_dag = build_dag(
    subset(_pipeline, _sources, name="heteroflow-prewarm", description="prewarm the data set into the cache tier"),
    "heteroflow-prewarm",
    schedule="@hourly",
    outlets={name: [PREWARMED] for name in _sources},
)
train_dag = build_dag(_pipeline, "heteroflow-train-on-prewarm", schedule=[PREWARMED])
