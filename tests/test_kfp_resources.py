"""Resources rendered onto KFP tasks (``heteroflow.pipelines.kfp.resources.apply_resources``), compiled with the real
KFP compiler.

- Four public pipelines' resource intent, written once with heteroflow and once in plain KFP + kfp.kubernetes,
  compiled both ways and compared field by field (task resources, retry, caching, and the kfp-kubernetes platform
  spec: node selector, node affinity, tolerations, pod labels and annotations):
  1. kubeflow/pipelines samples/v2/kubernetes_task_config.py: CPU 100m / memory 100Mi requests and limits, one
     NVIDIA GPU, node selector disktype=ssd, a NoExecute toleration, a node-affinity term, caching off;
  2. kubeflow/pipelines samples/v2/pipeline_with_retry.py: retries with backoff, no resources;
  3. a practitioner's fine-tune asking for a T4 with an 8G memory limit (written there for Vertex AI as
     ``set_accelerator_type("NVIDIA_TESLA_T4")``; on open-source KFP on GKE that is nvidia.com/gpu plus GKE's
     cloud.google.com/gke-accelerator label and the GPU taint's toleration, here on a Kueue cluster);
  4. a practitioner's train step: request 1 CPU / 2Gi, limit 2 CPU / 4Gi.
- A golden file per example profile (tests/golden/kfp_resources_<profile>.yaml): each candidate's compiled task
  resources, its kfp-kubernetes config and the pod builder's output. Regenerate after an intended change with
  ``HETEROFLOW_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_kfp_resources.py -k golden`` and review the diff.
"""

# No "from __future__ import annotations": KFP reads the component's annotations as types.
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

kfp = pytest.importorskip("kfp")
pytest.importorskip("kfp.kubernetes")
from kfp import compiler, dsl  # noqa: E402
from kfp import kubernetes as kfp_k8s  # noqa: E402
from kubernetes import client  # noqa: E402

from heteroflow.components.devices.cluster import ClusterProfile, load_profile  # noqa: E402
from heteroflow.components.errors import InvalidResources  # noqa: E402
from heteroflow.components.resources import Resources, RetryPolicy  # noqa: E402
from heteroflow.pipelines.k8s.resources import build_pod_resources  # noqa: E402
from heteroflow.pipelines.kfp.render import apply_retry  # noqa: E402
from heteroflow.pipelines.kfp.resources import apply_resources, kfp_memory_text  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "examples" / "profiles"
GOLDEN_DIR = Path(__file__).parent / "golden"
UPDATE_GOLDEN_ENV = "HETEROFLOW_UPDATE_GOLDEN"
PLAIN = ClusterProfile.from_dict({"name": "plain", "accelerator_tolerations": False})

pytestmark = pytest.mark.filterwarnings("ignore:The default base_image used by the @dsl.component:FutureWarning")


@dsl.component(base_image="python:3.11")
def step(text: str) -> str:
    return text


def _compile(pipeline_func: Any, tmp_path: Path) -> dict[str, dict[str, Any]]:
    """Compile with KFP's compiler; per task: its resources, retry, caching and kfp-kubernetes executor config."""
    path = tmp_path / f"{pipeline_func.name}.yaml"
    compiler.Compiler().compile(pipeline_func, str(path))
    docs = list(yaml.safe_load_all(path.read_text()))
    spec = docs[0]
    platform = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"] if len(docs) > 1 else {}
    out = {}
    for name, task in spec["root"]["dag"]["tasks"].items():
        executor = spec["components"][task["componentRef"]["name"]]["executorLabel"]
        container = spec["deploymentSpec"]["executors"][executor]["container"]
        out[name] = {
            "resources": container.get("resources"),
            "retry": task.get("retryPolicy"),
            "caching": task.get("cachingOptions"),
            "kubernetes": platform.get(executor),
        }
    return out


# --- 1. samples/v2/kubernetes_task_config.py -----------------------------------------------------------------

SAMPLE_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["ssd"]}]}]
        }
    }
}


