"""Which pools a DAG's tasks use, as ``prepare-run`` checks them (#16.14; the real-Airflow runs are in
test_airflow_pools.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("airflow", reason="the airflow extra is not installed")

from heteroflow.dags.factory import build_dag  # noqa: E402
from heteroflow.dags.pools import pools_in_use  # noqa: E402
from heteroflow.pipelines.default import default_pipeline  # noqa: E402


def test_the_pools_a_dag_uses_with_the_most_slots_one_task_takes() -> None:
    assert pools_in_use(build_dag(default_pipeline(), "hf-a").tasks) == {"heteroflow-npu": 1, "heteroflow-gpu": 1}
    pipeline = default_pipeline(train_candidates=["gpu:count=2", "gpu:accelerator=t4", "npu:accelerator=ascend-910b3,count=4", "cpu"])
    assert pools_in_use(build_dag(pipeline, "hf-b").tasks) == {
        "heteroflow-gpu": 2,
        "heteroflow-gpu-nvidia-t4": 1,
        "heteroflow-npu-ascend-910b3": 4,
    }
    assert pools_in_use(build_dag(default_pipeline(), "hf-c", pools=False).tasks) == {}  # pools turned off
