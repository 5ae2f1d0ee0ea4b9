"""The mixed candidate's train task is its job's launcher and hosts the job's c10d store (#29 follow-up): both cluster
renderings give that task ``POD_IP`` from the downward API (``status.podIP``), the store's port
(``HETEROFLOW_RDZV_PORT``) and the label a NetworkPolicy admitting the port selects; a single-kind candidate's task
of the same call gets none of them.

- KFP: the compiled pipeline's kfp-kubernetes platform spec (``fieldPathAsEnv``, ``podMetadata``) and container env;
- Airflow: the pod ``KubernetesPodOperator.build_pod_request_obj`` builds (no cluster), validated with
  kubernetes-validate (strict).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from heteroflow.components.resources import Candidates
from heteroflow.components.training.mixed_job import RDZV_PORT
from heteroflow.components.training.mixed_launch import LAUNCHER_LABEL, POD_IP_ENV, PORT_ENV, pod_ip
from heteroflow.components.training.trainjob import PROFILE_ENV

PROFILE_YAML = """\
name: mixed
vendors: {nvidia: {labels: gfd}, ascend: {plugin: official, labels: npu-chip-name}}
images: {gpu: reg.example/hf:cuda, npu: reg.example/hf:cann8, cpu: reg.example/hf:cpu}
shared_storage: {claim: hf-shared}
"""
MIXED = "gpu:count=2+npu:count=4"
K8S_VERSION = "1.33.0"


def _profile() -> Any:
    from heteroflow.components.devices.cluster import ClusterProfile

    return ClusterProfile.from_dict(yaml.safe_load(PROFILE_YAML))


def _pipeline() -> Any:
    from heteroflow.pipelines.default import default_pipeline

    return default_pipeline(train_candidates=Candidates([MIXED, "cpu"]))


def test_the_kfp_rendering_gives_the_mixed_candidates_task_its_pod_ip_from_the_downward_api(tmp_path: Path) -> None:
    from heteroflow.pipelines.kfp.render import compile_pipeline

    path = compile_pipeline(_pipeline(), tmp_path / "p.yaml", profile=_profile())
    spec, platform = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    # the chain's tasks per candidate: the mixed one (candidate 0) is exec-train, the cpu one exec-train-2
    train = executors["exec-train"]
    assert train["fieldPathAsEnv"] == [{"name": POD_IP_ENV, "fieldPath": "status.podIP"}]
    assert train["podMetadata"]["labels"][LAUNCHER_LABEL] == "true"
    env = {e["name"]: e["value"] for e in spec["deploymentSpec"]["executors"]["exec-train"]["container"]["env"]}
    assert env[PORT_ENV] == str(RDZV_PORT) and json.loads(env[PROFILE_ENV])["name"] == "mixed"
    # the other train executors (the cpu candidate's) are plain pods: no downward-API POD_IP, no launcher label
    others = {k: executors.get(k, {}) for k in spec["deploymentSpec"]["executors"] if k.startswith("exec-train-")}
    assert others, sorted(spec["deploymentSpec"]["executors"])
    for name, settings in others.items():
        assert "fieldPathAsEnv" not in settings, name
        assert LAUNCHER_LABEL not in (settings.get("podMetadata") or {}).get("labels", {}), name
        container = spec["deploymentSpec"]["executors"][name]["container"]
        assert PORT_ENV not in {e["name"] for e in container.get("env") or []}, name


def test_kfp_local_compiles_no_kubernetes_settings_for_the_mixed_task(tmp_path: Path) -> None:
    """kfp.local never reads platform settings (and runs the kinds as local processes): none are written."""
    from heteroflow.pipelines.kfp.resources import apply_resources, without_kubernetes_settings
    from kfp import dsl

    @dsl.component(base_image="python:3.11")
    def noop():  # noqa: ANN202 - KFP reads the annotations: none, as a string "None" is not a type to it
        pass

    @dsl.pipeline(name="p")
    def body():  # noqa: ANN202
        with without_kubernetes_settings():
            apply_resources(noop(), Candidates([MIXED])[0], profile=_profile())

    from kfp import compiler

    out = tmp_path / "local.yaml"
    compiler.Compiler().compile(body, str(out))
    docs = list(yaml.safe_load_all(out.read_text(encoding="utf-8")))
    assert len(docs) == 1  # no kubernetes platform spec at all


def _airflow_pods(tmp_path: Path, **pod_kwargs: Any) -> dict[str, dict[str, Any]]:
    from kubernetes import client

    from heteroflow.dags.factory import build_dag
    from heteroflow.dags.pods import PodStepOperator

    kubeconfig = tmp_path / "kubeconfig.yaml"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: none, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: none, user: {}}]\ncontexts: [{name: none, context: {cluster: none, user: none}}]\n"
        "current-context: none\n")
    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE_YAML, encoding="utf-8")
    dag = build_dag(_pipeline(), "hf-mixed", mode="kubernetes", profile=profile, image="reg.example/hf:cpu",
                    run_root="/mnt/heteroflow-runs", pod_kwargs={"namespace": "ml", "in_cluster": False, "config_file": str(kubeconfig), **pod_kwargs})
    api = client.ApiClient()
    return {t.task_id: api.sanitize_for_serialization(t.build_pod_request_obj()) for t in dag.tasks if isinstance(t, PodStepOperator)}


def test_the_airflow_rendering_gives_the_mixed_candidates_pod_its_pod_ip_from_the_downward_api(tmp_path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is a dev extra")
    pods = _airflow_pods(tmp_path)
    trains = {tid: pod for tid, pod in pods.items() if tid.startswith("train")}
    assert len(trains) == 2, sorted(pods)
    launcher = [tid for tid, pod in trains.items() if LAUNCHER_LABEL in pod["metadata"].get("labels", {})]
    assert len(launcher) == 1, sorted(trains)
    for tid, pod in trains.items():
        assert kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "base"]  # beside it, the xcom sidecar
        env = {e["name"]: e for e in container["env"]}
        if tid in launcher:
            assert env[POD_IP_ENV] == {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
            assert env[PORT_ENV]["value"] == str(RDZV_PORT)
            assert json.loads(env[PROFILE_ENV]["value"])["name"] == "mixed"
            assert pod["metadata"]["labels"][LAUNCHER_LABEL] == "true"
            assert "HETEROFLOW_RUN_ID" in env  # the operator's own variables are kept beside it
        else:  # the cpu candidate's pod: a plain pod
            assert POD_IP_ENV not in env and PORT_ENV not in env, tid


def test_the_caller_may_set_pod_ip_itself_on_an_airflow_pod(tmp_path: Path) -> None:
    pods = _airflow_pods(tmp_path, env_vars={POD_IP_ENV: "10.9.8.7"})
    (launcher,) = [pod for tid, pod in pods.items() if LAUNCHER_LABEL in pod["metadata"].get("labels", {})]
    (container,) = [c for c in launcher["spec"]["containers"] if c["name"] == "base"]
    env = [e for e in container["env"] if e["name"] == POD_IP_ENV]
    assert env == [{"name": POD_IP_ENV, "value": "10.9.8.7"}]  # once, the caller's: no duplicate variable


def test_the_launcher_reads_the_rendered_pod_ip() -> None:
    assert pod_ip({POD_IP_ENV: "10.1.2.3"}) == "10.1.2.3"


def test_the_readmes_role_and_network_policy_are_valid_and_admit_the_rendered_port_to_the_launcher() -> None:
    """The README's mixed-cluster section: its Role and NetworkPolicy validate (kubernetes-validate, strict); the
    policy selects the label the renderings put on the launcher and admits the port they render, TCP."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is a dev extra")
    import re

    from heteroflow.components.devices.podplan import plan_pod

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Mixed jobs on a cluster"):]
    section = section[:section.index("\n## ")]
    docs = {d["kind"]: d for d in (yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", section, re.S))}
    for doc in docs.values():
        assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    (rule,) = docs["Role"]["rules"]
    assert rule["apiGroups"] == ["batch.volcano.sh"] and rule["resources"] == ["jobs"]
    assert set(rule["verbs"]) >= {"create", "get", "delete"}  # what launch_mixed_job calls
    plan = plan_pod(Candidates([MIXED])[0], _profile())
    policy = docs["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= plan.labels.items()  # it selects the launcher's pod
    (ingress,) = policy["ingress"]
    assert ingress["ports"] == [{"protocol": "TCP", "port": int(plan.env[PORT_ENV])}]
    assert ingress["from"] == [{"podSelector": {"matchExpressions": [{"key": "volcano.sh/job-name", "operator": "Exists"}]}}]