@dsl.pipeline(name="task-config-kfp")
def task_config_kfp():
    t = (
        step(text="x")
        .set_caching_options(False)
        .set_cpu_request("100m")
        .set_memory_request("100Mi")
        .set_cpu_limit("100m")
        .set_memory_limit("100Mi")
        .set_accelerator_type("nvidia.com/gpu")
        .set_accelerator_limit(1)
    )
    kfp_k8s.add_node_selector(t, label_key="disktype", label_value="ssd")
    kfp_k8s.add_toleration(t, key="example-key", operator="Exists", effect="NoExecute", toleration_seconds=3600)
    kfp_k8s.add_node_affinity(t, match_expressions=[{"key": "disktype", "operator": "In", "values": ["ssd"]}])


SAMPLE = Resources(
    kind="gpu",
    cpu="100m",
    memory="100Mi",
    node_selector={"disktype": "ssd"},
    tolerations=[{"key": "example-key", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 3600}],
    affinity=SAMPLE_AFFINITY,
)


@dsl.pipeline(name="task-config-heteroflow")
def task_config_heteroflow():
    apply_resources(step(text="x").set_caching_options(False), SAMPLE, profile=PLAIN)


# --- 2. samples/v2/pipeline_with_retry.py ---------------------------------------------------------------------


@dsl.pipeline(name="retry-kfp")
def retry_kfp():
    step(text="x").set_retry(num_retries=2, backoff_duration="0s", backoff_factor=2, backoff_max_duration="3600s")


@dsl.pipeline(name="retry-heteroflow")
def retry_heteroflow():
    task = apply_resources(step(text="x"), Resources(cpu=None, memory=None))
    apply_retry(task, RetryPolicy(retries=2, backoff_seconds=0, factor=2, max_delay_seconds=3600))


# --- 3. a fine-tune on a T4 with an 8G memory limit, on a GKE cluster behind Kueue ------------------------------


