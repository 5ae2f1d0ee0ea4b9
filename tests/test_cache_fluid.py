"""Fluid Dataset / AlluxioRuntime / DataLoad manifests validated against the real CRDs (unknown fields
rejected), and data-locality hints as preferred node affinity validated in a Pod against Kubernetes' schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from heteroflow.cache.crds import crd_path
from heteroflow.cache.errors import DatasetError, InvalidCacheOption
from heteroflow.cache.fluid import (
    alluxio_runtime,
    data_load,
    fluid_dataset,
    fluid_manifests,
    fluid_node_label,
    locality_affinity,
    validate_manifest,
)

CRDS = {kind: crd_path(kind) for kind in ("Dataset", "AlluxioRuntime", "DataLoad")}


@pytest.fixture(autouse=True)
def _schemas_present() -> None:
    missing = [str(p) for p in CRDS.values() if not p.is_file()]
    assert not missing, f"the CRD schemas shipped in heteroflow.cache are missing: {missing}"


def test_manifests_validate_against_the_crds():
    manifests = fluid_manifests("digits", "s3://datasets/digits/", namespace="ml", credentials_secret="s3-creds",
                                replicas=2, medium="SSD", quota="20Gi")
    assert [m["kind"] for m in manifests] == ["Dataset", "AlluxioRuntime", "DataLoad"]
    for m in manifests:
        validate_manifest(m, CRDS[m["kind"]])
    dataset, runtime, load = manifests
    [mount] = dataset["spec"]["mounts"]
    assert mount["mountPoint"] == "s3://datasets/digits/"
    assert mount["encryptOptions"] == [
        {"name": "aws.accessKeyId", "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "aws.accessKeyId"}}},
        {"name": "aws.secretKey", "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "aws.secretKey"}}},
    ]
    assert runtime["spec"]["tieredstore"]["levels"][0] == {"mediumtype": "SSD", "path": "/dev/shm", "quota": "20Gi",
                                                           "high": "0.95", "low": "0.7"}
    assert load["spec"]["dataset"] == {"name": "digits", "namespace": "ml"}


@pytest.mark.parametrize(
    ("kind", "mutate", "where"),
    [
        ("Dataset", lambda m: m["spec"]["mounts"][0].update(mountpoint="typo"), "spec.mounts.0"),
        ("AlluxioRuntime", lambda m: m["spec"].update(replica=3), "spec"),
        ("AlluxioRuntime", lambda m: m["spec"]["tieredstore"]["levels"][0].update(mediumtype=7), "spec.tieredstore.levels.0.mediumtype"),
        ("DataLoad", lambda m: m["spec"]["target"][0].pop("path"), "spec.target.0"),
    ],
    ids=["misspelled-field", "unknown-field", "wrong-type", "missing-required"],
)
def test_bad_manifests_are_rejected(kind: str, mutate, where: str):
    m = {"Dataset": fluid_dataset("d", "https://h/d/"), "AlluxioRuntime": alluxio_runtime("d"),
         "DataLoad": data_load("d-warm", dataset="d")}[kind]
    validate_manifest(m, CRDS[kind])
    mutate(m)
    with pytest.raises(InvalidCacheOption, match=rf"^{kind} d(-warm)?: {where}: "):
        validate_manifest(m, CRDS[kind])


def test_credentials_never_reach_a_manifest():
    with pytest.raises(DatasetError, match=r"https://\*\*\*@h/d/ carries credentials; .*Kubernetes Secret"):
        fluid_dataset("d", "https://alice:s3cretPW@h/d/")
    with pytest.raises(InvalidCacheOption, match=r"needs secret_keys for gs://"):
        fluid_dataset("d", "gs://b/d", credentials_secret="gcs")


def test_bad_values():
    with pytest.raises(InvalidCacheOption, match=r"name 'Digits_1' is not a valid Kubernetes name"):
        fluid_dataset("Digits_1", "s3://b/d")
    with pytest.raises(InvalidCacheOption, match=r"medium='NVME' is not a Fluid medium; valid: MEM, SSD, HDD"):
        alluxio_runtime("d", medium="NVME")
    with pytest.raises(InvalidCacheOption, match=r"quota='2GB' is not a Kubernetes quantity"):
        alluxio_runtime("d", quota="2GB")
    with pytest.raises(InvalidCacheOption, match=r"weight=0 is out of range"):
        locality_affinity(nodes=["n1"], weight=0)


def test_locality_affinity_in_a_pod_validates_against_kubernetes():
    import kubernetes_validate

    affinity = locality_affinity(nodes=["gpu-node-2", "gpu-node-1"], dataset="digits", namespace="ml")
    terms = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [t["preference"]["matchExpressions"][0]["key"] for t in terms] == [fluid_node_label("digits", "ml"),
                                                                             "kubernetes.io/hostname"]
    assert terms[1]["preference"]["matchExpressions"][0]["values"] == ["gpu-node-1", "gpu-node-2"]
    assert fluid_node_label("digits", "ml") == "fluid.io/s-ml-digits"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train"},
           "spec": {"affinity": affinity, "containers": [{"name": "train", "image": "heteroflow:0.1.0"}]}}
    kubernetes_validate.validate(pod, "1.30.0", strict=True)
    assert locality_affinity() == {}


def test_the_example_renders_valid_manifests():
    import subprocess
    import sys

    import yaml

    script = Path(__file__).resolve().parents[1] / "examples" / "fluid_cache.py"
    out = subprocess.run([sys.executable, str(script), "s3://datasets/digits/", "--name", "digits", "--secret", "s3-creds"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert [d["kind"] for d in docs] == ["Dataset", "AlluxioRuntime", "DataLoad"]
    for d in docs:
        validate_manifest(d, CRDS[d["kind"]])
    assert "fluid.io/s-default-digits" in out
