"""Server-side dry run of the rendered manifests on a real cluster (integration; runs only when
HETEROFLOW_KUBECONFIG names a kubeconfig whose cluster has the Volcano, Kueue and Kubeflow Trainer CRDs installed).

The API server then checks what the schemas here cannot: CEL rules (``x-kubernetes-validations``), defaulting and
the admission webhooks of Kueue and Volcano. Namespaced objects go to HETEROFLOW_K8S_NAMESPACE (default: default).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from heteroflow.components.devices.cluster import load_profile
from heteroflow.components.resources import Candidates
from heteroflow.pipelines.k8s.manifests import load_inventory, render_all

ROOT = Path(__file__).resolve().parent.parent
KUBECONFIG = os.environ.get("HETEROFLOW_KUBECONFIG", "")

pytestmark = pytest.mark.skipif(
    not KUBECONFIG, reason="HETEROFLOW_KUBECONFIG is not set: no cluster to dry-run the manifests against"
)


@pytest.mark.slow
@pytest.mark.parametrize("profile_name", ["ascend-official", "kueue-gke", "nvidia-gfd"])
@pytest.mark.parametrize("training_job", ["trainjob", "pytorchjob"])
def test_manifests_pass_a_server_side_dry_run(profile_name: str, training_job: str) -> None:
    from kubernetes import config, dynamic
    from kubernetes.client import api_client

    namespace = os.environ.get("HETEROFLOW_K8S_NAMESPACE", "default")
    inv = load_inventory(ROOT / "examples" / "manifests" / "inventory.yaml")
    inv = dataclasses.replace(inv, queues=tuple(dataclasses.replace(q, namespaces=(namespace,)) for q in inv.queues))
    profile = dataclasses.replace(load_profile(ROOT / "examples" / "profiles" / f"{profile_name}.yaml"), training_job=training_job)
    files = render_all(inv, Candidates(["npu:accelerator=910b3", "gpu:accelerator=a100-80gb", "cpu:cpu=8"]), profile,
                       namespace=namespace, image="registry.example.com/heteroflow:train")
    config.load_kube_config(config_file=KUBECONFIG)  # sets the client's default configuration
    client = dynamic.DynamicClient(api_client.ApiClient())
    for docs in files.values():
        for doc in docs:
            api = client.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            ns = doc["metadata"].get("namespace") if api.namespaced else None
            api.create(body=doc, namespace=ns, dry_run="All")  # raises ApiException with the server's reason