@dsl.pipeline(name="finetune-kfp")
def finetune_kfp():
    t = step(text="x").set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(1).set_memory_limit("8G")
    kfp_k8s.add_node_selector(t, label_key="cloud.google.com/gke-accelerator", label_value="nvidia-tesla-t4")
    kfp_k8s.add_toleration(t, key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
    kfp_k8s.add_pod_label(t, label_key="app.kubernetes.io/part-of", label_value="heteroflow")
    kfp_k8s.add_pod_label(t, label_key="kueue.x-k8s.io/queue-name", label_value="team-ml")


FINETUNE = Resources(accelerator="NVIDIA_TESLA_T4", cpu=None, memory=None, memory_limit="8G")


@dsl.pipeline(name="finetune-heteroflow")
def finetune_heteroflow():
    apply_resources(step(text="x"), FINETUNE, profile=load_profile(PROFILES / "kueue-gke.yaml"))


# --- 4. a train step: request 1 CPU / 2Gi, limit 2 CPU / 4Gi ------------------------------------------------------


@dsl.pipeline(name="train-kfp")
def train_kfp():
    step(text="x").set_cpu_request("1").set_cpu_limit("2").set_memory_request("2Gi").set_memory_limit("4Gi")


@dsl.pipeline(name="train-heteroflow")
def train_heteroflow():
    apply_resources(step(text="x"), Resources(cpu="1", memory="2Gi", cpu_limit="2", memory_limit="4Gi"))


PAIRS = [
    ("kubernetes-task-config", task_config_kfp, task_config_heteroflow),
    ("retry", retry_kfp, retry_heteroflow),
    ("finetune-t4-8G", finetune_kfp, finetune_heteroflow),
    ("train-requests-limits", train_kfp, train_heteroflow),
]


@pytest.mark.parametrize(("plain", "ours"), [(p, o) for _, p, o in PAIRS], ids=[n for n, _, _ in PAIRS])
def test_heteroflow_compiles_to_what_plain_kfp_compiles_to(plain, ours, tmp_path):
    expected, actual = _compile(plain, tmp_path), _compile(ours, tmp_path)
    assert list(actual) == list(expected) == ["step"]
    for field in ("resources", "retry", "caching", "kubernetes"):
        assert actual["step"][field] == expected["step"][field], field


def test_the_compared_fields_are_really_there(tmp_path):
    """The comparison above compares real content, not two empty dicts."""
    sample = _compile(task_config_heteroflow, tmp_path)["step"]
    assert sample["resources"]["resourceCpuRequest"] == sample["resources"]["resourceCpuLimit"] == "100m"
    assert sample["resources"]["resourceMemoryLimit"] == "100Mi"
    assert sample["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"
    assert sample["kubernetes"]["nodeSelector"] == {"labels": {"disktype": "ssd"}}
    assert sample["kubernetes"]["tolerations"] == [
        {"key": "example-key", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": "3600"}
    ]
    assert sample["kubernetes"]["nodeAffinity"] == [{"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["ssd"]}]}]
    assert sample["caching"] == {}  # caching off
    finetune = _compile(finetune_heteroflow, tmp_path)["step"]
    assert finetune["resources"]["resourceMemoryLimit"] == "8G"  # not 7812500Ki
    assert "resourceMemoryRequest" not in finetune["resources"] and "resourceCpuLimit" not in finetune["resources"]
    assert finetune["kubernetes"]["podMetadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-ml"
    train = _compile(train_heteroflow, tmp_path)["step"]
    assert (train["resources"]["resourceCpuRequest"], train["resources"]["resourceCpuLimit"]) == ("1", "2")
    assert (train["resources"]["resourceMemoryRequest"], train["resources"]["resourceMemoryLimit"]) == ("2Gi", "4Gi")
    retry = _compile(retry_heteroflow, tmp_path)["step"]
    assert retry["resources"] is None and retry["kubernetes"] is None
    assert retry["retry"]["maxRetryCount"] == 2


# --- Goldens: one per example profile --------------------------------------------------------------------------

GOLDEN_CANDIDATES: dict[str, dict[str, Resources]] = {
    "nvidia-gfd": {
        "cpu-small": Resources(cpu="2", memory="4Gi"),
        "t4-8G": Resources(accelerator="T4", cpu="4", memory="8G"),
        "any-nvidia": Resources(kind="gpu", cpu="8", memory="32Gi"),
        "nvidia-40Gi-bf16-x2": Resources(kind="gpu", count=2, cpu="16", memory="64Gi", device_memory="40Gi", precision="bf16"),
    },
    "ascend-official": {
        "910b3-x1": Resources(accelerator="Ascend 910B3", count=1, cpu="8", memory="32Gi"),
        "any-910b-x8": Resources(accelerator="910B", count=8, cpu="64", memory="512Gi"),
        "any-910": Resources(kind="npu", cpu="8", memory="32Gi"),
        "310p": Resources(accelerator="310P", cpu="4", memory="16Gi"),
    },
    "ascend-hami": {
        "910b3-x1": Resources(accelerator="Ascend 910B3", count=1, cpu="8", memory="32Gi"),
        "910a-x2": Resources(accelerator="ascend-910a", count=2, cpu="8", memory="32Gi"),
        "310p": Resources(accelerator="310P", cpu="4", memory="16Gi"),
    },
    "kueue-gke": {
        "t4-limit-8G": FINETUNE,
        "l4-bf16": Resources(accelerator="L4", precision="bf16", cpu="4", memory="16Gi", memory_limit="24Gi"),
        "nvidia-80Gi": Resources(kind="gpu", device_memory="80Gi", cpu="12", memory="85G"),
        "cpu": Resources(cpu="500m", memory="1Gi"),
    },
}


def _golden_data(profile_name: str, tmp_path: Path) -> dict[str, Any]:
    """What apply_resources() compiles to and the pod build_pod_resources() makes, per candidate of a profile."""
    profile = load_profile(PROFILES / f"{profile_name}.yaml")
    candidates = GOLDEN_CANDIDATES[profile_name]

    @dsl.pipeline(name=f"golden-{profile_name}")
    def pipeline():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the scheduler_name note, tested on its own below
            for key, resources in candidates.items():
                apply_resources(step(text=key).set_display_name(key), resources, profile=profile)

    compiled = _compile(pipeline, tmp_path)
    out = {}
    for index, (key, resources) in enumerate(candidates.items()):
        task = compiled["step" if index == 0 else f"step-{index + 1}"]
        pod = client.ApiClient().sanitize_for_serialization(build_pod_resources(resources, profile).pod(name=key.lower()))
        out[key] = {
            "candidate": resources.describe(),
            "kfp": {"resources": task["resources"], "kubernetes": task["kubernetes"]},
            "pod": {"metadata": pod["metadata"], "spec": pod["spec"]},
        }
    return out


@pytest.mark.parametrize("profile_name", sorted(GOLDEN_CANDIDATES))
def test_golden_per_profile(profile_name, tmp_path):
    data = _golden_data(profile_name, tmp_path)
    golden = GOLDEN_DIR / f"kfp_resources_{profile_name}.yaml"
    if os.environ.get(UPDATE_GOLDEN_ENV) == "1":
        header = (
            f"# apply_resources() and build_pod_resources() under examples/profiles/{profile_name}.yaml.\n"
            f"# Regenerate: {UPDATE_GOLDEN_ENV}=1 .venv/bin/pytest tests/test_kfp_resources.py -k golden\n"
        )
        golden.write_text(header + yaml.safe_dump(data, sort_keys=True, width=120))
    expected = yaml.safe_load(golden.read_text())
    assert set(data) == set(expected)
    for key in expected:
        assert data[key] == expected[key], f"{profile_name}/{key} differs from {golden.name}"


@pytest.mark.parametrize("profile_name", sorted(GOLDEN_CANDIDATES))
def test_every_golden_pod_is_a_valid_pod(profile_name, tmp_path):
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (the dev extra) is not installed: pods are not validated")
    data = _golden_data(profile_name, tmp_path)
    assert data
    for key, entry in data.items():
        pod = {"apiVersion": "v1", "kind": "Pod", **entry["pod"]}
        assert kubernetes_validate.validate(pod, "1.33.0", strict=True) == "1.33", key


def test_910b3_compiles_per_profile(tmp_path):
    official = _golden_data("ascend-official", tmp_path)["910b3-x1"]
    assert official["kfp"]["resources"]["accelerator"]["resourceType"] == "huawei.com/Ascend910"
    assert official["kfp"]["kubernetes"]["nodeSelector"] == {"labels": {"node.kubernetes.io/npu.chip.name": "910B3"}}
    hami = _golden_data("ascend-hami", tmp_path)["910b3-x1"]
    assert hami["kfp"]["resources"]["accelerator"]["resourceType"] == "huawei.com/Ascend910B3"
    assert hami["kfp"]["kubernetes"] is None  # no label, no toleration, no queue
    assert official["pod"]["spec"]["containers"][0]["resources"]["limits"]["huawei.com/Ascend910"] == "1"
    assert hami["pod"]["spec"]["containers"][0]["resources"]["limits"]["huawei.com/Ascend910B3"] == "1"


# --- What KFP cannot say ------------------------------------------------------------------------------------------


def test_scheduler_name_warns_that_kfp_cannot_set_it(tmp_path):
    profile = load_profile(PROFILES / "ascend-official.yaml")

    @dsl.pipeline(name="volcano")
    def pipeline():
        with pytest.warns(UserWarning, match=r"scheduler_name='volcano', which KFP cannot set on a task; make it the namespace"):
            apply_resources(step(text="x"), Resources(accelerator="910B3"), profile=profile)

    compiled = _compile(pipeline, tmp_path)["step"]
    assert compiled["kubernetes"]["podMetadata"]["annotations"] == {"scheduling.volcano.sh/queue-name": "default"}
    assert "schedulerName" not in yaml.safe_dump(compiled)


def test_pod_affinity_is_an_error_on_kfp(tmp_path):
    @dsl.pipeline(name="anti")
    def pipeline():
        anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname"}]}}
        with pytest.raises(InvalidResources, match=r"^affinity.podAntiAffinity cannot be set on a KFP task: kfp-kubernetes sets node affinity only"):
            apply_resources(step(text="x"), Resources(affinity=anti))

    compiler.Compiler().compile(pipeline, str(tmp_path / "p.yaml"))


def test_preferred_node_affinity_keeps_its_weight(tmp_path):
    affinity = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 20, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
            ]
        }
    }

    @dsl.pipeline(name="preferred")
    def pipeline():
        apply_resources(step(text="x"), Resources(affinity=affinity))

    compiled = _compile(pipeline, tmp_path)["step"]
    assert compiled["kubernetes"]["nodeAffinity"] == [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}], "weight": 20}
    ]


