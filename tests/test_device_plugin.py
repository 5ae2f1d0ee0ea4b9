"""The example device-kind plugin (examples/device_plugin): installed into a folder (never the venv) and put on
PYTHONPATH, its ``tpu`` kind works end to end: a run that falls back from a faulty simulated TPU to the CPU, the
Airflow pods and the compiled KFP YAML asking Kubernetes for ``google.com/tpu``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "examples" / "device_plugin"

RENDER = textwrap.dedent(
    """
    import json, sys
    from kubernetes import client
    from heteroflow.components.devices import DeviceKind
    from heteroflow.components.resources import Resources
    from heteroflow.dags.factory import build_dag
    from heteroflow.dags.pods import PodStepOperator
    from heteroflow.pipelines.default import default_pipeline

    p = default_pipeline()
    p.replace("train", candidates=[Resources(kind="tpu", count=4, cpu="8", memory="32Gi"),
                                   Resources(kind="cpu", cpu="8", memory="16Gi")])
    dag = build_dag(p, "hf-tpu", mode="kubernetes", image="registry.example.com/heteroflow:0.1.0",
                    run_root="/runs", pod_kwargs={"namespace": "ml", "in_cluster": False, "config_file": sys.argv[1]})
    api = client.ApiClient()
    pods = {t.task_id: api.sanitize_for_serialization(t.build_pod_request_obj())
            for t in dag.tasks if isinstance(t, PodStepOperator)}
    print(json.dumps({"kinds": [k.value for k in DeviceKind], "pods": pods}))
    """
)

KUBECONFIG = (
    "apiVersion: v1\\nkind: Config\\nclusters: [{name: none, cluster: {server: 'https://127.0.0.1:9'}}]\\n"
    "users: [{name: none, user: {}}]\\ncontexts: [{name: none, context: {cluster: none, user: none}}]\\n"
    "current-context: none\\n"
).replace("\\n", "\n")


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    target = tmp_path_factory.mktemp("plugin")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--target", str(target),
         str(PLUGIN)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    assert (target / "heteroflow_tpu.py").exists()
    path = os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))
    home = tmp_path_factory.mktemp("home")
    return {**os.environ, "PYTHONPATH": path, "HETEROFLOW_HOME": str(home)}


@pytest.mark.slow
def test_a_run_falls_back_from_a_faulty_plugin_tpu_to_the_cpu(plugin_env: dict[str, str], tmp_path: Path) -> None:
    env = {**plugin_env, "HETEROFLOW_SIMULATE_DEVICES": "tpu", "HETEROFLOW_INJECT_FAULT": "train@tpu=device"}
    exe = Path(sys.executable).with_name("heteroflow")
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [str(exe), "run", "--engine", "inprocess", "-c", "tpu", "-c", "cpu", "--param", "epochs=1",
         "--output", str(run_dir)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded"
    assert record["placement"]["train"]["device_kind"] == "tpu"
    assert record["placement"]["train"]["torch_device"] == "xla"
    train = next(s for s in record["steps"] if s["name"] == "train")
    assert (train["status"], train["kind"], train["candidate"], train["attempts"]) == ("succeeded", "cpu", 1, 2)
    assert "train@tpu=device" in json.dumps(record["fallbacks"])
    metrics = (run_dir / "metrics.prom").read_text()  # the run's metrics and report carry the plugin kind
    assert 'device_kind="tpu",failure_class="device"' in metrics
    assert "tpu" in (run_dir / "report.html").read_text()


@pytest.mark.slow
def test_airflow_pods_and_kfp_yaml_ask_for_the_plugin_resource(plugin_env: dict[str, str], tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig.yaml"
    kubeconfig.write_text(KUBECONFIG)
    out = subprocess.run([sys.executable, "-c", RENDER, str(kubeconfig)], capture_output=True, text=True,
                         env=plugin_env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rendered = json.loads(out.stdout.strip().splitlines()[-1])
    assert rendered["kinds"] == ["cpu", "gpu", "npu", "tpu"]
    tpu_pods = {k: v for k, v in rendered["pods"].items() if k.startswith("train.tpu")}
    assert tpu_pods, sorted(rendered["pods"])
    for pod in tpu_pods.values():
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources["limits"]["google.com/tpu"] == "4"
        assert resources["requests"]["google.com/tpu"] == "4"
        assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    cpu_pods = [v for k, v in rendered["pods"].items() if k.startswith("train.cpu")]
    assert cpu_pods and all("google.com/tpu" not in p["spec"]["containers"][0]["resources"].get("limits", {}) for p in cpu_pods)

    exe = Path(sys.executable).with_name("heteroflow")
    compiled = tmp_path / "pipeline.yaml"
    out = subprocess.run([str(exe), "compile", "-c", "tpu:count=2", "-c", "cpu", "-o", str(compiled)],
                         capture_output=True, text=True, env=plugin_env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    text = compiled.read_text()
    assert "resourceType: google.com/tpu" in text
    assert "name: train on tpu (candidate 0)" in text