def test_returns_the_task_for_chaining(tmp_path):
    @dsl.pipeline(name="chain")
    def pipeline():
        task = step(text="x")
        assert apply_resources(task, Resources()) is task

    compiler.Compiler().compile(pipeline, str(tmp_path / "p.yaml"))


KFP_MEMORY = [("8G", 8 * 10**9, "8G"), ("1.5Gi", 3 * 2**29, "1536Mi"), ("2000k", 2 * 10**6, "2M"), ("1500", 1500, "1500"), ("3k", 3000, "3000")]


@pytest.mark.parametrize(("text", "num", "expected"), KFP_MEMORY, ids=[t for t, _, _ in KFP_MEMORY])
def test_kfp_memory_text(text, num, expected):
    assert kfp_memory_text(text, num) == expected


def test_memory_kfp_cannot_spell_is_rendered_exactly(tmp_path):
    @dsl.pipeline(name="kilo")
    def pipeline():
        apply_resources(step(text="x"), Resources(memory="1.5Gi", memory_limit="3Gi"))

    res = _compile(pipeline, tmp_path)["step"]["resources"]
    assert (res["resourceMemoryRequest"], res["resourceMemoryLimit"]) == ("1536Mi", "3Gi")


# --- Issue #10 done-when: bad input, each a clear error naming the field and the valid choices ------------------

DONE_WHEN_ERRORS = [
    ("unknown-model", lambda: Resources(accelerator="T5"), r"^accelerator='T5' is unknown; .*valid: amd-gpu, "),
    ("device-memory-beyond-model", lambda: Resources(accelerator="T4", device_memory="40Gi"), r"^device_memory='40Gi' is more than nvidia-t4 .*valid: at most 16Gi"),
    ("request-above-limit", lambda: Resources(memory="8Gi", memory_limit="4Gi"), r"^memory='8Gi' is above memory_limit='4Gi'.*valid: memory <= memory_limit"),
    ("fractional-device-count", lambda: Resources(accelerator="T4", count=0.5), r"^count=0\.5 is not an integer; valid: a whole number of devices >= 1"),
    ("toleration-empty-key-not-exists", lambda: Resources(tolerations=[{"key": "", "operator": "Equal"}]), r"^tolerations\[0\]\.operator='Equal' with an empty key.*valid: operator='Exists'"),
    ("profile-unknown-field", lambda: ClusterProfile.from_dict({"queue": {"kueue": "q"}, "schedulerName": "volcano"}, source="p.yaml"), r"^p.yaml: unknown field 'schedulerName' \(did you mean 'scheduler_name'\?\) in the profile \(top level\); valid: version, name, vendors, accelerator_tolerations, tolerations, queue, scheduler_name"),
]


@pytest.mark.parametrize("make, pattern", [(m, p) for _, m, p in DONE_WHEN_ERRORS], ids=[n for n, _, _ in DONE_WHEN_ERRORS])
def test_bad_input_is_a_clear_error(make, pattern):
    with pytest.raises(InvalidResources, match=pattern):
        make()
